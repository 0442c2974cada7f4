"""System prompts, chat clean-up for local models, and Whisper language names."""

from __future__ import annotations

import copy

import pytest

from speech_to_speech.llm.prompts import (
    INTERRUPTION_MARKER,
    PLACEHOLDER_USER_CONTENT,
    VOICE_EXAMPLES,
    WHISPER_LANGUAGES,
    build_text_system_prompt,
    build_voice_system_prompt,
    clean_messages_for_local_model,
    language_name,
)
from speech_to_speech.speech.text import split_sentences

PERSONA = "You are Ada, the concierge of the Blue Lagoon hotel."
TOOLS = "TOOLS: get_weather(city) returns the forecast for a city."


def _rules_part(prompt: str, title: str) -> str:
    assert prompt.count(title) == 1
    return prompt.split(title, 1)[1]


# -- voice prompt -----------------------------------------------------------------------------


def test_voice_prompt_order_lead_instructions_tools_rules() -> None:
    prompt = build_voice_system_prompt(PERSONA, TOOLS)
    lead = prompt.index("live voice conversation")
    persona = prompt.index(PERSONA)
    tools = prompt.index(TOOLS)
    examples = prompt.index("EXAMPLES OF GOOD REPLIES")
    rules = prompt.index("VOICE RULES")
    assert lead < persona < tools < examples < rules
    assert prompt.startswith("You are talking with a person in a live voice conversation")


def test_voice_prompt_shows_answer_first_replies_and_forbids_echoes() -> None:
    prompt = build_voice_system_prompt()
    for said, reply in VOICE_EXAMPLES:
        assert f'User: "{said}" You: "{reply}"' in prompt
        assert not set(reply.lower().split()) >= set(said.lower().split())  # an example is no echo
        first = split_sentences(reply)[0]
        assert 1 <= len(first.split()) <= 4, first  # the answer or reaction first, in a few words
    rules = _rules_part(prompt, "VOICE RULES")
    assert "Start with the answer itself, in one to four words" in rules
    rules = _rules_part(prompt, "VOICE RULES")
    assert "Never repeat, quote or rephrase their words." in rules
    assert "EXAMPLES" not in build_text_system_prompt()


def test_voice_lead_explains_roles_of_parts() -> None:
    lead = build_voice_system_prompt(PERSONA).split(PERSONA, 1)[0]
    assert "session instructions below define who you are" in lead
    assert "rules at the end only govern how you speak" in lead


def test_voice_rules_are_the_last_part() -> None:
    prompt = build_voice_system_prompt(PERSONA, TOOLS, language="French")
    rules = _rules_part(prompt, "VOICE RULES")
    # Nothing from the session part comes after the rules heading.
    assert PERSONA not in rules and TOOLS not in rules
    assert prompt.rstrip().endswith(rules.rstrip())
    assert prompt.rstrip().splitlines()[-1].startswith("- ")


def test_voice_rules_content() -> None:
    rules = _rules_part(build_voice_system_prompt(), "VOICE RULES").lower()
    assert "one to four words" in rules and "at most one short sentence" in rules
    assert "markdown" in rules and "lists" in rules and "emoji" in rules and "*laughs*" in rules
    assert "speech transcript" in rules and "misheard" in rules
    assert "do not point out or correct possible mishearings unless" in rules
    assert "tool" not in rules  # tool rules only when tools are offered
    with_tools = _rules_part(build_voice_system_prompt(PERSONA, TOOLS), "VOICE RULES").lower()
    assert "never say the name of a tool" in with_tools
    assert "without announcing it" in with_tools
    assert "say nothing between one tool call and the next" in with_tools


def test_native_tools_get_the_tool_rules_without_a_block() -> None:
    native = _rules_part(build_voice_system_prompt(PERSONA, tools_offered=True), "VOICE RULES").lower()
    assert "never say the name of a tool" in native
    assert "call the tool and answer from its result; never guess" in native
    assert "TOOLS:" not in native  # the chat template or the provider carries the tools themselves


def test_compact_voice_prompt_is_the_persona_and_one_rule() -> None:
    compact = build_voice_system_prompt(compact=True)
    assert compact == (
        "You are a helpful, friendly voice assistant. "
        "Your replies are spoken aloud, so answer in one or two short sentences of plain text."
    )
    assert len(compact.split()) < len(build_voice_system_prompt().split()) // 5
    styled = build_voice_system_prompt(PERSONA, language="fr", tools_offered=True, compact=True)
    assert styled.startswith(PERSONA)
    assert "Always reply in français." in styled
    assert styled.endswith("Use a tool whenever one can answer the question.")
    assert "VOICE RULES" not in styled and "EXAMPLES" not in styled
    assert TOOLS in build_voice_system_prompt(PERSONA, TOOLS, compact=True)


