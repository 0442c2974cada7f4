"""Local tool calling: schema → signature, the tools prompt, streaming ``<code>`` extraction and safe parsing."""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import os
from typing import Any, Literal, Optional, Union

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from speech_to_speech.llm.prompts import build_text_system_prompt, build_voice_system_prompt
from speech_to_speech.llm.tools import (
    CODE_CLOSE,
    CODE_OPEN,
    CodeBlockExtractor,
    ToolCallParseError,
    build_tool_prompt,
    extract_calls,
    format_annotation,
    parse_call,
    parse_calls,
    render_signature,
    schema_to_annotation,
    schema_to_signature,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"], "default": "c"}},
        "required": ["city"],
    },
}
TIMER = {
    "type": "function",
    "name": "set_timer",
    "description": "Start a countdown timer.",
    "parameters": {
        "type": "object",
        "properties": {
            "minutes": {"type": "integer", "description": "Length of the timer."},
            "label": {"type": "string"},
            "note": {"type": ["string", "null"]},
        },
        "required": ["minutes"],
    },
}
TOOLS = [WEATHER, TIMER]


def _param(parameters: dict[str, Any], name: str) -> inspect.Parameter:
    return schema_to_signature(parameters).parameters[name]


def _one(spec: dict[str, Any], required: bool = True) -> inspect.Parameter:
    """The signature parameter for a single property ``x`` with schema ``spec``."""
    return _param({"type": "object", "properties": {"x": spec}, "required": ["x"] if required else []}, "x")


