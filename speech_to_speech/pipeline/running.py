"""The running pipeline: its stages by role, start and stop, barge-in.

:func:`speech_to_speech.pipeline.builder.build` builds a :class:`Pipeline`; everything after that
(loading the models in parallel, starting the source last, flushing stale work and cutting
playback on a barge-in, stopping in order) is here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, overload

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import (
    BargeIn,
    Event,
    EventBus,
    ReplyPaused,
    ReplyResumed,
    ResponseInterrupted,
    SpeechStarted,
    ToolCallReady,
    TurnSuperseded,
)
from speech_to_speech.core.handler import BaseHandler, StageControl
from speech_to_speech.core.messages import ControlMessage, Flush, Interrupt, Pause, Resume
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.llm.upstream import CommitToolCall, CutToHeard
from speech_to_speech.pipeline.registry import get_backend
from speech_to_speech.speech.audio_io import AudioDeviceError, StreamClock
from speech_to_speech.turns.interruptions import Interruptions, JudgeEvent, ReplyProgress
from speech_to_speech.turns.replies import RepliesInFlight

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=BaseHandler)


class PipelineError(RuntimeError):
    """The pipeline could not be built or started (bad input, missing device, model failed)."""


class Stages(Sequence[BaseHandler]):
    """A pipeline's stages in data-flow order, each under its role.

    Roles: ``source`` (none when the caller feeds the pipeline), ``vad`` and ``stt`` (none for
    typed input), ``judge`` (the interruption judge, where it is on), ``llm``, ``lm_output``,
    ``tts``, ``hold`` (the speculation hold, where turns are sent on speculatively), ``sink``.
    Positions and iteration follow the data flow; a role finds its stage wherever it is
    (:meth:`get`, :meth:`Pipeline.stage`).

    Args:
        by_role: the stages under their roles, in data-flow order.
    """

    def __init__(self, by_role: Mapping[str, BaseHandler]) -> None:
        self._roles = list(by_role)
        self._stages = list(by_role.values())

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles present, in data-flow order."""
        return tuple(self._roles)

    def get(self, role: str) -> BaseHandler | None:
        """The stage in ``role``, or None when the pipeline has none."""
        return self._stages[self._roles.index(role)] if role in self._roles else None

    def items(self) -> list[tuple[str, BaseHandler]]:
        """(role, stage) pairs in data-flow order."""
        return list(zip(self._roles, self._stages, strict=True))

    @overload
    def __getitem__(self, index: int) -> BaseHandler: ...
    @overload
    def __getitem__(self, index: slice) -> list[BaseHandler]: ...
    def __getitem__(self, index: int | slice) -> BaseHandler | list[BaseHandler]:
        return self._stages[index]

    def __len__(self) -> int:
        return len(self._stages)

    def __iter__(self) -> Iterator[BaseHandler]:
        return iter(list(self._stages))


