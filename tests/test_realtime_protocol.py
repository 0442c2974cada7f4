"""The realtime protocol layer without models: typed client events, session updates, the
conversation mirror and the history controls.

Client events are parsed with the openai SDK's types (an unknown type, a malformed event or a
field of the wrong shape is a ``ProtocolError`` naming it); a ``session.update`` applies what the
server supports and reports each field it does not; the conversation keeps the protocol order
that ``previous_item_id`` refers to; history edits reach the LLM's ``Chat`` as stage controls.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.realtime import RealtimeSessionCreateRequest

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import EventBus
from speech_to_speech.core.handler import BaseHandler, StageControl
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.replies import RepliesInHistory
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.realtime.config import SessionConfig, apply_update
from speech_to_speech.realtime.controls import HistoryDelete, HistoryInsert
from speech_to_speech.realtime.conversation import ROOT, Conversation, to_history
from speech_to_speech.realtime.protocol import (
    CLIENT_EVENT_MODELS,
    SERVER_EVENT_MODELS,
    ProtocolError,
    parse_client_event,
    server_event,
)
from speech_to_speech.realtime.session import HANDLERS

ARGS = parse_args(["--mode", "server"])


# -- client events --------------------------------------------------------------------------------
def test_every_client_event_type_has_a_handler() -> None:
    assert set(HANDLERS) == set(CLIENT_EVENT_MODELS)
    assert len(HANDLERS) == 11


@pytest.mark.parametrize(
    "event",
    [
        {"type": "session.update", "session": {"instructions": "Be brief."}},
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"eagerness": "low"}}}}},
        {"type": "input_audio_buffer.append", "audio": "AAAA"},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {"type": "output_audio_buffer.clear"},
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c", "output": ""}},
        {"type": "conversation.item.retrieve", "item_id": "item_1"},
        {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 10},
        {"type": "conversation.item.delete", "item_id": "item_1"},
        {"type": "response.create", "response": {"metadata": {"k": "v"}}},
        {"type": "response.cancel"},
    ],
)
def test_client_events_parse_into_the_sdk_types(event: dict[str, Any]) -> None:
    parsed = parse_client_event(json.dumps({**event, "event_id": "evt_1"}))
    assert isinstance(parsed, CLIENT_EVENT_MODELS[event["type"]])
    assert parsed.event_id == "evt_1"  # type: ignore[attr-defined]


def test_a_session_without_type_is_a_realtime_one_and_a_turn_detection_without_type_server_vad() -> None:
    parsed = parse_client_event(
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {}}}}})
    )
    assert parsed.session.type == "realtime"  # type: ignore[attr-defined]
    assert parsed.session.audio.input.turn_detection.type == "server_vad"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "session.update", "session": {"instructions": 5}}, "invalid_value", "session.instructions"),
        ({"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": "a"}, "invalid_value", None),
        ({"type": "conversation.item.retrieve"}, "invalid_value", "item_id"),
        ({"type": "response.create", "response": 0}, "invalid_value", "response"),
        ({"type": "no.such.event"}, "unknown_event", None),
    ],
)
def test_bad_client_events_name_the_problem(event: dict[str, Any], code: str, param: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(json.dumps({**event, "event_id": "evt_bad"}))
    assert info.value.code == code and info.value.event_id == "evt_bad"
    if param is not None:
        assert info.value.param == param, info.value.message


def test_server_events_are_built_with_the_sdk_models() -> None:
    event = server_event("conversation.item.deleted", item_id="item_1")
    assert event["type"] == "conversation.item.deleted" and event["event_id"].startswith("event_")
    SERVER_EVENT_MODELS["conversation.item.deleted"].model_validate(event)
    with pytest.raises(ValueError):
        server_event("conversation.item.deleted")  # no item_id: a bug, caught where it is built


# -- session.update ---------------------------------------------------------------------------------
def update(session: dict[str, Any], config: SessionConfig | None = None) -> tuple[SessionConfig, list[ProtocolError]]:
    request = RealtimeSessionCreateRequest.model_validate({"type": "realtime", **session})
    return apply_update(config or SessionConfig.from_args(ARGS), request, ARGS)


def test_semantic_vad_is_taken_with_its_eagerness() -> None:
    config, problems = update({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    assert not problems
    assert config.turn_detection is not None and config.turn_detection.type == "semantic_vad"
    assert config.turn_detection.vad_settings()["eagerness"] == "high"
    wire = config.session_object("sess_1", "m")["audio"]["input"]["turn_detection"]
    assert wire["type"] == "semantic_vad" and wire["eagerness"] == "high"
    config, problems = update(
        {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 900}}}}, config
    )
    assert not problems and config.turn_detection.type == "server_vad"  # type: ignore[union-attr]
    assert config.turn_detection.vad_settings() | {"eagerness": None} == config.turn_detection.vad_settings()  # type: ignore[union-attr]
    assert config.turn_detection.silence_duration_ms == 900  # type: ignore[union-attr]


def test_an_unsupported_field_is_reported_and_the_rest_applies() -> None:
    config, problems = update(
        {
            "instructions": "Be brief.",
            "output_modalities": ["text"],
            "audio": {"output": {"speed": 1.5, "voice": "joe"}, "input": {"format": {"type": "audio/pcmu"}}},
            "prompt": {"id": "pmpt_1"},
            "tracing": "auto",
            "max_output_tokens": "inf",
        }
    )
    assert sorted(p.param for p in problems) == [
        "session.audio.input.format",
        "session.audio.output.speed",
        "session.prompt",
    ]
    assert config.instructions == "Be brief." and config.output_modalities == ("text",) and config.tracing == "auto"


def test_empty_modalities_and_a_bad_threshold_are_refused() -> None:
    bad_threshold = {"turn_detection": {"type": "server_vad", "threshold": 1.5}}
    config, problems = update({"output_modalities": [], "audio": {"input": bad_threshold}})
    assert {p.param for p in problems} == {"session.output_modalities", "session.audio.input.turn_detection.threshold"}
    assert config.output_modalities == ("audio",)


# -- the conversation ---------------------------------------------------------------------------------
def item(item_id: str, role: str = "user", text: str = "hi") -> dict[str, Any]:
    part = {"type": "output_text" if role == "assistant" else "input_text", "text": text}
    return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": [part]}


def test_the_conversation_keeps_the_order_previous_item_id_asks_for() -> None:
    conv = Conversation()
    assert conv.add(item("a"), ("chat", "a")) is None
    assert conv.add(item("c"), ("chat", "c")) == "a"
    assert conv.add(item("b"), ("chat", "b"), previous_item_id="a") == "a"
    assert conv.add(item("z"), ("chat", "z"), previous_item_id=ROOT) is None
    assert conv.previous_id("c") == "b" and conv.last_id() == "c"
    assert conv.refs_before("c") == [("chat", "b"), ("chat", "a"), ("chat", "z")]
    with pytest.raises(KeyError):
        conv.add(item("q"), ("chat", "q"), previous_item_id="nope")
    with pytest.raises(ValueError):
        conv.add(item("a"), ("chat", "a"))
    assert conv.remove("b") == ("chat", "b") and conv.get("b") is None and conv.remove("b") is None


def test_protocol_items_become_history_items() -> None:
    assert to_history(item("u", "user", "Hello")) == {"id": "u", "type": "message", "role": "user", "content": "Hello"}
    assert to_history(item("s", "system", "Rules"))["role"] == "system"
    spoken = {
        "id": "a",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_audio", "transcript": "Hi"}],
    }
    assert to_history(spoken)["content"] == "Hi"
    call = {
        "id": "f",
        "type": "function_call",
        "call_id": "c1",
        "name": "get",
        "arguments": "{}",
        "status": "completed",
    }
    assert to_history(call) == {"id": "f", "type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"}
    image = {"id": "i", "type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}
    with pytest.raises(ProtocolError) as info:
        to_history(image)
    assert (info.value.code, info.value.param) == ("invalid_image", "item.content.0.image_url")  # tests/test_images.py
    with pytest.raises(ProtocolError):
        to_history({"id": "e", "type": "message", "role": "user", "content": []})


# -- history controls --------------------------------------------------------------------------------
def fake_llm(chat: Chat) -> Any:
    return SimpleNamespace(chat=chat, name="llm", _user_items={7: None}, replies=RepliesInHistory(chat, keep=8))


def test_history_insert_and_delete_edit_the_chat_in_protocol_order() -> None:
    chat = Chat(size=8)
    llm = fake_llm(chat)
    for i in ("a", "b"):
        HistoryInsert(to_history(item(i, text=i))).apply(llm)
    HistoryInsert(to_history(item("s", "system", "x")), after=[("chat", "a")]).apply(llm)
    HistoryInsert(to_history(item("r", "assistant", "y")), after=[("user_turn", 7)]).apply(llm)  # no anchor: first
    assert [i["id"] for i in chat.items()] == ["r", "a", "s", "b"]
    HistoryInsert({"id": "f", "type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"}).apply(llm)
    chat.append_tool_output("c1", "42")
    HistoryDelete(("chat", "f")).apply(llm)  # the call goes, and its output with it
    HistoryDelete(("chat", "a")).apply(llm)
    HistoryDelete(("chat", "gone")).apply(llm)  # nothing there: nothing happens
    assert [i["id"] for i in chat.items()] == ["r", "s", "b"]


class _Echo(BaseHandler):
    def process(self, item: Any) -> Any:
        yield item


class _Mark(StageControl):
    target = _Echo

    def __init__(self, applied: list[str]) -> None:
        self.applied = applied

    def apply(self, stage: Any) -> None:
        self.applied.append(stage.name)


def test_a_stage_control_is_applied_by_its_stage_in_order_and_passed_on_by_others() -> None:
    class Other(BaseHandler):
        def process(self, item: Any) -> Any:
            yield item

    stop, gate, bus = threading.Event(), Gate(), EventBus()
    q1, q2, q3 = StageQueue(8), StageQueue(8), StageQueue(8)
    first = Other(stop, q1, q2, gate, bus, name="other")
    second = _Echo(stop, q2, q3, gate, bus, name="echo")
    applied: list[str] = []
    for stage in (first, second):
        stage.start()
    try:
        q1.put("before")
        q1.put(_Mark(applied))
        q1.put("after")
        assert [q3.get(timeout=5), q3.get(timeout=5)] == ["before", "after"]
        assert applied == ["echo"]
        assert q3.empty()
    finally:
        stop.set()
        for stage in (first, second):
            stage.join(2)
