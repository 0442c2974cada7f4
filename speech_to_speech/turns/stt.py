"""The shared STT stage: timing, empty-transcript filtering, partial transcripts and events."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import EmptyTranscript, UserTranscript, UserTranscriptDelta
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import PartialSpeech, PartialTranscript, SpeechSegment, Transcript
from speech_to_speech.core.priority import CORES, CRITICAL
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.turns.turn_detection import FINISHED_QUESTION, transcript_ends_turn
from speech_to_speech.turns.vad import TranscriptEndsTurn

logger = logging.getLogger(__name__)

#: turns whose partial-transcript state is kept (older ones are forgotten)
TURNS_KEPT = 8
#: each partial skipped as too slow shrinks the pass-time estimate by this factor, so that a
#: slow pass (e.g. while another stage was busy) does not stop partials for the rest of the turn
SKIP_DECAY = 0.7
#: the fixed part of a pass's cost, in seconds of audio (see :meth:`BaseSTTHandler.predicted_pass_ms`)
PASS_OVERHEAD_S = 3.0


@dataclass
class STTConfig:
    """Settings shared by every STT backend.

    Attributes:
        stt_model: model folder or hub id ("" = the backend's embedded default).
        language: ISO 639-1 code (e.g. "en"), "auto" to detect per turn, or a comma-separated
            list (e.g. "en,fr,de") to detect among those languages only.
        stt_compute_type: numeric precision for the engine ("default" picks per device).
        stt_beam_size: beam width (1 = greedy, fastest).
        stt_cpu_threads: CPU threads of the engine (0 = the engine's default). One thread
            leaves a core to the LLM and TTS on a 2-core machine and was as fast as two there
            (numbers in :mod:`handlers.stt.faster_whisper_stt`).
    """

    stt_model: str = ""
    language: str = "en"
    stt_compute_type: str = "default"
    stt_beam_size: int = 1
    stt_cpu_threads: int = 1


def _norm(word: str) -> str:
    return re.sub(r"[^\w']+", "", word.lower())


def trim_repeats(text: str, times: int = 3, longest: int = 4) -> str:
    """Cut ``text`` where a run of up to ``longest`` words repeats ``times`` times in a row
    (keeping one copy): how Whisper loops on unfinished speech ("th th th th")."""
    words = text.split()
    keys = [_norm(w) for w in words]
    for start in range(len(words)):
        for n in range(1, longest + 1):
            run = keys[start : start + n]
            if len(run) == n and all(keys[start + k * n : start + (k + 1) * n] == run for k in range(times)):
                return " ".join(words[: start + n])
    return text


def _agreeing(a: list[str], b: list[str]) -> int:
    """How many leading words ``a`` and ``b`` share (ignoring case and punctuation)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if _norm(x) != _norm(y):
            break
        n += 1
    return n


class TranscriptDeltas:
    """Turns successive partial transcripts of a turn into append-only deltas. Thread-safe.

    A word is announced once two partials in a row agree on it and on every word
    before it (local agreement) and it is not the last word of either, so a word
    still being spoken is not announced half heard. Concatenating a turn's deltas
    gives the words announced so far. Whisper sometimes drops or adds a word at the
    start of a partial; announced words are found again up to :attr:`max_offset` words in.
    """

    #: how far into a later transcript the announced words may start, words
    max_offset = 2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turns: dict[int, tuple[list[str], list[str]]] = {}  # turn: (previous partial, announced)

    def partial(self, turn_id: int, text: str) -> str:
        """Record a partial transcript of ``turn_id``; return the newly stable words ("" if none)."""
        words = text.split()
        with self._lock:
            previous, announced = self._turns.pop(turn_id, ([], []))
            stable = words[: max(0, min(_agreeing(previous, words), len(previous) - 1, len(words) - 1))]
            delta = self._extend(announced, stable)
            self._turns[turn_id] = (words, announced)
            while len(self._turns) > TURNS_KEPT:
                self._turns.pop(next(iter(self._turns)))
            return delta

    def final(self, turn_id: int, text: str) -> str:
        """The end of the final ``text`` not announced yet; forgets the turn's partials.

        Returns "" when the announced words are not the start of ``text`` (a delta cannot be taken back).
        """
        with self._lock:
            _, announced = self._turns.pop(turn_id, ([], []))
            return self._extend(announced, text.split())

    def _extend(self, announced: list[str], words: list[str]) -> str:
        end = self._after(announced, words)
        if end is None or end >= len(words):
            return ""
        new = words[end:]
        delta = (" " if announced else "") + " ".join(new)
        announced.extend(new)
        return delta

    def _after(self, announced: list[str], words: list[str]) -> int | None:
        """Index in ``words`` just after the announced words, or None if they are not there."""
        if not announced:
            return 0
        for offset in range(self.max_offset + 1):
            if _agreeing(announced, words[offset:]) == len(announced):
                return offset + len(announced)
        return None


class BaseSTTHandler(BaseHandler):
    """Consumes :class:`SpeechSegment`, emits :class:`Transcript`; other messages pass through in order.

    Backends implement :meth:`load` and :meth:`transcribe`. Segments that
    transcribe to nothing (noise, coughs) end the turn without a response.

    :class:`PartialSpeech` (the audio of a turn so far) is transcribed for a
    :class:`UserTranscriptDelta` event, unless the stage is behind (more input
    waiting) or the pass would still run when the turn's next segment can arrive
    (its ``deadline``, predicted from recent passes): a partial never makes the
    final transcript wait.

    The transcript of a ``speculative`` segment goes on to the LLM at once; its
    :class:`UserTranscript` event waits for the VAD to confirm the endpoint (see
    :attr:`speculation`) and is never published if the turn is superseded. When that transcript
    reads as a finished turn (:func:`~speech_to_speech.turns.turn_detection.transcript_ends_turn`),
    the stage tells the VAD so with a :class:`~speech_to_speech.turns.vad.TranscriptEndsTurn` at
    the head of :attr:`upstream`, its input queue: the VAD then ends the turn after a shorter silence.
    """

    #: False for engines too slow for partial transcripts
    supports_partials = True

    def __init__(
        self,
        *args: object,
        config: STTConfig,
        device: str = "cpu",
        speculation: SpeculativeTurns | None = None,
        upstream: StageQueue | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device
        #: where unconfirmed (speculative) turns are tracked: the pipeline's, when it holds them
        self.speculation = speculation
        #: the VAD's input queue, for what the transcript of a pause says of the turn's end (None: not told)
        self.upstream = upstream
        self.deltas = TranscriptDeltas()
        self._recent_pass: tuple[float, int] | None = None  # (ms, samples) of the last pass
        #: partial passes run and skipped (behind or too close to the deadline)
        self.partials_run = 0
        self.partials_skipped = 0
        #: the final pass done ahead at the end of speech: (stamp, speech end offset, text, language)
        self._ahead: tuple[Stamp, int, str, str | None] | None = None
        #: segments whose transcript was the pass done ahead
        self.finals_ahead = 0

    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """Load the model."""
        raise NotImplementedError

    def set_language(self, language: str) -> None:
        """Hear ``language`` from the next pass on (a ``--language`` value: a code, "auto" or a
        comma-separated list; see :class:`STTConfig`). Runs in the stage's thread."""
        self.config.language = language

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        """Return ``(text, language)`` for float32 mono ``samples`` at ``sample_rate`` Hz."""
        raise NotImplementedError

    def transcribe_during_reply(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        """Like :meth:`transcribe`, for speech heard while a reply was playing: as likely a
        backchannel ("mm-hmm", "uh-huh") as words, which an engine may be told to expect.
        Defaults to :meth:`transcribe`."""
        return self.transcribe(samples, sample_rate)

    def transcribe_partial(self, samples: np.ndarray, sample_rate: int) -> str:
        """Text of unfinished speech (float32 mono at ``sample_rate`` Hz); defaults to :meth:`transcribe`."""
        return self.transcribe(samples, sample_rate)[0]

    def predicted_pass_ms(self, samples: int) -> float:
        """Expected time of a pass over ``samples`` samples, ms (0 before any pass).

        Scaled from the last pass, as if each pass also cost :data:`PASS_OVERHEAD_S` of audio
        (Whisper's cost grows slower than the audio: a 7 s pass takes about twice a 1 s one).
        """
        if self._recent_pass is None:
            return 0.0
        ms, length = self._recent_pass
        overhead = PASS_OVERHEAD_S * 16_000
        return ms * max(1.0, (samples + overhead) / (length + overhead))

    def _timed(self, samples: int, started: float) -> float:
        ms = (time.monotonic() - started) * 1000
        self._recent_pass = (ms, samples)
        return ms

    def process(self, item: Any) -> Iterator[Any]:
        if isinstance(item, PartialSpeech):
            self._partial(item)
            return
        if not isinstance(item, SpeechSegment):  # typed turns and requests keep their place in line
            yield item
            return
        if not self.gate.admits(item.stamp):
            return
        start = time.monotonic()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[:2] == (item.stamp, item.stream_end_offset) and not item.during_reply:
            # the pass at the end of speech heard all of it: the endpoint to here is this pass's wait
            _, _, text, language = ahead
            stt_ms = max(0.0, start - item.endpoint_time) * 1000
            self.finals_ahead += 1
        else:
            transcribe = self.transcribe_during_reply if item.during_reply else self.transcribe
            # the user waits for this pass: work done ahead gives way, and the LLM keeps off its core
            with CRITICAL.running():
                text, language = transcribe(item.samples, item.sample_rate)
            stt_ms = self._timed(len(item.samples), start)
        text = text.strip()
        if not text:
            logger.info("turn %d: empty transcript, no response", item.stamp.turn_id)
            self.bus.publish(EmptyTranscript(item.stamp.turn_id))
            return
        if not self.gate.admits(item.stamp):
            return
        turn_id = item.stamp.turn_id

        def publish() -> None:
            delta = self.deltas.final(turn_id, text)
            self.bus.publish(UserTranscript(turn_id, text=text, language=language, stt_ms=stt_ms, delta=delta))

        if item.speculative and self.speculation is not None:
            if self.upstream is not None and (finished := transcript_ends_turn(text)) is not None:
                self.upstream.put_first(TranscriptEndsTurn(item.stamp, finished == FINISHED_QUESTION))
            self.speculation.when_confirmed(item.stamp, publish)
        else:
            publish()
        yield Transcript(
            item.stamp,
            text,
            language,
            speech_end_time=item.speech_end_time,
            stt_ms=stt_ms,
            wants_audio=item.wants_audio,
            respond=item.respond,
        )

    def _partial(self, item: PartialSpeech) -> None:
        if not self.supports_partials or not self.gate.admits(item.stamp):
            return
        behind = self.input_queue is not None and not self.input_queue.empty()
        if item.speech_end_offset >= 0:
            if not behind:
                self._pass_ahead(item)
            return
        late = time.monotonic() + self.predicted_pass_ms(len(item.samples)) / 1000 > item.deadline
        if behind or late:
            logger.debug("turn %d: partial skipped (%s)", item.stamp.turn_id, "behind" if behind else "too slow")
            self.partials_skipped += 1
            if late and self._recent_pass is not None:
                self._recent_pass = (self._recent_pass[0] * SKIP_DECAY, self._recent_pass[1])
            return
        start = time.monotonic()
        with CORES.using():  # the LLM's prefill meanwhile keeps off this core
            text = trim_repeats(self.transcribe_partial(item.samples, item.sample_rate).strip())
        stt_ms = self._timed(len(item.samples), start)
        self.partials_run += 1
        logger.debug("turn %d: partial pass over %d samples in %.0f ms", item.stamp.turn_id, len(item.samples), stt_ms)
        if not text or not self.gate.admits(item.stamp):
            return
        self._partial_transcript(item, text, stt_ms)

    def _pass_ahead(self, item: PartialSpeech) -> None:
        """The final pass over speech that stopped, done before its endpoint: kept for the segment
        that ends there (:meth:`process`), and announced as a partial transcript."""
        start = time.monotonic()
        with CRITICAL.running():  # the turn's own final pass: the user will wait for it
            text, language = self.transcribe(item.samples, item.sample_rate)
        stt_ms = self._timed(len(item.samples), start)
        text = text.strip()
        self._ahead = (item.stamp, item.speech_end_offset, text, language)
        logger.debug(
            "turn %d: final pass ahead over %d samples in %.0f ms", item.stamp.turn_id, len(item.samples), stt_ms
        )
        if text and self.gate.admits(item.stamp):
            self._partial_transcript(item, text, stt_ms)

    def _partial_transcript(self, item: PartialSpeech, text: str, stt_ms: float) -> None:
        """Announce the words so far: as an event (the client, the console, the interruption judge)
        and, at the head of the LLM stage's queue, as a :class:`PartialTranscript` it evaluates ahead."""
        delta = self.deltas.partial(item.stamp.turn_id, text)
        audio_ms = 1000 * len(item.samples) / item.sample_rate
        self.bus.publish(
            UserTranscriptDelta(item.stamp.turn_id, text=text, delta=delta, stt_ms=stt_ms, audio_ms=audio_ms)
        )
        if self.output_queue is not None:
            self.output_queue.put_first(PartialTranscript(item.stamp, text))