def _merge_text(parts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Adjacent text parts joined (how text is divided depends on the deltas)."""
    merged: list[tuple[str, Any]] = []
    for kind, payload in parts:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + payload)
        else:
            merged.append((kind, payload))
    return merged


def _run(deltas: list[str], **kwargs: Any) -> list[tuple[str, str]]:
    extractor = CodeBlockExtractor(**kwargs)
    parts = []
    for delta in deltas:
        parts.extend(extractor.feed(delta))
    parts.extend(extractor.flush())
    return parts


# -- schema → signature ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "annotation"),
    [
        ({"type": "string"}, str),
        ({"type": "integer"}, int),
        ({"type": "number"}, float),
        ({"type": "boolean"}, bool),
        ({"type": "null"}, None),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, dict[str, Any]),
        ({"properties": {"a": {"type": "string"}}}, dict[str, Any]),
        ({"type": "array", "items": {"type": "string"}}, list[str]),
        ({"type": "array"}, list[Any]),
        ({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}, list[list[int]]),
        (
            {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}},
            list[list[list[bool]]],
        ),
        ({"type": "array", "items": {"type": "object"}}, list[dict[str, Any]]),
        ({}, Any),
        ({"type": "frobnicate"}, Any),
        ({"description": "anything"}, Any),
        (True, Any),
    ],
)
def test_schema_types_map_to_annotations(spec: Any, annotation: Any) -> None:
    assert schema_to_annotation(spec) == annotation
    if isinstance(spec, dict):
        assert _one(spec).annotation == annotation


def test_const_is_a_single_literal() -> None:
    assert _one({"const": "metric"}).annotation == Literal["metric"]
    assert _one({"const": 3, "type": "integer"}).annotation == Literal[3]


def test_enum_is_a_literal_of_all_values_in_order() -> None:
    annotation = _one({"type": "string", "enum": ["c", "f", "k"]}).annotation
    assert annotation == Literal["c", "f", "k"]
    assert format_annotation(annotation) == "Literal['c', 'f', 'k']"


def test_enum_with_unhashable_values_falls_back_to_any() -> None:
    assert schema_to_annotation({"enum": [[1, 2], {"a": 1}]}) is Any


def test_any_of_is_a_deduplicated_union_in_order() -> None:
    annotation = _one({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "string"}]}).annotation
    assert annotation == Union[str, int]  # noqa: UP007
    assert format_annotation(annotation) == "Union[str, int]"
    # order is kept: int first when it comes first
    assert format_annotation(schema_to_annotation({"anyOf": [{"type": "integer"}, {"type": "string"}]})) == (
        "Union[int, str]"
    )


def test_any_of_with_a_single_distinct_member_is_not_wrapped() -> None:
    assert _one({"anyOf": [{"type": "number"}, {"type": "number"}]}).annotation is float


def test_one_of_is_a_union_and_with_null_is_optional() -> None:
    annotation = _one({"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]}).annotation
    assert annotation == Optional[list[str]]  # noqa: UP045
    assert format_annotation(annotation) == "Optional[list[str]]"


def test_nullable_type_list_is_optional() -> None:
    annotation = _one({"type": ["string", "null"]}).annotation
    assert annotation == Optional[str]  # noqa: UP045
    assert format_annotation(annotation) == "Optional[str]"
    three = schema_to_annotation({"type": ["integer", "string", "null"]})
    assert three == Union[int, str, None]  # noqa: UP007
    assert format_annotation(three) == "Union[int, str, None]"


def test_openapi_nullable_flag_is_optional() -> None:
    assert schema_to_annotation({"type": "integer", "nullable": True}) == Optional[int]  # noqa: UP045


def test_all_of_merges_object_schemas() -> None:
    parameters = {
        "allOf": [
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            {"properties": {"days": {"type": "integer"}}, "required": ["days"]},
            {"properties": {"unit": {"enum": ["c", "f"]}}},
        ]
    }
    signature = schema_to_signature(parameters)
    assert list(signature.parameters) == ["city", "days", "unit"]
    assert signature.parameters["city"].default is inspect.Parameter.empty
    assert signature.parameters["days"].default is inspect.Parameter.empty
    assert signature.parameters["days"].annotation is int
    assert signature.parameters["unit"].default is None
    assert signature.parameters["unit"].annotation == Literal["c", "f"]


def test_all_of_on_a_property_merges_its_members() -> None:
    assert _one({"allOf": [{"type": "string"}, {"minLength": 1}]}).annotation is str
    assert _one({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}).annotation == dict[str, Any]


def test_required_default_and_none_default() -> None:
    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "default": "c"},
            "days": {"type": "integer"},
            "lang": {"type": "string", "default": "en"},
        },
        "required": ["city", "lang"],
    }
    params = schema_to_signature(parameters).parameters
    assert params["city"].default is inspect.Parameter.empty  # required, no default
    assert params["unit"].default == "c"  # schema default
    assert params["days"].default is None  # optional without default
    assert params["lang"].default == "en"  # required but has a default: the default wins
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


def test_required_name_without_property_schema_is_any() -> None:
    params = schema_to_signature({"type": "object", "properties": {}, "required": ["blob"]}).parameters
    assert params["blob"].annotation is Any
    assert params["blob"].default is inspect.Parameter.empty


def test_empty_parameters_give_an_empty_signature() -> None:
    assert not schema_to_signature({}).parameters
    assert not schema_to_signature(None).parameters
    assert not schema_to_signature({"type": "object", "properties": {}}).parameters


@pytest.mark.parametrize("name", ["first-name", "class", "2fast"])
def test_parameter_names_that_are_not_keyword_arguments_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="keyword argument"):
        schema_to_signature({"type": "object", "properties": {name: {"type": "string"}}})


# -- render_signature ---------------------------------------------------------------------------------
def test_render_signature_matches_the_documented_stub() -> None:
    text = render_signature(WEATHER["name"], WEATHER["description"], WEATHER["parameters"])
    assert text == (
        "def get_weather(*, city: str, unit: Literal['c', 'f'] = 'c') -> None:\n"
        '    """Current weather for a city."""'
    )


def test_render_signature_lists_argument_descriptions_and_optional_types() -> None:
    text = render_signature(TIMER["name"], TIMER["description"], TIMER["parameters"])
    assert text == (
        "def set_timer(*, minutes: int, label: str = None, note: Optional[str] = None) -> None:\n"
        '    """Start a countdown timer.\n'
        "\n"
        "    Args:\n"
        "        minutes: Length of the timer.\n"
        '    """'
    )


def test_render_signature_without_parameters_or_description() -> None:
    assert render_signature("dance", "", {}) == "def dance() -> None: ..."
    assert render_signature("dance", "Do a little dance.", None) == 'def dance() -> None:\n    """Do a little dance."""'


