"""The whole tool loop: a response calls a tool, the client answers it, the follow-up is spoken.

Three levels:

1. the LLM stage alone (:class:`speech_to_speech.testing.fakes.FakeLLM` running as a real stage thread between
   real stage queues, with a :class:`PrefetchCoordinator`): the follow-up to the tool result is
   generated *hidden* as soon as every call is answered, and is either claimed by a plain
   ``response.create`` (a :class:`ResponseRequest` with claim options, in the stage's queue: its
   output then flows, in the stage's own thread) or discarded without a trace; a failed hidden
   generation discards itself; no prefetch starts while the client's own request is waiting;
2. the realtime server in process, driven by the official ``openai`` SDK, with the
   ``responses-api`` backend pointed at the scripted :mod:`speech_to_speech.testing.responses_server`: the call is
   announced on the side channel, the client sends the output and a plain ``response.create``, and
   the follow-up is served from the prefetch; sent back to back, output and request still give
   exactly one follow-up (these load the embedded VAD, STT and TTS, hence ``models``);
3. the embedded Qwen2.5-Coder-0.5B through the default ``llama-cpp`` backend with the sample tools:
   the model's choice is only recorded; the pipeline's guarantees are asserted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from openai import AsyncOpenAI

from speech_to_speech.core.events import AssistantText, Event, ResponseStarted
from speech_to_speech.core.messages import (
    EndOfResponse,
    FunctionOutput,
    ResponseRequest,
    ToolCallRequest,
    Transcript,
    TTSInput,
)
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.api import LlamaCppConfig, new_call_id
from speech_to_speech.llm.hidden_response import DiscardFollowUp
from speech_to_speech.llm.prefetch import PrefetchCoordinator, PrefetchState, ResponsePrefetchTransaction
from speech_to_speech.llm.stage import FAILURE_FALLBACK
from speech_to_speech.pipeline.registry import get_backend
from speech_to_speech.realtime.session import RealtimeSession
from speech_to_speech.testing.fakes import FakeLLM, Script, make_llm
from speech_to_speech.testing.realtime import EventLog, InProcessServer
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from tests.helpers import WEATHER_TOOL, new_stage

if TYPE_CHECKING:
    from openai.resources.realtime.realtime import AsyncRealtimeConnection

#: upper bound of any single wait in the unit-level tests, s (they finish in milliseconds)
WAIT_S = 10.0
#: how long "nothing arrives" is watched for, s
QUIET_S = 0.3


# == 1. the LLM stage: hidden follow-up, claim and discard ===========================================
class RecordingCoordinator(PrefetchCoordinator):
    """A :class:`PrefetchCoordinator` that keeps every transaction it started."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[ResponsePrefetchTransaction] = []

    def try_start(self, key: str, fingerprint: dict) -> ResponsePrefetchTransaction | None:
        txn = super().try_start(key, fingerprint)
        if txn is not None:
            self.started.append(txn)
        return txn


@dataclass
class Stage:
    """A :class:`FakeLLM` running as a stage thread, and what it produced."""

    llm: FakeLLM
    inq: StageQueue
    outq: StageQueue
    events: list[Event]

    @property
    def prefetch(self) -> RecordingCoordinator:
        """The LLM's prefetch coordinator."""
        assert isinstance(self.llm.prefetch, RecordingCoordinator)
        return self.llm.prefetch

    def take_until_end(self, timeout_s: float = WAIT_S) -> list[Any]:
        """Items from the output queue up to and including the next :class:`EndOfResponse`."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while not out or not isinstance(out[-1], EndOfResponse):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no EndOfResponse within {timeout_s} s; got {out}"
            try:
                out.append(self.outq.get(timeout=remaining))
            except queue.Empty:
                continue
        return out

    def quiet(self, seconds: float = QUIET_S) -> list[Any]:
        """Whatever reaches the output queue within ``seconds`` (should be nothing)."""
        try:
            return [self.outq.get(timeout=seconds)]
        except queue.Empty:
            return []

    def events_of(self, kind: type[Event], since: int = 0) -> list[Event]:
        """Published events of type ``kind`` at index ``since`` or later."""
        return [e for e in self.events[since:] if isinstance(e, kind)]

    def history(self) -> list[tuple[str, str]]:
        """``(role, content)`` of the messages in history."""
        return [(i["role"], i["content"]) for i in self.llm.chat.items() if i["type"] == "message"]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` (test code only) until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.005)


@pytest.fixture
def make_stage() -> Iterator[Callable[..., Stage]]:
    """Build a started LLM stage playing the given scripts; stopped at the end of the test."""
    started: list[FakeLLM] = []

    def build(*scripts: Script, start: bool = True) -> Stage:
        inq, outq = StageQueue(16), StageQueue(64)
        llm, events = make_llm(*scripts, heeds_stop=True, inq=inq, outq=outq, set_up=False, name="llm")
        llm.prefetch = RecordingCoordinator()
        llm.tools = [WEATHER_TOOL]
        if start:
            llm.start()
            assert llm.ready.wait(WAIT_S) and llm.setup_error is None
            started.append(llm)
        else:
            llm.setup()
        return Stage(llm, inq, outq, events)

    yield build
    for llm in started:
        llm.stop_event.set()
        for script in llm.played + llm.scripts:
            script.resume.set()
        llm.join(WAIT_S)


CALLING_DELTAS = ["Let me check. <co", 'de>get_weather(city="Par', 'is")</code>']
WEATHER_OUTPUT = '{"sky": "sunny", "temp_c": 24}'


def calling_script() -> Script:
    """A reply that says one sentence and calls get_weather(city="Paris")."""
    return Script(list(CALLING_DELTAS))


def ask_and_call(stage: Stage) -> ToolCallRequest:
    """A user turn whose reply calls the tool; checks that reply and returns its call."""
    stage.inq.put(Transcript(stage.llm.gate.new_turn_stamp(), "What's the weather in Paris?"))
    out = stage.take_until_end()
    assert [type(m).__name__ for m in out] == ["TTSInput", "ToolCallRequest", "EndOfResponse"], out
    assert out[0].text == "Let me check." and out[2].error is None
    call = out[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    return call


def answer_and_prefetch(stage: Stage, call: ToolCallRequest) -> ResponsePrefetchTransaction:
    """Send the tool's output and wait until the hidden follow-up has been generated completely."""
    stage.inq.put(FunctionOutput(call.call_id, WEATHER_OUTPUT))
    wait_for(lambda: bool(stage.prefetch.started), "started a prefetch")
    txn = stage.prefetch.started[-1]
    wait_for(lambda: txn.state is not PrefetchState.PENDING and stage.prefetch.running is None, "finished it")
    return txn


