// speech-to-speech in the browser: the OpenAI Realtime WebRTC flow against this server.
//
// The microphone (echo cancellation, noise suppression, automatic gain control on) goes to the
// server on a WebRTC audio track; the assistant's voice comes back on the same peer connection;
// the protocol's JSON events travel on the "oai-events" data channel. The SDP offer is POSTed to
// /v1/realtime/calls (Authorization: Bearer KEY when a key is entered); the answer comes back.
//
// Order: the call is placed first, with an audio transceiver but no track (so a missing or wrong
// key, or a full server, is known before the microphone is asked for); the microphone opens once
// the data channel is open, and its track is put on the transceiver then. Nothing is captured
// before the call is up, so no opening words are lost; the page says "connecting…" until then.
//
// Modules: call.js (ICE wait, what to say when the call or the microphone fails), controls.js
// (mute, devices, text box, new conversation), eventlog.js (the debug panel of the data channel's
// events), images.js ("Attach image"), latency.js (the server's per-turn latency breakdown),
// meters.js (audio levels).
//
// Timing: the server sends each response.output_audio_transcript.delta when the audio that speaks
// those words leaves it; the page shows the words once the receiver's jitter buffer has played
// them out (its delay is read from getStats), so text never runs ahead of the voice.
// Voice-to-voice latency per turn: the end of the user's voice at the microphone (the last loud
// frame before the server's speech_stopped) to the first audible frame of the reply.
import { callProblem, micProblem, waitForIce } from "./call.js";
import { setupControls } from "./controls.js";
import { createEventLog } from "./eventlog.js";
import { setupImages } from "./images.js";
import { showBreakdown } from "./latency.js";
import { DEFAULT_PLAYOUT_MS, measurePlayout, startMeters } from "./meters.js";

const CALLS_PATH = "/v1/realtime/calls";

const $ = (id) => document.getElementById(id);
const ui = {
  key: $("api-key"),
  connect: $("connect"),
  disconnect: $("disconnect"),
  message: $("message"),
  who: $("who"),
  whoText: $("who-text"),
  conversation: $("conversation"),
  audio: $("assistant-audio"),
  micLevel: $("mic-level"),
  outLevel: $("out-level"),
  mute: $("mute"),
  newConversation: $("new-conversation"),
  micSelect: $("mic-select"),
  speakerSelect: $("speaker-select"),
  composer: $("composer"),
  textInput: $("text-input"),
  textSend: $("text-send"),
  attach: $("attach"),
  imageFile: $("image-file"),
};

