"""What the output side tells the LLM stage, as messages: the words the user heard, the calls shown.

The history belongs to the LLM stage; what became of a reply is known downstream. The sink knows
what was heard of a cut reply (it publishes :class:`~speech_to_speech.core.events.ResponseInterrupted`);
the LM output stage knows when a tool call goes out to the client
(:class:`~speech_to_speech.core.events.ToolCallReady`). The pipeline turns each into a message put
at the head of the LLM stage's queue, and the stage applies it in its own thread:

- :class:`CutToHeard`: before the transcript of the speech that interrupted (which the interruption
  judge holds until the cut is done, see :mod:`speech_to_speech.turns.interruptions`);
- :class:`CommitToolCall`: before the client's answer to the call can arrive (it comes after the
  client saw the call, through the queues upstream of the LLM).
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


@dataclass
class CommitToolCall(StageControl):
    """The client was shown tool call ``call_id``: keep it in the LLM stage's history from now on,
    whatever becomes of the rest of its response (:meth:`BaseLLMHandler.commit_shown_call`), so
    that its output, early or late, pairs with it.

    Attributes:
        call_id: the call's id (``call_...``).
    """

    target: ClassVar[type] = BaseLLMHandler
    call_id: str

    def apply(self, stage: BaseLLMHandler) -> None:
        """Commit the call."""
        stage.commit_shown_call(self.call_id)
