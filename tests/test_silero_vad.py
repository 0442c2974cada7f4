"""Silero VAD on real speech, and the quiet-input shortcut that keeps idle CPU low."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from handlers.vad.silero_vad import QUIET_RESET_CHUNKS, SileroVADHandler
from speech_to_speech.turns.vad import CHUNK_SAMPLES, VADConfig
from tests.helpers import new_stage

pytestmark = pytest.mark.models
CLIP = Path(__file__).parent / "data" / "librivox-0880.wav"


@pytest.fixture(scope="module")
def vad() -> SileroVADHandler:
    handler = new_stage(SileroVADHandler, config=VADConfig())
    handler.load()
    return handler


def chunks(audio: np.ndarray) -> list[np.ndarray]:
    usable = len(audio) // CHUNK_SAMPLES * CHUNK_SAMPLES
    return list(audio[:usable].reshape(-1, CHUNK_SAMPLES))


class CountingModel:
    """Wraps the TorchScript model and counts calls."""

    def __init__(self, model: Any) -> None:
        self.model, self.calls = model, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.model(*args)

    def reset_states(self) -> None:
        self.model.reset_states()


def test_speech_scores_high_and_quiet_input_skips_the_model(vad: SileroVADHandler) -> None:
    speech, rate = sf.read(str(CLIP), dtype="float32")
    assert rate == 16_000
    counting = CountingModel(vad.model)
    vad.model = counting
    try:
        vad.reset_state()
        scores = [vad.speech_probability(c) for c in chunks(speech)]
        assert max(scores) > 0.9 and counting.calls == len(scores)
        calls = counting.calls
        silence = chunks(np.zeros(16_000 * 2, dtype=np.float32))
        assert [vad.speech_probability(c) for c in silence] == [0.0] * len(silence)
        assert counting.calls == calls  # the model did not run on digital silence
        # after a long quiet stretch the state is fresh: speech is still found at once
        assert len(silence) > QUIET_RESET_CHUNKS
        again = [vad.speech_probability(c) for c in chunks(speech)]
        assert max(again) > 0.9
    finally:
        vad.model = counting.model


def test_quiet_input_costs_far_less_than_scoring_it(vad: SileroVADHandler) -> None:
    """Not a timing goal (see scripts/benchmark_latency.py), a ratio on the same machine and moment."""
    noise = np.random.default_rng(0).normal(0, 0.0002, 16_000 * 3).astype(np.float32)  # -74 dBFS
    loud = np.random.default_rng(1).normal(0, 0.05, 16_000 * 3).astype(np.float32)

    def cost(audio: np.ndarray) -> float:
        start = time.process_time()
        for c in chunks(audio):
            vad.speech_probability(c)
        return time.process_time() - start

    cost(loud)  # warm up
    assert cost(noise) < 0.5 * cost(loud)