def ask(stage: Stage, options: dict[str, Any] | None = None) -> int:
    """The client's ``response.create`` (``options``: what it asks beyond the session's defaults),
    as the session sends it: a :class:`ResponseRequest` in the LLM stage's queue. Returns its turn."""
    stamp = stage.llm.gate.new_turn_stamp()
    stage.inq.put(ResponseRequest(stamp, claim_options={} if options is None else options))
    return stamp.turn_id


def test_follow_up_is_generated_hidden_then_claimed(make_stage: Callable[..., Stage]) -> None:
    stage = make_stage(calling_script(), Script(["It is sunny ", "in Paris. ", "Enjoy the day!"]))
    call = ask_and_call(stage)
    since = len(stage.events)

    txn = answer_and_prefetch(stage, call)
    assert txn.state is PrefetchState.COMPLETED  # generated, waiting for its decision
    assert len(stage.llm.requests) == 2, "the follow-up was not generated ahead"
    assert stage.quiet() == [], "the hidden follow-up reached the output queue before its claim"
    assert not stage.events_of(ResponseStarted, since) and not stage.events_of(AssistantText, since)
    # its history is there, provisionally (a discard rolls it back)
    assert stage.history()[-1] == ("assistant", "It is sunny in Paris. Enjoy the day!")

    request = ask(stage)
    out = stage.take_until_end()
    assert txn.state is PrefetchState.CLAIMED
    assert len(stage.llm.requests) == 2, "the follow-up was generated again"
    started = stage.events_of(ResponseStarted, since)
    assert len(started) == 1 and started[0].claimed_by == request  # replayed by the claim
    assert [type(m) for m in out] == [TTSInput] * (len(out) - 1) + [EndOfResponse], out
    # spoken in chunks (the first a short phrase), in order, every word once
    assert " ".join(m.text for m in out[:-1]) == "It is sunny in Paris. Enjoy the day!"
    assert {m.stamp for m in out} == {out[0].stamp} and out[0].stamp.turn_id == started[0].turn_id
    assert out[-1].error is None and out[-1].text == "It is sunny in Paris. Enjoy the day!"
    assert stage.quiet() == [], "more than one EndOfResponse"
    texts = [e.text for e in stage.events_of(AssistantText, since)]
    assert texts == ["It is sunny in Paris. Enjoy the day!"]

    items = stage.llm.chat.items()
    # the call is written when it is made, the reply's text when the reply ends
    kinds = [(i["type"], i.get("role")) for i in items]
    assert kinds == [
        ("message", "user"),
        ("function_call", None),
        ("message", "assistant"),
        ("function_call_output", None),
        ("message", "assistant"),
    ]
    assert items[-1]["content"] == "It is sunny in Paris. Enjoy the day!"
    assert items[1]["call_id"] == items[3]["call_id"] == call.call_id
    # the follow-up's prompt: the reply that called (its text, then its call), then the result, last
    follow_up = [(m["role"], m["content"]) for m in stage.llm.requests[1][1:]]
    assert follow_up == [
        ("user", "What's the weather in Paris?"),
        ("assistant", "Let me check. <code>get_weather(city='Paris')</code>"),
        ("user", "[tool result] " + WEATHER_OUTPUT),
    ]


def test_claim_while_still_generating_streams_the_rest(make_stage: Callable[..., Stage]) -> None:
    follow_up = Script(["It is sunny. ", "Take a hat. ", "Bye."], pause_after=2)
    stage = make_stage(calling_script(), follow_up)
    call = ask_and_call(stage)
    stage.inq.put(FunctionOutput(call.call_id, WEATHER_OUTPUT))
    assert follow_up.paused.wait(WAIT_S)
    assert stage.quiet() == []

    ask(stage, {"metadata": {"client": "test"}})  # metadata is ignored
    # taken between two provider events (here the provider's pause): the held output flows at
    # once, before the model finished
    first = stage.outq.get(timeout=WAIT_S)
    assert isinstance(first, TTSInput) and first.text == "It is sunny."
    assert not follow_up.resume.is_set()
    follow_up.resume.set()
    out = [first, *stage.take_until_end()]
    assert len(stage.llm.requests) == 2 and not follow_up.stopped_early
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["It is sunny.", "Take a hat.", "Bye."]
    assert sum(isinstance(m, EndOfResponse) for m in out) == 1 and out[-1].error is None
    assert stage.history()[-1] == ("assistant", "It is sunny. Take a hat. Bye.")


