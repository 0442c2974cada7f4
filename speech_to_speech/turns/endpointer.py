"""The endpointing state machine: per-chunk speech probabilities in, utterance boundaries out.

The backend (e.g. Silero) only scores fixed-size chunks; :class:`Endpointer`
decides where speech starts and ends. The hysteresis (enter speech at
``threshold``, leave below ``threshold - 0.15``) follows the iterator in the
Silero VAD project's utilities; the pre-roll and padding keep soft word onsets
and endings that score below threshold.

Two ways to end a turn:

* **silence** (``semantic=False``): ``min_silence_ms`` of silence ends it;
* **semantic** (``semantic=True``): the silence bound of an utterance long enough
  to be a turn is ``turn_max_silence_ms`` instead, and the pause reported after
  ``speculative_silence_ms`` (:class:`Speculation`) is where the caller asks an
  end-of-turn model; if it says "complete", :meth:`Endpointer.end_turn` ends the
  turn at once. Noise shorter than ``min_speech_ms`` still ends after ``min_silence_ms``.
  When the transcript of the pause reads finished although the model judged it unfinished,
  :meth:`Endpointer.shorten` ends it after a shorter silence (``by`` = :data:`BY_TEXT`).

The state machine itself is pure (no model, no clock): the caller scores the audio.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from speech_to_speech.core.audio import CHUNK_SAMPLES, SAMPLE_RATE

if TYPE_CHECKING:
    from speech_to_speech.turns.vad import VADConfig

#: the pause at which an end-of-turn model is asked when ``speculative_silence_ms`` is 0, ms
DEFAULT_PAUSE_MS = 200

#: a blip that paused a reply (at most :data:`BLIP_MS` of speech) is dropped after this much silence,
#: ms, instead of ``min_silence_ms``: the reply plays again only then. In the room of
#: ``benchmark_room.py`` (the canceller on, no noise, 2026-12-07) blips of the voice's echo that AEC3
#: left paused 3-4 of 6 stories for 480-600 ms each (``too_short``, with the 500 ms bound); 160-230
#: ms with this bound
SHORT_SPEECH_DROP_MS = 160
#: the most speech a blip has, ms (3 chunks): the room's were 1-3 chunks. A word is longer: "Wait,"
#: of "Wait, stop." keeps the 500 ms bound over its comma (dropped after 160 ms, the reply played
#: again before "stop.": ``tests/test_realtime_backchannel.py``)
BLIP_MS = 96
#: why an utterance ended (:attr:`Endpoint.by`)
BY_MODEL = "model"  # the end-of-turn model judged it complete after a short pause
BY_SILENCE = "silence"  # the silence bound (min_silence_ms, or turn_max_silence_ms in semantic mode)
BY_TEXT = "text"  # the shorter silence bound of an utterance whose transcript reads finished
BY_MAX_SPEECH = "max_speech"  # max_speech_ms reached
BY_END_OF_INPUT = "end_of_input"  # the input stream ended


@dataclass
class Endpoint:
    """One utterance found by :class:`Endpointer`.

    Attributes:
        samples: float32 audio including pre-roll and end padding.
        speech_end_offset: stream sample index where speech ended (before padding).
        confirms_speculation: a :class:`Speculation` came before and no speech since: this
            endpoint confirms it (its audio is the same speech).
        by: what ended it: :data:`BY_MODEL`, :data:`BY_SILENCE`, :data:`BY_MAX_SPEECH` or
            :data:`BY_END_OF_INPUT`.
        end_offset: stream sample index just after ``samples`` (-1: not known).
    """

    samples: np.ndarray
    speech_end_offset: int
    confirms_speculation: bool = False
    by: str = BY_SILENCE
    end_offset: int = -1


@dataclass
class Speculation:
    """A pause of ``speculative_silence_ms`` in an utterance: maybe its end, not yet confirmed.

    Attributes:
        samples: float32 audio so far, including pre-roll and end padding (as an endpoint would).
        speech_end_offset: stream sample index where speech ended (before padding).
        end_offset: stream sample index just after ``samples``.
    """

    samples: np.ndarray
    speech_end_offset: int
    end_offset: int


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
        semantic: end long-enough utterances after ``turn_max_silence_ms`` of silence (or
            earlier, by :meth:`end_turn`) instead of ``min_silence_ms``; the pause is then
            reported after ``speculative_silence_ms`` (:data:`DEFAULT_PAUSE_MS` when that is 0).
    """

    def __init__(
        self,
        config: VADConfig,
        sample_rate: int = SAMPLE_RATE,
        chunk_samples: int = CHUNK_SAMPLES,
        semantic: bool = False,
    ) -> None:
        if not 0.0 < config.vad_threshold < 1.0:
            raise ValueError(f"vad_threshold must be in (0, 1), got {config.vad_threshold}")
        self.config = config
        self.sample_rate = sample_rate
        self.chunk_samples = chunk_samples
        self.semantic = semantic
        ms_per_chunk = self.ms_per_chunk = 1000 * chunk_samples / sample_rate
        self._off_threshold = max(0.01, config.vad_threshold - 0.15)
        self._silence_chunks = max(1, round(config.min_silence_ms / ms_per_chunk))
        #: silent chunks that end an utterance long enough to be a turn
        self.turn_silence_chunks = (
            max(1, round(config.turn_max_silence_ms / ms_per_chunk)) if semantic else self._silence_chunks
        )
        self._min_speech_chunks = max(1, round(config.min_speech_ms / ms_per_chunk))
        self._blip_chunks = max(1, round(BLIP_MS / ms_per_chunk))
        self._pad_chunks = round(config.speech_pad_ms / ms_per_chunk)
        self._max_chunks = max(1, round(config.max_speech_ms / ms_per_chunk))
        pause_ms = config.speculative_silence_ms
        if semantic and pause_ms <= 0:
            pause_ms = DEFAULT_PAUSE_MS
        speculative = round(pause_ms / ms_per_chunk) if pause_ms > 0 else 0
        #: silent chunks after which a speculation is reported (0: never)
        self.speculative_chunks = max(1, speculative) if 0 < speculative < self.turn_silence_chunks else 0
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
        self._short_silence_chunks = 0
        self._drop_chunks = 0
        self._preroll.clear()

    @property
    def offset(self) -> int:
        """Samples fed since the last :meth:`reset`."""
        return self._offset

    @property
    def silent_run(self) -> int:
        """Silent chunks since speech was last heard in the utterance in progress (0 outside one)."""
        return self._silent_run if self.in_speech else 0

    @property
    def speech_end_offset(self) -> int:
        """Stream sample index where the speech of the utterance in progress last ended (-1 outside one)."""
        return self._last_speech_end if self.in_speech else -1

    @property
    def long_enough(self) -> bool:
        """The utterance in progress has enough speech to be a turn (``min_speech_ms``)."""
        return self.in_speech and self._speech_chunks >= self._min_speech_chunks

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
            self._short_silence_chunks = 0  # more words: the transcript that read finished is outdated
        else:
            self._silent_run += 1
        long_enough = self._speech_chunks >= self._min_speech_chunks
        short = self._drop_chunks if self._drop_chunks and self._speech_chunks <= self._blip_chunks else 0
        if self._silent_run >= (self.turn_silence_chunks if long_enough else short or self._silence_chunks):
            return self._finish(BY_SILENCE)
        if self._short_silence_chunks and long_enough and self._silent_run >= self._short_silence_chunks:
            return self._finish(BY_TEXT)
        if len(self._chunks) >= self._max_chunks:
            return self._finish(BY_MAX_SPEECH)
        if resumed:
            return RESUMED
        if self._silent_run == self.speculative_chunks and self.speculative_chunks and long_enough:
            self._speculated = True
            return Speculation(self._kept_audio(), self._last_speech_end, self._kept_end())
        return None

    def shorten(self, silence_ms: int) -> None:
        """End the utterance in progress after ``silence_ms`` of silence (counted from the end of
        its speech; at the next chunk if that much has passed) instead of the silence bound, unless
        speech resumes first. Its endpoint's ``by`` is :data:`BY_TEXT`. No effect outside an
        utterance or with ``silence_ms`` <= 0."""
        if self.in_speech and silence_ms > 0:
            self._short_silence_chunks = max(1, round(silence_ms / self.ms_per_chunk))

    def drop_short_after(self, silence_ms: int = SHORT_SPEECH_DROP_MS) -> None:
        """While the utterance in progress is a blip (at most :data:`BLIP_MS` of speech), let
        ``silence_ms`` of silence drop it (instead of ``min_silence_ms``): for speech that paused a
        reply, which plays again only once the speech is dropped. No effect outside an utterance or
        with ``silence_ms`` <= 0."""
        if self.in_speech and silence_ms > 0:
            self._drop_chunks = max(1, round(silence_ms / self.ms_per_chunk))

    def end_turn(self) -> Endpoint | None:
        """End the utterance in progress now (an end-of-turn model judged it complete).

        Returns:
            Its :class:`Endpoint` (``by`` = :data:`BY_MODEL`), or None outside an utterance
            or when it is too short to be one.
        """
        return self._finish(BY_MODEL) if self.in_speech else None

    def flush(self) -> Endpoint | None:
        """End the stream: return the utterance in progress, if long enough."""
        if not self.in_speech:
            return None
        return self._finish(BY_END_OF_INPUT)

    def _kept_chunks(self) -> int:
        """Chunks of the utterance kept at its end: trailing silence beyond the padding is cut."""
        return len(self._chunks) - max(0, self._silent_run - self._pad_chunks)

    def _kept_end(self) -> int:
        """Stream sample index just after the kept chunks (:meth:`_kept_chunks`)."""
        return self._offset - (len(self._chunks) - self._kept_chunks()) * self.chunk_samples

    def _kept_audio(self) -> np.ndarray:
        return np.concatenate(self._chunks[: self._kept_chunks()]).astype(np.float32, copy=False)

    def _finish(self, by: str) -> Endpoint | None:
        keep = self._kept_chunks()
        end_offset = self._kept_end()
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
        self._short_silence_chunks = 0
        self._drop_chunks = 0
        if not long_enough or not chunks:
            return None
        return Endpoint(np.concatenate(chunks).astype(np.float32, copy=False), speech_end, confirms, by, end_offset)
