"""Silero VAD (the model shipped in the ``silero-vad`` package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from speech_to_speech.vad import SAMPLE_RATE, BaseVADHandler


class SileroVADHandler(BaseVADHandler):
    """Scores 512-sample chunks at 16 kHz with Silero VAD's TorchScript model.

    The model is recurrent: chunks must arrive in order; :meth:`reset_state`
    starts a new stream.
    """

    def load(self) -> None:
        import torch
        from silero_vad import load_silero_vad

        self._torch = torch
        self.model: Any = load_silero_vad(onnx=False)
        self.model.reset_states()

    def speech_probability(self, chunk: np.ndarray) -> float:
        with self._torch.inference_mode():
            return float(self.model(self._torch.from_numpy(chunk), SAMPLE_RATE).item())

    def reset_state(self) -> None:
        self.model.reset_states()
