"""Spoken questions that need a tool, through the real STT and the embedded 1.5B with the sample tools.

espeak-ng (or the embedded Piper voice) says each question, the embedded Whisper tiny.en
transcribes it, and the llama.cpp stage (Qwen2.5-Coder-1.5B-Instruct, the voice system prompt
with its tool rules, the model's tool-call threshold) answers the transcript as a spoken turn.
Before the threshold and the tool rules, the 1.5B answered the time and sums from memory ("The
current date and time in Tokyo is 2023-10-05T14:30:00+09:00"); a question no tool serves must
still get no call, and a turn the threshold forces into a call that makes up its numbers gets
words instead.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from handlers.llm.embedded import EMBEDDED_MODELS
from handlers.llm.llama_cpp_llm import LlamaCppLLMHandler
from speech_to_speech.client.talk import sample_tools
from speech_to_speech.core.messages import ToolCallRequest, Transcript, TTSInput
from tests.helpers import new_stage

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"),
    pytest.mark.skipif(
        not all(importlib.util.find_spec(part) for part in EMBEDDED_MODELS["qwen2.5-coder-1.5b"].parts),
        reason="the Qwen2.5-Coder-1.5B parts are not installed",
    ),
]

#: question -> the call it needs (name, arguments), or None for no call
QUESTIONS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "What time is it in Tokyo?": ("get_time", {"timezone": "Asia/Tokyo"}),
    "Can you add seventeen and twenty five?": ("add", {"a": 17, "b": 25}),
    "What is the capital of France?": None,
    # p(call) above the threshold; the call it was forced into made up add(5, 3), now undone
    "Hi, I need some help with a few numbers.": None,
}
#: a word the reply to each question that needs no call must say
ANSWERS = {"What is the capital of France?": "paris", "Hi, I need some help with a few numbers.": "number"}
#: questions said by the embedded Piper voice instead (tiny.en hears espeak-ng's "numbers" as "hummors")
PIPER = {"Hi, I need some help with a few numbers."}


def spoken(text: str, folder: Path) -> np.ndarray:
    """``text`` said by espeak-ng (US English), as 16 kHz mono float32 samples."""
    path = folder / "say.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "165", "-w", str(path), text], check=True)
    samples, rate = sf.read(path, dtype="float32")
    return soxr.resample(samples, rate, 16_000).astype(np.float32)


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each question as the pipeline's STT stage hears it (the embedded tiny.en, its own passes)."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from speech_to_speech.turns.stt import STTConfig

    folder = tmp_path_factory.mktemp("speech")
    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(), name="stt")
    stt.setup()
    from speech_to_speech.testing.turns import synthesize

    def audio(question: str) -> np.ndarray:
        return synthesize(question) if question in PIPER else spoken(question, folder)

    return {question: stt.transcribe(audio(question), 16_000)[0] for question in QUESTIONS}


@pytest.fixture(scope="module")
def llm() -> Any:
    from speech_to_speech.pipeline.registry import get_backend

    config = get_backend("llm", "llama-cpp").config_cls(llm_model="qwen2.5-coder-1.5b", first_token_timeout_s=0)
    stage = new_stage(LlamaCppLLMHandler, config=config, name="llm:llama-cpp")
    stage.setup()
    stage.tools = list(sample_tools.TOOLS)
    yield stage
    stage.stop_event.set()
    stage.cleanup()


@pytest.mark.parametrize("question", list(QUESTIONS))
def test_a_spoken_question_calls_the_tool_it_needs(question: str, transcripts: dict[str, str], llm: Any) -> None:
    heard = transcripts[question]
    llm.chat.reset()
    calls, said = [], ""
    for out in llm.process(Transcript(llm.gate.new_turn_stamp(), heard, wants_audio=True)):
        if isinstance(out, ToolCallRequest):
            calls.append((out.name, json.loads(out.arguments)))
        elif isinstance(out, TTSInput):
            said += out.text
    expected = QUESTIONS[question]
    if expected is None:
        assert calls == [], f"heard {heard!r}, called {calls}"
        assert said.strip() and ANSWERS[question] in said.lower(), f"heard {heard!r}, said {said!r}"
        return
    name, arguments = expected
    assert [call[0] for call in calls] == [name], f"heard {heard!r}, said {said!r}"
    made = {key: value for key, value in calls[0][1].items() if value not in (None, "")}
    assert made == arguments, f"heard {heard!r}"


def test_a_tool_result_after_a_question_back_is_answered_not_thanked(transcripts: dict[str, str], llm: Any) -> None:
    """The 1.5B asked "What numbers do you need assistance with?"; the user's next words called add;
    its result (shown to the model as a user turn) was thanked for ("Thank you! Is there anything
    else...") until the result carried TOOL_RESULT_NOTE."""
    from handlers.llm.llama_cpp_llm import _messages
    from speech_to_speech.llm.api import LLMRequest, TextDelta
    from speech_to_speech.llm.chat import Chat
    from speech_to_speech.llm.prompts import TOOL_RESULT_NOTE

    chat = Chat()
    chat.add_item(
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Hi, I need some help with a few numbers."}],
        }
    )
    chat.add_item(
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Sure, I'd be happy to help! What numbers do you need assistance with?"}
            ],
        }
    )
    chat.add_item(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Please add 120 and 80."}]}
    )
    chat.add_item({"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 120, "b": 80}'})
    chat.append_tool_output("call_1", '{"result": 200}')
    request = LLMRequest(llm.system_prompt(True, None, None, llm.tools), chat.items(), tools=llm.tools)
    said = "".join(e.text for e in llm.events(request, lambda: False) if isinstance(e, TextDelta))
    assert "200" in said and "thank" not in said.lower(), said
    messages = _messages(request)
    assert messages[-1]["role"] == "tool" and messages[-1]["content"].endswith(TOOL_RESULT_NOTE)
    assert all(TOOL_RESULT_NOTE not in str(m.get("content")) for m in messages[:-1])


def test_a_forced_call_that_writes_a_result_is_written_again_as_a_call(llm: Any) -> None:
    """After a get_time result in the history, the call the threshold forced for the London
    question opened with a bare '{' and wrote a made-up result for 6 s ('{"timezone":
    "Europe/London", "iso": ...'): the turn ended in the first-token apology in every conversation
    benchmark run. It is now stopped and written again from '{"name": "' (handlers/llm/call_threshold.py)."""
    from speech_to_speech.llm.api import LLMRequest, ToolCall
    from speech_to_speech.llm.chat import Chat

    def said(role: str, text: str) -> dict[str, Any]:
        kind = "input_text" if role == "user" else "output_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    chat = Chat()
    chat.add_item(said("user", "What time is it in Tokyo?"))
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time"}
    chat.add_item({**call, "arguments": json.dumps({"timezone": "Asia/Tokyo"})})
    tokyo = sample_tools.get_time("Asia/Tokyo")  # the sample tool's result, as the benchmark's session got it
    chat.append_tool_output("call_1", json.dumps(tokyo))
    chat.add_item(said("assistant", f"The current time in Tokyo is {tokyo['time']}."))
    chat.add_item(said("user", "Can you add 17 and 25?"))
    chat.add_item(said("assistant", "The sum of 17 and 25 is 42."))
    chat.add_item(said("user", "Thanks. What's the capital of Spain?"))
    chat.add_item(said("assistant", "The capital of Spain is Madrid."))
    chat.add_item(said("user", "What's the time and London right now?"))  # as tiny.en heard it
    request = LLMRequest(llm.system_prompt(True, None, None, llm.tools), chat.items(), tools=llm.tools)
    calls = [e for e in llm.events(request, lambda: False) if isinstance(e, ToolCall)]
    assert [(c.name, json.loads(c.arguments).get("timezone")) for c in calls] == [("get_time", "Europe/London")], calls
