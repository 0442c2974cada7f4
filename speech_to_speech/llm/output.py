"""The LMOutputProcessor: the ordered hand-off from the LLM to TTS, with a side channel for tools."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from speech_to_speech.core.events import FirstChunk, ToolCallReady
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import EndOfResponse, TextOutput, ToolCallRequest, TTSInput

#: turns remembered as having had speech or text (a response's output passes in order; older ones go)
MAX_TURNS_KEPT = 64


class LMOutputProcessor(BaseHandler):
    """Sits between the LLM and TTS and keeps text, tool calls and speech in one ordered queue.

    * Every output part (speakable text, raw text, tool call) goes on, in order,
      to the TTS queue, so the client hears and sees them in the order the model
      produced them.
    * A tool call is also published at once as
      :class:`~speech_to_speech.core.events.ToolCallReady` (the side channel), so a
      client can start running it before the audio in front of it has played. It says whether
      speech or text of its response went before it (``after_output``), so that the client is
      shown the message item before the call, in the order the model produced them.
    * The first text of each response revision that goes to TTS is published as
      :class:`~speech_to_speech.core.events.FirstChunk` (a point of the latency waterfall).
    * A stale turn gets no output, but its :class:`EndOfResponse` still goes on
      (marked ``cleanup_only``), so no response is ever left open downstream.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._with_output: dict[int, None] = {}  # turn ids whose response had speech or text so far (ordered)
        self._spoken: dict[tuple[int, int], None] = {}  # (turn id, revision) whose first chunk went to TTS

    def process(self, item: Any) -> Iterator[Any]:
        stamp = getattr(item, "stamp", None)
        if isinstance(item, EndOfResponse):
            if stamp is not None:
                self._with_output.pop(stamp.turn_id, None)
                if not self.gate.admits(stamp):
                    item.cleanup_only = True
            yield item
            return
        if stamp is not None and not self.gate.admits(stamp):
            return
        if isinstance(item, (TTSInput, TextOutput)):
            self._with_output[item.stamp.turn_id] = None
            while len(self._with_output) > MAX_TURNS_KEPT:
                self._with_output.pop(next(iter(self._with_output)))
        if isinstance(item, TTSInput) and (key := (item.stamp.turn_id, item.stamp.revision)) not in self._spoken:
            self._spoken[key] = None
            while len(self._spoken) > MAX_TURNS_KEPT:
                self._spoken.pop(next(iter(self._spoken)))
            self.bus.publish(FirstChunk(key[0], revision=key[1], text=item.text))
        elif isinstance(item, ToolCallRequest):
            turn, said = item.stamp.turn_id, item.stamp.turn_id in self._with_output
            self.bus.publish(
                ToolCallReady(turn, call_id=item.call_id, name=item.name, arguments=item.arguments, after_output=said)
            )
        yield item
