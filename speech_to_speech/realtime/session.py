"""One client of the realtime server: its pipeline, its state, and the client events' handlers.

The session speaks the core of the OpenAI Realtime protocol (GA event names).
Stages run in threads as in local mode; protocol events produced in those
threads reach the asyncio side through :meth:`RealtimeSession.emit`, which
hands them over with ``loop.call_soon_threadsafe`` (no polling).
:data:`HANDLERS` maps each client event type to the session method that applies it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from speech_to_speech.cancel import Gate, Stamp
from speech_to_speech.cli import config_from_args
from speech_to_speech.events import (
    Event,
    EventBus,
    ResponseInterrupted,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    StageError,
    ToolCallReady,
    UserTranscript,
    UserTranscriptDelta,
)
from speech_to_speech.handler import BaseHandler
from speech_to_speech.llm import BaseLLMHandler
from speech_to_speech.lm_output import LMOutputProcessor
from speech_to_speech.messages import (
    AudioChunk,
    FunctionOutput,
    ResponseRequest,
    SpeechSegment,
    Transcript,
)
from speech_to_speech.playback import Interrupt
from speech_to_speech.prefetch import PrefetchCoordinator
from speech_to_speech.queues import StageQueue
from speech_to_speech.realtime.protocol import ProtocolError, check_tools, error_event, new_id
from speech_to_speech.realtime.responses import ResponseOutput
from speech_to_speech.realtime.sink import ClientSink
from speech_to_speech.realtime.wire import WIRE_RATE, decode_audio
from speech_to_speech.registry import get_backend
from speech_to_speech.vad import SAMPLE_RATE, BaseVADHandler, Endpointer

logger = logging.getLogger(__name__)


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
    """

    def __init__(
        self,
        args: argparse.Namespace,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[dict[str, Any]], None],
        limits: SessionLimits | None = None,
    ) -> None:
        self.id = new_id("sess")
        self.args = args
        self.loop = loop
        self._loop_thread = threading.get_ident()  # sessions are created on the loop's thread
        self._send = send
        self.limits = limits or SessionLimits()
        self.stop_event = threading.Event()
        self.gate = Gate()
        self.bus = EventBus()
        self.lock = threading.RLock()
        self.instructions = ""
        self.voice = "joe"
        self.output_modalities = ["audio"]
        self.turn_detection: dict[str, Any] | None = {
            "type": "server_vad",
            "threshold": args.vad_threshold,
            "silence_duration_ms": args.min_silence_ms,
            "prefix_padding_ms": args.speech_pad_ms,
            "interrupt_response": True,
            "create_response": True,
        }
        self.tools: list[dict[str, Any]] = []
        self.tool_choice = "auto"
        self._resampler = soxr.ResampleStream(WIRE_RATE, SAMPLE_RATE, 1, dtype="float32")
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._offset = 0
        self._user_items: dict[int, str] = {}
        self._input_audio_s: dict[int, float] = {}  # per turn: seconds of audio sent to STT
        self.output = ResponseOutput(self.emit, self.gate, lambda: self._discard_prefetch("response failed"))
        self._build()

    # -- pipeline -----------------------------------------------------------------------
    def _build(self) -> None:
        common: dict[str, Any] = {"stop_event": self.stop_event, "gate": self.gate, "bus": self.bus}
        self.queues = {
            name: StageQueue(size)
            for name, size in (
                ("audio", 512),
                ("segments", 16),
                ("transcripts", 16),
                ("llm_out", 64),
                ("tts", 64),
                ("out", 128),
            )
        }
        q = self.queues

        def stage(kind: str, name: str, inq: StageQueue, outq: StageQueue) -> BaseHandler:
            backend = get_backend(kind, name)
            config = copy.deepcopy(config_from_args(backend.config_cls, self.args))
            handler_cls = backend.load_handler_class()
            return handler_cls(
                input_queue=inq,
                output_queue=outq,
                config=config,
                device=self.args.resolved_device,
                name=f"{self.id}:{kind}",
                **common,
            )

        self.vad: BaseVADHandler = stage("vad", self.args.vad, q["audio"], q["segments"])  # type: ignore[assignment]
        self.stt = stage("stt", self.args.stt, q["segments"], q["transcripts"])
        self.llm: BaseLLMHandler = stage("llm", self.args.llm_backend, q["transcripts"], q["llm_out"])  # type: ignore[assignment]
        lm_output = LMOutputProcessor(
            input_queue=q["llm_out"], output_queue=q["tts"], name=f"{self.id}:lm_output", **common
        )
        self.tts = stage("tts", self.args.tts, q["tts"], q["out"])
        self.sink = ClientSink(input_queue=q["out"], target=self.output, name=f"{self.id}:sink", **common)
        self.llm.prefetch = PrefetchCoordinator()
        self.stages: list[BaseHandler] = [self.vad, self.stt, self.llm, lm_output, self.tts, self.sink]
        self.bus.subscribe(self._on_event)

    def start(self, stop: threading.Event | None = None) -> None:
        """Start every stage and wait until they are ready (models are shared, so this is quick).

        Args:
            stop: when set while stages load, the session is closed and start gives up.

        Raises:
            RuntimeError: if a stage fails to set up, or ``stop`` was set first.
        """
        for s in self.stages:
            s.start()
        for s in self.stages:
            while not s.ready.wait(0.1):
                if stop is not None and stop.is_set():
                    self.close()
                    raise RuntimeError("stopped while loading models")
            if s.setup_error is not None:
                self.close()
                raise RuntimeError(f"{s.name}: {s.setup_error}")
        self.emit({"type": "session.created", "session": self.session_object()})

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop every stage of this session and join its threads."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for s in self.stages:
            if s.is_alive():
                s.join(max(0.0, deadline - time.monotonic()))

    def emit(self, event: dict[str, Any], stamp: Stamp | None = None) -> None:
        """Send ``event`` to the client from any thread.

        Events with a ``stamp`` are checked against the gate again just before
        they are written to the socket, so nothing of a cancelled reply leaves
        after the cancel.
        """
        event.setdefault("event_id", new_id("event"))
        gated = (event, stamp)
        if threading.get_ident() == self._loop_thread:
            self._send_gated(gated)
        else:
            with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is gone, the client left
                self.loop.call_soon_threadsafe(self._send_gated, gated)

    def _send_gated(self, gated: tuple[dict[str, Any], Stamp | None]) -> None:
        event, stamp = gated
        if stamp is not None and not self.gate.admits(stamp):
            return
        self._send(event)

    # -- session configuration ----------------------------------------------------------
    def session_object(self) -> dict[str, Any]:
        """The session as the protocol describes it."""
        return {
            "type": "realtime",
            "id": self.id,
            "object": "realtime.session",
            "model": self.args.llm_backend,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": WIRE_RATE},
                    "turn_detection": copy.deepcopy(self.turn_detection),
                    "transcription": {"model": self.args.stt},
                },
                "output": {"format": {"type": "audio/pcm", "rate": WIRE_RATE}, "voice": self.voice},
            },
            "tools": copy.deepcopy(self.tools),
            "tool_choice": self.tool_choice,
        }

    def update_session(self, session: dict[str, Any]) -> None:
        """Apply a ``session.update``; raises ProtocolError without changing anything on bad input."""
        if not isinstance(session, dict):
            raise ProtocolError("invalid_value", "'session' must be an object")
        instructions = session.get("instructions", self.instructions)
        modalities = session.get("output_modalities", self.output_modalities)
        tools = session.get("tools", self.tools)
        tool_choice = session.get("tool_choice", self.tool_choice)
        audio = {} if session.get("audio") is None else session["audio"]
        if not isinstance(instructions, str):
            raise ProtocolError("invalid_value", "'instructions' must be a string")
        if not isinstance(modalities, list) or not modalities or not set(modalities) <= {"audio", "text"}:
            raise ProtocolError("invalid_value", "'output_modalities' must be ['audio'] or ['text']")
        check_tools(tools, tool_choice)
        if not isinstance(audio, dict):
            raise ProtocolError("invalid_value", "'audio' must be an object")
        audio_in, audio_out = ({} if audio.get(k) is None else audio[k] for k in ("input", "output"))
        if not isinstance(audio_in, dict) or not isinstance(audio_out, dict):
            raise ProtocolError("invalid_value", "'audio.input' and 'audio.output' must be objects")
        for part in (audio_in, audio_out):
            fmt = part.get("format") if isinstance(part, dict) else None
            if fmt is not None and (
                not isinstance(fmt, dict) or fmt.get("type") != "audio/pcm" or fmt.get("rate", WIRE_RATE) != WIRE_RATE
            ):
                raise ProtocolError("unsupported_audio_format", f"only audio/pcm at {WIRE_RATE} Hz is supported")
        turn_detection = (
            audio_in.get("turn_detection", self.turn_detection) if isinstance(audio_in, dict) else self.turn_detection
        )
        if turn_detection is not None:
            if not isinstance(turn_detection, dict) or turn_detection.get("type", "server_vad") != "server_vad":
                raise ProtocolError("invalid_value", "turn_detection must be null or {'type': 'server_vad', ...}")
            threshold = turn_detection.get("threshold", self.args.vad_threshold)
            if not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
                raise ProtocolError("invalid_value", "turn_detection.threshold must be in (0, 1)")
            turn_detection = {**(self.turn_detection or {}), "type": "server_vad", **turn_detection}
        voice = audio_out.get("voice", self.voice) if isinstance(audio_out, dict) else self.voice
        self._discard_prefetch("session.update")
        with self.lock:
            self.instructions = instructions
            self.output_modalities = ["text"] if modalities == ["text"] else ["audio"]
            self.llm.default_wants_audio = self.output_modalities == ["audio"]
            self.tools = copy.deepcopy(tools)
            self.tool_choice = tool_choice
            self.voice = str(voice)
            self.turn_detection = turn_detection
            self.llm.config.system_prompt = instructions
            self.llm.tools = copy.deepcopy(tools)
            self.llm.tool_choice = tool_choice
            if turn_detection is not None:
                cfg = self.vad.config
                cfg.vad_threshold = float(turn_detection.get("threshold", cfg.vad_threshold))
                cfg.min_silence_ms = int(turn_detection.get("silence_duration_ms", cfg.min_silence_ms))
                cfg.speech_pad_ms = int(turn_detection.get("prefix_padding_ms", cfg.speech_pad_ms))
                cfg.interrupt_response = bool(turn_detection.get("interrupt_response", True))
                self.vad.create_response = bool(turn_detection.get("create_response", True))
                self.vad.endpointer = Endpointer(cfg)
        self.emit({"type": "session.updated", "session": self.session_object()})

    # -- input audio ------------------------------------------------------------------------
    def append_audio(self, audio_b64: Any) -> None:
        """``input_audio_buffer.append``: base64 pcm16 at 24 kHz."""
        samples = self._resampler.resample_chunk(decode_audio(audio_b64))
        if self.turn_detection is None:
            if (self._buffered + len(samples)) / SAMPLE_RATE > self.limits.max_buffer_s:
                raise ProtocolError(
                    "input_audio_buffer_full", f"the input buffer holds at most {self.limits.max_buffer_s:g} s"
                )
            self._buffer.append(samples)
            self._buffered += len(samples)
            return
        chunk = AudioChunk(samples, SAMPLE_RATE, time.monotonic(), self._offset)
        self._offset += len(samples)
        try:
            self.queues["audio"].put_nowait(chunk)
        except queue.Full:
            raise ProtocolError("input_audio_overflow", "the server is behind; audio was dropped") from None

    def commit_audio(self) -> None:
        """``input_audio_buffer.commit``: the buffered audio becomes a user turn."""
        if self.turn_detection is not None:
            raise ProtocolError("invalid_state", "commit is only used when turn_detection is null")
        if not self._buffered:
            raise ProtocolError("input_audio_buffer_commit_empty", "the input audio buffer is empty")
        samples = np.concatenate(self._buffer)
        self._buffer, self._buffered = [], 0
        stamp = self.gate.new_turn_stamp()
        self._input_audio_s[stamp.turn_id] = len(samples) / SAMPLE_RATE
        item_id = self._user_item(stamp.turn_id)
        self.emit({"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": item_id})
        self._emit_user_item(item_id, audio=True)
        now = time.monotonic()
        segment = SpeechSegment(stamp, samples, SAMPLE_RATE, now, now, respond=False)
        self._enqueue(segment)

    def clear_audio(self) -> None:
        """``input_audio_buffer.clear``."""
        self._buffer, self._buffered = [], 0
        self.emit({"type": "input_audio_buffer.cleared"})

    # -- conversation -------------------------------------------------------------------------
    def create_item(self, item: dict[str, Any]) -> None:
        """``conversation.item.create``: user text or a function call output."""
        if not isinstance(item, dict):
            raise ProtocolError("invalid_value", "'item' must be an object")
        self._discard_prefetch("conversation.item.create")
        kind = item.get("type")
        if kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise ProtocolError("invalid_value", "function_call_output needs string 'call_id' and 'output'")
            if not any(i.get("call_id") == call_id and i.get("type") == "function_call" for i in self.llm.chat.items()):
                raise ProtocolError("item_not_found", f"no function_call with call_id {call_id!r}")
            item_id = item.get("id") or new_id("item")
            self._enqueue(FunctionOutput(call_id, output))
            self.emit(
                {
                    "type": "conversation.item.created",
                    "item": {"id": item_id, "type": kind, "call_id": call_id, "output": output},
                }
            )
            return
        if kind != "message" or item.get("role") != "user":
            raise ProtocolError("invalid_value", "only user messages and function_call_output items can be created")
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise ProtocolError("invalid_value", "'content' must be a non-empty list")
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                raise ProtocolError("invalid_value", "user content parts must be {'type': 'input_text', 'text': str}")
            texts.append(part["text"])
        stamp = self.gate.new_turn_stamp()
        item_id = self._user_item(stamp.turn_id, item.get("id"))
        self.emit(
            {
                "type": "conversation.item.created",
                "item": {"id": item_id, "type": "message", "role": "user", "content": content},
            }
        )
        self._enqueue(Transcript(stamp, "\n".join(texts), respond=False, item_id=item_id))

    def truncate(self, item_id: Any, audio_end_ms: Any) -> None:
        """``conversation.item.truncate``: the client played only ``audio_end_ms`` of an assistant item."""
        if not isinstance(item_id, str) or not isinstance(audio_end_ms, (int, float)) or audio_end_ms < 0:
            raise ProtocolError("invalid_value", "truncate needs 'item_id' and a non-negative 'audio_end_ms'")
        response = self.output.assistant_item(item_id)
        if response is None:
            raise ProtocolError("item_not_found", f"no assistant audio item {item_id!r}")
        heard = "".join(words for at_ms, words in response.spoken if at_ms < audio_end_ms).strip()
        self.llm.apply_heard_text(response.turn_id, heard)
        self.emit(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": audio_end_ms,
            }
        )

    # -- responses ------------------------------------------------------------------------------
    def create_response(self, options: dict[str, Any] | None) -> None:
        """``response.create``: answer from the conversation as it is."""
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise ProtocolError("invalid_value", "'response' must be an object")
        with self.output.lock:
            if self.output.active is not None:
                raise ProtocolError("conversation_already_has_active_response", "a response is already in progress")
        modalities = options.get("output_modalities", self.output_modalities)
        instructions = options.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ProtocolError("invalid_value", "'instructions' must be a string")
        if not isinstance(modalities, list) or not set(modalities) <= {"audio", "text"} or not modalities:
            raise ProtocolError("invalid_value", "'output_modalities' must be ['audio'] or ['text']")
        tools = options.get("tools")
        tool_choice = options.get("tool_choice")
        if tools is not None or tool_choice is not None:
            check_tools(tools if tools is not None else [], tool_choice if tool_choice is not None else "auto")
        stamp = self.gate.new_turn_stamp()
        request = ResponseRequest(
            stamp, wants_audio=modalities != ["text"], instructions=instructions, tools=tools, tool_choice=tool_choice
        )
        # a follow-up to tool results may already have been generated ahead; it is claimed
        # by a plain response.create (only metadata may differ), else discarded
        self.llm.respond_or_claim(options, lambda: self._enqueue(request))

    def cancel_response(self) -> None:
        """``response.cancel``: stop the response in progress (what was heard stays in history)."""
        with self.output.lock:
            active = self.output.active
        if active is None:
            raise ProtocolError("response_cancel_not_active", "no response is in progress")
        active.client_cancelled = True
        self.interrupt()

    def interrupt(self) -> None:
        """Barge-in or cancel: bump the generation, flush stale queued work, cut playback."""
        self.gate.scope.cancel()
        self._flush()

    def _discard_prefetch(self, reason: str) -> None:
        if self.llm.prefetch is not None:
            self.llm.prefetch.discard_open(reason)

    def _flush(self) -> None:
        for name in ("segments", "transcripts", "llm_out", "tts", "out"):
            self.queues[name].drop_where(self.gate.drops)
        self.queues["out"].put_unless_stopped(Interrupt(time.monotonic()), self.stop_event)

    def _enqueue(self, item: Any) -> None:
        """Client-driven work goes through the STT queue so it keeps its place after audio turns.

        Never blocks the event loop: a full queue is an error for the client.
        """
        try:
            self.queues["segments"].put_nowait(item)
        except queue.Full:
            raise ProtocolError("server_busy", "too many requests in flight; try again shortly") from None

    # -- events from the pipeline threads ---------------------------------------------------------
    def _user_item(self, turn_id: int, item_id: str | None = None) -> str:
        with self.lock:
            if turn_id not in self._user_items:
                self._user_items[turn_id] = item_id or new_id("item")
            return self._user_items[turn_id]

    def _emit_user_item(self, item_id: str, audio: bool) -> None:
        content = [{"type": "input_audio", "transcript": None}] if audio else []
        self.emit(
            {
                "type": "conversation.item.created",
                "item": {"id": item_id, "type": "message", "role": "user", "status": "completed", "content": content},
            }
        )

    def _on_event(self, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._discard_prefetch("speech started")
            self._flush()  # the VAD already bumped the generation (barge-in)
            item_id = self._user_item(event.turn_id)
            self.emit(
                {
                    "type": "input_audio_buffer.speech_started",
                    "audio_start_ms": int(event.audio_ms),
                    "item_id": item_id,
                }
            )
        elif isinstance(event, SpeechStopped):
            item_id = self._user_item(event.turn_id)
            self._input_audio_s[event.turn_id] = event.duration_ms / 1000
            self.emit(
                {
                    "type": "input_audio_buffer.speech_stopped",
                    "audio_end_ms": int(event.audio_ms),
                    "item_id": item_id,
                }
            )
            self.emit({"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": item_id})
            self._emit_user_item(item_id, audio=True)
        elif isinstance(event, UserTranscriptDelta) and event.delta:
            self._emit_transcription_delta(event.turn_id, event.delta)  # a partial transcript, while speaking
        elif isinstance(event, UserTranscript) and event.stt_ms is not None:
            self._discard_prefetch("new transcription")
            item_id = self._user_item(event.turn_id)
            if event.delta:  # the words no partial announced (all of them without partials)
                self._emit_transcription_delta(event.turn_id, event.delta)
            self.emit(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item_id,
                    "content_index": 0,
                    "transcript": event.text,
                    "usage": {"type": "duration", "seconds": round(self._input_audio_s.pop(event.turn_id, 0.0), 3)},
                }
            )
        elif isinstance(event, ResponseStarted):
            self.output.start(event.turn_id, self.output_modalities)
        elif isinstance(event, ToolCallReady):
            self.output.tool_call(event)
        elif isinstance(event, ResponseInterrupted):
            self.llm.apply_heard_text(event.turn_id, event.heard_text)
        elif isinstance(event, StageError):
            self.emit(error_event("server_error", f"{event.stage}: {event.message}"))

    def _emit_transcription_delta(self, turn_id: int, delta: str) -> None:
        item = self._user_item(turn_id)
        event = {"type": "conversation.item.input_audio_transcription.delta", "item_id": item, "content_index": 0}
        self.emit({**event, "delta": delta})


#: client event type → the session method that applies it (the event's fields as keywords)
HANDLERS: dict[str, Callable[[RealtimeSession, dict[str, Any]], None]] = {
    "session.update": lambda s, e: s.update_session(e.get("session")),
    "input_audio_buffer.append": lambda s, e: s.append_audio(e.get("audio")),
    "input_audio_buffer.commit": lambda s, e: s.commit_audio(),
    "input_audio_buffer.clear": lambda s, e: s.clear_audio(),
    "conversation.item.create": lambda s, e: s.create_item(e.get("item")),
    "conversation.item.truncate": lambda s, e: s.truncate(e.get("item_id"), e.get("audio_end_ms")),
    "response.create": lambda s, e: s.create_response(e.get("response")),
    "response.cancel": lambda s, e: s.cancel_response(),
}


def dispatch(session: RealtimeSession, event: dict[str, Any]) -> None:
    """Apply one parsed client event to ``session``.

    Raises:
        ProtocolError: unknown event type or invalid fields.
    """
    handler = HANDLERS.get(event["type"])
    if handler is None:
        raise ProtocolError("unknown_event", f"unsupported client event type {event['type']!r}")
    handler(session, event)