def test_response_create_with_overrides_discards_the_prefetch(make_stage: Callable[..., Stage]) -> None:
    stage = make_stage(calling_script(), Script(["It is sunny in Paris."]), Script(["Fresh answer."]))
    call = ask_and_call(stage)
    since = len(stage.events)
    txn = answer_and_prefetch(stage, call)

    stamp = stage.llm.gate.new_turn_stamp()
    stage.inq.put(ResponseRequest(stamp, instructions="x", claim_options={"instructions": "x"}))
    out = stage.take_until_end()  # the fresh response, generated from the tool result
    assert txn.state is PrefetchState.DISCARDED and txn.discard_reason == "response.create overrides"
    assert "It is sunny in Paris." not in json.dumps(stage.llm.requests[2]), "the fresh request saw it"
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["Fresh answer."]
    assert [e.turn_id for e in stage.events_of(ResponseStarted, since)] == [stamp.turn_id]
    assert [e.text for e in stage.events_of(AssistantText, since)] == ["Fresh answer."]
    assert stage.history()[-1] == ("assistant", "Fresh answer.")
    assert sum(1 for role, _ in stage.history() if role == "assistant") == 2  # the call's reply, the fresh one


def test_another_request_while_generating_stops_the_follow_up_and_is_answered(
    make_stage: Callable[..., Stage],
) -> None:
    follow_up = Script(["It is sunny. ", "Take a hat. ", "Bye."], pause_after=2)
    stage = make_stage(calling_script(), follow_up, Script(["Fresh answer."]))
    call = ask_and_call(stage)
    stage.inq.put(FunctionOutput(call.call_id, WEATHER_OUTPUT))
    assert follow_up.paused.wait(WAIT_S)
    txn = stage.prefetch.open_transaction
    assert txn is not None

    stamp = stage.llm.gate.new_turn_stamp()
    stage.inq.put(ResponseRequest(stamp, instructions="x", claim_options={"instructions": "x"}))
    out = stage.take_until_end()  # met between two provider events (the pause): the follow-up stops
    follow_up.resume.set()
    assert txn.state is PrefetchState.DISCARDED and txn.discard_reason == "response.create overrides"
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["Fresh answer."]
    assert {m.stamp for m in out} == {stamp} and out[-1].error is None
    assert stage.quiet() == []
    assert [content for role, content in stage.history() if role == "assistant"] == ["Let me check.", "Fresh answer."]


def test_discard_before_the_claim_rolls_history_back(make_stage: Callable[..., Stage]) -> None:
    stage = make_stage(calling_script(), Script(["It is sunny in Paris."]))
    call = ask_and_call(stage)
    since = len(stage.events)
    before = stage.llm.chat.items()  # the function call, not yet its output
    txn = answer_and_prefetch(stage, call)
    assert stage.history()[-1] == ("assistant", "It is sunny in Paris.")

    stage.inq.put_ahead(DiscardFollowUp("speech"))  # e.g. the user started speaking
    wait_for(lambda: txn.state is PrefetchState.DISCARDED, "discarded it")
    assert txn.discard_reason == "speech"
    items = stage.llm.chat.items()
    assert items[: len(before)] == before
    assert [i["type"] for i in items[len(before) :]] == ["function_call_output"]  # the client's item stays

    assert stage.quiet() == []
    assert not stage.events_of(ResponseStarted, since) and not stage.events_of(AssistantText, since)


def test_discard_while_generating_stops_the_model(make_stage: Callable[..., Stage]) -> None:
    follow_up = Script(["It is sunny. ", "Take a hat. ", "Bye."], pause_after=1)
    stage = make_stage(calling_script(), follow_up)
    call = ask_and_call(stage)
    stage.inq.put(FunctionOutput(call.call_id, WEATHER_OUTPUT))
    assert follow_up.paused.wait(WAIT_S)
    txn = stage.prefetch.open_transaction
    assert txn is not None and txn.state is PrefetchState.PENDING
    rolled_back_in: list[str] = []
    txn.on_rollback(lambda: rolled_back_in.append(threading.current_thread().name))

    # the provider sends nothing meanwhile: the stage, waiting on it, still takes the message
    stage.inq.put_ahead(DiscardFollowUp("conversation.item.create"))
    wait_for(lambda: txn.state is PrefetchState.DISCARDED, "discarded it while the provider was silent")
    assert txn.discard_reason == "conversation.item.create" and rolled_back_in == ["llm"]
    follow_up.resume.set()
    wait_for(lambda: stage.prefetch.running is None, "released the prefetch slot")
    assert follow_up.stopped_early and not follow_up.finished.is_set()
    assert stage.quiet() == []
    assert [i["type"] for i in stage.llm.chat.items()][-1] == "function_call_output"
    assert stage.inq.empty()


def test_an_engine_on_the_stage_thread_takes_the_discard_when_it_asks_whether_to_stop(
    make_stage: Callable[..., Stage],
) -> None:
    """An in-process engine (llama.cpp) runs in the stage's thread and asks ``should_stop``
    between tokens: the discard is applied there."""
    follow_up = Script(["It is sunny. ", "Take a hat. ", "Bye."], pause_after=1)
    stage = make_stage(calling_script(), follow_up)
    stage.llm.events_in_helper_thread = False
    call = ask_and_call(stage)
    stage.inq.put(FunctionOutput(call.call_id, WEATHER_OUTPUT))
    assert follow_up.paused.wait(WAIT_S)
    txn = stage.prefetch.open_transaction
    assert txn is not None
    rolled_back_in: list[str] = []
    txn.on_rollback(lambda: rolled_back_in.append(threading.current_thread().name))
    stage.inq.put_ahead(DiscardFollowUp("session.update"))
    follow_up.resume.set()
    wait_for(lambda: stage.prefetch.running is None, "released the prefetch slot")
    assert txn.state is PrefetchState.DISCARDED and txn.discard_reason == "session.update"
    assert rolled_back_in == ["llm"] and follow_up.stopped_early
    assert stage.quiet() == []


