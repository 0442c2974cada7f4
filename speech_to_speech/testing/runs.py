"""Small helpers shared by the tests and the benchmarks: build a stage as the pipeline does, run
local mode's pipeline in process, wait for a condition, record a bus's events, and the flags that
point the LLM at a scripted provider."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import Event, EventBus

T = TypeVar("T")


def wait_until(condition: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll ``condition`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


def new_stage(cls: type[T], **kwargs: Any) -> T:
    """A stage of class ``cls`` built as the pipeline builds one, with its own stop event, gate and bus.

    ``kwargs`` go to the constructor (``config``, ``name``, ``device``...); the queues are None
    unless given (``input_queue``, ``output_queue``): the stage is driven through ``process``.
    """
    kwargs.setdefault("input_queue", None)
    kwargs.setdefault("output_queue", None)
    return cls(stop_event=threading.Event(), gate=Gate(), bus=EventBus(), **kwargs)


def run_local(args: Any, bus: EventBus) -> Any:
    """Build local mode's pipeline from parsed ``args``, run it to the end of its input file and
    stop it; return it (its stages hold what the run left, e.g. the LLM's history)."""
    from speech_to_speech.pipeline.builder import build_pipeline

    pipeline = build_pipeline(args, bus)
    pipeline.start()
    try:
        pipeline.wait()
    finally:
        pipeline.stop()
    return pipeline


def responses_api_flags(base_url: str, model: str = "test-model") -> tuple[str, ...]:
    """The flags that make the LLM ``responses-api`` on ``base_url`` (e.g. a scripted :class:`ResponsesServer`)."""
    return ("--llm_backend", "responses-api", "--responses_api_base_url", base_url, "--model_name", model)


class BusLog:
    """Records every event published on an :class:`EventBus` and wakes waiters when one arrives."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        self._changed = threading.Condition()
        bus.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, kind: type[Event], turn_id: int | None = None) -> list[Any]:
        """Events of type ``kind`` (for ``turn_id`` when given), in publication order."""
        with self._changed:
            return [e for e in self.events if isinstance(e, kind) and (turn_id is None or e.turn_id == turn_id)]

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Block until ``condition()`` holds (re-checked on each event), ``stop`` is set or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return condition()
                self._changed.wait(min(left, 0.05))
            return True