def test_render_signature_nested_and_default_values() -> None:
    parameters = {
        "type": "object",
        "properties": {
            "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            "opts": {"type": "object", "default": {"fast": True}},
            "mode": {"const": "x"},
        },
        "required": ["grid"],
    }
    text = render_signature("plot", "Plot.", parameters)
    assert text.splitlines()[0] == (
        "def plot(*, grid: list[list[float]], opts: dict[str, Any] = {'fast': True}, "
        "mode: Literal['x'] = None) -> None:"
    )


def test_render_signature_escapes_triple_quotes_in_the_docstring() -> None:
    text = render_signature("say", 'Says """hi""".', {})
    body = text.split("\n", 1)[1]
    assert body.count('"""') == 2
    compile(text, "<stub>", "exec")  # still valid Python


@pytest.mark.parametrize("name", ["get-weather", "def", ""])
def test_render_signature_rejects_tool_names_that_are_not_identifiers(name: str) -> None:
    with pytest.raises(ValueError):
        render_signature(name, "x", {})


def test_rendered_stubs_are_valid_python() -> None:
    for tool in TOOLS:
        compile(render_signature(tool["name"], tool["description"], tool["parameters"]), "<stub>", "exec")


# -- the tools prompt ----------------------------------------------------------------------------------
def test_tool_prompt_contains_every_signature_and_the_rules() -> None:
    prompt = build_tool_prompt(TOOLS)
    for tool in TOOLS:
        assert render_signature(tool["name"], tool["description"], tool["parameters"]) in prompt
    assert f"{CODE_OPEN}function_name(argument='value'){CODE_CLOSE}" in prompt
    lowered = prompt.lower()
    assert "exactly one call per <code> block" in lowered
    assert "keyword arguments only" in lowered
    assert "string values in quotes" in lowered
    assert "omit an optional argument rather than filling it with a placeholder" in lowered
    assert "never mention tools, functions, code or tags" in lowered


def test_voice_and_text_prompts_differ_only_in_the_spoken_rules() -> None:
    voice = build_tool_prompt(TOOLS, voice=True)
    text = build_tool_prompt(TOOLS, voice=False)
    assert "spoken aloud" in voice and "one short sentence" in voice
    assert "Never claim to have a result" in voice
    assert "spoken aloud" not in text and "short sentence" not in text and "claim" not in text
    assert "without a lead-in sentence" in text and "lead-in" not in voice
    common = [line for line in text.splitlines() if "lead-in" not in line]
    assert common == [line for line in voice.splitlines() if line in common]


def test_tool_prompt_is_empty_without_function_tools() -> None:
    assert build_tool_prompt([]) == ""
    assert build_tool_prompt([], voice=False) == ""
    assert build_tool_prompt([{"type": "web_search"}]) == ""


def test_tool_prompt_skips_tools_that_cannot_be_written_as_python(caplog: pytest.LogCaptureFixture) -> None:
    bad = {"type": "function", "name": "get-weather", "description": "x", "parameters": {}}
    with caplog.at_level(logging.WARNING):
        prompt = build_tool_prompt([bad, WEATHER])
    assert "get-weather" not in prompt.split("Tool call rules")[0]
    assert "def get_weather(" in prompt
    assert "get-weather" in caplog.text
    assert build_tool_prompt([bad]) == ""


def test_tool_prompt_is_not_html_escaped_and_accepts_the_nested_shape() -> None:
    nested = {
        "type": "function",
        "function": {"name": "compare", "description": "Is a < b & b > c?", "parameters": {}},
    }
    prompt = build_tool_prompt([nested])
    assert '"""Is a < b & b > c?"""' in prompt
    assert "&lt;" not in prompt and "&amp;" not in prompt


def test_tool_prompt_fits_in_the_system_prompts() -> None:
    block = build_tool_prompt(TOOLS)
    system = build_voice_system_prompt("You are Ada.", tools_block=block)
    assert block in system
    assert system.index("You are Ada.") < system.index(block) < system.index("VOICE RULES")
    assert build_tool_prompt(TOOLS, voice=False) in build_text_system_prompt("", build_tool_prompt(TOOLS, False))


