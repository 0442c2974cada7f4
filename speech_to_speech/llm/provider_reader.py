"""Reading a backend's provider events in a helper thread, so that time-outs hold while it blocks.

:func:`read_with_deadlines` is what the LLM stage iterates instead of the backend's generator: the
events, in order, each read only when the previous one was consumed; a :class:`ProviderTimeout`
past the first-token limit, the limit between tokens (a provider that stalls after its first
words) or the whole-response limit; and :data:`STALLED` once per pause of the provider after its
first token (a whole sentence held back for more text is spoken then).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from speech_to_speech.llm.api import AssistantMessage, ProviderEvent, ProviderTimeout, TextDelta, ToolCall

#: kinds of :attr:`ProviderReader.results` entries: an event, the end of the stream, an exception
EVENT, END, ERROR = object(), object(), object()
#: seconds a stopped provider reader may take to end by itself before it is aborted
READER_GRACE_S = 0.05
#: marker yielded by :func:`read_with_deadlines` when the provider paused after its first token
STALLED: Any = object()
#: the pause that counts, s (a healthy stream's tokens come every 10-100 ms)
STALL_FLUSH_S = 0.5
#: seconds between checks of the deadlines and of ``should_stop`` while the provider is silent
POLL_S = 0.1


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


def read_with_deadlines(
    make_events: Callable[[Callable[[], bool]], Iterator[ProviderEvent]],
    name: str,
    should_stop: Callable[[], bool],
    start: float,
    limits: tuple[float | None, float | None, float | None],
    abort: Callable[[], None],
) -> Iterator[ProviderEvent]:
    """The events of ``make_events`` (see :class:`ProviderReader`), with deadlines.

    Args:
        make_events: builds the backend's generator, given ``abandoned()``.
        name: the reader thread's name.
        should_stop: True once the response is no longer wanted (then this returns quietly).
        start: when the request was made (``time.monotonic()``).
        limits: (first-token limit, next-token limit, whole-response limit), s; None for no limit.
            Any text delta (an empty one is a sign of life, e.g. a call's arguments streaming),
            tool call or full message counts as the first token. The next-token limit holds from
            then on, for each event after the previous one, counted from the moment it was asked
            for (the time the stage took to pass the previous one on is not the provider's).
        abort: unblocks the backend when its thread does not end by itself once given up on.

    Raises:
        ProviderTimeout: a limit passed.
    """
    first_s, next_s, total_s = limits
    reader = ProviderReader(make_events, name)
    first = False
    try:
        while True:
            reader.ask_next()
            asked, stalled = time.monotonic(), False
            while True:
                try:
                    kind, value = reader.results.get(timeout=POLL_S)
                    break
                except queue.Empty:
                    pass
                if should_stop():
                    return
                now = time.monotonic()
                if first_s is not None and not first and now - start > first_s:
                    raise ProviderTimeout(f"no first token within {first_s:g} s")
                if next_s is not None and first and now - asked > next_s:
                    raise ProviderTimeout(f"no next token within {next_s:g} s")
                if total_s is not None and now - start > total_s:
                    raise ProviderTimeout(f"no complete answer within {total_s:g} s")
                if first and not stalled and now - asked > STALL_FLUSH_S:
                    stalled = True
                    yield STALLED
            if kind is END:
                return
            if kind is ERROR:
                raise value
            if isinstance(value, (TextDelta, ToolCall, AssistantMessage)):
                first = True
            yield value
    finally:
        if not reader.stop():
            abort()
