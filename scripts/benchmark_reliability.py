#!/usr/bin/env python
"""Reliability of the realtime server under load and faults: soak, sequential sessions, fuzz,
provider faults and concurrency, each with its figures next to the goals they must meet.

Everything runs on loopback (127.0.0.1) and every loop is bounded in count and in time. The
server is started as a subprocess on a free port (flags after ``--`` go to it unchanged), and is
talked to through :mod:`speech_to_speech.client.realtime`:

- the **scripted server** (phases soak, sessions, fuzz, faults): the default VAD, STT and TTS
  models, and the ``responses-api`` backend pointed at the scriptable ``/v1/responses`` endpoint
  of ``speech_to_speech/testing/responses_server.py`` running in this process, so that turns are fast and the
  provider can be made to fail on purpose;
- the **default server** (phase concurrency): every default model, the embedded LLM included,
  with ``--max_sessions`` equal to the highest concurrency level.

Phases (``--phases``, default all, in this order):

1. **soak**: one session, ``--turns`` turns (default 500): every ``--audio_every``-th turn is
   spoken (a LibriVox clip sent faster than real time, the server's VAD ends the turn), half-way
   between them a typed turn with a spoken reply, the others typed turns with text replies.
   Figures: server RSS after ``--soak_warmup`` turns and at the end (goal: growth <= 5 %), server
   threads before the session and after it closed (goal: back to the baseline), responses started
   vs ended (``response.created`` vs ``response.done``; goal: equal).
2. **sessions**: ``--sessions`` sequential sessions (default 200): connect, ``session.update``, one
   typed turn with a spoken reply, close; every 10th client disconnects without a closing handshake
   at the reply's first audio (mid-response). Figures: RSS after ``--sessions_warmup`` sessions and
   at the end (goal: <= 20 MB more), the growth per session after the warm-up (least squares),
   threads vs baseline, responses started vs ended (clients that stayed to the end).
3. **fuzz**: ``--fuzz_events`` (default 10,000) malformed, oversized, out-of-order and random
   client events over ``--fuzz_sessions`` sessions, from a generator seeded with ``--seed``: text
   that is not JSON, JSON that is not an object, no or a non-string ``type``, unknown types,
   binary frames, known events with fields of the wrong type or shape, bad base64 and odd-length
   audio, events that make no sense now (cancel with no response, truncate/retrieve/delete of an
   unknown item, the output of an unknown call), and frames over ``--max_message_kb`` (these end
   the connection with close code 1009; the client reconnects). Each event is sent, then its
   answer awaited. Figures: server crashes (goal: 0), bad events answered by an ``error`` event
   (goal: all but the oversized frames, which get close 1009), answers that name the event (its
   ``event_id`` echoed, for the events that have one), internal errors (``server_error``), and a
   fresh client served afterwards (goal: yes).
4. **faults**: the provider fails in one way per case: HTTP 500, HTTP 429, the connection reset
   mid-stream, a malformed stream, a stall before the first token, a stall after it, an empty
   reply, a reply that is only a tool call. Each case is one typed turn with a spoken reply, then
   a normal turn (for the tool call: its output, then ``response.create``). Figures per case:
   ``response.done`` count for the failing response (goal: exactly 1), its status, what was spoken
   (goal: a spoken line: some audio with its transcript; for the tool call, the follow-up), the
   longest silence from the user's message to the end of that audio (goal: <= 10 s), time to
   ``response.done``, and whether the next turn was answered (goal: yes).
5. **concurrency**: 1, 2 and 4 (``--levels``) simultaneous sessions on real speech (LibriVox clips
   at real-time pace), ``--rounds`` rounds per level. Figures per level: voice-to-voice p50/p90
   (the end of the clip's speech as sent -> the reply's first ``response.output_audio.delta``
   received, as in ``benchmark_server.py``), the same from ``speech_stopped`` received
   ("after stop", which leaves out the end-of-turn wait), and what the client one over ``--max_sessions``
   gets (goal: an ``error`` with code ``max_sessions_reached`` and close code 1013).

Measured (2 shared cores, defaults): soak 590.7 -> 594.7 MB (0.7 %), threads 7 -> 7 (peak 13), 500
of 500 responses ended; sessions 580.1 MB after 20 -> 580.7 MB after 200 (3 KiB per session),
threads 7 -> 7, 180 of 180 responses ended (20 clients dropped mid-response); fuzz 10,000 events (20
oversized: closed with 1009), 9,980 of 9,980 answered by an error, 6,551 of 6,551 with an event_id
echoed, 0 internal errors, no crash, a fresh client served; every provider fault one response.done
and a spoken line, the next turn answered (first audio after 0.2 s for the failures, 6.3 s for a
stall before the first token, 0.6 s for a stall after it: the sentence before the stall, then the
apology at 20 s); ``speech_stopped`` -> first audio p50/p90 491/573 ms (1 session), 676/1083 ms (2),
807/1102 ms (4) (then named voice-to-voice), the fifth client refused with max_sessions_reached and
close code 1013. With ``--next_token_timeout_s`` (default 5 s), faults again (2026-12-02, 2 shared
cores, load 3-5, ``--phases faults --seed 9137``): a stall after the first token now has its apology
5 s after its last token, longest silence 4.3 s and done at 9.3 s (before: 19.6 s and 24.6 s); a
stall before it 6.8 s of silence; the others at most 1.2 s.

RSS and threads are the server process's (psutil), read once the server has settled (sessions
closed), after two priming sessions on the scripted server (first inferences, and the event loop's
executor threads, a pool that keeps its idle workers). Exit status: 0 when every goal is met, 1
otherwise (or when a server could not start), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speech_to_speech.client.realtime import (
    BLOCK_SAMPLES,
    EventLog,
    EventTimeout,
    RealtimeClient,
    event_type,
    session_update,
    silence,
)
from speech_to_speech.testing.bench import REPO_ROOT, cell, find_clips, free_port, percentile, print_table, split_extra
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from speech_to_speech.testing.results import load_average
from speech_to_speech.testing.server_runs import BenchmarkError, Clip, Options, ServerProcess, load_clip, speak_one_turn

PROG = "benchmark_reliability.py"
PHASES = ("soak", "sessions", "fuzz", "faults", "concurrency")
#: the only address anything here listens on or connects to
LOOPBACK = "127.0.0.1"
#: the longest a single wait for a server event may take, s
WAIT_S = 60.0
#: a stalled provider stalls this long (far beyond every time-out of the server), s
STALL_S = 120.0
#: the longest a provider fault may leave the user in silence before something is said, s (issue 30)
MAX_SILENCE_S = 10.0
#: close code of a full server, and of a frame over the size limit
CLOSE_TRY_AGAIN_LATER, CLOSE_MESSAGE_TOO_BIG = 1013, 1009
#: silence after a spoken clip so that the server's VAD ends the turn, s
TRAILING_SILENCE_S = 1.2
#: the scripted provider's reply to normal turns
REPLY = Reply([Text(["Sure, ", "here you go."])])
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# -- the server under test ----------------------------------------------------------------------


class Target:
    """A realtime server to talk to: its URL, and its process's RSS, threads and liveness.

    Args:
        url: ``ws://127.0.0.1:PORT/v1/realtime``.
        pid: the server's process id (psutil reads it).
        alive: returns False once the server process has died.
    """

    def __init__(self, url: str, pid: int, alive: Callable[[], bool]) -> None:
        import psutil

        self.url = url
        self.alive = alive
        self._process = psutil.Process(pid)

    def rss_mb(self) -> float:
        """Resident memory, MiB."""
        return self._process.memory_info().rss / 2**20

    def threads(self) -> int:
        """Threads of the process."""
        return self._process.num_threads()

    async def settle(self, baseline_threads: int | None, timeout_s: float = 15.0) -> int:
        """Wait until the thread count is back to ``baseline_threads`` (closed sessions are gone), at
        most ``timeout_s``, then a little more for the memory release after a close; the count."""
        deadline = time.monotonic() + timeout_s
        while baseline_threads is not None and self.threads() > baseline_threads and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        return self.threads()


def start_server(flags: list[str], log: Any) -> tuple[ServerProcess, Target]:
    """Start ``s2s_pipeline.py --mode server`` on a free loopback port with ``flags``.

    Raises:
        BenchmarkError: it exited or did not listen within 10 minutes.
    """
    port = free_port(LOOPBACK)
    command = [sys.executable, str(REPO_ROOT / "s2s_pipeline.py"), "--mode", "server", "--host", LOOPBACK]
    server = ServerProcess([*command, "--port", str(port), *flags], log)
    server.start()
    url = server.wait_ready(600)
    if not url.startswith(f"ws://{LOOPBACK}:"):
        server.stop()
        raise BenchmarkError(f"the server listens on {url}, not on loopback")
    assert server.proc is not None
    return server, Target(url, server.pid, lambda: server.proc is not None and server.proc.poll() is None)


# -- a client session ---------------------------------------------------------------------------


def user_text(text: str) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


def response_id(event: dict[str, Any]) -> str:
    return str(event.get("response_id") or (event.get("response") or {}).get("id") or "")


class Session:
    """One client connection with an :class:`EventLog`, and the turns run on it."""

    def __init__(self, client: RealtimeClient, log: EventLog) -> None:
        self.client = client
        self.log = log

    @classmethod
    async def open(cls, url: str, retries: int = 40) -> Session:
        """Connect and wait for ``session.created`` (retrying while a closing session still fills the server).

        Raises:
            BenchmarkError: no session within the retries.
        """
        for _ in range(retries):
            client = await RealtimeClient.connect(url)
            log = client.start_log()
            first = await log.wait_for(lambda e: True, WAIT_S, what="a first event")
            if event_type(first) == "session.created":
                return cls(client, log)
            await log.stop()
            await client.close()
            if (first.get("error") or {}).get("code") != "max_sessions_reached":
                raise BenchmarkError(f"unexpected first event: {json.dumps(first)[:200]}")
            await asyncio.sleep(0.25)
        raise BenchmarkError("the server stayed full")

    async def update(self, turn_detection: dict[str, Any] | None, **extra: Any) -> None:
        """``session.update`` for spoken replies; waits for ``session.updated``."""
        since = len(self.log.events)
        event = session_update(turn_detection)
        event["session"].update(extra)
        await self.client.send(event)
        await self.log.wait_for("session.updated", WAIT_S, since=since)

    def count(self, kind: str) -> int:
        return len(self.log.of(kind))

    async def typed_turn(self, text: str, audio: bool = True, abort_at_audio: bool = False) -> dict[str, Any] | None:
        """A user message and ``response.create``; the reply's ``response.done`` (None when aborted).

        With ``abort_at_audio`` the connection is dropped (no closing handshake) at the reply's
        first audio delta.
        """
        since = len(self.log.events)
        await self.client.send(user_text(text))
        await self.client.send(
            {"type": "response.create", "response": {"output_modalities": ["audio" if audio else "text"]}}
        )
        created = await self.log.wait_for("response.created", WAIT_S, since=since)
        rid = created["response"]["id"]
        if abort_at_audio:
            await self.log.wait_for(
                lambda e: e.get("type") == "response.output_audio.delta" and e.get("response_id") == rid, WAIT_S, since
            )
            self.client.abort()  # no closing handshake
            return None
        return await self.done(rid, since)

    async def done(self, rid: str, since: int = 0, timeout_s: float = WAIT_S) -> dict[str, Any]:
        return await self.log.wait_for(
            lambda e: e.get("type") == "response.done" and e["response"]["id"] == rid, timeout_s, since, "response.done"
        )

    async def spoken_turn(self, clip: Clip) -> dict[str, Any]:
        """Send ``clip`` (faster than real time) and silence; the ``response.done`` of the reply to it."""
        since = len(self.log.events)
        audio = np.concatenate([clip.samples, silence(TRAILING_SILENCE_S)])
        for start in range(0, len(audio), BLOCK_SAMPLES):
            await self.client.append_audio(audio[start : start + BLOCK_SAMPLES])
        stopped = await self.log.wait_for("input_audio_buffer.speech_stopped", WAIT_S, since=since)
        at = self.log.index(stopped)
        created = await self.log.wait_for("response.created", WAIT_S, since=at)
        return await self.done(created["response"]["id"], at)

    async def idle(self, timeout_s: float = WAIT_S) -> None:
        """Wait until every response created so far has ended."""
        await self.log.wait_until(
            lambda: self.count("response.created") <= self.count("response.done"), timeout_s, "all responses ended"
        )

    async def close(self) -> None:
        await self.log.stop()
        await self.client.close()


def spoken_text(events: list[dict[str, Any]], rid: str) -> tuple[float, str]:
    """(seconds of audio, transcript) of response ``rid``."""
    audio = sum(
        len(base64.b64decode(e["delta"])) / 2 / 24_000
        for e in events
        if e.get("type") == "response.output_audio.delta" and e.get("response_id") == rid
    )
    words = "".join(
        e["delta"]
        for e in events
        if e.get("type") == "response.output_audio_transcript.delta" and e.get("response_id") == rid
    )
    return audio, words.strip()


def longest_silence(log: EventLog, rids: set[str], since: int, began: float) -> float:
    """The longest stretch, s, from ``began`` to the end of the last audio of responses ``rids``
    in which none of their audio played: each audio delta (24 kHz pcm16) plays from its receipt, or
    right after the audio before it when that still plays (as a client's player does)."""
    playing_until, longest = began, 0.0
    for event, at in zip(log.events[since:], log.times[since:], strict=True):
        if event.get("type") == "response.output_audio.delta" and event.get("response_id") in rids:
            longest = max(longest, at - playing_until)
            playing_until = max(at, playing_until) + len(base64.b64decode(event["delta"])) / 2 / 24_000
    return longest


def first_audio_after(log: EventLog, rid: str, since: int, began: float) -> float | None:
    """Seconds from ``began`` to the receipt of response ``rid``'s first audio delta."""
    for event, at in zip(log.events[since:], log.times[since:], strict=True):
        if event.get("type") == "response.output_audio.delta" and event.get("response_id") == rid:
            return at - began
    return None


# -- results -----------------------------------------------------------------------------------


@dataclass
class Goal:
    """One figure next to its goal."""

    name: str
    value: str
    goal: str
    met: bool


@dataclass
class Report:
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, value: str, goal: str, met: bool) -> None:
        self.goals.append(Goal(name, value, goal, met))


