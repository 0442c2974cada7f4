"""Endpointing: turning per-chunk speech probabilities into user turns.

The backend (e.g. Silero) only scores fixed-size chunks; this module decides
where speech starts and ends. The hysteresis (enter speech at ``threshold``,
leave below ``threshold - 0.15``) follows the iterator in the Silero VAD
project's utilities; the pre-roll and padding keep soft word onsets and
endings that score below threshold.

Two things happen before an endpoint, to save time after it:

* a short pause (``speculative_silence_ms``) sends the turn on speculatively
  (see :mod:`speech_to_speech.speculation`); the endpoint confirms it, speech
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

import numpy as np

from speech_to_speech.cancel import Stamp
from speech_to_speech.events import SpeechStarted, SpeechStopped, TurnSpeculated, TurnSuperseded
from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import AudioChunk, PartialSpeech, SpeechSegment
from speech_to_speech.speculation import SpeculativeTurns

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
CHUNK_SAMPLES = 512  # 32 ms at 16 kHz, the frame size Silero VAD v5 expects


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


@dataclass
class Endpoint:
    """One utterance found by :class:`Endpointer`.

    Attributes:
        samples: float32 audio including pre-roll and end padding.
        speech_end_offset: stream sample index where speech ended (before padding).
        confirms_speculation: a :class:`Speculation` came before and no speech since: this
            endpoint confirms it (its audio is the same speech).
    """

    samples: np.ndarray
    speech_end_offset: int
    confirms_speculation: bool = False


@dataclass
class Speculation:
    """A pause of ``speculative_silence_ms`` in an utterance: maybe its end, not yet confirmed.

    Attributes:
        samples: float32 audio so far, including pre-roll and end padding (as an endpoint would).
        speech_end_offset: stream sample index where speech ended (before padding).
    """

    samples: np.ndarray
    speech_end_offset: int


#: returned by :meth:`Endpointer.feed` when speech resumes after a :class:`Speculation`
RESUMED = "resumed"


class Endpointer:
    """A streaming speech/silence state machine over fixed-size chunks.

    Feed each chunk with its speech probability; :meth:`feed` returns
    ``"start"`` when speech begins, a :class:`Speculation` after
    ``speculative_silence_ms`` of silence, :data:`RESUMED` when speech comes back
    after a speculation, an :class:`Endpoint` when a turn ends, otherwise None.

    Args:
        config: thresholds and durations.
        sample_rate: Hz of the chunks.
        chunk_samples: samples per chunk.
    """

    def __init__(self, config: VADConfig, sample_rate: int = SAMPLE_RATE, chunk_samples: int = CHUNK_SAMPLES) -> None:
        if not 0.0 < config.vad_threshold < 1.0:
            raise ValueError(f"vad_threshold must be in (0, 1), got {config.vad_threshold}")
        self.config = config
        self.sample_rate = sample_rate
        self.chunk_samples = chunk_samples
        ms_per_chunk = 1000 * chunk_samples / sample_rate
        self._off_threshold = max(0.01, config.vad_threshold - 0.15)
        self._silence_chunks = max(1, round(config.min_silence_ms / ms_per_chunk))
        self._min_speech_chunks = max(1, round(config.min_speech_ms / ms_per_chunk))
        self._pad_chunks = round(config.speech_pad_ms / ms_per_chunk)
        self._max_chunks = max(1, round(config.max_speech_ms / ms_per_chunk))
        speculative = round(config.speculative_silence_ms / ms_per_chunk) if config.speculative_silence_ms > 0 else 0
        #: silent chunks after which a speculation is reported (0: never)
        self.speculative_chunks = max(1, speculative) if 0 < speculative < self._silence_chunks else 0
        self._preroll: collections.deque[np.ndarray] = collections.deque(maxlen=self._pad_chunks)
        self.reset()

    def reset(self) -> None:
        """Forget any utterance in progress."""
        self.in_speech = False
        self.last_chunk_was_speech = False
        self._chunks: list[np.ndarray] = []
        self._speech_chunks = 0
        self._silent_run = 0
        self._offset = 0
        self._last_speech_end = 0
        self._speculated = False
        self._preroll.clear()

    @property
    def offset(self) -> int:
        """Samples fed since the last :meth:`reset`."""
        return self._offset

    @property
    def silent_run(self) -> int:
        """Silent chunks since speech was last heard in the utterance in progress (0 outside one)."""
        return self._silent_run if self.in_speech else 0

    def utterance_audio(self) -> np.ndarray:
        """float32 audio of the utterance in progress so far (pre-roll included; empty outside one)."""
        if not self.in_speech or not self._chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self._chunks).astype(np.float32, copy=False)

    def feed(self, chunk: np.ndarray, probability: float) -> str | Endpoint | Speculation | None:
        """Advance by one chunk scored ``probability`` (0–1)."""
        self._offset += len(chunk)
        self.last_chunk_was_speech = probability >= (
            self._off_threshold if self.in_speech else self.config.vad_threshold
        )
        if not self.in_speech:
            if probability >= self.config.vad_threshold:
                self.in_speech = True
                self._chunks = [*list(self._preroll), chunk]
                self._speech_chunks = 1
                self._silent_run = 0
                self._last_speech_end = self._offset
                self._preroll.clear()
                return "start"
            self._preroll.append(chunk)
            return None
        self._chunks.append(chunk)
        resumed = False
        if probability >= self._off_threshold:
            self._speech_chunks += 1 + self._silent_run
            self._silent_run = 0
            self._last_speech_end = self._offset
            resumed, self._speculated = self._speculated, False
        else:
            self._silent_run += 1
        if self._silent_run >= self._silence_chunks or len(self._chunks) >= self._max_chunks:
            return self._finish()
        if resumed:
            return RESUMED
        if (
            self._silent_run == self.speculative_chunks
            and self.speculative_chunks
            and self._speech_chunks >= self._min_speech_chunks
        ):
            self._speculated = True
            return Speculation(self._kept_audio(), self._last_speech_end)
        return None

    def flush(self) -> Endpoint | None:
        """End the stream: return the utterance in progress, if long enough."""
        if not self.in_speech:
            return None
        return self._finish()

    def _kept_chunks(self) -> int:
        """Chunks of the utterance kept at its end: trailing silence beyond the padding is cut."""
        return len(self._chunks) - max(0, self._silent_run - self._pad_chunks)

    def _kept_audio(self) -> np.ndarray:
        return np.concatenate(self._chunks[: self._kept_chunks()]).astype(np.float32, copy=False)

    def _finish(self) -> Endpoint | None:
        keep = self._kept_chunks()
        chunks = self._chunks[:keep]
        long_enough = self._speech_chunks >= self._min_speech_chunks
        speech_end = self._last_speech_end
        confirms = self._speculated
        if self._pad_chunks:  # the trimmed silence is the next utterance's pre-roll
            self._preroll.extend(self._chunks[keep:])
        self.in_speech = False
        self._chunks = []
        self._speech_chunks = 0
        self._silent_run = 0
        self._speculated = False
        if not long_enough or not chunks:
            return None
        return Endpoint(np.concatenate(chunks).astype(np.float32, copy=False), speech_end, confirms)


class BaseVADHandler(BaseHandler):
    """Consumes 16 kHz :class:`AudioChunk`, emits one :class:`SpeechSegment` per user turn.

    Incoming audio of any block size is re-blocked into :data:`CHUNK_SAMPLES`
    chunks. Backends implement :meth:`load` and :meth:`speech_probability`.

    When speech starts, the cancel scope is bumped (barge-in: every reply in
    flight becomes stale) unless ``interrupt_response`` is off. Speech that
    resumes within ``turn_grace_ms`` of an endpoint reopens that turn as a new
    revision; its segment holds the earlier audio too, so the transcript is whole.

    With :attr:`speculation` set (the pipeline holds unconfirmed output), a pause of
    ``speculative_silence_ms`` sends a ``speculative`` segment at once and publishes
    :class:`TurnSpeculated`; the endpoint then confirms it (no second segment, only
    :class:`SpeechStopped`), or speech that resumes first supersedes it: a new
    revision of the turn, :class:`TurnSuperseded`, and the endpoint sends that.

    While speech goes on, :class:`PartialSpeech` with the audio so far is sent every
    ``partial_interval_ms`` of audio, only when the STT has nothing waiting.
    """

    def __init__(self, *args: object, config: VADConfig, device: str = "cpu", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device
        self.endpointer = Endpointer(config)
        self._pending = np.zeros(0, dtype=np.float32)
        self._speech_end_time = 0.0
        self._stamp: Stamp | None = None
        self._last: tuple[Stamp, np.ndarray, int] | None = None  # last segment: stamp, audio, end offset
        self._prefix = np.zeros(0, dtype=np.float32)
        self._last_time = 0.0
        self._speculative: Stamp | None = None  # the revision sent on a pause, not yet confirmed
        self._partial_offset = 0  # endpointer offset of the last partial request
        #: answer each endpointed turn (False: only transcribe it; the client asks for responses)
        self.create_response = True
        #: where unconfirmed turns are held; None (the default) disables speculative turns
        self.speculation: SpeculativeTurns | None = None

    def setup(self) -> None:
        self.load()

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
        self._pending = np.concatenate([self._pending, np.asarray(item.samples, dtype=np.float32)])
        while len(self._pending) >= CHUNK_SAMPLES:
            chunk, self._pending = self._pending[:CHUNK_SAMPLES], self._pending[CHUNK_SAMPLES:]
            result = self.endpointer.feed(chunk, self.speech_probability(chunk))
            if self.endpointer.last_chunk_was_speech:
                self._speech_end_time = item.time
            if result == "start":
                self._start_turn()
            elif isinstance(result, Speculation):
                yield from self._speculate(result)
            elif result == RESUMED:
                self._supersede()
            elif isinstance(result, Endpoint):
                yield from self._segment(result)
            elif result is None and not self.endpointer.in_speech and self._stamp is not None:
                # too short: noise. A reopened turn still gets its earlier words answered.
                if len(self._prefix):
                    yield from self._segment(Endpoint(np.zeros(0, dtype=np.float32), self.endpointer.offset))
                else:
                    self._stamp = None
            if self._partial_due():
                yield self._partial(item.time)

    def _start_turn(self) -> None:
        if self.config.interrupt_response:
            self.gate.scope.cancel()  # barge-in: whatever is in flight is stale from now on
        grace = self.config.turn_grace_ms * SAMPLE_RATE // 1000
        recent = self._last is not None and time.monotonic() - self._last_time <= self.config.turn_grace_ms / 1000
        # both the audio and the wall clock must agree the pause was short (a client may stop sending)
        if self._last is not None and recent and self.endpointer.offset - self._last[2] <= grace:
            previous, audio, _ = self._last
            self._stamp = self.gate.stamp(previous.turn_id, self.gate.turns.revise(previous.turn_id))
            self._prefix = audio
        else:
            self._stamp = self.gate.new_turn_stamp()
            self._prefix = np.zeros(0, dtype=np.float32)
        self._partial_offset = self.endpointer.offset
        start_ms = 1000 * max(0, self.endpointer.offset - CHUNK_SAMPLES) / SAMPLE_RATE
        self.bus.publish(SpeechStarted(self._stamp.turn_id, revision=self._stamp.revision, audio_ms=start_ms))

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

    def _partial(self, now: float) -> PartialSpeech:
        assert self._stamp is not None
        self._partial_offset = self.endpointer.offset
        audio = self.endpointer.utterance_audio()
        samples = np.concatenate([self._prefix, audio]) if len(self._prefix) else audio
        # the next segment needs this much silence first: speculative if that is on, else the endpoint
        speculative = self.speculation is not None and self.endpointer.speculative_chunks > 0
        silence_ms = self.config.speculative_silence_ms if speculative else self.config.min_silence_ms
        return PartialSpeech(self._stamp, samples, SAMPLE_RATE, time=now, deadline=now + silence_ms / 1000)

    # -- speculative turns -------------------------------------------------------------------
    def _speculate(self, speculation: Speculation) -> Iterator[SpeechSegment]:
        if self.speculation is None:
            return
        stamp = self._stamp or self.gate.new_turn_stamp()
        self._stamp = self._speculative = stamp
        self.speculation.open(stamp)
        samples = np.concatenate([self._prefix, speculation.samples]) if len(self._prefix) else speculation.samples
        now = time.monotonic()
        end_ms = 1000 * speculation.speech_end_offset / SAMPLE_RATE
        self.bus.publish(TurnSpeculated(stamp.turn_id, revision=stamp.revision, audio_ms=end_ms))
        yield SpeechSegment(
            stamp=stamp,
            samples=samples,
            sample_rate=SAMPLE_RATE,
            speech_end_time=self._speech_end_time or now,
            endpoint_time=now,
            stream_end_offset=speculation.speech_end_offset,
            respond=self.create_response,
            speculative=True,
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
        self._last = (stamp, samples, self.endpointer.offset)
        now = time.monotonic()
        self._last_time = now
        delay_ms = (now - self._speech_end_time) * 1000 if self._speech_end_time else 0.0
        duration_ms = 1000 * len(samples) / SAMPLE_RATE
        end_ms = 1000 * endpoint.speech_end_offset / SAMPLE_RATE
        self.bus.publish(
            SpeechStopped(stamp.turn_id, duration_ms=duration_ms, endpoint_delay_ms=delay_ms, audio_ms=end_ms)
        )
        if confirmed and speculative is not None and self.speculation is not None:
            self.speculation.confirm(speculative)  # its transcript and reply are on their way: release them
            return
        yield SpeechSegment(
            stamp=stamp,
            samples=samples,
            sample_rate=SAMPLE_RATE,
            speech_end_time=self._speech_end_time or now,
            endpoint_time=now,
            stream_end_offset=endpoint.speech_end_offset,
            respond=self.create_response,
        )
