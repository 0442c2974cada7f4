"""Which replies are in flight: the book-keeping of the VAD, the interruption judge and the pipeline.

A reply is in flight from its LLM request until its end at the sink; once some of its audio
reached the sink it is audible. The VAD asks at each speech start (speech during a reply pauses
it, see :mod:`speech_to_speech.turns.interruptions`), the judge when it pauses and cuts; each
keeps its own copy, fed in its own thread by the pipeline's messages. The pipeline's copy, fed
by the bus, tells it on a barge-in which replies had nothing heard (they leave no text in history).
"""

from __future__ import annotations

import threading
from typing import ClassVar

from speech_to_speech.core.events import Event, EventBus, FirstAudio, ResponseDone, ResponseStarted, TurnSuperseded


class RepliesInFlight:
    """Which turns have a reply in flight, from its LLM request to its end at the sink. Thread-safe.

    Fed by the pipeline's events (:attr:`EVENTS`): :class:`ResponseStarted` opens a reply,
    :class:`FirstAudio` marks that its audio reached the sink, :class:`ResponseDone`
    closes it; :class:`TurnSuperseded` closes a speculative revision's reply (its end
    is dropped before the sink, and the next revision starts its own).

    Args:
        bus: subscribe to it (None: fed by :meth:`on_event` only, as a stage's own copy is, in its
            thread: the VAD's through ``ReplyProgress`` messages, the judge's through ``JudgeEvent``).
    """

    #: the events :meth:`on_event` tracks
    EVENTS: ClassVar[tuple[type[Event], ...]] = (ResponseStarted, FirstAudio, ResponseDone, TurnSuperseded)

    def __init__(self, bus: EventBus | None = None) -> None:
        self._lock = threading.Lock()
        self._replies: dict[int, bool] = {}  # turn id -> some of its audio reached the sink
        if bus is not None:
            bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Track one event."""
        with self._lock:
            if isinstance(event, ResponseStarted):
                self._replies.setdefault(event.turn_id, False)
            elif isinstance(event, FirstAudio):
                if event.turn_id in self._replies:
                    self._replies[event.turn_id] = True
            elif isinstance(event, (ResponseDone, TurnSuperseded)):
                self._replies.pop(event.turn_id, None)

    def turns(self, other_than: int | None = None) -> list[int]:
        """Turns with a reply in flight (except ``other_than``), oldest first."""
        with self._lock:
            return [turn for turn in self._replies if turn != other_than]

    def silent(self, other_than: set[int] | None = None) -> list[int]:
        """Turns whose reply is in flight with none of its audio at the sink yet."""
        with self._lock:
            return [turn for turn, audible in self._replies.items() if not audible and turn not in (other_than or ())]

    def audible(self) -> list[int]:
        """Turns whose reply is in flight and has audio at the sink."""
        with self._lock:
            return [turn for turn, audible in self._replies.items() if audible]
