"""JSON tool calls as chat-template models write them: tagged, fenced or bare, split anywhere."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speech_to_speech.llm.tools.json_calls import JsonCallExtractor, parse_json_calls
from speech_to_speech.llm.tools.parse import extract_calls

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    }
]

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
REPLIES = {
    "tagged": f"Let me check. <tool_call>\n{CALL}\n</tool_call>",
    "fenced": f"Let me check. ```json\n{CALL}\n```",
    "bare": f"Let me check. {CALL}",
}


def run(reply: str, pieces: int) -> list[tuple[str, Any]]:
    """Feed ``reply`` in ``pieces``-character deltas; return the validated parts, text joined."""
    extractor = JsonCallExtractor()
    parts: list[tuple[str, str]] = []
    for start in range(0, len(reply), pieces):
        parts += extractor.feed(reply[start : start + pieces])
    parts += extractor.flush()
    merged: list[tuple[str, Any]] = []
    for kind, value in extract_calls(parts, TOOLS):
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


@pytest.mark.parametrize("form", sorted(REPLIES))
@pytest.mark.parametrize("pieces", [1, 3, 7, 1000])
def test_each_form_gives_the_call_and_keeps_the_text(form: str, pieces: int) -> None:
    parts = run(REPLIES[form], pieces)
    assert parts[0] == ("text", "Let me check. ")
    assert [kind for kind, _ in parts[1:]] == ["call"]
    name, arguments = parts[1][1]
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}


def test_text_after_a_call_and_braces_inside_strings() -> None:
    reply = '{"name": "get_weather", "arguments": {"city": "Paris {north}"}} Done.'
    parts = run(reply, 2)
    assert parts[0][0] == "call" and json.loads(parts[0][1][1]) == {"city": "Paris {north}"}
    assert parts[1] == ("text", " Done.")


def test_plain_text_is_released_at_once_except_a_possible_opener() -> None:
    extractor = JsonCallExtractor()
    assert extractor.feed("It is sunny`") == [("text", "It is sunny")]  # "`" may open a fence
    assert extractor.feed("s are nice.") == [("text", "`s are nice.")]
    assert extractor.feed(" See <tool") == [("text", " See ")]
    assert extractor.flush() == [("text", "<tool")]


def test_unclosed_call_at_the_end_of_the_stream_still_counts() -> None:
    parts = run('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}', 5)
    assert [kind for kind, _ in parts] == ["call"]
    assert json.loads(parts[0][1][1]) == {"city": "Rome"}


def test_unknown_tools_and_bad_arguments_are_skipped_json_that_is_no_call_is_text() -> None:
    assert run('{"name": "launch_rockets", "arguments": {}}', 4) == []
    assert run('{"name": "get_weather", "arguments": {"town": "Paris"}}', 4) == []
    assert run("Braces {like these} stay text.", 4) == [("text", "Braces {like these} stay text.")]


def test_parse_json_calls_forms() -> None:
    assert parse_json_calls(CALL) == [("get_weather", {"city": "Paris"})]
    listed = f"[{CALL}, {CALL}]"
    assert parse_json_calls(listed) == [("get_weather", {"city": "Paris"})] * 2
    as_string = '{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'
    assert parse_json_calls(as_string) == [("get_weather", {"city": "Oslo"})]
    assert parse_json_calls('{"name": "get_weather", "parameters": {"city": "Oslo"}}') == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert parse_json_calls("{not json") is None
    assert parse_json_calls('{"city": "Paris"}') is None
    assert parse_json_calls('{"name": "x", "arguments": [1]}') is None
