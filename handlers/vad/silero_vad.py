"""Silero VAD (the model shipped in the ``silero-vad`` package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from speech_to_speech.vad import SAMPLE_RATE, BaseVADHandler

#: torch intra-op threads for Silero VAD (see :class:`SileroVADHandler`)
TORCH_THREADS = 1


class SileroVADHandler(BaseVADHandler):
    """Scores 512-sample chunks at 16 kHz with Silero VAD's TorchScript model.

    The model is recurrent: chunks must arrive in order; :meth:`reset_state`
    starts a new stream.

    Threads: torch runs this model on one thread (:data:`TORCH_THREADS`, set at load).
    A 512-sample chunk is far below torch's intra-op grain size, so a second thread
    never speeds it up (measured on the 2-core target: 0.18 ms per chunk with 1 or 2
    threads; 2.7-3.7 % of a core at real-time pace either way); it only adds an OpenMP
    worker that competes with STT, LLM and TTS for the 2 cores. The setting is
    process-wide in torch; with the default backends nothing else in the process uses
    torch (faster-whisper runs on CTranslate2, llama.cpp and Piper's onnxruntime have
    their own pools), while the optional ``transformers`` LLM backend would then run
    torch on one thread too unless it sets its own count.
    """

    def load(self) -> None:
        import torch
        from silero_vad import load_silero_vad

        torch.set_num_threads(TORCH_THREADS)
        self._torch = torch
        self.model: Any = load_silero_vad(onnx=False)
        self.model.reset_states()

    def speech_probability(self, chunk: np.ndarray) -> float:
        with self._torch.inference_mode():
            return float(self.model(self._torch.from_numpy(chunk), SAMPLE_RATE).item())

    def reset_state(self) -> None:
        self.model.reset_states()
