"""Helpers for testing the realtime server in process: a server thread, a raw client, audio on the wire."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr
from websockets.asyncio.client import ClientConnection, connect

from speech_to_speech.cli import parse_args
from speech_to_speech.realtime.server import PATH, RealtimeServer

#: the protocol's audio rate, Hz (pcm16 mono)
WIRE_RATE = 24_000


class InProcessServer:
    """A :class:`RealtimeServer` serving from its own asyncio loop in a daemon thread.

    The server object stays reachable, so tests can look at ``server.sessions``.

    Args:
        flags: extra command-line flags (``--mode server --port 0`` are always given).
        warm_up: load the models in the calling thread before serving.
    """

    def __init__(self, *flags: str, warm_up: bool = True) -> None:
        args = parse_args(["--mode", "server", "--port", "0", *flags])
        args.resolved_device = "cpu"
        self.server = RealtimeServer(args)
        self._warm_up = warm_up
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name="realtime-server", daemon=True)

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return int(self.server.port)

    @property
    def ws_url(self) -> str:
        """The realtime endpoint, ``ws://127.0.0.1:PORT/v1/realtime``."""
        return f"ws://127.0.0.1:{self.port}{PATH}"

    def start(self, timeout_s: float = 120.0) -> InProcessServer:
        """Warm up (when asked), start serving and wait until the socket is bound."""
        if self._warm_up:
            self.server.warm_up()
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the realtime server did not start listening")
        if self._failure is not None:
            raise RuntimeError("the realtime server failed to start") from self._failure
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Resolve the server's stop future and wait for its thread to end."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start()
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = self._loop.create_future()
        # Start the loop's default executor now (sessions start and close in it), so that its
        # idle worker thread already exists when a test counts threads.
        await self._loop.run_in_executor(None, lambda: None)
        ready = asyncio.Event()
        serving = asyncio.create_task(self.server.run(ready=ready, stop=self._stop))
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        self._ready.set()
        await serving


def event_type(event: Any) -> str:
    """The ``type`` of a server event, given as a dict or as an SDK model."""
    return str(event["type"] if isinstance(event, dict) else event.type)


class EventLog:
    """Reads server events in a background task, keeps them in arrival order, and waits on them.

    Args:
        recv: coroutine function returning the next server event (dict or SDK model);
            it raises once the connection is closed.
    """

    def __init__(self, recv: Callable[[], Awaitable[Any]]) -> None:
        self.events: list[Any] = []
        self.closed: BaseException | None = None
        self._recv = recv
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                event = await self._recv()
                async with self._changed:
                    self.events.append(event)
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

    async def wait_for(
        self, predicate: Callable[[Any], bool] | str, timeout_s: float, since: int = 0, what: str = ""
    ) -> Any:
        """The first event at index ``since`` or later that matches ``predicate`` (or has that type).

        Raises:
            AssertionError: on timeout, or if the connection closed first; lists the types seen.
        """
        match = (lambda e: event_type(e) == predicate) if isinstance(predicate, str) else predicate
        what = what or (predicate if isinstance(predicate, str) else "a matching event")

        def found() -> Any:
            return next((e for e in self.events[since:] if match(e)), None)

        async def wait() -> Any:
            async with self._changed:
                await self._changed.wait_for(lambda: found() is not None or self.closed is not None)
                return found()

        try:
            event = await asyncio.wait_for(wait(), timeout_s)
        except asyncio.TimeoutError:
            event = None
        if event is None:
            seen = [event_type(e) for e in self.events[since:]]
            reason = f"connection closed ({self.closed!r})" if self.closed is not None else f"{timeout_s:g} s passed"
            raise AssertionError(f"no {what}: {reason}; received since {since}: {seen}")
        return event

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until ``condition()`` holds; it is checked again whenever an event arrives.

        Raises:
            AssertionError: on timeout, or if the connection closed first.
        """

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: condition() or self.closed is not None)

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wait(), timeout_s)
        if not condition():
            reason = f"connection closed ({self.closed!r})" if self.closed is not None else f"{timeout_s:g} s passed"
            raise AssertionError(f"never {what}: {reason}")

    async def stop(self) -> None:
        """Stop reading."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class RawClient:
    """A plain ``websockets`` client of the realtime endpoint that logs every server event as a dict.

    Use :meth:`open` to connect; :meth:`close` ends the connection.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.log = EventLog(self._recv)

    @classmethod
    async def open(cls, url: str, headers: dict[str, str] | None = None) -> RawClient:
        """Connect to ``url`` (with extra HTTP ``headers``)."""
        ws = await connect(url, additional_headers=headers, max_size=16 * 1024 * 1024, open_timeout=120)
        return cls(ws)

    async def _recv(self) -> dict[str, Any]:
        return json.loads(await self.ws.recv())

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        """Send an event dict as JSON, or a raw text or binary frame as is."""
        await self.ws.send(json.dumps(event) if isinstance(event, dict) else event)

    async def close(self) -> None:
        """Close the connection (handshake) and stop reading."""
        with contextlib.suppress(Exception):
            await self.ws.close()
        await self.log.stop()

    def abort(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        self.ws.transport.abort()


# -- audio on the wire ------------------------------------------------------------------------
def load_clip(path: Path) -> np.ndarray:
    """A sound file as int16 mono samples at :data:`WIRE_RATE` (resampled with soxr)."""
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if rate != WIRE_RATE:
        mono = soxr.resample(mono, rate, WIRE_RATE)
    return np.round(np.clip(mono, -1.0, 1.0) * 32767.0).astype(np.int16)


def silence(seconds: float) -> np.ndarray:
    """``seconds`` of int16 silence at :data:`WIRE_RATE`."""
    return np.zeros(round(seconds * WIRE_RATE), dtype=np.int16)


def blocks(samples: np.ndarray, block_s: float = 0.1) -> Iterator[str]:
    """Base64 pcm16 (little-endian) payloads of successive ``block_s`` blocks of ``samples``."""
    size = round(block_s * WIRE_RATE)
    for start in range(0, len(samples), size):
        yield base64.b64encode(samples[start : start + size].astype("<i2").tobytes()).decode("ascii")


def decode_pcm16(payload: str) -> np.ndarray:
    """Base64 pcm16 → float32 samples in [-1, 1]."""
    return np.frombuffer(base64.b64decode(payload), dtype="<i2").astype(np.float32) / 32768.0


def append_event(audio: str) -> dict[str, Any]:
    """An ``input_audio_buffer.append`` event."""
    return {"type": "input_audio_buffer.append", "audio": audio}
