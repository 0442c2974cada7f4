"""Helpers for testing the realtime server in process: a server thread, a raw client, audio blocks.

The client side (connection, :class:`EventLog`, wire audio) is :mod:`speech_to_speech.client.realtime`,
the same that s2s-talk (speech_to_speech/client/talk/) and the server benchmark use; the names tests use from it are
re-exported here (``load_clip`` is its ``load_wire_audio``: int16 at :data:`WIRE_RATE`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from speech_to_speech.client.realtime import (
    WIRE_RATE,
    EventLog,
    EventTimeout,
    PacedSender,
    RealtimeClient,
    append_event,
    decode_pcm16,
    encode_pcm16,
    event_type,
    float_to_int16,
    silence,
)
from speech_to_speech.client.realtime import load_wire_audio as load_clip
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.realtime.server import PATH, RealtimeServer
from speech_to_speech.realtime.session import RealtimeSession

__all__ = [
    "IDLE_TIMEOUT_S",
    "WIRE_RATE",
    "EventLog",
    "EventTimeout",
    "InProcessServer",
    "Microphone",
    "OverReply",
    "RawClient",
    "append_event",
    "audio_arrivals",
    "blocks",
    "decode_pcm16",
    "event_type",
    "load_clip",
    "longest_gap",
    "session_threads",
    "silence",
    "talk_over_reply",
    "transcription_of",
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
        args = parse_args(["--mode", "server", "--port", "0", "--device", "cpu", *flags])
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


# -- talking over a reply, like a microphone -----------------------------------------------------


class Microphone:
    """A client's microphone: :class:`~speech_to_speech.client.realtime.PacedSender` with an open
    mic (silence between utterances, in real time), noting when each utterance is sent.

    Attributes:
        said: per utterance, (when it was queued: its first block leaves within one block, when
            its last block was sent), monotonic s.
    """

    def __init__(self, client: RealtimeClient) -> None:
        self.sender = PacedSender(client, open_mic=True)
        self.said: list[list[float]] = []
        self._marks: list[asyncio.Task[None]] = []

    def say(self, samples: np.ndarray, rate: int = 16_000) -> None:
        """Queue an utterance, float32 mono at ``rate`` Hz (on the running loop)."""
        wire = soxr.resample(samples, rate, WIRE_RATE).astype(np.float32)
        times = [time.monotonic(), -1.0]
        self.said.append(times)
        self.sender.say(float_to_int16(wire))

        async def sent() -> None:
            await self.sender.drained()
            times[1] = time.monotonic()

        self._marks.append(asyncio.get_running_loop().create_task(sent()))

    async def stop(self) -> None:
        """Stop sending."""
        for task in self._marks:
            task.cancel()
        await self.sender.stop()


@dataclass
class OverReply:
    """What :func:`talk_over_reply` saw: every server event with its arrival time, when each
    utterance was sent (the question first), and the session's LLM history at the end."""

    events: list[dict[str, Any]]
    times: list[float]
    said: list[list[float]]
    history: list[dict[str, Any]]
    llm_heard: list[str]


async def talk_over_reply(
    url: str,
    question: np.ndarray,
    during_reply: list[np.ndarray],
    until: Callable[[list[dict[str, Any]]], bool],
    server: InProcessServer | None = None,
    playing_s: float = 1.5,
    every_s: float = 3.0,
    timeout_s: float = 60.0,
) -> OverReply:
    """Ask ``question`` (16 kHz) as a microphone would; once the reply's audio has been arriving
    for ``playing_s``, say each of ``during_reply`` (the next ``every_s`` later); return once
    ``until(events)`` holds (and 0.5 s more, for anything that would follow).

    Args:
        server: the in-process server, to read the session's history (and a scripted LLM's
            ``heard``) at the end; None: not read.

    Raises:
        EventTimeout: the reply or the end did not come within ``timeout_s``.
    """
    client = await RawClient.open(url)
    log = client.log
    mic = Microphone(client)
    try:
        created = await log.wait_for("session.created", timeout_s)
        await client.send({"type": "session.update", "session": {"type": "realtime"}})
        await log.wait_for("session.updated", timeout_s)
        mic.say(question)
        first = await log.wait_for("response.output_audio.delta", timeout_s)
        first_at = log.times[log.events.index(first)]
        for n, utterance in enumerate(during_reply):
            await asyncio.sleep(max(0.0, first_at + playing_s + every_s * n - time.monotonic()))
            mic.say(utterance)
        await log.wait_until(lambda: until(log.events), timeout_s, "the end of the conversation")
        await asyncio.sleep(0.5)
        history: list[dict[str, Any]] = []
        heard: list[str] = []
        if server is not None:
            session = server.session(created["session"]["id"])
            history = session.llm.chat.items()
            heard = list(getattr(session.llm, "heard", []))
        return OverReply(list(log.events), list(log.times), [list(t) for t in mic.said], history, heard)
    finally:
        await mic.stop()
        await client.close()


def audio_arrivals(events: list[dict[str, Any]], times: list[float], response_id: str) -> list[tuple[float, float]]:
    """(arrival time, seconds of audio) of each ``response.output_audio.delta`` of ``response_id``."""
    return [
        (t, len(base64.b64decode(e["delta"])) / 2 / WIRE_RATE)
        for e, t in zip(events, times, strict=True)
        if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
    ]


def longest_gap(arrivals: list[tuple[float, float]], start: float, end: float) -> tuple[float, float]:
    """(length, start) of the longest pause between audio arrivals from the last one before
    ``start`` to ``end`` (monotonic s); (0.0, start) if there are fewer than two."""
    before = [t for t, _ in arrivals if t < start]
    times = before[-1:] + [t for t, _ in arrivals if start <= t < end]
    gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
    return max(gaps) if gaps else (0.0, start)


async def transcription_of(log: EventLog, speech_started: dict[str, Any], timeout_s: float, what: str = "") -> Any:
    """The ``conversation.item.input_audio_transcription.completed`` event of the item that the
    ``input_audio_buffer.speech_started`` event ``speech_started`` opened (``what`` names it in a time-out)."""
    return await log.wait_for(
        lambda e: (
            e["type"] == "conversation.item.input_audio_transcription.completed"
            and e["item_id"] == speech_started["item_id"]
        ),
        timeout_s,
        what=what,
    )
