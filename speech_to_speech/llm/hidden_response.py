"""The follow-up to tool results generated ahead by the LLM stage, held until a client claims it.

When a client has answered every tool call of a reply, it almost always asks for a response next.
The LLM stage starts that response at once, hidden (:class:`FollowUpAhead`, a part of
:class:`~speech_to_speech.llm.stage.BaseLLMHandler`): its events and outputs are held
(:class:`HiddenResponse`). Everything here runs in the LLM stage's thread:

- the client's ``response.create`` reaches the stage as a
  :class:`~speech_to_speech.core.messages.ResponseRequest` in its queue; the stage claims the
  follow-up for it (the held events are published, the held outputs go downstream, the rest streams
  as it is generated) or, when the request asks for another response, discards it;
- anything else that changes what the follow-up was made from (a ``session.update``, a history edit,
  the user speaking, a failed reply) reaches the stage as a :class:`DiscardFollowUp`, put ahead of
  the data in its queue. The stage looks for one between two provider events and while it waits on a
  provider that sends nothing, so the discard (its rollback of history included) is done in the
  stage's thread even while the follow-up is being generated.

The decision itself (claimed or discarded, once) is the
:class:`~speech_to_speech.llm.prefetch.ResponsePrefetchTransaction`'s.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from speech_to_speech.core.events import Event, EventBus, ResponseStarted
from speech_to_speech.core.handler import StageControl
from speech_to_speech.core.messages import EndOfResponse, ResponseRequest, Transcript
from speech_to_speech.llm.prefetch import PrefetchCoordinator


class HiddenResponse:
    """Holds a prefetched response's events and outputs until it is claimed.

    Stands in for the event bus during the hidden generation (:meth:`publish`); the stage holds its
    outputs here (:meth:`hold`) until :meth:`release`. Both lists are bounded by the response's own
    length (the model's token limit). Used in the LLM stage's thread only.

    Args:
        real_bus: the bus the events go to once the response is claimed.
    """

    def __init__(self, real_bus: EventBus) -> None:
        self.real_bus = real_bus
        self._events: list[Event] = []
        self._outputs: list[Any] = []
        self.released = False

    def publish(self, event: Event) -> None:
        """Hold ``event`` until the claim (once claimed, pass it on at once)."""
        if self.released:
            self.real_bus.publish(event)
        else:
            self._events.append(event)

    def hold(self, item: Any) -> None:
        """Keep one output of the hidden response for the claim."""
        self._outputs.append(item)

    def release(self, claimed_by: int) -> list[Any]:
        """Claimed by the response request of turn ``claimed_by``: publish the held events (its
        :class:`ResponseStarted` names that turn, so the client's request and its options find the
        response) and return the held outputs, for the stage to send downstream in order."""
        events, self._events, self.released = self._events, [], True
        for event in events:
            if isinstance(event, ResponseStarted):
                event = dataclasses.replace(event, claimed_by=claimed_by)
            self.real_bus.publish(event)
        outputs, self._outputs = self._outputs, []
        return outputs


class FollowUpAhead:
    """The LLM stage's part that generates the follow-up to tool results ahead (see the module doc).

    A base class of :class:`~speech_to_speech.llm.stage.BaseLLMHandler`, written against its
    attributes (``prefetch``, ``gate``, ``bus``, ``chat``, ``input_queue``, ``_generate``...); every
    method runs in the stage's thread.

    Attributes:
        prefetch: the session's coordinator of follow-ups generated ahead (None: none generated).
    """

    prefetch: PrefetchCoordinator | None
    _hidden: tuple[str, HiddenResponse] | None
    # BaseLLMHandler's and BaseHandler's, used here (with its _generate, build_request, latest_language)
    gate: Any
    bus: EventBus
    chat: Any
    input_queue: Any
    default_wants_audio: bool

    def discard_follow_up(self, reason: str) -> None:
        """Throw the follow-up generated ahead away, if one is open: its generation stops and its
        history is rolled back (:meth:`PrefetchCoordinator.discard_open`). ``reason`` is for logs."""
        if self.prefetch is not None:
            self.prefetch.discard_open(reason)

    def _all_calls_answered(self) -> bool:
        items = self.chat.items()
        calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
        outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
        return bool(calls) and calls <= outputs

    def _prefetch(self) -> Iterator[Any]:
        """Generate the follow-up to tool results hidden, before the client asks for it.

        Its events and outputs are held (:class:`HiddenResponse`) until the client's plain
        ``response.create`` claims it: a :class:`ResponseRequest` met at the head of this stage's
        queue between two provider events (:meth:`_between_events`) or after (``process``); the
        held output then flows at once. Any other request, or a :class:`DiscardFollowUp`, stops it
        and rolls its history back; a failed one discards itself (the client's request generates
        afresh).
        """
        assert self.prefetch is not None
        if self.input_queue is not None and not self.input_queue.empty():
            return  # more work is waiting (maybe the client's own response request)
        stamp = self.gate.new_turn_stamp()
        txn = self.prefetch.try_start(f"prefetch_{stamp.turn_id}", {})
        if txn is None:
            return
        hidden = HiddenResponse(self.bus)
        self._hidden = (txn.key, hidden)
        txn.register_abort(lambda: self.gate.turns.revise(stamp.turn_id))  # stale: generation stops
        try:
            item = Transcript(stamp, "", language=self.latest_language(), wants_audio=self.default_wants_audio)
            for out in self._generate(item, self.build_request(item), txn):
                # a failed follow-up is never claimed (the request generates afresh); a claimed one ends
                failed = isinstance(out, EndOfResponse) and out.error not in (None, "cancelled")
                if (failed and txn.discard("prefetch failed")) or txn.is_discarded:
                    break
                if hidden.released:
                    yield out
                    continue
                hidden.hold(out)
        finally:
            self.prefetch.finished(txn)

    def _between_events(self, st: Any) -> Iterator[Any]:
        """Between two provider events of the follow-up generated ahead, what is next in this
        stage's queue: a :class:`DiscardFollowUp` is applied (generation stops); a response request
        is taken and the follow-up claimed for it (the held output goes on at once, :meth:`_claim`),
        or, when it asks for another response, generation stops and it is put back at the head of
        the queue (this stage takes it next)."""
        queue = self.input_queue
        if self._discard_waiting():
            st.cancelled = True
            return
        request = queue.take_first_if(lambda m: isinstance(m, ResponseRequest)) if queue is not None else None
        if request is None:
            return
        held = self._claim(request)
        if held is None:
            queue.put_first(request)
            st.cancelled = True
            return
        yield from held

    def _discard_waiting(self) -> bool:
        """Apply a :class:`DiscardFollowUp` at the head of this stage's queue, if there is one and
        this is the stage's own thread (a provider's reader thread also asks whether to stop).

        Returns:
            True when one was applied (the follow-up generated ahead, if open, is discarded).
        """
        queue = self.input_queue
        if queue is None or threading.current_thread() is not self:
            return False
        message = queue.take_first_if(lambda m: isinstance(m, DiscardFollowUp))
        if message is None:
            return False
        message.apply(self)
        return True

    def _claim(self, request: ResponseRequest) -> list[Any] | None:
        """Claim the follow-up generated ahead for ``request`` if it is that response: a client's
        current request whose options match (:meth:`PrefetchCoordinator.take_for`, which discards
        the follow-up when they do not). Returns the held outputs to send on, or None."""
        if self.prefetch is None or self._hidden is None or request.claim_options is None:
            return None
        key, hidden = self._hidden
        txn = self.prefetch.open_transaction
        if txn is None or txn.key != key or not self.gate.admits(request.stamp):
            return None
        if self.prefetch.take_for(request.claim_options) is None:
            return None
        self._hidden = None
        return hidden.release(request.stamp.turn_id)


@dataclass
class DiscardFollowUp(StageControl):
    """Throw away the follow-up the LLM stage generated ahead, if one is open
    (:meth:`FollowUpAhead.discard_follow_up`): what it was made from changed.

    A realtime session sends it, ahead of the data in the LLM stage's queue, on a ``session.update``,
    a history edit, the user's speech or transcript, and a failed reply; the stage applies it in its
    thread, also while it is generating the follow-up (see the module doc).

    Attributes:
        reason: why, for logs (e.g. ``"session.update"``).
    """

    target: ClassVar[type] = FollowUpAhead
    reason: str

    def apply(self, stage: Any) -> None:
        """Discard the stage's follow-up generated ahead."""
        stage.discard_follow_up(self.reason)
