"""The order of a session's response events (:class:`ResponseOutput`, no models): the message item
before a call that followed its words, and a response that starts while another is active held
until that one's ``response.done`` has gone out (issue 30)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import ToolCallReady
from speech_to_speech.core.messages import AudioOutput, EndOfResponse, ToolCallRequest, TTSInput
from speech_to_speech.llm.output import LMOutputProcessor
from speech_to_speech.realtime.conversation import Conversation
from speech_to_speech.realtime.responses import ResponseOutput
from speech_to_speech.realtime.wire import WIRE_RATE
from tests.helpers import new_stage


class Recorder:
    """The ``emit`` and ``after_sent`` of a :class:`ResponseOutput`: events in order; the callables
    handed to ``after_sent`` kept until :meth:`run_after_sent` (as a session's loop runs them later)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.later: list[Callable[[], None]] = []

    def emit(self, event: dict[str, Any], stamp: Stamp | None = None) -> None:
        self.events.append(event)

    def after_sent(self, run: Callable[[], None]) -> None:
        self.later.append(run)

    def run_after_sent(self) -> None:
        later, self.later = self.later, []
        for run in later:
            run()

    def kinds(self, response_id: str | None = None) -> list[str]:
        """Event types in order (of one response's events, when ``response_id`` is given)."""
        return [e["type"] for e in self.events if response_id is None or response_of(e) == response_id]


def response_of(event: dict[str, Any]) -> str | None:
    return event.get("response_id") or (event.get("response") or {}).get("id")


def make_output() -> tuple[ResponseOutput, Recorder, Gate]:
    recorder, gate = Recorder(), Gate()
    output = ResponseOutput(recorder.emit, gate, Conversation(), lambda: None, after_sent=recorder.after_sent)
    return output, recorder, gate


def speak(output: ResponseOutput, stamp: Stamp, words: str) -> None:
    samples = np.full(WIRE_RATE // 10, 0.1, dtype=np.float32)
    output.on_audio(AudioOutput(stamp, samples, WIRE_RATE, words), samples)


def test_the_message_is_announced_before_a_call_that_followed_its_words() -> None:
    output, recorder, gate = make_output()
    stamp = gate.new_turn_stamp()
    output.start(stamp.turn_id, ["audio"])
    # the call is ready (side channel) before the words in front of it have any audio
    output.tool_call(ToolCallReady(stamp.turn_id, call_id="call_1", name="get_weather", after_output=True))
    speak(output, stamp, "Let me check.")
    output.on_response_end(EndOfResponse(stamp, text="Let me check."))
    added = [
        (e["item"]["type"], e["output_index"]) for e in recorder.events if e["type"] == "response.output_item.added"
    ]
    assert added == [("message", 0), ("function_call", 1)]
    [done] = [e for e in recorder.events if e["type"] == "response.done"]
    assert [o["type"] for o in done["response"]["output"]] == ["message", "function_call"]
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Let me check."


def test_a_call_with_no_words_before_it_comes_first() -> None:
    output, recorder, gate = make_output()
    stamp = gate.new_turn_stamp()
    output.start(stamp.turn_id, ["audio"])
    output.tool_call(ToolCallReady(stamp.turn_id, call_id="call_1", name="get_weather"))
    speak(output, stamp, "Done.")
    added = [
        (e["item"]["type"], e["output_index"]) for e in recorder.events if e["type"] == "response.output_item.added"
    ]
    assert added == [("function_call", 0), ("message", 1)]


def test_the_output_stage_says_whether_words_went_before_a_call() -> None:
    stage = new_stage(LMOutputProcessor)
    gate, ready = stage.gate, []
    stage.bus.subscribe(lambda e: ready.append(e) if isinstance(e, ToolCallReady) else None)
    spoken, silent = gate.new_turn_stamp(), gate.new_turn_stamp()
    for item in (
        TTSInput(spoken, "Let me check."),
        ToolCallRequest(spoken, "call_1", "get_weather", "{}"),
        EndOfResponse(spoken),
        ToolCallRequest(silent, "call_2", "get_weather", "{}"),
        EndOfResponse(silent),
    ):
        assert list(stage.process(item)) == [item]  # everything passes on, in order
    assert [(e.call_id, e.after_output) for e in ready] == [("call_1", True), ("call_2", False)]


def test_a_response_started_while_another_plays_out_follows_its_response_done() -> None:
    output, recorder, gate = make_output()
    first, second = gate.new_turn_stamp(), gate.new_turn_stamp()
    output.start(first.turn_id, ["audio"])
    speak(output, first, "Let me check.")
    output.tool_call(ToolCallReady(first.turn_id, call_id="call_1", name="get_weather", after_output=True))
    assert output.active is not None and output.active.winding_down  # it handed out a call
    output.start(second.turn_id, ["audio"])  # the follow-up, asked for at once
    speak(output, second, "It is sunny.")
    id1, id2 = output.active.id, output._responses[second.turn_id].id
    assert recorder.kinds(id2) == [], "the follow-up's events went out while the first was active"
    speak(output, first, " More.")
    output.on_response_end(EndOfResponse(first, text="Let me check. More."))
    assert recorder.kinds()[-1] == "response.done" and recorder.kinds(id2) == []  # not before it has gone out
    assert output.active is not None and output.active.id == id1
    recorder.run_after_sent()  # the loop sent the first response.done
    kinds = recorder.kinds(id2)
    assert kinds[0] == "response.created" and "response.output_audio.delta" in kinds
    assert output.active is not None and output.active.id == id2
    done1 = next(i for i, e in enumerate(recorder.events) if e["type"] == "response.done")
    assert all(response_of(e) != id2 for e in recorder.events[:done1])
    speak(output, second, " Enjoy.")  # live now
    output.on_response_end(EndOfResponse(second, text="It is sunny. Enjoy."))
    recorder.run_after_sent()
    [done2] = [e for e in recorder.events if e["type"] == "response.done" and response_of(e) == id2]
    assert done2["response"]["output"][0]["content"][0]["transcript"] == "It is sunny. Enjoy."
    assert output.active is None


def test_a_held_response_that_ended_meanwhile_goes_out_whole() -> None:
    output, recorder, gate = make_output()
    first, second, third = gate.new_turn_stamp(), gate.new_turn_stamp(), gate.new_turn_stamp()
    output.start(first.turn_id, ["audio"])
    output.start(second.turn_id, ["audio"])
    output.on_response_end(EndOfResponse(second, error="cancelled"))  # ended while it waited
    output.start(third.turn_id, ["audio"])
    ids = [output._responses[t.turn_id].id for t in (first, third)]
    output.on_response_end(EndOfResponse(first))
    recorder.run_after_sent()
    # the second: created and done (cancelled), after the first's done; then the third is active
    dones = [response_of(e) for e in recorder.events if e["type"] == "response.done"]
    assert len(dones) == 2 and dones[0] == ids[0]
    assert [e["response"]["status"] for e in recorder.events if e["type"] == "response.done"] == [
        "completed",
        "cancelled",
    ]
    assert output.active is not None and output.active.id == ids[1]
    assert recorder.kinds(ids[1]) == ["response.created"]
