"""The stage base class: one thread, bounded queues, ordered shutdown."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import EventBus, StageError
from speech_to_speech.core.messages import END_OF_STREAM, ControlMessage, EndOfStream, Flush
from speech_to_speech.core.queues import StageQueue

logger = logging.getLogger(__name__)

#: ``extra`` for log records of failures that are also published as events (and so shown
#: by the console): a console log filter drops them to show each failure once
SHOWN_AS_EVENT = {"shown_as_event": True}


class StageControl(ControlMessage):
    """A control message for one kind of stage: applied in that stage's own thread, in order
    with the data around it (so a setting changed before a request holds for that request).

    This is how another thread changes a running stage (a realtime session's update reaching
    the VAD or the LLM, a history edit): subclasses name the stage base class in ``target``
    and change the stage in :meth:`apply`. :class:`~speech_to_speech.core.handler.BaseHandler`
    applies it when it reaches a stage of that class and forwards it, unchanged, through any
    other stage. It carries no stamp and is never stale.
    """

    target: ClassVar[type] = object

    def apply(self, stage: Any) -> None:
        """Change ``stage`` (runs in its thread, between two items)."""
        raise NotImplementedError


class BaseHandler(threading.Thread):
    """One pipeline stage running in its own thread.

    Life cycle: :meth:`setup` once (load models), then for each input item
    :meth:`process` as a generator whose yielded items go to the output queue,
    then :meth:`cleanup`. The thread ends when :data:`END_OF_STREAM` arrives
    (it is forwarded downstream after :meth:`on_end_of_stream` has yielded its
    last items, so the chain shuts down in order) or when ``stop_event`` is set.

    An exception raised while processing one item is logged with the stage name
    and item type, published as :class:`~speech_to_speech.core.events.StageError`,
    and the stage carries on with the next item.

    Every yielded item that carries a ``stamp`` passes :meth:`Gate.admits`
    before it is enqueued; stale items are dropped.

    Args:
        stop_event: set to stop every stage.
        input_queue: where items come from (None for sources).
        output_queue: where results go (None for sinks).
        gate: the shared validity gate.
        bus: where events are published.
        name: thread name, also used in logs.
    """

    #: seconds between checks of ``stop_event`` while waiting on a queue
    poll_s: float = 0.1

    def __init__(
        self,
        stop_event: threading.Event,
        input_queue: StageQueue | None,
        output_queue: StageQueue | None,
        gate: Gate,
        bus: EventBus,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name or type(self).__name__, daemon=True)
        self.stop_event = stop_event
        self.input_queue = input_queue
        self.output_queue = output_queue
        self.gate = gate
        self.bus = bus
        self.ready = threading.Event()
        self.setup_error: BaseException | None = None
        #: seconds :meth:`setup` took (model load), set once ready
        self.load_seconds = 0.0
        self.dropped_stale = 0

    # -- hooks for subclasses -------------------------------------------------
    def setup(self) -> None:
        """Load models and allocate resources. Runs once, in the stage thread."""

    def process(self, item: Any) -> Iterator[Any] | Iterable[Any] | None:
        """Handle one input item; yield zero or more output items."""
        raise NotImplementedError

    def on_end_of_stream(self) -> Iterator[Any] | Iterable[Any] | None:
        """Yield final items (e.g. a buffered utterance) before shutdown."""
        return None

    def cleanup(self) -> None:
        """Release resources. Runs once, in the stage thread, after the loop."""

    def flushed(self, message: Flush) -> None:
        """React to a :class:`~speech_to_speech.core.messages.Flush` or an
        :class:`~speech_to_speech.core.messages.Interrupt` (in this stage's thread, after the stale
        data queued here was dropped). The stage's current work already stopped at its next gate
        check; a sink cuts playback here."""

    # -- machinery ----------------------------------------------------------------
    def emit(self, item: Any) -> bool:
        """Send ``item`` downstream if it is still valid.

        Blocks while the output queue is full (backpressure) unless stopping.
        Only data messages are ever stale: ends of response and control messages always pass
        (:class:`~speech_to_speech.core.cancel.MessageKind`).

        Returns:
            True if the item was enqueued; False if it was stale or we are stopping.
        """
        if self.gate.drops(item):
            self.dropped_stale += 1
            logger.debug("%s dropped stale %s", self.name, type(item).__name__)
            return False
        if self.output_queue is None:
            return False
        return self.output_queue.put_unless_stopped(item, self.stop_event, self.poll_s)

    def _emit_all(self, results: Iterator[Any] | Iterable[Any] | None) -> None:
        if results is None:
            return
        for result in results:
            if self.stop_event.is_set():
                return
            self.emit(result)

    def _next_item(self) -> Any:
        """Block for the next input item; None while nothing arrived."""
        assert self.input_queue is not None
        try:
            return self.input_queue.get(timeout=self.poll_s)
        except queue.Empty:
            return None

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.setup()
        except BaseException as exc:  # reported to the builder, which exits cleanly
            self.setup_error = exc
            logger.debug("%s setup failed", self.name, exc_info=True)
            self.ready.set()
            self.stop_event.set()
            return
        self.load_seconds = time.monotonic() - start
        logger.info("%s ready in %.1f s", self.name, self.load_seconds)
        self.ready.set()
        try:
            self._loop()
        finally:
            try:
                self.cleanup()
            except Exception:
                logger.exception("%s cleanup failed", self.name)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            item = self._next_item()
            if item is None:
                continue
            if isinstance(item, EndOfStream):
                self._guarded(self.on_end_of_stream, None)
                if self.output_queue is not None:
                    self.output_queue.put_unless_stopped(END_OF_STREAM, self.stop_event)
                return
            if isinstance(item, Flush):
                self._flush(item)
                continue
            if isinstance(item, StageControl):
                self._control(item)
                continue
            self._guarded(self.process, item)

    def _flush(self, message: Flush) -> None:
        """Drop the stale data queued for this stage, then let the stage react (:meth:`flushed`).

        A flush is put at the head of every stage's queue by the pipeline, so it is not passed on."""
        assert self.input_queue is not None
        dropped = self.input_queue.drop_where(self.gate.drops)
        self.dropped_stale += dropped
        if dropped:
            logger.debug("%s dropped %d stale queued items on %s", self.name, dropped, type(message).__name__)
        try:
            self.flushed(message)
        except Exception as exc:
            logger.exception("%s failed on %s", self.name, type(message).__name__, extra=SHOWN_AS_EVENT)
            self.bus.publish(StageError(0, stage=self.name, message=f"{type(exc).__name__}: {exc}"))

    def _control(self, control: StageControl) -> None:
        """Apply ``control`` if it is for this stage, else pass it on unchanged."""
        if not isinstance(self, control.target):
            self.emit(control)
            return
        try:
            control.apply(self)
        except Exception as exc:
            logger.exception("%s failed on %s", self.name, type(control).__name__, extra=SHOWN_AS_EVENT)
            self.bus.publish(StageError(0, stage=self.name, message=f"{type(exc).__name__}: {exc}"))

    def _guarded(self, method: Any, item: Any) -> None:
        try:
            self._emit_all(method(item) if item is not None else method())
        except Exception as exc:
            what = type(item).__name__ if item is not None else "end of stream"
            logger.exception("%s failed on %s", self.name, what, extra=SHOWN_AS_EVENT)
            turn_id = getattr(getattr(item, "stamp", None), "turn_id", 0)
            self.bus.publish(StageError(turn_id, stage=self.name, message=f"{type(exc).__name__}: {exc}"))
