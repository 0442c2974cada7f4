// Audio levels: who is speaking, when the voice ends and when the reply is heard; and how far the
// assistant's audio lags its events (the receiver's jitter buffer, read from getStats).
const MIC_VOICE_RMS = 0.02; // about -34 dBFS: louder frames at the microphone count as voice
const OUT_VOICE_RMS = 0.01; // the assistant's audio is audible above this
export const DEFAULT_PLAYOUT_MS = 80; // before getStats has measured the jitter buffer

function rms(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (let i = 0; i < buffer.length; i++) sum += buffer[i] * buffer[i];
  return Math.sqrt(sum / buffer.length);
}

export function startMeters(state, ui, markAudible) {
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

export async function measurePlayout(state) {
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
