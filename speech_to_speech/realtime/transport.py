"""How a realtime session reaches its client: the transport interface and the WebSocket transport.

A session does not know how its client is connected. The server gives it a :class:`Transport`,
which carries the same JSON events both ways, over a WebSocket (:class:`WebSocketTransport`, audio
inside the events as base64 pcm16) or a WebRTC data channel
(:class:`~speech_to_speech.realtime.webrtc.WebRTCCall`, audio on an Opus track). A transport with
:attr:`Transport.media` carries the audio itself: the session's sink then pushes the assistant's
audio into that :class:`~speech_to_speech.realtime.media.OutputAudioBuffer` instead of sending
``response.output_audio.delta`` events, and the transport hands the client's audio to
``session.feed_audio`` once :meth:`Transport.attach` was called.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from speech_to_speech.realtime.media import OutputAudioBuffer

#: ``feed(samples, rate)``: mono float32 samples of the client's audio at ``rate`` Hz
AudioFeed = Callable[[np.ndarray, int], None]


class Transport(Protocol):
    """One client connection as a session sees it. Every method runs on the server's event loop.

    Attributes:
        kind: "websocket" or "webrtc" (for logs).
        media: where the assistant's audio goes when the transport carries audio itself; None when
            audio travels inside the events.
    """

    kind: str
    media: OutputAudioBuffer | None

    def send(self, event: dict[str, Any]) -> None:
        """Queue one server event for the client; never blocks (events are dropped once closed)."""

    def messages(self) -> AsyncIterator[str | bytes]:
        """The client's messages (JSON text), in order, until the connection ends."""

    def attach(self, feed: AudioFeed) -> None:
        """From now on, hand the client's audio to ``feed`` (no-op without media)."""

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """End the connection (idempotent)."""


class WebSocketTransport:
    """A WebSocket client: events are text frames; audio travels inside them.

    Outbound events are queued and written by a task, so :meth:`send` never blocks the loop.
    """

    kind = "websocket"
    media: OutputAudioBuffer | None = None

    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pump = asyncio.create_task(self._write())

    def send(self, event: dict[str, Any]) -> None:
        self._outbox.put_nowait(event)

    async def _write(self) -> None:
        while True:
            event = await self._outbox.get()
            try:
                await self.connection.send(json.dumps(event))
            except ConnectionClosed:
                return

    async def messages(self) -> AsyncIterator[str | bytes]:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.connection:
                yield message

    def attach(self, feed: AudioFeed) -> None:
        pass

    async def flush(self, timeout_s: float = 1.0) -> None:
        """Wait until every queued event was written, the connection closed or ``timeout_s`` passed."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._outbox.empty() and not self._pump.done() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Write what is queued (1 s at most), then close with ``code`` (1000: the server closes it
        normally once the handler returns)."""
        await self.flush()
        if code != 1000:
            with contextlib.suppress(ConnectionClosed):
                await self.connection.close(code, reason)
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