def slope_mb(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (index, MiB) points, MiB per index."""
    if len(points) < 2:
        return None
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    return float(np.polyfit(x, y, 1)[0])


async def prime(target: Target, count: int = 2) -> None:
    """A few sessions before anything is measured: the first inference of every stage, and the
    server's executor threads (a pool that grows to the work it gets and keeps its idle workers),
    are in place before a thread or memory baseline is taken."""
    for i in range(count):
        session = await Session.open(target.url)
        try:
            await session.update({"type": "server_vad"})
            await session.typed_turn(f"Warm-up {i}.")
        finally:
            await session.close()
    await target.settle(None)


# -- 1. soak ------------------------------------------------------------------------------------


@dataclass
class SoakResult:
    turns: int = 0
    spoken_turns: int = 0
    rss_warm_mb: float | None = None
    rss_end_mb: float | None = None
    threads_base: int = 0
    threads_peak: int = 0
    threads_end: int = 0
    started: int = 0
    ended: int = 0
    failed_turns: list[str] = field(default_factory=list)


async def soak(target: Target, clip: Clip, turns: int, audio_every: int, warmup: int, limit_s: float) -> SoakResult:
    """One session, ``turns`` turns; see the module docstring."""
    result = SoakResult()
    deadline = time.monotonic() + limit_s
    result.threads_base = await target.settle(None)
    session = await Session.open(target.url)
    try:
        await session.update({"type": "server_vad", "create_response": True, "interrupt_response": True})
        for i in range(turns):
            if time.monotonic() > deadline:
                result.failed_turns.append(f"stopped at turn {i}: --time_limit_s")
                break
            try:
                if audio_every and i % audio_every == 0:
                    done = await session.spoken_turn(clip)
                    result.spoken_turns += 1
                else:
                    audio = bool(audio_every) and i % audio_every == audio_every // 2
                    done = await session.typed_turn(f"Turn {i}: tell me something.", audio=audio)
                assert done is not None
                if done["response"]["status"] != "completed":
                    result.failed_turns.append(f"turn {i}: {done['response']['status']}")
                await session.idle()
            except EventTimeout as exc:
                result.failed_turns.append(f"turn {i}: {exc}"[:200])
                await session.idle(10)
            result.turns = i + 1
            result.threads_peak = max(result.threads_peak, target.threads())
            if i + 1 == warmup:
                result.rss_warm_mb = target.rss_mb()
        result.rss_end_mb = target.rss_mb()
        result.started, result.ended = session.count("response.created"), session.count("response.done")
    finally:
        await session.close()
    result.threads_end = await target.settle(result.threads_base)
    return result


# -- 2. sequential sessions ---------------------------------------------------------------------


@dataclass
class SessionsResult:
    sessions: int = 0
    aborted: int = 0
    rss: list[tuple[int, float]] = field(default_factory=list)  # (sessions done, MiB)
    threads_base: int = 0
    threads_end: int = 0
    started: int = 0
    ended: int = 0
    failures: list[str] = field(default_factory=list)


async def sessions(target: Target, count: int, warmup: int, limit_s: float, abort_every: int = 10) -> SessionsResult:
    """``count`` sequential sessions, one typed turn each; see the module docstring."""
    result = SessionsResult()
    deadline = time.monotonic() + limit_s
    result.threads_base = await target.settle(None)
    result.rss.append((0, target.rss_mb()))
    for i in range(count):
        if time.monotonic() > deadline:
            result.failures.append(f"stopped after {i} sessions: --time_limit_s")
            break
        abort = bool(abort_every) and i % abort_every == abort_every - 1
        try:
            session = await Session.open(target.url)
            try:
                await session.update({"type": "server_vad"})
                done = await session.typed_turn(f"Session {i}: say hello.", abort_at_audio=abort)
                if done is not None and done["response"]["status"] != "completed":
                    result.failures.append(f"session {i}: {done['response']['status']}")
                if not abort:
                    result.started += session.count("response.created")
                    result.ended += session.count("response.done")
            finally:
                await session.close()
        except (EventTimeout, BenchmarkError) as exc:
            result.failures.append(f"session {i}: {exc}"[:200])
        result.aborted += abort
        result.sessions = i + 1
        await target.settle(result.threads_base)
        result.rss.append((i + 1, target.rss_mb()))
    result.threads_end = await target.settle(result.threads_base)
    return result


# -- 3. fuzz ------------------------------------------------------------------------------------


class BadEvents:
    """Seeded generator of client frames the server must refuse.

    :meth:`next` returns ``(category, frame, event_id)``: the frame (text or bytes) and the
    ``event_id`` an answer must echo (None when the frame carries none, or cannot be read).
    """

    KNOWN = (
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "output_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
    )

    def __init__(self, seed: int, max_message_kb: int, oversized_every: int = 500) -> None:
        self.rng = random.Random(seed)
        self.max_bytes = max_message_kb * 1024
        self.oversized_every = oversized_every
        self.count = 0
        self.makers: list[tuple[str, Callable[[str], dict[str, Any] | str | bytes]]] = [
            ("not_json", self._not_json),
            ("not_object", self._not_object),
            ("no_type", self._no_type),
            ("unknown_type", self._unknown_type),
            ("binary", self._binary),
            ("wrong_field", self._wrong_field),
            ("bad_audio", self._bad_audio),
            ("out_of_order", self._out_of_order),
            ("random_fields", self._random_fields),
        ]

    # random values
    def _text(self, n: int = 12) -> str:
        alphabet = string.ascii_letters + string.digits + " _-.:/{}[]\"'\\éß漢🙂"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(0, n)))

    def _value(self, depth: int = 0) -> Any:
        kind = self.rng.randrange(8 if depth < 3 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return self.rng.random() < 0.5
        if kind == 2:
            return self.rng.randint(-(2**40), 2**40)
        if kind == 3:
            return self.rng.uniform(-1e9, 1e9)
        if kind in (4, 5):
            return self._text()
        if kind == 6:
            return [self._value(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self._text(6): self._value(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def _non(self, *types: type) -> Any:
        """A random JSON value of none of ``types`` (a bool counts as an int only when int is listed)."""
        while True:
            value = self._value()
            if not isinstance(value, types):
                return value

    # categories (each returns the event, or a raw frame)
    def _not_json(self, event_id: str) -> str:
        while True:
            text = self._text(40) + self.rng.choice(["{", "[", '"', "}", ":", ",", "nul"])
            try:
                json.loads(text)
            except ValueError:
                return text

    def _not_object(self, event_id: str) -> str:
        return json.dumps(self._non(dict))

    def _no_type(self, event_id: str) -> dict[str, Any]:
        event = {"event_id": event_id, "payload": self._value()}
        if self.rng.random() < 0.5:
            event["type"] = self._non(str)
        return event

    def _unknown_type(self, event_id: str) -> dict[str, Any]:
        while True:
            kind = self.rng.choice(
                [self._text(30), self.rng.choice(self.KNOWN) + "." + self._text(5), "response.update"]
            )
            if kind not in self.KNOWN:
                return {"type": kind, "event_id": event_id, "x": self._value()}

    def _binary(self, event_id: str) -> bytes:
        return bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 64)))

    def _wrong_field(self, event_id: str) -> dict[str, Any]:
        none = type(None)
        choices: list[dict[str, Any]] = [
            {"type": "session.update", "session": self._non(dict)},
            {"type": "session.update", "session": {"instructions": self._non(str, none)}},
            {"type": "session.update", "session": {"tools": self._non(list, none)}},
            {"type": "session.update", "session": {"output_modalities": self._non(list, none)}},
            {"type": "session.update", "session": {"audio": self._non(dict, none)}},
            {"type": "input_audio_buffer.append", "audio": self._non(str)},
            {"type": "conversation.item.create", "item": self._non(dict)},
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": self._non(list, none)},
            },
            {"type": "conversation.item.truncate", "item_id": self._non(str), "content_index": 0, "audio_end_ms": 0},
            {"type": "conversation.item.retrieve", "item_id": self._non(str)},
            {"type": "conversation.item.delete", "item_id": self._non(str)},
            {"type": "response.create", "response": self._non(dict, none)},
        ]
        return {**self.rng.choice(choices), "event_id": event_id}

    def _bad_audio(self, event_id: str) -> dict[str, Any]:
        if self.rng.random() < 0.5:
            odd = bytes(self.rng.randrange(256) for _ in range(2 * self.rng.randint(0, 40) + 1))
            audio = base64.b64encode(odd).decode()
        else:
            audio = self._text(20) + self.rng.choice(["*", "!", "%", "=a", "é"])
        return {"type": "input_audio_buffer.append", "audio": audio, "event_id": event_id}

    def _out_of_order(self, event_id: str) -> dict[str, Any]:
        unknown = f"item_{self.rng.getrandbits(64):016x}"
        choices: list[dict[str, Any]] = [
            {"type": "response.cancel"},
            {"type": "conversation.item.truncate", "item_id": unknown, "content_index": 0, "audio_end_ms": 10},
            {"type": "conversation.item.retrieve", "item_id": unknown},
            {"type": "conversation.item.delete", "item_id": unknown},
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": f"call_{unknown}", "output": "{}"},
            },
        ]
        return {**self.rng.choice(choices), "event_id": event_id}

    def _random_fields(self, event_id: str) -> dict[str, Any]:
        """A known type whose required field holds a random JSON value it cannot be."""
        field_name, allowed = self.rng.choice(
            [
                ("session.update:session", (dict,)),
                ("input_audio_buffer.append:audio", (str,)),
                ("conversation.item.retrieve:item_id", (str,)),
                ("conversation.item.delete:item_id", (str,)),
                ("conversation.item.truncate:audio_end_ms", (int, float)),
                ("conversation.item.create:item", ()),
            ]
        )
        kind, name = field_name.split(":")
        event: dict[str, Any] = {"type": kind, "event_id": event_id, name: self._non(*allowed) if allowed else None}
        if kind == "conversation.item.create":  # an object with random keys, or anything else: never an item
            value = self._value()
            event["item"] = {self._text(6): value} if self.rng.random() < 0.5 else self._non(dict)
        if kind == "conversation.item.truncate":
            event.update(item_id=f"item_{self.rng.getrandbits(32):08x}", content_index=0)
        return event

    def oversized(self) -> bytes | str:
        return json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (self.max_bytes + 1024)})

    def next(self) -> tuple[str, str | bytes, str | None]:
        self.count += 1
        if self.oversized_every and self.count % self.oversized_every == 0:
            return "oversized", self.oversized(), None
        category, make = self.rng.choice(self.makers)
        event_id = f"evt_fuzz_{self.count}"
        made = make(event_id)
        if isinstance(made, dict):
            return category, json.dumps(made), made.get("event_id") if isinstance(made.get("event_id"), str) else None
        return category, made, None


@dataclass
class FuzzResult:
    sent: int = 0
    oversized: int = 0
    oversized_closed: int = 0
    answered: int = 0
    with_id: int = 0
    named: int = 0
    internal: int = 0
    unanswered: list[str] = field(default_factory=list)
    by_category: dict[str, int] = field(default_factory=dict)
    crashed: bool = False
    fresh_client_served: bool = False


async def fuzz(
    target: Target, events: int, session_count: int, seed: int, max_message_kb: int, limit_s: float
) -> FuzzResult:
    """Send ``events`` bad frames over ``session_count`` sessions; see the module docstring."""
    result = FuzzResult()
    generator = BadEvents(seed, max_message_kb)
    deadline = time.monotonic() + limit_s
    per_session = max(1, events // max(1, session_count))
    session: Session | None = None
    try:
        while result.sent < events and time.monotonic() < deadline:
            if not target.alive():
                result.crashed = True
                break
            if session is None or session.client.closed or (result.sent % per_session == 0 and result.sent):
                if session is not None:
                    await session.close()
                session = await Session.open(target.url)
            category, frame, event_id = generator.next()
            result.sent += 1
            result.by_category[category] = result.by_category.get(category, 0) + 1
            since = len(session.log.events)
            await session.client.send(frame)
            if category == "oversized":
                result.oversized += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(session.client.ws.wait_closed(), 10)
                if session.client.ws.close_code == CLOSE_MESSAGE_TOO_BIG:
                    result.oversized_closed += 1
                await session.close()
                session = None
                continue

            def answer(log: EventLog = session.log, since: int = since, event_id: str | None = event_id) -> Any:
                for e in log.events[since:]:
                    if e.get("type") == "error" and (event_id is None or e["error"].get("event_id") == event_id):
                        return e
                return None

            if not await session.log.until(lambda: answer() is not None, 10.0):
                seen = [event_type(e) for e in session.log.events[since:]]
                result.unanswered.append(f"{category}: {str(frame)[:120]!r} -> {seen}")
                if session.client.closed:
                    session = None
                continue
            error = answer()
            assert error is not None
            result.answered += 1
            if error["error"].get("code") == "server_error":
                result.internal += 1
            if event_id is not None:
                result.with_id += 1
                result.named += error["error"].get("event_id") == event_id
    finally:
        if session is not None:
            await session.close()
    result.crashed = result.crashed or not target.alive()
    if not result.crashed:
        fresh = await Session.open(target.url)
        try:
            await fresh.update({"type": "server_vad"})
            done = await fresh.typed_turn("Say hello.")
            result.fresh_client_served = done is not None and done["response"]["status"] == "completed"
        finally:
            await fresh.close()
    return result


# -- 4. provider faults ---------------------------------------------------------------------------


#: name -> the failing reply (the text before an event index is streamed normally)
FAULTS: dict[str, Reply] = {
    "http 500": Reply(status=500),
    "http 429": Reply(status=429),
    "reset mid-stream": Reply([Text(["Well, ", "let me see. ", "The answer is"])], cut_after=5),
    "malformed stream": Reply([Text(["Hello there. ", "How are you?"])], garbage_after=4),
    "stall before first token": Reply([Text(["Too late."])], delay_s=STALL_S),
    "stall after first token": Reply([Text(["Let me see. ", "Hmm, and then"])], delay_s=STALL_S, delay_at=5),
    "empty reply": Reply([]),
    "tool call only": Reply([Call("get_weather", '{"city": "Paris"}')]),
}


@dataclass
class FaultResult:
    name: str
    dones: int = 0
    status: str = "-"
    spoken_s: float = 0.0
    transcript: str = ""
    first_audio_s: float | None = None
    done_s: float | None = None
    silence_s: float | None = None
    next_ok: bool = False
    error: str | None = None


async def fault_case(target: Target, provider: ResponsesServer, name: str, reply: Reply) -> FaultResult:
    """One provider fault: a typed turn that meets it, then a normal turn."""
    result = FaultResult(name)
    tool_only = bool(reply.output) and all(isinstance(part, Call) for part in reply.output)
    follow_up = Reply([Text(["It is sunny in Paris."])]) if tool_only else REPLY
    provider.script(reply, follow_up)
    session = await Session.open(target.url)
    try:
        await session.update(None, tools=[WEATHER_TOOL], tool_choice="auto") if tool_only else await session.update(
            None
        )
        since = len(session.log.events)
        began = time.monotonic()
        await session.client.send(user_text(f"{name}: what now?"))
        await session.client.send({"type": "response.create"})
        created = await session.log.wait_for("response.created", WAIT_S, since=since)
        rid = created["response"]["id"]
        done = await session.done(rid, since, timeout_s=STALL_S)
        result.done_s = time.monotonic() - began
        await asyncio.sleep(0.5)  # a second response.done would arrive by now
        result.dones = sum(1 for e in session.log.of("response.done", since) if e["response"]["id"] == rid)
        result.status = done["response"]["status"]
        result.spoken_s, result.transcript = spoken_text(session.log.events[since:], rid)
        result.first_audio_s = first_audio_after(session.log, rid, since, began)
        result.silence_s = longest_silence(session.log, {rid}, since, began)
        asked, since = since, len(session.log.events)
        if tool_only:
            calls = [o for o in done["response"]["output"] if o.get("type") == "function_call"]
            if not calls:
                result.error = "response.done lists no function call"
                return result
            output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": '{"sky": "sunny"}'}
            await session.client.send({"type": "conversation.item.create", "item": output})
            await session.client.send({"type": "response.create"})
            created = await session.log.wait_for("response.created", WAIT_S, since=since)
            after = await session.done(created["response"]["id"], since)
            result.spoken_s, result.transcript = spoken_text(session.log.events[since:], created["response"]["id"])
            result.first_audio_s = first_audio_after(session.log, created["response"]["id"], since, began)
            result.silence_s = longest_silence(session.log, {rid, created["response"]["id"]}, asked, began)
        else:
            after = await session.typed_turn("And now?")
        result.next_ok = after is not None and after["response"]["status"] == "completed"
    except (EventTimeout, BenchmarkError) as exc:
        result.error = str(exc)[:200]
    finally:
        await session.close()
    return result


async def faults(target: Target, provider: ResponsesServer, names: list[str] | None = None) -> list[FaultResult]:
    """Every fault of :data:`FAULTS` (or those named), one after another."""
    results = []
    for name in names or list(FAULTS):
        results.append(await fault_case(target, provider, name, FAULTS[name]))
    provider.script(REPLY)
    return results


# -- 5. concurrency -------------------------------------------------------------------------------


@dataclass
class ConcurrencyResult:
    v2v_ms: dict[int, list[float]] = field(default_factory=dict)
    after_stop_ms: dict[int, list[float]] = field(default_factory=dict)
    missing: dict[int, int] = field(default_factory=dict)
    over_limit_code: str | None = None
    over_limit_close: int | None = None
    notes: list[str] = field(default_factory=list)


async def concurrency(
    target: Target, clips: list[Clip], levels: list[int], rounds: int, max_sessions: int
) -> ConcurrencyResult:
    """Spoken turns from ``level`` clients at once, ``rounds`` times per level; then one client too many."""
    result = ConcurrencyResult()
    options = Options(target.url, {}, 1.0, False, False, 120.0, 0.0)
    # warm-up: the first inference of each stage is slower
    await speak_one_turn(options, "warm-up", "warm-up", clips[0], cancel=True)
    for level in levels:
        values: list[float] = []
        after_stop: list[float] = []
        missing = 0
        for r in range(rounds):
            picked = [clips[(r * level + i) % len(clips)] for i in range(level)]
            turns = await asyncio.gather(
                *(
                    speak_one_turn(options, f"x{level}", f"c{level}.{r}.{i}", clip, False)
                    for i, clip in enumerate(picked)
                )
            )
            for turn in (t for client in turns for t in client):
                if turn.after_stop_ms is None:
                    missing += 1
                    continue
                after_stop.append(turn.after_stop_ms)
                if turn.v2v_ms is not None:
                    values.append(turn.v2v_ms)
            await target.settle(None, 0)
        result.v2v_ms[level], result.after_stop_ms[level], result.missing[level] = values, after_stop, missing
    result.notes = options.notes
    # one client over --max_sessions
    held = [await Session.open(target.url) for _ in range(max_sessions)]
    try:
        client = await RealtimeClient.connect(target.url)
        log = client.start_log()
        first = await log.wait_for(lambda e: True, WAIT_S, what="an answer")
        result.over_limit_code = (
            (first.get("error") or {}).get("code") if event_type(first) == "error" else event_type(first)
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(client.ws.wait_closed(), 10)
        result.over_limit_close = client.ws.close_code
        await log.stop()
        await client.close()
    finally:
        for session in held:
            await session.close()
    return result


# -- the report -----------------------------------------------------------------------------------


def report_soak(r: SoakResult, report: Report) -> None:
    growth = None if r.rss_warm_mb is None or r.rss_end_mb is None else 100 * (r.rss_end_mb / r.rss_warm_mb - 1)
    print(f"\nsoak: {r.turns} turns in one session ({r.spoken_turns} spoken)")
    print_table(
        ["figure", "value"],
        [
            ["RSS after warm-up, MB", cell(r.rss_warm_mb, 1)],
            ["RSS at the end, MB", cell(r.rss_end_mb, 1)],
            ["threads: before / peak / after", f"{r.threads_base} / {r.threads_peak} / {r.threads_end}"],
            ["responses started / ended", f"{r.started} / {r.ended}"],
        ],
    )
    report.add("soak: RSS growth", f"{cell(growth, 1)} %", "<= 5 %", growth is not None and growth <= 5)
    report.add(
        "soak: threads after", f"{r.threads_end} (before {r.threads_base})", "= before", r.threads_end <= r.threads_base
    )
    report.add("soak: responses without an end", str(r.started - r.ended), "0", r.started == r.ended and r.started > 0)
    report.add("soak: failed turns", str(len(r.failed_turns)), "0", not r.failed_turns)
    report.notes += [f"soak: {f}" for f in r.failed_turns[:10]]


def report_sessions(r: SessionsResult, warmup: int, report: Report) -> None:
    warm = next((mb for n, mb in r.rss if n == warmup), None)
    end = r.rss[-1][1] if r.rss else None
    growth = None if warm is None or end is None else end - warm
    slope = slope_mb([p for p in r.rss if p[0] >= warmup])
    print(f"\nsessions: {r.sessions} sequential ({r.aborted} dropped mid-response)")
    marks = sorted({0, 1, warmup, *range(0, r.sessions + 1, max(1, r.sessions // 10)), r.sessions})
    print_table(["after sessions", "RSS MB"], [[str(n), cell(mb, 1)] for n, mb in r.rss if n in marks])
    print(f"growth after the warm-up: {cell(None if slope is None else slope * 1024, 0)} KiB per session")
    print(
        f"threads: before {r.threads_base}, after {r.threads_end}; responses started / ended: {r.started} / {r.ended}"
    )
    report.add(
        f"sessions: RSS growth after {warmup}", f"{cell(growth, 1)} MB", "<= 20 MB", growth is not None and growth <= 20
    )
    report.add(
        "sessions: threads after",
        f"{r.threads_end} (before {r.threads_base})",
        "= before",
        r.threads_end <= r.threads_base,
    )
    report.add(
        "sessions: responses without an end", str(r.started - r.ended), "0", r.started == r.ended and r.started > 0
    )
    report.add("sessions: failures", str(len(r.failures)), "0", not r.failures)
    report.notes += [f"sessions: {f}" for f in r.failures[:10]]


def report_fuzz(r: FuzzResult, report: Report) -> None:
    print(f"\nfuzz: {r.sent} bad events ({', '.join(f'{k} {v}' for k, v in sorted(r.by_category.items()))})")
    print_table(
        ["figure", "value"],
        [
            ["answered by an error", f"{r.answered} of {r.sent - r.oversized}"],
            ["errors naming the event (event_id echoed)", f"{r.named} of {r.with_id}"],
            ["internal errors (server_error)", str(r.internal)],
            ["oversized frames closed with 1009", f"{r.oversized_closed} of {r.oversized}"],
            ["server crashed", "yes" if r.crashed else "no"],
            ["a fresh client served afterwards", "yes" if r.fresh_client_served else "no"],
        ],
    )
    report.add("fuzz: events", str(r.sent), ">= 10,000 (full run)", True)
    report.add("fuzz: server crashes", "1" if r.crashed else "0", "0", not r.crashed)
    report.add(
        "fuzz: bad events answered by an error",
        f"{r.answered} of {r.sent - r.oversized}",
        "all",
        r.answered == r.sent - r.oversized and r.sent > 0,
    )
    report.add("fuzz: errors naming the event", f"{r.named} of {r.with_id}", "all", r.named == r.with_id)
    report.add(
        "fuzz: oversized frames refused (1009)",
        f"{r.oversized_closed} of {r.oversized}",
        "all",
        r.oversized_closed == r.oversized,
    )
    report.add("fuzz: fresh client served", "yes" if r.fresh_client_served else "no", "yes", r.fresh_client_served)
    report.notes += [f"fuzz unanswered: {u}" for u in r.unanswered[:10]]


def report_faults(results: list[FaultResult], report: Report) -> None:
    print("\nprovider faults (typed turn, spoken reply)")
    rows = []
    for r in results:
        said = f"{r.spoken_s:.1f} s: {r.transcript[:48]}" if r.spoken_s else "nothing"
        first, done, silence = cell(r.first_audio_s, 2), cell(r.done_s, 2), cell(r.silence_s, 2)
        rows.append([r.name, str(r.dones), r.status, said, first, silence, done, "yes" if r.next_ok else "no"])
        ok = r.error is None and r.dones == 1 and r.spoken_s > 0 and bool(r.transcript) and r.next_ok
        report.add(
            f"fault {r.name}",
            f"{r.dones} done, {'spoken' if r.spoken_s else 'silent'}, next {'ok' if r.next_ok else 'failed'}",
            "1 done, spoken, next ok",
            ok,
        )
        quiet = r.silence_s is not None and r.silence_s <= MAX_SILENCE_S
        report.add(f"fault {r.name}: longest silence", f"{silence} s", f"<= {MAX_SILENCE_S:g} s", quiet)
        if r.error:
            report.notes.append(f"fault {r.name}: {r.error}")
    header = ["fault", "response.done", "status", "spoken", "first audio s", "longest silence s", "done s", "next turn"]
    print_table(header, rows)
    print("(times from the user's message; tool call only: what was spoken is the follow-up, after the call's")
    print("output was sent, and its first audio is counted from the user's message too; longest silence: from")
    print("the user's message to the end of the reply's audio, the longest stretch with none of it playing)")


def concurrency_figures(r: ConcurrencyResult) -> dict[str, Any]:
    """Per level (sessions at once): voice-to-voice p50/p90 and after speech_stopped p50, ms, and
    turns without reply audio, for docs/results.json."""
    return {
        "levels": {
            str(level): {
                "v2v_p50_ms": percentile(values, 50),
                "v2v_p90_ms": percentile(values, 90),
                "after_stop_p50_ms": percentile(r.after_stop_ms.get(level, []), 50),
                "no_audio": r.missing[level],
            }
            for level, values in r.v2v_ms.items()
        }
    }


def report_concurrency(r: ConcurrencyResult, max_sessions: int, report: Report) -> None:
    print("\nconcurrency at the client, ms: voice-to-voice (end of the speech sent -> first audio delta);")
    print("after stop (speech_stopped received -> the same delta)")
    rows = []
    for level, values in r.v2v_ms.items():
        rows.append(
            [
                str(level),
                str(len(values)),
                cell(percentile(values, 50)),
                cell(percentile(values, 90)),
                cell(percentile(r.after_stop_ms.get(level, []), 50)),
                str(r.missing[level]),
            ]
        )
        report.add(
            f"concurrency x{level}: turns without reply audio", str(r.missing[level]), "0", r.missing[level] == 0
        )
    print_table(["sessions", "turns", "v2v p50", "v2v p90", "after stop p50", "no audio"], rows)
    over = f"client {max_sessions + 1} (over --max_sessions {max_sessions})"
    print(f"{over}: {r.over_limit_code}, close code {r.over_limit_close}")
    refused = r.over_limit_code == "max_sessions_reached" and r.over_limit_close == CLOSE_TRY_AGAIN_LATER
    report.add(
        "concurrency: client over --max_sessions",
        f"{r.over_limit_code}, close {r.over_limit_close}",
        "max_sessions_reached, 1013",
        refused,
    )
    report.notes += [f"concurrency: {n}" for n in r.notes[:10]]


def print_goals(report: Report) -> bool:
    print("\ngoals")
    print_table(
        ["figure", "value", "goal", "met"], [[g.name, g.value, g.goal, "yes" if g.met else "NO"] for g in report.goals]
    )
    for note in report.notes:
        print(f"note: {note}")
    return all(g.met for g in report.goals)


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, server_flags = split_extra(argv)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--turns", type=int, default=500, help="soak: turns in the one session")
    parser.add_argument("--audio_every", type=int, default=10, help="soak: every N-th turn is spoken (0: none)")
    parser.add_argument("--soak_warmup", type=int, default=50, help="soak: turns before the first RSS reading")
    parser.add_argument("--sessions", type=int, default=200, help="sessions: how many, one after another")
    parser.add_argument(
        "--sessions_warmup", type=int, default=20, help="sessions: sessions before the first RSS reading"
    )
    parser.add_argument("--fuzz_events", type=int, default=10_000, help="fuzz: bad events in all")
    parser.add_argument("--fuzz_sessions", type=int, default=5, help="fuzz: sessions they are spread over")
    parser.add_argument("--seed", type=int, default=0, help="fuzz: seed of the generator")
    parser.add_argument("--levels", default="1,2,4", help="concurrency: simultaneous sessions per level")
    parser.add_argument("--rounds", type=int, default=3, help="concurrency: rounds per level")
    parser.add_argument(
        "--clips_dir", default=None, help="LibriVox clips (default: pocketsphinx-testdata, else the bundled one)"
    )
    parser.add_argument("--phase_limit_s", type=float, default=1800.0, help="each phase stops after this, s")
    parser.add_argument("--log", default=None, help="write the servers' output to this file")
    parser.add_argument(
        "--record",
        action="store_true",
        help="append the concurrency phase's voice-to-voice to docs/results.json (key server-concurrency)",
    )
    args = parser.parse_args(own)
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(unknown)}")
    args.phases = phases
    try:
        args.levels = sorted({int(x) for x in args.levels.split(",") if x})
    except ValueError:
        parser.error("--levels takes comma-separated integers")
    for name in ("turns", "sessions", "fuzz_events", "fuzz_sessions", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not args.levels or args.levels[0] < 1:
        parser.error("--levels must be >= 1")
    return args, server_flags


async def run(args: argparse.Namespace, server_flags: list[str]) -> bool:
    clips = [load_clip(p) for p in find_clips(args.clips_dir)]
    if not clips:
        raise BenchmarkError("no speech clips found")
    clips.sort(key=lambda c: c.duration_s)
    report = Report()
    log = open(args.log, "w", encoding="utf-8") if args.log else None  # noqa: SIM115 (closed below)
    try:
        scripted_phases = [p for p in args.phases if p != "concurrency"]
        if scripted_phases:
            with ResponsesServer() as provider:
                provider.script(REPLY)
                flags = ["--llm_backend", "responses-api", "--responses_api_base_url", provider.base_url]
                flags += ["--model_name", "scripted", "--max_sessions", "8", *server_flags]
                print(f"scripted server: {' '.join(flags)}", file=sys.stderr, flush=True)
                server, target = start_server(flags, log)
                try:
                    max_kb = 1024
                    if "--max_message_kb" in server_flags:
                        max_kb = int(server_flags[server_flags.index("--max_message_kb") + 1])
                    await prime(target)
                    if "soak" in args.phases:
                        print(f"[soak] {args.turns} turns ...", file=sys.stderr, flush=True)
                        result = await soak(
                            target, clips[0], args.turns, args.audio_every, args.soak_warmup, args.phase_limit_s
                        )
                        report_soak(result, report)
                    if "sessions" in args.phases:
                        print(f"[sessions] {args.sessions} sessions ...", file=sys.stderr, flush=True)
                        result2 = await sessions(target, args.sessions, args.sessions_warmup, args.phase_limit_s)
                        report_sessions(result2, args.sessions_warmup, report)
                    if "fuzz" in args.phases:
                        print(f"[fuzz] {args.fuzz_events} events ...", file=sys.stderr, flush=True)
                        result3 = await fuzz(
                            target, args.fuzz_events, args.fuzz_sessions, args.seed, max_kb, args.phase_limit_s
                        )
                        report_fuzz(result3, report)
                    if "faults" in args.phases:
                        print("[faults] ...", file=sys.stderr, flush=True)
                        report_faults(await faults(target, provider), report)
                finally:
                    server.stop()
        if "concurrency" in args.phases:
            top = max(args.levels)
            print(f"[concurrency] levels {args.levels} ...", file=sys.stderr, flush=True)
            server, target = start_server(["--max_sessions", str(top), *server_flags], log)
            load = load_average()
            try:
                result5 = await concurrency(target, clips, args.levels, args.rounds, top)
                report_concurrency(result5, top, report)
                if args.record:
                    from speech_to_speech.testing.results import command_line, record

                    command = command_line("benchmark_reliability.py", sys.argv[1:])
                    record("server-concurrency", command, concurrency_figures(result5), round(load, 2))
            finally:
                server.stop()
    finally:
        if log is not None:
            log.close()
    return print_goals(report)


def main(argv: list[str] | None = None) -> int:
    args, server_flags = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return 0 if asyncio.run(run(args, server_flags)) else 1
    except BenchmarkError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
