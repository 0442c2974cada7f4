#!/usr/bin/env python
"""Realtime server benchmark: latency and barge-in seen by WebSocket clients, and the server's load.

The script starts the realtime server as a subprocess on a free port::

    python s2s_pipeline.py --mode server --host 127.0.0.1 --port PORT --max_sessions N [EXTRA FLAGS]

(flags after ``--`` go to the server unchanged), or uses a running one given with ``--url``.
It then talks to it through WebSocket clients that speak the OpenAI Realtime protocol
(:mod:`speech_to_speech.client.realtime`: ``session.update`` with ``server_vad``, then
``input_audio_buffer.append`` blocks of 40 ms of pcm16 at 24 kHz), in these phases:

1. **warm-up** (skip with ``--no_warmup``): one client speaks one clip and cancels the reply at
   its first audio delta, so that first-inference costs (lazy initialisation, kernel caches) do
   not land on the first measured turn. Not measured.
2. **sequential**: ``--clients`` clients, one after another, each in its own session.
3. **concurrent**: ``--clients`` clients at once (the server is started with ``--max_sessions``
   equal to ``--clients``).
4. **barge-in** (``--barge_in_runs``, default 1, one after another): a client speaks a clip and,
   right after the reply's first audio delta (plus ``--barge_in_after_s``), speaks a second clip
   over it.

Client ``i`` speaks LibriVox clip ``i`` (cycling), from the Debian package
``pocketsphinx-testdata`` (``/usr/share/pocketsphinx/test/data/librivox``) or ``--clips_dir``,
resampled to 24 kHz with soxr. Audio goes out at real-time pace (``--speed`` changes it) on an
absolute schedule (block ``i`` leaves at start + (i + 1) × 40 ms), followed by 1.5 s of silence so
the server's VAD can endpoint. With ``--open_mic`` (always in the barge-in phase) the client
keeps sending silence after that, like an open microphone, until it is done. A client is done
when the response created after its last ``speech_stopped`` has sent ``response.done`` (or after
``--turn_timeout_s``); with ``--cancel_replies`` it sends ``response.cancel`` at the reply's first
audio delta instead of listening to the whole reply (shorter runs, less server load).

What is measured (``time.monotonic()`` in this process, when an event is received):

- **v2v ms** (voice-to-voice latency): receipt of ``input_audio_buffer.speech_stopped`` -> receipt
  of the first ``response.output_audio.delta`` of the response created after it. It includes the
  server's STT, LLM time to first sentence, TTS of that sentence and the network hop, but not the
  VAD's endpoint delay (``speech_stopped`` is sent once the VAD has decided), nor the client's
  playback buffer. Percentiles are over all turns of the phase (linear interpolation); a clip the
  VAD splits into two turns yields two values.
- **stop: last delta ms** (barge-in): receipt of ``speech_started`` for the second utterance ->
  receipt of the last ``response.output_audio.delta`` of the interrupted response that arrives
  after it; 0 when none arrives after it (the server stopped the audio before announcing the
  barge-in). "late audio ms" is how much audio those late deltas carried.
- **stop: done ms** (barge-in): the same start -> receipt of the interrupted response's
  ``response.done`` (expected status ``cancelled``). A reply that was over before the second
  utterance started counts as not interrupted and gives no value.
- **CPU mean/peak %**, **RSS peak MB**: the server process, sampled every ``--sample_s`` seconds
  (psutil when installed, else ``/proc/PID/stat`` and ``/proc/PID/status``; Linux only without
  psutil). CPU % is of one core (200 = two cores busy) over each sampling interval; each phase
  row covers the samples taken during that phase, "startup" the model load. With ``--url`` there
  is no process to sample unless ``--server_pid`` names it.
- **model load s**: from starting the server process to its line "realtime server listening on
  ws://..." (Python start-up, imports and loading every model once). Not known with ``--url``.

The clients run in this process, on one asyncio loop, and add their own (small) CPU load to the
machine; on a busy machine all numbers are noisy.

Exit status: 0 when every turn got a reply and every barge-in was measured, 1 otherwise (or when
the server could not be started or reached), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (
    REPO_ROOT,
    ProbeUnavailable,
    ProcessProbe,
    ResourceSampler,
    cell,
    find_clips,
    free_port,
    percentile,
    print_table,
    split_extra,
)

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

#: silence sent after each clip so that the server's VAD can endpoint, s
TRAILING_SILENCE_S = 1.5
#: what the server prints once its models are loaded and it accepts clients
LISTENING = "realtime server listening on "
#: close code of a full server (try again later)
CLOSE_TRY_AGAIN_LATER = 1013
#: seconds to wait for session.created / session.updated
SESSION_TIMEOUT_S = 10.0
#: seconds to wait for a cancelled response's response.done when cleaning up
CLEANUP_TIMEOUT_S = 10.0
PROG = "benchmark_server.py"


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

    def voice_to_voice_ms(self) -> list[tuple[float | None, str | None]]:
        """Per user turn: (speech_stopped -> first audio delta of the response created after it, ms; status)."""
        turns: list[tuple[float | None, str | None]] = []
        for index, stopped in enumerate(self.speech_stopped):
            bound = next((t for t in self.speech_started if t > stopped), float("inf"))
            firsts = [
                (deltas[0][0], r)
                for r, deltas in self.deltas.items()
                if deltas and self.created.get(r, 0.0) > stopped and deltas[0][0] < bound
            ]
            if firsts:
                first, response = min(firsts)
                turns.append(((first - stopped) * 1000.0, self.done.get(response, (0.0, "no response.done"))[1]))
            else:
                superseded = index + 1 < len(self.speech_stopped)
                turns.append((None, "superseded" if superseded else "no audio"))
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
        v2v_ms: voice-to-voice latency, or None (no reply audio).
        status: the reply's response.done status, or why there is no value.
    """

    phase: str
    client: str
    clip: str
    v2v_ms: float | None
    status: str | None


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
        mic.say(np.concatenate([clip.samples, silence(TRAILING_SILENCE_S)]))
        await mic.drained()
        if not await client.wait_for(lambda: bool(client.speech_started), 3.0):
            return [Turn(phase, name, clip.name, None, "the VAD found no speech")]
        if not await client.wait_for(client.last_turn_answered, options.turn_timeout_s):
            options.notes.append(f"{name}: no reply finished within --turn_timeout_s {options.turn_timeout_s:g}")
        turns = [Turn(phase, name, clip.name, ms, status) for ms, status in client.voice_to_voice_ms()]
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


