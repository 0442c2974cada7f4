"""Wiring stages into a running pipeline: one builder for every mode.

:func:`build` wires ``VAD → STT → LLM → LM output → TTS`` between the two :class:`Ends` of a
mode (what feeds the pipeline, what plays its replies), with that mode's :class:`Features`.
Local mode is one pair of ends (:func:`local_ends`: microphone, file or typed text in; speaker
or file out; :func:`build_pipeline` builds it); a realtime session, over WebSocket or WebRTC,
is another (no source stage, the client's sink; see
:class:`~speech_to_speech.realtime.session.RealtimeSession`).
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import EventBus
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.llm.output import LMOutputProcessor
from speech_to_speech.llm.prefetch import PrefetchCoordinator
from speech_to_speech.pipeline.cli import config_from_args
from speech_to_speech.pipeline.registry import Backend, get_backend
from speech_to_speech.pipeline.running import Pipeline, PipelineError, Stages
from speech_to_speech.speech.audio_io import (
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
from speech_to_speech.speech.echo_cancel import EchoCanceller, EchoCancellerUnavailable
from speech_to_speech.speech.playback import PlaybackReference
from speech_to_speech.turns.background import BackgroundGate
from speech_to_speech.turns.echo import EchoGate
from speech_to_speech.turns.interruptions import Interruptions, TurnJudge
from speech_to_speech.turns.replies import RepliesInFlight
from speech_to_speech.turns.speculation import HoldUntilConfirmed
from speech_to_speech.turns.turn_detection import resolve_turn_detection
from speech_to_speech.turns.vad import SAMPLE_RATE

__all__ = [
    "LOCAL",
    "QUEUE_SIZES",
    "SESSION",
    "SESSION_QUEUE_SIZES",
    "Ends",
    "Features",
    "Pipeline",
    "PipelineError",
    "Shared",
    "Stages",
    "backend_names",
    "build",
    "build_pipeline",
    "local_ends",
    "resolve_device",
]

logger = logging.getLogger(__name__)

#: playback rate of the speaker sink, Hz (TTS audio is resampled once, here)
SPEAKER_RATE = 24_000
#: silence fed after an input file, on top of --min_silence_ms, seconds
FILE_TAIL_SILENCE_S = 0.5
#: queue capacities (items) between stages, by the queue's name (its items: audio → VAD,
#: segments → STT, heard → the interruption judge, transcripts → LLM, llm_out → LM output,
#: tts_inputs → TTS, audio_out → the speculation hold (else the sink), confirmed → the sink)
QUEUE_SIZES = {
    "audio": 256,
    "segments": 8,
    "heard": 8,
    "transcripts": 8,
    "llm_out": 32,
    "tts_inputs": 32,
    "audio_out": 64,
    "confirmed": 64,
}
#: queue capacities of a realtime session: a client may send audio faster than real time, and its
#: requests go on the STT's queue without waiting (a full queue is an error for the client)
SESSION_QUEUE_SIZES = {**QUEUE_SIZES, "audio": 512, "segments": 16, "heard": 16, "transcripts": 16, "llm_out": 64}
SESSION_QUEUE_SIZES |= {"tts_inputs": 64, "audio_out": 128, "confirmed": 128}

#: the model stages, in data-flow order, and the flag that names each one's backend
BACKEND_FLAGS = {"vad": "vad", "stt": "stt", "llm": "llm_backend", "tts": "tts"}


# -- what a mode is: its features and its two ends -------------------------------------------------
@dataclass(frozen=True)
class Features:
    """What a pipeline does beyond passing items from stage to stage; one per mode.

    The turn-taking features (all but ``prefetch``) act on speech input: with typed input there
    is no VAD or STT, and they do nothing.

    Attributes:
        speculative_turns: the VAD sends a turn on at a short pause (``--speculative_silence_ms``);
            the LLM pauses after each output of an unconfirmed turn and its audio waits in front
            of the sink until the endpoint confirms it (:mod:`~speech_to_speech.turns.speculation`).
        smart_turn: the VAD ends turns with the end-of-turn model of ``--turn_detection``
            (:mod:`~speech_to_speech.turns.turn_detection`), checked before anything loads.
        interruption_judge: speech during a reply pauses it and its words decide
            (:mod:`~speech_to_speech.turns.interruptions`), unless ``--interrupt_response false`` or
            ``--resume_within_ms 0`` (then speech cancels the reply at once).
        prefetch: the LLM generates the follow-up to tool results ahead, for the client's next
            ``response.create`` to claim (:mod:`~speech_to_speech.llm.prefetch`).
    """

    speculative_turns: bool
    smart_turn: bool
    interruption_judge: bool
    prefetch: bool


#: local mode: microphone, file or typed text in; speaker or file out
LOCAL = Features(
    speculative_turns=True,
    smart_turn=True,
    interruption_judge=True,
    # nothing runs tool calls here (no client), so no follow-up to tool results ever comes
    prefetch=False,
)
#: a realtime session, over WebSocket or WebRTC
SESSION = Features(
    # as in local mode; a response begun at a pause is announced (response.created) only once the
    # endpoint confirms its turn, and never when the user speaks on (RealtimeSession._on_response_event)
    speculative_turns=True,
    # as in local mode (a session starts with semantic_vad: SessionConfig.from_args); the client may
    # switch to server_vad (silence) per session (BaseVADHandler.set_eagerness)
    smart_turn=True,
    interruption_judge=True,
    prefetch=True,
)


@dataclass(frozen=True)
class Shared:
    """What the stages of one pipeline share.

    Attributes:
        stop_event: set to stop every stage.
        gate: the validity gate.
        bus: where events are published.
        clock: the stream clock (a source's time zero, for the sink's timing).
    """

    stop_event: threading.Event
    gate: Gate
    bus: EventBus
    clock: StreamClock

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments every stage takes from it (``stop_event``, ``gate``, ``bus``)."""
        return {"stop_event": self.stop_event, "gate": self.gate, "bus": self.bus}


