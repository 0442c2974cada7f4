"""A Realtime-protocol client for scripts, benchmarks and tests: WebSocket (``realtime``) and WebRTC
(``webrtc``). The server never imports it."""
