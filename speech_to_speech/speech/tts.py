"""The shared TTS stage: gating and chunking around an engine's synthesis."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import AudioOutput, EndOfResponse, TTSInput
from speech_to_speech.core.priority import CORES

logger = logging.getLogger(__name__)

#: samples quieter than this (-60 dBFS) at the start of a response's audio are silence to skip
LEADING_SILENCE_LEVEL = 1e-3
#: what is kept of that silence before the first audible sample, ms
LEADING_SILENCE_KEEP_MS = 10


def trim_leading_silence(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """``audio`` from :data:`LEADING_SILENCE_KEEP_MS` before its first sample above -60 dBFS.

    Piper starts most sentences with 20-50 ms of silence and some with much more (300 ms
    before "He was not ..." with the default voice): heard as a reply that comes late.
    All-silent audio is returned unchanged.
    """
    loud = np.flatnonzero(np.abs(audio) > LEADING_SILENCE_LEVEL)
    if not len(loud):
        return audio
    return audio[max(0, int(loud[0]) - sample_rate * LEADING_SILENCE_KEEP_MS // 1000) :]


#: a language code in ``--tts_voice``: ISO 639-1/3, optionally with a region (``fr``, ``pt-BR``)
_LANGUAGE = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z]{2})?")


def base_language(code: str | None) -> str | None:
    """``"fr"`` for ``"fr"``, ``"fr-FR"`` or ``"fr_FR"``; None for None or ""."""
    return re.split(r"[-_]", code.strip().lower())[0] if code and code.strip() else None


def parse_voices(spec: str) -> dict[str, str]:
    """The voices of a ``--tts_voice`` value, by language.

    ``spec`` is comma-separated entries, each ``LANG=VOICE`` (a voice for one language) or a
    bare ``VOICE`` (the default voice, key ``""``); "" is no voice at all (the backend's
    embedded default). A voice is whatever the backend takes: a Piper ``.onnx`` path, an
    espeak-ng voice name.

    Raises:
        ValueError: an empty entry or voice, a malformed language code, a language named twice
            or two default voices; the message names the entry.
    """
    voices: dict[str, str] = {}
    if not spec.strip():
        return voices
    for entry in spec.split(","):
        entry = entry.strip()
        language, sep, voice = entry.rpartition("=") if "=" in entry else ("", "", entry)
        language, voice = language.strip(), voice.strip()
        if not voice:
            raise ValueError(f"--tts_voice entry {entry!r} names no voice (expected LANG=VOICE or VOICE)")
        if sep and not _LANGUAGE.fullmatch(language):
            raise ValueError(f"--tts_voice entry {entry!r}: {language!r} is not a language code such as fr or pt-BR")
        key = base_language(language) or ""
        if key in voices:
            what = f"language {key!r}" if key else "default voice"
            raise ValueError(f"--tts_voice names the {what} twice ({voices[key]!r} and {voice!r})")
        voices[key] = voice
    return voices


@dataclass
class TTSConfig:
    """Settings shared by every TTS backend.

    Attributes:
        tts_voice: the voices, ``LANG=VOICE`` entries and/or one default ``VOICE``, comma-separated
            (:func:`parse_voices`); "" = the backend's embedded default.
        tts_chunk_ms: size of the audio chunks sent downstream, ms.
    """

    tts_voice: str = ""
    tts_chunk_ms: int = 100


class BaseTTSHandler(BaseHandler):
    """Consumes :class:`TTSInput`, emits :class:`AudioOutput` chunks.

    Each :class:`TTSInput` is synthesised whole, as the LLM stage's sentence
    streamer cut it (:class:`~speech_to_speech.speech.text.SentenceStreamer`: the
    first clause or sentence of a reply alone, then sentence batches), so text
    is split into sentences in one place only. Each audio chunk carries the
    words whose (estimated) start falls inside it, so sinks can show and
    record exactly the words that were played. The silence an engine puts in
    front of a response's first audio is skipped (:func:`trim_leading_silence`):
    it would only delay the reply.

    Every other message (:class:`EndOfResponse`, text deltas, tool calls) is
    passed on unchanged, in order with the audio around it.

    Subclasses set :attr:`sample_rate` in :meth:`load` and implement :meth:`synthesize`.
    The stale-work gate is checked before synthesis and before every chunk,
    so a cancelled turn stops producing audio at the next chunk boundary.
    """

    #: native output rate of the engine, Hz (set by :meth:`load`)
    sample_rate: int = 0
    #: the engine's name as the console shows it (``"piper"``)
    engine: str = ""

    def __init__(self, *args: object, config: TTSConfig, device: str = "cpu", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device
        self._responses_begun: set[Stamp] = set()  # responses whose first word was spoken

    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """Load the voice; must set :attr:`sample_rate`."""
        raise NotImplementedError

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield float32 mono audio in [-1, 1] at :attr:`sample_rate` for ``text``."""
        raise NotImplementedError

    def speak(self, text: str, language: str | None) -> tuple[Iterable[np.ndarray], int, str]:
        """Audio for ``text`` in ``language`` (ISO 639-1, None: unknown): the float32 chunks,
        their rate in Hz and the engine that speaks them. A backend with a voice per language
        (or a fallback engine) overrides this; the default is :meth:`synthesize`."""
        return self.synthesize(text), self.sample_rate, self.engine

    def process(self, item: Any) -> Iterator[Any]:
        if not isinstance(item, TTSInput):  # text deltas, tool calls, end of response: in order
            if isinstance(item, EndOfResponse):
                self._responses_begun.discard(item.stamp)
            yield item
            return
        if not self.gate.admits(item.stamp):
            return
        # the LLM's sentence streamer already cut the text into the chunks to speak (the first
        # clause or sentence alone, then sentence batches): speak each as it is, never re-split
        # the synthesis takes a core: the LLM writing the next sentence meanwhile keeps to the rest
        with CORES.using():
            spoken, rate, engine = self.speak(item.text, item.language)
            parts = [np.asarray(a, dtype=np.float32).reshape(-1) for a in spoken]
        chunk = max(1, rate * self.config.tts_chunk_ms // 1000)
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        if item.stamp not in self._responses_begun:  # the reply's first audio: no silence in front
            audio = trim_leading_silence(audio, rate)
        if not len(audio):
            return
        words = self._words(item.stamp, item.text)
        for start in range(0, len(audio), chunk):
            if not self.gate.admits(item.stamp):
                return
            text = "".join(w for w, at in words if start <= at * len(audio) < start + chunk)
            yield AudioOutput(item.stamp, audio[start : start + chunk], rate, text, engine, item.language)

    def _words(self, stamp: Stamp, text: str) -> list[tuple[str, float]]:
        """Words of ``text`` with their estimated start as a fraction of its audio.

        The estimate is proportional to characters: good enough to cut a reply
        to what was heard at chunk granularity. The first word of a response
        has no leading space; every later word has one.
        """
        words = text.split()
        total = max(1, sum(len(w) + 1 for w in words))
        out, seen = [], 0
        for word in words:
            lead = " " if (out or stamp in self._responses_begun) else ""
            self._responses_begun.add(stamp)
            out.append((lead + word, seen / total))
            seen += len(word) + 1
        return out
