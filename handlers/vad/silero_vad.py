"""Silero VAD (the model shipped in the ``silero-vad`` package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from speech_to_speech.core.audio import rms
from speech_to_speech.core.shared import shared_model
from speech_to_speech.turns.vad import SAMPLE_RATE, BaseVADHandler

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

    Sharing: the TorchScript model is loaded once per process (:func:`shared_model`); each
    handler keeps only its stream's recurrent state (:class:`SileroStream`). Loading it per
    session cost ~9 MB of allocations, and a loaded TorchScript module is a web of reference
    cycles, freed only by a full garbage collection (which a server with ~350,000 live objects
    runs every ~40 sessions): that was most of the server's RSS growth per session.
    """

    def load(self) -> None:
        import torch
        from silero_vad import load_silero_vad

        torch.set_num_threads(TORCH_THREADS)
        self._torch = torch
        scripted = shared_model(("silero-vad", "jit"), lambda: load_silero_vad(onnx=False))
        self.model: Any = SileroStream(scripted, torch)
        self._quiet_chunks = 0

    def cleanup(self) -> None:
        super().cleanup()
        self.model = None  # the stream's state; the network stays loaded for other sessions

    def speech_probability(self, chunk: np.ndarray) -> float:
        if rms(chunk) < SILENCE_RMS:
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


class SileroStream:
    """One audio stream over the shared Silero network: the recurrent state and the context the
    TorchScript wrapper (``load_silero_vad()``) would keep in itself, so that one loaded model
    serves every session.

    Same results as the wrapper for 16 kHz mono chunks of 512 samples: the last
    ``context_size_samples`` (64) samples of the previous chunk go in front of each chunk, and the
    network's ``forward(x, state)`` returns the probability and the next state. The network holds
    no state of its own, so concurrent streams may call it from their own threads.

    Args:
        scripted: the loaded TorchScript wrapper (its ``_model`` is the 16 kHz network).
        torch: the ``torch`` module.
    """

    def __init__(self, scripted: Any, torch: Any) -> None:
        self._net = scripted._model
        self._torch = torch
        self._context_size = int(self._net.context_size_samples)
        self.reset_states()

    def reset_states(self) -> None:
        """Start a new stream."""
        self._state = self._torch.zeros([0])
        self._context = self._torch.zeros([0])

    def __call__(self, x: Any, sr: int) -> Any:
        """The speech probability of chunk ``x`` (a 1-D float tensor), as a ``[1, 1]`` tensor.

        Raises:
            ValueError: ``sr`` is not 16000.
        """
        if sr != SAMPLE_RATE:
            raise ValueError(f"Silero VAD streams here take {SAMPLE_RATE} Hz, got {sr} Hz")
        torch = self._torch
        x = x.unsqueeze(0) if x.dim() == 1 else x
        if not len(self._context):
            self._context = torch.zeros([x.shape[0], self._context_size])
        joined = torch.cat([self._context, x], 1)
        out, self._state = self._net(joined, self._state)
        self._context = joined[:, -self._context_size :]
        return out