@dataclass
class Pipeline:
    """A chain of started-or-not stages sharing one stop event, gate and bus.

    Attributes:
        stages: the stages by role, in data-flow order.
    """

    stages: Stages
    stop_event: threading.Event
    gate: Gate
    bus: EventBus
    clock: StreamClock
    #: unconfirmed speculative turns, whose output the queues hold (None: no speculation)
    speculation: SpeculativeTurns | None = None
    #: the replies in flight (None: not tracked, e.g. typed input)
    replies: RepliesInFlight | None = None
    #: judges user speech during a reply (None: speech cancels the reply at once)
    interruptions: Interruptions | None = None
    #: the queues by name (see :data:`~speech_to_speech.pipeline.builder.QUEUE_SIZES`): where a caller feeds
    #: a pipeline that has no source stage (a session puts audio on ``"audio"``, typed turns and requests
    #: on ``"typed"``: the STT's queue, or the LLM's without speech input, as local mode's typed turns)
    inputs: dict[str, StageQueue] = field(default_factory=dict)

    @overload
    def stage(self, role: str) -> BaseHandler: ...
    @overload
    def stage(self, role: str, kind: type[S]) -> S: ...
    def stage(self, role: str, kind: type[BaseHandler] = BaseHandler) -> BaseHandler:
        """The stage in ``role`` (see :class:`Stages`), checked to be a ``kind``.

        Raises:
            KeyError: the pipeline has no stage in that role (typed input has no ``"vad"``).
            TypeError: the stage is not a ``kind``.
        """
        found = self.stages.get(role)
        if found is None:
            raise KeyError(f"no {role!r} stage (the pipeline has {', '.join(self.stages.roles)})")
        if not isinstance(found, kind):
            raise TypeError(f"the {role!r} stage is a {type(found).__name__}, not a {kind.__name__}")
        return found

    @property
    def source(self) -> BaseHandler | None:
        """The stage that feeds the pipeline, started last (None: the caller feeds :attr:`inputs`)."""
        return self.stages.get("source")

    @property
    def sink(self) -> BaseHandler:
        """The last stage, which plays or sends the replies."""
        return self.stage("sink")

    def start(
        self,
        setup_timeout_s: float | None = None,
        on_ready: Callable[[str, float], None] | None = None,
        on_loaded: Callable[[], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, float]:
        """Start every stage but the source, wait until all have loaded, then start the source (if any).

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
        loading = [stage for role, stage in self.stages.items() if role != "source"]
        for stage in loading:
            stage.start()
        pending = list(loading)
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
        failed = [s for s in loading if s.setup_error is not None]
        if failed or self.stop_event.is_set():
            self.stop()
            if failed:
                raise PipelineError(_describe(failed[0].setup_error) + _install_hint(failed[0]))
            raise PipelineError("stopped while loading models")
        loaded = {s.name: s.load_seconds for s in loading}
        if on_loaded is not None:
            on_loaded()
        if self.source is not None:
            self.source.start()
        return loaded

    def wait(self, poll_s: float = 0.2) -> None:
        """Block until the sink has finished (end of input) or a stop was requested."""
        while self.sink.is_alive() and not self.stop_event.is_set():
            self.sink.join(poll_s)
        if self.source is not None and self.source.setup_error is not None:
            raise PipelineError(_describe(self.source.setup_error))

    def on_event(self, event: Event) -> None:
        """Turn the pipeline's events into control messages, so that every stage acts in its own
        thread, in order with its data:

        - the events the interruption judge decides on (:attr:`Interruptions.EVENTS`): a
          :class:`JudgeEvent` ahead of the data in its queue, in the order they happened; a
          reply's progress (:attr:`RepliesInFlight.EVENTS`): a :class:`ReplyProgress` the same
          way to the VAD, which pauses a reply in flight at speech start;
        - speech start: an :class:`Interrupt` to every stage (barge-in), unless the speech only
          pauses the reply (the interruption judge decides): then a :class:`Pause` to the sink,
          followed by a :class:`Resume` (a backchannel) or, on a real interruption
          (:class:`BargeIn`), a cancel that keeps the user's turn and an :class:`Interrupt`;
        - a superseded speculative turn: a :class:`Flush` (its queued work is stale; none of it
          reached the sink);
        - the sink's report of what was heard of a cut reply: a :class:`CutToHeard` to the LLM;
        - a tool call going out to the client (the LM output stage's :class:`ToolCallReady`): a
          :class:`CommitToolCall` to the LLM, at the head of its queue, before the client can answer.
        """
        if self.interruptions is not None and isinstance(event, Interruptions.EVENTS):
            self.send_ahead(JudgeEvent(event))
        if self.interruptions is not None and isinstance(event, RepliesInFlight.EVENTS):
            self.send_ahead(ReplyProgress(event))
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
            self._to_every_stage(Flush())
        elif isinstance(event, ResponseInterrupted):
            self._to_llm(CutToHeard(event.turn_id, event.heard_text, event.revision))
        elif isinstance(event, ToolCallReady):
            self._to_llm(CommitToolCall(event.call_id))

    def send_ahead(self, message: StageControl) -> None:
        """Put ``message`` ahead of the data in its target stage's queue, behind the control
        messages already there (events reach a stage in the order they happened). Never blocks;
        any thread (a realtime session sends a :class:`~speech_to_speech.llm.hidden_response.DiscardFollowUp`
        this way)."""
        for stage in self.stages:
            if isinstance(stage, message.target) and stage.input_queue is not None:
                stage.input_queue.put_ahead(message)

    def _to_llm(self, message: StageControl) -> None:
        """Put ``message`` at the head of the LLM stage's queue (found by type: a hand-built chain
        has no roles)."""
        for stage in self.stages:
            if isinstance(stage, message.target) and stage.input_queue is not None:
                stage.input_queue.put_first(message)

    def interrupt(self, at: float, report_silent: bool = False, keep: list[int] | None = None) -> None:
        """Barge-in: put an :class:`Interrupt` at the head of every stage's queue.

        The work to cut must already be stale (the VAD bumps the generation on speech start; a
        session on ``response.cancel``). Each stage, in its own thread, drops the stale data
        queued for it; the sink also cuts playback at ``at`` and reports what was heard.

        Args:
            at: monotonic time the user started speaking, s.
            report_silent: the replies in flight with no audio at the sink yet were cancelled:
                publish that nothing of them was heard (a :class:`ResponseInterrupted` with no
                words), so that history keeps no text of them. The sink reports the others.
            keep: turns whose replies were not cancelled.
        """
        self._to_every_stage(Interrupt(at))
        if report_silent and self.replies is not None:
            for turn_id in self.replies.silent(other_than=set(keep or ())):
                self.bus.publish(ResponseInterrupted(turn_id, heard_text="", audio_end_ms=0.0))

    def _to_every_stage(self, message: Flush) -> None:
        """Put ``message`` at the head of every stage's input queue (the source has none)."""
        for stage in self.stages:
            if stage.input_queue is not None:
                stage.input_queue.put_first(message)

    def _to_sink(self, message: ControlMessage) -> None:
        """Put a control message on the sink's queue (in order with the audio before it)."""
        sink_queue = self.sink.input_queue
        if sink_queue is not None:
            sink_queue.put_unless_stopped(message, self.stop_event)

    def stop(self, timeout_s: float = 2.0) -> list[str]:
        """Signal every stage to stop and join them within ``timeout_s`` in total.

        Returns:
            Names of threads still alive after the timeout (normally empty).
        """
        self.stop_event.set()
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