# -- parse_call ------------------------------------------------------------------------------------------
def test_parse_call_nested_literals() -> None:
    name, arguments = parse_call('plan(a=1, b="x", c=[1, {"k": None}], d=True, e=(1, 2), f={3}, g=-2.5, h=False)')
    assert name == "plan"
    assert arguments == {
        "a": 1,
        "b": "x",
        "c": [1, {"k": None}],
        "d": True,
        "e": (1, 2),
        "f": {3},
        "g": -2.5,
        "h": False,
    }


def test_parse_call_escaped_strings() -> None:
    source = r"say(text='It\'s \"fine\"\n', path=r'C:\dir', snow='\u2603', quote=" + '"""a "b" c""")'
    assert parse_call(source) == (
        "say",
        {"text": 'It\'s "fine"\n', "path": "C:\\dir", "snow": "\u2603", "quote": 'a "b" c'},
    )


def test_parse_call_without_arguments_and_with_whitespace() -> None:
    assert parse_call("dance()") == ("dance", {})
    assert parse_call("\n  get_weather(\n    city='Paris',\n  )\n") == ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    "source",
    [
        "get_weather(city='Paris'",  # syntax error
        "get_weather(city=Paris)",  # bare name
        "get_weather('Paris')",  # positional
        "get_weather(*args)",
        "get_weather(**{'city': 'Paris'})",
        "os.system(cmd='ls')",  # attribute call
        "tools[0](city='Paris')",
        "make()(city='Paris')",
        "get_weather(city=str(1))",  # call inside an argument
        "get_weather(city=lambda: 1)",
        "get_weather(city=f'{1}')",
        "get_weather(city='a' + 'b')",
        "get_weather(city=[x for x in 'ab'])",
        "get_weather(city=(yield))",
        "get_weather",  # not a call
        "'Paris'",
        "a(x=1); b(y=2)",  # parse_call takes exactly one call
        "",
        "get_weather(city='Paris') if True else None",
        "x = get_weather(city='Paris')",
    ],
)
def test_parse_call_rejects_malformed_blocks(source: str) -> None:
    with pytest.raises(ToolCallParseError):
        parse_call(source)


def test_parse_call_error_is_a_value_error() -> None:
    assert issubclass(ToolCallParseError, ValueError)


@pytest.mark.parametrize(
    "source",
    [
        "f(x=__import__('os').system('touch {path}'))",
        "__import__('os').system('touch {path}')",
        "f(x=open('{path}', 'w').write('x'))",
        "f(x=[__import__('os').system('touch {path}')])",
        "f(x={{'k': __import__('os').system('touch {path}')}})",
        "f(x=exec(\"open('{path}', 'w')\"))",
    ],
)
def test_code_injection_is_rejected_and_never_runs(source: str, tmp_path: Any) -> None:
    target = "/tmp/pwned_s2s"
    local_target = tmp_path / "pwned_s2s"
    for path in (target, str(local_target)):
        if os.path.exists(path):
            os.remove(path)
        code = source.format(path=path)
        with pytest.raises(ToolCallParseError):
            parse_call(code)
        with pytest.raises(ToolCallParseError):
            parse_calls(code)
        assert list(extract_calls([("code", code)], [{"type": "function", "name": "f", "parameters": {}}])) == []
        assert not os.path.exists(path)


def test_parse_calls_accepts_several_calls_in_one_block() -> None:
    assert parse_calls("a(x=1)\nb(y='2'); c()") == [("a", {"x": 1}), ("b", {"y": "2"}), ("c", {})]
    assert parse_calls("  ") == []
    with pytest.raises(ToolCallParseError):
        parse_calls("a(x=1)\nimport os")
    with pytest.raises(ToolCallParseError):
        parse_calls("a(x=1)\nb(2)")


# -- CodeBlockExtractor -----------------------------------------------------------------------------------
STREAM = (
    "Sure <co let me look <cod<c. "
    "<code>get_weather(city='Paris', unit='c')</code> One more. "
    '<code>set_timer(minutes=5, label="tea <3")</code><code>nope(</code> tail <'
)
STREAM_PARTS = [
    ("text", "Sure <co let me look <cod<c. "),
    ("code", "get_weather(city='Paris', unit='c')"),
    ("text", " One more. "),
    ("code", 'set_timer(minutes=5, label="tea <3")'),
    ("code", "nope("),
    ("text", " tail <"),
]


