"""Reliability of the realtime server: memory and threads over many sessions, a tool output that
arrives after an interruption, time-outs, and short runs of ``scripts/benchmark_reliability.py``'s
fuzz and provider faults.

The servers run in process (``speech_to_speech/testing/realtime.py``) with the real embedded VAD, STT and
TTS models; the LLM is the embedded llama.cpp model where memory is measured, else the scriptable
``/v1/responses`` endpoint of ``speech_to_speech/testing/responses_server.py`` (so that it can stall and fail).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import psutil
import pytest

import speech_to_speech.realtime.session as session_module
from speech_to_speech.llm.stage import TIMEOUT_APOLOGY
from speech_to_speech.testing.realtime import InProcessServer, RawClient, session_threads
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from tests.helpers import REPO_ROOT, WEATHER_TOOL, load_module, responses_api_flags

pytestmark = pytest.mark.models

#: the longest a single wait for a server event may take on a slow, shared machine, s
WAIT_S = 300.0
#: first-token, next-token and whole-response limits of the scripted server, s (a stall after the
#: first token that only the whole-response limit ended would leave over NEXT_TOKEN_S + SLACK_S of silence)
FIRST_TOKEN_S, NEXT_TOKEN_S, RESPONSE_S = 1.5, 2.0, 12.0
#: how late an answer may come after a limit on a busy machine, s
SLACK_S = 4.0

bench = load_module(REPO_ROOT / "scripts" / "benchmark_reliability.py", "benchmark_reliability_under_test")


def run(scenario: Any, timeout_s: float = 1800.0) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@pytest.fixture(scope="module")
def scripted(provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    """The server with the scripted provider (the conftest fixture) as its LLM, and short time-outs."""
    timeouts = ("--first_token_timeout_s", str(FIRST_TOKEN_S), "--request_timeout_s", str(RESPONSE_S))
    timeouts += ("--next_token_timeout_s", str(NEXT_TOKEN_S))
    return realtime_servers(*responses_api_flags(provider.base_url, "scripted"), *timeouts)


def target(server: InProcessServer) -> Any:
    return bench.Target(server.ws_url, os.getpid(), lambda: True)


# -- 1. memory and threads over sessions -------------------------------------------------------------
#: sessions before the first reading, and sessions measured after it
WARMUP_SESSIONS, MEASURED_SESSIONS = 10, 40
#: RSS growth allowed over the measured sessions, MiB. Before the fix a closed session (its
#: TorchScript VAD, HTTP client, buffers) stayed in memory until a full garbage collection, ~40
#: sessions later: +0.9 MB per session (36 MB here); now ~0.05 MB. Generous for a busy machine.
GROWTH_BOUND_MB = 20.0


def own_threads() -> list[str]:
    """Names of this process's threads, but for the event loops' executor workers (a pool that
    grows up to its bound as needed, and keeps its idle workers)."""
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith("asyncio_"))


def test_closed_sessions_release_their_memory_and_threads(realtime_servers: Callable[..., InProcessServer]) -> None:
    server = realtime_servers("--max_new_tokens", "12")  # every default model, the embedded LLM included
    server.wait_until_idle(WAIT_S)
    process = psutil.Process()
    threads_before = own_threads()
    sessions: list[weakref.ref[Any]] = []
    original = session_module.RealtimeSession.__init__

    def remember(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sessions.append(weakref.ref(self))

    async def one(index: int) -> None:
        session = await bench.Session.open(server.ws_url)
        try:
            await session.update({"type": "server_vad"})
            # every 5th client drops the connection at the reply's first audio (mid-response)
            await session.typed_turn(f"Say hello {index}.", abort_at_audio=index % 5 == 4)
        finally:
            await session.close()
        await asyncio.get_running_loop().run_in_executor(None, server.wait_until_idle, WAIT_S)

    async def scenario() -> tuple[float, float]:
        for i in range(WARMUP_SESSIONS):
            await one(i)
        await asyncio.sleep(0.5)
        warm = process.memory_info().rss / 2**20
        for i in range(MEASURED_SESSIONS):
            await one(WARMUP_SESSIONS + i)
        await asyncio.sleep(0.5)
        return warm, process.memory_info().rss / 2**20

    session_module.RealtimeSession.__init__ = remember  # type: ignore[method-assign]
    gc_was_enabled = gc.isenabled()
    gc.disable()  # only the server's own release may free the sessions' reference cycles
    try:
        warm, end = run(scenario())
        deadline = time.monotonic() + 30
        while any(ref() is not None for ref in sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = [i for i, ref in enumerate(sessions) if ref() is not None]
    finally:
        if gc_was_enabled:
            gc.enable()
        session_module.RealtimeSession.__init__ = original  # type: ignore[method-assign]
    assert len(sessions) == WARMUP_SESSIONS + MEASURED_SESSIONS
    assert not alive, f"closed sessions {alive} (of {len(sessions)}) are still in memory"
    assert not session_threads(), session_threads()
    assert own_threads() == threads_before, [t.name for t in threading.enumerate()]
    assert end - warm <= GROWTH_BOUND_MB, f"RSS grew {end - warm:.1f} MB over {MEASURED_SESSIONS} sessions"


# -- 2. a tool output after an interruption, the provider still streaming ---------------------------


def test_a_tool_output_after_an_interruption_pairs_with_its_call(
    scripted: InProcessServer, provider: ResponsesServer
) -> None:
    # the provider sends a sentence and the call, then keeps the stream open (stalls) with more to say
    call = Call("get_weather", '{"city": "Paris"}')
    provider.script(
        Reply([Text(["Let me check. "]), call, Text(["While I look, ", "here is more."])], delay_s=60, delay_at=12),
        Reply([Text(["It is sunny in Paris."])]),
    )

    async def scenario() -> dict[str, Any]:
        client = await RawClient.open(scripted.ws_url)
        log = client.log
        try:
            await log.wait_for("session.created", WAIT_S)
            update = {"tools": [WEATHER_TOOL], "tool_choice": "auto", "audio": {"input": {"turn_detection": None}}}
            await client.send({"type": "session.update", "session": update})
            await log.wait_for("session.updated", WAIT_S)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}
            await client.send({"type": "conversation.item.create", "item": item})
            await client.send({"type": "response.create"})
            first = (await log.wait_for("response.created", WAIT_S))["response"]["id"]
            shown = await log.wait_for("response.function_call_arguments.done", WAIT_S)
            await client.send({"type": "response.cancel"})  # the user interrupts; the provider still streams
            done = await log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["id"] == first, WAIT_S, what="done 1"
            )
            since = len(log.events)
            output = {"type": "function_call_output", "call_id": shown["call_id"], "output": '{"sky": "sunny"}'}
            await client.send({"type": "conversation.item.create", "item": output, "event_id": "evt_late_output"})
            await client.send({"type": "response.create"})
            second = (await log.wait_for("response.created", WAIT_S, since=since))["response"]["id"]
            follow_up = await log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["id"] == second, WAIT_S, since, "done 2"
            )
            return {"shown": shown, "done": done, "follow_up": follow_up, "after": log.events[since:]}
        finally:
            await client.close()

    r = run(scenario())
    errors = [e for e in r["after"] if e["type"] == "error"]
    assert not errors, errors  # no item_not_found for the late output
    listed = [o for o in r["done"]["response"]["output"] if o.get("type") == "function_call"]
    assert [o["call_id"] for o in listed] == [r["shown"]["call_id"]]
    assert r["follow_up"]["response"]["status"] == "completed", r["follow_up"]["response"]
    follow_up_calls = [o for o in r["follow_up"]["response"]["output"] if o.get("type") == "function_call"]
    assert not follow_up_calls, "the tool was called again"
    body = provider.requests[-1].body
    calls = [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in body["input"] if i.get("type") == "function_call_output"]
    assert calls == outputs == [r["shown"]["call_id"]], body["input"]


# -- 3. time-outs -----------------------------------------------------------------------------------
def test_a_provider_stalled_before_the_first_token_is_answered_within_the_first_token_timeout(
    scripted: InProcessServer, provider: ResponsesServer
) -> None:
    provider.script(Reply([Text(["Too late."])], delay_s=60), Reply([Text(["Back again."])]))

    async def scenario() -> tuple[float, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        session = await bench.Session.open(scripted.ws_url)
        try:
            await session.update(None)
            since = len(session.log.events)
            began = time.monotonic()
            done = await session.typed_turn("Hello?")
            assert done is not None
            rid = done["response"]["id"]
            first_audio = bench.first_audio_after(session.log, rid, since, began)
            assert first_audio is not None, "nothing was spoken"
            events = session.log.events[since:]
            following = await session.typed_turn("Hello again?")
            return first_audio, done, events, following
        finally:
            await session.close()

    first_audio, done, events, following = run(scenario())
    assert first_audio < FIRST_TOKEN_S + SLACK_S, f"the apology started {first_audio:.1f} s after the request"
    rid = done["response"]["id"]
    assert [e["response"]["id"] for e in events if e["type"] == "response.done"].count(rid) == 1
    _, transcript = bench.spoken_text(events, rid)
    assert transcript == TIMEOUT_APOLOGY
    assert done["response"]["status"] == "failed"
    assert following["response"]["status"] == "completed"  # the session goes on


# -- 4. short runs of the benchmark's fuzz and faults ---------------------------------------------
def test_fuzz_short(scripted: InProcessServer) -> None:
    result = run(bench.fuzz(target(scripted), 600, 2, seed=7, max_message_kb=1024, limit_s=600))
    assert not result.crashed
    assert result.sent == 600
    assert result.answered == result.sent - result.oversized, result.unanswered[:5]
    assert result.named == result.with_id > 0
    assert result.internal == 0
    assert result.oversized_closed == result.oversized
    assert result.fresh_client_served


def test_provider_faults_short(scripted: InProcessServer, provider: ResponsesServer) -> None:
    results = run(bench.faults(target(scripted), provider))
    table = json.dumps([r.__dict__ for r in results], indent=1)
    assert {r.name for r in results} == set(bench.FAULTS)
    for r in results:
        assert r.error is None, table
        assert r.dones == 1, table
        assert r.spoken_s > 0 and r.transcript, table
        assert r.next_ok, table
        if r.name.startswith("stall before"):
            assert r.first_audio_s is not None and r.first_audio_s < FIRST_TOKEN_S + SLACK_S, table
        if r.name.startswith("stall after"):  # the sentence before the stall, then the apology: no long silence
            assert r.first_audio_s is not None and r.first_audio_s < FIRST_TOKEN_S + SLACK_S, table
            assert r.silence_s is not None and r.silence_s < NEXT_TOKEN_S + SLACK_S, table
        assert r.silence_s is not None and r.silence_s <= bench.MAX_SILENCE_S, table