#: builds an end stage from its queue (the source's output, the sink's input) and what stages share
EndFactory = Callable[[StageQueue, Shared], BaseHandler]


@dataclass(frozen=True)
class Ends:
    """The two ends of a pipeline: what feeds it and what plays (or sends) its replies.

    Attributes:
        sink: builds the last stage from the TTS's output queue.
        source: builds the first stage from its output queue (the VAD's input, or the LLM's
            when ``speech_input`` is False); None: the caller feeds the pipeline through
            :attr:`Pipeline.inputs` (a realtime session).
        speech_input: the input is audio (VAD → STT in front of the LLM); False: typed turns
            only (no VAD or STT: the ``"typed"`` queue is the LLM's).
        queue_sizes: capacity of each queue, by name (see :data:`QUEUE_SIZES`).
        thread_prefix: threads are named ``f"{thread_prefix}:{role}"`` (a session's id);
            "": ``role:backend`` (``lm_output`` alone).
        playback: the sink's voice as the user hears it, when their microphone can hear it too
            (a speaker, a WebRTC call): the VAD sets its echo aside
            (:class:`~speech_to_speech.turns.echo.EchoGate`); None: no echo (a file, a WebSocket
            client, whose playback the server does not see).
        raw_input: the input is a raw microphone, not cleaned of the voice's echo by its client
            (local mode's); ``--echo_cancel auto`` cancels the echo only then (a browser on a
            WebRTC call cancels its own).
    """

    sink: EndFactory
    source: EndFactory | None = None
    speech_input: bool = True
    queue_sizes: Mapping[str, int] = field(default_factory=lambda: dict(QUEUE_SIZES))
    thread_prefix: str = ""
    playback: PlaybackReference | None = None
    raw_input: bool = False


@functools.cache
def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"``, ``"mps"`` or ``"cpu"`` by what torch sees (once per process)."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