def test_whole_stream_in_one_delta() -> None:
    assert _merge_text(_run([STREAM])) == STREAM_PARTS


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40), st.booleans())
def test_any_split_of_the_stream_gives_the_same_parts(cuts: list[int], text_mode: bool) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    deltas = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    parts = _run(deltas, text_mode=text_mode)
    assert _merge_text(parts) == STREAM_PARTS
    assert all(payload for kind, payload in parts if kind == "text")  # no empty text parts


_plain = st.text(alphabet=st.sampled_from("ab <>/cdeo\n'\"()=,"), max_size=12).filter(
    lambda s: CODE_OPEN not in s and CODE_CLOSE not in s
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["text", "code"]), _plain), max_size=6), st.data())
def test_random_streams_round_trip(pieces: list[tuple[str, str]], data: st.DataObject) -> None:
    stream = "".join(f"{CODE_OPEN}{p}{CODE_CLOSE}" if kind == "code" else p for kind, p in pieces)
    # A text piece could end in "<code" and combine with what follows; keep streams unambiguous.
    blocks = sum(kind == "code" for kind, _ in pieces)
    assume(stream.count(CODE_OPEN) == blocks and stream.count(CODE_CLOSE) == blocks)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=10))
    bounds = [0, *sorted(cuts), len(stream)]
    parts = _merge_text(_run([stream[a:b] for a, b in itertools.pairwise(bounds)]))
    expected = _merge_text([(kind, p) for kind, p in pieces if kind == "code" or p])
    assert parts == expected


def test_text_before_a_block_is_released_before_the_block_completes() -> None:
    extractor = CodeBlockExtractor()
    assert extractor.feed("Let me check. ") == [("text", "Let me check. ")]
    assert extractor.feed("<code>get_weather(") == []
    assert extractor.in_block
    assert extractor.feed("city='Paris')") == []
    assert extractor.feed("</code> Done") == [("code", "get_weather(city='Paris')"), ("text", " Done")]
    assert extractor.flush() == []


def test_text_and_block_start_in_the_same_delta() -> None:
    extractor = CodeBlockExtractor()
    assert extractor.feed("Okay. <code>dance(") == [("text", "Okay. ")]
    assert extractor.feed(")</code>") == [("code", "dance()")]


def test_a_possible_tag_prefix_is_held_then_released_as_text() -> None:
    extractor = CodeBlockExtractor()
    assert extractor.feed("Hello <co") == [("text", "Hello ")]
    assert extractor.feed("ol") == [("text", "<cool")]
    assert extractor.feed(" <") == [("text", " ")]
    assert extractor.feed("code") == []
    assert extractor.feed("x") == [("text", "<codex")]
    assert extractor.feed("<") == []
    assert extractor.flush() == [("text", "<")]


def test_a_held_prefix_that_becomes_a_tag_opens_a_block() -> None:
    extractor = CodeBlockExtractor()
    assert extractor.feed("Hi <") == [("text", "Hi ")]
    assert extractor.feed("<") == [("text", "<")]
    assert extractor.feed("co") == []
    assert extractor.feed("de>dance()</co") == []
    assert extractor.feed("de>") == [("code", "dance()")]


def test_text_mode_forwards_everything_but_a_tag_prefix_at_once() -> None:
    extractor = CodeBlockExtractor(text_mode=True)
    assert extractor.text_mode is True
    out = []
    for char in "a <b> c <code>f()</code>!":
        out.extend(extractor.feed(char))
    out.extend(extractor.flush())
    assert out == [
        ("text", "a"),
        ("text", " "),
        ("text", "<b"),
        ("text", ">"),
        ("text", " "),
        ("text", "c"),
        ("text", " "),
        ("code", "f()"),
        ("text", "!"),
    ]


def test_stray_close_tag_is_text() -> None:
    assert _merge_text(_run(["a </code> b"])) == [("text", "a </code> b")]


