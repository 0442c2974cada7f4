"""A client of the realtime protocol: one WebSocket connection, its server events, audio on the wire.

``s2s-talk`` (the terminal client, :mod:`speech_to_speech.client.talk`), ``scripts/benchmark_server.py`` and the tests
(``speech_to_speech/testing/realtime.py``) all talk to a realtime server through this module; the server itself
never imports it.

- :class:`RealtimeClient`: connects (with ``Authorization: Bearer KEY`` when given an API key), sends
  client events (dropped once the connection is closed) and receives the server's: one by one
  (``async for event in client``, for a consumer that handles each in order), or through
  :meth:`RealtimeClient.start_log`, a background :class:`EventLog` that keeps every event with its
  receipt time and waits for one of a type, one that matches, or a condition.
- :class:`PacedSender`: audio sent as ``input_audio_buffer.append`` blocks on an absolute real-time
  schedule, as a microphone would deliver it.
- Audio on the wire is pcm16 mono at :data:`WIRE_RATE` Hz, base64 in JSON
  (:func:`encode_pcm16` / :func:`decode_pcm16`). Files are read and resampled with soxr by
  :func:`speech_to_speech.speech.audio_io.load_audio` (:func:`load_wire_audio`); a stream is
  resampled chunk by chunk with :class:`speech_to_speech.core.audio.StreamResampler`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, WebSocketException

from speech_to_speech.core.audio import WIRE_RATE, float_to_int16
from speech_to_speech.speech.audio_io import load_audio

#: seconds of audio in one input_audio_buffer.append block
BLOCK_S = 0.040
#: samples in one append block at WIRE_RATE
BLOCK_SAMPLES = round(WIRE_RATE * BLOCK_S)
#: largest server message accepted, bytes (a long audio delta is well below)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: seconds the WebSocket handshake may take
OPEN_TIMEOUT_S = 10.0


# -- audio on the wire --------------------------------------------------------------------------


def encode_pcm16(samples: np.ndarray) -> str:
    """Base64 of int16 samples as 16-bit little-endian PCM."""
    return base64.b64encode(np.asarray(samples, dtype="<i2").tobytes()).decode("ascii")


def decode_pcm16(payload: str) -> np.ndarray:
    """Base64 16-bit little-endian PCM to an int16 array.

    Raises:
        ValueError: not base64 (``binascii.Error``), or an odd number of bytes.
    """
    raw = base64.b64decode(payload, validate=True)
    if len(raw) % 2:
        raise ValueError(f"pcm16 audio must have an even number of bytes, not {len(raw)}")
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def pcm16_bytes(payload: str) -> int:
    """Decoded size in bytes of a base64 string (without decoding it)."""
    return len(payload) * 3 // 4 - payload[-2:].count("=")


def silence(seconds: float) -> np.ndarray:
    """``seconds`` of int16 silence at :data:`WIRE_RATE`."""
    return np.zeros(round(seconds * WIRE_RATE), dtype=np.int16)


def load_wire_audio(path: str | Path) -> np.ndarray:
    """Any file libsndfile reads, as int16 mono at :data:`WIRE_RATE` (through ``audio_io.load_audio``).

    Raises:
        FileNotFoundError, IsADirectoryError, ValueError: as ``load_audio``.
    """
    return float_to_int16(load_audio(path, WIRE_RATE))


def append_event(payload: str) -> dict[str, Any]:
    """An ``input_audio_buffer.append`` event carrying base64 pcm16 ``payload``."""
    return {"type": "input_audio_buffer.append", "audio": payload}


class Blocker:
    """Cuts a stream of int16 samples into blocks of a fixed number of samples."""

    def __init__(self, block_samples: int) -> None:
        self._block = block_samples
        self._pending = np.zeros(0, dtype=np.int16)

    def feed(self, samples: np.ndarray) -> list[np.ndarray]:
        """Add samples; return every complete block now available."""
        self._pending = np.concatenate([self._pending, samples])
        count = len(self._pending) // self._block
        blocks = [self._pending[i * self._block : (i + 1) * self._block] for i in range(count)]
        self._pending = self._pending[count * self._block :]
        return blocks


def session_update(
    turn_detection: dict[str, Any] | None,
    *,
    instructions: str | None = None,
    voice: str | None = None,
    transcription_model: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ``session.update`` for spoken replies, audio in and out as pcm16 at :data:`WIRE_RATE`.

    ``turn_detection`` None means manual turns (the client commits); with ``tools``,
    ``tool_choice`` is "auto". Fields left None are not sent (the server keeps its own).
    """
    audio_in: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": WIRE_RATE}, "turn_detection": turn_detection}
    if transcription_model:
        audio_in["transcription"] = {"model": transcription_model}
    audio_out: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": WIRE_RATE}}
    if voice:
        audio_out["voice"] = voice
    session: dict[str, Any] = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": audio_in, "output": audio_out},
    }
    if instructions:
        session["instructions"] = instructions
    if tools:
        session["tools"] = [dict(tool) for tool in tools]
        session["tool_choice"] = "auto"
    return {"type": "session.update", "session": session}


