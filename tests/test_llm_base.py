"""The shared LLM stage: streaming to sentences, the response life cycle and history.

The fake backend is :class:`speech_to_speech.testing.fakes.FakeLLM`, a :class:`LocalLLMHandler` (a
:class:`BaseLLMHandler` whose backend only streams text), driven through :meth:`BaseLLMHandler.process`
without a thread.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from speech_to_speech.core.cancel import Stamp
from speech_to_speech.core.events import AssistantText, Event, FirstToken, ResponseStarted, UserTranscript
from speech_to_speech.core.messages import (
    EndOfResponse,
    FunctionOutput,
    ResponseRequest,
    TextOutput,
    ToolCallRequest,
    Transcript,
    TTSInput,
)
from speech_to_speech.llm.api import ProviderTimeout, TextDelta, Usage
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.stage import FAILURE_FALLBACK, TIMEOUT_APOLOGY, BaseLLMHandler
from speech_to_speech.speech.text import is_speakable
from speech_to_speech.testing import fakes
from speech_to_speech.testing.fakes import FakeLLM, Script


def make_llm(*scripts: Script, history_turns: int = 8, batch: int = 1) -> tuple[FakeLLM, list[Event]]:
    """A set-up :class:`FakeLLM` that goes on streaming until the stage stops pulling (the stage must)."""
    llm, events = fakes.make_llm(*scripts, history_turns=history_turns, batch=batch, heeds_stop=False)
    assert isinstance(llm, BaseLLMHandler)
    return llm, events


def ask(llm: FakeLLM, text: str, stamp: Stamp | None = None, wants_audio: bool = True) -> list[Any]:
    transcript = Transcript(stamp or llm.gate.new_turn_stamp(), text, wants_audio=wants_audio)
    return list(llm.process(transcript))


def texts(out: list[Any]) -> list[str]:
    return [item.text for item in out if isinstance(item, TTSInput)]


def history(llm: FakeLLM) -> list[tuple[str, str]]:
    return [(item["role"], item["content"]) for item in llm.chat.items() if item["type"] == "message"]


def replies(llm: FakeLLM) -> list[str]:
    return [content for role, content in history(llm) if role == "assistant"]


def check_response(out: list[Any]) -> EndOfResponse:
    """Every response: exactly one EndOfResponse, last; every TTSInput speakable and stripped."""
    ends = [item for item in out if isinstance(item, EndOfResponse)]
    assert len(ends) == 1
    assert out[-1] is ends[0]
    for item in out[:-1]:
        assert isinstance(item, (TTSInput, TextOutput))
        assert item.stamp == ends[0].stamp
        if isinstance(item, TTSInput):
            assert item.text and item.text == item.text.strip()
            assert is_speakable(item.text), item.text
    return ends[0]


REPLY = ["Hello", " there", ".", " How", " can", " I", " help", "?", " Ask", " away", "."]


def test_first_sentence_comes_out_before_stream_ends() -> None:
    script = Script(REPLY)
    llm, events = make_llm(script)
    gen = llm.process(Transcript(llm.gate.new_turn_stamp(), "hi"))
    first = next(gen)
    assert isinstance(first, TTSInput)
    assert first.text == "Hello there."
    assert not script.finished.is_set()
    assert script.yielded == REPLY.index(".") + 1  # with its stop: "there." is no abbreviation
    out = [first, *gen]
    end = check_response(out)
    assert texts(out) == ["Hello there.", "How can I help?", "Ask away."]
    assert end.error is None
    assert end.text == "Hello there. How can I help? Ask away."
    assert [type(e) for e in events] == [UserTranscript, ResponseStarted, FirstToken, AssistantText]


def test_batches_after_the_second_chunk() -> None:
    """The first two chunks go alone (the second is what the listener waits for while the first
    plays), then batches of ``stream_batch_sentences``."""
    llm, _ = make_llm(Script([*REPLY, " I", " am", " here", ".", " Go", " on", "."]), batch=2)
    out = ask(llm, "hi")
    check_response(out)
    assert texts(out) == ["Hello there.", "How can I help?", "Ask away. I am here.", "Go on."]


@pytest.mark.parametrize("at_limit", [True, False])
def test_a_spoken_reply_cut_at_its_token_cap_ends_at_its_last_whole_sentence(at_limit: bool) -> None:
    pieces = ["The moon", " orbits Earth.", " It is", " covered in", " craters.", " Its light", " is reflected by"]
    llm = fakes.make_provider_llm([*(TextDelta(p) for p in pieces), Usage(900, 96, at_token_limit=at_limit)])
    out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "Tell me about the moon.")))
    end = check_response(out)
    whole = "".join(pieces)
    said = "The moon orbits Earth. It is covered in craters." if at_limit else whole
    assert " ".join(texts(out)) == said
    assert end.text == said
    assert replies(llm) == [said]


def test_markdown_and_emoji_filtered_and_punctuation_only_batches_skipped() -> None:
    deltas = ["**Sure!**", " 😀😀.", " Here", " is", " `code`", ".", " ...", " 🎉"]
    llm, _ = make_llm(Script(deltas))
    out = ask(llm, "hi")
    end = check_response(out)
    assert texts(out) == ["Sure!", "Here is code."]
    assert end.error is None


def test_text_only_response_passes_raw_deltas() -> None:
    deltas = ["**Sure**", " thing. ", "Done 😀"]
    llm, _ = make_llm(Script(deltas))
    out = ask(llm, "hi", wants_audio=False)
    end = check_response(out)
    assert texts(out) == []
    assert [item.text for item in out if isinstance(item, TextOutput)] == deltas
    assert end.error is None


def test_backend_raises_before_any_text_speaks_fallback() -> None:
    llm, events = make_llm(Script(["never"], raise_after=0))
    out = ask(llm, "hi")
    end = check_response(out)
    assert texts(out) == [FAILURE_FALLBACK]
    assert end.error is not None and "the model crashed" in end.error
    assert replies(llm) == []
    finals = [e for e in events if isinstance(e, AssistantText)]
    assert len(finals) == 1 and finals[0].error == end.error


def test_backend_raises_after_some_text_has_no_fallback() -> None:
    llm, _ = make_llm(Script(REPLY, raise_after=REPLY.index(" can")))
    out = ask(llm, "hi")
    end = check_response(out)
    assert texts(out) == ["Hello there."]
    assert end.error is not None and "ScriptError" in end.error
    assert replies(llm) == []


def test_provider_timeout_speaks_apology() -> None:
    llm, _ = make_llm(Script(["Hel"], raise_after=1, error=ProviderTimeout("20 s")))
    out = ask(llm, "hi")
    end = check_response(out)
    assert texts(out) == [TIMEOUT_APOLOGY]
    assert end.error is not None and "timeout" in end.error


@pytest.mark.parametrize("deltas", [[], [" ", "\n", " "]], ids=["nothing", "whitespace"])
def test_empty_reply_ends_once_and_says_nothing_empty(deltas: list[str]) -> None:
    llm, _ = make_llm(Script(deltas))
    out = ask(llm, "hi")
    end = check_response(out)
    assert end.text == ""
    assert all(text.strip() for text in texts(out))
    assert replies(llm) == []


def test_punctuation_only_reply_speaks_the_fallback() -> None:
    llm, _ = make_llm(Script(["...", " 😀", " !"]))
    out = ask(llm, "hi")
    end = check_response(out)
    assert texts(out) == [FAILURE_FALLBACK]  # nothing to hear is a failure, not silence
    assert end.error is not None and end.error.startswith("empty reply")
    assert replies(llm) == []


def test_empty_request_ends_without_calling_backend() -> None:
    script = Script(["unused."])
    llm, _ = make_llm(script)
    out = ask(llm, "   ")
    end = check_response(out)
    assert end.error is not None
    assert texts(out) == []
    assert script.messages == []  # the backend was never asked
    assert history(llm) == []


def test_cancel_mid_stream_stops_speech_and_skips_history() -> None:
    cancel_at = REPLY.index(" can")
    script = Script(REPLY, cancel_after=cancel_at)
    llm, events = make_llm(script)
    stamp = llm.gate.new_turn_stamp()
    out = ask(llm, "hi", stamp)
    end = check_response(out)
    assert texts(out) == ["Hello there."]  # released before the barge-in, nothing after it
    assert end.stamp == stamp
    assert end.error is not None
    assert not llm.gate.admits(stamp)
    # the stream was abandoned right after the cancel, not drained
    assert script.yielded == cancel_at + 1
    assert not script.finished.is_set()
    assert replies(llm) == []
    assert not any(isinstance(e, AssistantText) for e in events)


def test_cancel_before_first_sentence_emits_only_end() -> None:
    llm, _ = make_llm(Script(REPLY, cancel_after=1))
    out = ask(llm, "hi")
    check_response(out)
    assert texts(out) == []  # not even the failure fallback


def test_stale_transcript_still_ends_once() -> None:
    script = Script(REPLY)
    llm, _ = make_llm(script)
    stamp = llm.gate.new_turn_stamp()
    llm.gate.turns.revise(stamp.turn_id)
    out = ask(llm, "old revision", stamp)
    check_response(out)
    assert texts(out) == []
    assert script.messages == []
    assert history(llm) == []


def test_history_committed_on_success_and_bounded() -> None:
    scripts = [Script([f"Answer {i}."]) for i in range(4)]
    llm, _ = make_llm(*scripts, history_turns=2)
    for i in range(4):
        assert check_response(ask(llm, f"Question {i}")).error is None

    # each request holds the system prompt, the kept history and the new question
    first = scripts[0].messages
    assert first[0]["role"] == "system" and "Be brief." in first[0]["content"]
    assert [(m["role"], m["content"]) for m in scripts[1].messages[1:]] == [
        ("user", "Question 0"),
        ("assistant", "Answer 0."),
        ("user", "Question 1"),
    ]
    assert [m["content"] for m in scripts[3].messages[1:]] == [
        "Question 1",
        "Answer 1.",
        "Question 2",
        "Answer 2.",
        "Question 3",
    ]
    assert history(llm) == [
        ("user", "Question 2"),
        ("assistant", "Answer 2."),
        ("user", "Question 3"),
        ("assistant", "Answer 3."),
    ]


def test_failed_turn_commits_no_reply() -> None:
    llm, _ = make_llm(Script(["Fine."]), Script(["Half", " a"], raise_after=2), Script(["Again."]))
    ask(llm, "one")
    ask(llm, "two")
    ask(llm, "three")
    assert replies(llm) == ["Fine.", "Again."]
    assert "Half a" not in [content for _, content in history(llm)]


def test_chat_refuses_zero_size() -> None:
    with pytest.raises(ValueError):
        Chat(size=0)


def test_language_auto_passes_detected_language_to_prompt() -> None:
    llm, _ = make_llm(Script(["Bonjour."]), Script(["Hello."]))
    llm.config.language = "auto"
    out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "Bonjour, comment ça va ?", language="fr")))
    assert isinstance(out[-1], EndOfResponse)
    system = llm.requests[0][0]
    assert system["role"] == "system" and "français" in system["content"]
    llm.config.language = "en"  # a fixed language does not add a rule
    list(llm.process(Transcript(llm.gate.new_turn_stamp(), "Hello", language="fr")))
    assert "French" not in llm.requests[1][0]["content"]


def test_local_messages_are_cleaned_before_the_model() -> None:
    llm, _ = make_llm(Script(["One."]))
    llm.chat.add_item({"type": "message", "role": "assistant", "content": "Earlier reply"})
    ask(llm, "Question")
    roles = [m["role"] for m in llm.requests[0]]
    assert roles[0] == "system" and roles[1] == "user"  # a user message follows the system prompt
    assert all(a != b or a == "tool" for a, b in itertools.pairwise(roles))


def test_stream_words_sends_whole_words_to_tts() -> None:
    llm, _ = make_llm(Script(["Hel", "lo the", "re, **my** fri", "end."]))
    llm.config.stream_words = True
    out = ask(llm, "Hi")
    words = texts(out)
    assert words == ["Hello", " there,", " my", " friend."]
    assert isinstance(out[-1], EndOfResponse) and out[-1].text == "Hello there, **my** friend."


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_local_tool_call_in_code_block_becomes_ordered_call() -> None:
    llm, _ = make_llm(Script(["Let me check. <co", 'de>get_weather(city="Par', 'is")</code>']))
    llm.tools = [WEATHER_TOOL]
    out = ask(llm, "Weather in Paris?")
    system = llm.requests[0][0]["content"]
    assert "def get_weather(*, city: str)" in system and "<code>" in system
    kinds = [type(m).__name__ for m in out]
    assert kinds == ["TTSInput", "ToolCallRequest", "EndOfResponse"]
    call = out[1]
    assert isinstance(call, ToolCallRequest) and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert texts(out) == ["Let me check."]  # the code block is never spoken
    stored = [i for i in llm.chat.items() if i["type"] == "function_call"]
    assert stored and stored[0]["call_id"] == call.call_id


def test_local_tool_result_is_fed_back_as_plain_messages() -> None:
    llm, _ = make_llm(Script(['<code>get_weather(city="Oslo")</code>']), Script(["It is cold in Oslo."]))
    llm.tools = [WEATHER_TOOL]
    call = next(m for m in ask(llm, "Weather in Oslo?") if isinstance(m, ToolCallRequest))
    list(llm.process(FunctionOutput(call.call_id, '{"temp_c": -3}')))
    out = list(llm.process(ResponseRequest(llm.gate.new_turn_stamp())))
    assert " ".join(texts(out)) == "It is cold in Oslo."  # in chunks: a short first phrase, the rest
    follow_up = llm.requests[1]
    assert all(m["role"] in ("system", "user", "assistant") for m in follow_up)
    joined = "\n".join(m["content"] for m in follow_up)
    assert "<code>get_weather(city='Oslo')</code>" in joined and '[tool result] {"temp_c": -3}' in joined


def test_unknown_local_tool_is_skipped_not_fatal() -> None:
    llm, _ = make_llm(Script(["Sure. <code>launch_rockets(count=3)</code> Done."]))
    llm.tools = [WEATHER_TOOL]
    out = ask(llm, "Go")
    assert not any(isinstance(m, ToolCallRequest) for m in out)
    assert isinstance(out[-1], EndOfResponse) and out[-1].error is None


QUESTION = "Hi there, what is the capital of France?"


def test_the_cut_of_a_reopened_turn_s_first_reply_leaves_its_new_reply_alone() -> None:
    """ "Hi there," is endpointed and answered, then the user goes on: the turn's next revision gets
    its own reply. The first reply's cut (nothing of it heard), handled after that, must not cut
    the new one (it had left "[interrupted by the user]" in its place), and the unheard first reply
    leaves history: the turn reads as one question and one answer."""
    llm, _ = make_llm(Script(["Hello!"]), Script(["Paris."]))
    first = llm.gate.new_turn_stamp()
    ask(llm, "Hi there.", first)
    reopened = llm.gate.stamp(first.turn_id, llm.gate.turns.revise(first.turn_id))
    ask(llm, QUESTION, reopened)
    llm.apply_heard_text(first.turn_id, "", first.revision)  # the first reply's cut, late
    assert history(llm) == [("user", QUESTION), ("assistant", "Paris.")]
    llm.apply_heard_text(first.turn_id, "Par", reopened.revision)  # the new reply's own cut applies
    assert history(llm) == [("user", QUESTION), ("assistant", "Par [interrupted by the user]")]


def test_a_reopened_turn_s_first_reply_cut_unheard_before_the_new_one_leaves_history() -> None:
    """The usual order: the user's speech cuts the first reply (nothing heard) before the reopened
    turn's transcript is answered; no "[interrupted by the user]" stays between question and answer."""
    llm, _ = make_llm(Script(["Hello!"]), Script(["Paris."]))
    first = llm.gate.new_turn_stamp()
    ask(llm, "Hi there.", first)
    llm.apply_heard_text(first.turn_id, "", first.revision)
    assert history(llm) == [("user", "Hi there."), ("assistant", "[interrupted by the user]")]
    reopened = llm.gate.stamp(first.turn_id, llm.gate.turns.revise(first.turn_id))
    ask(llm, QUESTION, reopened)
    assert history(llm) == [("user", QUESTION), ("assistant", "Paris.")]


def test_a_reopened_turn_s_first_reply_partly_heard_stays_cut_to_what_was_heard() -> None:
    llm, _ = make_llm(Script(["Hello! How can I help?"]), Script(["Paris."]))
    first = llm.gate.new_turn_stamp()
    ask(llm, "Hi there.", first)
    reopened = llm.gate.stamp(first.turn_id, llm.gate.turns.revise(first.turn_id))
    ask(llm, QUESTION, reopened)
    llm.apply_heard_text(first.turn_id, "Hello!", first.revision)
    assert history(llm) == [
        ("user", QUESTION),
        ("assistant", "Hello! [interrupted by the user]"),
        ("assistant", "Paris."),
    ]