def test_voice_prompt_stays_short() -> None:
    # local engines keep it in the KV cache (evaluated once), but an API provider reads it with every
    # request and a start-up prefill evaluates it: keep the default prompt small (the answer-first
    # examples added ~40 words, evaluated once at start-up by local engines, nothing per turn there).
    # 310: the announcement rule grew by 7 words (308 in all) so that it no longer matches news; its
    # 14-word forms (without "now read or recite" and "wait for it") made the 1.5B answer "Here is the
    # first line of the poem." with "Listen to this line." or a first line of its own (2026-12-07)
    assert len(build_voice_system_prompt().split()) < 310


def test_voice_default_persona_when_instructions_empty() -> None:
    for empty in ("", "   \n"):
        prompt = build_voice_system_prompt(empty)
        assert "helpful, friendly voice assistant" in prompt
        assert prompt.index("helpful, friendly voice assistant") < prompt.index("VOICE RULES")
    assert "helpful, friendly voice assistant" not in build_voice_system_prompt(PERSONA)


def test_voice_tools_block_optional() -> None:
    assert TOOLS in build_voice_system_prompt(PERSONA, TOOLS)
    without = build_voice_system_prompt(PERSONA)
    assert "TOOLS:" not in without
    assert "\n\n\n" not in without


def test_voice_language_rule_only_when_given() -> None:
    assert "Always reply in" not in build_voice_system_prompt(PERSONA)
    assert "Always reply in" not in build_voice_system_prompt(PERSONA, language="")
    prompt = build_voice_system_prompt(PERSONA, language="French")
    rules = _rules_part(prompt, "VOICE RULES")
    assert "Always reply in français" in rules


def test_voice_language_code_turned_into_name() -> None:
    prompt = build_voice_system_prompt(language="fr-FR")
    assert "Always reply in français" in prompt
    assert "reply in fr," not in prompt and "reply in fr-FR" not in prompt


# -- text prompt ------------------------------------------------------------------------------


def test_text_prompt_order_and_content() -> None:
    prompt = build_text_system_prompt(PERSONA, TOOLS, language="German")
    assert prompt.index("text chat") < prompt.index(PERSONA) < prompt.index(TOOLS) < prompt.index("TEXT RULES")
    rules = _rules_part(prompt, "TEXT RULES")
    assert "concise" in rules.lower()
    assert "Markdown is allowed" in rules
    assert "Always reply in Deutsch" in rules
    assert PERSONA not in rules
    assert "VOICE RULES" not in prompt and "one sentence by default" not in prompt


def test_text_prompt_defaults() -> None:
    prompt = build_text_system_prompt()
    assert "helpful, friendly assistant" in prompt
    assert "Always reply in" not in prompt


# -- clean_messages_for_local_model -----------------------------------------------------------


def _sys(text: str = "SYS") -> dict:
    return {"role": "system", "content": text}


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _asst(text: str | None, **extra) -> dict:
    return {"role": "assistant", "content": text, **extra}


TOOL_CALL = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]


def test_clean_keeps_a_well_formed_chat() -> None:
    messages = [_sys(), _user("hi"), _asst("hello"), _user("how are you")]
    assert clean_messages_for_local_model(messages) == messages


def test_clean_drops_empty_and_marker_only_assistant() -> None:
    for content in ("", "  ", None, INTERRUPTION_MARKER, INTERRUPTION_MARKER.strip()):
        messages = [_sys(), _user("a"), _asst(content), _asst("kept")]
        assert clean_messages_for_local_model(messages) == [_sys(), _user("a"), _asst("kept")]


def test_clean_keeps_empty_assistant_with_tool_calls() -> None:
    messages = [
        _user("weather?"),
        _asst(None, tool_calls=TOOL_CALL),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        _asst("It is sunny."),
    ]
    assert clean_messages_for_local_model(messages) == messages


def test_clean_strips_marker_from_last_message_only() -> None:
    middle = "I was saying" + INTERRUPTION_MARKER
    messages = [_user("a"), _asst(middle), _user("b"), _asst("Sure, the answer" + INTERRUPTION_MARKER)]
    out = clean_messages_for_local_model(messages)
    assert out[-1]["content"] == "Sure, the answer"
    assert out[1]["content"] == middle


def test_clean_strips_marker_from_last_user_message() -> None:
    out = clean_messages_for_local_model([_user("hello" + INTERRUPTION_MARKER)])
    assert out == [_user("hello")]


