"""Speculative turns: which turn revisions were sent on before their endpoint, and wait for it.

The book-keeping shared by the stages that act on a speculative turn (the VAD opens, confirms
or discards a revision; the STT, the LLM and the hold in front of the sink wait on it). The
design is :mod:`speech_to_speech.turns.speculation`'s.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from speech_to_speech.core.cancel import Gate, MessageKind, Stamp

#: how many superseded revisions are remembered (their late response ends are dropped)
SUPERSEDED_KEPT = 64

_Key = tuple[int, int]


def _key(stamp: Stamp) -> _Key:
    return (stamp.turn_id, stamp.revision)


class SpeculativeTurns:
    """The turn revisions sent on speculatively and not yet confirmed. Thread-safe.

    A revision is *pending* from :meth:`open` until :meth:`confirm` or
    :meth:`discard`. Revisions never opened are not speculative: nothing waits for them.

    Args:
        gate: the pipeline's gate; waits also end when a stamp turns stale.
    """

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._changed = threading.Condition()
        self._pending: dict[_Key, list[Callable[[], None]]] = {}
        self._superseded: collections.OrderedDict[_Key, None] = collections.OrderedDict()

    def open(self, stamp: Stamp) -> None:
        """``stamp``'s revision was sent on before its endpoint: hold its output."""
        with self._changed:
            self._pending.setdefault(_key(stamp), [])

    def confirm(self, stamp: Stamp) -> None:
        """The endpoint followed: run the revision's :meth:`when_confirmed` callbacks, in the order
        they were added, then release its output (so what a callback announces, such as a
        transcript or a response's start, comes before the output it held)."""
        key = _key(stamp)
        while True:
            with self._changed:
                callbacks = self._pending.get(key)
                if not callbacks:
                    self._pending.pop(key, None)
                    self._changed.notify_all()
                    return
                callback = callbacks.pop(0)
            callback()

    def discard(self, stamp: Stamp) -> None:
        """The user spoke on: the revision will never be confirmed (its callbacks are dropped)."""
        with self._changed:
            self._pending.pop(_key(stamp), None)
            self._superseded[_key(stamp)] = None
            while len(self._superseded) > SUPERSEDED_KEPT:
                self._superseded.popitem(last=False)
            self._changed.notify_all()

    def is_pending(self, stamp: Stamp | None) -> bool:
        """True while ``stamp``'s revision awaits its endpoint (and is still valid at the gate)."""
        if stamp is None:
            return False
        with self._changed:
            pending = _key(stamp) in self._pending
        return pending and self.gate.admits(stamp)

    def was_superseded(self, stamp: Stamp | None) -> bool:
        """True when ``stamp``'s revision was sent on speculatively and then superseded."""
        if stamp is None:
            return False
        with self._changed:
            return _key(stamp) in self._superseded

    def when_confirmed(self, stamp: Stamp, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``stamp``'s revision is confirmed: now if it is not pending,
        never if it is superseded (or turns stale)."""
        with self._changed:
            callbacks = self._pending.get(_key(stamp))
            if callbacks is not None:
                callbacks.append(callback)
                return
            if _key(stamp) in self._superseded:
                return
        if self.gate.admits(stamp):
            callback()

    def when_revision_confirmed(self, turn_id: int, revision: int, callback: Callable[[], None]) -> None:
        """Like :meth:`when_confirmed`, for revision ``revision`` of turn ``turn_id``: later if it is
        pending, never if it was superseded, now otherwise."""
        key = (turn_id, revision)
        with self._changed:
            callbacks = self._pending.get(key)
            if callbacks is not None:
                callbacks.append(callback)
                return
            if key in self._superseded:
                return
        callback()

    def wait_after(self, item: Any, stop: threading.Event, poll_s: float = 0.1) -> None:
        """After ``item`` was sent on, block while its turn is pending (:meth:`wait`), if it is data
        (a stage's output of the turn; control messages and response ends never wait)."""
        stamp = getattr(item, "stamp", None)
        if getattr(item, "kind", MessageKind.DATA) is MessageKind.DATA and self.is_pending(stamp):
            self.wait(stamp, stop, poll_s)

    def wait(self, stamp: Stamp, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Block while ``stamp`` is pending.

        Wakes at once on :meth:`confirm` or :meth:`discard`; a stamp that turns stale
        otherwise (a cancel) or ``stop`` are noticed within ``poll_s`` seconds.

        Returns:
            True if the revision may go on (confirmed, or never speculative); False if it
            was superseded or turned stale, or on stop.
        """
        with self._changed:
            while _key(stamp) in self._pending and not stop.is_set() and self.gate.admits(stamp):
                self._changed.wait(poll_s)
        return not stop.is_set() and self.gate.admits(stamp) and not self.was_superseded(stamp)
