"""Smart Turn v3.2: a semantic end-of-turn model that judges from the audio whether the user is done.

The model (pipecat-ai/smart-turn, BSD-2-Clause, 8.7 MB ONNX, 23 languages) reads
the last 8 s of the utterance at 16 kHz as Whisper-style log-mel features
(80 mel bins x 800 frames, the input of ``WhisperFeatureExtractor(chunk_length=8)``)
and returns the probability that the turn is complete. Its CPU file ships inside
the ``pipecat-ai`` wheel (``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``);
it is located on disk without importing pipecat and run with onnxruntime
(already installed by piper-tts).

Measured on the 2-core target (one intra-op thread): about 25 ms per call,
features included.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

import numpy as np

#: input rate of the model, Hz
SAMPLE_RATE = 16_000
#: audio the model reads: the last 8 s of the utterance (zero-padded at the front), samples
WINDOW_SAMPLES = 8 * SAMPLE_RATE
#: the model file inside the pipecat-ai wheel, relative to the ``pipecat`` package folder
MODEL_IN_PIPECAT = Path("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")


def smart_turn_model_path() -> Path | None:
    """The Smart Turn v3.2 CPU model shipped by ``pipecat-ai``, or None if it is not installed.

    ``find_spec`` of the top-level package reads no code of it, so pipecat's
    import-time side effects (logging set-up, dependency checks) never run.
    """
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / MODEL_IN_PIPECAT
        if path.is_file():
            return path
    return None


class SmartTurnModel:
    """Scores whether an utterance is a finished turn.

    Args:
        model_path: the ONNX file (None: :func:`smart_turn_model_path`).
        threads: onnxruntime intra-op threads (1: the model is small and the other
            stages need the second core).

    Raises:
        FileNotFoundError: no model file (install ``pipecat-ai``).
    """

    def __init__(self, model_path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        path = model_path or smart_turn_model_path()
        if path is None or not Path(path).is_file():
            raise FileNotFoundError(
                "the Smart Turn model is not installed (pip install pipecat-ai, or use --turn_detection silence)"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self.features = WhisperFeatureExtractor(chunk_length=8)
        self.lock = threading.Lock()  # one session may be shared by several pipelines

    def probability(self, samples: np.ndarray) -> float:
        """P(the turn is complete) for float32 mono ``samples`` at 16 kHz (any length; the last 8 s count)."""
        audio = np.asarray(samples, dtype=np.float32)[-WINDOW_SAMPLES:]
        if audio.size < WINDOW_SAMPLES:
            audio = np.pad(audio, (WINDOW_SAMPLES - audio.size, 0))
        features: Any = self.features(
            audio,
            sampling_rate=SAMPLE_RATE,
            return_tensors="np",
            padding="max_length",
            max_length=WINDOW_SAMPLES,
            truncation=True,
            do_normalize=True,
        ).input_features.astype(np.float32)
        with self.lock:
            (logits,) = self.session.run(None, {"input_features": features})
        return float(np.asarray(logits).reshape(-1)[0])
