"""Silero VAD (the model shipped in the ``silero-vad`` package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from speech_to_speech.vad import SAMPLE_RATE, BaseVADHandler

#: torch intra-op threads for Silero VAD (see :class:`SileroVADHandler`)
TORCH_THREADS = 1
#: chunks with an RMS below this (-60 dBFS; speech at any usable microphone level is 20 dB or
#: more above it) are scored 0 without running the model
SILENCE_RMS = 10 ** (-60 / 20)
#: after this many such chunks in a row (about 1 s) the model's recurrent state is reset, as for
#: a new stream, so that speech after a long quiet stretch is scored from a clean state
QUIET_RESET_CHUNKS = 32


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

    Idle cost: the model alone is about 3 % of a core at real-time pace (31 chunks/s),
    while nobody speaks too. Chunks below :data:`SILENCE_RMS` skip the model (score 0),
    so a quiet input (digital silence, a muted or very quiet microphone) costs almost nothing.
    """

    def load(self) -> None:
        import torch
        from silero_vad import load_silero_vad

        torch.set_num_threads(TORCH_THREADS)
        self._torch = torch
        self.model: Any = load_silero_vad(onnx=False)
        self.model.reset_states()
        self._quiet_chunks = 0

    def speech_probability(self, chunk: np.ndarray) -> float:
        if float(np.sqrt(np.mean(np.square(chunk, dtype=np.float32)))) < SILENCE_RMS:
            self._quiet_chunks += 1
            if self._quiet_chunks == QUIET_RESET_CHUNKS:
                self.model.reset_states()
            return 0.0
        self._quiet_chunks = 0
        with self._torch.inference_mode():
            return float(self.model(self._torch.from_numpy(chunk), SAMPLE_RATE).item())

    def reset_state(self) -> None:
        self.model.reset_states()
        self._quiet_chunks = 0
