"""Cutting a reply in history to what the user heard, as a message to the LLM stage.

The sink knows what was heard (it publishes :class:`~speech_to_speech.core.events.ResponseInterrupted`);
the history belongs to the LLM stage. :class:`CutToHeard` carries the words from one to the other:
the pipeline puts it at the head of the LLM stage's queue, and the stage applies it in its own
thread, before the transcript of the speech that interrupted (which the interruption judge holds
until the cut is done, see :mod:`speech_to_speech.turns.interruptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from speech_to_speech.core.events import ReplyCut
from speech_to_speech.core.handler import StageControl
from speech_to_speech.llm.stage import BaseLLMHandler


@dataclass
class CutToHeard(StageControl):
    """Cut the reply to turn ``turn_id`` to ``heard`` in the LLM stage's history, then publish
    :class:`~speech_to_speech.core.events.ReplyCut`.

    Attributes:
        turn_id: the user turn whose reply was interrupted (or truncated by a client).
        heard: the words the user heard ("" when nothing was: the reply leaves no text).
        revision: the turn's revision the reply answered (None: whichever reply the turn has).
    """

    target: ClassVar[type] = BaseLLMHandler
    turn_id: int
    heard: str
    revision: int | None = None

    def apply(self, stage: BaseLLMHandler) -> None:
        """Cut the history (see :meth:`BaseLLMHandler.apply_heard_text`) and report it."""
        stage.apply_heard_text(self.turn_id, self.heard, self.revision)
        stage.bus.publish(ReplyCut(self.turn_id, heard_text=self.heard))
