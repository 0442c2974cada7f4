// Placing the call: the offer's ICE wait, and what to tell the user when the call or the
// microphone cannot be had (each cause its own message).
const ICE_GATHER_TIMEOUT_MS = 2000;

export function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ICE_GATHER_TIMEOUT_MS); // host candidates come at once; do not wait for more
  });
}

/** Why the server refused the call (a non-201 answer to the offer); sentKey: a key was sent. */
export async function callProblem(response, sentKey) {
  let error = {};
  try {
    error = (await response.json()).error || {};
  } catch {
    // not JSON
  }
  if (response.status === 401 && !sentKey) {
    return "This server needs an API key. Enter it above and press Enter (or Connect); " +
      "the microphone opens only once the call is up.";
  }
  if (response.status === 401) {
    return "The API key was refused: it is not the one the server was started with (--api_key). " +
      "Correct it above and press Enter (or Connect).";
  }
  if (response.status === 503 && error.code === "max_sessions_reached") {
    return "The server is full: every session it allows (--max_sessions) is in use. Try again in a moment.";
  }
  if (response.status === 503) return `The server is busy: ${error.message || "try again later"}.`;
  return `The server refused the call (${response.status}): ${error.message || response.statusText}`;
}

/** Why the microphone cannot be opened (err: getUserMedia's error, or null without mediaDevices). */
export function micProblem(err) {
  if (!window.isSecureContext || !navigator.mediaDevices) {
    return "The browser only gives a page the microphone over HTTPS or on localhost. " +
      "Start the server with --ssl_certfile and --ssl_keyfile and open https://HOST:PORT/.";
  }
  if (err && (err.name === "NotAllowedError" || err.name === "SecurityError")) {
    return "Microphone access was denied. Allow the microphone for this page (the icon in the address bar) " +
      "and press Connect again.";
  }
  if (err && (err.name === "NotFoundError" || err.name === "OverconstrainedError")) {
    return "No microphone was found. Plug one in and press Connect again.";
  }
  if (err && err.name === "NotReadableError") {
    return "The microphone is busy (another program uses it). Close it and press Connect again.";
  }
  return `The microphone cannot be opened: ${err ? err.message || err.name : "unknown error"}`;
}