# -- the builder ----------------------------------------------------------------------------
def build(args: argparse.Namespace, ends: Ends, features: Features, bus: EventBus | None = None) -> Pipeline:
    """Build (but do not start) the pipeline between ``ends`` with ``features``, for every mode.

    Stages: the source (if any), VAD and STT (speech input only), the interruption judge (with
    ``interruption_judge``), LLM, LM output, TTS, the speculation hold (with
    ``speculative_turns``), the sink. Every backend is looked up and imported, and with
    ``smart_turn`` the end-of-turn model checked, before any stage is built. Each stage gets its
    collaborators (the speculative turns, the interruption judge, the prefetch coordinator) as
    constructor arguments; the queues between them are plain :class:`StageQueue` s. The pipeline
    subscribes to ``bus`` for barge-in (:meth:`Pipeline.on_event`).

    Args:
        args: the parsed command line (backends and their settings, ``--device``).
        ends: what feeds the pipeline and what plays its replies.
        features: what the mode does (:data:`LOCAL`, :data:`SESSION`).
        bus: where events are published (a new one if None).

    Raises:
        UnknownBackendError, BackendUnavailableError: a bad backend selection.
        PipelineError: a bad ``--turn_detection``, or a missing audio device (local mode).
    """
    backends = _backends(args, ends.speech_input)
    turn_taking = ends.speech_input  # the turn-taking features need the VAD
    if turn_taking and features.smart_turn:
        try:  # an unknown mode, or smart_turn without its model, fails before anything loads
            resolve_turn_detection(args.turn_detection)
        except (ValueError, FileNotFoundError) as exc:
            raise PipelineError(str(exc)) from None
    device = resolve_device(args.device)
    shared = Shared(threading.Event(), Gate(), bus or EventBus(), StreamClock())
    # speculative turns: the LLM pauses after each output of an unconfirmed turn, and its audio
    # waits in front of the sink (the "hold" stage) until the VAD confirms the endpoint
    speculation = SpeculativeTurns(shared.gate) if turn_taking and features.speculative_turns else None
    # replies in flight: one cancelled before any of its audio was played leaves no text in history
    # the pipeline's own book-keeping (a reply cut before any audio leaves no text); the VAD and the
    # judge keep their own views, from messages
    replies = RepliesInFlight(shared.bus) if turn_taking else None
    # speech during a reply pauses it; its transcript is judged on its way to the LLM (TurnJudge)
    # the input can hear the sink's voice: the VAD sets its echo aside and the judge knows its words
    echo_reference = ends.playback if args.echo_gate else None
    judge = features.interruption_judge and args.interrupt_response and args.resume_within_ms > 0
    interruptions = None
    if judge and replies is not None:
        hears_voice = echo_reference is not None
        interruptions = Interruptions(shared.bus, args.resume_within_ms, hears_voice=hears_voice)
    names = ("audio", "segments") if ends.speech_input else ()
    names += ("heard",) if interruptions is not None else ()
    names += ("transcripts", "llm_out", "tts_inputs", "audio_out")
    names += ("confirmed",) if speculation is not None else ()
    queues = {name: StageQueue(ends.queue_sizes[name]) for name in names}
    # typed turns and client requests enter one way: the queue after the VAD (the STT's, where they
    # keep their place after the speech before them; the LLM's when there is no speech input)
    queues["typed"] = queues["segments" if ends.speech_input else "transcripts"]

    def model_stage(role: str, inq: str, outq: str, **collaborators: Any) -> BaseHandler:
        backend = backends[role]
        config = copy.deepcopy(config_from_args(backend.config_cls, args))
        return backend.load_handler_class()(
            input_queue=queues[inq],
            output_queue=queues[outq],
            config=config,
            device=device,
            name=_thread_name(ends.thread_prefix, role, backend.name),
            **shared.kwargs,
            **collaborators,
        )

    stages: dict[str, BaseHandler] = {}
    if ends.source is not None:
        stages["source"] = ends.source(queues["audio" if ends.speech_input else "typed"], shared)
    if ends.speech_input:
        stages["vad"] = model_stage(
            "vad",
            "audio",
            "segments",
            speculation=speculation,
            interruptions=interruptions,
            semantic_turns=features.smart_turn,
            echo=EchoGate(echo_reference) if echo_reference is not None else None,
            canceller=_canceller(args, ends),
            background=_background(args, ends),
        )
        # the transcript of a pause the end-of-turn model judged unfinished may still read finished:
        # the STT tells the VAD, at the head of its input queue
        upstream = queues["audio"] if speculation is not None else None
        heard = "heard" if interruptions is not None else "transcripts"
        stages["stt"] = model_stage("stt", "segments", heard, speculation=speculation, upstream=upstream)
        if interruptions is not None:  # a transcript of speech during a reply is judged here
            stages["judge"] = TurnJudge(
                input_queue=queues["heard"],
                output_queue=queues["transcripts"],
                interruptions=interruptions,
                name=_thread_name(ends.thread_prefix, "judge", ""),
                **shared.kwargs,
            )
    prefetch = PrefetchCoordinator() if features.prefetch else None
    stages["llm"] = model_stage("llm", "transcripts", "llm_out", prefetch=prefetch, speculation=speculation)
    lm_output_name = _thread_name(ends.thread_prefix, "lm_output", "")
    stages["lm_output"] = LMOutputProcessor(
        input_queue=queues["llm_out"], output_queue=queues["tts_inputs"], name=lm_output_name, **shared.kwargs
    )
    stages["tts"] = model_stage("tts", "tts_inputs", "audio_out")
    if speculation is not None:  # a speculative turn's audio waits here for its endpoint
        stages["hold"] = HoldUntilConfirmed(
            input_queue=queues["audio_out"],
            output_queue=queues["confirmed"],
            turns=speculation,
            name=_thread_name(ends.thread_prefix, "hold", ""),
            **shared.kwargs,
        )
    stages["sink"] = ends.sink(queues["confirmed" if speculation is not None else "audio_out"], shared)
    pipeline = Pipeline(
        Stages(stages),
        shared.stop_event,
        shared.gate,
        shared.bus,
        shared.clock,
        speculation=speculation,
        replies=replies,
        interruptions=interruptions,
        inputs=queues,
    )
    shared.bus.subscribe(pipeline.on_event)
    return pipeline


