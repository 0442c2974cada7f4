"""The output side of a session: one response's pipeline output turned into ``response.*`` events.

:class:`ResponseOutput` keeps the protocol state of each response (ids, output items, what was
sent and when it plays) and is called from the pipeline's threads: the session's event handler
(response started, tool call ready) and the client sink (audio, text, end of response).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speech_to_speech.cancel import Gate
from speech_to_speech.events import ToolCallReady
from speech_to_speech.messages import AudioOutput, EndOfResponse, TextOutput
from speech_to_speech.realtime.protocol import new_id
from speech_to_speech.realtime.wire import WIRE_RATE, encode_audio

Emit = Callable[..., None]
"""``emit(event, stamp=None)``: send a server event from any thread (see RealtimeSession.emit)."""


@dataclass
class _Response:
    """Protocol state of one response."""

    id: str
    turn_id: int
    item_id: str
    modalities: list[str]
    started: bool = False  # output item announced
    message_index: int = 0  # the message's output_index (its slot in ``outputs`` from its announcement)
    transcript: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    spoken: list[tuple[float, str]] = field(default_factory=list)  # (audio ms, words) as sent
    audio_ms: float = 0.0
    client_cancelled: bool = False  # ended by response.cancel (else by the user speaking)


class ResponseOutput:
    """Responses of one session, from ``response.created`` to ``response.done``.

    Args:
        emit: sends a server event (optionally stamped, so it is dropped once stale).
        gate: the session's validity gate.
        on_failed: called when a response fails (the session discards its prefetch).
    """

    def __init__(self, emit: Emit, gate: Gate, on_failed: Callable[[], None]) -> None:
        self.emit = emit
        self.gate = gate
        self._on_failed = on_failed
        self.lock = threading.RLock()
        self._responses: dict[int, _Response] = {}
        self._assistant_items: dict[str, _Response] = {}
        #: the response in progress, if any
        self.active: _Response | None = None

    def assistant_item(self, item_id: str) -> _Response | None:
        """The response whose assistant message is ``item_id`` (the newest 64 are kept)."""
        with self.lock:
            return self._assistant_items.get(item_id)

    def start(self, turn_id: int, modalities: list[str]) -> None:
        with self.lock:
            response = _Response(new_id("resp"), turn_id, new_id("item"), list(modalities))
            self._responses[turn_id] = response
            self.active = response
        self.emit(
            {
                "type": "response.created",
                "response": {
                    "id": response.id,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "output": [],
                    "output_modalities": modalities,
                },
            }
        )

    def _announce_message(self, response: _Response) -> None:
        if response.started:
            return
        response.started = True
        audio = response.modalities != ["text"]
        part = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        item = {"id": response.item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        with self.lock:  # the message takes the next output slot now; a tool call announced later, the next
            response.message_index = len(response.outputs)
            response.outputs.append(item)
        base = {"response_id": response.id, "output_index": response.message_index}
        self.emit({"type": "response.output_item.added", **base, "item": item})
        self.emit(
            {
                "type": "response.content_part.added",
                **base,
                "item_id": response.item_id,
                "content_index": 0,
                "part": part,
            }
        )
        with self.lock:
            self._assistant_items[response.item_id] = response
            while len(self._assistant_items) > 64:
                self._assistant_items.pop(next(iter(self._assistant_items)))

    def tool_call(self, event: ToolCallReady) -> None:
        with self.lock:
            response = self._responses.get(event.turn_id)
        if response is None:
            return
        item = {
            "id": new_id("item"),
            "type": "function_call",
            "status": "completed",
            "call_id": event.call_id,
            "name": event.name,
            "arguments": event.arguments,
        }
        with self.lock:  # the sink may be announcing the message at the same time
            base = {"response_id": response.id, "output_index": len(response.outputs)}
            response.outputs.append(item)
        self.emit(
            {"type": "response.output_item.added", **base, "item": {**item, "status": "in_progress", "arguments": ""}}
        )
        self.emit(
            {
                "type": "response.function_call_arguments.done",
                **base,
                "item_id": item["id"],
                "call_id": event.call_id,
                "name": event.name,
                "arguments": event.arguments,
            }
        )
        self.emit({"type": "response.output_item.done", **base, "item": item})

    def on_audio(self, item: AudioOutput, samples: np.ndarray) -> None:
        """A chunk of assistant audio is due: send it (and the words it speaks)."""
        response = self._responses.get(item.stamp.turn_id)
        if response is None:
            return
        self._announce_message(response)
        base = {
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": response.message_index,
            "content_index": 0,
        }
        self.emit(
            {
                "type": "response.output_audio.delta",
                **base,
                "delta": encode_audio(samples),
            },
            item.stamp,
        )
        if item.text:
            response.transcript.append(item.text)
            response.spoken.append((response.audio_ms, item.text))
            self.emit({"type": "response.output_audio_transcript.delta", **base, "delta": item.text}, item.stamp)
        response.audio_ms += 1000 * len(samples) / WIRE_RATE

    def on_text_delta(self, item: TextOutput) -> None:
        """A raw text delta of a text-only reply."""
        response = self._responses.get(item.stamp.turn_id)
        if response is None:
            return
        self._announce_message(response)
        response.text.append(item.text)
        base = {
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": response.message_index,
            "content_index": 0,
        }
        self.emit({"type": "response.output_text.delta", **base, "delta": item.text}, item.stamp)

    def on_response_end(self, end: EndOfResponse) -> None:
        """The response's output has played: close its items and send ``response.done``."""
        with self.lock:
            response = self._responses.pop(end.stamp.turn_id, None)
            if response is not None and self.active is response:
                self.active = None
        if response is None:
            return
        status = "completed"
        if end.error == "cancelled" or end.cleanup_only or not self.gate.admits(end.stamp):
            status = "cancelled"  # also a reply fully generated, then cut while it played
        elif end.error is not None:
            status = "failed"
        base = {"response_id": response.id, "output_index": response.message_index}
        if response.started:
            audio = response.modalities != ["text"]
            if audio:
                transcript = "".join(response.transcript).strip()
                self.emit(
                    {"type": "response.output_audio.done", **base, "item_id": response.item_id, "content_index": 0}
                )
                self.emit(
                    {
                        "type": "response.output_audio_transcript.done",
                        **base,
                        "item_id": response.item_id,
                        "content_index": 0,
                        "transcript": transcript,
                    }
                )
                part = {"type": "audio", "transcript": transcript}
            else:
                text = "".join(response.text)
                self.emit(
                    {
                        "type": "response.output_text.done",
                        **base,
                        "item_id": response.item_id,
                        "content_index": 0,
                        "text": text,
                    }
                )
                part = {"type": "text", "text": text}
            item = {
                "id": response.item_id,
                "type": "message",
                "role": "assistant",
                "status": "completed" if status == "completed" else "incomplete",
                "content": [{**part, "type": "output_audio" if audio else "output_text"}],
            }
            self.emit(
                {
                    "type": "response.content_part.done",
                    **base,
                    "item_id": response.item_id,
                    "content_index": 0,
                    "part": part,
                }
            )
            self.emit({"type": "response.output_item.done", **base, "item": item})
            response.outputs[response.message_index] = item
        usage = {
            "input_tokens": end.usage.get("input_tokens", 0),
            "output_tokens": end.usage.get("output_tokens", 0),
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        details = None
        if status == "failed":
            self._on_failed()
            details = {"type": "failed", "error": {"type": "server_error", "message": end.error}}
        elif status == "cancelled":
            details = {
                "type": "cancelled",
                "reason": "client_cancelled" if response.client_cancelled else "turn_detected",
            }
        self.emit(
            {
                "type": "response.done",
                "response": {
                    "id": response.id,
                    "object": "realtime.response",
                    "status": status,
                    "status_details": details,
                    "output": response.outputs,
                    "output_modalities": response.modalities,
                    "usage": usage,
                },
            }
        )
