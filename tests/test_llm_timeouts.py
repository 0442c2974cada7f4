"""Time-outs of the LLM stage: a first token within ``first_token_timeout_s``, each next one within
``next_token_timeout_s``, a whole response within ``request_timeout_s``, the user hearing a short
apology soon, and the session going on.

The provider is the scriptable ``/v1/responses`` server of :mod:`speech_to_speech.testing.responses_server`, reached
through the real ``openai`` SDK; the engine lock of the in-process llama.cpp backend is exercised
with a stand-in for the model.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from handlers.llm.llama_cpp_llm import LlamaEngine
from handlers.llm.openai_compatible import ResponsesAPIHandler
from speech_to_speech.core.messages import ToolCallRequest, Transcript, TTSInput
from speech_to_speech.llm.api import TextDelta
from speech_to_speech.llm.stage import TIMEOUT_APOLOGY
from speech_to_speech.testing.fakes import make_provider_llm
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from tests.test_openai_backends import ask, check_response, make_handler, spoken

#: first-token limit used here, s; the provider stalls far longer
FIRST_TOKEN_S = 1.0
#: how late the apology may come after the limit on a busy machine, s
SLACK_S = 2.5


def provider_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(":provider")]


def wait_no_provider_threads(timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while provider_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return provider_threads()


@pytest.mark.parametrize(
    "stall",
    [
        pytest.param(Reply([Text(["Too late."])], delay_s=60), id="before-headers"),
        pytest.param(Reply([Text(["Too late."])], delay_s=60, delay_at=2), id="after-headers"),
    ],
)
def test_stall_before_the_first_token_is_answered_within_the_first_token_timeout(
    provider: ResponsesServer, stall: Reply
) -> None:
    provider.script(stall, Reply([Text(["Back again."])]))
    handler = make_handler(
        ResponsesAPIHandler, provider.base_url, first_token_timeout_s=FIRST_TOKEN_S, request_timeout_s=20
    )
    started = time.monotonic()
    out = ask(handler)
    took = time.monotonic() - started
    end = check_response(out)
    assert FIRST_TOKEN_S <= took < FIRST_TOKEN_S + SLACK_S, took
    assert spoken(out) == [TIMEOUT_APOLOGY]
    assert end.error and "first token" in end.error
    assert not wait_no_provider_threads(), "the stalled request's reader thread lingers"
    # the session goes on: the next turn is answered
    out = ask(handler, "again")
    assert check_response(out).error is None
    assert spoken(out) == ["Back again."]


def test_a_slow_but_steady_stream_is_not_cut(provider: ResponsesServer) -> None:
    # the first token in time, then a pause longer than the first-token limit but shorter than the
    # next-token one (event 5 is the second delta), all within the total: no time-out
    provider.script(Reply([Text(["One.", " Two."])], delay_s=1.5 * FIRST_TOKEN_S, delay_at=5))
    handler = make_handler(
        ResponsesAPIHandler,
        provider.base_url,
        first_token_timeout_s=FIRST_TOKEN_S,
        next_token_timeout_s=3 * FIRST_TOKEN_S,
    )
    out = ask(handler)
    assert check_response(out).error is None
    assert " ".join(spoken(out)) == "One. Two."


def test_a_whole_sentence_is_spoken_when_the_stream_pauses_after_it(provider: ResponsesServer) -> None:
    # event 4 is "Let me see. ", a whole sentence normally held until more text shows where it ends;
    # the provider then stalls until the whole-response limit
    provider.script(Reply([Text(["Let me see. ", "Hmm"])], delay_s=60, delay_at=5))
    handler = make_handler(
        ResponsesAPIHandler, provider.base_url, first_token_timeout_s=FIRST_TOKEN_S, request_timeout_s=3
    )
    out = []
    started = time.monotonic()
    heard_at = None
    for message in handler.process(Transcript(handler.gate.new_turn_stamp(), "question")):
        out.append(message)
        if isinstance(message, TTSInput) and heard_at is None:
            heard_at = time.monotonic() - started
    end = check_response(out)
    assert spoken(out) == ["Let me see.", TIMEOUT_APOLOGY]
    assert heard_at is not None and heard_at < 3, heard_at  # at the pause, not at the time-out
    assert end.error and end.error.startswith("timeout")


#: next-token limit used here, s; the provider stalls far longer
NEXT_TOKEN_S = 1.5


@pytest.mark.parametrize("stream_words", [False, True], ids=["sentences", "words"])
def test_a_stall_after_the_first_words_is_answered_within_the_next_token_timeout(
    provider: ResponsesServer, stream_words: bool
) -> None:
    # event 4 is "Let me see. ", then the provider stalls (far beyond the whole-response limit)
    provider.script(Reply([Text(["Let me see. ", "Hmm, and then"])], delay_s=60, delay_at=5), Reply([Text(["Back."])]))
    handler = make_handler(
        ResponsesAPIHandler,
        provider.base_url,
        first_token_timeout_s=FIRST_TOKEN_S,
        next_token_timeout_s=NEXT_TOKEN_S,
        request_timeout_s=60,
        stream_words=stream_words,
    )
    out: list[Any] = []
    started = time.monotonic()
    apology_at = None
    for message in handler.process(Transcript(handler.gate.new_turn_stamp(), "question")):
        out.append(message)
        if isinstance(message, TTSInput) and message.text == TIMEOUT_APOLOGY:
            apology_at = time.monotonic() - started
    end = check_response(out)
    assert " ".join(spoken(out)).replace("  ", " ").strip().startswith("Let me see.")
    assert spoken(out)[-1] == TIMEOUT_APOLOGY and "Hmm" not in " ".join(spoken(out))
    assert apology_at is not None and NEXT_TOKEN_S <= apology_at < NEXT_TOKEN_S + SLACK_S, apology_at
    assert end.error and "next token" in end.error
    assert not wait_no_provider_threads(), "the stalled request's reader thread lingers"
    out = ask(handler, "again")  # the session goes on
    assert check_response(out).error is None
    assert spoken(out) == ["Back."]


def test_no_next_token_limit_with_zero(provider: ResponsesServer) -> None:
    # 0 turns the limit off: a pause after the first words lasts until the provider goes on
    provider.script(Reply([Text(["One.", " Two."])], delay_s=2.5 * FIRST_TOKEN_S, delay_at=5))
    handler = make_handler(
        ResponsesAPIHandler, provider.base_url, first_token_timeout_s=FIRST_TOKEN_S, next_token_timeout_s=0
    )
    out = ask(handler)
    assert check_response(out).error is None
    assert " ".join(spoken(out)) == "One. Two."


def test_a_tool_call_streaming_longer_than_the_first_token_limit_is_not_cut(provider: ResponsesServer) -> None:
    # events: 2 the call announced, 3 its arguments' delta, 4 arguments done (after a long pause)
    provider.script(Reply([Call("get_weather", '{"city": "Paris"}')], delay_s=2 * FIRST_TOKEN_S, delay_at=4))
    handler = make_handler(ResponsesAPIHandler, provider.base_url, first_token_timeout_s=FIRST_TOKEN_S)
    out = ask(handler)
    end = check_response(out)
    assert end.error is None, end.error
    assert [m.name for m in out if isinstance(m, ToolCallRequest)] == ["get_weather"]


def test_blocking_requests_have_only_the_total(provider: ResponsesServer) -> None:
    # a blocking request brings its first token with its last: the first-token limit does not apply
    provider.script(Reply([Text(["Whole answer."])], delay_s=1.5))
    handler = make_handler(
        ResponsesAPIHandler, provider.base_url, first_token_timeout_s=0.5, responses_api_stream=False
    )
    out = ask(handler)
    assert check_response(out).error is None
    assert spoken(out) == ["Whole answer."]


def test_an_in_process_backend_gets_the_first_token_timeout_and_is_stopped() -> None:
    # a backend stuck before its first token until told to stop (an engine busy elsewhere)
    llm = make_provider_llm([TextDelta("never heard")], blocks=True, first_token_timeout_s=0.5)
    started = time.monotonic()
    out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "hello")))
    assert time.monotonic() - started < 0.5 + SLACK_S
    assert [m.text for m in out if isinstance(m, TTSInput)] == [TIMEOUT_APOLOGY]
    assert llm.released.wait(2), "the backend was never told to stop"
    assert not wait_no_provider_threads()


class _FakeLlama:
    """Stands in for ``llama_cpp.Llama`` in :class:`LlamaEngine` (the lock is what is tested)."""

    n_tokens = 0
    _input_ids: Any = None

    def create_completion(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield {"choices": [{"text": "hi"}]}


def test_llama_engine_gives_up_waiting_for_its_lock_when_stopped() -> None:
    engine = LlamaEngine.__new__(LlamaEngine)  # no model: only the lock matters here
    engine.lock = threading.Lock()
    engine._evaluator = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    engine._waiting, engine._waiting_lock = 0, threading.Lock()  # replies waiting for the lock
    engine.llm = _FakeLlama()
    engine.n_threads = engine._threads_now = 1  # one thread: fit_threads never changes it
    engine.cached_prefix = lambda tokens: 0  # type: ignore[method-assign]
    stop = threading.Event()
    started: list[Any] = []
    with engine.lock:  # another session is generating
        threading.Timer(0.2, stop.set).start()
        began = time.monotonic()
        pieces = list(engine.stream([1, 2], 8, 0.0, stop.is_set, started.append))
        waited = time.monotonic() - began
    assert pieces == [] and started == []  # never took the engine
    assert 0.2 <= waited < 0.2 + SLACK_S
    assert list(engine.stream([1, 2], 8, 0.0, lambda: False, started.append)) == ["hi"]
    assert not engine.lock.locked()