def build_pipeline(args: argparse.Namespace, bus: EventBus | None = None) -> Pipeline:
    """Build (but do not start) local mode's pipeline as ``args`` describe it: :func:`build`
    with :func:`local_ends` and :data:`LOCAL`.

    Raises:
        UnknownBackendError, BackendUnavailableError: bad backend selection.
        PipelineError: no microphone for live mode; a bad ``--turn_detection``.
    """
    return build(args, local_ends(args), LOCAL, bus)


def backend_names(args: argparse.Namespace, speech_input: bool = True) -> dict[str, str]:
    """The backend each model stage uses, by role (VAD and STT with speech input only)."""
    roles = [role for role in BACKEND_FLAGS if speech_input or role not in ("vad", "stt")]
    return {role: getattr(args, BACKEND_FLAGS[role]) for role in roles}


def _backends(args: argparse.Namespace, speech_input: bool) -> dict[str, Backend]:
    """The backend of each model stage, looked up and its handler imported: the one check of
    the backend selection (a bad name or a missing dependency fails here, before any stage exists).

    Raises:
        UnknownBackendError, BackendUnavailableError: see :mod:`speech_to_speech.pipeline.registry`.
    """
    backends = {role: get_backend(role, name) for role, name in backend_names(args, speech_input).items()}
    for backend in backends.values():
        backend.load_handler_class()
    return backends


def _thread_name(prefix: str, role: str, backend: str) -> str:
    """``prefix:role`` (a session's threads), else ``role:backend`` (or ``role`` without a backend)."""
    if prefix:
        return f"{prefix}:{role}"
    return f"{role}:{backend}" if backend else role


