"""Speculative turns: work started on a short pause, held until the endpoint is confirmed.

The VAD sends a turn on after ``speculative_silence_ms`` of silence, before the
``min_silence_ms`` that confirms its endpoint. STT, LLM and TTS start at once;
what they produce is held:

* :class:`PauseUntilConfirmed` (between the LLM and its consumer) lets each
  output of an unconfirmed turn through, then keeps the LLM waiting until the
  endpoint is confirmed. TTS can synthesise the first sentence meanwhile, and
  the LLM cannot finish the response, so it cannot commit it to history, before
  the turn is confirmed.
* :class:`HoldUntilConfirmed` (in front of the sink) keeps that audio back. The
  confirmed endpoint releases it at once: that is the latency gained.

If the user speaks on instead, the VAD supersedes the turn with a new revision
(:meth:`~speech_to_speech.core.cancel.TurnTracker.revise`): every message of the
speculative revision becomes stale at the gate, the waiting LLM wakes up, sees
it and cancels its response (rolling its history back), and the held audio is
dropped, the response's end included, so the sink never learns of it.

One :class:`SpeculativeTurns` per pipeline records which revisions are still
unconfirmed; stages and queues wait on it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from speech_to_speech.core.cancel import Gate, MessageKind, Stamp
from speech_to_speech.core.queues import DEFAULT_MAXSIZE, StageQueue

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


class PauseUntilConfirmed(StageQueue):
    """A stage queue whose producer, after putting an item of a pending turn, waits for its endpoint.

    Put between the LLM and the next stage: the first sentence of a speculative
    reply goes on to TTS at once, but the LLM cannot finish (and so cannot write
    the reply to history) before the turn is confirmed or superseded.

    Args:
        turns: the pipeline's speculative turns.
        maxsize: capacity in items.
    """

    def __init__(self, turns: SpeculativeTurns, maxsize: int = DEFAULT_MAXSIZE) -> None:
        super().__init__(maxsize)
        self.turns = turns

    def put_unless_stopped(self, item: Any, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Enqueue ``item`` (with backpressure); then, if its turn is pending, wait for the endpoint."""
        if not super().put_unless_stopped(item, stop, poll_s):
            return False
        stamp = getattr(item, "stamp", None)
        if getattr(item, "kind", MessageKind.DATA) is MessageKind.DATA and self.turns.is_pending(stamp):
            self.turns.wait(stamp, stop, poll_s)
        return True


class HoldUntilConfirmed(StageQueue):
    """A stage queue that keeps the items of a pending turn out until its endpoint is confirmed.

    Put in front of the sink: audio of a speculative turn is computed but not
    played; confirmation lets it in at once. Items of a superseded revision are
    dropped, its :class:`~speech_to_speech.core.messages.EndOfResponse` too (nothing of
    the response reached the sink, so there is nothing to end there). Other stale
    items are dropped as at any emit; other response ends pass.

    The producer (TTS) waits while holding, which is backpressure enough: the
    LLM in front of it is paused by :class:`PauseUntilConfirmed` as well.

    Args:
        turns: the pipeline's speculative turns.
        maxsize: capacity in items.

    Attributes:
        held: items that had to wait for their turn's endpoint.
        dropped: items of superseded revisions dropped here.
    """

    def __init__(self, turns: SpeculativeTurns, maxsize: int = DEFAULT_MAXSIZE) -> None:
        super().__init__(maxsize)
        self.turns = turns
        self.held = 0
        self.dropped = 0

    def put_unless_stopped(self, item: Any, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Wait while ``item``'s turn is pending, then enqueue it unless it is stale.

        Returns:
            True if the item was enqueued; False if it was dropped or ``stop`` was set.
        """
        stamp = getattr(item, "stamp", None)
        if self.turns.is_pending(stamp):
            self.held += 1
            self.turns.wait(stamp, stop, poll_s)
        if self.turns.was_superseded(stamp):
            self.dropped += 1
            return False
        if stop.is_set() or self.turns.gate.drops(item):
            return False
        return super().put_unless_stopped(item, stop, poll_s)