def test_clean_merges_adjacent_same_role() -> None:
    messages = [_sys(), _user("one"), _user("two"), _asst("three"), _asst("four"), _user("five")]
    assert clean_messages_for_local_model(messages) == [
        _sys(),
        _user("one\ntwo"),
        _asst("three\nfour"),
        _user("five"),
    ]


def test_clean_does_not_merge_tool_messages_or_tool_calls() -> None:
    messages = [
        _user("weather in Paris and Rome?"),
        _asst("Checking.", tool_calls=TOOL_CALL),
        _asst(None, tool_calls=[{**TOOL_CALL[0], "id": "call_2"}]),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rainy"},
        _asst("Paris is sunny."),
        _asst("Rome is rainy."),
    ]
    out = clean_messages_for_local_model(messages)
    assert out[:5] == messages[:5]
    assert out[5] == _asst("Paris is sunny.\nRome is rainy.")
    assert len(out) == 6


def test_clean_inserts_user_first() -> None:
    out = clean_messages_for_local_model([_sys(), _asst("Welcome back!"), _user("thanks")])
    assert out == [_sys(), _user(PLACEHOLDER_USER_CONTENT), _asst("Welcome back!"), _user("thanks")]
    out = clean_messages_for_local_model([_asst("Hi there.")])
    assert out == [_user(PLACEHOLDER_USER_CONTENT), _asst("Hi there.")]


def test_clean_no_insert_without_conversation() -> None:
    assert clean_messages_for_local_model([]) == []
    assert clean_messages_for_local_model([_sys()]) == [_sys()]


def test_clean_combined() -> None:
    messages = [
        _sys(),
        _asst("Hi, I am Ada."),
        _user("what's the"),
        _asst(INTERRUPTION_MARKER),  # interrupted before saying anything
        _user("weather like"),
        _asst("It looks"),
        _asst("sunny today" + INTERRUPTION_MARKER),
    ]
    assert clean_messages_for_local_model(messages) == [
        _sys(),
        _user(PLACEHOLDER_USER_CONTENT),
        _asst("Hi, I am Ada."),
        _user("what's the\nweather like"),
        _asst("It looks\nsunny today"),
    ]


def test_clean_does_not_mutate_input() -> None:
    messages = [
        _sys(),
        _asst("first"),
        _user("a"),
        _user("b"),
        _asst(""),
        _asst("x" + INTERRUPTION_MARKER, meta={"k": [1]}),
    ]
    before = copy.deepcopy(messages)
    out = clean_messages_for_local_model(messages)
    assert messages == before
    assert out is not messages
    out[-1]["meta"]["k"].append(2)
    assert messages[-1]["meta"] == {"k": [1]}
    assert all(o is not m for o in out for m in messages)


# -- language names ---------------------------------------------------------------------------


def test_whisper_language_table() -> None:
    assert len(WHISPER_LANGUAGES) == 100
    assert WHISPER_LANGUAGES["en"] == "English"
    assert WHISPER_LANGUAGES["zh"] == "Chinese"
    assert WHISPER_LANGUAGES["yue"] == "Cantonese"
    assert WHISPER_LANGUAGES["haw"] == "Hawaiian"
    assert WHISPER_LANGUAGES["jw"] == "Javanese"
    assert all(code == code.lower() and 2 <= len(code) <= 3 for code in WHISPER_LANGUAGES)
    assert all(name[0].isupper() for name in WHISPER_LANGUAGES.values())
    assert len(set(WHISPER_LANGUAGES.values())) == len(WHISPER_LANGUAGES)


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("en", "English"),
        ("EN", "English"),
        ("en-US", "English"),
        ("en_GB", "English"),
        (" fr ", "French"),
        ("zh-Hant", "Chinese"),
        ("yue", "Cantonese"),
        ("HAW", "Hawaiian"),
        ("jv", "Javanese"),
        ("iw", "Hebrew"),
        ("nb", "Norwegian"),
        (None, None),
        ("", None),
        ("auto", None),
        ("xx", None),
        ("klingon", None),
    ],
)
def test_language_name(code: str | None, name: str | None) -> None:
    assert language_name(code) == name


def test_the_reply_rule_names_the_language_in_itself() -> None:
    # "Always reply in German" primes the embedded 1.5B with Germany (see prompts.ENDONYMS)
    assert "Always reply in Deutsch" in build_voice_system_prompt(language="de")
    assert "German" not in build_voice_system_prompt(language="German")
    assert "Always reply in 日本語" in build_voice_system_prompt(language="ja")
    assert "Always reply in Swahili" in build_voice_system_prompt(language="sw")  # no endonym listed: English
