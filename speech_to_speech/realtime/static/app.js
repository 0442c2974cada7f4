// speech-to-speech in the browser: the OpenAI Realtime WebRTC flow against this server.
//
// The microphone (echo cancellation, noise suppression, automatic gain control on) goes to the
// server on a WebRTC audio track; the assistant's voice comes back on the same peer connection;
// the protocol's JSON events travel on the "oai-events" data channel. The SDP offer is POSTed to
// /v1/realtime/calls (Authorization: Bearer KEY when a key is entered); the answer comes back.
//
// Timing: the server sends each response.output_audio_transcript.delta when the audio that speaks
// those words leaves it; the page shows the words once the receiver's jitter buffer has played
// them out (its delay is read from getStats), so text never runs ahead of the voice.
// Voice-to-voice latency per turn: the end of the user's voice at the microphone (the last loud
// frame before the server's speech_stopped) to the first audible frame of the reply.
//
// Images: "Attach image" (the camera on a phone) sends the picture at once as a user item,
// conversation.item.create with an input_image part; the next question is about it. The picture is
// first shrunk to a JPEG that fits one data channel message (see IMAGE_MAX_CHARS).
"use strict";

const CALLS_PATH = "/v1/realtime/calls";
const MIC_VOICE_RMS = 0.02; // about -34 dBFS: louder frames at the microphone count as voice
const OUT_VOICE_RMS = 0.01; // the assistant's audio is audible above this
const DEFAULT_PLAYOUT_MS = 80; // before getStats has measured the jitter buffer
const ICE_GATHER_TIMEOUT_MS = 2000;
// the longest side of a sent image, px: vision models work on smaller tiles (SmolVLM 512 px; OpenAI's
// high detail scales to 768 px on the short side), so more only costs bytes
const IMAGE_MAX_SIDE = 1024;
// the longest data URL sent, characters: one data channel message holds at most 256 KiB (the
// max-message-size of aiortc and of Chromium), and the server echoes the item back in one message
const IMAGE_MAX_CHARS = 200000;
const IMAGE_QUALITIES = [0.85, 0.7, 0.55]; // JPEG qualities tried at each size, best first

const $ = (id) => document.getElementById(id);
const ui = {
  key: $("api-key"),
  connect: $("connect"),
  disconnect: $("disconnect"),
  attach: $("attach"),
  imageFile: $("image-file"),
  message: $("message"),
  who: $("who"),
  whoText: $("who-text"),
  conversation: $("conversation"),
  audio: $("assistant-audio"),
  micLevel: $("mic-level"),
  outLevel: $("out-level"),
};

// Everything the page knows; window.s2s exposes it (the browser test reads it).
const state = {
  pc: null,
  channel: null,
  mic: null,
  callUrl: null,
  key: "",
  closing: false,
  connected: false,
  sessionId: null,
  silenceMs: 500,
  playoutMs: DEFAULT_PLAYOUT_MS,
  audioCtx: null,
  micAnalyser: null,
  outAnalyser: null,
  lastVoiceAt: 0,
  userSpeaking: false,
  turns: [], // {itemId, el, partial, transcript, stoppedAt, speechEndAt, response}
  turnsByItem: new Map(),
  responses: new Map(), // id → {el, textEl, text, shown, turn, audible, firstAudioAt, done, status, cut}
  current: null, // the response whose audio is playing or about to
  events: [], // types received, in order
  errors: [],
  images: [], // {eventId, el, width, height, chars, refused}: the images sent, in order
  whoLog: [], // the speaking indicator's states, in order
  timers: [],
};
window.s2s = state;

// -- messages and the speaking indicator -------------------------------------------------------
function say(text, kind = "info") {
  ui.message.className = `message ${kind}`;
  ui.message.textContent = text;
  if (kind === "error") state.errors.push(text);
}

function who(kind, text) {
  if (state.whoLog[state.whoLog.length - 1] !== kind) state.whoLog.push(kind);
  ui.who.className = `who ${kind}`;
  ui.whoText.textContent = text;
}

