"""The VAD stage: per-chunk speech probabilities into user turns.

The backend (e.g. Silero) only scores fixed-size chunks; the state machine in
:mod:`speech_to_speech.turns.endpointer` decides where speech starts and ends. A turn
ends on silence (``--turn_detection silence``: ``min_silence_ms``) or, with an
end-of-turn model (:mod:`speech_to_speech.turns.turn_detection`), as soon as the model
judges the utterance complete after a short pause, else after ``turn_max_silence_ms``.

Speech that starts while a reply is in flight cancels it (barge-in), or, with
:attr:`BaseVADHandler.interruptions` given, pauses it until its words are known
(:mod:`speech_to_speech.turns.interruptions`).

Two things happen before an endpoint, to save time after it:

* a short pause (``speculative_silence_ms``) sends the turn on speculatively
  (see :mod:`speech_to_speech.turns.speculation`); the endpoint confirms it, speech
  that resumes first supersedes it with a new revision of the same turn;
* while the user speaks, the audio so far goes to the STT every
  ``partial_interval_ms`` for a partial transcript.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from speech_to_speech.core.audio import speech_end_index
from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import (
    SpeechDiscarded,
    SpeechStarted,
    SpeechStopped,
    TurnSpeculated,
    TurnSuperseded,
)
from speech_to_speech.core.handler import BaseHandler, StageControl
from speech_to_speech.core.messages import AudioChunk, PartialSpeech, SpeechSegment
from speech_to_speech.core.priority import CRITICAL
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.speech.echo_cancel import EchoCanceller, EchoCancellerUnavailable
from speech_to_speech.turns.background import BackgroundGate
from speech_to_speech.turns.echo import EchoGate
from speech_to_speech.turns.endpointer import (
    BY_MAX_SPEECH,
    CHUNK_SAMPLES,
    DEFAULT_PAUSE_MS,
    RESUMED,
    SAMPLE_RATE,
    Endpoint,
    Endpointer,
    Speculation,
)
from speech_to_speech.turns.replies import RepliesInFlight
from speech_to_speech.turns.turn_detection import (
    EAGERNESS_MAX_SILENCE_MS,
    STATEMENT_LIKELY_P,
    TurnDetector,
    TurnModelUnavailable,
    load_turn_detector,
)

if TYPE_CHECKING:
    from speech_to_speech.turns.interruptions import Interruptions

logger = logging.getLogger(__name__)

__all__ = [
    "CHUNK_SAMPLES",
    "RESUMED",
    "SAMPLE_RATE",
    "BaseVADHandler",
    "Endpoint",
    "Endpointer",
    "Speculation",
    "TranscriptEndsTurn",
    "VADConfig",
]


#: silent chunks (32 ms each) after a turn's speech at which its final STT pass is done ahead, before
#: the pause that asks the end-of-turn model (``speculative_silence_ms``, 200 ms) and the endpoint:
#: two, so that a dip between two words does not start one
AHEAD_SILENCE_CHUNKS = 3
#: input blocks whose arrival the VAD remembers, to time the end of speech by (a microphone's
#: 32 ms blocks: 8 s; the end of speech is at most the endpoint's silence before the newest)
ARRIVALS_KEPT = 256


@dataclass
class VADConfig:
    """Endpointing settings.

    Attributes:
        vad_threshold: speech probability that starts speech (0–1).
        min_silence_ms: silence that ends a turn, ms.
        min_speech_ms: shorter speech is ignored as noise, ms.
        speech_pad_ms: audio kept before speech onset and after its end, ms.
        max_speech_ms: a turn is cut here even without silence, ms.
        interrupt_response: user speech cancels the assistant's reply in flight (barge-in).
        turn_grace_ms: speech that resumes within this time after an endpoint reopens the same
            turn (a new revision, transcribed together with the earlier audio), ms; 0 disables.
        speculative_silence_ms: silence after which the turn is sent on speculatively, before
            ``min_silence_ms`` confirms it, ms; 0 disables (so does any value >= ``min_silence_ms``).
            Only where the pipeline holds unconfirmed output (local mode; not the realtime server).
        partial_interval_ms: while the user speaks, send the audio so far for a partial
            transcript every this much audio, ms; 0 disables.
        turn_detection: how a turn ends: ``"smart_turn"`` (an end-of-turn model judges each
            pause of ``speculative_silence_ms``), ``"silence"`` (``min_silence_ms``) or
            ``"auto"`` (``smart_turn`` when its model is installed). Local mode only for now.
        turn_threshold: P(complete) from the end-of-turn model that ends the turn at once (0-1).
        turn_max_silence_ms: with the model, the silence that ends a turn it judged unfinished, ms.
        turn_question_silence_ms: with the model and speculative turns, the silence that ends a turn
            it judged unfinished whose transcript at the pause is a question
            (:func:`~speech_to_speech.turns.turn_detection.transcript_ends_turn`), ms; 0: off.
        turn_statement_silence_ms: the same for a transcript that is a finished statement, ms; 0: off.
            Longer than for a question: a reader's pause after a whole sentence may still go on.
        resume_within_ms: speech during a reply pauses it; a backchannel or false start
            judged within this time (from the start of the speech, or from its end once it
            ended) resumes it, anything else cancels it, ms; 0: speech cancels the reply at
            once (no pause).
        echo_gate: where the input can hear the assistant's voice (live mode's speaker, a
            WebRTC call), set aside what its echo explains (:mod:`speech_to_speech.turns.echo`).
        echo_cancel: "auto" (the default: cancel the voice's echo where the input is a raw
            microphone that can hear it, local mode's, from the moment the voice is found in it),
            "true" (also on WebRTC calls), "false" (:mod:`speech_to_speech.speech.echo_cancel`).
        noise_suppression: WebRTC's noise suppression on the input, before VAD and STT.
        background_gate: "auto" (the default: where the input is a raw microphone in a room, local
            mode's), "true" or "false": speech no louder than the room's background, other people
            talking, is not the user's, while that background is itself speech
            (:mod:`speech_to_speech.turns.background`).
    """

    vad_threshold: float = 0.5
    min_silence_ms: int = 500
    min_speech_ms: int = 250
    speech_pad_ms: int = 200
    max_speech_ms: int = 30_000
    interrupt_response: bool = True
    turn_grace_ms: int = 700
    speculative_silence_ms: int = 200
    partial_interval_ms: int = 500
    turn_detection: str = "auto"
    turn_threshold: float = 0.7
    turn_max_silence_ms: int = 2000
    turn_question_silence_ms: int = 500
    turn_statement_silence_ms: int = 1000
    resume_within_ms: int = 1500
    echo_gate: bool = True
    echo_cancel: str = "auto"
    noise_suppression: bool = False
    background_gate: str = "auto"


class BaseVADHandler(BaseHandler):
    """Consumes 16 kHz :class:`AudioChunk`, emits one :class:`SpeechSegment` per user turn.

    Incoming audio of any block size is re-blocked into :data:`CHUNK_SAMPLES`
    chunks. Backends implement :meth:`load` and :meth:`speech_probability`.

    When speech starts, the cancel scope is bumped (barge-in: every reply in
    flight becomes stale) unless ``interrupt_response`` is off, or, with
    :attr:`interruptions` set and a reply to another turn in flight, the reply is
    paused instead (``SpeechStarted.pauses_reply``): its words decide. Speech that
    resumes within ``turn_grace_ms`` of an endpoint reopens that turn as a new
    revision; its segment holds the earlier audio too, so the transcript is whole. Once
    the turn's reply is audible it is not reopened: speech then pauses the reply like any
    (the reply's own echo, before the canceller has found it, must not cancel it).

    With :attr:`speculation` set (the pipeline holds unconfirmed output), a pause of
    ``speculative_silence_ms`` sends a ``speculative`` segment at once and publishes
    :class:`TurnSpeculated`; the endpoint then confirms it (no second segment, only
    :class:`SpeechStopped`), or speech that resumes first supersedes it: a new
    revision of the turn, :class:`TurnSuperseded`, and the endpoint sends that.

    While speech goes on, :class:`PartialSpeech` with the audio so far is sent every
    ``partial_interval_ms`` of audio, only when the STT has nothing waiting.

    With :attr:`echo` set (the user's microphone can hear the assistant's voice), each chunk's
    score goes through the echo gate first: a chunk the voice just played can explain scores 0.
    With :attr:`background` set (a microphone in a room), a chunk must also stand out from the
    room's background level to be speech (:mod:`speech_to_speech.turns.background`): a television
    or other people talking further away are not the user.
    With :attr:`canceller` set, every input block is cleaned of the voice's echo (and of noise)
    before anything else sees it: the VAD, the end-of-turn model and the STT.

    With :attr:`semantic_turns` set, :meth:`setup` loads the end-of-turn model of
    ``turn_detection``; at each pause it judges the utterance first: "complete" endpoints
    at once (a plain segment, nothing to hold), "unfinished" sends the turn on
    speculatively and waits up to ``turn_max_silence_ms``.

    Args:
        config: the VAD's settings.
        device: where the backend runs.
        speculation: where unconfirmed turns are held (None: no speculative turns).
        interruptions: the judge of speech during a reply (None: speech cancels the reply).
        semantic_turns: end turns with the model of ``config.turn_detection`` (False: on silence).
        echo: sets aside the echo of the assistant's voice (None: the input cannot hear it).
        canceller: the input's echo canceller and noise suppression (None: the input as it comes).
        background: sets aside speech no louder than the room's background, other people talking
            (None: every chunk the model scores as speech is the user's).
        *args, **kwargs: the :class:`~speech_to_speech.core.handler.BaseHandler` arguments.
    """

    def __init__(
        self,
        *args: object,
        config: VADConfig,
        device: str = "cpu",
        speculation: SpeculativeTurns | None = None,
        interruptions: Interruptions | None = None,
        semantic_turns: bool = False,
        echo: EchoGate | None = None,
        canceller: EchoCanceller | None = None,
        background: BackgroundGate | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device
        self.endpointer = Endpointer(config)
        self._pending = np.zeros(0, dtype=np.float32)
        self._speech_end_time = 0.0  # when the last chunk the VAD called speech arrived
        #: (endpointer offset just after an input block, when it arrived), newest last
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque(maxlen=ARRIVALS_KEPT)
        self._stamp: Stamp | None = None
        self._last: tuple[Stamp, np.ndarray, int] | None = None  # last segment: stamp, audio, end offset
        self._prefix = np.zeros(0, dtype=np.float32)
        self._last_time = 0.0
        self._speculative: Stamp | None = None  # the revision sent on a pause, not yet confirmed
        self._partial_offset = 0  # endpointer offset of the last partial request
        self._start_offset = 0  # endpointer offset where the utterance in progress started
        #: answer each endpointed turn (False: only transcribe it; the client asks for responses)
        self.create_response = True
        #: where unconfirmed turns are held; None (the default) disables speculative turns
        self.speculation = speculation
        #: end turns with the model of ``config.turn_detection`` (False, the default: on silence only)
        self.semantic_turns = semantic_turns
        #: the loaded end-of-turn model (None: silence only)
        self.turn_detector: TurnDetector | None = None
        #: judges speech during a reply (None, the default: speech cancels the reply at once)
        self.interruptions = interruptions
        #: the replies in flight, as :class:`~speech_to_speech.turns.interruptions.ReplyProgress` tells this stage
        self.replies = RepliesInFlight()
        self._turn_probability: float | None = None  # the model's last verdict on this utterance
        self._during_reply = False  # the utterance in progress paused a reply
        #: sets aside the echo of the assistant's voice (None, the default: no echo possible)
        self.echo = echo
        #: cleans the input of the voice's echo and of noise first (None, the default: raw input)
        self.canceller = canceller
        #: sets aside other people's speech, no louder than the room (None, the default: all speech)
        self.background = background

    def setup(self) -> None:
        self.load()
        if self.semantic_turns:
            self.turn_detector = load_turn_detector(self.config.turn_detection, self.config.turn_threshold)
            if self.turn_detector is not None:
                self.endpointer = Endpointer(self.config, semantic=True)

    def clean_input(self, noise_suppression: bool, echo_cancel: bool) -> None:
        """Replace the input's canceller (a realtime session's ``noise_reduction``; called in this
        stage's thread): noise suppression, and echo cancelling where the input hears the voice
        (:attr:`echo` has its reference). Without the livekit wheel the input stays raw (logged)."""
        reference = self.echo.reference if self.echo is not None and echo_cancel else None
        if self.canceller is not None:
            self.canceller.close()
        self.canceller = None
        if noise_suppression or reference is not None:
            try:
                self.canceller = EchoCanceller(reference, noise_suppression=noise_suppression)
            except EchoCancellerUnavailable as exc:
                logger.warning("noise_reduction: %s", exc)

    def set_eagerness(self, eagerness: str | None) -> None:
        """Turn detection as a realtime client asks for it (called in this stage's thread).

        Args:
            eagerness: ``semantic_vad``'s ``"low"``, ``"medium"``, ``"high"`` or ``"auto"``: end
                turns with the end-of-turn model, an unfinished one after the silence of
                :data:`~speech_to_speech.turns.turn_detection.EAGERNESS_MAX_SILENCE_MS` (high: soon);
                None (``server_vad``): on ``min_silence_ms`` of silence only. Without the
                model installed, ``semantic_vad`` also ends turns on silence (logged).
        """
        if eagerness is not None and self.turn_detector is None:
            try:
                self.turn_detector = load_turn_detector("smart_turn", self.config.turn_threshold)
            except (TurnModelUnavailable, ValueError) as exc:
                logger.warning("semantic_vad: %s; turns end on silence", exc)
        if eagerness is None or self.turn_detector is None:
            self.turn_detector = None
            self.endpointer = Endpointer(self.config)
            return
        self.config.turn_max_silence_ms = EAGERNESS_MAX_SILENCE_MS.get(eagerness, EAGERNESS_MAX_SILENCE_MS["auto"])
        self.endpointer = Endpointer(self.config, semantic=True)

    def load(self) -> None:
        """Load the VAD model."""
        raise NotImplementedError

    def speech_probability(self, chunk: np.ndarray) -> float:
        """Score one :data:`CHUNK_SAMPLES`-sample float32 chunk at 16 kHz (0–1)."""
        raise NotImplementedError

    def reset_state(self) -> None:
        """Reset the model's recurrent state (between streams)."""

    def process(self, item: AudioChunk) -> Iterator[SpeechSegment | PartialSpeech]:
        if item.sample_rate != SAMPLE_RATE:
            raise ValueError(f"VAD expects {SAMPLE_RATE} Hz audio, got {item.sample_rate} Hz")
        samples = np.asarray(item.samples, dtype=np.float32)
        if self.canceller is not None:
            samples = self.canceller.process(samples, item.time)
        self._pending = np.concatenate([self._pending, samples])
        self._arrivals.append((self.endpointer.offset + len(self._pending), item.time))
        while len(self._pending) >= CHUNK_SAMPLES:
            chunk, self._pending = self._pending[:CHUNK_SAMPLES], self._pending[CHUNK_SAMPLES:]
            probability = self.speech_probability(chunk)  # always: the model's state follows the stream
            if self.echo is not None:
                probability = self.echo.filter(chunk, item.time, probability, self.endpointer.in_speech)
            if self.background is not None:
                playing = bool(self.replies.audible())
                probability = self.background.filter(chunk, probability, self.endpointer.in_speech, playing)
            result = self.endpointer.feed(chunk, probability)
            if self.endpointer.last_chunk_was_speech:
                self._speech_end_time = item.time
            if result == "start":
                self._start_turn()
            elif isinstance(result, Speculation):
                yield from self._pause(result)
            elif result == RESUMED:
                self._supersede()
            elif isinstance(result, Endpoint):
                yield from self._segment(result)
            elif result is None and not self.endpointer.in_speech and self._stamp is not None:
                # too short: noise. A reopened turn still gets its earlier words answered.
                if len(self._prefix):
                    yield from self._segment(Endpoint(np.zeros(0, dtype=np.float32), self.endpointer.offset))
                else:
                    stamp, self._stamp = self._stamp, None
                    speech_ms = 1000 * (self.endpointer.offset - self._start_offset) / SAMPLE_RATE
                    self.bus.publish(SpeechDiscarded(stamp.turn_id, speech_ms=speech_ms))
            if self._partial_due():
                yield self._partial(item.time)
            elif self._ahead_due():
                yield self._partial(item.time, ahead=True)

    def _start_turn(self) -> None:
        grace = self.config.turn_grace_ms * SAMPLE_RATE // 1000
        recent = self._last is not None and time.monotonic() - self._last_time <= self.config.turn_grace_ms / 1000
        # both the audio and the wall clock must agree the pause was short (a client may stop sending)
        reopens = self._last is not None and recent and self.endpointer.offset - self._last[2] <= grace
        if reopens and self._last is not None and self.interruptions is not None:
            # its reply already plays: speech now is judged over it (words interrupt; its own echo does not)
            reopens = self._last[0].turn_id not in self.replies.audible()
        pauses = False
        if self.config.interrupt_response:
            reopened = self._last[0].turn_id if reopens and self._last is not None else None
            # a reply to another turn is in flight: pause it, the words will decide; else barge in
            pauses = self.interruptions is not None and bool(self.replies.turns(other_than=reopened))
            if not pauses:
                self.gate.scope.cancel()  # barge-in: whatever is in flight is stale from now on
            else:  # a blip (the voice's echo, a click) gives the reply back soon
                self.endpointer.drop_short_after()
        self._turn_probability = None
        self._start_offset = self.endpointer.offset
        self._during_reply = pauses or (reopens and self._during_reply)
        if reopens and self._last is not None:
            previous, audio, _ = self._last
            self._stamp = self.gate.stamp(previous.turn_id, self.gate.turns.revise(previous.turn_id))
            self._prefix = audio
        else:
            self._stamp = self.gate.new_turn_stamp()
            self._prefix = np.zeros(0, dtype=np.float32)
        self._partial_offset = self.endpointer.offset
        start_ms = 1000 * max(0, self.endpointer.offset - CHUNK_SAMPLES) / SAMPLE_RATE
        self.bus.publish(
            SpeechStarted(
                self._stamp.turn_id,
                revision=self._stamp.revision,
                audio_ms=start_ms,
                pauses_reply=pauses,
                barge_in=self.config.interrupt_response and not pauses,
            )
        )

    # -- partial transcripts ---------------------------------------------------------------
    def _partial_due(self) -> bool:
        """Speech goes on, enough new audio since the last request, and the STT has nothing waiting."""
        interval = self.config.partial_interval_ms * SAMPLE_RATE // 1000
        return (
            interval > 0
            and self._stamp is not None
            and self.endpointer.in_speech
            and self.endpointer.last_chunk_was_speech
            and self.endpointer.offset - self._partial_offset >= interval
            and (self.output_queue is None or self.output_queue.empty())
        )

    def _ahead_due(self) -> bool:
        """The speech of a turn long enough stopped :data:`AHEAD_SILENCE_CHUNKS` chunks ago, partial
        transcripts are on, the STT has nothing waiting and no reply plays: time for the final
        pass, done ahead of the endpoint (see :class:`~speech_to_speech.core.messages.PartialSpeech`)."""
        return (
            self.config.partial_interval_ms > 0
            and self._stamp is not None
            and not self._during_reply  # that speech's final pass is another one (a backchannel's)
            and self.endpointer.silent_run == AHEAD_SILENCE_CHUNKS
            and self.endpointer.long_enough
            and (self.output_queue is None or self.output_queue.empty())
        )

    def _partial(self, now: float, ahead: bool = False) -> PartialSpeech:
        assert self._stamp is not None
        self._partial_offset = self.endpointer.offset
        audio = self.endpointer.utterance_audio()
        samples = np.concatenate([self._prefix, audio]) if len(self._prefix) else audio
        # the next segment needs this much silence first: the pause if anything happens there, else the endpoint
        at_pause = self.turn_detector is not None or self.speculation is not None
        if at_pause and self.endpointer.speculative_chunks > 0:
            silence_ms = self.config.speculative_silence_ms or DEFAULT_PAUSE_MS
        else:
            silence_ms = self.config.min_silence_ms
        end = -1
        if ahead:  # the silence after the speech, as long as the segment's padding will be (zeros yet to come)
            end = self.endpointer.speech_end_offset
            missing = self.config.speech_pad_ms * SAMPLE_RATE // 1000 - (self.endpointer.offset - end)
            samples = np.concatenate([samples, np.zeros(max(0, missing), dtype=np.float32)])
        return PartialSpeech(self._stamp, samples, SAMPLE_RATE, now, now + silence_ms / 1000, speech_end_offset=end)

    # -- pauses: the end-of-turn model, speculative turns ----------------------------------------
    def _pause(self, pause: Speculation) -> Iterator[SpeechSegment]:
        """A short pause: the model may end the turn now; if not, send it on speculatively."""
        if self.turn_detector is not None:
            samples = np.concatenate([self._prefix, pause.samples]) if len(self._prefix) else pause.samples
            with CRITICAL.running():  # the endpoint waits for it: work done ahead gives way (and its core)
                verdict = self.turn_detector.judge(samples)
            self._turn_probability = verdict.probability
            logger.debug("end of turn: p=%.2f in %.0f ms", verdict.probability, verdict.ms)
            if verdict.complete:
                endpoint = self.endpointer.end_turn()
                if endpoint is not None:
                    yield from self._segment(endpoint)
                return
        if self.config.speculative_silence_ms > 0:
            yield from self._speculate(pause)

    def on_transcript_ends_turn(self, stamp: Stamp, question: bool) -> None:
        """The transcript of the speculative revision ``stamp`` reads finished (see
        :class:`TranscriptEndsTurn`): end its turn after ``turn_question_silence_ms`` (a question,
        or a statement the model scored at least :data:`STATEMENT_LIKELY_P`) or
        ``turn_statement_silence_ms`` of silence. Ignored when that revision is no longer the one
        waiting for its endpoint, and without an end-of-turn model (silence alone ends turns)."""
        if (
            self.turn_detector is None
            or self._speculative is None
            or (stamp.turn_id, stamp.revision)
            != (
                self._speculative.turn_id,
                self._speculative.revision,
            )
        ):
            return
        logger.debug("turn %d: its transcript reads finished (question: %s)", stamp.turn_id, question)
        config, likely = self.config, question or (self._turn_probability or 0.0) >= STATEMENT_LIKELY_P
        self.endpointer.shorten(config.turn_question_silence_ms if likely else config.turn_statement_silence_ms)

    def _speculate(self, speculation: Speculation) -> Iterator[SpeechSegment]:
        if self.speculation is None:
            return
        stamp = self._stamp or self.gate.new_turn_stamp()
        self._stamp = self._speculative = stamp
        self.speculation.open(stamp)
        samples = np.concatenate([self._prefix, speculation.samples]) if len(self._prefix) else speculation.samples
        now = time.monotonic()
        speech_end = self._speech_end(samples, speculation.end_offset, now)
        end_ms = 1000 * speculation.speech_end_offset / SAMPLE_RATE
        self.bus.publish(TurnSpeculated(stamp.turn_id, revision=stamp.revision, audio_ms=end_ms))
        yield SpeechSegment(
            stamp=stamp,
            samples=samples,
            sample_rate=SAMPLE_RATE,
            speech_end_time=speech_end,
            endpoint_time=now,
            stream_end_offset=speculation.speech_end_offset,
            respond=self.create_response,
            speculative=True,
            during_reply=self._during_reply,
        )

    def _supersede(self) -> None:
        """Speech resumed after a speculative pause: the next revision of the turn replaces it."""
        previous, self._speculative = self._speculative, None
        if previous is None:
            return
        revision = self.gate.turns.revise(previous.turn_id)  # everything of `previous` is stale now
        self._stamp = self.gate.stamp(previous.turn_id, revision)
        if self.speculation is not None:
            self.speculation.discard(previous)
        self.bus.publish(TurnSuperseded(previous.turn_id, revision=revision))

    def _speech_end(self, samples: np.ndarray, end_offset: int, now: float) -> float:
        """When the speech in an utterance's ``samples`` ended (monotonic s): the end of its last
        loud frame (:func:`~speech_to_speech.core.audio.speech_end_index`, the definition every
        benchmark reads from the input audio), timed by when that sample arrived. Falls back to
        when the last chunk the VAD called speech arrived (``end_offset`` unknown, no loud frame).

        Args:
            samples: the utterance, float32 at 16 kHz, ending at stream offset ``end_offset``.
            end_offset: the endpointer's sample index just after ``samples`` (-1: not known).
            now: the time of the endpoint (monotonic s), the latest the speech can have ended.
        """
        index = speech_end_index(samples, SAMPLE_RATE)
        if index is None or end_offset < 0:
            return self._speech_end_time or now
        offset = end_offset - (len(samples) - index)
        block: tuple[int, float] | None = None  # the block the sample arrived in: the first to end after it
        for arrival in reversed(self._arrivals):
            if arrival[0] < offset:
                break
            block = arrival
        if block is None:
            return self._speech_end_time or now
        # the block's time is its last sample's: less the samples after this one
        return min(now, block[1] - (block[0] - offset) / SAMPLE_RATE)

    # -- endpoints ---------------------------------------------------------------------------
    def on_end_of_stream(self) -> Iterator[SpeechSegment]:
        result = self.endpointer.flush()
        if isinstance(result, Endpoint):
            yield from self._segment(result)

    def _segment(self, endpoint: Endpoint) -> Iterator[SpeechSegment]:
        speculative = self._speculative
        confirmed = speculative is not None and endpoint.confirms_speculation and self.gate.admits(speculative)
        if speculative is not None and not confirmed:
            self._supersede()  # speech came back in the very chunk that ended the utterance
        stamp = self._stamp or self.gate.new_turn_stamp()
        samples = np.concatenate([self._prefix, endpoint.samples]) if len(self._prefix) else endpoint.samples
        self._stamp, self._prefix, self._speculative = None, np.zeros(0, dtype=np.float32), None
        # a cut at max_speech_ms is no pause: speech that goes on is a turn of its own, not a reopening
        # that would grow the turn past max_speech_ms without end (babble, a television)
        self._last = None if endpoint.by == BY_MAX_SPEECH else (stamp, samples, self.endpointer.offset)
        now = time.monotonic()
        self._last_time = now
        speech_end = self._speech_end(samples, endpoint.end_offset, now)
        delay_ms = (now - speech_end) * 1000
        duration_ms = 1000 * len(samples) / SAMPLE_RATE
        end_ms = 1000 * endpoint.speech_end_offset / SAMPLE_RATE
        self.bus.publish(
            SpeechStopped(
                stamp.turn_id,
                duration_ms=duration_ms,
                endpoint_delay_ms=delay_ms,
                audio_ms=end_ms,
                endpoint_by=endpoint.by,
                turn_probability=self._turn_probability,
            )
        )
        self._turn_probability = None
        if confirmed and speculative is not None and self.speculation is not None:
            self.speculation.confirm(speculative)  # its transcript and reply are on their way: release them
            return
        yield SpeechSegment(
            stamp=stamp,
            samples=samples,
            sample_rate=SAMPLE_RATE,
            speech_end_time=speech_end,
            endpoint_time=now,
            stream_end_offset=endpoint.speech_end_offset,
            respond=self.create_response,
            during_reply=self._during_reply,
        )


@dataclass
class TranscriptEndsTurn(StageControl):
    """For the VAD, from the STT (put at the head of the VAD's input queue): the transcript of the
    speculative revision ``stamp``, sent on at a pause the end-of-turn model judged unfinished,
    reads as a finished turn. Unless speech resumes first, that revision's turn then ends after
    ``turn_question_silence_ms`` or ``turn_statement_silence_ms`` of silence instead of
    ``turn_max_silence_ms``.

    Attributes:
        stamp: the speculative revision the transcript belongs to.
        question: the transcript is a question (else a finished statement).
    """

    target: ClassVar[type] = BaseVADHandler
    stamp: Stamp
    question: bool = False

    def apply(self, stage: Any) -> None:
        stage.on_transcript_ends_turn(self.stamp, self.question)
