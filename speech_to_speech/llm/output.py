"""The LMOutputProcessor: the ordered hand-off from the LLM to TTS, with a side channel for tools."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from speech_to_speech.core.events import ToolCallReady
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import EndOfResponse, ToolCallRequest


class LMOutputProcessor(BaseHandler):
    """Sits between the LLM and TTS and keeps text, tool calls and speech in one ordered queue.

    * Every output part (speakable text, raw text, tool call) goes on, in order,
      to the TTS queue, so the client hears and sees them in the order the model
      produced them.
    * A tool call is also published at once as
      :class:`~speech_to_speech.core.events.ToolCallReady` (the side channel), so a
      client can start running it before the audio in front of it has played.
    * A stale turn gets no output, but its :class:`EndOfResponse` still goes on
      (marked ``cleanup_only``), so no response is ever left open downstream.
    """

    def process(self, item: Any) -> Iterator[Any]:
        stamp = getattr(item, "stamp", None)
        if isinstance(item, EndOfResponse):
            if stamp is not None and not self.gate.admits(stamp):
                item.cleanup_only = True
            yield item
            return
        if stamp is not None and not self.gate.admits(stamp):
            return
        if isinstance(item, ToolCallRequest):
            self.bus.publish(
                ToolCallReady(item.stamp.turn_id, call_id=item.call_id, name=item.name, arguments=item.arguments)
            )
        yield item
