"""faster-whisper's short-context passes: a pass that reads the speech twice keeps its first
reading instead of being redone in the 30 s window (handlers/stt/faster_whisper_stt.py)."""

from __future__ import annotations

import numpy as np
import pytest

from handlers.stt.faster_whisper_stt import cut_restart
from speech_to_speech.testing.speech_data import word_error_rate


@pytest.mark.parametrize(
    ("text", "first"),
    [
        # what tiny.en wrote for Piper's "Can you tell me a fun fact about octopuses?" + 0.2 s
        (
            "Can you tell me a fun fact about ochopuses? Can you tell me a fun fact about o",
            "Can you tell me a fun fact about ochopuses?",
        ),
        (
            "He might even have been made amiable himself. He might even",
            "He might even have been made amiable himself.",
        ),
        ("Who wrote it? Who wrote it?", "Who wrote it?"),
        # and in the pipeline, on the same question with its pre-roll: read twice and more
        ("Can you tell me a fun? Can you tell me a fun? Can", "Can you tell me a fun?"),
    ],
)
def test_a_second_reading_is_cut(text: str, first: str) -> None:
    assert cut_restart(text.split()) == first.split()


@pytest.mark.parametrize(
    "text",
    [
        "I went home. I went to bed.",  # starts like the first sentence, then differs
        "Yes. Yes. Yes.",  # too short to tell a restart from what was said
        "Can you tell me a fun fact about octopuses?",
        "The cat sat. The",  # one word again is no restart
        "",
    ],
)
def test_other_transcripts_are_left_alone(text: str) -> None:
    assert cut_restart(text.split()) is None


@pytest.mark.models
def test_the_question_whisper_read_twice_is_heard_in_one_short_pass() -> None:
    """The Piper question on which the final pass took 788 ms (issue 27): no 30 s window now."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from speech_to_speech.testing.turns import synthesize
    from speech_to_speech.turns.stt import STTConfig
    from tests.helpers import new_stage

    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(), name="stt")
    stt.setup()
    question = "Can you tell me a fun fact about octopuses?"
    # the speech and the 200 ms pause the speculative pass is cut at
    text, _ = stt.transcribe(np.concatenate([synthesize(question), np.zeros(3200, np.float32)]), 16_000)
    assert word_error_rate(question, text) <= 0.15, text
    assert stt.full_window_passes == 0