def test_failed_hidden_generation_is_never_claimed(make_stage: Callable[..., Stage]) -> None:
    """A prefetch whose generation fails is discarded by itself ("prefetch failed").

    The client's ``response.create`` then gets a fresh generation (the failure may have been
    transient) instead of a claimed failure with the spoken fallback apology; nothing of the
    failed attempt is ever published or spoken.
    """
    stage = make_stage(calling_script(), Script(["It is", " sunny."], raise_after=1), Script(["It is sunny."]))
    call = ask_and_call(stage)
    since = len(stage.events)
    txn = answer_and_prefetch(stage, call)
    assert txn.state is PrefetchState.DISCARDED and txn.discard_reason == "prefetch failed"
    assert [i["type"] for i in stage.llm.chat.items()][-1] == "function_call_output"

    assert stage.quiet() == []
    assert not stage.events_of(ResponseStarted, since) and not stage.events_of(AssistantText, since)

    request = ask(stage)  # not claimable: generated afresh
    out = stage.take_until_end()
    assert [(e.turn_id, e.claimed_by) for e in stage.events_of(ResponseStarted, since)] == [(request, None)]
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["It is sunny."]
    assert FAILURE_FALLBACK not in [m.text for m in out if isinstance(m, TTSInput)]
    assert out[-1].error is None
    assert stage.history()[-1] == ("assistant", "It is sunny.")


def test_no_prefetch_while_more_input_is_waiting(make_stage: Callable[..., Stage]) -> None:
    stage = make_stage(calling_script(), Script(["It is sunny."]), start=False)
    out = list(stage.llm.process(Transcript(stage.llm.gate.new_turn_stamp(), "Weather in Paris?")))
    call = next(m for m in out if isinstance(m, ToolCallRequest))
    request = ResponseRequest(stage.llm.gate.new_turn_stamp())
    stage.inq.put(request)  # e.g. the client's own response.create, already on its way

    assert list(stage.llm.process(FunctionOutput(call.call_id, WEATHER_OUTPUT))) == []
    assert stage.prefetch.open_transaction is None and stage.prefetch.running is None
    assert len(stage.llm.requests) == 1, "a follow-up was generated although a request was waiting"
    assert [i["type"] for i in stage.llm.chat.items()][-1] == "function_call_output"

    # the waiting request is answered normally
    out = list(stage.llm.process(stage.inq.get_nowait()))
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["It is sunny."]
    assert isinstance(out[-1], EndOfResponse) and out[-1].error is None


def first_call(stage: Stage, text: str) -> ToolCallRequest:
    """Answer ``text`` (without the stage thread) and return the reply's first tool call."""
    out = list(stage.llm.process(Transcript(stage.llm.gate.new_turn_stamp(), text)))
    return next(m for m in out if isinstance(m, ToolCallRequest))


def test_a_request_still_upstream_claims_the_follow_up_begun_meanwhile(make_stage: Callable[..., Stage]) -> None:
    """The client's response.create is still in an earlier stage (the realtime session queues it
    before STT) when the tool output reaches the LLM: the follow-up starts, and the request, when it
    arrives, takes it: generated once, in order, every word once."""
    stage = make_stage(calling_script(), Script(["It is sunny."]), start=False)
    call = first_call(stage, "Paris?")
    assert list(stage.llm.process(FunctionOutput(call.call_id, WEATHER_OUTPUT))) == []
    (txn,) = stage.prefetch.started
    assert txn.state is PrefetchState.COMPLETED

    request = ResponseRequest(stage.llm.gate.new_turn_stamp(), claim_options={})
    out = list(stage.llm.process(request))  # the request arrives
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["It is sunny."]
    assert isinstance(out[-1], EndOfResponse) and out[-1].error is None
    assert len(stage.llm.requests) == 2 and txn.state is PrefetchState.CLAIMED
    assert [content for role, content in stage.history() if role == "assistant"] == ["Let me check.", "It is sunny."]


def test_a_response_request_discards_an_open_prefetch(make_stage: Callable[..., Stage]) -> None:
    stage = make_stage(calling_script(), Script(["It is sunny in Paris."]), Script(["Fresh answer."]))
    call = ask_and_call(stage)
    txn = answer_and_prefetch(stage, call)
    stage.inq.put(ResponseRequest(stage.llm.gate.new_turn_stamp()))  # no claim options: not a client's
    out = stage.take_until_end()
    assert txn.state is PrefetchState.DISCARDED and txn.discard_reason == "response request"
    assert [m.text for m in out if isinstance(m, TTSInput)] == ["Fresh answer."]
    assert "It is sunny in Paris." not in json.dumps(stage.llm.requests[2]), (
        "the fresh request saw the speculative reply"
    )
    assert [content for role, content in stage.history() if role == "assistant"] == ["Let me check.", "Fresh answer."]
    assert stage.prefetch.open_transaction is None  # nothing stale is left to claim


