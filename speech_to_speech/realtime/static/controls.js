// The call's controls beyond Connect/Disconnect: Enter in the key box, mute, the microphone and
// speaker pickers, the text box, and "New conversation".
//
// setupControls(app) wires them to the page (app: {state, ui, connect, newConversation,
// switchMicrophone, send, refreshWho}); it returns {sync, listDevices}: sync() enables what the
// call's state allows, listDevices() refills the pickers (labels come once the microphone is open).
const canPickSpeaker = typeof HTMLMediaElement !== "undefined" && "setSinkId" in HTMLMediaElement.prototype;

function fill(select, devices, kind, fallback) {
  const chosen = select.value;
  const options = devices.filter((d) => d.kind === kind && d.deviceId !== "default" && d.deviceId !== "communications");
  select.replaceChildren(new Option("default", ""));
  options.forEach((d, i) => select.add(new Option(d.label || `${fallback} ${i + 1}`, d.deviceId)));
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
}

async function listDevices(ui) {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  try {
    const devices = await navigator.mediaDevices.enumerateDevices();
    fill(ui.micSelect, devices, "audioinput", "microphone");
    fill(ui.speakerSelect, devices, "audiooutput", "speaker");
  } catch {
    // keep the lists as they are
  }
}

function setMuted(app, muted) {
  const { state, ui } = app;
  state.muted = muted;
  if (state.mic) state.mic.getAudioTracks().forEach((t) => (t.enabled = !muted));
  ui.mute.setAttribute("aria-pressed", String(muted));
  ui.mute.textContent = muted ? "Unmute" : "Mute";
  app.refreshWho();
}

function sendText(app) {
  const { state, ui } = app;
  const text = ui.textInput.value.trim();
  if (!text || !state.connected) return;
  app.send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  });
  app.send({ type: "response.create" });
  ui.textInput.value = "";
}

export function setupControls(app) {
  const { state, ui } = app;
  ui.key.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      app.connect();
    }
  });
  ui.mute.addEventListener("click", () => setMuted(app, !state.muted));
  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    sendText(app);
  });
  ui.newConversation.addEventListener("click", () => app.newConversation());
  ui.micSelect.addEventListener("change", () => app.switchMicrophone(ui.micSelect.value));
  ui.speakerSelect.addEventListener("change", () => {
    if (canPickSpeaker) ui.audio.setSinkId(ui.speakerSelect.value).catch(() => {});
  });
  if (!canPickSpeaker) {
    ui.speakerSelect.disabled = true;
    ui.speakerSelect.title = "this browser cannot choose the speaker (no setSinkId)";
  }
  if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
    navigator.mediaDevices.addEventListener("devicechange", () => listDevices(ui));
  }
  listDevices(ui);

  function sync() {
    const busy = state.connecting || state.connected;
    ui.connect.disabled = busy;
    ui.key.disabled = busy;
    ui.mute.disabled = !state.live;
    ui.newConversation.disabled = !state.live;
    ui.textInput.disabled = ui.textSend.disabled = !state.connected;
    if (!state.live && state.muted) setMuted(app, false);
  }
  return { sync, listDevices: () => listDevices(ui) };
}
