"""One client of the realtime server: its state, and the handlers of the client events.

The session speaks the OpenAI Realtime protocol (GA event names). Client events arrive parsed
into the openai SDK's own types (:func:`~speech_to_speech.realtime.protocol.parse_client_event`)
and :data:`HANDLERS` maps each of the 11 client event types to its handler. Stages run in
threads as in local mode; protocol events produced in those threads reach the asyncio side
through :meth:`RealtimeSession.emit`, which hands them over with ``loop.call_soon_threadsafe``
(no polling). Changes to running stages travel as messages (:mod:`.controls`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from openai.types.realtime import (
    ConversationItemCreateEvent,
    ConversationItemDeleteEvent,
    ConversationItemRetrieveEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferAppendEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    SessionUpdateEvent,
)

from speech_to_speech.core.audio import RateConverter
from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import (
    AssistantText,
    BargeIn,
    Event,
    EventBus,
    ReplyResumed,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    StageError,
    ToolCallReady,
    UserTranscript,
    UserTranscriptDelta,
)
from speech_to_speech.core.messages import AudioChunk, FunctionOutput, ResponseRequest, SpeechSegment
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.hidden_response import DiscardFollowUp
from speech_to_speech.llm.stage import BaseLLMHandler
from speech_to_speech.llm.upstream import CutToHeard
from speech_to_speech.pipeline.builder import SESSION, SESSION_QUEUE_SIZES, Ends, Shared, build
from speech_to_speech.pipeline.console import MetricsCollector, latency_metadata
from speech_to_speech.realtime.config import SessionConfig, apply_update, check_modalities
from speech_to_speech.realtime.controls import HistoryDelete, HistoryInsert, update_controls
from speech_to_speech.realtime.conversation import ROOT, Conversation, to_history
from speech_to_speech.realtime.image_items import ImageChecks, image_indices, refuse_images
from speech_to_speech.realtime.media import OutputAudioBuffer
from speech_to_speech.realtime.protocol import (
    ProtocolError,
    check_tools,
    error_event,
    new_id,
    parse_client_event,
    protocol_error_event,
    server_event,
)
from speech_to_speech.realtime.responses import ResponseOutput
from speech_to_speech.realtime.sink import ClientSink
from speech_to_speech.realtime.wire import WIRE_RATE, decode_audio
from speech_to_speech.turns.vad import SAMPLE_RATE, BaseVADHandler

logger = logging.getLogger(__name__)

#: response.create fields this server does not act on (reported; the response is still made)
_IGNORED_RESPONSE_FIELDS = ("prompt", "reasoning", "parallel_tool_calls")


@dataclass
class SessionLimits:
    """Bounds that protect the server from one client.

    Attributes:
        max_buffer_s: longest audio kept in the input buffer (manual turn detection), s.
    """

    max_buffer_s: float = 120.0


class RealtimeSession:
    """State and pipeline of one connected client.

    Args:
        args: the server's parsed command line (backends and their settings).
        loop: the asyncio loop that owns the connection.
        send: coroutine-free callback run on the loop for each outbound event dict.
        limits: per-session bounds.
        media: where the assistant's audio goes when the transport carries audio itself (WebRTC);
            None: it goes out as ``response.output_audio.delta`` events (WebSocket). The session
            is the same either way; the transport feeds the client's audio to :meth:`feed_audio`.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[dict[str, Any]], None],
        limits: SessionLimits | None = None,
        media: OutputAudioBuffer | None = None,
    ) -> None:
        self.id = new_id("sess")
        self.media = media
        self.args = args
        self.loop = loop
        self._loop_thread = threading.get_ident()  # sessions are created on the loop's thread
        self._send = send
        self.limits = limits or SessionLimits()
        self.lock = threading.RLock()
        self.config = SessionConfig.from_args(args)
        self.conversation = Conversation()
        self._resampler = RateConverter(SAMPLE_RATE)
        self.images = ImageChecks()  # the next message's images, checked ahead off the loop
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._offset = 0
        self._user_items: dict[int, str] = {}
        self._input_audio_s: dict[int, float] = {}  # per turn: seconds of audio sent to STT
        self._requested: dict[int, tuple[list[str], dict[str, str] | None]] = {}  # turn -> modalities, metadata
        #: events of user speech that paused a reply, per turn, held until its words decide
        self._held: dict[int, list[Event]] = {}
        #: turns that resumed the reply: their events that come after the verdict (the VAD's endpoint
        #: of a turn whose transcript was judged ahead of it) are not reported either
        self._not_reported: collections.deque[int] = collections.deque(maxlen=16)
        self._build()

    # -- pipeline -----------------------------------------------------------------------
    def _build(self) -> None:
        """The session's pipeline: :func:`~speech_to_speech.pipeline.builder.build` (the builder of local
        mode too) with the session's ends, no source stage (the client's audio and requests go on
        :attr:`inputs`) and the client's sink (:class:`ClientSink`), and the features of
        :data:`~speech_to_speech.pipeline.builder.SESSION`."""

        def make_sink(queue: StageQueue, shared: Shared) -> ClientSink:
            on_failed = lambda: self._discard_prefetch("response failed")  # noqa: E731
            latency = lambda turn_id: latency_metadata(self.metrics.metrics_of(turn_id))  # noqa: E731
            self.output = ResponseOutput(
                self.emit, shared.gate, self.conversation, on_failed, self.media, latency, after_sent=self.on_loop
            )
            rate = self.media.rate if self.media is not None else WIRE_RATE  # the sink resamples the TTS once, to it
            name = f"{self.id}:sink"
            return ClientSink(input_queue=queue, target=self.output, sample_rate=rate, name=name, **shared.kwargs)

        # The user's speech is reported to the client before the pipeline acts on it: subscribed
        # after the pipeline, a barge-in's cancelled response.done (sent by the sink's thread once
        # the pipeline cut the reply) could go out before the speech_started it releases, and
        # clients truncate the reply on speech_started. The response's events are reported after
        # the stages have acted (a tool call is in history before the client hears of it).
        self.bus = EventBus()
        self.bus.subscribe(self._on_speech_event)
        self.metrics = MetricsCollector(self.bus, keep_last=8)  # each response.done carries its turn's latencies
        playback = self.media.reference if self.media is not None else None  # WebRTC: the echo gate's reference
        ends = Ends(make_sink, source=None, queue_sizes=SESSION_QUEUE_SIZES, thread_prefix=self.id, playback=playback)
        self.pipeline = build(self.args, ends, SESSION, bus=self.bus)
        self.gate, self.stop_event = self.pipeline.gate, self.pipeline.stop_event
        #: where the client's audio and requests enter: ``"audio"`` (the VAD's queue), ``"typed"`` (the STT's)
        self.inputs = self.pipeline.inputs
        self.vad = self.pipeline.stage("vad", BaseVADHandler)
        self.llm = self.pipeline.stage("llm", BaseLLMHandler)
        self.sink = self.pipeline.stage("sink", ClientSink)
        self.bus.subscribe(self._on_response_event)

    def start(self, stop: threading.Event | None = None) -> None:
        """Start every stage and wait until they are ready (models are shared, so this is quick).

        Args:
            stop: when set while stages load, the session is closed and start gives up.

        Raises:
            RuntimeError: if a stage fails to set up, or ``stop`` was set first.
        """
        self.pipeline.start(cancel=stop)
        self.emit(server_event("session.created", session=self.session_object()))

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop every stage of this session and join its threads."""
        self.pipeline.stop(timeout_s)

    def emit(self, event: dict[str, Any], stamp: Stamp | None = None) -> None:
        """Send ``event`` to the client from any thread.

        Events with a ``stamp`` are checked against the gate again just before
        they are written to the socket, so nothing of a cancelled reply leaves
        after the cancel.
        """
        event.setdefault("event_id", new_id("event"))
        self.on_loop(lambda: self._send_gated((event, stamp)))

    def on_loop(self, run: Callable[[], None]) -> None:
        """Call ``run`` on the loop: now when called there, else after what was handed over before."""
        if threading.get_ident() == self._loop_thread:
            run()
        else:
            with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is gone, the client left
                self.loop.call_soon_threadsafe(run)

    def _send_gated(self, gated: tuple[dict[str, Any], Stamp | None]) -> None:
        event, stamp = gated
        if stamp is not None and not self.gate.admits(stamp):
            return
        self._send(event)

    def handle(self, raw: str | bytes) -> None:
        """Apply one client message; bad input gets an ``error`` event (echoing its ``event_id``)."""
        event_id = None
        try:
            if isinstance(raw, bytes):
                raise ProtocolError("invalid_event", "binary frames are not supported; send JSON text")
            event = parse_client_event(raw)
            event_id = event.event_id  # type: ignore[attr-defined]
            HANDLERS[event.type](self, event)  # type: ignore[attr-defined]
        except ProtocolError as exc:
            exc.event_id = exc.event_id or event_id
            self.emit(protocol_error_event(exc))
        except Exception as exc:  # a bug must not end the session
            logger.exception("session %s: event handling failed", self.id)
            self.emit(error_event("server_error", f"{type(exc).__name__}: {exc}", event_id, kind="server_error"))

    # -- session configuration ----------------------------------------------------------
    def session_object(self) -> dict[str, Any]:
        """The session as the protocol describes it."""
        return self.config.session_object(self.id, self.args.llm_backend)

    def update_session(self, event: SessionUpdateEvent) -> None:
        """``session.update``: a field the server does not support gets an error; the rest applies."""
        if event.session.type != "realtime":
            raise ProtocolError("unsupported_parameter", "only realtime sessions are supported", param="session.type")
        config, problems = apply_update(self.config, event.session, self.args)
        for problem in problems:
            problem.event_id = event.event_id
            self.emit(protocol_error_event(problem))
        self._discard_prefetch("session.update")
        with self.lock:
            old, self.config = self.config, config
        to_vad, llm_settings = update_controls(old, config, self.args)
        for control in to_vad:
            self._to_vad(control)  # passes the VAD (to the STT too), in order with the audio
        self._enqueue(llm_settings)
        self.emit(server_event("session.updated", session=self.session_object()))

    # -- input audio ------------------------------------------------------------------------
    def append_audio(self, event: InputAudioBufferAppendEvent) -> None:
        """``input_audio_buffer.append``: base64 pcm16 at 24 kHz."""
        self.feed_audio(decode_audio(event.audio), WIRE_RATE)

    def feed_audio(self, samples: np.ndarray, rate: int) -> None:
        """The client's audio, float32 mono at ``rate`` Hz (appended events, or a WebRTC track's
        48 kHz frames), resampled once to the pipeline's rate."""
        samples = self._resampler.process(samples, rate)
        if self.config.turn_detection is None:
            if (self._buffered + len(samples)) / SAMPLE_RATE > self.limits.max_buffer_s:
                raise ProtocolError(
                    "input_audio_buffer_full", f"the input buffer holds at most {self.limits.max_buffer_s:g} s"
                )
            self._buffer.append(samples)
            self._buffered += len(samples)
            return
        self._to_vad(AudioChunk(samples, SAMPLE_RATE, time.monotonic(), self._offset))
        self._offset += len(samples)

    def _to_vad(self, item: Any) -> None:
        try:
            self.inputs["audio"].put_nowait(item)
        except queue.Full:
            raise ProtocolError("input_audio_overflow", "the server is behind; audio was dropped") from None

    def commit_audio(self, event: Any = None) -> None:
        """``input_audio_buffer.commit``: the buffered audio becomes a user turn."""
        if self.config.turn_detection is not None:
            # the server's VAD commits each turn itself; nothing waits in a buffer to be committed
            message = "with turn detection on, the server commits the audio itself (commit is for turn_detection null)"
            raise ProtocolError("input_audio_buffer_commit_empty", message)
        if not self._buffered:
            raise ProtocolError("input_audio_buffer_commit_empty", "the input audio buffer is empty")
        samples = np.concatenate(self._buffer)
        self._buffer, self._buffered = [], 0
        stamp = self.gate.new_turn_stamp()
        self._input_audio_s[stamp.turn_id] = len(samples) / SAMPLE_RATE
        self._commit_user_audio(stamp.turn_id)
        now = time.monotonic()
        self._enqueue(SpeechSegment(stamp, samples, SAMPLE_RATE, now, now, respond=False))

    def clear_audio(self, event: Any = None) -> None:
        """``input_audio_buffer.clear``."""
        self._buffer, self._buffered = [], 0
        self.emit(server_event("input_audio_buffer.cleared"))

    def clear_output_audio(self, event: Any = None) -> None:
        """``output_audio_buffer.clear``: stop the reply's audio now (the response ends cancelled)."""
        with self.output.lock:
            active = self.output.active
        if active is not None:
            active.client_cancelled = True
            active.audio_cleared = True  # this event says so (not again at response.done)
            self.interrupt()
        self.emit(server_event("output_audio_buffer.cleared", response_id=active.id if active else ""))

    # -- conversation -------------------------------------------------------------------------
    def create_item(self, event: ConversationItemCreateEvent) -> None:
        """``conversation.item.create``: a message (user, assistant, system), function call or output."""
        item = event.item.model_dump(mode="json", exclude_none=True)
        item = {**item, "id": item.get("id") or new_id("item"), "object": "realtime.item", "status": "completed"}
        if self.conversation.get(item["id"]) is not None:
            raise ProtocolError(
                "item_create_duplicate_item_id", f"an item {item['id']!r} already exists", param="item.id"
            )
        if image_indices(item) and not self.llm.accepts_images:
            item, refusal = refuse_images(item, self.args.llm_backend, event.event_id)
            self.emit(protocol_error_event(refusal))
            if item is None:
                return
        history = to_history(item, self.images)
        kind = item["type"]
        if kind == "function_call" and self.conversation.find_call(item["call_id"]) is not None:
            raise ProtocolError("invalid_value", f"a function_call {item['call_id']!r} exists", param="item.call_id")
        if kind == "function_call_output":
            call_id = item["call_id"]
            known = self.conversation.find_call(call_id) is not None or any(
                i.get("type") == "function_call" and i.get("call_id") == call_id for i in self.llm.chat.items()
            )
            if not known:
                raise ProtocolError(
                    "item_not_found", f"no function_call with call_id {call_id!r}", param="item.call_id"
                )
            if self.conversation.has_output(call_id):
                raise ProtocolError(
                    "invalid_value", f"the call {call_id!r} already has an output", param="item.call_id"
                )
        after = event.previous_item_id
        if after not in (None, ROOT) and self.conversation.get(after) is None:
            after = None  # an anchor the client no longer has (deleted meanwhile): at the end
        self._discard_prefetch("conversation.item.create")
        ref = ("output", item["call_id"]) if kind == "function_call_output" else ("chat", item["id"])
        previous = self.conversation.add(item, ref, after)
        if kind == "function_call_output":
            self._enqueue(FunctionOutput(item["call_id"], item["output"]))
        else:
            at_end = self.conversation.last_id() == item["id"]
            self._enqueue(HistoryInsert(history, None if at_end else self.conversation.refs_before(item["id"])))
        self.emit(server_event("conversation.item.added", previous_item_id=previous, item=item))
        self.emit(server_event("conversation.item.done", previous_item_id=previous, item=item))

    def retrieve_item(self, event: ConversationItemRetrieveEvent) -> None:
        """``conversation.item.retrieve``: the item as the server has it now."""
        item = self.conversation.get(event.item_id)
        if item is None:
            raise ProtocolError("item_retrieve_invalid_item_id", f"no item {event.item_id!r}", param="item_id")
        self.emit(server_event("conversation.item.retrieved", item=item))

    def delete_item(self, event: ConversationItemDeleteEvent) -> None:
        """``conversation.item.delete``: the item leaves the conversation and the model's history."""
        ref = self.conversation.remove(event.item_id)
        if ref is None:
            raise ProtocolError("item_delete_invalid_item_id", f"no item {event.item_id!r}", param="item_id")
        self._discard_prefetch("conversation.item.delete")
        self._enqueue(HistoryDelete(ref))
        self.emit(server_event("conversation.item.deleted", item_id=event.item_id))

    def truncate(self, event: ConversationItemTruncateEvent) -> None:
        """``conversation.item.truncate``: the client played only ``audio_end_ms`` of an assistant item."""
        if event.audio_end_ms < 0 or event.content_index != 0:
            raise ProtocolError("invalid_value", "truncate needs content_index 0 and audio_end_ms >= 0")
        response = self.output.assistant_item(event.item_id)
        if response is None:
            raise ProtocolError("item_truncate_invalid_item_id", f"no assistant audio item {event.item_id!r}")
        heard = "".join(words for at_ms, words in response.spoken if at_ms < event.audio_end_ms).strip()
        self._enqueue(CutToHeard(response.turn_id, heard))  # in order with the requests behind it
        self.conversation.set_content(event.item_id, 0, transcript=heard)
        fields = {"item_id": event.item_id, "content_index": 0, "audio_end_ms": event.audio_end_ms}
        self.emit(server_event("conversation.item.truncated", **fields))

    # -- responses ------------------------------------------------------------------------------
    def create_response(self, event: ResponseCreateEvent) -> None:
        """``response.create``: answer from the conversation as it is. While the active response only
        plays out what it generated (or has handed out a function call), the new one is made at once
        and its events follow that response's ``response.done``; while it still generates: refused."""
        with self.output.lock:
            if self.output.active is not None and not self.output.active.winding_down:
                raise ProtocolError("conversation_already_has_active_response", "a response is already in progress")
        params = event.response.model_dump(exclude_none=True) if event.response is not None else {}
        if params.get("conversation", "auto") != "auto" or params.get("input") is not None:
            param = "response.conversation" if "conversation" in params else "response.input"
            raise ProtocolError("unsupported_parameter", "out-of-band responses are not supported", param=param)
        for name in _IGNORED_RESPONSE_FIELDS:
            if name in params:
                message = f"'response.{name}' is not supported by this server"
                error = ProtocolError("unsupported_parameter", message, event.event_id, f"response.{name}")
                self.emit(protocol_error_event(error))
        config = self.config
        modalities = list(config.output_modalities)
        if "output_modalities" in params:
            modalities = list(check_modalities(params["output_modalities"], "response.output_modalities"))
        tools, tool_choice = params.get("tools"), params.get("tool_choice")
        if tools is not None or tool_choice is not None:
            check_tools(tools if tools is not None else [], tool_choice if tool_choice is not None else "auto")
        metadata = params.get("metadata")
        # what differs from the session's defaults (a follow-up generated ahead answers a plain request)
        options = {k: v for k, v in params.items() if k in ("instructions", "tools", "tool_choice", "metadata")}
        if modalities != list(config.output_modalities):
            options["output_modalities"] = modalities
        stamp = self.gate.new_turn_stamp()
        # a follow-up to tool results may already be generated ahead: the LLM stage gives it to a
        # plain request (only metadata may differ, see claim_options), else discards it
        request = ResponseRequest(
            stamp,
            wants_audio=modalities != ["text"],
            instructions=params.get("instructions"),
            tools=tools,
            tool_choice=tool_choice,
            claim_options=options,
        )
        self._requested[stamp.turn_id] = (modalities, metadata)
        while len(self._requested) > 64:  # requests cancelled before they started never pop theirs
            self._requested.pop(next(iter(self._requested)))
        try:
            self._enqueue(request)
        except ProtocolError:
            self._requested.pop(stamp.turn_id, None)
            raise

    def cancel_response(self, event: ResponseCancelEvent) -> None:
        """``response.cancel``: stop the response in progress (what was heard stays in history)."""
        with self.output.lock:
            active = self.output.active
        if active is None or active.finished or (event.response_id is not None and event.response_id != active.id):
            raise ProtocolError("response_cancel_not_active", "no such response is in progress")
        active.client_cancelled = True
        self.interrupt()

    def interrupt(self) -> None:
        """Cancel: bump the generation, flush stale queued work, cut playback (as a barge-in does)."""
        self.gate.scope.cancel()
        # a reply none of whose audio was sent leaves no text in history (a text-only one keeps
        # what was sent: the client showed it)
        self.pipeline.interrupt(time.monotonic(), report_silent=True, keep=self.output.text_only_turns())

    def _discard_prefetch(self, reason: str) -> None:
        """What the follow-up generated ahead was made from changed: the LLM stage discards it, in
        its thread (a :class:`DiscardFollowUp` ahead of the data in its queue)."""
        self.pipeline.send_ahead(DiscardFollowUp(reason))

    def _enqueue(self, item: Any) -> None:
        """Client-driven work enters where typed turns do (the pipeline's ``"typed"`` queue, the STT's),
        so that it keeps its place after the audio turns before it.

        Never blocks the event loop: a full queue is an error for the client.
        """
        try:
            self.inputs["typed"].put_nowait(item)
        except queue.Full:
            raise ProtocolError("server_busy", "too many requests in flight; try again shortly") from None

    # -- events from the pipeline threads ---------------------------------------------------------
    def _user_item(self, turn_id: int) -> str:
        with self.lock:
            if turn_id not in self._user_items:
                self._user_items[turn_id] = new_id("item")
                while len(self._user_items) > 256:
                    self._user_items.pop(next(iter(self._user_items)))
            return self._user_items[turn_id]

    def _commit_user_audio(self, turn_id: int) -> None:
        """The user's audio of turn ``turn_id`` is committed: it becomes a conversation item."""
        item_id = self._user_item(turn_id)
        if self.conversation.get(item_id) is not None:  # a reopened turn keeps its item
            return
        content = [{"type": "input_audio", "transcript": None}]
        item = {"id": item_id, "type": "message", "object": "realtime.item", "role": "user", "status": "completed"}
        item["content"] = content
        previous = self.conversation.add(item, ("user_turn", turn_id))
        self.emit(server_event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id))
        self.emit(server_event("conversation.item.added", previous_item_id=previous, item=item))
        self.emit(server_event("conversation.item.done", previous_item_id=previous, item=item))

    def _on_speech_event(self, event: Event) -> None:
        """The user's speech becomes protocol events. Speech that paused a reply is not reported
        until its words decide (:mod:`~speech_to_speech.turns.interruptions`): a client stops playback
        and truncates the reply on ``speech_started``, so a backchannel or false start, which
        resumes the reply, is never reported at all; a real interruption is reported then, with
        every event held for it in order (``speech_started`` at the speech's start offset, then
        ``speech_stopped``, ``committed`` and the transcription as far as they came)."""
        if self._hold(event):
            return
        if isinstance(event, SpeechStarted):
            self._discard_prefetch("speech started")  # the pipeline flushed the reply (barge-in)
            fields = {"audio_start_ms": int(event.audio_ms), "item_id": self._user_item(event.turn_id)}
            self.emit(server_event("input_audio_buffer.speech_started", **fields))
        elif isinstance(event, SpeechStopped):
            self._input_audio_s[event.turn_id] = event.duration_ms / 1000
            fields = {"audio_end_ms": int(event.audio_ms), "item_id": self._user_item(event.turn_id)}
            self.emit(server_event("input_audio_buffer.speech_stopped", **fields))
            self._commit_user_audio(event.turn_id)
        elif isinstance(event, UserTranscriptDelta) and event.delta:
            self._emit_transcription_delta(event.turn_id, event.delta)  # a partial transcript, while speaking
        elif isinstance(event, UserTranscript) and event.stt_ms is not None:
            self._discard_prefetch("new transcription")
            item_id = self._user_item(event.turn_id)
            if event.delta:  # the words no partial announced (all of them without partials)
                self._emit_transcription_delta(event.turn_id, event.delta)
            self.conversation.set_content(item_id, 0, transcript=event.text)
            seconds = round(self._input_audio_s.pop(event.turn_id, 0.0), 3)
            fields = {"item_id": item_id, "content_index": 0, "transcript": event.text}
            usage = {"type": "duration", "seconds": seconds}
            if event.language:  # the detected (or pinned) language, as gpt-transcribe reports it
                fields["languages"] = [{"code": event.language}]
            self.emit(server_event("conversation.item.input_audio_transcription.completed", **fields, usage=usage))

    def _on_response_event(self, event: Event) -> None:
        """The response's pipeline events become protocol events (after the stages acted on them)."""
        if isinstance(event, ResponseStarted):
            # a follow-up generated ahead has its own turn; the request that claimed it has the options
            requested = self._requested.pop(event.turn_id if event.claimed_by is None else event.claimed_by, None)
            modalities, metadata = requested or (list(self.config.output_modalities), None)
            start = lambda: self.output.start(event.turn_id, modalities, metadata)  # noqa: E731
            # a reply begun at a pause is announced once the endpoint confirms it, never if superseded
            turns = self.pipeline.speculation
            turns.when_revision_confirmed(event.turn_id, event.revision, start) if turns else start()
        elif isinstance(event, ToolCallReady):
            self.output.tool_call(event)
        elif isinstance(event, AssistantText):  # its generation ended: a response.create may follow it
            self.output.generated(event.turn_id)
        elif isinstance(event, StageError):
            self.emit(error_event("server_error", f"{event.stage}: {event.message}", kind="server_error"))

    def _hold(self, event: Event) -> bool:
        """Hold, release or drop the events of speech that paused a reply; True if ``event`` was held."""
        if not isinstance(
            event, (SpeechStarted, SpeechStopped, UserTranscriptDelta, UserTranscript, ReplyResumed, BargeIn)
        ):
            return False
        with self.lock:  # events come from several stage threads; releases keep their order
            if isinstance(event, SpeechStarted) and event.pauses_reply:
                self._held[event.turn_id] = [event]
                if event.turn_id in self._not_reported:  # it went on: judged again, whole
                    self._not_reported.remove(event.turn_id)
                return True
            if isinstance(event, ReplyResumed):  # not an interruption: none of it is reported
                dropped, self._held = self._held, {}
                for turn in dropped:
                    logger.info("session %s: turn %d did not interrupt (%s)", self.id, turn, event.reason)
                    self._not_reported.append(turn)
                return True
            if not isinstance(event, (SpeechStarted, BargeIn)) and event.turn_id in self._not_reported:
                return True
            if isinstance(event, BargeIn):  # a real interruption: report it, as it happened
                held, self._held = self._held, {}  # the turns not kept were judged earlier: dropped
                for turn in event.keep_turn_ids:
                    for item in held.get(turn, []):
                        if isinstance(item, SpeechStarted):  # reported as what it now is: a barge-in
                            item = dataclasses.replace(item, pauses_reply=False, barge_in=True)
                        self._on_speech_event(item)
                return True
            held_events = self._held.get(event.turn_id)
            if held_events is not None and not isinstance(event, SpeechStarted):
                held_events.append(event)
                return True
        return False

    def _emit_transcription_delta(self, turn_id: int, delta: str) -> None:
        fields = {"item_id": self._user_item(turn_id), "content_index": 0, "delta": delta}
        self.emit(server_event("conversation.item.input_audio_transcription.delta", **fields))


#: client event type → the session method that applies it (the event parsed into the SDK's type)
HANDLERS: dict[str, Callable[[RealtimeSession, Any], None]] = {
    "session.update": RealtimeSession.update_session,
    "input_audio_buffer.append": RealtimeSession.append_audio,
    "input_audio_buffer.commit": RealtimeSession.commit_audio,
    "input_audio_buffer.clear": RealtimeSession.clear_audio,
    "output_audio_buffer.clear": RealtimeSession.clear_output_audio,
    "conversation.item.create": RealtimeSession.create_item,
    "conversation.item.retrieve": RealtimeSession.retrieve_item,
    "conversation.item.truncate": RealtimeSession.truncate,
    "conversation.item.delete": RealtimeSession.delete_item,
    "response.create": RealtimeSession.create_response,
    "response.cancel": RealtimeSession.cancel_response,
}