def test_no_prefetch_while_a_call_is_unanswered(make_stage: Callable[..., Stage]) -> None:
    two_calls = Script(['<code>get_weather(city="Paris")</code> <code>get_weather(city="Rome")</code>'])
    stage = make_stage(two_calls, Script(["Sunny in both."]), start=False)
    out = list(stage.llm.process(Transcript(stage.llm.gate.new_turn_stamp(), "Paris and Rome?")))
    calls = [m for m in out if isinstance(m, ToolCallRequest)]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    list(stage.llm.process(FunctionOutput(calls[0].call_id, WEATHER_OUTPUT)))
    assert stage.prefetch.open_transaction is None  # Rome is still unanswered
    list(stage.llm.process(FunctionOutput(calls[1].call_id, WEATHER_OUTPUT)))
    txn = stage.prefetch.open_transaction
    assert txn is not None and txn.state is PrefetchState.COMPLETED
    assert stage.outq.empty()


# == 2. the loop through the realtime server, with the official SDK as the client =====================
#: longest wait for one server event (TTS on a shared CPU can be slow), s
SERVER_WAIT_S = 120.0
SAID_BEFORE_CALL = "Let me check the weather."
FOLLOW_UP = "It is sunny in Paris."


def weather_script() -> list[Reply]:
    """The scripted provider: a sentence then get_weather(city="Paris"); then the follow-up."""
    return [
        Reply([Text(["Let me check ", "the weather."]), Call("get_weather", '{"city": "Paris"}')]),
        Reply([Text(["It is sunny ", "in Paris."])]),
    ]


def record_claims(session: RealtimeSession) -> list[bool]:
    """Each response the session's LLM starts, in order: True when it is a follow-up generated ahead
    and claimed by the client's request (its :class:`ResponseStarted` names the claiming turn)."""
    results: list[bool] = []

    def on_event(event: Event) -> None:
        if isinstance(event, ResponseStarted):
            results.append(event.claimed_by is not None)

    session.llm.bus.subscribe(on_event)
    return results


@contextlib.asynccontextmanager
async def sdk_session(
    srv: InProcessServer,
) -> AsyncIterator[tuple[AsyncRealtimeConnection, EventLog, RealtimeSession, list[bool]]]:
    """An official-SDK connection to ``srv`` once its session exists: the connection, the log of its
    events, the server's session and whether each response it started was claimed (:func:`record_claims`)."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="x")
    async with client.realtime.connect(model="s2s") as conn:
        log = EventLog(conn.recv)
        try:
            created = await log.wait_for("session.created", SERVER_WAIT_S)
            session = srv.session(created.session.id)
            yield conn, log, session, record_claims(session)
        finally:
            await log.stop()


async def poll_until(condition: Callable[[], bool], what: str, timeout_s: float = SERVER_WAIT_S) -> None:
    """Check ``condition`` every few ms on the loop (for state outside the event stream)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.01)


@pytest.mark.models  # the server loads the embedded VAD, STT and TTS models
def test_tool_loop_through_the_realtime_server(server: InProcessServer, provider: ResponsesServer) -> None:
    provider.script(*weather_script())

    async def scenario() -> dict[str, Any]:
        async with sdk_session(server) as (conn, log, session, claims):
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "You are a weather assistant.",
                    "output_modalities": ["audio"],
                    "tools": [WEATHER_TOOL],  # type: ignore[list-item]
                    "audio": {"input": {"turn_detection": None}},
                }
            )
            updated = await log.wait_for("session.updated", SERVER_WAIT_S)
            assert [t.name for t in updated.session.tools] == ["get_weather"]
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}
            )
            await conn.response.create()

            first = (await log.wait_for("response.created", SERVER_WAIT_S)).response.id
            announced = await log.wait_for("response.function_call_arguments.done", SERVER_WAIT_S)
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": announced.call_id, "output": '{"sky": "sunny"}'}
            )
            first_done = await log.wait_for(
                lambda e: e.type == "response.done" and e.response.id == first, SERVER_WAIT_S, what="done 1"
            )
            # the follow-up is requested from the provider by the server itself (the prefetch)
            await poll_until(lambda: len(provider.requests) >= 2, "prefetched the follow-up")
            requests_before_create = len(provider.requests)
            since = len(log.events)
            await conn.response.create()
            second = (await log.wait_for("response.created", SERVER_WAIT_S, since=since)).response.id
            second_done = await log.wait_for(
                lambda e: e.type == "response.done" and e.response.id == second, SERVER_WAIT_S, what="done 2"
            )
            return {
                "events": list(log.events),
                "first": first,
                "second": second,
                "announced": announced,
                "first_done": first_done,
                "second_done": second_done,
                "claims": list(claims),
                "requests_before_create": requests_before_create,
                "history": session.llm.chat.items(),
            }

    r = asyncio.run(asyncio.wait_for(scenario(), 4 * SERVER_WAIT_S))
    events: list[Any] = r["events"]
    errors = [e for e in events if e.type == "error"]
    assert not errors, errors

    # response 1: speech, then the call, announced on the side channel before the response ends
    announced = r["announced"]
    assert announced.response_id == r["first"] and announced.name == "get_weather"
    assert json.loads(announced.arguments) == {"city": "Paris"}
    assert events.index(announced) < events.index(r["first_done"])
    first_done = r["first_done"].response
    assert first_done.status == "completed", first_done
    [call_item] = [o for o in first_done.output if o.type == "function_call"]
    assert (call_item.call_id, call_item.name, call_item.arguments) == (
        announced.call_id,
        "get_weather",
        announced.arguments,
    )
    [message] = [o for o in first_done.output if o.type == "message"]
    assert message.content[0].transcript == SAID_BEFORE_CALL
    first_audio = [e for e in events if e.type == "response.output_audio.delta" and e.response_id == r["first"]]
    assert first_audio, "the sentence before the call was not spoken"
    # (the call may be announced before that sentence's audio has played: that is the side channel's point;
    # its message item is announced first, as the model produced them)
    added = [e for e in events if e.type == "response.output_item.added" and e.response_id == r["first"]]
    assert [(e.item.type, e.output_index) for e in added] == [("message", 0), ("function_call", 1)], added

    # response 2: the follow-up, served from the prefetch
    assert r["requests_before_create"] == 2
    assert r["claims"] == [False, True], "the follow-up was generated again instead of claimed"
    assert len(provider.requests) == 2, "a third provider request: the prefetch was not used"
    second_done = r["second_done"].response
    assert second_done.status == "completed", second_done
    transcripts = [
        e.transcript
        for e in events
        if e.type == "response.output_audio_transcript.done" and e.response_id == r["second"]
    ]
    assert len(transcripts) == 1 and "sunny" in transcripts[0], transcripts
    second_audio = [e for e in events if e.type == "response.output_audio.delta" and e.response_id == r["second"]]
    assert second_audio, "the follow-up was not spoken"
    assert events.index(r["first_done"]) < events.index(second_audio[0])

    # the provider's second request carried the call and its output, paired by call_id
    body = provider.requests[1].body
    calls = [i for i in body["input"] if i.get("type") == "function_call"]
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert [(c["call_id"], c["name"], json.loads(c["arguments"])) for c in calls] == [
        (announced.call_id, "get_weather", {"city": "Paris"})
    ]
    assert [(o["call_id"], o["output"]) for o in outputs] == [(announced.call_id, '{"sky": "sunny"}')]
    assert [t["name"] for t in body["tools"]] == ["get_weather"]

    history = [(i["type"], i.get("role"), i.get("content")) for i in r["history"]]
    assert history[-1] == ("message", "assistant", FOLLOW_UP)