async def run_phases(
    options: Options,
    clips: list[Clip],
    n_clients: int,
    barge_in_runs: int,
    warmup: bool,
    sampler: ResourceSampler | None,
) -> tuple[list[Turn], list[BargeIn]]:
    """Warm-up, sequential, concurrent and barge-in phases, in that order.

    Raises:
        BenchmarkError: the server cannot be reached.
    """

    def enter(phase: str) -> None:
        print(f"[{phase}] ...", file=sys.stderr, flush=True)
        if sampler is not None:
            sampler.phase = phase

    probe = await BenchClient.open(options.url, "probe", options.headers)  # fail early when unreachable
    await probe.close()
    turns: list[Turn] = []
    if warmup:
        enter("warm-up")
        warm = await speak_one_turn(options, "warm-up", "warm-up", clips[0], cancel=True)
        if all(t.v2v_ms is None for t in warm):
            options.notes.append(f"warm-up: {warm[0].status if warm else 'no turn'}")
    enter("sequential")
    for i in range(n_clients):
        clip = clips[i % len(clips)]
        turns += await speak_one_turn(options, "sequential", f"seq-{i + 1}", clip, options.cancel_replies)
    enter("concurrent")
    batches = await asyncio.gather(
        *(
            speak_one_turn(options, "concurrent", f"conc-{i + 1}", clips[i % len(clips)], options.cancel_replies)
            for i in range(n_clients)
        )
    )
    turns += [turn for batch in batches for turn in batch]
    barge_ins: list[BargeIn] = []
    if barge_in_runs:
        enter("barge-in")
        for i in range(barge_in_runs):
            first, second = clips[i % len(clips)], clips[(i + 1) % len(clips)]
            barge_ins.append(await barge_in(options, f"barge-{i + 1}", first, second))
    enter("done")
    return turns, barge_ins


