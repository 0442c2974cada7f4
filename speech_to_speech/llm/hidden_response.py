"""A prefetched (hidden) response of the LLM stage, held until a client claims it.

The follow-up to tool results is generated ahead, in the LLM stage's thread, before the client asks
for it. Its events and outputs are held here; the client's ``response.create`` reaches the stage as a
:class:`~speech_to_speech.core.messages.ResponseRequest` in its queue, and the stage, in its own
thread, either claims this response (:meth:`HiddenResponse.release`: the held events are published,
the held outputs go downstream, and the rest streams as it is generated) or discards it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from speech_to_speech.core.events import Event, EventBus, ResponseStarted


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
