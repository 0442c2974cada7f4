"""The interruption judge's stage for tests, driven in the test's own thread (shared by
``tests/test_interruptions.py`` and ``tests/test_echo.py``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import Event, EventBus, ResponseStarted
from speech_to_speech.core.messages import Transcript
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.turns.interruptions import Interruptions, TurnJudge


@dataclass
class JudgeRig:
    """A :class:`TurnJudge` with a reply in flight (turn :attr:`reply`), its bus and what was published.

    Events published on :attr:`bus` reach the judge at once, in the publisher's thread (the
    pipeline queues them for the stage's own thread instead); transcripts go through
    :meth:`transcript`; the clock through :meth:`TurnJudge.tick`.
    """

    bus: EventBus
    gate: Gate
    judge: TurnJudge
    events: list[Event]
    reply: int

    @classmethod
    def build(cls, resume_within_ms: int = 60_000, hears_voice: bool = False) -> JudgeRig:
        """A rig whose judge gives a verdict within ``resume_within_ms``."""
        bus, gate, events = EventBus(), Gate(), []
        bus.subscribe(events.append)
        interruptions = Interruptions(bus, resume_within_ms, hears_voice=hears_voice)
        judge = TurnJudge(
            stop_event=threading.Event(),
            input_queue=None,
            output_queue=StageQueue(8),
            gate=gate,
            bus=bus,
            interruptions=interruptions,
        )
        bus.subscribe(lambda event: judge.on_event(event) if isinstance(event, Interruptions.EVENTS) else None)
        reply = gate.new_turn_stamp().turn_id
        bus.publish(ResponseStarted(reply))
        return cls(bus, gate, judge, events, reply)

    @property
    def interruptions(self) -> Interruptions:
        """The judge's decisions."""
        return self.judge.interruptions

    def of(self, kind: type[Event]) -> list[Any]:
        """The events of type ``kind`` published so far."""
        return [e for e in list(self.events) if isinstance(e, kind)]

    def transcript(self, turn_id: int, text: str) -> bool:
        """The STT's transcript of ``turn_id`` reaches the judge: True if it goes on to the LLM
        (now, or once the replies it interrupted are cut), False if it is dropped."""
        passed = list(self.judge.process(Transcript(self.gate.stamp(turn_id), text, "en")))
        return bool(passed) or bool(self.judge._held)
