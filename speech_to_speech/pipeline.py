"""Wiring stages into a running pipeline."""

from __future__ import annotations

import argparse
import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speech_to_speech.audio_io import (
    AudioDeviceError,
    FileSink,
    FileSource,
    MicrophoneSource,
    NullSink,
    SpeakerSink,
    StreamClock,
    TextSource,
    check_input_device,
    check_output_device,
)
from speech_to_speech.cancel import Gate
from speech_to_speech.cli import config_from_args
from speech_to_speech.events import (
    BargeIn,
    Event,
    EventBus,
    ReplyPaused,
    ReplyResumed,
    ResponseInterrupted,
    SpeechStarted,
    TurnSuperseded,
)
from speech_to_speech.handler import BaseHandler
from speech_to_speech.interruptions import Interruptions, JudgedTranscripts, RepliesInFlight
from speech_to_speech.llm import BaseLLMHandler
from speech_to_speech.lm_output import LMOutputProcessor
from speech_to_speech.playback import Interrupt, Pause, Resume
from speech_to_speech.prefetch import PrefetchCoordinator
from speech_to_speech.queues import StageQueue
from speech_to_speech.registry import get_backend
from speech_to_speech.speculation import HoldUntilConfirmed, PauseUntilConfirmed, SpeculativeTurns
from speech_to_speech.turn_detection import resolve_turn_detection
from speech_to_speech.vad import SAMPLE_RATE

logger = logging.getLogger(__name__)

#: playback rate of the speaker sink, Hz (TTS audio is resampled once, here)
SPEAKER_RATE = 24_000
#: silence fed after an input file, on top of --min_silence_ms, seconds
FILE_TAIL_SILENCE_S = 0.5
#: queue capacities (items) between stages
QUEUE_SIZES = {"audio": 256, "segments": 8, "transcripts": 8, "llm_out": 32, "tts_inputs": 32, "audio_out": 64}
#: queue capacities of a realtime session: a client may send audio faster than real time, and its
#: requests go on the STT's queue without waiting (a full queue is an error for the client)
SESSION_QUEUE_SIZES = {**QUEUE_SIZES, "audio": 512, "segments": 16, "transcripts": 16, "llm_out": 64}
SESSION_QUEUE_SIZES |= {"tts_inputs": 64, "audio_out": 128}