# -- local mode's ends ---------------------------------------------------------------------
def local_ends(args: argparse.Namespace) -> Ends:
    """Local mode's ends, as ``args`` describe them.

    In: ``--input_text`` (typed turns, straight to the LLM), ``--input_audio`` (a WAV file at
    ``--input_speed``), else the microphone. Out: ``--output_audio`` (a WAV file), else the
    speaker; with file or typed input and no speaker, the audio is discarded with a warning.
    The audio devices are checked when the ends are built (:func:`build`), not here.
    """

    def text_source(queue: StageQueue, shared: Shared) -> BaseHandler:
        texts = list(args.input_text)
        return TextSource(output_queue=queue, texts=texts, clock=shared.clock, name="source:text", **shared.kwargs)

    def file_source(queue: StageQueue, shared: Shared) -> BaseHandler:
        return FileSource(
            output_queue=queue,
            path=args.input_audio,
            clock=shared.clock,
            speed=args.input_speed,
            # a microphone keeps hearing the room after the last word; so does the file
            tail_silence_s=FILE_TAIL_SILENCE_S + args.min_silence_ms / 1000,
            name="source:file",
            **shared.kwargs,
        )

    def microphone(queue: StageQueue, shared: Shared) -> BaseHandler:
        _require(check_input_device, SAMPLE_RATE)
        return MicrophoneSource(output_queue=queue, clock=shared.clock, name="source:microphone", **shared.kwargs)

    # live mode: the microphone may hear the speaker, so the VAD gets what the speaker played
    live = not (args.input_text or args.input_audio or args.output_audio)
    playback = PlaybackReference() if live else None

    def sink(queue: StageQueue, shared: Shared) -> BaseHandler:
        return _make_sink(args, queue, shared, playback)

    if args.input_text:
        return Ends(sink, text_source, speech_input=False)
    return Ends(sink, file_source if args.input_audio else microphone, playback=playback, raw_input=live)


def _canceller(args: argparse.Namespace, ends: Ends) -> EchoCanceller | None:
    """The input's echo canceller and noise suppression (``--echo_cancel``, ``--noise_suppression``).

    Raises:
        PipelineError: ``--echo_cancel`` is not auto, true or false; or the livekit wheel is
            missing for a setting that asked for it explicitly (auto without it only warns).
    """
    wanted = str(args.echo_cancel).lower()
    if wanted not in ("auto", "true", "false"):
        raise PipelineError(f"--echo_cancel must be auto, true or false, not {args.echo_cancel!r}")
    cancel = ends.playback is not None and (wanted == "true" or (wanted == "auto" and ends.raw_input))
    if not (cancel or args.noise_suppression):
        return None
    try:
        return EchoCanceller(ends.playback if cancel else None, noise_suppression=args.noise_suppression)
    except EchoCancellerUnavailable as exc:
        if wanted == "auto" and not args.noise_suppression:
            logger.warning("%s; the echo gate alone keeps the voice's echo out", exc)
            return None
        raise PipelineError(str(exc)) from None


def _background(args: argparse.Namespace, ends: Ends) -> BackgroundGate | None:
    """The VAD's background gate (``--background_gate``; ``auto``: on a raw microphone in a room).

    Raises:
        PipelineError: ``--background_gate`` is not auto, true or false.
    """
    wanted = str(args.background_gate).lower()
    if wanted not in ("auto", "true", "false"):
        raise PipelineError(f"--background_gate must be auto, true or false, not {args.background_gate!r}")
    if wanted == "false" or (wanted == "auto" and not ends.raw_input):
        return None
    return BackgroundGate()


_NO_DEVICE_HINT = (
    "on a machine without audio devices use --input_audio FILE or --input_text TEXT, with --output_audio out.wav"
)


def _require(check: Callable[[int], Any], sample_rate: int) -> None:
    try:
        check(sample_rate)
    except AudioDeviceError as exc:
        raise PipelineError(f"{exc}; {_NO_DEVICE_HINT}") from None


def _make_sink(
    args: argparse.Namespace, queue_in: StageQueue, shared: Shared, playback: PlaybackReference | None = None
) -> BaseHandler:
    common = shared.kwargs
    if args.output_audio:
        return FileSink(input_queue=queue_in, path=args.output_audio, clock=shared.clock, name="sink:file", **common)
    if not (args.input_audio or args.input_text):
        _require(check_output_device, SPEAKER_RATE)
        return SpeakerSink(
            input_queue=queue_in, sample_rate=SPEAKER_RATE, reference=playback, name="sink:speaker", **common
        )
    try:
        check_output_device(SPEAKER_RATE)
    except AudioDeviceError as exc:
        logger.warning("%s: the assistant's audio is discarded (use --output_audio out.wav to keep it)", exc)
        return NullSink(input_queue=queue_in, name="sink:null", **common)
    return SpeakerSink(input_queue=queue_in, sample_rate=SPEAKER_RATE, name="sink:speaker", **common)