function refreshWho() {
  if (!state.connected) return who("idle", "not connected");
  if (state.userSpeaking) return who("user", "you are speaking");
  const r = state.current;
  if (r && !r.finished && !r.cut) {
    return r.audible ? who("assistant", "assistant speaking") : who("thinking", "thinking…");
  }
  const turn = lastTurn();
  if (turn && turn.stoppedAt && !turn.answered) return who("thinking", "thinking…");
  return who("listening", "listening");
}

// -- the conversation ---------------------------------------------------------------------------
function bubble(role, label) {
  const el = document.createElement("div");
  el.className = `turn ${role}`;
  el.innerHTML = `<div class="role"></div><div class="text"></div>`;
  el.querySelector(".role").textContent = label;
  ui.conversation.appendChild(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function userTurn(itemId) {
  let turn = state.turnsByItem.get(itemId);
  if (!turn) {
    turn = { itemId, el: bubble("user", "you"), partial: "", transcript: null, stoppedAt: 0, speechEndAt: 0 };
    turn.el.dataset.itemId = itemId;
    state.turns.push(turn);
    state.turnsByItem.set(itemId, turn);
  }
  return turn;
}

function showUserText(turn) {
  const text = turn.el.querySelector(".text");
  if (turn.transcript !== null) {
    text.className = "text final";
    text.textContent = turn.transcript || "(nothing recognised)";
  } else {
    text.className = "text live";
    text.textContent = turn.partial || "…";
  }
}

function lastTurn() {
  return state.turns.length ? state.turns[state.turns.length - 1] : null;
}

function responseOf(id) {
  let r = state.responses.get(id);
  if (!r) {
    const turn = lastTurn();
    const el = bubble("assistant", "assistant");
    el.dataset.responseId = id;
    r = { id, el, textEl: el.querySelector(".text"), text: "", shown: "", turn, audible: false,
          firstAudioAt: 0, audioStartedAt: 0, finished: false, status: null, cut: false };
    if (turn) turn.answered = true;
    state.responses.set(id, r);
  }
  return r;
}

function showWords(r, delta) {
  if (r.cut) return;
  if (!r.shown) r.firstShownAt = performance.now();
  r.shown += delta;
  r.textEl.textContent = r.shown.trimStart();
  r.el.scrollIntoView({ block: "end" });
}

function later(ms, fn) {
  const t = setTimeout(() => {
    state.timers = state.timers.filter((x) => x !== t);
    fn();
  }, Math.max(0, ms));
  state.timers.push(t);
}

function cut(r, why) {
  if (!r || r.cut || r.finished) return;
  r.cut = true;
  r.el.classList.add("interrupted");
  const note = document.createElement("span");
  note.className = "note";
  note.textContent = why;
  r.el.querySelector(".role").appendChild(note);
}

function showLatency(r) {
  const turn = r.turn;
  if (!turn || !turn.speechEndAt || !r.firstAudioAt || r.latencyShown) return;
  r.latencyShown = true;
  const ms = Math.round(r.firstAudioAt - turn.speechEndAt);
  turn.v2vMs = ms;
  const el = document.createElement("div");
  el.className = "latency";
  el.textContent = `voice-to-voice ${ms} ms`;
  r.el.appendChild(el);
}

// -- server events --------------------------------------------------------------------------------
function onEvent(message) {
  let e;
  try {
    e = JSON.parse(message.data);
  } catch {
    return;
  }
  state.events.push(e.type);
  const now = performance.now();
  switch (e.type) {
    case "session.created":
    case "session.updated": {
      state.sessionId = e.session.id;
      const td = e.session.audio && e.session.audio.input && e.session.audio.input.turn_detection;
      if (td && td.silence_duration_ms) state.silenceMs = td.silence_duration_ms;
      if (e.type === "session.created") say("Connected. Speak when you like; speak over the assistant to interrupt it.", "ok");
      break;
    }
    case "input_audio_buffer.speech_started": {
      state.userSpeaking = true;
      userTurn(e.item_id);
      if (state.current && !state.current.finished) cut(state.current, "interrupted");
      break;
    }
    case "input_audio_buffer.speech_stopped": {
      state.userSpeaking = false;
      const turn = userTurn(e.item_id);
      turn.stoppedAt = now;
      // the end of the voice: the last loud microphone frame, if it fits the VAD's silence window
      const gap = now - state.lastVoiceAt;
      turn.speechEndAt = gap >= 0 && gap <= state.silenceMs + 1500 ? state.lastVoiceAt : now - state.silenceMs;
      break;
    }
    case "conversation.item.input_audio_transcription.delta": {
      const turn = userTurn(e.item_id);
      turn.partial += e.delta;
      showUserText(turn);
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const turn = userTurn(e.item_id);
      turn.transcript = e.transcript;
      // the language the server heard (detected with --language auto), next to "you"
      const language = (e.languages || []).map((l) => l.code).join(", ");
      turn.el.querySelector(".role").textContent = language ? `you · ${language}` : "you";
      turn.el.dataset.language = language;
      showUserText(turn);
      break;
    }
    case "response.created":
      state.current = responseOf(e.response.id);
      break;
    case "output_audio_buffer.started": {
      const r = responseOf(e.response_id);
      r.audioStartedAt = now;
      state.current = r;
      later(state.playoutMs, () => {
        // the analyser normally hears it first; this is the fallback
        if (!r.audible && !r.cut) markAudible(r, performance.now());
      });
      break;
    }
    case "response.output_audio_transcript.delta": {
      const r = responseOf(e.response_id);
      r.text += e.delta;
      later(state.playoutMs, () => showWords(r, e.delta));
      break;
    }
    case "response.output_text.delta": {
      const r = responseOf(e.response_id);
      r.text += e.delta;
      showWords(r, e.delta);
      break;
    }
    case "response.done": {
      const r = responseOf(e.response.id);
      r.status = e.response.status;
      if (r.status === "cancelled") cut(r, "interrupted");
      if (r.status === "failed") {
        const why = (e.response.status_details && e.response.status_details.error) || {};
        say(`The reply failed: ${why.message || "server error"}`, "error");
      }
      if (!r.audioStartedAt) r.finished = true; // no audio: nothing left to play
      break;
    }
    case "output_audio_buffer.stopped":
    case "output_audio_buffer.cleared": {
      const r = responseOf(e.response_id);
      later(e.type === "output_audio_buffer.stopped" ? state.playoutMs : 0, () => {
        r.finished = true;
        refreshWho();
      });
      break;
    }
    case "error": {
      const err = e.error || {};
      const image = state.images.find((i) => err.event_id && i.eventId === err.event_id);
      if (image) refuseImage(image, err);
      say(`Server error${err.code ? ` (${err.code})` : ""}: ${err.message || "unknown"}`, "error");
      break;
    }
    default:
      break;
  }
  refreshWho();
}

function markAudible(r, at) {
  if (r.audible) return;
  r.audible = true;
  r.firstAudioAt = at;
  showLatency(r);
  refreshWho();
}

// -- images ---------------------------------------------------------------------------------------
async function shrinkImage(file) {
  // a JPEG data URL of at most IMAGE_MAX_CHARS: scaled to IMAGE_MAX_SIDE, then smaller until it fits
  const bitmap = await createImageBitmap(file); // decodes PNG, JPEG, WebP, GIF, HEIC where supported
  let scale = Math.min(1, IMAGE_MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  for (let attempt = 0; attempt < 8; attempt++) {
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    for (const quality of IMAGE_QUALITIES) {
      const url = canvas.toDataURL("image/jpeg", quality);
      if (url.length <= IMAGE_MAX_CHARS) {
        bitmap.close();
        return { url, width: canvas.width, height: canvas.height };
      }
    }
    scale *= 0.7;
  }
  bitmap.close();
  throw new Error("it cannot be made small enough to send");
}

async function attachImage(file) {
  if (!file) return;
  if (!state.channel || state.channel.readyState !== "open") {
    say("Connect first, then attach an image.", "warn");
    return;
  }
  let image;
  try {
    image = await shrinkImage(file);
  } catch (err) {
    say(`That image cannot be sent: ${err.message || "the browser cannot read it"}.`, "error");
    return;
  }
  const eventId = `evt_image_${Date.now()}_${state.images.length}`;
  const part = { type: "input_image", image_url: image.url, detail: "auto" };
  const item = { type: "message", role: "user", content: [part] };
  state.channel.send(JSON.stringify({ type: "conversation.item.create", event_id: eventId, item }));
  const el = bubble("user image", "you");
  const img = document.createElement("img");
  img.src = image.url;
  img.alt = "the image you attached";
  el.querySelector(".text").appendChild(img);
  state.images.push({ eventId, el, width: image.width, height: image.height, chars: image.url.length, refused: null });
  say("Image sent: ask about it.", "ok");
}

function refuseImage(image, err) {
  image.refused = err.message || "refused";
  image.el.classList.add("refused");
  const note = document.createElement("span");
  note.className = "note";
  note.textContent = "not seen";
  image.el.querySelector(".role").appendChild(note);
}

// -- audio levels: who is speaking, when the voice ends and when the reply is heard ----------------
function rms(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (let i = 0; i < buffer.length; i++) sum += buffer[i] * buffer[i];
  return Math.sqrt(sum / buffer.length);
}

function startMeters() {
  const buf = new Float32Array(512);
  const tick = () => {
    if (!state.audioCtx) return;
    const now = performance.now();
    if (state.micAnalyser) {
      const level = rms(state.micAnalyser, buf);
      if (level > MIC_VOICE_RMS) state.lastVoiceAt = now;
      ui.micLevel.style.width = `${Math.min(100, level * 400)}%`;
    }
    if (state.outAnalyser) {
      const level = rms(state.outAnalyser, buf);
      ui.outLevel.style.width = `${Math.min(100, level * 400)}%`;
      const r = state.current;
      if (r && r.audioStartedAt && !r.audible && !r.cut && level > OUT_VOICE_RMS) markAudible(r, now);
    }
  };
  state.meterTimer = setInterval(tick, 10);
}

async function measurePlayout() {
  // the receiver's jitter buffer delay (plus the output's latency) is how far audio lags its event
  if (!state.pc) return;
  try {
    const stats = await state.pc.getStats();
    stats.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio" && s.jitterBufferEmittedCount > 0) {
        const jitterMs = (1000 * s.jitterBufferDelay) / s.jitterBufferEmittedCount;
        const outputMs = state.audioCtx ? 1000 * (state.audioCtx.outputLatency || 0) : 0;
        state.playoutMs = Math.min(500, Math.max(20, jitterMs + outputMs));
      }
    });
  } catch {
    // keep the last value
  }
}

