"""The OpenAI-compatible LLM backends against real servers on loopback.

* ``responses-api`` talks, through the real ``openai`` SDK, to the scriptable
  /v1/responses server of :mod:`speech_to_speech.testing.responses_server` (real SSE event shapes).
* ``chat-completions`` talks to a real llama.cpp server (llama-cpp-python's
  ``llama_cpp.server``) serving the embedded Qwen2.5-Coder-0.5B GGUF; these tests, and the
  end-to-end run of ``s2s_pipeline.py`` against it, are marked ``models``.

The handlers are driven the way the pipeline drives them: built with a gate and
an event bus, ``setup()``, then ``process(Transcript)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from handlers.llm.openai_compatible import (
    ChatCompletionsHandler,
    OpenAICompatibleHandler,
    ResponsesAPIHandler,
    build_extra_body,
    is_loopback_url,
    is_official_openai,
    new_call_id,
    to_chat_tools,
)
from speech_to_speech.core.messages import EndOfResponse, TextOutput, ToolCallRequest, Transcript, TTSInput
from speech_to_speech.llm.api import OpenAICompatibleConfig
from speech_to_speech.llm.stage import FAILURE_FALLBACK, TIMEOUT_APOLOGY
from speech_to_speech.speech.text import is_speakable
from speech_to_speech.testing.bench import free_port
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from tests.helpers import new_stage

ROOT = Path(__file__).resolve().parent.parent

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


# -- helpers --------------------------------------------------------------------------
def make_handler(
    cls: type[OpenAICompatibleHandler], base_url: str, model: str = "test-model", **settings: Any
) -> OpenAICompatibleHandler:
    """A set-up handler of class ``cls`` for ``base_url``, built as the pipeline builds it."""
    settings.setdefault("system_prompt", "You are Ada, a helpful voice assistant.")
    config = OpenAICompatibleConfig(model_name=model, responses_api_base_url=base_url, **settings)
    handler = new_stage(cls, config=config, name=f"llm:{cls.__name__}")
    handler.setup()
    return handler


def ask(handler: OpenAICompatibleHandler, text: str = "question", wants_audio: bool = True) -> list[Any]:
    """Everything the handler yields for one user turn ``text``."""
    return list(handler.process(Transcript(handler.gate.new_turn_stamp(), text, wants_audio=wants_audio)))


def check_response(out: list[Any]) -> EndOfResponse:
    """Check the invariants of every response and return its :class:`EndOfResponse`.

    Exactly one end marker, last; every TTS input speakable (never empty, never
    punctuation only); every message stamped with the same turn.
    """
    ends = [m for m in out if isinstance(m, EndOfResponse)]
    assert len(ends) == 1, out
    assert out[-1] is ends[0], out
    for message in out:
        if isinstance(message, TTSInput):
            assert message.text.strip() and is_speakable(message.text), out
        assert message.stamp == ends[0].stamp
    return ends[0]


def spoken(out: list[Any]) -> list[str]:
    """The texts of the :class:`TTSInput` messages in ``out``."""
    return [m.text for m in out if isinstance(m, TTSInput)]


def history(handler: OpenAICompatibleHandler) -> list[tuple[str, str]]:
    """The history as ``(type, role or name)`` pairs."""
    return [(i["type"], i.get("role") or i.get("name", "")) for i in handler.chat.items()]


# -- fixtures --------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their API key themselves."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def server(provider: ResponsesServer) -> ResponsesServer:
    """The module's scriptable /v1/responses server (``provider``) with a fresh default script and no
    recorded requests."""
    provider.script(Reply([Text(["Hello."])]))
    return provider


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real llama.cpp OpenAI-compatible server on loopback serving the embedded GGUF; yields its base URL."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    for extra in ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        pytest.importorskip(extra, reason="pip install 'llama-cpp-python[server]'")
    from handlers.llm.embedded import embedded_gguf

    port = free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(embedded_gguf(None, "qwen2.5-coder-0.5b")),
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", "2048", "--model_alias", "qwen",
    ]  # fmt: skip
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama.cpp server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=5) as reply:
                    if reply.status == 200 and json.load(reply)["data"]:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp server did not answer in 300 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.25)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- pure helpers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://localhost:8000/v1", True),
        ("http://LOCALHOST/v1", True),
        ("http://127.0.0.1:8080/v1", True),
        ("http://127.5.6.7/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://0.0.0.0:8000/v1", False),
        ("http://192.168.1.10:8000/v1", False),
        ("http://localhost.example.com/v1", False),
        ("https://api.openai.com/v1", False),
        ("", False),
        ("not a url", False),
    ],
)
def test_is_loopback_url(url: str, expected: bool) -> None:
    assert is_loopback_url(url) is expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", True),
        ("https://api.openai.com/v1", True),
        ("https://api.openai.com/v1/", True),
        ("https://api.openai.com/", True),
        ("https://api.openai.com", True),
        ("https://API.OpenAI.com/v1", True),
        ("https://api.openai.com.example.net/v1", False),
        ("https://example.com/api.openai.com/v1", False),
        ("http://127.0.0.1:8000/v1", False),
    ],
)
def test_is_official_openai(url: str, expected: bool) -> None:
    assert is_official_openai(url) is expected


def test_build_extra_body() -> None:
    assert build_extra_body("") is None
    assert build_extra_body("https://api.openai.com/v1/", reasoning_effort="low") is None
    local = "http://127.0.0.1:8000/v1"
    assert build_extra_body(local) == {"chat_template_kwargs": {"enable_thinking": False}}
    assert build_extra_body(local, reasoning_effort="minimal") == {"reasoning_effort": "minimal"}
    assert build_extra_body("https://openrouter.ai/api/v1") == {"chat_template_kwargs": {"enable_thinking": False}}


def test_to_chat_tools() -> None:
    converted = to_chat_tools([WEATHER_TOOL, {"type": "web_search"}, {"type": "function", "name": "now"}])
    assert converted == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "now"}},
    ]
    assert to_chat_tools([]) == []


def test_new_call_ids_are_unique() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("call_") for i in ids)


def test_remote_url_without_key_fails_at_setup() -> None:
    with pytest.raises(ValueError, match="API key"):
        make_handler(ResponsesAPIHandler, "https://llm.example.com/v1")


# -- responses-api against the scripted server -----------------------------------------
def test_streamed_text_is_split_into_sentences(server: ResponsesServer) -> None:
    chunks = ["Hello", " there. How", " are you", " today? I am", " fine. Thanks", " for asking."]
    server.script(Reply([Text(chunks)], usage=(33, 17)))
    handler = make_handler(ResponsesAPIHandler, server.base_url, stream_batch_sentences=2)
    out = ask(handler)
    end = check_response(out)
    # the first two chunks alone (the second is what plays next), then batches of two
    assert spoken(out) == ["Hello there.", "How are you today?", "I am fine. Thanks for asking."]
    assert end.error is None
    assert end.text == "".join(chunks)
    assert end.usage == {"input_tokens": 33, "output_tokens": 17}
    assert history(handler) == [("message", "user"), ("message", "assistant")]
    assert handler.chat.items()[-1]["content"] == "".join(chunks)


def test_request_has_instructions_input_and_thinking_off(server: ResponsesServer) -> None:
    handler = make_handler(ResponsesAPIHandler, server.base_url, max_new_tokens=50)
    check_response(ask(handler, "What time is it?"))
    (request,) = server.requests
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "Bearer none"  # loopback, no key
    body = request.body
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["store"] is False
    assert body["max_output_tokens"] == 50
    assert "You are Ada, a helpful voice assistant." in body["instructions"]
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}
    ]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_effort" not in body
    assert "tools" not in body

    check_response(ask(handler, "And the date?"))
    second = server.requests[1].body["input"]
    assert [(i["role"], i["content"][0]["type"], i["content"][0]["text"]) for i in second] == [
        ("user", "input_text", "What time is it?"),
        ("assistant", "output_text", "Hello."),
        ("user", "input_text", "And the date?"),
    ]


def test_reasoning_effort_replaces_enable_thinking(server: ResponsesServer) -> None:
    handler = make_handler(ResponsesAPIHandler, server.base_url, reasoning_effort="low")
    check_response(ask(handler))
    body = server.requests[0].body
    assert body["reasoning_effort"] == "low"
    assert "chat_template_kwargs" not in body


def test_api_key_is_sent(server: ResponsesServer, monkeypatch: pytest.MonkeyPatch) -> None:
    check_response(ask(make_handler(ResponsesAPIHandler, server.base_url, responses_api_api_key="sk-flag")))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    check_response(ask(make_handler(ResponsesAPIHandler, server.base_url)))
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer sk-flag", "Bearer sk-env"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_function_call_becomes_tool_call_request(server: ResponsesServer, stream: bool) -> None:
    server.script(
        Reply([Text(["Let me check", " the weather"]), Call("get_weather", '{"city": "Paris"}', call_id="call_srv_42")])
    )
    handler = make_handler(ResponsesAPIHandler, server.base_url, responses_api_stream=stream)
    handler.tools = [WEATHER_TOOL]
    out = ask(handler, "Weather in Paris?")
    end = check_response(out)
    assert end.error is None
    kinds = [type(m) for m in out]
    assert kinds == [TTSInput, ToolCallRequest, EndOfResponse]  # speech before the call comes first
    assert out[0].text == "Let me check the weather"
    call = out[1]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    assert call.call_id != "call_srv_42"
    assert server.requests[0].body["tools"] == [WEATHER_TOOL]

    items = handler.chat.items()
    calls = [i for i in items if i["type"] == "function_call"]
    assert len(calls) == 1
    assert (calls[0]["call_id"], calls[0]["name"]) == (call.call_id, "get_weather")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert history(handler)[0] == ("message", "user")
    assert ("message", "assistant") in history(handler)

    # the tool's answer goes back under our call id
    handler.chat.add_item({"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'})
    server.script(Reply([Text(["It is 21 degrees in Paris."])]))
    follow_up = ask(handler, "Thanks, so?")
    assert " ".join(spoken(follow_up)) == "It is 21 degrees in Paris."
    sent = server.requests[0].body["input"]
    assert {
        "type": "function_call",
        "call_id": call.call_id,
        "name": "get_weather",
        "arguments": calls[0]["arguments"],
    } in sent
    assert {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'} in sent


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_tool_call_only_reply(server: ResponsesServer, stream: bool) -> None:
    server.script(Reply([Call("get_weather", '{"city": "Oslo"}')]))
    handler = make_handler(ResponsesAPIHandler, server.base_url, responses_api_stream=stream)
    handler.tools = [WEATHER_TOOL]
    out = ask(handler)
    end = check_response(out)
    assert [type(m) for m in out] == [ToolCallRequest, EndOfResponse]
    assert end.error is None
    assert end.text == ""
    assert end.usage == {"input_tokens": 21, "output_tokens": 9}
    assert history(handler) == [("message", "user"), ("function_call", "get_weather")]


def test_blocking_response_is_split_into_sentences(server: ResponsesServer) -> None:
    text = "Hello there. How are you today? I am fine."
    server.script(Reply([Text([text])]))
    handler = make_handler(ResponsesAPIHandler, server.base_url, responses_api_stream=False)
    out = ask(handler)
    end = check_response(out)
    assert spoken(out) == ["Hello there.", "How are you today?", "I am fine."]
    assert server.requests[0].body["stream"] is False
    assert (end.text, end.error) == (text, None)
    assert end.usage == {"input_tokens": 21, "output_tokens": 9}
    assert history(handler) == [("message", "user"), ("message", "assistant")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_text_only_reply_is_raw_deltas(server: ResponsesServer, stream: bool) -> None:
    chunks = ["**Paris**", " is the capital", " of France. 🇫🇷"]
    server.script(Reply([Text(chunks)]))
    handler = make_handler(ResponsesAPIHandler, server.base_url, responses_api_stream=stream)
    out = ask(handler, wants_audio=False)
    end = check_response(out)
    deltas = [m.text for m in out if isinstance(m, TextOutput)]
    assert not spoken(out)
    assert deltas == (chunks if stream else ["".join(chunks)])
    assert "".join(deltas) == end.text
    assert "You are Ada, a helpful voice assistant." in server.requests[0].body["instructions"]


def test_incomplete_response_keeps_text_and_usage(server: ResponsesServer) -> None:
    server.script(Reply([Text(["It was a dark", " and stormy"])], terminal="response.incomplete", usage=(40, 96)))
    handler = make_handler(ResponsesAPIHandler, server.base_url)
    out = ask(handler)
    end = check_response(out)
    assert " ".join(spoken(out)) == "It was a dark and stormy"
    assert end.error is None
    assert end.usage == {"input_tokens": 40, "output_tokens": 96}


@pytest.mark.parametrize("cls", [ResponsesAPIHandler, ChatCompletionsHandler])
@pytest.mark.parametrize("stream", [True, False])
def test_a_reply_cut_at_max_output_tokens_ends_at_its_last_whole_sentence(
    server: ResponsesServer, cls: type[OpenAICompatibleHandler], stream: bool
) -> None:
    """The provider stopped at the cap (Responses: incomplete, max_output_tokens; Chat Completions:
    finish_reason "length"): the unfinished sentence is neither spoken nor kept in history."""
    chunks = ["It was a dark", " and stormy night.", " The wind", " howled.", " Then the", " door"]
    server.script(Reply([Text(chunks)], terminal="response.incomplete", usage=(40, 96)))
    handler = make_handler(cls, server.base_url, responses_api_stream=stream)
    out = ask(handler)
    end = check_response(out)
    assert " ".join(spoken(out)) == "It was a dark and stormy night. The wind howled."
    assert end.text == "It was a dark and stormy night. The wind howled."
    assert handler.chat.items()[-1]["content"] == end.text


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply([]), id="no-output"),
        pytest.param(Reply([Text([])]), id="empty-message"),
        pytest.param(Reply([Text(["**", " 🙂 ", "..."])]), id="unspeakable"),
    ],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_empty_reply(server: ResponsesServer, reply: Reply, stream: bool) -> None:
    # nothing to hear: the listener gets the fallback line instead of silence, and history no reply
    server.script(reply)
    handler = make_handler(ResponsesAPIHandler, server.base_url, responses_api_stream=stream)
    out = ask(handler)
    end = check_response(out)
    assert spoken(out) == [FAILURE_FALLBACK]
    assert not any(isinstance(m, ToolCallRequest) for m in out)
    assert end.error and end.error.startswith("empty reply")
    assert history(handler) == [("message", "user")]
    # a text-only reply is passed on as it is, and is no failure
    out = ask(handler, wants_audio=False)
    assert check_response(out).error is None
    assert not spoken(out)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(status=500), id="http-500"),
        pytest.param(Reply(status=400), id="http-400"),
        pytest.param(Reply([Text(["Hello there. How are you?"])], garbage_after=4), id="malformed"),
        pytest.param(Reply([Text(["Hello there. How are you?"])], cut_after=4), id="truncated"),
        pytest.param(Reply([Text([])], terminal="response.failed"), id="response-failed"),
    ],
)
@pytest.mark.parametrize("wants_audio", [True, False], ids=["voice", "text"])
def test_failure_with_nothing_said_speaks_fallback_once(
    server: ResponsesServer, reply: Reply, wants_audio: bool
) -> None:
    server.script(reply)
    handler = make_handler(ResponsesAPIHandler, server.base_url)
    out = ask(handler, wants_audio=wants_audio)
    end = check_response(out)
    said = [m.text for m in out if isinstance(m, TTSInput | TextOutput)]
    assert said == [FAILURE_FALLBACK]
    assert isinstance(out[0], TTSInput if wants_audio else TextOutput)
    assert end.error
    assert history(handler) == [("message", "user")]  # no assistant message for a failed response
    assert server.requests  # the request did reach the server


def test_failure_after_speech_has_no_fallback(server: ResponsesServer) -> None:
    # event 4 is the first delta; the stream is cut right after it
    server.script(Reply([Text(["First sentence here. Second", " sentence never comes."])], cut_after=5))
    handler = make_handler(ResponsesAPIHandler, server.base_url)
    out = ask(handler)
    end = check_response(out)
    assert spoken(out) == ["First sentence here."]
    assert end.error
    assert history(handler) == [("message", "user")]


def test_failed_turn_then_good_turn(server: ResponsesServer) -> None:
    server.script(Reply(status=500))
    handler = make_handler(ResponsesAPIHandler, server.base_url)
    assert check_response(ask(handler, "first")).error
    server.script(Reply([Text(["Back again."])]))
    end = check_response(ask(handler, "second"))
    assert (end.text, end.error) == ("Back again.", None)
    contents = [(i["role"], i["content"]) for i in handler.chat.items()]
    assert contents[-2:] == [("user", "second"), ("assistant", "Back again.")]
    assert [role for role, _ in contents].count("assistant") == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_timeout_speaks_apology(server: ResponsesServer, stream: bool) -> None:
    server.script(Reply([Text(["Too late."])], delay_s=30))
    handler = make_handler(ResponsesAPIHandler, server.base_url, request_timeout_s=0.5, responses_api_stream=stream)
    started = time.monotonic()
    out = ask(handler)
    assert time.monotonic() - started < 20  # far less than the server's delay
    end = check_response(out)
    assert spoken(out) == [TIMEOUT_APOLOGY]
    assert end.error and end.error.startswith("timeout")
    assert history(handler) == [("message", "user")]


def test_timeout_mid_stream_keeps_what_was_said(server: ResponsesServer) -> None:
    # event 4 is the first delta; the server stalls before event 5
    server.script(Reply([Text(["Sure thing. Let", " me think."])], delay_s=30, delay_at=5))
    handler = make_handler(ResponsesAPIHandler, server.base_url, request_timeout_s=0.5)
    out = ask(handler)
    end = check_response(out)
    assert spoken(out) == ["Sure thing.", TIMEOUT_APOLOGY]
    assert end.error and end.error.startswith("timeout")
    assert history(handler) == [("message", "user")]


def test_barge_in_mid_stream_ends_once_and_writes_nothing(server: ResponsesServer) -> None:
    server.script(Reply([Text(["One. Two", ". Three", ". Four."])]))
    handler = make_handler(ResponsesAPIHandler, server.base_url, stream_batch_sentences=1)
    out = []
    for message in handler.process(Transcript(handler.gate.new_turn_stamp(), "count")):
        out.append(message)
        if isinstance(message, TTSInput):
            handler.gate.scope.cancel()  # the user starts speaking
    end = check_response(out)
    assert spoken(out) == ["One."]
    assert end.error == "cancelled"
    assert history(handler) == [("message", "user")]


# -- chat-completions against a real llama.cpp server --------------------------------------
#: first-token time-out for the real server, s: its first request evaluates the whole voice prompt
#: (~370 tokens) on the server's one thread, 2-4 s on a quiet 2-core machine, more on a busy one; the
#: time-out itself is tested against the scripted server above
LLAMA_SERVER_FIRST_TOKEN_S = 60.0


@pytest.mark.models
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_chat_completions_llama_speaks(llama_server: str, stream: bool) -> None:
    handler = make_handler(
        ChatCompletionsHandler,
        llama_server,
        model="qwen",
        responses_api_stream=stream,
        max_new_tokens=64,
        first_token_timeout_s=LLAMA_SERVER_FIRST_TOKEN_S,
    )
    out = ask(handler, "What is the capital of France?")
    end = check_response(out)
    assert end.error is None, end.error
    said = spoken(out)
    assert said, out
    assert end.text
    assert not any(isinstance(m, TextOutput) for m in out)
    if stream:
        # llama-cpp-python sends no usage chunk when streaming (it ignores stream_options)
        assert all(v > 0 for v in end.usage.values())
    else:
        assert end.usage["input_tokens"] > 0
        assert end.usage["output_tokens"] > 0
    assert history(handler) == [("message", "user"), ("message", "assistant")]
    assert handler.chat.items()[-1]["content"] == end.text

    out = ask(handler, "And of Italy?")
    assert check_response(out).error is None
    assert spoken(out)
    assert history(handler) == [("message", "user"), ("message", "assistant")] * 2


@pytest.mark.models
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_chat_completions_llama_text_only(llama_server: str, stream: bool) -> None:
    handler = make_handler(
        ChatCompletionsHandler,
        llama_server,
        model="qwen",
        responses_api_stream=stream,
        max_new_tokens=48,
        first_token_timeout_s=LLAMA_SERVER_FIRST_TOKEN_S,
    )
    out = ask(handler, "Name three colours.", wants_audio=False)
    end = check_response(out)
    assert end.error is None, end.error
    deltas = [m.text for m in out if isinstance(m, TextOutput)]
    assert not spoken(out)
    assert deltas
    if stream:
        assert len(deltas) > 1
    assert "".join(deltas).strip() == end.text
    assert end.text


def test_chat_completions_connection_refused() -> None:
    handler = make_handler(ChatCompletionsHandler, f"http://127.0.0.1:{free_port()}/v1", request_timeout_s=2)
    out = ask(handler)  # nothing listens there: a connection error, not a hang
    end = check_response(out)
    assert spoken(out) == [FAILURE_FALLBACK]
    assert end.error
    assert history(handler) == [("message", "user")]


@pytest.mark.models
def test_pipeline_end_to_end_with_llama_server(llama_server: str, tmp_path: Path) -> None:
    wav, transcript = tmp_path / "out.wav", tmp_path / "t.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    result = subprocess.run(
        [
            sys.executable, "s2s_pipeline.py",
            "--input_text", "Say hello.",
            "--llm_backend", "chat-completions",
            "--responses_api_base_url", llama_server,
            "--model_name", "qwen",
            "--first_token_timeout_s", str(LLAMA_SERVER_FIRST_TOKEN_S),
            "--output_audio", str(wav),
            "--transcript", str(transcript),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    replies = [e for e in events if e["event"] == "assistant_text"]
    assert len(replies) == 1, events
    assert replies[0]["text"].strip()
    assert replies[0]["error"] is None
    audio, rate = sf.read(str(wav), dtype="float32")
    assert rate > 0
    assert audio.size / rate > 0.3  # at least a short word
    assert float(np.sqrt(np.mean(np.square(audio)))) > 0.005
    assert float(np.max(np.abs(audio))) > 0.05