# -- report -----------------------------------------------------------------------------------


def report(
    turns: list[Turn],
    barge_ins: list[BargeIn],
    sampler: ResourceSampler | None,
    load_s: float | None,
    n_clients: int,
    notes: list[str],
) -> None:
    """Print the per-turn details, then the summary table and notes."""
    print("\nper turn:")
    rows = [[t.phase, t.client, t.clip, cell(t.v2v_ms), t.status or "-"] for t in turns]
    print_table(["phase", "client", "clip", "v2v ms", "reply status"], rows)
    if barge_ins:
        print("\nbarge-in runs:")
        rows = [
            [
                b.client,
                b.clips,
                cell(b.stop_last_delta_ms),
                cell(b.stop_done_ms),
                cell(b.late_audio_ms),
                b.error or b.status or "-",
            ]
            for b in barge_ins
        ]
        headers = ["client", "clips", "stop: last delta ms", "stop: done ms", "late audio ms", "interrupted reply"]
        print_table(headers, rows)

    def resources(phase: str) -> list[str]:
        mean, peak, rss = sampler.summary(phase) if sampler is not None else (None, None, None)
        return [cell(mean), cell(peak), cell(rss)]

    print("\nsummary:")
    rows = []
    if sampler is not None and load_s is not None:
        rows.append(["startup", "-", "-", "-", "-", "-", "-", *resources("startup")])
    for phase in ("sequential", "concurrent"):
        values = [t.v2v_ms for t in turns if t.phase == phase and t.v2v_ms is not None]
        count = len([t for t in turns if t.phase == phase])
        p50, p90 = percentile(values, 50), percentile(values, 90)
        rows.append([phase, str(n_clients), f"{len(values)}/{count}", cell(p50), cell(p90), "-", "-"])
        rows[-1] += resources(phase)
    if barge_ins:
        measured = [b for b in barge_ins if b.stop_done_ms is not None]
        last = percentile([b.stop_last_delta_ms for b in measured if b.stop_last_delta_ms is not None], 50)
        done = percentile([b.stop_done_ms for b in measured if b.stop_done_ms is not None], 50)
        rows.append(["barge-in", "1", f"{len(measured)}/{len(barge_ins)}", "-", "-", cell(last), cell(done)])
        rows[-1] += resources("barge-in")
    headers = ["phase", "clients", "turns", "v2v p50 ms", "v2v p90 ms", "stop: last delta ms", "stop: done ms"]
    print_table([*headers, "CPU mean %", "CPU peak %", "RSS peak MB"], rows)
    all_rss = [rss for _, _, rss in sampler.samples] if sampler is not None else []
    print(
        f"\nmodel load s: {cell(load_s, 1)} (server start -> 'listening' line)   "
        f"server RSS peak over the whole run: {cell(max(all_rss) if all_rss else None)} MB   "
        f"CPU % is of one core ({os.cpu_count()} cores here)"
    )
    if len(barge_ins) > 1:
        print("barge-in stop values are the p50 over the runs.")
    for note in notes:
        print(f"note: {note}")


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (server flags go after ``--``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmark the realtime server with WebSocket clients: voice-to-voice latency (sequential "
        "and concurrent sessions), barge-in stop time, server CPU and memory. Flags after -- go to the server.",
    )
    parser.add_argument("--url", help="use this running server (ws://HOST:PORT/v1/realtime) instead of starting one")
    parser.add_argument("--api_key", default="", help="send 'Authorization: Bearer KEY' (with --url)")
    parser.add_argument("--server_pid", type=int, help="with --url: the server's process id, to sample CPU and RSS")
    parser.add_argument("--clients", type=int, default=3, help="clients per phase (default 3)")
    parser.add_argument("--barge_in_runs", type=int, default=1, help="barge-in runs, one after another (default 1)")
    parser.add_argument("--barge_in_after_s", type=float, default=0.0, help="wait after the first reply audio (s)")
    parser.add_argument("--clips_dir", help="folder of *.wav clips (default: the pocketsphinx-testdata LibriVox clips)")
    parser.add_argument("--speed", type=float, default=1.0, help="input pace, times real time (default 1.0)")
    parser.add_argument("--open_mic", action="store_true", help="keep sending silence after each clip")
    parser.add_argument("--cancel_replies", action="store_true", help="cancel each reply at its first audio delta")
    parser.add_argument("--no_warmup", action="store_true", help="skip the unmeasured warm-up turn")
    parser.add_argument("--turn_timeout_s", type=float, default=120.0, help="wait for a reply at most this long")
    parser.add_argument("--load_timeout_s", type=float, default=600.0, help="wait for the server at most this long")
    parser.add_argument("--sample_s", type=float, default=0.25, help="seconds between CPU/RSS samples")
    parser.add_argument("--server_log", metavar="PATH", help="write the started server's output here")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.barge_in_runs < 0 or args.speed <= 0 or args.sample_s <= 0:
        parser.error("--barge_in_runs must be >= 0, --speed and --sample_s > 0")
    if args.url and extra:
        parser.error("server flags after -- need a server started by this script (no --url)")
    paths = find_clips(args.clips_dir)
    if not paths:
        print(
            f"{PROG}: error: no *.wav clips found; install pocketsphinx-testdata or pass --clips_dir", file=sys.stderr
        )
        return 1
    clips = [load_clip(path) for path in paths]
    for clip, name in zip(clips, short_names([clip.name for clip in clips]), strict=True):
        clip.name = name
    print(f"{len(clips)} clip(s) from {paths[0].parent}; {args.clients} client(s) per phase", file=sys.stderr)

    server: ServerProcess | None = None
    sampler: ResourceSampler | None = None
    log = open(args.server_log, "w") if args.server_log else None  # noqa: SIM115 (closed in finally)
    notes: list[str] = []
    try:
        pid = args.server_pid
        if args.url:
            url = args.url
        else:
            host = "127.0.0.1"
            command = [sys.executable, str(REPO_ROOT / "s2s_pipeline.py"), "--mode", "server", "--host", host]
            command += ["--port", str(free_port(host)), "--max_sessions", str(args.clients), *extra]
            print(f"starting: {' '.join(command)}", file=sys.stderr, flush=True)
            server = ServerProcess(command, log)
            server.start()
            pid = server.pid
        if pid is not None:
            try:
                sampler = ResourceSampler(ProcessProbe(pid), args.sample_s)
                sampler.start()
            except ProbeUnavailable as exc:
                notes.append(str(exc))
            except Exception as exc:  # e.g. psutil.NoSuchProcess for a wrong --server_pid
                notes.append(f"cannot sample process {pid}: {exc}")
        if server is not None:
            url = server.wait_ready(args.load_timeout_s)
            print(f"server listening on {url} after {server.load_s:.1f} s", file=sys.stderr, flush=True)
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        options = Options(
            url, headers, args.speed, args.open_mic, args.cancel_replies, args.turn_timeout_s, args.barge_in_after_s
        )
        options.notes = notes
        turns, barge_ins = asyncio.run(
            run_phases(options, clips, args.clients, args.barge_in_runs, not args.no_warmup, sampler)
        )
    except BenchmarkError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if sampler is not None:
            sampler.stop()
        if server is not None:
            server.stop()
        if log is not None:
            log.close()
    report(turns, barge_ins, sampler, server.load_s if server else None, args.clients, notes)
    ok = all(t.v2v_ms is not None or t.status == "superseded" for t in turns) and all(
        b.error is None for b in barge_ins
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
