"""Paced playback: a RealtimeQueue and the sink base that releases audio at its real time.

TTS runs faster than real time. Releasing its audio (and the words spoken in
it) only when it is due on a playback clock gives two things: output is paced
like a speaker, and at any moment we know how much of a reply the user has
actually heard, which is what an interrupted reply is cut to.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from speech_to_speech.cancel import Stamp
from speech_to_speech.events import FirstAudio, ResponseDone, ResponseInterrupted
from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import AudioOutput, EndOfResponse

logger = logging.getLogger(__name__)


class RealtimeQueue:
    """A min-heap of items, each released once its due time has come on a clock.

    Items need not arrive in due order. Thread-safe.

    Args:
        clock: returns the current time in seconds (default ``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()  # ties keep insertion order
        self._lock = threading.Lock()

    def put(self, due: float, item: Any) -> None:
        """Schedule ``item`` for release at clock time ``due`` (s)."""
        with self._lock:
            heapq.heappush(self._heap, (due, next(self._order), item))

    def pop_due(self, now: float | None = None) -> list[Any]:
        """Remove and return, in due order, every item due at ``now`` (default: the clock)."""
        now = self.clock() if now is None else now
        released = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                released.append(heapq.heappop(self._heap)[2])
        return released

    def next_due(self) -> float | None:
        """Due time of the earliest item, or None when empty."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def drop_where(self, predicate: Callable[[Any], bool]) -> list[Any]:
        """Remove every item for which ``predicate`` is true; return them in due order."""
        with self._lock:
            dropped = sorted(entry for entry in self._heap if predicate(entry[2]))
            if dropped:
                self._heap = [entry for entry in self._heap if not predicate(entry[2])]
                heapq.heapify(self._heap)
        return [entry[2] for entry in dropped]

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)


@dataclass
class Interrupt:
    """Control message for a sink: the user barged in at ``time`` (monotonic s)."""

    time: float = field(default_factory=time.monotonic)
    bypasses_gate = True


@dataclass
class _Played:
    """One delivered chunk: when it plays and what it says."""

    stamp: Stamp
    start: float
    duration: float
    text: str


class PacedAudioSink(BaseHandler):
    """Base of every audio sink: schedules audio on a playback clock and releases it when due.

    Each :class:`AudioOutput` is resampled (soxr, stateful per response) to
    :attr:`sample_rate` and scheduled right after the audio already scheduled
    (or now, if the line is quiet). It is delivered to :meth:`write`
    ``lead_s`` seconds before it plays, so a device buffer never runs dry.
    The stale-work gate is asked again at delivery: audio of a cancelled
    response never reaches the output once the generation moved on.

    On an :class:`Interrupt` the reply being played is cut at the interruption
    time; the words heard so far are published as
    :class:`~speech_to_speech.events.ResponseInterrupted`.

    Args:
        sample_rate: the sink's rate, Hz.
        lead_s: how long before its play time a chunk is delivered, s.
    """

    lead_s = 0.0

    def __init__(self, *args: Any, sample_rate: int, **kwargs: Any) -> None:
        super().__init__(*args, output_queue=None, **kwargs)
        self.sample_rate = sample_rate
        self.schedule = RealtimeQueue()
        self._play_end = 0.0
        self._resampler: soxr.ResampleStream | None = None
        self._resampler_rate = 0
        self._turns_with_audio: set[int] = set()
        self._played: list[_Played] = []
        self._lock = threading.Lock()

    # -- subclass hooks -------------------------------------------------------------
    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        """Deliver float32 mono ``samples`` at :attr:`sample_rate` that play at ``start`` (monotonic s)."""
        raise NotImplementedError

    def on_interrupt(self, at: float) -> None:
        """Stop whatever was delivered but not yet played at monotonic time ``at``."""

    def on_response_done(self, item: EndOfResponse) -> None:
        """Called when the end of a response is due (its audio has played)."""

    # -- scheduling -------------------------------------------------------------------
    def _resample(self, item: AudioOutput) -> np.ndarray:
        if item.sample_rate == self.sample_rate:
            return item.samples
        if self._resampler is None or self._resampler_rate != item.sample_rate:
            self._resampler = soxr.ResampleStream(item.sample_rate, self.sample_rate, 1, dtype="float32")
            self._resampler_rate = item.sample_rate
        return self._resampler.resample_chunk(item.samples)

    def process(self, item: Any) -> Iterator[None]:
        now = time.monotonic()
        if isinstance(item, Interrupt):
            self._interrupt(item.time)
        elif isinstance(item, AudioOutput):
            if self.gate.admits(item.stamp):
                samples = self._resample(item)
                if item.stamp.turn_id not in self._turns_with_audio:
                    self._turns_with_audio.add(item.stamp.turn_id)
                    self.bus.publish(FirstAudio(item.stamp.turn_id))
                start = max(now, self._play_end)
                self._play_end = start + len(samples) / self.sample_rate
                self.schedule.put(start - self.lead_s, ("audio", item, samples, start))
        elif isinstance(item, EndOfResponse):
            if self._resampler is not None:  # flush the resampler's tail
                tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
                self._resampler = None
                if len(tail) and self.gate.admits(item.stamp):
                    start = max(now, self._play_end)
                    self._play_end = start + len(tail) / self.sample_rate
                    chunk = AudioOutput(item.stamp, tail, self.sample_rate)
                    self.schedule.put(start - self.lead_s, ("audio", chunk, tail, start))
            due = max(now, self._play_end) if self.gate.admits(item.stamp) else now
            self.schedule.put(due, ("end", item))
        self._release()
        return iter(())

    def _release(self) -> None:
        for entry in self.schedule.pop_due():
            if entry[0] == "audio":
                _, item, samples, start = entry
                if not self.gate.admits(item.stamp):
                    continue
                with self._lock:
                    self._played.append(_Played(item.stamp, start, len(samples) / self.sample_rate, item.text))
                self.write(samples, item, start)
            else:
                end: EndOfResponse = entry[1]
                self.on_response_done(end)
                self.bus.publish(ResponseDone(end.stamp.turn_id, text=end.text, error=end.error))
                with self._lock:
                    self._played = [p for p in self._played if p.stamp != end.stamp]

    def _interrupt(self, at: float) -> None:
        """Cut the replies being played at ``at``; report what was heard of each."""
        self.on_interrupt(at)
        dropped = self.schedule.drop_where(lambda e: not self.gate.admits(e[1].stamp))
        stale = [e for e in dropped if e[0] == "audio"]
        for entry in dropped:  # a cut reply ends now, not when its dropped audio would have ended
            if entry[0] == "end":
                entry[1].error = entry[1].error or "cancelled"
                self.schedule.put(time.monotonic(), entry)
        with self._lock:
            played = [p for p in self._played if not self.gate.admits(p.stamp)]
            self._played = [p for p in self._played if self.gate.admits(p.stamp)]
        self._play_end = min(self._play_end, max(at, time.monotonic())) if stale or played else self._play_end
        by_stamp: dict[Stamp, list[_Played]] = {}
        for piece in played:
            by_stamp.setdefault(piece.stamp, []).append(piece)
        for stamp, pieces in by_stamp.items():
            heard = "".join(p.text for p in pieces if p.start < at).strip()
            first = min(p.start for p in pieces)
            audio_end_ms = max(0.0, min(at, max(p.start + p.duration for p in pieces)) - first) * 1000
            self.bus.publish(ResponseInterrupted(stamp.turn_id, heard_text=heard, audio_end_ms=audio_end_ms))

    # -- loop: wait for input or for the next due item -------------------------------
    def _next_item(self) -> Any:
        assert self.input_queue is not None
        timeout = self.poll_s
        due = self.schedule.next_due()
        if due is not None:
            timeout = max(0.0, min(timeout, due - time.monotonic()))
        try:
            return self.input_queue.get(timeout=timeout)
        except queue.Empty:
            self._release()
            return None

    def on_end_of_stream(self) -> Iterator[None]:
        """Play out everything scheduled before the stream ends."""
        while len(self.schedule) and not self.stop_event.is_set():
            due = self.schedule.next_due()
            if due is not None and self.stop_event.wait(max(0.0, due - time.monotonic())):
                break
            self._release()
        return iter(())
