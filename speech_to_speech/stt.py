"""The shared STT stage: timing, empty-transcript filtering and events."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speech_to_speech.events import UserTranscript
from speech_to_speech.handler import BaseHandler
from speech_to_speech.messages import SpeechSegment, Transcript

logger = logging.getLogger(__name__)


@dataclass
class STTConfig:
    """Settings shared by every STT backend.

    Attributes:
        stt_model: model folder or hub id ("" = the backend's embedded default).
        language: ISO 639-1 code (e.g. "en"), or "auto" to detect per turn.
        stt_compute_type: numeric precision for the engine ("default" picks per device).
        stt_beam_size: beam width (1 = greedy, fastest).
    """

    stt_model: str = ""
    language: str = "en"
    stt_compute_type: str = "default"
    stt_beam_size: int = 1


class BaseSTTHandler(BaseHandler):
    """Consumes :class:`SpeechSegment`, emits :class:`Transcript`; other messages pass through in order.

    Backends implement :meth:`load` and :meth:`transcribe`. Segments that
    transcribe to nothing (noise, coughs) end the turn without a response.
    """

    def __init__(self, *args: object, config: STTConfig, device: str = "cpu", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.config = config
        self.device = device

    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """Load the model."""
        raise NotImplementedError

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        """Return ``(text, language)`` for float32 mono ``samples`` at ``sample_rate`` Hz."""
        raise NotImplementedError

    def process(self, item: Any) -> Iterator[Any]:
        if not isinstance(item, SpeechSegment):  # typed turns and requests keep their place in line
            yield item
            return
        if not self.gate.admits(item.stamp):
            return
        start = time.monotonic()
        text, language = self.transcribe(item.samples, item.sample_rate)
        stt_ms = (time.monotonic() - start) * 1000
        text = text.strip()
        if not text:
            logger.info("turn %d: empty transcript, no response", item.stamp.turn_id)
            return
        if not self.gate.admits(item.stamp):
            return
        self.bus.publish(UserTranscript(item.stamp.turn_id, text=text, language=language, stt_ms=stt_ms))
        yield Transcript(
            item.stamp,
            text,
            language,
            speech_end_time=item.speech_end_time,
            stt_ms=stt_ms,
            wants_audio=item.wants_audio,
            respond=item.respond,
        )