// Everything the page knows; window.s2s exposes it (the browser test reads it).
let controls = null; // controls.js, once set up
let images = null; // images.js, once set up
const state = {
  pc: null,
  channel: null,
  mic: null,
  callUrl: null,
  key: "",
  closing: false,
  connecting: false, // from Connect until the microphone is live (or it fails)
  connected: false, // the data channel is open
  live: false, // the microphone's track is on the call
  muted: false,
  sender: null, // the audio transceiver's sender (its track: the microphone, once live)
  timeline: {}, // performance.now() of connectAt, answeredAt, channelOpenAt, micOpenAt
  conversations: 0, // calls started on this page (a divider separates them)
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
  if (controls) controls.sync();
  if (images) images.sync();
  if (!state.connected && !state.connecting) return who("idle", "not connected");
  if (!state.live) return who("connecting", "connecting…");
  if (state.userSpeaking) return who("user", "you are speaking");
  const r = state.current;
  if (r && !r.finished && !r.cut) {
    return r.audible ? who("assistant", "assistant speaking") : who("thinking", "thinking…");
  }
  const turn = lastTurn();
  if (turn && turn.stoppedAt && !turn.answered) return who("thinking", "thinking…");
  if (state.muted) return who("muted", "muted");
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

// -- one conversation per call -------------------------------------------------------------------
// A call that ends leaves no live partial transcript (a partial becomes "(cut off)", an empty one
// goes) and no reply in progress; the next call starts below a divider, with fresh state.
function endConversation() {
  for (const turn of state.turns) {
    if (turn.transcript !== null) continue;
    if (!turn.partial) {
      turn.el.remove();
      continue;
    }
    const text = turn.el.querySelector(".text");
    text.className = "text stale";
    text.textContent = `${turn.partial} (cut off)`;
  }
  for (const r of state.responses.values()) {
    if (!r.finished) cut(r, "call ended");
  }
}

function startConversation() {
  state.conversations += 1;
  Object.assign(state, { turns: [], turnsByItem: new Map(), responses: new Map(), current: null });
  state.userSpeaking = false;
  const last = ui.conversation.lastElementChild;
  if (last && !last.classList.contains("divider")) {
    const divider = document.createElement("div");
    divider.className = "divider";
    divider.setAttribute("role", "separator");
    divider.textContent = `new conversation · ${new Date().toLocaleTimeString()}`;
    ui.conversation.appendChild(divider);
    divider.scrollIntoView({ block: "end" });
  }
}

function typedTurn(item) {
  const part = (item.content || []).find((c) => c.type === "input_text");
  if (item.role !== "user" || !part) return;
  const turn = userTurn(item.id);
  turn.typed = true;
  turn.el.classList.add("typed");
  turn.transcript = part.text;
  showUserText(turn);
}

function send(event) {
  if (!state.channel || state.channel.readyState !== "open") return false;
  state.channel.send(JSON.stringify(event));
  eventLog.record("out", event);
  return true;
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
  eventLog.record("in", e);
  const now = performance.now();
  switch (e.type) {
    case "session.created":
    case "session.updated": {
      state.sessionId = e.session.id;
      const td = e.session.audio && e.session.audio.input && e.session.audio.input.turn_detection;
      if (td && td.silence_duration_ms) state.silenceMs = td.silence_duration_ms;
      if (e.type === "session.created" && state.live) say(CONNECTED, "ok");
      // the best turn detection the server has: the end-of-turn model, with its default eagerness
      if (e.type === "session.created" && td && td.type !== "semantic_vad") {
        send({
          type: "session.update",
          session: { type: "realtime", audio: { input: { turn_detection: { type: "semantic_vad" } } } },
        });
      }
      break;
    }
    case "conversation.item.added": {
      if (e.item && e.item.type === "message") typedTurn(e.item);
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
      r.breakdown = showBreakdown(r.el, e.response.metadata);
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
      say(`Server error${err.code ? ` (${err.code})` : ""}: ${err.message || "unknown"}`, "error");
      if (images) images.onError(err);
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

// -- connecting ------------------------------------------------------------------------------------
function authHeaders() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

function mark(name) {
  state.timeline[name] = performance.now();
}

function microphone(deviceId) {
  // the browser's echo canceller keeps the assistant's voice out of the microphone (the server
  // also sets aside what is left of it); voice isolation, where the browser has it, helps too
  const audio = { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 };
  if (navigator.mediaDevices.getSupportedConstraints().voiceIsolation) audio.voiceIsolation = true;
  if (deviceId) audio.deviceId = { exact: deviceId };
  return navigator.mediaDevices.getUserMedia({ audio });
}

// Put a microphone stream on the call: its track on the sender, the level meter on it.
async function useMicrophone(stream) {
  const [track] = stream.getAudioTracks();
  track.enabled = !state.muted;
  await state.sender.replaceTrack(track);
  const old = state.mic;
  state.mic = stream;
  if (old && old !== stream) old.getTracks().forEach((t) => t.stop());
  state.micAnalyser = state.audioCtx.createAnalyser();
  state.audioCtx.createMediaStreamSource(stream).connect(state.micAnalyser);
}

// The data channel is open: only now is the microphone asked for, and its audio sent.
async function goLive() {
  say("Connected. Opening the microphone…");
  const pc = state.pc;
  let stream;
  try {
    stream = await microphone(ui.micSelect.value);
  } catch (err) {
    if (state.pc !== pc) return; // hung up meanwhile
    const why = micProblem(err);
    await disconnect();
    say(why, "error");
    return;
  }
  if (state.pc !== pc || state.closing) {
    stream.getTracks().forEach((t) => t.stop()); // hung up meanwhile
    return;
  }
  await useMicrophone(stream);
  mark("micOpenAt");
  Object.assign(state, { live: true, connecting: false });
  say(CONNECTED, "ok");
  controls.listDevices();
  refreshWho();
}

async function switchMicrophone(deviceId) {
  if (!state.live) return;
  try {
    await useMicrophone(await microphone(deviceId));
  } catch (err) {
    say(micProblem(err), "warn");
  }
}

async function connect() {
  if (state.pc || state.connecting) return;
  state.key = ui.key.value.trim();
  sessionStorage.setItem("s2s-api-key", state.key); // this tab only; never in the URL
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    say(micProblem(null), "error");
    return;
  }
  startConversation();
  Object.assign(state, { closing: false, connecting: true, timeline: {} });
  mark("connectAt");
  eventLog.restart();
  say("Connecting… (the microphone opens once the call is up)");
  refreshWho();
  try {
    state.audioCtx = new AudioContext();
    state.audioCtx.resume().catch(() => {});
    startMeters(state, ui, markAudible);

    const pc = new RTCPeerConnection();
    state.pc = pc;
    state.sender = pc.addTransceiver("audio", { direction: "sendrecv" }).sender; // the microphone comes later
    pc.ontrack = (ev) => {
      const stream = ev.streams[0] || new MediaStream([ev.track]);
      ui.audio.srcObject = stream;
      ui.audio.play().catch(() => {});
      state.outAnalyser = state.audioCtx.createAnalyser();
      state.audioCtx.createMediaStreamSource(stream).connect(state.outAnalyser);
    };
    const current = () => state.pc === pc && !state.closing; // events of an earlier call are ignored
    pc.onconnectionstatechange = () => {
      if (!current()) return;
      if (pc.connectionState === "failed") lost("the WebRTC connection failed");
      else if (pc.connectionState === "disconnected") say("The connection is interrupted; trying to recover…", "warn");
      else if (pc.connectionState === "connected" && state.live) say("Connected.", "ok");
    };
    const channel = pc.createDataChannel("oai-events");
    state.channel = channel;
    channel.onmessage = (message) => current() && onEvent(message);
    channel.onopen = () => {
      if (!current()) return;
      state.connected = true;
      mark("channelOpenAt");
      ui.disconnect.disabled = false;
      refreshWho();
      goLive();
    };
    channel.onclose = () => {
      if (current()) lost("the server closed the connection");
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
    if (state.pc !== pc) return; // hung up while the offer was out
    if (response.status !== 201) {
      const why = await callProblem(response, Boolean(state.key));
      teardown();
      say(why, "error");
      if (response.status === 401) ui.key.focus(); // the key is asked for: no microphone yet
      if (response.status === 401 && state.key) ui.key.select();
      return;
    }
    mark("answeredAt");
    const location = response.headers.get("Location");
    state.callUrl = location ? new URL(location, window.location.href).href : null;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    state.statsTimer = setInterval(() => measurePlayout(state), 1000);
    ui.disconnect.disabled = false;
  } catch (err) {
    teardown();
    say(`Cannot connect: ${err.message || err}`, "error");
  }
}

function lost(why) {
  if (state.closing) return;
  const url = state.callUrl;
  teardown();
  hangUp(url);
  say(`Connection lost: ${why}. Press Connect to start a new conversation.`, "error");
}

function teardown() {
  state.closing = true;
  endConversation();
  Object.assign(state, { connected: false, connecting: false, live: false, userSpeaking: false, callUrl: null });
  for (const t of state.timers) clearTimeout(t);
  state.timers = [];
  clearInterval(state.meterTimer);
  clearInterval(state.statsTimer);
  if (state.channel) state.channel.close();
  if (state.pc) state.pc.close();
  if (state.mic) state.mic.getTracks().forEach((t) => t.stop());
  if (state.audioCtx) state.audioCtx.close().catch(() => {});
  Object.assign(state, {
    pc: null, channel: null, mic: null, sender: null, audioCtx: null, micAnalyser: null, outAnalyser: null,
  });
  ui.audio.srcObject = null;
  ui.micLevel.style.width = ui.outLevel.style.width = "0";
  ui.disconnect.disabled = true;
  refreshWho();
}

function hangUp(url) {
  if (url) fetch(`${url}/hangup`, { method: "POST", headers: authHeaders() }).catch(() => {});
}

async function disconnect() {
  const url = state.callUrl;
  teardown();
  say("Disconnected.", "info");
  hangUp(url);
}

// New conversation: hang up, clear the page, call again (a fresh session: empty history).
async function newConversation() {
  await disconnect();
  ui.conversation.replaceChildren();
  eventLog.clear();
  await connect();
}

const CONNECTED = "Connected. Speak when you like; speak over the assistant to interrupt it.";
const eventLog = createEventLog({
  panel: $("event-log"),
  list: $("event-list"),
  count: $("event-count"),
  toggle: $("log-toggle"),
  clear: $("event-clear"),
});
state.eventLog = eventLog;
const app = { state, ui, connect, newConversation, switchMicrophone, send, refreshWho };
controls = setupControls(app);
images = setupImages({ button: ui.attach, input: ui.imageFile, state, say, bubble });

ui.key.value = sessionStorage.getItem("s2s-api-key") || "";
ui.connect.addEventListener("click", connect);
ui.disconnect.addEventListener("click", disconnect);
window.addEventListener("pagehide", () => state.pc && disconnect());
refreshWho();