// -- connecting ------------------------------------------------------------------------------------
function micProblem(err) {
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

function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ICE_GATHER_TIMEOUT_MS); // host candidates come at once; do not wait for more
  });
}

async function callError(response) {
  let detail = "";
  try {
    const body = await response.json();
    detail = (body.error && body.error.message) || "";
  } catch {
    // not JSON
  }
  if (response.status === 401) {
    ui.key.focus();
    return "This server needs an API key, or the one entered is wrong: enter it above and press Connect.";
  }
  if (response.status === 503) return `The server is busy: ${detail || "try again later"}.`;
  return `The server refused the call (${response.status}): ${detail || response.statusText}`;
}

function authHeaders() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

async function connect() {
  if (state.pc) return;
  state.key = ui.key.value.trim();
  sessionStorage.setItem("s2s-api-key", state.key); // this tab only; never in the URL
  ui.connect.disabled = true;
  state.closing = false;
  say("Opening the microphone…");
  try {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) throw new Error("insecure");
    state.mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
  } catch (err) {
    say(micProblem(err), "error");
    ui.connect.disabled = false;
    return;
  }
  say("Connecting…");
  try {
    state.audioCtx = new AudioContext();
    state.audioCtx.resume().catch(() => {});
    state.micAnalyser = state.audioCtx.createAnalyser();
    state.audioCtx.createMediaStreamSource(state.mic).connect(state.micAnalyser);
    startMeters();

    const pc = new RTCPeerConnection();
    state.pc = pc;
    for (const track of state.mic.getAudioTracks()) pc.addTrack(track, state.mic);
    pc.ontrack = (ev) => {
      const stream = ev.streams[0] || new MediaStream([ev.track]);
      ui.audio.srcObject = stream;
      ui.audio.play().catch(() => {});
      state.outAnalyser = state.audioCtx.createAnalyser();
      state.audioCtx.createMediaStreamSource(stream).connect(state.outAnalyser);
    };
    pc.onconnectionstatechange = () => {
      if (state.closing) return;
      if (pc.connectionState === "failed") lost("the WebRTC connection failed");
      else if (pc.connectionState === "disconnected") say("The connection is interrupted; trying to recover…", "warn");
      else if (pc.connectionState === "connected" && state.connected) say("Connected.", "ok");
    };
    const channel = pc.createDataChannel("oai-events");
    state.channel = channel;
    channel.onmessage = onEvent;
    channel.onopen = () => {
      state.connected = true;
      ui.disconnect.disabled = false;
      ui.attach.disabled = false;
      refreshWho();
    };
    channel.onclose = () => {
      if (!state.closing) lost("the server closed the connection");
    };

    await pc.setLocalDescription(await pc.createOffer());
    await waitForIce(pc);
    let response;
    try {
      response = await fetch(CALLS_PATH, {
        method: "POST",
        body: pc.localDescription.sdp,
        headers: { "Content-Type": "application/sdp", ...authHeaders() },
      });
    } catch (err) {
      throw new Error(`cannot reach the server (${err.message})`);
    }
    if (response.status !== 201) {
      const why = await callError(response);
      teardown();
      say(why, "error");
      return;
    }
    const location = response.headers.get("Location");
    state.callUrl = location ? new URL(location, window.location.href).href : null;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    state.statsTimer = setInterval(measurePlayout, 1000);
    ui.disconnect.disabled = false;
  } catch (err) {
    teardown();
    say(`Cannot connect: ${err.message || err}`, "error");
  }
}

