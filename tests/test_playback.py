"""Paced playback: the RealtimeQueue, the PacedAudioSink base, FileSink cuts and the pipeline's barge-in flush.

No models: the sinks run as real threads fed through StageQueues with synthetic audio.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import EventBus, FirstAudio, ResponseDone, ResponseInterrupted
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import END_OF_STREAM, AudioOutput, EndOfResponse, Interrupt, Transcript, TTSInput
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.pipeline.builder import Pipeline
from speech_to_speech.speech.audio_io import FileSink, StreamClock
from speech_to_speech.speech.playback import PacedAudioSink, RealtimeQueue
from speech_to_speech.testing.fakes import RecordingSink, Write, chained
from tests.helpers import BusLog, wait_until

RATE = 16_000
#: generous bound for anything a thread must do "soon" on a loaded machine, s
WAIT_S = 10.0


# -- helpers ---------------------------------------------------------------------------------


class FakeClock:
    """A settable clock for :class:`RealtimeQueue`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tone(seconds: float, value: float = 0.5, rate: int = RATE) -> np.ndarray:
    """A constant-valued float32 block (easy to find again in a written file)."""
    return np.full(round(seconds * rate), value, dtype=np.float32)


@dataclass
class SinkRig:
    """A sink thread with its input queue, gate, bus and event log."""

    sink: Any
    queue: StageQueue
    gate: Gate
    bus: EventBus
    log: BusLog
    stop: threading.Event

    def feed(self, *items: Any) -> None:
        """Put ``items`` on the sink's input queue."""
        for item in items:
            assert self.queue.put_unless_stopped(item, self.stop)

    def finish(self) -> None:
        """End the stream and wait for the sink thread to play out and exit."""
        self.feed(END_OF_STREAM)
        self.sink.join(WAIT_S)
        assert not self.sink.is_alive(), "sink did not finish"


@pytest.fixture
def rig_factory() -> Iterator[Callable[..., SinkRig]]:
    """Builds sinks (not started) sharing nothing; every one is stopped at teardown."""
    rigs: list[SinkRig] = []

    def make(sink_cls: type[PacedAudioSink] = RecordingSink, **kwargs: Any) -> SinkRig:
        stop, gate, bus, q = threading.Event(), Gate(), EventBus(), StageQueue(64)
        log = BusLog(bus)
        sink = sink_cls(stop_event=stop, input_queue=q, gate=gate, bus=bus, **kwargs)
        rig = SinkRig(sink, q, gate, bus, log, stop)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.stop.set()
        if rig.sink.is_alive():
            rig.sink.join(WAIT_S)


def audio(stamp: Stamp, seconds: float, text: str = "", value: float = 0.5, rate: int = RATE) -> AudioOutput:
    """An :class:`AudioOutput` of ``seconds`` of constant audio."""
    return AudioOutput(stamp, tone(seconds, value, rate), rate, text)


# -- RealtimeQueue -------------------------------------------------------------------------------


def test_realtime_queue_releases_out_of_order_puts_in_due_order() -> None:
    clock = FakeClock()
    q = RealtimeQueue(clock)
    for due, name in [(3.0, "c"), (1.0, "a"), (2.0, "b"), (5.0, "e"), (4.0, "d")]:
        q.put(due, name)
    assert len(q) == 5
    clock.now = 10.0
    assert q.pop_due() == ["a", "b", "c", "d", "e"]
    assert len(q) == 0 and q.next_due() is None


def test_realtime_queue_releases_nothing_early() -> None:
    clock = FakeClock(0.0)
    q = RealtimeQueue(clock)
    q.put(1.0, "a")
    q.put(2.0, "b")
    assert q.pop_due() == []
    clock.now = 0.999
    assert q.pop_due() == []
    clock.now = 1.0  # due exactly now: released
    assert q.pop_due() == ["a"]
    clock.now = 1.5
    assert q.pop_due() == []
    assert q.pop_due(now=2.5) == ["b"]  # an explicit time overrides the clock
    assert len(q) == 0