@pytest.mark.models  # the server loads the embedded VAD, STT and TTS models
def test_output_and_response_create_back_to_back(server: InProcessServer, provider: ResponsesServer) -> None:
    """The client sends the tool output and at once a plain response.create (its tool finished after
    the response holding the call was done). Whichever reaches the LLM first, the follow-up is
    generated once (claimed, or generated for the request), never twice, and history holds it once."""
    rounds = 3

    async def scenario() -> tuple[list[dict[str, Any]], list[int], list[str], list[bool]]:
        async with sdk_session(server) as (conn, log, session, claims):
            tools = [WEATHER_TOOL]
            update = {"type": "realtime", "tools": tools, "audio": {"input": {"turn_detection": None}}}
            await conn.session.update(session=update)  # type: ignore[arg-type]
            await log.wait_for("session.updated", SERVER_WAIT_S)
            requests: list[int] = []
            transcripts: list[str] = []
            for _ in range(rounds):
                provider.script(*weather_script())
                since = len(log.events)
                text = {"type": "input_text", "text": "Paris?"}
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
                await conn.response.create()
                first = (await log.wait_for("response.created", SERVER_WAIT_S, since=since)).response.id
                call = await log.wait_for("response.function_call_arguments.done", SERVER_WAIT_S, since=since)
                await log.wait_for(lambda e, r=first: e.type == "response.done" and e.response.id == r, SERVER_WAIT_S)
                since = len(log.events)
                output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
                await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
                await conn.response.create()
                second = (await log.wait_for("response.created", SERVER_WAIT_S, since=since)).response.id
                done = await log.wait_for(
                    lambda e, r=second: e.type == "response.done" and e.response.id == r, SERVER_WAIT_S
                )
                assert done.response.status == "completed", done.response
                transcripts.append(done.response.output[0].content[0].transcript)
                requests.append(len(provider.requests))
            assert not log.of("error"), log.of("error")
            return session.llm.chat.items(), requests, transcripts, list(claims)

    history, requests, transcripts, claims = asyncio.run(asyncio.wait_for(scenario(), 4 * SERVER_WAIT_S))
    assert requests == [2] * rounds, f"provider requests per round: {requests} (3: the follow-up was generated twice)"
    assert transcripts == [FOLLOW_UP] * rounds
    assert len(claims) == 2 * rounds and not any(claims[::2])  # the first response.create of a round never claims
    replies = [i["content"] for i in history if i["type"] == "message" and i["role"] == "assistant"]
    assert replies == [SAID_BEFORE_CALL, FOLLOW_UP] * rounds


@pytest.mark.models  # the server loads the embedded VAD, STT and TTS models
def test_a_response_create_while_a_response_is_generated_is_refused(
    server: InProcessServer, provider: ResponsesServer
) -> None:
    """Only a response that plays out what it generated lets a second one wait behind it: one still
    being generated refuses it, as OpenAI's server does (event 4 is the first sentence; the provider
    then pauses before the rest)."""
    pause = 4.0  # under the default --next_token_timeout_s
    provider.script(Reply([Text(["Well. ", "Let me think. ", "Here it is."])], delay_s=pause, delay_at=5))

    async def scenario() -> tuple[Any, list[Any], Any]:
        async with sdk_session(server) as (conn, log, _session, _claims):
            update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
            await conn.session.update(session=update)  # type: ignore[arg-type]
            await log.wait_for("session.updated", SERVER_WAIT_S)
            since = len(log.events)
            text = {"type": "input_text", "text": "Tell me."}
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
            await conn.response.create()
            first = (await log.wait_for("response.created", SERVER_WAIT_S, since=since)).response.id
            await log.wait_for("response.output_audio.delta", SERVER_WAIT_S, since=since)  # "Well." plays
            await conn.response.create()
            error = await log.wait_for("error", SERVER_WAIT_S, since=since)
            done = await log.wait_for(
                lambda e: e.type == "response.done" and e.response.id == first, SERVER_WAIT_S, since, "done"
            )
            await asyncio.sleep(0.5)
            return error, log.of("response.created", since), done

    error, created, done = asyncio.run(asyncio.wait_for(scenario(), 4 * SERVER_WAIT_S))
    assert error.error.code == "conversation_already_has_active_response", error
    assert len(created) == 1, "the refused request made a response"
    assert done.response.status == "completed"
    assert done.response.output[0].content[0].transcript == "Well. Let me think. Here it is."