function lost(why) {
  if (state.closing) return;
  teardown();
  say(`Connection lost: ${why}. Press Connect to start a new conversation.`, "error");
}

function teardown() {
  state.closing = true;
  state.connected = false;
  state.userSpeaking = false;
  for (const t of state.timers) clearTimeout(t);
  state.timers = [];
  clearInterval(state.meterTimer);
  clearInterval(state.statsTimer);
  if (state.channel) state.channel.close();
  if (state.pc) state.pc.close();
  if (state.mic) state.mic.getTracks().forEach((t) => t.stop());
  if (state.audioCtx) state.audioCtx.close().catch(() => {});
  Object.assign(state, { pc: null, channel: null, mic: null, audioCtx: null, micAnalyser: null, outAnalyser: null });
  ui.audio.srcObject = null;
  ui.micLevel.style.width = ui.outLevel.style.width = "0";
  ui.connect.disabled = false;
  ui.disconnect.disabled = true;
  ui.attach.disabled = true;
  refreshWho();
}

async function disconnect() {
  const url = state.callUrl;
  state.callUrl = null;
  teardown();
  say("Disconnected.", "info");
  if (url) {
    fetch(`${url}/hangup`, { method: "POST", headers: authHeaders() }).catch(() => {});
  }
}

ui.key.value = sessionStorage.getItem("s2s-api-key") || "";
ui.connect.addEventListener("click", connect);
ui.disconnect.addEventListener("click", disconnect);
ui.attach.addEventListener("click", () => ui.imageFile.click());
ui.imageFile.addEventListener("change", () => {
  const file = ui.imageFile.files[0];
  ui.imageFile.value = ""; // the same photo can be chosen again
  attachImage(file);
});
window.addEventListener("pagehide", () => state.pc && disconnect());
refreshWho();
