"""A tool call the client was shown stays in history, whatever happens to the rest of its response.

The LLM stage is driven through :meth:`BaseLLMHandler.process` with a backend that yields provider
events from a script (:class:`speech_to_speech.testing.fakes.FakeProviderLLM`). Where the client is shown
a call (the LM output stage publishes :class:`ToolCallReady`, which the realtime session turns into
``response.function_call_arguments.done``), the pipeline puts a :class:`CommitToolCall` at the head
of the LLM stage's queue; the stage handles it after the item it is processing, in its own thread,
as :func:`handle_queued` does here.
"""

from __future__ import annotations

from typing import Any

from speech_to_speech.core.events import ToolCallReady
from speech_to_speech.core.messages import (
    EndOfResponse,
    FunctionOutput,
    ResponseRequest,
    ToolCallRequest,
    Transcript,
    TTSInput,
)
from speech_to_speech.llm.api import ProviderTimeout, TextDelta, ToolCall
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.serialize import to_responses_input
from speech_to_speech.llm.stage import TIMEOUT_APOLOGY
from speech_to_speech.llm.upstream import CommitToolCall
from speech_to_speech.pipeline.running import Pipeline
from speech_to_speech.speech.audio_io import StreamClock
from speech_to_speech.testing.fakes import FakeProviderLLM, chained, make_provider_llm

WEATHER = ToolCall("call_weather_1", "get_weather", '{"city": "Paris"}')


def shown(llm: FakeProviderLLM, item: Any) -> None:
    """A call passes the LM output stage, which shows it to the client: the pipeline's reaction
    (:meth:`Pipeline.on_event`) puts a :class:`CommitToolCall` at the head of the LLM's queue."""
    if isinstance(item, ToolCallRequest):
        assert llm.input_queue is not None
        llm.input_queue.put_first(CommitToolCall(item.call_id))


def handle_queued(llm: FakeProviderLLM) -> None:
    """What the stage's thread does next: take the control messages at its queue's head."""
    assert llm.input_queue is not None
    while (control := llm.input_queue.take_first_if(lambda m: isinstance(m, CommitToolCall))) is not None:
        llm._control(control)


def kinds(chat: Chat) -> list[tuple[str, str]]:
    return [(i["type"], i.get("role") or i.get("call_id", "")) for i in chat.items()]


def test_interrupted_after_the_call_keeps_the_call_and_pairs_its_late_output() -> None:
    # the provider goes on streaming after the call; the user interrupts during that
    llm = make_provider_llm(
        [TextDelta("Let me check."), WEATHER, TextDelta(" Meanwhile, here is"), TextDelta(" more.")], []
    )
    out = []
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather in Paris?")):
        out.append(item)
        shown(llm, item)
        if isinstance(item, ToolCallRequest):
            llm.gate.scope.cancel()  # barge-in while the provider still streams
    handle_queued(llm)
    assert [type(i).__name__ for i in out] == ["TTSInput", "ToolCallRequest", "EndOfResponse"]
    assert out[-1].error == "cancelled"
    assert kinds(llm.chat) == [("message", "user"), ("function_call", WEATHER.call_id)]

    # the late output is accepted, and the next request carries the pair
    assert list(llm.process(FunctionOutput(WEATHER.call_id, '{"sky": "sunny"}'))) == []
    sent = to_responses_input(llm.chat.items())
    assert [i.get("type") for i in sent[-2:]] == ["function_call", "function_call_output"]
    assert sent[-1]["call_id"] == sent[-2]["call_id"] == WEATHER.call_id


def test_a_failure_after_the_call_keeps_the_call() -> None:
    llm = make_provider_llm([WEATHER, TextDelta("Done")])

    def explode(index: int) -> None:
        if index == 1:
            raise ConnectionResetError("provider dropped the stream")

    llm.on_event = explode
    out = []
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather?")):
        out.append(item)
        shown(llm, item)
    handle_queued(llm)
    end = out[-1]
    assert isinstance(end, EndOfResponse) and end.error and "ConnectionResetError" in end.error
    assert ("function_call", WEATHER.call_id) in kinds(llm.chat)
    llm.chat.append_tool_output(WEATHER.call_id, "{}")  # pairs


def test_a_call_the_client_never_saw_is_rolled_back() -> None:
    # cancelled after the LLM emitted the call but before it passed the LM output stage
    llm = make_provider_llm([TextDelta("Let me check."), WEATHER, TextDelta(" more.")])
    out = []
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather?")):
        out.append(item)
        if isinstance(item, ToolCallRequest):
            llm.gate.scope.cancel()  # flushed from the queue: never shown
    assert out[-1].error == "cancelled"
    assert kinds(llm.chat) == [("message", "user")]