#: rounds of the answer-at-once flow in one session (each: the call, then its follow-up)
AT_ONCE_ROUNDS = 3


def silence_between(r: dict[str, Any]) -> float:
    """Seconds from the end of the first response's audio to the start of the follow-up's, as a
    client's player plays them (each 24 kHz pcm16 delta from its receipt, or after the one before)."""
    playing_until, gap = 0.0, 0.0
    for event, at in zip(r["events"], r["times"], strict=True):
        if event.type == "response.output_audio.delta":
            if event.response_id == r["second"] and not gap:
                gap = max(1e-9, at - playing_until)
            playing_until = max(at, playing_until) + len(base64.b64decode(event.delta)) / 2 / 24_000
    return round(gap, 3)


@pytest.fixture(scope="module")
def chat_server(provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    """The realtime server with the ``chat-completions`` backend on the scripted provider."""
    flags = ("--llm_backend", "chat-completions", "--responses_api_base_url", provider.base_url)
    return realtime_servers(*flags, "--model_name", "test-model")


@pytest.mark.models  # the server loads the embedded VAD, STT and TTS models
def test_a_client_that_answers_the_call_at_once_hears_the_follow_up(
    chat_server: InProcessServer, provider: ResponsesServer
) -> None:
    """Issue 30: the provider (chat completions) streams a sentence, then a call; the client sends the
    call's output and a ``response.create`` the moment ``function_call_arguments.done`` arrives, while
    the sentence is still being spoken. The message item comes before the call item, as the provider
    produced them; the request is not refused; the follow-up is spoken after the first response's
    ``response.done``, generated once."""

    async def one_round(conn: AsyncRealtimeConnection, log: EventLog, answered: list[float]) -> dict[str, Any]:
        provider.script(*weather_script())
        since = len(log.events)
        text = {"type": "input_text", "text": "What is the weather in Paris?"}
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
        await conn.response.create()
        first = (await log.wait_for("response.created", SERVER_WAIT_S, since=since)).response.id
        await log.wait_until(lambda: len(answered) > 0, SERVER_WAIT_S, "answered the call")
        first_done = await log.wait_for(
            lambda e: e.type == "response.done" and e.response.id == first, SERVER_WAIT_S, since, "done 1"
        )
        second = (
            await log.wait_for(lambda e: e.type == "response.created" and e.response.id != first, SERVER_WAIT_S, since)
        ).response.id
        second_done = await log.wait_for(
            lambda e: e.type == "response.done" and e.response.id == second, SERVER_WAIT_S, since, "done 2"
        )
        answered.clear()
        return {
            "events": log.events[since:],
            "times": log.times[since:],
            "first": first,
            "second": second,
            "first_done": first_done,
            "second_done": second_done,
            "requests": len(provider.requests),
            "second_request": provider.requests[-1].body if provider.requests else {},
        }

    async def scenario() -> list[dict[str, Any]]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{chat_server.port}/v1", api_key="x")
        async with client.realtime.connect(model="s2s") as conn:
            answered: list[float] = []

            async def answer(call_id: str) -> None:  # what a client with a quick tool does
                output = {"type": "function_call_output", "call_id": call_id, "output": '{"sky": "sunny"}'}
                await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
                await conn.response.create()
                answered.append(time.monotonic())

            def on_event(event: Any, at: float) -> None:
                if event.type == "response.function_call_arguments.done":
                    tasks.add(asyncio.get_running_loop().create_task(answer(event.call_id)))

            tasks: set[asyncio.Task[None]] = set()
            log = EventLog(conn.recv, on_event)
            try:
                await log.wait_for("session.created", SERVER_WAIT_S)
                update = {
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "tools": [WEATHER_TOOL],
                    "audio": {"input": {"turn_detection": None}},
                }
                await conn.session.update(session=update)  # type: ignore[arg-type]
                await log.wait_for("session.updated", SERVER_WAIT_S)
                return [await one_round(conn, log, answered) for _ in range(AT_ONCE_ROUNDS)]
            finally:
                await log.stop()

    rounds = asyncio.run(asyncio.wait_for(scenario(), 4 * SERVER_WAIT_S))
    print(
        f"\nsilence between the sentence before the call and the follow-up, s: {[silence_between(r) for r in rounds]}"
    )
    for r in rounds:
        events: list[Any] = r["events"]
        errors = [e for e in events if e.type == "error"]
        assert not errors, errors  # no conversation_already_has_active_response
        first_done, second_done = r["first_done"].response, r["second_done"].response
        assert first_done.status == "completed", first_done
        # the items in the provider's order: the message with its sentence, then the call
        assert [o.type for o in first_done.output] == ["message", "function_call"], first_done.output
        assert first_done.output[0].content[0].transcript == SAID_BEFORE_CALL
        added = [(e.item.type, e.output_index) for e in events if e.type == "response.output_item.added"]
        assert added[:2] == [("message", 0), ("function_call", 1)], added
        # the client answered at once: before the sentence in front of the call had been heard
        done_at = events.index(r["first_done"])
        call_at = next(i for i, e in enumerate(events) if e.type == "response.function_call_arguments.done")
        assert call_at < done_at
        # the follow-up: spoken, after the first response's response.done, all of it
        assert second_done.status == "completed", second_done
        assert [o.type for o in second_done.output] == ["message"]
        assert second_done.output[0].content[0].transcript == FOLLOW_UP
        second = [i for i, e in enumerate(events) if getattr(e, "response_id", None) == r["second"]]
        created_at = next(
            i for i, e in enumerate(events) if e.type == "response.created" and e.response.id == r["second"]
        )
        assert done_at < created_at < min(second), "the follow-up's events came before the first response ended"
        audio = [e for e in events if e.type == "response.output_audio.delta" and e.response_id == r["second"]]
        assert audio, "the follow-up was not spoken"
        transcript = [
            e.delta
            for e in events
            if e.type == "response.output_audio_transcript.delta" and e.response_id == r["second"]
        ]
        assert "".join(transcript).strip() == FOLLOW_UP
        # generated once: the call's request and the follow-up's, which carried the call and its output
        assert r["requests"] == 2, f"{r['requests']} provider requests"
        messages = r["second_request"]["messages"]
        call = [c for m in messages for c in m.get("tool_calls") or []][-1]  # (earlier rounds' calls before it)
        assert call["function"]["name"] == "get_weather"
        assert messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny"}'}


# == 3. the local path with the embedded model ======================================================
def assert_pipeline_output(out: list[Any], tool_names: set[str]) -> list[ToolCallRequest]:
    """The guarantees that hold whatever the model chose; returns the tool calls.

    Exactly one :class:`EndOfResponse`, last; no ``<code>`` markup ever spoken; every call names
    a known tool and has a JSON object as arguments.
    """
    ends = [m for m in out if isinstance(m, EndOfResponse)]
    assert len(ends) == 1 and out[-1] is ends[0], out
    spoken = [m.text for m in out if isinstance(m, TTSInput)]
    assert all(s.strip() for s in spoken)
    assert not [s for s in spoken if "<code" in s or "code>" in s or "</" in s or "{" in s], spoken
    calls = [m for m in out if isinstance(m, ToolCallRequest)]
    for call in calls:
        assert call.name in tool_names, call
        assert isinstance(json.loads(call.arguments), dict), call
        assert call.call_id.startswith("call_")
    return calls


@pytest.mark.models
def test_embedded_model_tool_call_keeps_the_pipeline_guarantees(
    record_property: Callable[[str, Any], None], sample_tools: ModuleType
) -> None:
    sample = sample_tools
    tool_names = {tool["name"] for tool in sample.TOOLS}
    handler_cls = get_backend("llm", "llama-cpp").load_handler_class()
    inq, outq = StageQueue(16), StageQueue(64)
    config = LlamaCppConfig(max_new_tokens=64, stream_batch_sentences=1)
    llm = new_stage(handler_cls, input_queue=inq, output_queue=outq, config=config, device="cpu", name="llm:llama-cpp")
    llm.setup()
    llm.tools = list(sample.TOOLS)
    llm.prefetch = PrefetchCoordinator()
    try:
        out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "What time is it in Tokyo? Use the tool.")))
        calls = assert_pipeline_output(out, tool_names)
        spoken = " ".join(m.text for m in out if isinstance(m, TTSInput))
        called = [(c.name, json.loads(c.arguments)) for c in calls]
        record_property("tool_calls", called)
        record_property("spoken", spoken)
        print(f"\nembedded model: calls={called} spoken={spoken!r}")
        history = llm.chat.items()
        assert [i["call_id"] for i in history if i["type"] == "function_call"] == [c.call_id for c in calls]
        if not calls:  # the model answered without the tool: record a call as if it had made one
            call = ToolCallRequest(out[-1].stamp, new_call_id(), "get_time", '{"timezone": "Asia/Tokyo"}')
            llm.chat.add_item(
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
            )
            calls = [call]

        # answer every call with the real sample tool: the follow-up is generated hidden, then claimed
        for call in calls:
            result = asyncio.run(sample.execute_tool(call.name, json.loads(call.arguments)))
            assert list(llm.process(FunctionOutput(call.call_id, json.dumps(result)))) == []
        assert outq.empty(), "the hidden follow-up reached the output queue"
        txn = llm.prefetch.open_transaction
        assert txn is not None, "no follow-up was generated ahead"
        request = ResponseRequest(llm.gate.new_turn_stamp(), claim_options={})  # the client's response.create
        follow_up = list(llm.process(request))
        assert txn.state is PrefetchState.CLAIMED, "the follow-up generated ahead was not claimed"
        assert follow_up and isinstance(follow_up[-1], EndOfResponse), follow_up
        assert sum(isinstance(m, EndOfResponse) for m in follow_up) == 1
        follow_calls = assert_pipeline_output(follow_up, tool_names)
        assert follow_up[-1].error is None
        record_property("follow_up", follow_up[-1].text)
        print(f"follow-up: {follow_up[-1].text!r}, calls={[c.name for c in follow_calls]}")
        assistant = [i for i in llm.chat.items() if i["type"] == "message" and i["role"] == "assistant"]
        if follow_up[-1].text:
            assert assistant[-1]["content"] == follow_up[-1].text
    finally:
        llm.stop_event.set()
        llm.cleanup()