class PipelineError(RuntimeError):
    """The pipeline could not be built or started (bad input, missing device, model failed)."""


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"``, ``"mps"`` or ``"cpu"`` by what torch sees."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@dataclass
class Pipeline:
    """A chain of started-or-not stages sharing one stop event, gate and bus.

    Attributes:
        stages: in data-flow order; the first is the source, the last the sink.
    """

    stages: list[BaseHandler]
    stop_event: threading.Event
    gate: Gate
    bus: EventBus
    clock: StreamClock
    queues: list[StageQueue] = field(default_factory=list)
    #: unconfirmed speculative turns, whose output the queues hold (None: no speculation)
    speculation: SpeculativeTurns | None = None
    #: the replies in flight (None: not tracked, e.g. typed input)
    replies: RepliesInFlight | None = None
    #: judges user speech during a reply (None: speech cancels the reply at once)
    interruptions: Interruptions | None = None
    #: where a caller feeds a pipeline that has no source stage (a realtime session): its queues by name
    inputs: dict[str, StageQueue] = field(default_factory=dict)

    @property
    def source(self) -> BaseHandler:
        return self.stages[0]

    @property
    def sink(self) -> BaseHandler:
        return self.stages[-1]

    def start(
        self,
        setup_timeout_s: float | None = None,
        on_ready: Callable[[str, float], None] | None = None,
        on_loaded: Callable[[], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, float]:
        """Start every stage, wait until all have loaded, then start the source.

        Models load in parallel, one thread per stage.

        Args:
            setup_timeout_s: give up waiting after this many seconds (None: wait as long as it takes).
            on_ready: called on this thread with (stage name, setup seconds) as each stage
                finishes loading, in the order they finish.
            on_loaded: called on this thread once every stage is ready, just before the source starts.
            cancel: when set while stages load, the pipeline is stopped (as by ``stop_event``).

        Returns:
            Setup seconds per stage name.

        Raises:
            PipelineError: if any stage fails in setup (the others are stopped).
        """
        began = time.monotonic()
        for stage in self.stages[1:]:
            stage.start()
        pending = list(self.stages[1:])
        while pending:
            pending[0].ready.wait(0.05)
            for stage in [s for s in pending if s.ready.is_set()]:
                pending.remove(stage)
                if stage.setup_error is None and on_ready is not None:
                    on_ready(stage.name, stage.load_seconds)
            if cancel is not None and cancel.is_set():
                self.stop_event.set()
            if self.stop_event.is_set() or (setup_timeout_s and time.monotonic() - began > setup_timeout_s):
                break
        failed = [s for s in self.stages[1:] if s.setup_error is not None]
        if failed or self.stop_event.is_set():
            self.stop()
            if failed:
                raise PipelineError(_describe(failed[0].setup_error) + _install_hint(failed[0]))
            raise PipelineError("stopped while loading models")
        loaded = {s.name: s.load_seconds for s in self.stages[1:]}
        if on_loaded is not None:
            on_loaded()
        self.source.start()
        return loaded

    def wait(self, poll_s: float = 0.2) -> None:
        """Block until the sink has finished (end of input) or a stop was requested."""
        while self.sink.is_alive() and not self.stop_event.is_set():
            self.sink.join(poll_s)
        if self.source.setup_error is not None:
            raise PipelineError(_describe(self.source.setup_error))

    def on_event(self, event: Event) -> None:
        """Barge-in: on speech start flush stale work and cut the reply being played (or,
        when the speech pauses the reply, pause the sink; resume it or, on a real
        interruption, cancel and cut as for a barge-in); when the sink reports what was
        heard, cut the reply in history to that; when a speculative turn is superseded,
        drop its queued work (none of it reached the sink)."""
        if isinstance(event, SpeechStarted):
            if not event.pauses_reply:
                self.interrupt(event.time, report_silent=event.barge_in)
        elif isinstance(event, ReplyPaused):
            self._to_sink(Pause(event.at))
        elif isinstance(event, ReplyResumed):
            self._to_sink(Resume())
        elif isinstance(event, BargeIn):
            self.gate.cancel(keep_turns=event.keep_turn_ids)  # the user's speech stays valid
            self.interrupt(event.at, report_silent=True, keep=event.keep_turn_ids)
        elif isinstance(event, TurnSuperseded):
            self.drop_stale()
        elif isinstance(event, ResponseInterrupted):
            for stage in self.stages:
                if isinstance(stage, BaseLLMHandler):
                    stage.apply_heard_text(event.turn_id, event.heard_text)

    def interrupt(self, at: float, report_silent: bool = False, keep: list[int] | None = None) -> int:
        """Drop every queued item whose stamp is stale and tell the sink to cut playback at ``at``.

        The work to cut must already be stale (the VAD bumps the generation on speech start).

        Args:
            at: monotonic time the user started speaking, s.
            report_silent: the replies in flight with no audio at the sink yet were cancelled:
                publish that nothing of them was heard (a :class:`ResponseInterrupted` with no
                words), so that history keeps no text of them. The sink reports the others.
            keep: turns whose replies were not cancelled.

        Returns:
            The number of queued items dropped.
        """
        dropped = self.drop_stale()
        self._to_sink(Interrupt(at))
        if dropped:
            logger.info("barge-in: dropped %d stale queued items", dropped)
        if report_silent and self.replies is not None:
            for turn_id in self.replies.silent(other_than=set(keep or ())):
                self.bus.publish(ResponseInterrupted(turn_id, heard_text="", audio_end_ms=0.0))
        return dropped

    def _to_sink(self, message: Interrupt | Pause | Resume) -> None:
        """Put a control message on the sink's queue (in order with the audio before it)."""
        sink_queue = self.sink.input_queue
        if sink_queue is not None:
            sink_queue.put_unless_stopped(message, self.stop_event)

    def drop_stale(self) -> int:
        """Drop every queued item whose stamp is stale; return how many were dropped."""
        return sum(q.drop_where(self.gate.drops) for q in self.queues)

    def stop(self, timeout_s: float = 2.0) -> list[str]:
        """Signal every stage to stop and join them within ``timeout_s`` in total.

        Returns:
            Names of threads still alive after the timeout (normally empty).
        """
        self.stop_event.set()
        if self.interruptions is not None:
            self.interruptions.close()
        deadline = time.monotonic() + timeout_s
        for stage in self.stages:
            if stage.is_alive():
                stage.join(max(0.0, deadline - time.monotonic()))
        return [s.name for s in self.stages if s.is_alive()]


def _install_hint(stage: BaseHandler) -> str:
    """For a backend stage (named ``"stage:backend"``) that failed on a missing module: how to install it."""
    if not isinstance(stage.setup_error, ImportError):
        return ""
    kind, _, name = stage.name.partition(":")
    try:
        extra = get_backend(kind, name).extra
    except ValueError:  # not a registered backend stage
        return ""
    return f"; install it with: pip install 'speech-to-speech[{extra}]'" if extra else ""


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, (FileNotFoundError, ValueError, AudioDeviceError, PipelineError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def build_pipeline(args: argparse.Namespace, bus: EventBus | None = None) -> Pipeline:
    """Build (but do not start) the pipeline that ``args`` describe.

    Modes: ``--input_text`` (text → LLM → TTS), ``--input_audio`` (file → VAD →
    STT → LLM → TTS), else the microphone. Output: ``--output_audio`` WAV, else
    the speaker (discarded with a warning when input is a file or text and no
    speaker exists).

    Raises:
        UnknownBackendError, BackendUnavailableError: bad backend selection.
        PipelineError: no microphone for live mode.
    """
    bus = bus or EventBus()
    stop = threading.Event()
    gate = Gate()
    clock = StreamClock()
    device = resolve_device(args.device)
    queues: list[StageQueue] = []
    stages: list[BaseHandler] = []

    # speculative turns (audio input only): the LLM pauses after each output of an unconfirmed
    # turn, and its audio waits in front of the sink until the VAD confirms the endpoint
    speculation = None if args.input_text else SpeculativeTurns(gate)
    holds = {"llm_out": PauseUntilConfirmed, "audio_out": HoldUntilConfirmed}
    # speech during a reply (audio input only) pauses it; its transcript is judged on its way to the LLM
    replies = None if args.input_text else RepliesInFlight(bus)
    interruptions = None if replies is None else _interruptions(args, bus, replies)

    def link(name: str) -> StageQueue:
        if name == "transcripts" and interruptions is not None:
            q: StageQueue = JudgedTranscripts(interruptions, QUEUE_SIZES[name])
        else:
            hold = holds.get(name) if speculation is not None else None
            q = StageQueue(QUEUE_SIZES[name]) if hold is None else hold(speculation, QUEUE_SIZES[name])
        queues.append(q)
        return q

    common: dict[str, Any] = {"stop_event": stop, "gate": gate, "bus": bus}

    def backend_stage(stage: str, name: str, inq: StageQueue, outq: StageQueue) -> BaseHandler:
        return _backend_stage(args, stage, name, inq, outq, device, common, f"{stage}:{name}")

    # resolve every backend first so a bad name fails before anything loads
    chosen = {"llm": args.llm_backend, "tts": args.tts}
    if not args.input_text:
        chosen = {"vad": args.vad, "stt": args.stt, **chosen}
    for stage, name in chosen.items():
        get_backend(stage, name)
    if not args.input_text:
        try:  # an unknown mode, or smart_turn without its model, fails before anything loads
            resolve_turn_detection(args.turn_detection)
        except (ValueError, FileNotFoundError) as exc:
            raise PipelineError(str(exc)) from None

    if args.input_text:
        transcripts = link("transcripts")
        stages.append(
            TextSource(output_queue=transcripts, texts=list(args.input_text), clock=clock, name="source:text", **common)
        )
    else:
        audio = link("audio")
        if args.input_audio:
            source: BaseHandler = FileSource(
                output_queue=audio,
                path=args.input_audio,
                clock=clock,
                speed=args.input_speed,
                # a microphone keeps hearing the room after the last word; so does the file
                tail_silence_s=FILE_TAIL_SILENCE_S + args.min_silence_ms / 1000,
                name="source:file",
                **common,
            )
        else:
            _require(check_input_device, SAMPLE_RATE)
            source = MicrophoneSource(output_queue=audio, clock=clock, name="source:microphone", **common)
        stages.append(source)
        segments, transcripts = link("segments"), link("transcripts")
        stages.append(backend_stage("vad", args.vad, audio, segments))
        stages.append(backend_stage("stt", args.stt, segments, transcripts))
        for stage in stages[-2:]:
            stage.speculation = speculation  # type: ignore[attr-defined]
        stages[-2].semantic_turns = True  # type: ignore[attr-defined]  # the model of --turn_detection
        stages[-2].interruptions = interruptions  # type: ignore[attr-defined]
    llm_out, tts_inputs, audio_out = link("llm_out"), link("tts_inputs"), link("audio_out")
    stages.extend(_reply_stages(args, transcripts, llm_out, tts_inputs, audio_out, device, common))
    stages.append(_make_sink(args, audio_out, clock, common))
    pipeline = Pipeline(stages, stop, gate, bus, clock, queues, speculation, replies, interruptions)
    bus.subscribe(pipeline.on_event)
    return pipeline


def build_session_pipeline(
    args: argparse.Namespace,
    make_sink: Callable[[StageQueue, dict[str, Any]], BaseHandler],
    name: str,
    bus: EventBus | None = None,
) -> Pipeline:
    """Build (but do not start) the pipeline of one realtime session: the stages of local mode
    (VAD → STT → LLM → LM output → TTS) with the client as source and sink.

    There is no source stage: the session puts the client's audio on ``inputs["audio"]`` and
    its requests (typed turns, committed audio, response requests, control messages) on
    ``inputs["segments"]``, the STT's queue, so they keep their place behind audio turns. Queue
    sizes are :data:`SESSION_QUEUE_SIZES`; barge-in flushing is :meth:`Pipeline.on_event`'s, as
    in local mode; the LLM gets a prefetch coordinator (follow-ups to tool results are generated
    ahead). Threads are named ``f"{name}:{stage}"``.

    Args:
        make_sink: builds the sink from its input queue and the shared stage keywords.
        name: the session id.
    """
    bus = bus or EventBus()
    stop = threading.Event()
    gate = Gate()
    device = getattr(args, "resolved_device", None) or resolve_device(args.device)
    common: dict[str, Any] = {"stop_event": stop, "gate": gate, "bus": bus}
    # replies in flight: one cancelled before any of its audio was sent leaves no text in history;
    # speech during one pauses it and its words decide (as in local mode), unless turned off
    replies_in_flight = RepliesInFlight(bus)
    interruptions = _interruptions(args, bus, replies_in_flight)
    q = {kind: StageQueue(size) for kind, size in SESSION_QUEUE_SIZES.items()}
    if interruptions is not None:
        q["transcripts"] = JudgedTranscripts(interruptions, SESSION_QUEUE_SIZES["transcripts"])
    vad = _backend_stage(args, "vad", args.vad, q["audio"], q["segments"], device, common, f"{name}:vad")
    stt = _backend_stage(args, "stt", args.stt, q["segments"], q["transcripts"], device, common, f"{name}:stt")
    replies = _reply_stages(args, q["transcripts"], q["llm_out"], q["tts_inputs"], q["audio_out"], device, common, name)
    replies[0].prefetch = PrefetchCoordinator()  # type: ignore[attr-defined]
    vad.interruptions = interruptions  # type: ignore[attr-defined]
    stages = [vad, stt, *replies, make_sink(q["audio_out"], common)]
    queues = list(q.values())
    pipeline = Pipeline(
        stages, stop, gate, bus, StreamClock(), queues, replies=replies_in_flight, interruptions=interruptions, inputs=q
    )
    bus.subscribe(pipeline.on_event)
    return pipeline


def _interruptions(args: argparse.Namespace, bus: EventBus, replies: RepliesInFlight) -> Interruptions | None:
    """The judge of speech during a reply (None: ``--interrupt_response false`` or
    ``--resume_within_ms 0``, where speech cancels the reply at once)."""
    if args.interrupt_response and args.resume_within_ms > 0:
        return Interruptions(bus, replies, args.resume_within_ms)
    return None


def _backend_stage(
    args: argparse.Namespace,
    stage: str,
    name: str,
    inq: StageQueue,
    outq: StageQueue,
    device: str,
    common: dict[str, Any],
    thread_name: str,
) -> BaseHandler:
    """The ``stage`` handler of backend ``name``, configured from ``args`` (its own config copy)."""
    backend = get_backend(stage, name)
    handler_cls = backend.load_handler_class()
    config = copy.deepcopy(config_from_args(backend.config_cls, args))
    return handler_cls(input_queue=inq, output_queue=outq, config=config, device=device, name=thread_name, **common)


def _reply_stages(
    args: argparse.Namespace,
    transcripts: StageQueue,
    llm_out: StageQueue,
    tts_inputs: StageQueue,
    audio_out: StageQueue,
    device: str,
    common: dict[str, Any],
    prefix: str = "",
) -> list[BaseHandler]:
    """LLM → LM output → TTS, as both modes wire them (threads ``llm:<backend>`` or ``<prefix>:llm``)."""

    def named(stage: str, backend: str) -> str:
        return f"{prefix}:{stage}" if prefix else f"{stage}:{backend}" if backend else stage

    return [
        _backend_stage(
            args, "llm", args.llm_backend, transcripts, llm_out, device, common, named("llm", args.llm_backend)
        ),
        LMOutputProcessor(input_queue=llm_out, output_queue=tts_inputs, name=named("lm_output", ""), **common),
        _backend_stage(args, "tts", args.tts, tts_inputs, audio_out, device, common, named("tts", args.tts)),
    ]


_NO_DEVICE_HINT = (
    "on a machine without audio devices use --input_audio FILE or --input_text TEXT, with --output_audio out.wav"
)


def _require(check: Callable[[int], Any], sample_rate: int) -> None:
    try:
        check(sample_rate)
    except AudioDeviceError as exc:
        raise PipelineError(f"{exc}; {_NO_DEVICE_HINT}") from None


def _make_sink(
    args: argparse.Namespace, queue_in: StageQueue, clock: StreamClock, common: dict[str, Any]
) -> BaseHandler:
    if args.output_audio:
        return FileSink(input_queue=queue_in, path=args.output_audio, clock=clock, name="sink:file", **common)
    if not (args.input_audio or args.input_text):
        _require(check_output_device, SPEAKER_RATE)
        return SpeakerSink(input_queue=queue_in, sample_rate=SPEAKER_RATE, name="sink:speaker", **common)
    try:
        check_output_device(SPEAKER_RATE)
    except AudioDeviceError as exc:
        logger.warning("%s: the assistant's audio is discarded (use --output_audio out.wav to keep it)", exc)
        return NullSink(input_queue=queue_in, name="sink:null", **common)
    return SpeakerSink(input_queue=queue_in, sample_rate=SPEAKER_RATE, name="sink:speaker", **common)