def test_realtime_queue_next_due_is_the_earliest() -> None:
    clock = FakeClock()
    q = RealtimeQueue(clock)
    assert q.next_due() is None
    q.put(5.0, "late")
    assert q.next_due() == 5.0
    q.put(2.0, "early")
    assert q.next_due() == 2.0
    clock.now = 3.0
    assert q.pop_due() == ["early"]
    assert q.next_due() == 5.0


def test_realtime_queue_ties_keep_insertion_order() -> None:
    clock = FakeClock(1.0)
    q = RealtimeQueue(clock)
    items = [f"item{i}" for i in range(20)]
    for item in items:
        q.put(1.0, item)
    q.put(0.5, "first")
    assert q.pop_due() == ["first", *items]


def test_realtime_queue_ties_do_not_compare_items() -> None:
    """Items that cannot be ordered (dicts, arrays) are fine: the insertion counter breaks ties."""
    q = RealtimeQueue(FakeClock(1.0))
    q.put(1.0, {"a": 1})
    q.put(1.0, {"b": 2})
    assert q.pop_due() == [{"a": 1}, {"b": 2}]


def test_realtime_queue_drop_where() -> None:
    clock = FakeClock()
    q = RealtimeQueue(clock)
    for due, item in [(4.0, ("old", 4)), (1.0, ("new", 1)), (3.0, ("old", 3)), (2.0, ("new", 2)), (0.5, ("old", 0))]:
        q.put(due, item)
    dropped = q.drop_where(lambda item: item[0] == "old")
    assert dropped == [("old", 0), ("old", 3), ("old", 4)]  # in due order
    assert len(q) == 2 and q.next_due() == 1.0
    assert q.drop_where(lambda item: item[0] == "old") == []
    clock.now = 10.0
    assert q.pop_due() == [("new", 1), ("new", 2)]  # the heap is still valid after the drop


def test_realtime_queue_drop_where_keeps_ties_in_insertion_order() -> None:
    q = RealtimeQueue(FakeClock(1.0))
    for i in range(6):
        q.put(1.0, i)
    assert q.drop_where(lambda i: i % 2 == 0) == [0, 2, 4]
    assert q.pop_due() == [1, 3, 5]


# -- PacedAudioSink: pacing ---------------------------------------------------------------------


def test_delivery_is_lead_early_at_most_and_back_to_back_chunks_are_contiguous(
    rig_factory: Callable[..., SinkRig],
) -> None:
    rig = rig_factory(sample_rate=RATE, lead_s=0.05)
    stamp = rig.gate.new_turn_stamp()
    chunk_s = 0.2
    # queued before the thread starts, so all are scheduled long before the first one ends
    rig.feed(*(audio(stamp, chunk_s, text=f" w{i}") for i in range(4)), EndOfResponse(stamp, text="reply"))
    rig.sink.start()
    rig.finish()

    writes = rig.sink.writes
    assert [w.item.text for w in writes] == [" w0", " w1", " w2", " w3"]
    for w in writes:
        assert w.time >= w.start - rig.sink.lead_s, "delivered earlier than lead_s before its play time"
        assert len(w.samples) == round(chunk_s * RATE)
    starts = [w.start for w in writes]
    for earlier, later in itertools.pairwise(starts):
        assert later - earlier == pytest.approx(chunk_s, abs=1e-9)