# -- server events --------------------------------------------------------------------------------


def event_type(event: Any) -> str:
    """The ``type`` of a server event, given as a dict or as an SDK model."""
    return str(event["type"] if isinstance(event, dict) else event.type)


class EventTimeout(TimeoutError):
    """The awaited event or condition did not come in time, or the connection closed first."""


class EventLog:
    """Reads server events in a background task, keeps them in arrival order, and waits on them.

    ``events[i]`` arrived at ``times[i]`` (``time.monotonic()`` right after it was received).
    Create it inside a running event loop.

    Args:
        recv: coroutine function returning the next server event (a dict, or an SDK model);
            it raises once the connection is closed (:attr:`closed` then holds the exception).
        on_event: called with each event and its receipt time as it arrives, before waiters wake.
    """

    def __init__(
        self, recv: Callable[[], Awaitable[Any]], on_event: Callable[[Any, float], None] | None = None
    ) -> None:
        self.events: list[Any] = []
        self.times: list[float] = []
        self.closed: BaseException | None = None
        self._recv = recv
        self._on_event = on_event
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                event = await self._recv()
                now = time.monotonic()
                async with self._changed:
                    self.events.append(event)
                    self.times.append(now)
                    if self._on_event is not None:
                        self._on_event(event, now)
                    self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection ended
            async with self._changed:
                self.closed = exc
                self._changed.notify_all()

    def of(self, kind: str, since: int = 0) -> list[Any]:
        """Events of type ``kind`` received at index ``since`` or later."""
        return [e for e in self.events[since:] if event_type(e) == kind]

    def index(self, event: Any) -> int:
        """Arrival position of ``event`` (by identity)."""
        return next(i for i, e in enumerate(self.events) if e is event)

    async def until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``condition()`` holds (checked again on every event); its value at the end.

        Returns False when ``timeout_s`` passes or the connection closes first.
        """

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: condition() or self.closed is not None)

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wait(), timeout_s)
        return condition()

    def _why(self, timeout_s: float) -> str:
        return f"connection closed ({self.closed!r})" if self.closed is not None else f"{timeout_s:g} s passed"

    async def wait_for(
        self, predicate: Callable[[Any], bool] | str, timeout_s: float, since: int = 0, what: str = ""
    ) -> Any:
        """The first event at index ``since`` or later that matches ``predicate`` (or has that type).

        Raises:
            EventTimeout: on timeout, or if the connection closed first; lists the types seen.
        """
        match = (lambda e: event_type(e) == predicate) if isinstance(predicate, str) else predicate

        def found() -> Any:
            return next((e for e in self.events[since:] if match(e)), None)

        if not await self.until(lambda: found() is not None, timeout_s):
            what = what or (predicate if isinstance(predicate, str) else "a matching event")
            seen = [event_type(e) for e in self.events[since:]]
            raise EventTimeout(f"no {what}: {self._why(timeout_s)}; received since {since}: {seen}")
        return found()

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until ``condition()`` holds; it is checked again whenever an event arrives.

        Raises:
            EventTimeout: on timeout, or if the connection closed first.
        """
        if not await self.until(condition, timeout_s):
            raise EventTimeout(f"never {what}: {self._why(timeout_s)}")

    async def stop(self) -> None:
        """Stop reading."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


# -- the connection ------------------------------------------------------------------------------


class ConnectError(Exception):
    """The server cannot be reached, or refused the WebSocket handshake (message for the user)."""


class RealtimeClient:
    """One open connection to a realtime server.

    Server events are read either by iterating the client or by :meth:`start_log`, not both.

    Attributes:
        ws: the ``websockets`` connection.
        closed: set once the connection is known to be closed (received, sent into, or closed here).
        close_reason: why the server side ended it (``code N: reason``), None while open or when
            it closed cleanly.
        log: the :class:`EventLog` once :meth:`start_log` was called.
        on_invalid: called with each text frame that is not JSON (such frames are skipped).
    """

    def __init__(self, ws: ClientConnection, *, on_invalid: Callable[[str], None] | None = None) -> None:
        self.ws = ws
        self.closed = False
        self.close_reason: str | None = None
        self.log: EventLog | None = None
        self.on_invalid = on_invalid

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        open_timeout_s: float = OPEN_TIMEOUT_S,
        **kwargs: Any,
    ) -> Any:
        """Open ``url`` (``ws://HOST:PORT/v1/realtime``); ``api_key`` is sent as a Bearer token.

        Extra keyword arguments go to the constructor (of a subclass, too).

        Raises:
            ConnectError: ``cannot connect to URL: why``.
        """
        sent = dict(headers or {})
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        try:
            ws = await connect(
                url, additional_headers=sent or None, max_size=MAX_MESSAGE_BYTES, open_timeout=open_timeout_s
            )
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConnectError(f"cannot connect to {url}: {exc}") from exc
        return cls(ws, **kwargs)

    # -- sending -----------------------------------------------------------------------------------

    async def send(self, event: dict[str, Any] | str | bytes) -> bool:
        """Send a client event (a dict, as JSON) or a raw frame; False, and nothing sent, once closed."""
        if self.closed:
            return False
        try:
            await self.ws.send(json.dumps(event) if isinstance(event, dict) else event)
        except ConnectionClosed:
            self.closed = True
            return False
        return True

    async def append_audio(self, samples: np.ndarray) -> bool:
        """Send int16 samples at :data:`WIRE_RATE` as one ``input_audio_buffer.append``."""
        return await self.send(append_event(encode_pcm16(samples)))

    # -- receiving ---------------------------------------------------------------------------------

    async def recv(self) -> dict[str, Any]:
        """The next server event.

        Binary frames and JSON that is not an object are skipped; text that is not JSON is
        skipped and handed to :attr:`on_invalid`.

        Raises:
            ConnectionClosed: the connection is closed (:attr:`close_reason` says why).
        """
        while True:
            try:
                message = await self.ws.recv()
            except ConnectionClosed as exc:
                self.closed = True
                if not isinstance(exc, ConnectionClosedOK):
                    rcvd = exc.rcvd
                    self.close_reason = f"code {rcvd.code}: {rcvd.reason}" if rcvd else "code 1006: no close frame"
                raise
            if isinstance(message, bytes):
                continue
            try:
                event = json.loads(message)
            except ValueError:
                if self.on_invalid is not None:
                    self.on_invalid(message)
                continue
            if isinstance(event, dict):
                return event

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        """Server events, in order, until the connection closes."""
        while True:
            try:
                event = await self.recv()
            except ConnectionClosed:
                return
            yield event

    def start_log(self, on_event: Callable[[Any, float], None] | None = None) -> EventLog:
        """Read every further event into an :class:`EventLog` (:attr:`log`) in a background task."""
        self.log = EventLog(self.recv, on_event)
        return self.log

    # -- ending ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection (closing handshake) and stop the log."""
        self.closed = True
        with contextlib.suppress(Exception):
            await self.ws.close()
        if self.log is not None:
            await self.log.stop()

    def abort(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        self.ws.transport.abort()


class PacedSender:
    """Sends queued audio as ``input_audio_buffer.append`` blocks on an absolute real-time schedule.

    Block ``i`` of a stretch leaves at start + (i + 1) × block duration / ``speed``, when it "has
    been recorded". With ``open_mic`` it sends silence whenever nothing is queued (one unbroken
    stream); otherwise it pauses, and the next :meth:`say` starts a new schedule. It stops once
    the connection is closed.

    Args:
        client: where the blocks go.
        speed: pace multiplier (1.0 = real time).
        open_mic: keep sending silence when nothing is queued.
        block_samples: samples per block at :data:`WIRE_RATE` (the last block of a stretch may be
            shorter, unless ``open_mic`` pads it with silence).
    """

    def __init__(
        self, client: RealtimeClient, speed: float = 1.0, open_mic: bool = False, block_samples: int = BLOCK_SAMPLES
    ) -> None:
        self.client = client
        self.block_samples = block_samples
        self.block_s = block_samples / WIRE_RATE / speed
        self.open_mic = open_mic
        self._pending = np.zeros(0, dtype=np.int16)
        self._start_at: float | None = None
        self._fed = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None

    def say(self, samples: np.ndarray, start: float | None = None) -> None:
        """Queue ``samples`` (int16 at :data:`WIRE_RATE`) after what is already queued.

        ``start``: when a new schedule begins with them, its time zero (``time.monotonic()``
        seconds; default: when the first block is due to be counted, i.e. now).
        """
        self._pending = np.concatenate([self._pending, samples.astype(np.int16)])
        self._start_at = start
        self._drained.clear()
        self._fed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def drained(self) -> None:
        """Wait until everything queued has been sent (or the connection closed)."""
        await self._drained.wait()

    async def stop(self) -> None:
        """Stop sending."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        try:
            await self._send_blocks()
        finally:  # the connection closed: nothing more will be sent
            self._drained.set()

    async def _send_blocks(self) -> None:
        start: float | None = None
        index = 0
        size = self.block_samples
        while not self.client.closed:
            if not len(self._pending) and not self.open_mic:
                self._fed.clear()
                await self._fed.wait()
                start = None
            if start is None:
                start, index = (self._start_at if self._start_at is not None else time.monotonic()), 0
                self._start_at = None
            index += 1
            delay = start + index * self.block_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            block, self._pending = self._pending[:size], self._pending[size:]
            if len(block) < size and self.open_mic:
                block = np.concatenate([block, np.zeros(size - len(block), dtype=np.int16)])
            if len(block):
                await self.client.append_audio(block)
            if not len(self._pending):
                self._drained.set()
