"""Paced playback: a RealtimeQueue and the sink base that releases audio at its real time.

TTS runs faster than real time. Releasing its audio (and the words spoken in
it) only when it is due on a playback clock gives two things: output is paced
like a speaker, and at any moment we know how much of a reply the user has
actually heard, which is what an interrupted reply is cut to.

Three control messages (:mod:`core.messages`) reach a sink through its input queue, in order with the
audio: :class:`Pause` (user speech: stop at once, keep the rest), :class:`Resume`
(it was a backchannel: play the rest from where it stopped) and :class:`Interrupt`
(a real interruption: cut the cancelled replies and report what was heard).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speech_to_speech.core.audio import StreamResampler, first_sound_index, rms
from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import FirstAudio, ReplyWords, ResponseDone, ResponseInterrupted
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import AudioOutput, EndOfResponse, Flush, Interrupt, Pause, Resume

logger = logging.getLogger(__name__)

#: length of one level measurement of a :class:`PlaybackReference`, s (a WebRTC frame)
REFERENCE_BLOCK_S = 0.020
#: how long a :class:`PlaybackReference` keeps its levels, s (a little over the longest echo delay)
REFERENCE_KEPT_S = 5.0


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
class _Played:
    """One delivered chunk: when it plays, what it says and its audio (at the sink's rate)."""

    stamp: Stamp
    start: float
    duration: float
    text: str
    samples: np.ndarray


class PlaybackReference:
    """The assistant's voice as it is played: its level per :data:`REFERENCE_BLOCK_S`, on the monotonic clock.

    Thread-safe: the sink (or a media track's sender) adds, the VAD's thread reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: collections.deque[tuple[float, float]] = collections.deque()
        self._taps: list[Callable[[np.ndarray, int, float], None]] = []

    def tap(self, listener: Callable[[np.ndarray, int, float], None]) -> None:
        """Also hand every block :meth:`add` records to ``listener(samples, sample_rate, start)``,
        in the thread that adds it (an echo canceller keeps the audio itself, not only its level)."""
        self._taps.append(listener)

    def untap(self, listener: Callable[[np.ndarray, int, float], None]) -> None:
        """Stop handing blocks to ``listener`` (no error if it was not tapped)."""
        if listener in self._taps:
            self._taps.remove(listener)

    def add(self, samples: np.ndarray, sample_rate: int, start: float) -> None:
        """Record float32 mono ``samples`` at ``sample_rate`` Hz that play (or leave) from ``start``
        (monotonic s), in time order; silence may be recorded or left out (a window's loudest
        block is what counts)."""
        for listener in self._taps:
            listener(samples, sample_rate, start)
        block = max(1, round(REFERENCE_BLOCK_S * sample_rate))
        levels = [(start + i / sample_rate, rms(samples[i : i + block])) for i in range(0, len(samples), block)]
        with self._lock:
            self._blocks.extend(levels)
            horizon = start - REFERENCE_KEPT_S
            while self._blocks and self._blocks[0][0] < horizon:
                self._blocks.popleft()

    def level(self, since: float, until: float) -> float:
        """The loudest block (RMS) of the voice played between ``since`` and ``until`` (monotonic s)."""
        loudest = 0.0
        with self._lock:
            for at, level in reversed(self._blocks):  # newest first: the windows asked for are recent
                if at < since:
                    break
                if at <= until:
                    loudest = max(loudest, level)
        return loudest


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
    :class:`~speech_to_speech.core.events.ResponseInterrupted`, also for a cut reply
    that had audio here but none played yet (no words heard).

    On a :class:`Pause` everything stops at the pause time (:meth:`on_pause`) and
    what was not played yet, the rest of the chunk playing then included, is held
    with the audio that arrives later; a :class:`Resume` schedules it from now on.

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
        self._resampler: StreamResampler | None = None
        self._turns_with_audio: set[int] = set()
        self._turns_heard: set[int] = set()  # turns whose first sound was scheduled (FirstAudio)
        self._played: list[_Played] = []
        self._lock = threading.Lock()
        self._paused_at: float | None = None
        #: while paused: ("audio", item, samples) and ("end", item) entries, in play order
        self._held: list[tuple[Any, ...]] = []

    # -- subclass hooks -------------------------------------------------------------
    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        """Deliver float32 mono ``samples`` at :attr:`sample_rate` that play at ``start`` (monotonic s)."""
        raise NotImplementedError

    def on_interrupt(self, at: float) -> None:
        """Stop whatever of the replies the gate no longer admits was delivered but not yet
        played at monotonic time ``at``."""

    def on_pause(self, at: float) -> float:
        """Stop everything delivered but not yet played at monotonic time ``at`` (a pause; the
        base keeps the audio and delivers it again on resume).

        Returns:
            when the output really stops (monotonic s), what the pause cuts at: ``at`` (the
            default) for a sink that stops on the clock; a later time for one that cannot take
            back what it delivered (audio already sent to a remote player plays out: it counts
            as heard and is not held); the end of what it really played, for one whose output
            keeps its own pace (a media track).
        """
        return at

    def on_response_done(self, item: EndOfResponse) -> None:
        """Called when the end of a response is due (its audio has played)."""

    # -- scheduling -------------------------------------------------------------------
    def _resample(self, item: AudioOutput) -> np.ndarray:
        if item.sample_rate == self.sample_rate:
            return item.samples
        if self._resampler is None or self._resampler.in_rate != item.sample_rate:
            self._resampler = StreamResampler(item.sample_rate, self.sample_rate)
        return self._resampler.process(item.samples)

    @property
    def paused(self) -> bool:
        """A :class:`Pause` holds the output (until a :class:`Resume` or an :class:`Interrupt`)."""
        return self._paused_at is not None

    def process(self, item: Any) -> Iterator[None]:
        now = time.monotonic()
        if isinstance(item, Pause):
            self._pause(item.time)
        elif isinstance(item, Resume):
            self._resume()
        elif isinstance(item, AudioOutput):
            if self.gate.admits(item.stamp):
                self._audio(item, self._resample(item), now)
        elif isinstance(item, EndOfResponse):
            if self._resampler is not None:  # flush the resampler's tail
                tail = self._resampler.flush()
                self._resampler = None
                if len(tail) and self.gate.admits(item.stamp):
                    self._audio(AudioOutput(item.stamp, tail, self.sample_rate), tail, now)
            if self.paused and self.gate.admits(item.stamp):
                self._held.append(("end", item))
            else:
                due = max(now, self._play_end) if self.gate.admits(item.stamp) else now
                self.schedule.put(due, ("end", item))
        self._release()
        return iter(())

    def flushed(self, message: Flush) -> None:
        """An :class:`Interrupt` cuts the replies the gate no longer admits (a bare flush: nothing
        of a superseded revision reached the sink)."""
        if isinstance(message, Interrupt):
            self._interrupt(message.time)
            self._release()

    def _audio(self, item: AudioOutput, samples: np.ndarray, now: float) -> None:
        """Schedule ``samples`` (at the sink's rate) right after what is scheduled, or hold them."""
        if self.paused:
            self._held.append(("audio", item, samples))
            return
        self._turns_with_audio.add(item.stamp.turn_id)
        start = max(now, self._play_end)
        self._play_end = start + len(samples) / self.sample_rate
        turn = item.stamp.turn_id
        if turn not in self._turns_heard and (index := first_sound_index(samples)) is not None:
            self._turns_heard.add(turn)
            at = start + index / self.sample_rate  # its first sound, as the benchmarks read it from the audio
            self.bus.publish(FirstAudio(turn, engine=item.engine, language=item.language, time=at))
        self.schedule.put(start - self.lead_s, ("audio", item, samples, start))

    def _release(self) -> None:
        for entry in self.schedule.pop_due():
            if entry[0] == "audio":
                _, item, samples, start = entry
                if not self.gate.admits(item.stamp):
                    continue
                piece = _Played(item.stamp, start, len(samples) / self.sample_rate, item.text, samples)
                with self._lock:
                    self._played.append(piece)
                self.write(samples, item, start)
                if item.text.strip():
                    self.bus.publish(ReplyWords(item.stamp.turn_id, text=item.text, at=start))
            else:
                end: EndOfResponse = entry[1]
                if not self.gate.admits(end.stamp):  # superseded (a reopened turn): its audio was dropped
                    end.error = end.error or "cancelled"
                self.on_response_done(end)
                self.bus.publish(ResponseDone(end.stamp.turn_id, text=end.text, error=end.error, usage=dict(end.usage)))
                with self._lock:
                    self._played = [p for p in self._played if p.stamp != end.stamp]

    def delivered_until(self) -> float:
        """When the audio delivered so far ends playing (monotonic s; 0.0 if none is playing)."""
        with self._lock:
            return max((p.start + p.duration for p in self._played), default=0.0)

    # -- pause and resume -------------------------------------------------------------
    def _pause(self, at: float) -> None:
        """Stop at ``at``; hold the rest (the unplayed part of the chunk playing then included)."""
        if self.paused:
            return
        at = self.on_pause(at)
        self._paused_at = at
        held: list[tuple[Any, ...]] = []
        with self._lock:
            kept = []
            for piece in self._played:
                if piece.start + piece.duration <= at:
                    kept.append(piece)
                    continue
                heard_s = max(0.0, at - piece.start)
                cut = min(len(piece.samples), round(heard_s * self.sample_rate))
                if cut > 0:  # playing at `at`: the played part stays, the rest is held
                    played = piece.samples[:cut]
                    kept.append(dataclasses.replace(piece, duration=cut / self.sample_rate, samples=played))
                    rest = piece.samples[cut:]
                    if len(rest):
                        held.append(("audio", AudioOutput(piece.stamp, rest, self.sample_rate), rest))
                else:  # delivered ahead (lead_s), not played yet
                    item = AudioOutput(piece.stamp, piece.samples, self.sample_rate, piece.text)
                    held.append(("audio", item, piece.samples))
            self._played = kept
        # in due order, after the delivered ones; ends of cancelled replies stay (they are due now)
        for entry in self.schedule.drop_where(lambda e: self.gate.admits(e[1].stamp)):
            held.append(entry[:3] if entry[0] == "audio" else entry)
        self._held = held + self._held
        self._play_end = at

    def _resume(self) -> None:
        """Schedule what the pause held, from now, back to back."""
        if not self.paused:
            return
        held, self._held, paused_at = self._held, [], self._paused_at
        self._paused_at = None
        now = time.monotonic()
        self._play_end = max(now, paused_at or now)  # after what could not be taken back
        self._schedule_held(held, now)

    def _schedule_held(self, held: list[tuple[Any, ...]], now: float) -> None:
        for entry in held:
            if entry[0] == "audio":
                if self.gate.admits(entry[1].stamp):
                    self._audio(entry[1], entry[2], now)
            else:
                end: EndOfResponse = entry[1]
                self.schedule.put(max(now, self._play_end) if self.gate.admits(end.stamp) else now, entry)

    def _interrupt(self, at: float) -> None:
        """Cut the replies the gate no longer admits at ``at``; report what was heard of each."""
        self.on_interrupt(at)
        held, self._held, self._paused_at = self._held, [], None
        stale_held = [e for e in held if not self.gate.admits(e[1].stamp)]
        dropped = self.schedule.drop_where(lambda e: not self.gate.admits(e[1].stamp))
        stale = [e for e in [*stale_held, *dropped] if e[0] == "audio"]
        for entry in [*stale_held, *dropped]:  # a cut reply ends now, not when its dropped audio would have ended
            if entry[0] == "end":
                entry[1].error = entry[1].error or "cancelled"
                self.schedule.put(time.monotonic(), entry)
        with self._lock:
            played = [p for p in self._played if not self.gate.admits(p.stamp)]
            self._played = [p for p in self._played if self.gate.admits(p.stamp)]
        if held:  # what the pause held of the replies still valid plays from now
            self._play_end = time.monotonic()
            self._schedule_held([e for e in held if self.gate.admits(e[1].stamp)], self._play_end)
        elif stale or played:
            self._play_end = min(self._play_end, max(at, time.monotonic()))
        by_stamp: dict[Stamp, list[_Played]] = {}
        for piece in played:
            by_stamp.setdefault(piece.stamp, []).append(piece)
        for entry in stale:  # had audio here, none of it played: nothing was heard
            if entry[1].stamp.turn_id in self._turns_with_audio:
                by_stamp.setdefault(entry[1].stamp, [])
        for stamp, pieces in by_stamp.items():
            heard = "".join(p.text for p in pieces if p.start < at).strip()
            audio_end_s = sum(min(p.duration, at - p.start) for p in pieces if p.start < at)
            cut = ResponseInterrupted(
                stamp.turn_id, heard_text=heard, audio_end_ms=audio_end_s * 1000, revision=stamp.revision
            )
            self.bus.publish(cut)

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
        """Play out everything scheduled (and anything still paused) before the stream ends."""
        self._resume()
        while len(self.schedule) and not self.stop_event.is_set():
            due = self.schedule.next_due()
            if due is not None and self.stop_event.wait(max(0.0, due - time.monotonic())):
                break
            self._release()
        return iter(())
