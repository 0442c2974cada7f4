"""Helpers for testing the realtime server in process: a server thread, a raw client, audio blocks.

The client side (connection, :class:`EventLog`, wire audio) is :mod:`speech_to_speech.realtime.client`,
the same that scripts/talk.py and the server benchmark use; the names tests use from it are
re-exported here (``load_clip`` is its ``load_wire_audio``: int16 at :data:`WIRE_RATE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np

from speech_to_speech.cli import parse_args
from speech_to_speech.realtime.client import (
    WIRE_RATE,
    EventLog,
    EventTimeout,
    RealtimeClient,
    append_event,
    decode_pcm16,
    encode_pcm16,
    event_type,
    silence,
)
from speech_to_speech.realtime.client import load_wire_audio as load_clip
from speech_to_speech.realtime.server import PATH, RealtimeServer
from speech_to_speech.realtime.session import RealtimeSession

__all__ = [
    "IDLE_TIMEOUT_S",
    "WIRE_RATE",
    "EventLog",
    "EventTimeout",
    "InProcessServer",
    "RawClient",
    "append_event",
    "blocks",
    "decode_pcm16",
    "event_type",
    "load_clip",
    "session_threads",
    "silence",
]

#: how long the sessions of a stopped or abandoned client may take to go away, s (a slow, shared machine)
IDLE_TIMEOUT_S = 300.0


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

    def session(self, session_id: str) -> RealtimeSession:
        """The live session with id ``session_id``."""
        found = [s for s in list(self.server.sessions) if s.id == session_id]
        assert found, f"no live session {session_id}"
        return found[0]

    def wait_until_idle(self, timeout_s: float = IDLE_TIMEOUT_S) -> None:
        """Wait until no session is registered and no session thread is alive (earlier clients are gone)."""
        deadline = time.monotonic() + timeout_s
        while self.server.sessions or session_threads():
            assert time.monotonic() < deadline, f"sessions did not go away: {session_threads()}"
            time.sleep(0.05)

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


def session_threads() -> list[str]:
    """Names of alive threads that belong to a realtime session (stages and their workers)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("sess_")]


class RawClient(RealtimeClient):
    """A client of the realtime endpoint that logs every server event, as a dict, in :attr:`log`.

    Use :meth:`open` to connect; :meth:`close` ends the connection. :meth:`send` takes an event
    dict or a raw text or binary frame.
    """

    log: EventLog

    @classmethod
    async def open(cls, url: str, headers: dict[str, str] | None = None) -> RawClient:
        """Connect to ``url`` (with extra HTTP ``headers``) and start logging."""
        client: RawClient = await cls.connect(url, headers=headers, open_timeout_s=120)
        client.start_log()
        return client


def blocks(samples: np.ndarray, block_s: float = 0.1) -> Iterator[str]:
    """Base64 pcm16 (little-endian) payloads of successive ``block_s`` blocks of int16 ``samples``."""
    size = round(block_s * WIRE_RATE)
    for start in range(0, len(samples), size):
        yield encode_pcm16(samples[start : start + size])
