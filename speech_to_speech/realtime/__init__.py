"""The realtime server: the OpenAI Realtime protocol over WebSocket, one pipeline per session."""
