"""The mlx-lm LLM backend (``--llm_backend mlx-lm``, the ``mlx`` extra) with the embedded Qwen2.5-Coder-0.5B-Instruct.

Skipped only where mlx-lm cannot be imported. Whether it imports is asked of a child process:
importing mlx in the test process would fix its matrix products to the reference BLAS of the
``mlx[cpu]`` wheel before the handler can bind an optimised one (see
``handlers/llm/mlx_lm_llm.py``), which makes the in-process test below several times slower.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speech_to_speech.core.messages import EndOfResponse, Transcript
from speech_to_speech.pipeline.registry import get_backend
from tests.helpers import check_prefix_reused, new_stage, require_mlx, run_pipeline

pytestmark = pytest.mark.models
ROOT = Path(__file__).resolve().parent.parent
#: a person asking "Hi there! What is the capital of France?" (tests/data/question-capital.txt)
QUESTION = ROOT / "tests" / "data" / "question-capital.wav"


@pytest.fixture(scope="module")
def mlx_llm() -> Any:
    require_mlx()
    backend = get_backend("llm", "mlx-lm")
    config = backend.config_cls(llm_model="qwen2.5-coder-0.5b", max_new_tokens=48)  # the fast one: a float32 copy
    llm = new_stage(backend.load_handler_class(), config=config, device="cpu")
    llm.setup()
    return llm


def test_mlx_lm_reuses_the_prompt_prefix(mlx_llm: Any) -> None:
    """The system prompt is evaluated at load and each turn evaluates only what is new (as llama-cpp does)."""
    mlx_llm.chat.reset()
    out = list(mlx_llm.process(Transcript(mlx_llm.gate.new_turn_stamp(), "What is the capital of France?")))
    first = mlx_llm.last_prompt
    assert first.reused_tokens > 0.6 * first.prompt_tokens, first
    assert isinstance(out[-1], EndOfResponse) and out[-1].error is None
    assert "paris" in out[-1].text.lower(), out[-1].text
    out = list(mlx_llm.process(Transcript(mlx_llm.gate.new_turn_stamp(), "And of Italy?")))
    check_prefix_reused(first, mlx_llm.last_prompt, out)


def test_mlx_lm_answers_a_spoken_question(tmp_path: Path) -> None:
    """File mode: a recorded question goes through VAD, STT, mlx-lm and TTS into a WAV file."""
    require_mlx()
    out, transcript = tmp_path / "out.wav", tmp_path / "t.jsonl"
    flags = ["--llm_backend", "mlx-lm", "--input_audio", str(QUESTION), "--output_audio", str(out)]
    result = run_pipeline(*flags, "--transcript", str(transcript))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    users = [e["text"].lower() for e in events if e["event"] == "user_transcript"]
    # one turn; "Hi there," may be endpointed at its pause and reopened by the rest (a revision)
    assert len({e["turn_id"] for e in events if e["event"] == "user_transcript"}) == 1, users
    assert "capital" in users[-1] and "france" in users[-1], users
    replies = [e for e in events if e["event"] == "assistant_text"]
    assert replies and replies[-1]["error"] is None, replies
    assert "paris" in replies[-1]["text"].lower(), replies[-1]["text"]

    audio, rate = sf.read(str(out), dtype="float32")
    assert rate == 16_000
    clip_s = sf.info(str(QUESTION)).duration
    assert len(audio) / rate >= clip_s  # the input's timeline, with the reply after the question
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    assert len(loud) > 0.2 * rate, "less than 0.2 s of audible reply"
    assert loud[0] / rate > 0.5 * clip_s, "the reply starts before the question was asked"