def test_response_done_only_after_the_audio_is_due(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    rig.feed(audio(stamp, 0.15, "Hi"), audio(stamp, 0.15, " there"), EndOfResponse(stamp, text="Hi there"))
    rig.sink.start()
    assert wait_until(lambda: bool(rig.log.of(ResponseDone)))
    done = rig.log.of(ResponseDone)
    assert len(done) == 1 and done[0].turn_id == stamp.turn_id and done[0].text == "Hi there"
    last = rig.sink.writes[-1]
    play_end = last.start + len(last.samples) / RATE
    assert done[0].time >= play_end
    rig.finish()
    assert len(rig.log.of(ResponseDone)) == 1


def test_first_audio_is_published_once_per_turn(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    first, second = rig.gate.new_turn_stamp(), rig.gate.new_turn_stamp()
    rig.feed(*(audio(first, 0.05) for _ in range(3)), EndOfResponse(first))
    rig.feed(*(audio(second, 0.05) for _ in range(2)), EndOfResponse(second))
    rig.sink.start()
    rig.finish()
    assert [e.turn_id for e in rig.log.of(FirstAudio)] == [first.turn_id, second.turn_id]
    assert [e.turn_id for e in rig.log.of(ResponseDone)] == [first.turn_id, second.turn_id]
    assert len(rig.sink.writes) == 5


def test_first_audio_is_the_first_sound_not_the_first_chunk(rig_factory: Callable[..., SinkRig]) -> None:
    """Voice-to-voice ends at the reply's first sample above -60 dBFS, as the benchmarks read it
    from the audio: a silent chunk is not its first audio, and the leading silence of the chunk
    that sounds is counted."""
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    sounding = np.concatenate([np.zeros(RATE // 10, np.float32), tone(0.1)])  # 100 ms of silence, then sound
    rig.feed(audio(stamp, 0.05, value=0.0005), AudioOutput(stamp, sounding, RATE), EndOfResponse(stamp))
    rig.sink.start()
    rig.finish()
    (first,) = rig.log.of(FirstAudio)
    second_write = rig.sink.writes[1]
    assert first.time == pytest.approx(second_write.start + 0.1, abs=1e-6)


def test_cancel_stops_delivery_of_chunks_already_scheduled(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    scheduled_at_cancel: list[int] = []
    cancelled = threading.Event()

    def cancel_on_second_write(w: Write) -> None:
        # runs in the sink's thread: no race between the cancel and the next delivery
        if len(rig.sink.writes) == 2 and not cancelled.is_set():
            scheduled_at_cancel.append(len(rig.sink.schedule))
            rig.gate.scope.cancel()
            cancelled.set()

    rig.sink.on_write = cancel_on_second_write
    rig.feed(*(audio(stamp, 0.15, f" w{i}") for i in range(6)), EndOfResponse(stamp, text="full reply"))
    rig.sink.start()
    rig.finish()

    assert cancelled.is_set()
    assert scheduled_at_cancel[0] >= 4, "the later chunks should already have been scheduled"
    assert [w.item.text for w in rig.sink.writes] == [" w0", " w1"]
    # the end of a cancelled response is still reported, exactly once
    done = rig.log.of(ResponseDone)
    assert [e.turn_id for e in done] == [stamp.turn_id]


def test_cancelled_audio_arriving_later_is_dropped(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    old = rig.gate.new_turn_stamp()
    rig.gate.scope.cancel()
    new = rig.gate.new_turn_stamp()
    rig.feed(audio(old, 0.05, "old"), EndOfResponse(old), audio(new, 0.05, "new"), EndOfResponse(new))
    rig.sink.start()
    rig.finish()
    assert [w.item.text for w in rig.sink.writes] == ["new"]
    assert [e.turn_id for e in rig.log.of(FirstAudio)] == [new.turn_id]


# -- PacedAudioSink: interruption ----------------------------------------------------------------


WORDS = ["Once", " upon", "", " a", " time", " there", "", " was", " a", " fox"]


def test_interrupt_reports_exactly_the_words_that_started_before_it(rig_factory: Callable[..., SinkRig]) -> None:
    chunk_s, lead_s = 0.2, 0.3  # delivered more than a chunk early: delivery is not hearing
    rig = rig_factory(sample_rate=RATE, lead_s=lead_s)
    stamp = rig.gate.new_turn_stamp()
    rig.feed(*(audio(stamp, chunk_s, word) for word in WORDS), EndOfResponse(stamp, text="".join(WORDS)))
    rig.sink.start()

    # interrupt in the middle of the fourth chunk, once it has been delivered
    assert wait_until(lambda: len(rig.sink.writes) >= 4)
    first_start = rig.sink.writes[0].start
    at = rig.sink.writes[3].start + chunk_s / 2
    assert wait_until(lambda: time.monotonic() >= at)
    rig.gate.scope.cancel()
    rig.feed(Interrupt(at))
    assert wait_until(lambda: bool(rig.log.of(ResponseInterrupted)))
    writes_at_interrupt = list(rig.sink.writes)
    rig.finish()

    delivered_after_at = [w for w in writes_at_interrupt if w.start >= at]
    assert delivered_after_at, "lead_s > chunk: a chunk starting after the interruption was already delivered"
    interrupted = rig.log.of(ResponseInterrupted)
    assert len(interrupted) == 1
    event = interrupted[0]
    assert event.turn_id == stamp.turn_id
    expected = "".join(w.item.text for w in writes_at_interrupt if w.start < at).strip()
    assert expected == "Once upon a"
    assert event.heard_text == expected
    assert event.audio_end_ms == pytest.approx((at - first_start) * 1000, abs=1e-6)
    # nothing of the interrupted reply is delivered after the interruption
    assert len(rig.sink.writes) == len(writes_at_interrupt)
    assert [e.turn_id for e in rig.log.of(ResponseDone)] == [stamp.turn_id]


def test_interrupt_then_new_reply_plays_right_away(rig_factory: Callable[..., SinkRig]) -> None:
    """After an interrupt the cut reply ends at once and the next reply is not queued behind its audio."""
    chunk_s, chunks = 0.5, 10
    rig = rig_factory(sample_rate=RATE)
    old = rig.gate.new_turn_stamp()
    rig.feed(*(audio(old, chunk_s, f" w{i}") for i in range(chunks)), EndOfResponse(old))
    rig.sink.start()
    assert wait_until(lambda: len(rig.sink.writes) >= 1)
    old_end = rig.sink.writes[0].start + chunks * chunk_s  # when the whole reply would have ended
    at = time.monotonic()
    rig.gate.scope.cancel()
    rig.feed(Interrupt(at))
    assert wait_until(lambda: bool(rig.log.of(ResponseInterrupted)))
    new = rig.gate.new_turn_stamp()
    rig.feed(audio(new, 0.1, "Yes"), EndOfResponse(new))
    assert wait_until(lambda: any(w.item.stamp == new for w in rig.sink.writes))
    reply = next(w for w in rig.sink.writes if w.item.stamp == new)
    assert reply.start < old_end - 2.0, "the new reply waited behind the cancelled audio"
    rig.finish()
    assert {w.item.stamp for w in rig.sink.writes} == {old, new}
    heard = "".join(w.item.text for w in rig.sink.writes if w.item.stamp == old and w.start < at).strip()
    assert rig.log.of(ResponseInterrupted)[0].heard_text == heard
    # the cut reply ends once (right after it was cut), before the reply that followed it
    done = rig.log.of(ResponseDone)
    assert [e.turn_id for e in done] == [old.turn_id, new.turn_id]
    assert done[0].time < old_end - 2.0


def test_interrupt_with_nothing_playing_publishes_nothing(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    rig.feed(audio(stamp, 0.05, "done"), EndOfResponse(stamp))
    rig.sink.start()
    assert wait_until(lambda: bool(rig.log.of(ResponseDone)))
    rig.gate.scope.cancel()
    rig.feed(Interrupt(time.monotonic()))
    rig.finish()
    assert rig.log.of(ResponseInterrupted) == []


# -- PacedAudioSink: resampling ------------------------------------------------------------------


def test_resampling_22050_to_16000_keeps_the_duration(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    native = 22_050
    signal = (0.5 * np.sin(2 * np.pi * 440 * np.arange(6_555) / native)).astype(np.float32)
    bounds = [0, 1_000, 3_205, 6_538, 6_555]  # odd sizes, one tiny
    rig.feed(*(AudioOutput(stamp, signal[a:b], native) for a, b in itertools.pairwise(bounds)))
    rig.feed(EndOfResponse(stamp))
    rig.sink.start()
    rig.finish()

    out = np.concatenate([w.samples for w in rig.sink.writes])
    expected = len(signal) * RATE / native
    assert abs(len(out) - expected) <= 2
    assert out.dtype == np.float32
    # streaming resampling matches resampling the whole signal at once
    whole = soxr.resample(signal, native, RATE)
    n = min(len(out), len(whole))
    assert np.max(np.abs(out[:n] - whole[:n])) < 1e-3
    # and the chunks still play back to back
    starts = [w.start for w in rig.sink.writes if len(w.samples)]
    lengths = [len(w.samples) for w in rig.sink.writes if len(w.samples)]
    for i in range(1, len(starts)):
        assert starts[i] - starts[i - 1] == pytest.approx(lengths[i - 1] / RATE, abs=1e-9)


def test_no_resampling_at_the_sink_rate(rig_factory: Callable[..., SinkRig]) -> None:
    rig = rig_factory(sample_rate=RATE)
    stamp = rig.gate.new_turn_stamp()
    chunk = audio(stamp, 0.05, value=0.25)
    rig.feed(chunk, EndOfResponse(stamp))
    rig.sink.start()
    rig.finish()
    assert len(rig.sink.writes) == 1
    np.testing.assert_array_equal(rig.sink.writes[0].samples, chunk.samples)


# -- FileSink ------------------------------------------------------------------------------------


def test_file_sink_cuts_the_interrupted_reply(rig_factory: Callable[..., SinkRig], tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    clock = StreamClock()
    rig = rig_factory(FileSink, path=out, clock=clock)
    old = rig.gate.new_turn_stamp()
    old_value, new_value = 0.5, -0.25
    rig.feed(*(audio(old, 0.2, f" w{i}", value=old_value) for i in range(10)), EndOfResponse(old))
    rig.sink.start()

    assert wait_until(lambda: len(rig.sink._pieces) >= 2)
    at = time.monotonic()
    rig.gate.scope.cancel()
    rig.feed(Interrupt(at))
    assert wait_until(lambda: bool(rig.log.of(ResponseInterrupted)))
    new = rig.gate.new_turn_stamp()
    rig.feed(audio(new, 0.2, "Yes", value=new_value), EndOfResponse(new))
    rig.finish()

    written, rate = sf.read(str(out), dtype="float32")
    assert rate == RATE
    cut = int((at - clock.start) * RATE)
    is_old = np.isclose(written, old_value, atol=1e-3)
    assert is_old[:cut].sum() > 0.2 * RATE, "the reply did play before the interruption"
    assert not is_old[cut:].any(), "samples of the cancelled reply after the interruption"
    # what played of the old reply is contiguous from its start up to the cut
    first_old = int(np.flatnonzero(is_old)[0])
    assert is_old[first_old:cut].all()
    is_new = np.isclose(written, new_value, atol=1e-3)
    assert is_new.sum() == pytest.approx(0.2 * RATE, abs=2)
    assert np.flatnonzero(is_new)[0] >= cut


def test_file_sink_is_at_least_as_long_as_the_run(rig_factory: Callable[..., SinkRig], tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    clock = StreamClock()
    rig = rig_factory(FileSink, path=out, clock=clock)
    stamp = rig.gate.new_turn_stamp()
    rig.feed(audio(stamp, 0.1, "hi", value=0.5), EndOfResponse(stamp))
    rig.sink.start()
    rig.finish()
    elapsed = time.monotonic() - clock.start
    written, _ = sf.read(str(out), dtype="float32")
    assert len(written) <= elapsed * RATE + 1
    assert np.isclose(written, 0.5, atol=1e-3).sum() == pytest.approx(0.1 * RATE, abs=2)


# -- Pipeline.interrupt: an Interrupt message at the head of every stage's queue -------------------


class Recorder(BaseHandler):
    """A stage that records what it processes and every flush it receives, in order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(output_queue=None, **kwargs)
        self.seen: list[Any] = []

    def process(self, item: Any) -> None:
        self.seen.append(item)

    def flushed(self, message: Any) -> None:
        self.seen.append(message)


def test_pipeline_interrupt_reaches_every_stage_first_and_each_drops_its_own_stale_items() -> None:
    stop, gate, bus = threading.Event(), Gate(), EventBus()
    tts_inputs, audio_out = StageQueue(32), StageQueue(64)
    common: dict[str, Any] = {"stop_event": stop, "gate": gate, "bus": bus}
    tts, sink = Recorder(input_queue=tts_inputs, **common), Recorder(input_queue=audio_out, **common)
    pipeline = Pipeline(chained([tts, sink]), stop, gate, bus, StreamClock())

    old = gate.new_turn_stamp()
    for item in [TTSInput(old, "one."), TTSInput(old, "two."), EndOfResponse(old, text="one. two.")]:
        tts_inputs.put(item)
    for item in [audio(old, 0.01), audio(old, 0.01), EndOfResponse(old, text="earlier")]:
        audio_out.put(item)
    gate.scope.cancel()  # the VAD does this on speech start
    new = gate.new_turn_stamp()
    tts_inputs.put(TTSInput(new, "fresh."))
    audio_out.put(audio(new, 0.01, "fresh"))
    tts_inputs.put(Transcript(new, "not really here, but valid"))

    at = time.monotonic()
    pipeline.interrupt(at)
    pipeline.interrupt(at)  # a second one finds nothing more to drop
    for stage in (tts, sink):
        stage.start()
    try:
        assert wait_until(lambda: len(tts.seen) == 5 and len(sink.seen) == 4, WAIT_S)
    finally:
        stop.set()
    # each stage handles the interrupts before anything queued in front of them was processed
    assert [type(i).__name__ for i in tts.seen] == [
        "Interrupt",
        "Interrupt",
        "EndOfResponse",
        "TTSInput",
        "Transcript",
    ]
    assert tts.seen[2].stamp == old and tts.seen[3].stamp == new
    assert [type(i).__name__ for i in sink.seen] == ["Interrupt", "Interrupt", "EndOfResponse", "AudioOutput"]
    assert sink.seen[0].time == at  # the sink is told when the user barged in
    assert sink.seen[2].stamp == old and sink.seen[3].stamp == new
    assert (tts.dropped_stale, sink.dropped_stale) == (2, 2)


def test_an_interrupt_at_a_full_queue_never_blocks_and_frees_the_producer() -> None:
    """The interrupt goes past ``maxsize`` at once; the stage's drop frees a blocked producer."""
    stop, gate, bus = threading.Event(), Gate(), EventBus()
    audio_out = StageQueue(2)
    sink = Recorder(input_queue=audio_out, stop_event=stop, gate=gate, bus=bus)
    pipeline = Pipeline(chained([sink]), stop, gate, bus, StreamClock())
    old = gate.new_turn_stamp()
    audio_out.put(audio(old, 0.01))
    audio_out.put(audio(old, 0.01))
    gate.scope.cancel()
    new = gate.new_turn_stamp()
    put_done = threading.Event()

    def producer() -> None:
        audio_out.put_unless_stopped(audio(new, 0.01, "new"), stop)
        put_done.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        assert not put_done.wait(0.1)  # blocked: the queue is full
        pipeline.interrupt(time.monotonic())  # returns at once, though the queue is full
        assert audio_out.qsize() == 3
        sink.start()
        assert put_done.wait(WAIT_S)
        assert wait_until(lambda: len(sink.seen) == 2, WAIT_S)
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert [type(i).__name__ for i in sink.seen] == ["Interrupt", "AudioOutput"]
    assert sink.seen[1].stamp == new
