"""The realtime server as a subprocess, and the turns the server benchmarks speak to it: clips at the
wire rate, one spoken turn (``speak_one_turn``) and one barge-in (``barge_in``) through a
:class:`speech_to_speech.client.realtime.RealtimeClient` subclass that times every event.

Used by ``scripts/benchmark_server.py``, ``scripts/benchmark_reliability.py`` and
``scripts/benchmark_webrtc.py`` (its :class:`ServerProcess`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from speech_to_speech.client.realtime import (
    WIRE_RATE,
    ConnectError,
    PacedSender,
    RealtimeClient,
    load_wire_audio,
    pcm16_bytes,
    session_update,
    silence,
)
from speech_to_speech.core.audio import int16_to_float
from speech_to_speech.testing.bench import REPO_ROOT, speech_end_s

TRAILING_SILENCE_S = 1.5
#: what the server prints once its models are loaded and it accepts clients
LISTENING = "realtime server listening on "
#: close code of a full server (try again later)
CLOSE_TRY_AGAIN_LATER = 1013
#: seconds to wait for session.created / session.updated
SESSION_TIMEOUT_S = 10.0
#: seconds to wait for a cancelled response's response.done when cleaning up
CLEANUP_TIMEOUT_S = 10.0


class BenchmarkError(Exception):
    """The benchmark cannot go on (message for the user)."""


# -- audio ---------------------------------------------------------------------------------


@dataclass
class Clip:
    """A speech clip ready to send.

    Attributes:
        name: the file stem.
        samples: int16 mono samples at :data:`WIRE_RATE`.
    """

    name: str
    samples: np.ndarray

    @property
    def duration_s(self) -> float:
        """Length in seconds."""
        return len(self.samples) / WIRE_RATE

    @property
    def speech_end_s(self) -> float:
        """Where the clip's speech ends, s (:func:`speech_to_speech.testing.bench.speech_end_s`)."""
        return speech_end_s(int16_to_float(self.samples), WIRE_RATE) or self.duration_s


def load_clip(path: Path) -> Clip:
    """Read ``path`` (any format soundfile reads), downmix to mono and resample to 24 kHz int16."""
    return Clip(path.stem, load_wire_audio(path))


def short_names(stems: list[str]) -> list[str]:
    """``stems`` without the prefix they all share, cut back to a ``-`` or ``_`` (one stem: as is)."""
    if len(stems) < 2:
        return stems
    prefix = stems[0]
    for stem in stems[1:]:
        while not stem.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind("-"), prefix.rfind("_")) + 1
    return [stem[cut:] or stem for stem in stems]


# -- the server process and its resource use -----------------------------------------------


class ServerProcess:
    """The realtime server as a subprocess; its output is drained by a thread.

    Args:
        command: the command line.
        log: a file that receives every line the server prints, or None.
    """

    def __init__(self, command: list[str], log: TextIO | None = None) -> None:
        self.command = command
        self.log = log
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.url: str | None = None
        self.load_s: float | None = None
        self.started = 0.0
        self._ready = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        """Start the process and the thread that reads its output."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, name="server-output", daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            if self.log is not None:
                self.log.write(line + "\n")
                self.log.flush()
            if self.url is None and line.startswith(LISTENING):
                self.load_s = time.monotonic() - self.started
                self.url = line[len(LISTENING) :].strip()
                self._ready.set()
        self._ready.set()  # the process ended

    def wait_ready(self, timeout_s: float) -> str:
        """Wait until the server listens and return its URL.

        Raises:
            BenchmarkError: the server exited or did not listen within ``timeout_s``.
        """
        self._ready.wait(timeout_s)
        if self.url is None:
            assert self.proc is not None
            state = f"exited with status {self.proc.poll()}" if self.proc.poll() is not None else "is not listening"
            output = "\n".join(f"  | {line}" for line in self.tail)
            raise BenchmarkError(f"the server {state} after {time.monotonic() - self.started:.0f} s:\n{output}")
        return self.url

    def stop(self) -> None:
        """SIGINT (the server's clean stop), then SIGTERM, then SIGKILL."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for signum, wait_s in ((signal.SIGINT, 15.0), (signal.SIGTERM, 5.0)):
            proc.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait_s)
                return
        proc.kill()
        proc.wait()