def test_a_call_shown_after_its_response_was_rolled_back_is_written_again() -> None:
    # the cancel wins the race: the response is rolled back, then the call reaches the client
    llm = make_provider_llm([WEATHER, TextDelta(" more.")])
    calls = []
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather?")):
        if isinstance(item, ToolCallRequest):
            calls.append(item)
            llm.gate.scope.cancel()
    assert kinds(llm.chat) == [("message", "user")]
    shown(llm, calls[0])
    handle_queued(llm)
    assert kinds(llm.chat) == [("message", "user"), ("function_call", WEATHER.call_id)]
    llm.chat.append_tool_output(WEATHER.call_id, "{}")


def test_a_completed_response_is_unchanged_by_the_commit() -> None:
    llm = make_provider_llm([TextDelta("Checking."), WEATHER])
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather?")):
        shown(llm, item)
    handle_queued(llm)
    assert kinds(llm.chat) == [("message", "user"), ("function_call", WEATHER.call_id), ("message", "assistant")]


def test_commit_provisional_call_survives_rollback_and_cancel() -> None:
    chat = Chat()
    chat.add_item({"type": "message", "role": "user", "content": "hi"})
    [call] = chat.add_provisional_generation_items(
        "r1", [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    )
    chat.add_provisional_generation_items("r1", [{"type": "message", "role": "assistant", "content": "so"}])
    chat.commit_provisional_call("r1", call)
    chat.cancel_provisional_generation("r1")
    assert [i["type"] for i in chat.items()] == ["message", "function_call"]
    chat.commit_provisional_call("r1", call)  # again: nothing changes
    assert [i["type"] for i in chat.items()] == ["message", "function_call"]
    chat.append_tool_output("c1", "ok")


def answer_tool_output_then_time_out(llm: FakeProviderLLM) -> list[Any]:
    """Weather? -> the call, shown; its output; then the follow-up's provider times out."""
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather in Paris?")):
        shown(llm, item)
    handle_queued(llm)
    llm.chat.append_tool_output(WEATHER.call_id, '{"sky": "sunny"}')

    def stall(index: int) -> None:
        raise ProviderTimeout("no first token within 8 s")

    llm.on_event = stall
    return list(llm.process(ResponseRequest(llm.gate.new_turn_stamp())))


def test_a_failed_reply_to_tool_results_keeps_the_apology_it_said() -> None:
    # without it the tool results stay unanswered in history and the next turn answers them
    llm = make_provider_llm([WEATHER], [TextDelta("Sunny.")])
    out = answer_tool_output_then_time_out(llm)
    assert [m.text for m in out if isinstance(m, TTSInput)] == [TIMEOUT_APOLOGY]
    assert out[-1].error and "timeout" in out[-1].error
    items = llm.chat.items()
    assert [i["type"] for i in items[-3:]] == ["function_call", "function_call_output", "message"]
    assert items[-1]["role"] == "assistant" and items[-1]["content"] == TIMEOUT_APOLOGY


def test_a_failed_reply_to_the_user_still_leaves_no_assistant_message() -> None:
    llm = make_provider_llm([TextDelta("never")])
    llm.on_event = lambda index: (_ for _ in ()).throw(ProviderTimeout("no first token"))
    out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "Hello?")))
    assert [m.text for m in out if isinstance(m, TTSInput)] == [TIMEOUT_APOLOGY]
    assert kinds(llm.chat) == [("message", "user")]


def test_the_pipeline_sends_the_commit_to_the_llm_stage_ahead_of_its_queue() -> None:
    """The LM output stage's ToolCallReady becomes a CommitToolCall at the head of the LLM stage's
    queue (ahead of the client's answer, wherever that is), handled in the stage's own thread."""
    llm = make_provider_llm([TextDelta("Let me check."), WEATHER, TextDelta(" more.")])
    pipeline = Pipeline(chained([llm]), llm.stop_event, llm.gate, llm.bus, StreamClock())
    llm.bus.subscribe(pipeline.on_event)
    out = []
    for item in llm.process(Transcript(llm.gate.new_turn_stamp(), "Weather?")):
        out.append(item)
        if isinstance(item, ToolCallRequest):
            assert llm.input_queue is not None
            llm.input_queue.put(FunctionOutput(WEATHER.call_id, "{}"))  # answered at once, already queued
            llm.bus.publish(ToolCallReady(item.stamp.turn_id, call_id=item.call_id, name=item.name))
            llm.gate.scope.cancel()  # then the user interrupts: the response is cancelled
    assert out[-1].error == "cancelled"
    assert kinds(llm.chat) == [("message", "user")]  # rolled back, the call too, for now
    assert llm.input_queue is not None
    queued = [llm.input_queue.get_nowait() for _ in range(llm.input_queue.qsize())]
    assert [type(m) for m in queued] == [CommitToolCall, FunctionOutput]
    llm._control(queued[0])
    assert list(llm.process(queued[1])) == []
    call = ("function_call", WEATHER.call_id)
    assert kinds(llm.chat) == [("message", "user"), call, ("function_call_output", WEATHER.call_id)]
