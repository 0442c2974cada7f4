"""Bounded inter-stage queues with a flush API.

All stage-to-stage queues are :class:`StageQueue` instances: a
:class:`queue.Queue` that must have a ``maxsize`` and that can drop stale
items without callers touching ``queue.mutex``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from speech_to_speech.core.cancel import MessageKind

DEFAULT_MAXSIZE = 64


class StageQueue(queue.Queue):
    """A bounded FIFO between two stages.

    Args:
        maxsize: capacity in items; must be >= 1 (unbounded queues are refused).

    Raises:
        ValueError: if ``maxsize`` < 1.
    """

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE) -> None:
        if maxsize < 1:
            raise ValueError(f"stage queues must be bounded, got maxsize={maxsize}")
        super().__init__(maxsize)

    def put_unless_stopped(self, item: Any, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Block until ``item`` fits (backpressure) or ``stop`` is set.

        Returns:
            True if the item was enqueued, False if ``stop`` was set first.
        """
        while not stop.is_set():
            try:
                self.put(item, timeout=poll_s)
                return True
            except queue.Full:
                continue
        return False

    def put_first(self, item: Any) -> None:
        """Put ``item`` at the head of the queue, at once, even when the queue is full.

        For control messages (:class:`~speech_to_speech.core.messages.Interrupt`, a stage's
        settings) that must overtake the data queued in front of them: they are few and small,
        so going past ``maxsize`` by one never blocks the caller, which may be any thread.
        """
        with self.mutex:
            self.queue.appendleft(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def put_ahead(self, item: Any) -> None:
        """Put ``item`` ahead of every data item but behind the control messages already at the
        head, at once, even when the queue is full.

        For a stream of control messages that must overtake the data queued in front of them and
        keep their own order (the events the interruption judge decides on, one after another);
        :meth:`put_first` puts each in front of the last.
        """
        with self.mutex:
            index = 0
            for queued in self.queue:
                if getattr(queued, "kind", None) is not MessageKind.CONTROL:
                    break
                index += 1
            self.queue.insert(index, item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def take_first_if(self, predicate: Callable[[Any], bool]) -> Any | None:
        """Take the item at the head of the queue if ``predicate`` is true of it, without blocking.

        For a stage that, in its own thread and in the middle of a long piece of work, looks whether
        the next message changes that work (the LLM stage generating a follow-up ahead: is the
        client's request for it next?).

        Returns:
            The item, now removed; None when the queue is empty or ``predicate`` is false of its head.
        """
        with self.mutex:
            if not self.queue or not predicate(self.queue[0]):
                return None
            item = self.queue.popleft()
            self.not_full.notify()
            return item

    def drop_where(self, predicate: Callable[[Any], bool]) -> int:
        """Remove every queued item for which ``predicate`` is true, keeping order.

        Returns:
            The number of items removed. Waiting producers are woken if space freed.
        """
        with self.mutex:
            kept = [item for item in self.queue if not predicate(item)]
            removed = len(self.queue) - len(kept)
            if removed:
                self.queue.clear()
                self.queue.extend(kept)
                self.unfinished_tasks = max(0, self.unfinished_tasks - removed)
                if self.unfinished_tasks == 0:
                    self.all_tasks_done.notify_all()
                self.not_full.notify_all()
            return removed

    def clear(self) -> int:
        """Remove all queued items. Returns how many were removed."""
        return self.drop_where(lambda _item: True)
