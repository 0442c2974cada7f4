"""A WebRTC client of the realtime server (aiortc), the Python twin of the browser page.

It places a call as the OpenAI Realtime WebRTC flow does: a peer connection with a microphone
track and a data channel named ``oai-events``, its SDP offer POSTed to ``/v1/realtime/calls``
(``Authorization: Bearer KEY`` with an API key), the answer applied. Then:

- :meth:`WebRTCClient.say` queues audio on the microphone track (48 kHz, sent in real time,
  20 ms frames, silence when nothing is queued: an open microphone);
- the server's events arrive on the data channel into :attr:`WebRTCClient.log`, the same
  :class:`~speech_to_speech.client.realtime.EventLog` as the WebSocket client's;
- the assistant's audio arrives on the remote track, decoded to mono float32 at 48 kHz, each frame
  kept with its receipt time in :attr:`WebRTCClient.received`.

The tests and ``scripts/benchmark_webrtc.py`` use it; the server never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from speech_to_speech.client.realtime import ConnectError, EventLog
from speech_to_speech.realtime.http import CALLS_PATH
from speech_to_speech.realtime.media import MEDIA_RATE, OutputAudioBuffer
from speech_to_speech.realtime.webrtc import EVENTS_CHANNEL, OutputTrack, frame_to_mono, low_latency_receiver

#: seconds to wait for the answer and for the data channel to open
CONNECT_TIMEOUT_S = 30.0


class CallError(ConnectError):
    """The server refused the call (``status`` is the HTTP status, 0 when it was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def post_offer(
    url: str,
    sdp: str,
    api_key: str | None = None,
    timeout_s: float = CONNECT_TIMEOUT_S,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[str, str]:
    """POST ``sdp`` to ``url`` as ``application/sdp``; return (the answer SDP, the Location header).

    ``ssl_context`` verifies an ``https://`` server (default: the system's trusted certificates).

    Raises:
        CallError: not 201 (with the server's error message), or the server cannot be reached.
    """
    headers = {"Content-Type": "application/sdp", "Accept": "application/sdp"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=sdp.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=ssl_context) as reply:
            if reply.status != 201:
                raise CallError(f"{url}: expected 201 Created, got {reply.status}", reply.status)
            return reply.read().decode(), reply.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            body = json.loads(body)["error"]["message"]
        raise CallError(f"{url}: {exc.code} {exc.reason}: {body}", exc.code) from None
    except (OSError, urllib.error.URLError) as exc:
        raise CallError(f"cannot reach {url}: {exc}") from exc


class WebRTCClient:
    """One call to a realtime server over WebRTC. Create it with :meth:`connect`.

    Attributes:
        pc: the peer connection.
        channel: the ``oai-events`` data channel.
        mic: the microphone's buffer (48 kHz mono float32), sent in real time.
        log: every server event, with receipt times.
        received: ``(receipt time, samples)`` of every audio frame from the server (48 kHz mono).
        on_audio: called with each frame as ``(receipt time, samples)``.
        call_url: the call's URL (``…/v1/realtime/calls/{id}``), from the answer's Location.
    """

    def __init__(self, pc: RTCPeerConnection, channel: Any, mic: OutputAudioBuffer) -> None:
        self.pc = pc
        self.channel = channel
        self.mic = mic
        self.received: list[tuple[float, np.ndarray]] = []
        self.on_audio: Callable[[float, np.ndarray], None] | None = None
        self.call_url = ""
        self.closed = False
        self._events: asyncio.Queue[str | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[Any]] = []
        self.log = EventLog(self._recv)

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = CONNECT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> WebRTCClient:
        """Place a call to the server at ``base_url`` (``http://HOST:PORT`` or ``https://``) and wait
        for the data channel (``ssl_context``: see :func:`post_offer`).

        Raises:
            CallError: the server refused the call or cannot be reached; the peer did not connect.
        """
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        mic = OutputAudioBuffer(rate=MEDIA_RATE)
        pc.addTrack(OutputTrack(mic, continuous=True))  # an open microphone: silence is sent too
        channel = pc.createDataChannel(EVENTS_CHANNEL)
        client = cls(pc, channel, mic)
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", lambda message: client._events.put_nowait(message))
        channel.on("close", lambda: client._events.put_nowait(None))
        pc.on("track", client._on_track)
        try:
            await pc.setLocalDescription(await pc.createOffer())
            url = base_url.rstrip("/") + CALLS_PATH
            offer = pc.localDescription.sdp
            answer, location = await asyncio.to_thread(post_offer, url, offer, api_key, timeout_s, ssl_context)
            client.call_url = base_url.rstrip("/") + location if location.startswith("/") else location
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            try:
                await asyncio.wait_for(opened.wait(), timeout_s)
            except TimeoutError:
                raise CallError(f"the data channel did not open within {timeout_s:g} s") from None
        except BaseException:
            await client.close()
            raise
        return client

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            low_latency_receiver(self.pc, track)
            self._tasks.append(asyncio.ensure_future(self._read_audio(track)))

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.monotonic()
            samples = frame_to_mono(frame)
            self.received.append((now, samples))
            if self.on_audio is not None:
                self.on_audio(now, samples)

    async def _recv(self) -> dict[str, Any]:
        while True:
            message = await self._events.get()
            if message is None:
                self._events.put_nowait(None)  # stays closed for later reads
                raise ConnectionError("the data channel closed")
            with contextlib.suppress(ValueError):
                event = json.loads(message)
                if isinstance(event, dict):
                    return event

    async def send(self, event: dict[str, Any]) -> bool:
        """Send a client event on the data channel; False, and nothing sent, once it is closed."""
        if self.closed or self.channel.readyState != "open":
            return False
        self.channel.send(json.dumps(event))
        return True

    def say(self, samples: np.ndarray, on_sent: Callable[[], None] | None = None) -> None:
        """Queue float32 mono ``samples`` at 48 kHz on the microphone, after what is queued.

        ``on_sent`` runs when their last sample has been sent.
        """
        self.mic.push(np.asarray(samples, dtype=np.float32))
        if on_sent is not None:
            self.mic.mark(on_sent)

    async def sent(self) -> float:
        """Wait until everything queued on the microphone has been sent; the monotonic time it was."""
        done = asyncio.get_running_loop().create_future()
        self.mic.mark(lambda: done.done() or done.set_result(time.monotonic()))
        return await done

    async def close(self) -> None:
        """Hang up: close the peer connection (the server ends the session) and stop reading."""
        self.closed = True
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await self.log.stop()