# -- the protocol client --------------------------------------------------------------------


class BenchClient(RealtimeClient):
    """One session: sends events, and records when each server event of interest arrived.

    Every timestamp is ``time.monotonic()`` right after the message was received (the
    :class:`~speech_to_speech.client.realtime.EventLog`'s receipt time).
    """

    def __init__(self, ws: ClientConnection, name: str = "") -> None:
        super().__init__(ws)
        self.name = name
        self.session_updated = False
        self.speech_started: list[float] = []
        self.speech_stopped: list[float] = []
        self.created: dict[str, float] = {}  # response id -> response.created
        self.deltas: dict[str, list[tuple[float, int]]] = {}  # response id -> [(t, bytes)]
        self.done: dict[str, tuple[float, str]] = {}  # response id -> (response.done, status)
        self.errors: list[str] = []
        self.cancel_on_first_audio = False
        self._tasks: set[asyncio.Task[bool]] = set()

    # -- connection --------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str, name: str, headers: dict[str, str], retries: int = 20) -> BenchClient:
        """Connect and wait for ``session.created``, retrying while the server is full.

        Raises:
            BenchmarkError: the server cannot be reached, stays full, or sends no session.created.
        """
        for _ in range(retries):
            try:
                client: BenchClient = await cls.connect(url, headers=headers, name=name)
            except ConnectError as exc:
                raise BenchmarkError(f"{name}: {exc}") from None
            try:
                first = await asyncio.wait_for(client.recv(), SESSION_TIMEOUT_S)
            except (TimeoutError, ConnectionClosed) as exc:
                await client.close()
                raise BenchmarkError(f"{name}: no session.created: {exc!r}") from None
            if first.get("type") == "session.created":
                client.start_log(client._handle)
                return client
            await client.close()
            code = (first.get("error") or {}).get("code")
            if code != "max_sessions_reached":
                raise BenchmarkError(f"{name}: unexpected first event: {json.dumps(first)[:200]}")
            await asyncio.sleep(0.5)  # a session of the previous client is still closing
        raise BenchmarkError(f"{name}: the server stayed full")

    async def configure(self) -> None:
        """``session.update`` with server VAD (audio in and out as pcm16 at 24 kHz), then wait for the ack.

        Raises:
            BenchmarkError: no ``session.updated`` arrived.
        """
        await self.send(session_update({"type": "server_vad", "interrupt_response": True, "create_response": True}))
        if not await self.wait_for(lambda: self.session_updated, SESSION_TIMEOUT_S):
            raise BenchmarkError(f"{self.name}: no session.updated ({'; '.join(self.errors) or 'no error event'})")

    # -- receiving ---------------------------------------------------------------------------

    def _handle(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        response_id = str(event.get("response_id") or (event.get("response") or {}).get("id") or "")
        if kind == "session.updated":
            self.session_updated = True
        elif kind == "input_audio_buffer.speech_started":
            self.speech_started.append(now)
        elif kind == "input_audio_buffer.speech_stopped":
            self.speech_stopped.append(now)
        elif kind == "response.created":
            self.created[response_id] = now
        elif kind == "response.output_audio.delta":
            deltas = self.deltas.setdefault(response_id, [])
            deltas.append((now, pcm16_bytes(str(event.get("delta", "")))))
            if len(deltas) == 1 and self.cancel_on_first_audio:
                task = asyncio.get_running_loop().create_task(self.send({"type": "response.cancel"}))
                self._tasks.add(task)  # keep a reference until it has run
                task.add_done_callback(self._tasks.discard)
        elif kind == "response.done":
            self.done[response_id] = (now, str((event.get("response") or {}).get("status", "?")))
        elif kind == "error":
            error = event.get("error") or {}
            self.errors.append(f"{error.get('code') or error.get('type')}: {error.get('message')}")

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds (checked after every event); False on timeout or close."""
        assert self.log is not None
        return await self.log.until(predicate, timeout_s)

    # -- turn bookkeeping ----------------------------------------------------------------------

    def in_flight(self) -> list[str]:
        """Responses created and not yet done."""
        return [r for r in self.created if r not in self.done]

    def response_after(self, t: float) -> str | None:
        """The first response created after ``t``."""
        later = [(created, r) for r, created in self.created.items() if created > t]
        return min(later)[1] if later else None

    def last_turn_answered(self) -> bool:
        """The response created after the last ``speech_stopped`` is done, and the user is not speaking."""
        if not self.speech_stopped or len(self.speech_started) > len(self.speech_stopped):
            return False
        response = self.response_after(self.speech_stopped[-1])
        return response is not None and response in self.done

    def first_audio_per_turn(self) -> list[tuple[float, float | None, str | None]]:
        """Per user turn: (receipt of its ``speech_stopped``, receipt of the first audio delta of the
        response created after it or None, that response's status or why there is none); monotonic s."""
        turns: list[tuple[float, float | None, str | None]] = []
        for index, stopped in enumerate(self.speech_stopped):
            bound = next((t for t in self.speech_started if t > stopped), float("inf"))
            firsts = [
                (deltas[0][0], r)
                for r, deltas in self.deltas.items()
                if deltas and self.created.get(r, 0.0) > stopped and deltas[0][0] < bound
            ]
            if firsts:
                first, response = min(firsts)
                turns.append((stopped, first, self.done.get(response, (0.0, "no response.done"))[1]))
            else:
                superseded = index + 1 < len(self.speech_stopped)
                turns.append((stopped, None, "superseded" if superseded else "no audio"))
        return turns

    async def finish(self) -> None:
        """Cancel what is still in flight (so that no work outlives the session), then close."""
        if self.speech_stopped and not self.closed:  # a turn whose response may be about to start
            await self.wait_for(lambda: self.response_after(self.speech_stopped[-1]) is not None, 15.0)
        if self.in_flight() and not self.closed:
            await self.send({"type": "response.cancel"})
            await self.wait_for(lambda: not self.in_flight(), CLEANUP_TIMEOUT_S)
        await self.close()


# -- the phases -------------------------------------------------------------------------------


@dataclass
class Turn:
    """One user turn of a latency phase.

    Attributes:
        phase: the phase's name.
        client: the client's name.
        clip: the clip spoken.
        v2v_ms: voice-to-voice, the end of the clip's speech (as it was sent: the paced schedule
            and :func:`speech_to_speech.testing.bench.speech_end_s`) -> the first audio delta of
            the reply, ms; None for no reply audio, or for a turn the VAD cut before the clip's end.
        status: the reply's response.done status, or why there is no value.
        after_stop_ms: receipt of ``speech_stopped`` -> the same first audio delta, ms (leaves
            out the server's end-of-turn wait).
    """

    phase: str
    client: str
    clip: str
    v2v_ms: float | None
    status: str | None
    after_stop_ms: float | None = None


@dataclass
class BargeIn:
    """One barge-in run.

    Attributes:
        client: the client's name.
        clips: the first and the interrupting clip.
        stop_last_delta_ms: second speech_started -> last late audio delta (0: none), ms.
        stop_done_ms: second speech_started -> the interrupted response's response.done, ms.
        late_audio_ms: audio carried by the deltas that arrived after speech_started, ms.
        status: the interrupted response's final status.
        error: why the run gave no value, or None.
    """

    client: str
    clips: str
    stop_last_delta_ms: float | None = None
    stop_done_ms: float | None = None
    late_audio_ms: float | None = None
    status: str | None = None
    error: str | None = None


@dataclass
class Options:
    """What every client needs besides its clip."""

    url: str
    headers: dict[str, str]
    speed: float
    open_mic: bool
    cancel_replies: bool
    turn_timeout_s: float
    barge_in_after_s: float
    notes: list[str] = field(default_factory=list)


async def speak_one_turn(options: Options, phase: str, name: str, clip: Clip, cancel: bool) -> list[Turn]:
    """Open a session, speak ``clip`` and 1.5 s of silence, wait for the reply; one Turn per user turn."""
    try:
        client = await BenchClient.open(options.url, name, options.headers)
    except BenchmarkError as exc:
        return [Turn(phase, name, clip.name, None, str(exc))]
    mic = PacedSender(client, options.speed, options.open_mic)
    try:
        await client.configure()
        client.cancel_on_first_audio = cancel
        start = time.monotonic()
        mic.say(np.concatenate([clip.samples, silence(TRAILING_SILENCE_S)]), start=start)
        speech_end = start + clip.speech_end_s / options.speed
        await mic.drained()
        if not await client.wait_for(lambda: bool(client.speech_started), 3.0):
            return [Turn(phase, name, clip.name, None, "the VAD found no speech")]
        if not await client.wait_for(client.last_turn_answered, options.turn_timeout_s):
            options.notes.append(f"{name}: no reply finished within --turn_timeout_s {options.turn_timeout_s:g}")
        turns = []
        heard = client.first_audio_per_turn()
        for index, (stopped, first, status) in enumerate(heard):
            last = index == len(heard) - 1  # the turn that holds the clip's end
            v2v = (first - speech_end) * 1000.0 if first is not None and last else None
            after_stop = (first - stopped) * 1000.0 if first is not None else None
            turns.append(Turn(phase, name, clip.name, v2v, status, after_stop))
        for error in client.errors:
            options.notes.append(f"{name}: error event: {error}")
        return turns
    except BenchmarkError as exc:
        return [Turn(phase, name, clip.name, None, str(exc))]
    finally:
        await mic.stop()
        await client.finish()


async def barge_in(options: Options, name: str, first: Clip, second: Clip) -> BargeIn:
    """Speak ``first``; at its reply's first audio delta speak ``second`` over it; time the stop."""
    result = BargeIn(name, f"{first.name} + {second.name}")
    try:
        client = await BenchClient.open(options.url, name, options.headers)
    except BenchmarkError as exc:
        result.error = str(exc)
        return result
    mic = PacedSender(client, options.speed, open_mic=True)
    try:
        await client.configure()
        mic.say(np.concatenate([first.samples, silence(TRAILING_SILENCE_S)]))

        def replying() -> bool:
            stopped = client.speech_stopped[-1] if client.speech_stopped else None
            response = client.response_after(stopped) if stopped is not None else None
            return response is not None and bool(client.deltas.get(response))

        if not await client.wait_for(replying, options.turn_timeout_s):
            result.error = "no reply audio to interrupt"
            return result
        interrupted = client.response_after(client.speech_stopped[-1])
        assert interrupted is not None
        if options.barge_in_after_s > 0:
            await asyncio.sleep(options.barge_in_after_s)
        began = time.monotonic()
        mic.say(np.concatenate([second.samples, silence(TRAILING_SILENCE_S)]))
        if not await client.wait_for(lambda: any(t > began for t in client.speech_started), 5.0 + second.duration_s):
            result.error = "the VAD did not hear the second utterance"
            return result
        started = next(t for t in client.speech_started if t > began)
        if not await client.wait_for(lambda: interrupted in client.done, options.turn_timeout_s):
            result.error = "the interrupted response never sent response.done"
            return result
        done_t, result.status = client.done[interrupted]
        if done_t < started:
            result.error = f"the reply was over ({result.status}) before the second utterance started"
            return result
        late = [(t, size) for t, size in client.deltas[interrupted] if t > started]
        result.stop_last_delta_ms = (late[-1][0] - started) * 1000.0 if late else 0.0
        result.late_audio_ms = sum(size for _, size in late) / 2 / WIRE_RATE * 1000.0
        result.stop_done_ms = (done_t - started) * 1000.0
        await mic.drained()
        for error in client.errors:
            options.notes.append(f"{name}: error event: {error}")
        return result
    except BenchmarkError as exc:
        result.error = str(exc)
        return result
    finally:
        await mic.stop()
        await client.finish()
