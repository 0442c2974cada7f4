"""Runtime machinery: bounded queues, backpressure, shutdown, error isolation and the stale-work gate."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import Event, EventBus, StageError
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import END_OF_STREAM, EndOfResponse, EndOfStream, TTSInput
from speech_to_speech.core.queues import StageQueue
from tests.helpers import wait_until

JOIN_TIMEOUT_S = 2.0


def drain(q: StageQueue) -> list[Any]:
    """Every item currently in ``q``, in order."""
    items = []
    while not q.empty():
        items.append(q.get_nowait())
    return items


class Tagger(BaseHandler):
    """Appends its name to each string item; on end of stream yields a final marker."""

    poll_s = 0.02

    def __init__(self, *args: Any, eos_log: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eos_log = eos_log if eos_log is not None else []

    def process(self, item: str) -> Iterator[str]:
        yield f"{item}>{self.name}"

    def on_end_of_stream(self) -> Iterator[str]:
        self.eos_log.append(self.name)
        yield f"flush>{self.name}"


class Fanout(BaseHandler):
    """Turns one input item into ``count`` output items, recording each one before it is emitted."""

    poll_s = 0.02

    def __init__(self, *args: Any, count: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count = count
        self.produced = 0

    def process(self, item: Any) -> Iterator[int]:
        for i in range(self.count):
            self.produced += 1
            yield i


class Collector(BaseHandler):
    """A sink that records every item it gets."""

    poll_s = 0.02

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, output_queue=None, **kwargs)
        self.items: list[Any] = []

    def process(self, item: Any) -> None:
        self.items.append(item)


class Failing(BaseHandler):
    """Passes items through, but raises on the item equal to ``bad``."""

    poll_s = 0.02

    def __init__(self, *args: Any, bad: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bad = bad

    def process(self, item: Any) -> Iterator[Any]:
        value = item.text if isinstance(item, TTSInput) else item
        if value == self.bad:
            raise RuntimeError(f"cannot handle {value}")
        yield item


class PassThrough(BaseHandler):
    poll_s = 0.02

    def process(self, item: Any) -> Iterator[Any]:
        yield item


@pytest.fixture
def stop() -> threading.Event:
    return threading.Event()


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def bus() -> EventBus:
    return EventBus()


@pytest.fixture
def started() -> Iterator[list[BaseHandler]]:
    """Threads a test starts; stopped and joined afterwards so none leaks into other tests."""
    threads: list[BaseHandler] = []
    yield threads
    for thread in threads:
        thread.stop_event.set()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)


def make_chain(
    stop: threading.Event, gate: Gate, bus: EventBus, maxsizes: tuple[int, int, int, int] = (64, 64, 64, 64)
) -> tuple[list[StageQueue], list[Tagger], list[str]]:
    """Three Tagger stages A -> B -> C joined by four queues (q0 in, q3 out)."""
    queues = [StageQueue(size) for size in maxsizes]
    eos_log: list[str] = []
    stages = [
        Tagger(stop, queues[i], queues[i + 1], gate, bus, name=name, eos_log=eos_log) for i, name in enumerate("ABC")
    ]
    return queues, stages, eos_log


# -- StageQueue -----------------------------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, -1])
def test_stage_queue_refuses_unbounded(maxsize: int) -> None:
    with pytest.raises(ValueError, match="bounded"):
        StageQueue(maxsize)


def test_stage_queue_default_is_bounded() -> None:
    assert StageQueue().maxsize >= 1


def test_drop_where_keeps_order_and_counts() -> None:
    q = StageQueue(10)
    for i in range(8):
        q.put(i)
    assert q.drop_where(lambda x: x % 2 == 0) == 4
    assert drain(q) == [1, 3, 5, 7]
    assert q.drop_where(lambda x: True) == 0


def test_drop_where_keeps_task_accounting() -> None:
    q = StageQueue(10)
    for i in range(5):
        q.put(i)
    q.get_nowait()
    q.task_done()
    assert q.drop_where(lambda x: x >= 3) == 2
    for _ in range(2):
        q.get_nowait()
        q.task_done()
    # all tasks accounted for: join() must return at once rather than hang
    joiner = threading.Thread(target=q.join, daemon=True)
    joiner.start()
    joiner.join(1.0)
    assert not joiner.is_alive()


def test_clear_empties_and_wakes_blocked_producer() -> None:
    q = StageQueue(2)
    q.put("a")
    q.put("b")
    done = threading.Event()

    def produce() -> None:
        q.put("c")  # blocks: the queue is full
        done.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    assert not done.wait(0.1)
    assert q.clear() == 2
    assert done.wait(1.0), "a producer blocked on a full queue must wake when clear() frees space"
    assert drain(q) == ["c"]
    assert q.clear() == 0


def test_put_unless_stopped_returns_false_when_stopped() -> None:
    q = StageQueue(1)
    q.put("full")
    stop = threading.Event()
    result: list[bool] = []
    putter = threading.Thread(target=lambda: result.append(q.put_unless_stopped("x", stop, poll_s=0.01)))
    putter.start()
    stop.set()
    putter.join(1.0)
    assert result == [False]
    assert drain(q) == ["full"]


# -- backpressure ----------------------------------------------------------------------


def test_slow_consumer_applies_backpressure(
    stop: threading.Event, gate: Gate, bus: EventBus, started: list[BaseHandler]
) -> None:
    maxsize, count = 3, 20
    inq, outq = StageQueue(4), StageQueue(maxsize)
    producer = Fanout(stop, inq, outq, gate, bus, name="producer", count=count)
    started.append(producer)
    producer.start()
    inq.put("go")

    assert wait_until(outq.full, JOIN_TIMEOUT_S)
    # The producer is now blocked in emit(): it has produced the item it cannot enqueue and no more.
    max_seen = 0
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        max_seen = max(max_seen, outq.qsize())
        time.sleep(0.01)
    assert max_seen == maxsize
    assert producer.produced == maxsize + 1
    assert producer.is_alive()

    # Once a consumer drains the queue the producer proceeds and everything arrives, in order.
    sink = Collector(stop, outq, gate=gate, bus=bus, name="sink")
    started.append(sink)
    sink.start()
    assert wait_until(lambda: len(sink.items) == count, JOIN_TIMEOUT_S)
    assert sink.items == list(range(count))
    assert producer.produced == count


# -- shutdown ----------------------------------------------------------------------------


def test_stop_event_joins_every_stage(stop: threading.Event, gate: Gate, bus: EventBus) -> None:
    # The output queue has room for one item and nobody reads it, so stage C blocks in emit,
    # B and A block behind it: stopping must still end every thread promptly.
    queues, stages, _ = make_chain(stop, gate, bus, maxsizes=(64, 1, 1, 1))
    for stage in stages:
        stage.start()
    for i in range(10):
        queues[0].put(str(i))
    assert wait_until(lambda: queues[3].full() and queues[2].full(), JOIN_TIMEOUT_S)
    assert all(stage.is_alive() for stage in stages)

    began = time.monotonic()
    stop.set()
    for stage in stages:
        stage.join(max(0.0, JOIN_TIMEOUT_S - (time.monotonic() - began)))
    assert [s.name for s in stages if s.is_alive()] == []
    assert time.monotonic() - began < JOIN_TIMEOUT_S


def test_stop_event_joins_idle_stages(stop: threading.Event, gate: Gate, bus: EventBus) -> None:
    _, stages, _ = make_chain(stop, gate, bus)
    for stage in stages:
        stage.start()
    assert all(stage.ready.wait(1.0) for stage in stages)
    stop.set()
    began = time.monotonic()
    for stage in stages:
        stage.join(JOIN_TIMEOUT_S)
    assert not any(stage.is_alive() for stage in stages)
    assert time.monotonic() - began < JOIN_TIMEOUT_S


def test_end_of_stream_shuts_chain_down_in_order(stop: threading.Event, gate: Gate, bus: EventBus) -> None:
    queues, stages, eos_log = make_chain(stop, gate, bus)
    for i in range(10):
        queues[0].put(str(i))
    queues[0].put(END_OF_STREAM)
    for stage in stages:
        stage.start()

    for stage in stages:
        stage.join(JOIN_TIMEOUT_S)
    assert not any(stage.is_alive() for stage in stages), "stages must end by themselves after END_OF_STREAM"
    assert not stop.is_set()

    out = drain(queues[3])
    assert out[:10] == [f"{i}>A>B>C" for i in range(10)]
    # each stage's final items come after its input, and are processed by the later stages
    assert out[10:13] == ["flush>A>B>C", "flush>B>C", "flush>C"]
    assert out[13:] == [END_OF_STREAM]
    assert isinstance(out[-1], EndOfStream)
    assert eos_log == ["A", "B", "C"]
    assert all(q.empty() for q in queues[:3])


# -- error isolation -------------------------------------------------------------------------


def test_exception_in_process_is_reported_and_stage_carries_on(
    stop: threading.Event, gate: Gate, bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Event] = []
    bus.subscribe(events.append)
    inq, outq = StageQueue(16), StageQueue(16)
    stage = Failing(stop, inq, outq, gate, bus, name="flaky", bad="two")
    stamp = gate.new_turn_stamp()
    for text in ("one", "two", "three"):
        inq.put(TTSInput(stamp, text))
    inq.put(END_OF_STREAM)

    with caplog.at_level(logging.ERROR, logger="speech_to_speech.core.handler"):
        stage.start()
        stage.join(JOIN_TIMEOUT_S)
    assert not stage.is_alive()

    out = drain(outq)
    assert [item.text for item in out[:-1]] == ["one", "three"]
    assert out[-1] is END_OF_STREAM

    errors = [e for e in events if isinstance(e, StageError)]
    assert len(errors) == 1
    assert errors[0].stage == "flaky"
    assert errors[0].turn_id == stamp.turn_id
    assert "RuntimeError" in errors[0].message and "cannot handle two" in errors[0].message
    assert any("flaky" in r.getMessage() and "TTSInput" in r.getMessage() for r in caplog.records)


def test_exception_in_end_of_stream_still_forwards_eos(stop: threading.Event, gate: Gate, bus: EventBus) -> None:
    class BadFlush(PassThrough):
        def on_end_of_stream(self) -> Iterator[Any]:
            raise RuntimeError("flush failed")

    events: list[Event] = []
    bus.subscribe(events.append)
    inq, outq = StageQueue(4), StageQueue(4)
    stage = BadFlush(stop, inq, outq, gate, bus, name="badflush")
    inq.put("x")
    inq.put(END_OF_STREAM)
    stage.start()
    stage.join(JOIN_TIMEOUT_S)
    assert not stage.is_alive()
    assert drain(outq) == ["x", END_OF_STREAM]
    assert [e.stage for e in events if isinstance(e, StageError)] == ["badflush"]


# -- the stale-work gate -------------------------------------------------------------------


def make_emitter(gate: Gate, bus: EventBus, maxsize: int = 8) -> tuple[PassThrough, StageQueue]:
    outq = StageQueue(maxsize)
    return PassThrough(threading.Event(), None, outq, gate, bus, name="emitter"), outq


def test_gate_drops_old_generation(gate: Gate, bus: EventBus) -> None:
    stage, outq = make_emitter(gate, bus)
    old = gate.new_turn_stamp()
    assert stage.emit(TTSInput(old, "before barge-in"))
    gate.scope.cancel()
    assert not stage.emit(TTSInput(old, "after barge-in"))
    current = gate.stamp(old.turn_id, old.revision)
    assert current.generation == old.generation + 1
    assert stage.emit(TTSInput(current, "new generation"))
    assert [item.text for item in drain(outq)] == ["before barge-in", "new generation"]
    assert stage.dropped_stale == 1


def test_gate_drops_older_revision(gate: Gate, bus: EventBus) -> None:
    stage, outq = make_emitter(gate, bus)
    rev0 = gate.new_turn_stamp()
    rev1 = gate.stamp(rev0.turn_id, gate.turns.revise(rev0.turn_id))
    assert rev1.revision == 1
    assert not stage.emit(TTSInput(rev0, "old transcript"))
    assert stage.emit(TTSInput(rev1, "new transcript"))
    # another turn's work is unaffected by this turn's revision
    other = gate.new_turn_stamp()
    assert stage.emit(TTSInput(other, "other turn"))
    assert [item.text for item in drain(outq)] == ["new transcript", "other turn"]
    assert stage.dropped_stale == 1


def test_end_of_response_bypasses_gate(gate: Gate, bus: EventBus) -> None:
    stage, outq = make_emitter(gate, bus)
    stamp = gate.new_turn_stamp()
    gate.turns.revise(stamp.turn_id)
    gate.scope.cancel()
    assert not gate.admits(stamp)
    assert stage.emit(EndOfResponse(stamp, text="cut short"))
    assert stage.emit("control message without a stamp")
    out = drain(outq)
    assert isinstance(out[0], EndOfResponse) and out[0].stamp == stamp
    assert out[1] == "control message without a stamp"
    assert stage.dropped_stale == 0


def test_stale_items_never_reach_output_queue_through_running_stage(
    stop: threading.Event, gate: Gate, bus: EventBus
) -> None:
    inq, outq = StageQueue(16), StageQueue(16)
    stage = PassThrough(stop, inq, outq, gate, bus, name="gated")
    stale = gate.new_turn_stamp()
    gate.scope.cancel()
    fresh = gate.new_turn_stamp()
    unknown = Stamp(turn_id=999, revision=0, generation=gate.scope.generation)  # not from this tracker
    inq.put(TTSInput(stale, "stale"))
    inq.put(TTSInput(fresh, "fresh"))
    inq.put(EndOfResponse(stale, text="stale end"))
    inq.put(TTSInput(unknown, "unknown turn"))
    inq.put(END_OF_STREAM)
    stage.start()
    stage.join(JOIN_TIMEOUT_S)
    assert not stage.is_alive()

    out = drain(outq)
    assert [type(item).__name__ for item in out] == ["TTSInput", "EndOfResponse", "TTSInput", "EndOfStream"]
    assert [getattr(item, "text", None) for item in out[:3]] == ["fresh", "stale end", "unknown turn"]
    assert stage.dropped_stale == 1


def test_sink_emit_without_output_queue_returns_false(gate: Gate, bus: EventBus) -> None:
    sink = Collector(threading.Event(), StageQueue(1), gate=gate, bus=bus)
    assert not sink.emit(TTSInput(gate.new_turn_stamp(), "nowhere to go"))


def test_every_message_says_how_it_behaves_on_a_cancel(gate: Gate) -> None:
    """Data is dropped once stale; an end of response and control messages never are."""
    import inspect

    from speech_to_speech.core import messages
    from speech_to_speech.core.cancel import MessageKind
    from speech_to_speech.core.handler import StageControl
    from speech_to_speech.llm.upstream import CutToHeard

    classes = [c for _, c in inspect.getmembers(messages, inspect.isclass) if c.__module__ == messages.__name__]
    assert all(issubclass(c, messages.Message) for c in classes)
    kinds = {c.__name__: c.kind for c in classes if c not in (messages.Message, messages.ControlMessage)}
    control = {"EndOfStream", "Flush", "Interrupt", "Pause", "Resume"}
    assert {name for name, kind in kinds.items() if kind is MessageKind.CONTROL} == control
    assert {name for name, kind in kinds.items() if kind is MessageKind.END} == {"EndOfResponse"}
    assert StageControl.kind is CutToHeard.kind is MessageKind.CONTROL

    stale = gate.new_turn_stamp()
    gate.scope.cancel()
    assert gate.drops(TTSInput(stale, "old words"))
    assert not gate.drops(EndOfResponse(stale))
    assert not gate.drops(messages.Interrupt()) and not gate.drops(CutToHeard(stale.turn_id, "old"))
    assert not gate.drops(TTSInput(gate.new_turn_stamp(), "new words"))


def test_take_first_if_takes_only_a_matching_head_and_frees_room() -> None:
    q = StageQueue(2)
    assert q.take_first_if(lambda x: True) is None  # empty
    q.put("a")
    q.put("b")
    assert q.take_first_if(lambda x: x == "b") is None  # "b" is not at the head
    done = threading.Event()

    def produce() -> None:
        q.put("c")  # blocks: the queue is full
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    assert not done.wait(0.05)
    assert q.take_first_if(lambda x: x == "a") == "a"
    assert done.wait(1.0)
    assert drain(q) == ["b", "c"]


def test_put_ahead_overtakes_data_and_keeps_the_order_of_control_messages() -> None:
    from speech_to_speech.core.messages import Flush, Interrupt

    q = StageQueue(2)
    q.put("data 1")
    q.put("data 2")  # full: put_ahead does not wait
    q.put_first(interrupt := Interrupt())
    q.put_ahead(first := Flush())
    q.put_ahead(second := Flush())
    assert drain(q) == [interrupt, first, second, "data 1", "data 2"]
