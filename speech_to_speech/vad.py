"""Endpointing: turning per-chunk speech probabilities into user turns.

The backend (e.g. Silero) only scores fixed-size chunks; this module decides
where speech starts and ends. The hysteresis (enter speech at ``threshold``,
leave below ``threshold - 0.15``) follows the iterator in the Silero VAD
project's utilities; the pre-roll and padding keep soft word onsets and
endings that score below threshold.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from speech_to_speech.cancel import Stamp
from speech_to_speech.events import SpeechStarted, SpeechStopped
from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import AudioChunk, SpeechSegment

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
    """

    vad_threshold: float = 0.5
    min_silence_ms: int = 500
    min_speech_ms: int = 250
    speech_pad_ms: int = 200
    max_speech_ms: int = 30_000
    interrupt_response: bool = True
    turn_grace_ms: int = 700


@dataclass
class Endpoint:
    """One utterance found by :class:`Endpointer`.

    Attributes:
        samples: float32 audio including pre-roll and end padding.
        speech_end_offset: stream sample index where speech ended (before padding).
    """

    samples: np.ndarray
    speech_end_offset: int


class Endpointer:
    """A streaming speech/silence state machine over fixed-size chunks.

    Feed each chunk with its speech probability; :meth:`feed` returns
    ``"start"`` when speech begins, an :class:`Endpoint` when a turn ends,
    otherwise None.

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
        self._preroll.clear()

    @property
    def offset(self) -> int:
        """Samples fed since the last :meth:`reset`."""
        return self._offset

    def feed(self, chunk: np.ndarray, probability: float) -> str | Endpoint | None:
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
        if probability >= self._off_threshold:
            self._speech_chunks += 1 + self._silent_run
            self._silent_run = 0
            self._last_speech_end = self._offset
        else:
            self._silent_run += 1
        if self._silent_run >= self._silence_chunks or len(self._chunks) >= self._max_chunks:
            return self._finish()
        return None

    def flush(self) -> Endpoint | None:
        """End the stream: return the utterance in progress, if long enough."""
        if not self.in_speech:
            return None
        return self._finish()

    def _finish(self) -> Endpoint | None:
        keep = len(self._chunks) - max(0, self._silent_run - self._pad_chunks)
        chunks = self._chunks[:keep]
        long_enough = self._speech_chunks >= self._min_speech_chunks
        speech_end = self._last_speech_end
        if self._pad_chunks:  # the trimmed silence is the next utterance's pre-roll
            self._preroll.extend(self._chunks[keep:])
        self.in_speech = False
        self._chunks = []
        self._speech_chunks = 0
        self._silent_run = 0
        if not long_enough or not chunks:
            return None
        return Endpoint(np.concatenate(chunks).astype(np.float32, copy=False), speech_end)


class BaseVADHandler(BaseHandler):
    """Consumes 16 kHz :class:`AudioChunk`, emits one :class:`SpeechSegment` per user turn.

    Incoming audio of any block size is re-blocked into :data:`CHUNK_SAMPLES`
    chunks. Backends implement :meth:`load` and :meth:`speech_probability`.

    When speech starts, the cancel scope is bumped (barge-in: every reply in
    flight becomes stale) unless ``interrupt_response`` is off. Speech that
    resumes within ``turn_grace_ms`` of an endpoint reopens that turn as a new
    revision; its segment holds the earlier audio too, so the transcript is whole.
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
        #: answer each endpointed turn (False: only transcribe it; the client asks for responses)
        self.create_response = True

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

    def process(self, item: AudioChunk) -> Iterator[SpeechSegment]:
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
            elif isinstance(result, Endpoint):
                yield from self._segment(result)
            elif result is None and not self.endpointer.in_speech and self._stamp is not None:
                # too short: noise. A reopened turn still gets its earlier words answered.
                if len(self._prefix):
                    yield from self._segment(Endpoint(np.zeros(0, dtype=np.float32), self.endpointer.offset))
                else:
                    self._stamp = None

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
        start_ms = 1000 * max(0, self.endpointer.offset - CHUNK_SAMPLES) / SAMPLE_RATE
        self.bus.publish(SpeechStarted(self._stamp.turn_id, revision=self._stamp.revision, audio_ms=start_ms))

    def on_end_of_stream(self) -> Iterator[SpeechSegment]:
        result = self.endpointer.flush()
        if isinstance(result, Endpoint):
            yield from self._segment(result)

    def _segment(self, endpoint: Endpoint) -> Iterator[SpeechSegment]:
        stamp = self._stamp or self.gate.new_turn_stamp()
        samples = np.concatenate([self._prefix, endpoint.samples]) if len(self._prefix) else endpoint.samples
        self._stamp, self._prefix = None, np.zeros(0, dtype=np.float32)
        self._last = (stamp, samples, self.endpointer.offset)
        now = time.monotonic()
        self._last_time = now
        delay_ms = (now - self._speech_end_time) * 1000 if self._speech_end_time else 0.0
        duration_ms = 1000 * len(samples) / SAMPLE_RATE
        end_ms = 1000 * endpoint.speech_end_offset / SAMPLE_RATE
        self.bus.publish(
            SpeechStopped(stamp.turn_id, duration_ms=duration_ms, endpoint_delay_ms=delay_ms, audio_ms=end_ms)
        )
        yield SpeechSegment(
            stamp=stamp,
            samples=samples,
            sample_rate=SAMPLE_RATE,
            speech_end_time=self._speech_end_time or now,
            endpoint_time=now,
            stream_end_offset=endpoint.speech_end_offset,
            respond=self.create_response,
        )
