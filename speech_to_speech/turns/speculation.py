"""Speculative turns: work started on a short pause, held until the endpoint is confirmed.

The VAD sends a turn on after ``speculative_silence_ms`` of silence, before the
``min_silence_ms`` that confirms its endpoint. STT, LLM and TTS start at once;
what they produce is held:

* the LLM stage, after each output of an unconfirmed turn, waits until the
  endpoint is confirmed (:meth:`SpeculativeTurns.wait_after`, in its ``emit``).
  TTS can synthesise the first sentence meanwhile, and the LLM cannot finish the
  response, so it cannot commit it to history, before the turn is confirmed.
* :class:`HoldUntilConfirmed`, a stage of its own in front of the sink, keeps that
  audio back. The confirmed endpoint releases it at once: that is the latency gained.

If the user speaks on instead, the VAD supersedes the turn with a new revision
(:meth:`~speech_to_speech.core.cancel.TurnTracker.revise`): every message of the
speculative revision becomes stale at the gate, the waiting LLM wakes up, sees
it and cancels its response (rolling its history back), and the held audio is
dropped, the response's end included, so the sink never learns of it.

One :class:`~speech_to_speech.core.speculation.SpeculativeTurns` per pipeline records which
revisions are still unconfirmed; the stages wait on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.speculation import SpeculativeTurns


class HoldUntilConfirmed(BaseHandler):
    """The stage in front of the sink that keeps the audio of a pending turn back until its
    endpoint is confirmed, in its own thread.

    Audio of a speculative turn is computed but not played; confirmation lets it through at once.
    Items of a superseded revision are dropped, its
    :class:`~speech_to_speech.core.messages.EndOfResponse` too (nothing of the response reached
    the sink, so there is nothing to end there). Other stale items are dropped as at any emit;
    other response ends pass. While it waits, the TTS in front of it goes on into its queue (the
    LLM in front of that waits after each output of the turn: :meth:`SpeculativeTurns.wait_after`).

    Args:
        turns: the pipeline's speculative turns.
        *args, **kwargs: the :class:`~speech_to_speech.core.handler.BaseHandler` arguments.

    Attributes:
        held: items that had to wait for their turn's endpoint.
        dropped: items of superseded revisions dropped here.
    """

    def __init__(self, *args: Any, turns: SpeculativeTurns, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.turns = turns
        self.held = 0
        self.dropped = 0

    def process(self, item: Any) -> Iterator[Any]:
        """Wait while ``item``'s turn is pending, then pass it on unless its revision was superseded."""
        stamp = getattr(item, "stamp", None)
        if self.turns.is_pending(stamp):
            self.held += 1
            self.turns.wait(stamp, self.stop_event, self.poll_s)
        if self.turns.was_superseded(stamp):
            self.dropped += 1
            return
        yield item
