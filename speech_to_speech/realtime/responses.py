"""The output side of a session: one response's pipeline output turned into ``response.*`` events.

:class:`ResponseOutput` keeps the protocol state of each response (ids, output items, what was
sent and when it plays) and is called from the pipeline's threads: the session's event handler
(response started, tool call ready) and the client sink (audio, text, end of response). Every
output item also enters the :class:`~speech_to_speech.realtime.conversation.Conversation`
(``conversation.item.added`` when it starts, ``conversation.item.done`` when it is complete).

Order of one spoken reply, as the GA protocol sends it: ``response.created``,
``response.output_item.added``, ``conversation.item.added``, ``response.content_part.added``,
``response.output_audio.delta`` / ``response.output_audio_transcript.delta`` ...,
``response.output_audio.done``, ``response.output_audio_transcript.done``,
``response.content_part.done``, ``response.output_item.done``, ``conversation.item.done``,
``response.done`` (with usage, always). A function call is announced as soon as it exists:
``response.output_item.added``, ``conversation.item.added``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``,
``conversation.item.done``.

With a media transport (WebRTC, ``media`` given) the audio goes into the transport's
:class:`~speech_to_speech.realtime.media.OutputAudioBuffer` instead of
``response.output_audio.delta`` events; each transcript delta is sent when the audio that speaks
it leaves the server, and the end of a response (``response.output_audio.done`` … ``response.done``)
after its last audio, followed by ``output_audio_buffer.stopped`` (``cleared`` when it was cut);
``output_audio_buffer.started`` comes with its first audio.

One response is active at a time. A response that starts while another is still active (a
``response.create`` that came while the last one played out the audio it had finished generating,
a tool follow-up claimed at once) is produced at once, but its events are held and go out when the
active one's ``response.done`` has gone out: its audio follows the other's without a gap, and each
response's events stay between its ``response.created`` and its ``response.done``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import ToolCallReady
from speech_to_speech.core.messages import AudioOutput, EndOfResponse, TextOutput
from speech_to_speech.realtime.conversation import Conversation
from speech_to_speech.realtime.media import OutputAudioBuffer
from speech_to_speech.realtime.protocol import new_id, server_event
from speech_to_speech.realtime.wire import WIRE_RATE, encode_audio

Emit = Callable[..., None]
"""``emit(event, stamp=None)``: send a server event from any thread (see RealtimeSession.emit)."""


@dataclass(eq=False)
class _Response:
    """Protocol state of one response."""

    id: str
    turn_id: int
    item_id: str
    modalities: list[str]
    metadata: dict[str, str] | None = None
    started: bool = False  # message item announced
    message_index: int = 0  # the message's output_index (its slot in ``outputs`` from its announcement)
    transcript: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    spoken: list[tuple[float, str]] = field(default_factory=list)  # (audio ms, words) as sent
    audio_ms: float = 0.0
    client_cancelled: bool = False  # ended by response.cancel (else by the user speaking)
    audio_sent: bool = False  # media transport: some of its audio has left (output_audio_buffer.started)
    audio_cleared: bool = False  # media transport: output_audio_buffer.cleared was sent for it
    generated: bool = False  # its generation ended: what is left is audio playing out
    calls: int = 0  # function calls announced
    finished: bool = False  # its response.done was sent (or is held)
    #: its events, held while the response before it is active (None: they go out at once)
    held: list[tuple[dict[str, Any], Stamp | None]] | None = None

    @property
    def audio(self) -> bool:
        return self.modalities != ["text"]

    @property
    def winding_down(self) -> bool:
        """Nothing a new request should wait for is still to come: its generation ended, or it
        handed out a function call (the model's turn ends at its calls; a client that answers them
        asks for the follow-up next), or the client cancelled it."""
        return self.generated or self.calls > 0 or self.client_cancelled or self.finished


class ResponseOutput:
    """Responses of one session, from ``response.created`` to ``response.done``.

    Args:
        emit: sends a server event (optionally stamped, so it is dropped once stale).
        gate: the session's validity gate.
        conversation: the session's conversation, which every output item joins.
        on_failed: called when a response fails (the session discards its prefetch).
        media: the transport's audio buffer (WebRTC), or None: audio goes out in events.
        latency: a turn's latencies as metadata (added to ``response.done``'s ``response.metadata``).
        after_sent: runs a callable once the events emitted so far have gone out (the session runs
            it on its loop, in order with them); None: at once.
    """

    def __init__(
        self,
        emit: Emit,
        gate: Gate,
        conversation: Conversation,
        on_failed: Callable[[], None],
        media: OutputAudioBuffer | None = None,
        latency: Callable[[int], dict[str, str]] | None = None,
        after_sent: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.emit = emit
        self._after_sent = after_sent or (lambda run: run())
        self.latency = latency
        self.media = media
        self.rate = media.rate if media is not None else WIRE_RATE  # of the audio the sink hands over
        self.gate = gate
        self.conversation = conversation
        self._on_failed = on_failed
        self.lock = threading.RLock()
        self._responses: dict[int, _Response] = {}
        self._assistant_items: dict[str, _Response] = {}
        #: the response in progress, if any (until its response.done has gone out)
        self.active: _Response | None = None
        #: responses started while another was active, in order; their events are held
        self._waiting: list[_Response] = []

    def assistant_item(self, item_id: str) -> _Response | None:
        """The response whose assistant message is ``item_id`` (the newest 64 are kept)."""
        with self.lock:
            return self._assistant_items.get(item_id)

    def _send(self, of: _Response, kind: str, stamp: Stamp | None = None, /, **fields: Any) -> None:
        """Send an event of response ``of`` now, or hold it while ``of`` waits for its turn."""
        event = server_event(kind, **fields)
        with self.lock:
            if of.held is not None:
                of.held.append((event, stamp))
            else:
                self.emit(event, stamp)

    def _added(self, response: _Response, index: int, item: dict[str, Any], ref: tuple[str, Any]) -> None:
        previous = self.conversation.add(item, ref)
        self._send(response, "response.output_item.added", response_id=response.id, output_index=index, item=item)
        self._send(response, "conversation.item.added", previous_item_id=previous, item=item)

    def _done(self, response: _Response, index: int, item: dict[str, Any]) -> None:
        self.conversation.update(item["id"], **item)
        self._send(response, "response.output_item.done", response_id=response.id, output_index=index, item=item)
        self._send(response, "conversation.item.done", item=item)

    # -- from the session's event handler -----------------------------------------------------
    def start(self, turn_id: int, modalities: list[str], metadata: dict[str, str] | None = None) -> None:
        """``response.created`` for the response of turn ``turn_id`` (echoing the request's metadata);
        held, with the rest of its events, while another turn's response is active."""
        response = _Response(new_id("resp"), turn_id, new_id("item"), list(modalities), metadata)
        body = {
            "id": response.id,
            "object": "realtime.response",
            "status": "in_progress",
            "output": [],
            "output_modalities": response.modalities,
            "metadata": metadata,
        }
        with self.lock:
            previous = self._responses.get(turn_id)
            if previous is not None and previous in self._waiting:  # a new revision of its turn replaces it
                self._waiting.remove(previous)
            self._responses[turn_id] = response
            if self.active is None or self.active.turn_id == turn_id:
                self.active = response
            else:
                response.held = []
                self._waiting.append(response)
            self._send(response, "response.created", response=body)

    def generated(self, turn_id: int) -> None:
        """The generation of turn ``turn_id``'s response ended (what is left is its audio playing out)."""
        with self.lock:
            response = self._responses.get(turn_id)
            if response is not None:
                response.generated = True

    def tool_call(self, event: ToolCallReady) -> None:
        """A function call of a response exists: announce it (before the audio in front of it has played),
        after the message item when speech or text of the response came before it."""
        with self.lock:  # the sink may be announcing the message at the same time
            response = self._responses.get(event.turn_id)
            if response is not None:
                self._announce_call(response, event)

    def _announce_call(self, response: _Response, event: ToolCallReady) -> None:
        if event.after_output:
            self._announce_message(response)
        item = {
            "id": new_id("item"),
            "type": "function_call",
            "object": "realtime.item",
            "status": "completed",
            "call_id": event.call_id,
            "name": event.name,
            "arguments": event.arguments,
        }
        index = len(response.outputs)
        response.outputs.append(item)
        response.calls += 1
        self._added(response, index, {**item, "status": "in_progress", "arguments": ""}, ("call", event.call_id))
        base = {"response_id": response.id, "output_index": index, "item_id": item["id"], "call_id": event.call_id}
        self._send(response, "response.function_call_arguments.delta", **base, delta=event.arguments)
        self._send(
            response, "response.function_call_arguments.done", **base, name=event.name, arguments=event.arguments
        )
        self._done(response, index, item)

    # -- from the client sink -------------------------------------------------------------------
    def _announce_message(self, response: _Response) -> None:
        with self.lock:  # from the sink (first audio or text) or before a call (tool_call), once
            if not response.started:
                response.started = True
                self._announce_message_locked(response)

    def _announce_message_locked(self, response: _Response) -> None:
        part = {"type": "audio", "transcript": ""} if response.audio else {"type": "text", "text": ""}
        item = {
            "id": response.item_id,
            "type": "message",
            "object": "realtime.item",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        # the message takes the next output slot now; a tool call announced later, the next
        response.message_index = len(response.outputs)
        response.outputs.append(item)
        self._assistant_items[response.item_id] = response
        while len(self._assistant_items) > 64:
            self._assistant_items.pop(next(iter(self._assistant_items)))
        self._added(response, response.message_index, item, ("reply", response.turn_id))
        self._send(response, "response.content_part.added", **self._part_base(response), part=part)

    @staticmethod
    def _part_base(response: _Response) -> dict[str, Any]:
        return {
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": response.message_index,
            "content_index": 0,
        }

    def on_audio(self, item: AudioOutput, samples: np.ndarray) -> None:
        """A chunk of assistant audio is due: send it (and the words it speaks)."""
        response = self._responses.get(item.stamp.turn_id)
        if response is None:
            return
        self._announce_message(response)
        base = self._part_base(response)
        said = (len(response.transcript), len(response.spoken))  # where this chunk's words go
        if item.text:
            response.transcript.append(item.text)
            response.spoken.append((response.audio_ms, item.text))
        response.audio_ms += 1000 * len(samples) / self.rate
        if self.media is not None:  # the words are sent when their audio leaves
            stamp, text = item.stamp, item.text
            self.media.push(
                samples,
                valid=lambda: self.gate.admits(stamp),
                on_start=lambda: self._audio_leaves(response, base, text, stamp),
                on_recall=lambda unsent, started: self._audio_recalled(response, said, unsent, started),
            )
            return
        self._send(response, "response.output_audio.delta", item.stamp, **base, delta=encode_audio(samples))
        if item.text:
            self._send(response, "response.output_audio_transcript.delta", item.stamp, **base, delta=item.text)

    def text_only_turns(self) -> list[int]:
        """Turns whose response in progress has no audio output."""
        with self.lock:
            return [turn for turn, response in self._responses.items() if not response.audio]

    def recall_audio(self) -> int | None:
        """The assistant pauses: take back the audio not sent yet, if the transport can.

        Returns:
            with a media transport, how many samples (at :attr:`rate`) were taken back, the
            words in them unsaid (the sink delivers them again on resume); None over WebSocket,
            where audio events already sent play out at the client.
        """
        if self.media is None:
            return None
        return self.media.recall()

    def _audio_recalled(self, response: _Response, said: tuple[int, int], unsent: int, started: bool) -> None:
        """A chunk of ``response``'s audio was taken back: ``unsent`` samples of it, and its words
        (from ``said``, their place in the transcript and in ``spoken``) unless its first sample
        had left. Taken-back chunks are the tail, so what follows its words goes too."""
        response.audio_ms -= 1000 * unsent / self.rate
        if not started:
            del response.transcript[said[0] :]
            del response.spoken[said[1] :]

    def _audio_leaves(self, response: _Response, base: dict[str, Any], text: str, stamp: Stamp) -> None:
        """Media transport: a chunk of ``response``'s audio starts to leave (on the transport's loop)."""
        if not response.audio_sent:
            response.audio_sent = True
            self._send(response, "output_audio_buffer.started", response_id=response.id)
        if text:
            self._send(response, "response.output_audio_transcript.delta", stamp, **base, delta=text)

    def on_text_delta(self, item: TextOutput) -> None:
        """A raw text delta of a text-only reply."""
        response = self._responses.get(item.stamp.turn_id)
        if response is None:
            return
        self._announce_message(response)
        response.text.append(item.text)
        self._send(response, "response.output_text.delta", item.stamp, **self._part_base(response), delta=item.text)

    def on_response_end(self, end: EndOfResponse) -> None:
        """The response's output has played: close its items and send ``response.done``.

        With a media transport, once its last audio has left the server.
        """
        if self.media is not None:
            self.media.mark(lambda: self._end(end))
        else:
            self._end(end)

    def _end(self, end: EndOfResponse) -> None:
        with self.lock:  # one block: a response waiting behind this one is released after its response.done
            response = self._responses.pop(end.stamp.turn_id, None)
            if response is None:
                return
            response.finished = True
            self._close(response, end)
            if self.active is response:  # the next response goes out once this response.done has
                self._after_sent(lambda: self._release(response))

    def _close(self, response: _Response, end: EndOfResponse) -> None:
        status = "completed"
        if end.error == "cancelled" or end.cleanup_only or not self.gate.admits(end.stamp):
            status = "cancelled"  # also a reply fully generated, then cut while it played
        elif end.error is not None:
            status = "failed"
        if response.started:
            self._close_message(response, status)
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
            reason = "client_cancelled" if response.client_cancelled else "turn_detected"
            details = {"type": "cancelled", "reason": reason}
        body = {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": copy.deepcopy(response.outputs),
            "output_modalities": response.modalities,
            "metadata": self._done_metadata(response),
            "usage": usage,
        }
        self._send(response, "response.done", response=body)
        if response.audio_sent and not response.audio_cleared:  # media transport: its audio has all left
            kind = "cleared" if status == "cancelled" else "stopped"
            self._send(response, f"output_audio_buffer.{kind}", response_id=response.id)

    def _release(self, ended: _Response) -> None:
        """``ended``'s response.done has gone out: the responses waiting behind it go out, in order,
        until one that has not ended yet becomes the active one."""
        with self.lock:
            if self.active is not ended:
                return
            self.active = None
            while self._waiting:
                response = self._waiting.pop(0)
                held, response.held = response.held or [], None
                for event, stamp in held:
                    self.emit(event, stamp)
                if not response.finished:
                    self.active = response
                    return

    def _done_metadata(self, response: _Response) -> dict[str, str] | None:
        """The request's metadata, unchanged when it set any (a client gets back what it attached:
        the protocol's metadata is the client's, at most 16 keys); else the turn's latencies
        (``s2s_*`` keys), which is what the browser page shows."""
        if response.metadata:
            return response.metadata
        measured = self.latency(response.turn_id) if self.latency is not None else {}
        return measured or response.metadata

    def _close_message(self, response: _Response, status: str) -> None:
        base = self._part_base(response)
        if response.audio:
            transcript = "".join(response.transcript).strip()
            self._send(response, "response.output_audio.done", **base)
            self._send(response, "response.output_audio_transcript.done", **base, transcript=transcript)
            part = {"type": "audio", "transcript": transcript}
            content = {"type": "output_audio", "transcript": transcript}
        else:
            text = "".join(response.text)
            self._send(response, "response.output_text.done", **base, text=text)
            part = {"type": "text", "text": text}
            content = {"type": "output_text", "text": text}
        self._send(response, "response.content_part.done", **base, part=part)
        item = {
            "id": response.item_id,
            "type": "message",
            "object": "realtime.item",
            "role": "assistant",
            "status": "completed" if status == "completed" else "incomplete",
            "content": [content],
        }
        response.outputs[response.message_index] = item
        self._done(response, response.message_index, item)
