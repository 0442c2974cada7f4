"""The shared TTS stage: gating and chunking around an engine's synthesis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import AudioOutput, TTSInput

logger = logging.getLogger(__name__)


@dataclass
class TTSConfig:
    """Settings shared by every TTS backend.

    Attributes:
        tts_voice: voice model path or name ("" = the backend's embedded default).
        tts_chunk_ms: size of the audio chunks sent downstream, ms.
    """

    tts_voice: str = ""
    tts_chunk_ms: int = 200


class BaseTTSHandler(BaseHandler):
    """Consumes :class:`TTSInput`, emits :class:`AudioOutput` chunks.

    Every other message (:class:`EndOfResponse`, text deltas, tool calls) is
    passed on unchanged, in order with the audio around it.

    Subclasses set :attr:`sample_rate` in :meth:`load` and implement :meth:`synthesize`.
    The stale-work gate is checked before synthesis and before every chunk,
    so a cancelled turn stops producing audio at the next chunk boundary.
    """

    #: native output rate of the engine, Hz (set by :meth:`load`)
    sample_rate: int = 0

    def __init__(self, *args: object, config: TTSConfig, device: str = "cpu", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device

    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """Load the voice; must set :attr:`sample_rate`."""
        raise NotImplementedError

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield float32 mono audio in [-1, 1] at :attr:`sample_rate` for ``text``."""
        raise NotImplementedError

    def process(self, item: Any) -> Iterator[Any]:
        if not isinstance(item, TTSInput):  # text deltas, tool calls, end of response: in order
            yield item
            return
        if not self.gate.admits(item.stamp):
            return
        chunk = max(1, self.sample_rate * self.config.tts_chunk_ms // 1000)
        first = True
        for audio in self.synthesize(item.text):
            audio = np.asarray(audio, dtype=np.float32).reshape(-1)
            for start in range(0, len(audio), chunk):
                if not self.gate.admits(item.stamp):
                    return
                yield AudioOutput(
                    item.stamp, audio[start : start + chunk], self.sample_rate, item.text if first else ""
                )
                first = False