def test_unclosed_block_at_flush_is_a_code_part_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    extractor = CodeBlockExtractor()
    assert extractor.feed("Sure. <code>get_weather(city='Paris')") == [("text", "Sure. ")]
    with caplog.at_level(logging.WARNING):
        assert extractor.flush() == [("code", "get_weather(city='Paris')")]
    assert "unclosed" in caplog.text
    # the extractor is reset
    assert not extractor.in_block
    assert extractor.feed("again") == [("text", "again")]


def test_truncated_unclosed_block_is_never_spoken_nor_called() -> None:
    parts = _run(["Okay. <code>set_timer(minu"])
    assert list(extract_calls(parts, TOOLS)) == [("text", "Okay. ")]


# -- extract_calls --------------------------------------------------------------------------------------------
def test_several_calls_across_several_blocks_in_one_stream() -> None:
    deltas = [
        "One mo",
        "ment. <co",
        "de>get_weather(city='Par",
        "is')</code><code>set_timer(",
        "minutes=10, label='pasta')</",
        "code> and <code>get_weather(city='Oslo', unit='f')</code>",
    ]
    out = list(extract_calls(_run(deltas), TOOLS))
    assert _merge_text(out) == [
        ("text", "One moment. "),
        ("call", ("get_weather", '{"city": "Paris"}')),
        ("call", ("set_timer", '{"minutes": 10, "label": "pasta"}')),
        ("text", " and "),
        ("call", ("get_weather", '{"city": "Oslo", "unit": "f"}')),
    ]


def test_extract_calls_skips_unknown_tools_and_arguments(caplog: pytest.LogCaptureFixture) -> None:
    parts = [
        ("text", "a"),
        ("code", "launch_rockets(count=3)"),
        ("code", "get_weather(city='Rome', country='IT')"),
        ("code", "set_timer(label='tea')"),  # required "minutes" missing
        ("code", "get_weather(city=Rome)"),  # does not parse
        ("code", "get_weather(city='Rome')"),
        ("text", "b"),
    ]
    with caplog.at_level(logging.WARNING):
        out = list(extract_calls(parts, TOOLS))
    assert out == [("text", "a"), ("call", ("get_weather", '{"city": "Rome"}')), ("text", "b")]
    assert "launch_rockets" in caplog.text
    assert "country" in caplog.text
    assert "minutes" in caplog.text


def test_extract_calls_drops_none_for_optional_arguments_unless_nullable() -> None:
    out = list(extract_calls([("code", "set_timer(minutes=1, label=None, note=None)")], TOOLS))
    assert out == [("call", ("set_timer", '{"minutes": 1, "note": null}'))]


def test_extract_calls_arguments_are_json_objects() -> None:
    tool = {
        "type": "function",
        "name": "store",
        "parameters": {"type": "object", "properties": {"items": {"type": "array"}, "meta": {"type": "object"}}},
    }
    out = list(extract_calls([("code", "store(items=(1, 'é', -2.5), meta={'k': [None, True]})")], [tool]))
    name, arguments = out[0][1]
    assert name == "store"
    assert json.loads(arguments) == {"items": [1, "é", -2.5], "meta": {"k": [None, True]}}


def test_extract_calls_skips_values_that_are_not_json() -> None:
    tool = {"type": "function", "name": "calc", "parameters": {"type": "object", "properties": {"x": {}}}}
    assert list(extract_calls([("code", "calc(x=1e999)")], [tool])) == []
    assert list(extract_calls([("code", "calc(x=1j)")], [tool])) == []
    assert list(extract_calls([("code", "calc(x={(1, 2): 3})")], [tool])) == []


def test_extract_calls_additional_properties_allow_extra_arguments() -> None:
    tool = {
        "type": "function",
        "name": "log",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": True},
    }
    assert list(extract_calls([("code", "log(level='info', msg='x')")], [tool])) == [
        ("call", ("log", '{"level": "info", "msg": "x"}'))
    ]


def test_extract_calls_skips_empty_blocks_and_handles_several_calls_per_block() -> None:
    out = list(extract_calls([("code", " "), ("code", "get_weather(city='A')\nset_timer(minutes=2)")], TOOLS))
    assert out == [
        ("call", ("get_weather", '{"city": "A"}')),
        ("call", ("set_timer", '{"minutes": 2}')),
    ]
