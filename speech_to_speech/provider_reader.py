"""Reading a backend's provider events in a helper thread, so that time-outs hold while it blocks."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from speech_to_speech.llm_api import ProviderEvent

#: kinds of :attr:`ProviderReader.results` entries: an event, the end of the stream, an exception
EVENT, END, ERROR = object(), object(), object()
#: seconds a stopped provider reader may take to end by itself before it is aborted
READER_GRACE_S = 0.05


class ProviderReader:
    """Runs a backend's event generator in a daemon thread, advancing it only when asked.

    ``make_events(abandoned)`` builds the generator; ``abandoned()`` turns True once the consumer
    gave up, so the backend can stop at its next check. Lock-step (one event per
    :meth:`ask_next`) keeps the order of side effects exactly as if the consumer iterated the
    generator itself: nothing is read ahead of what was consumed.
    """

    def __init__(self, make_events: Callable[[Callable[[], bool]], Iterator[ProviderEvent]], name: str) -> None:
        self.results: queue.Queue[tuple[object, Any]] = queue.Queue()
        self._asks: queue.Queue[bool] = queue.Queue()
        self._abandoned = threading.Event()
        self._make_events = make_events
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def ask_next(self) -> None:
        """Let the thread read one more event (its result lands in :attr:`results`)."""
        self._asks.put(True)

    def stop(self) -> bool:
        """Give up on the generator; True when its thread ended within :data:`READER_GRACE_S`."""
        self._abandoned.set()
        self._asks.put(False)
        self._thread.join(READER_GRACE_S)
        return not self._thread.is_alive()

    def _run(self) -> None:
        events: Iterator[ProviderEvent] | None = None
        try:
            events = iter(self._make_events(self._abandoned.is_set))
            while self._asks.get() and not self._abandoned.is_set():
                try:
                    event = next(events)
                except StopIteration:
                    self.results.put((END, None))
                    return
                self.results.put((EVENT, event))
        except BaseException as exc:  # handed to the consumer, which raises it in the stage thread
            self.results.put((ERROR, exc))
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
