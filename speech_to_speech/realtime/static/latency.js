// The server's latency breakdown of a turn, from response.done's response.metadata.
//
// The server adds its measurements as string metadata (see docs/server.md): s2s_endpoint_ms (end
// of speech → end of turn decided), s2s_stt_ms (the final transcription), s2s_ttft_ms (LLM
// request → first token), s2s_ttfa_ms (LLM request → first audio) and s2s_voice_to_voice_ms.
const PARTS = [
  ["s2s_endpoint_ms", "endpoint"],
  ["s2s_stt_ms", "STT"],
  ["s2s_ttft_ms", "TTFT"],
  ["s2s_ttfa_ms", "TTFA"],
];

/** "endpoint 310 ms · STT 95 ms · TTFT 420 ms · TTFA 610 ms", or "" without measurements. */
export function breakdownText(metadata) {
  if (!metadata) return "";
  const parts = PARTS.filter(([key]) => metadata[key] !== undefined).map(([key, label]) => `${label} ${metadata[key]} ms`);
  if (metadata.s2s_endpoint_by && metadata.s2s_endpoint_ms !== undefined) {
    parts[0] = `${parts[0]} (${metadata.s2s_endpoint_by})`;
  }
  return parts.join(" · ");
}

/** Show the breakdown under a reply's bubble (once). */
export function showBreakdown(bubbleEl, metadata) {
  const text = breakdownText(metadata);
  if (!text || bubbleEl.querySelector(".breakdown")) return "";
  const el = document.createElement("div");
  el.className = "breakdown";
  el.textContent = `server: ${text}`;
  el.title = "endpoint: end of speech → end of turn decided; STT: final transcription; " +
    "TTFT: LLM request → first token; TTFA: LLM request → first audio";
  bubbleEl.appendChild(el);
  return text;
}
