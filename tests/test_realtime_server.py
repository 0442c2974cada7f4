"""The realtime server (``/v1/realtime``) in process, with the real embedded models.

One server runs for the whole module in a background thread with its own
asyncio loop, so the tests can look inside it (``server.sessions``, a
session's history and event bus) while clients talk to it over real
WebSockets: the official ``openai`` SDK, and a plain ``websockets`` client.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import threading
import time
import typing
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.protocol import State

from speech_to_speech.core.audio import int16_to_float
from speech_to_speech.core.events import AssistantText, Event
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.realtime.server import CLOSE_TRY_AGAIN_LATER
from speech_to_speech.speech.text import remove_unspeakable
from speech_to_speech.testing.realtime import (
    WIRE_RATE,
    EventLog,
    InProcessServer,
    RawClient,
    append_event,
    blocks,
    decode_pcm16,
    event_type,
    load_clip,
    session_threads,
    silence,
    transcription_of,
)
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, normalize, word_error_rate
from tests.helpers import two_short_clips

pytestmark = pytest.mark.models

#: the longest any single wait for a server event may take on a slow, shared machine, s
WAIT_S = 300.0
#: a whole test scenario is stopped after this (a hang fails instead of blocking), s
SCENARIO_S = 900.0
#: how long threads and sessions of a dropped client may take to go away, s
CLEANUP_S = 15.0
#: silence after a clip so that the server's VAD ends the turn, s
TRAILING_SILENCE_S = 1.5
#: how much of the first reply has played when the user barges in, s
PLAYED_BEFORE_BARGE_IN_S = 0.75
#: the server sends audio this far ahead of its play time (ClientSink.lead_s), s
SERVER_LEAD_S = 0.25
#: size of each input_audio_buffer.append block, s
BLOCK_S = 0.1
#: the key of the server that requires one
API_KEY = "s2s-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
#: asks the model for a reply long enough to be interrupted
LONG_REPLY = "You are a storyteller. Always answer with a long story of at least five sentences."


#: two short LibriVox clips (path, reference): A starts a conversation, B barges in
CLIP_A, CLIP_B = two_short_clips()


def run(scenario: Coroutine[Any, Any, Any], timeout_s: float = SCENARIO_S) -> Any:
    """Run a client scenario on a fresh event loop in this thread, within ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@pytest.fixture(scope="module")
def server(realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    """The module's server: default settings, replies capped to keep playback short."""
    return realtime_servers("--max_new_tokens", "40")


@pytest.fixture(scope="module")
def guarded_server(server: InProcessServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    """A second server with one session at most and an API key (the models are already loaded)."""
    return realtime_servers("--max_sessions", "1", "--api_key", API_KEY, "--max_new_tokens", "20", warm_up=False)


async def text_turn(client: RawClient, prompt: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Send ``prompt`` as a user message and ask for a response.

    Returns:
        the ``response.done`` event and every event of that response, in order.
    """
    log = client.log
    since = len(log.events)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create"})
    created = await log.wait_for("response.created", WAIT_S, since=since)
    rid = created["response"]["id"]
    done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, WAIT_S, since, "response.done"
    )
    return done, [e for e in log.events[since:] if e.get("response_id") == rid]


# -- 1. the official SDK, end to end on real speech --------------------------------------------------
def _server_event_models() -> dict[str, type[pydantic.BaseModel]]:
    """The SDK's model class for each server event type."""
    union = typing.get_args(RealtimeServerEvent)[0]
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in typing.get_args(union)}


SERVER_EVENT_MODELS = _server_event_models()


def test_openai_sdk_drives_a_spoken_turn(server: InProcessServer) -> None:
    clip, reference = CLIP_A
    nonconforming: list[str] = []

    async def scenario() -> list[Any]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="test")
        async with client.realtime.connect(model="s2s") as conn:

            async def recv() -> Any:
                """The next event as the SDK parses it, after a strict check against the SDK's schema."""
                raw = await conn.recv_bytes()
                data = json.loads(raw)
                model = SERVER_EVENT_MODELS.get(data.get("type"))
                if model is None:
                    nonconforming.append(f"unknown event type {data.get('type')!r}")
                else:
                    try:
                        model.model_validate(data)
                    except pydantic.ValidationError as exc:
                        nonconforming.append(f"{data['type']}: {exc}")
                return conn.parse_event(raw)

            log = EventLog(recv)
            try:
                await log.wait_for("session.created", WAIT_S)
                await conn.session.update(
                    session={
                        "type": "realtime",
                        "instructions": "Reply in one short sentence.",
                        "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
                    }
                )
                await log.wait_for("session.updated", WAIT_S)
                audio = np.concatenate([load_clip(clip), silence(TRAILING_SILENCE_S)])
                for payload in blocks(audio, BLOCK_S):  # faster than real time
                    await conn.input_audio_buffer.append(audio=payload)
                await log.wait_for("response.done", WAIT_S)
            finally:
                await log.stop()
            return log.events

    events = run(scenario())
    assert not nonconforming, nonconforming
    types = [event_type(e) for e in events]

    started = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    stopped = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert len(started) == len(stopped) == len(committed) == 1, types
    item_id = started[0].item_id
    assert stopped[0].item_id == committed[0].item_id == item_id
    transcripts = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert [e.item_id for e in transcripts] == [item_id], types
    heard = transcripts[0].transcript
    assert word_error_rate(reference, heard) <= TRANSCRIPT_WER_MAX, (reference, heard)
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped")
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index("response.created")

    done = events[-1]
    assert done.type == "response.done"
    assert done.response.status == "completed", done.response
    usage = done.response.usage
    assert usage is not None and isinstance(usage.total_tokens, int)
    assert usage.total_tokens == (usage.input_tokens or 0) + (usage.output_tokens or 0)

    deltas = [e for e in events if e.type == "response.output_audio.delta"]
    assert deltas and {e.response_id for e in deltas} == {done.response.id}
    audio = int16_to_float(np.concatenate([decode_pcm16(e.delta) for e in deltas]))
    assert len(audio) > 0.3 * WIRE_RATE, "less than 0.3 s of reply audio"
    assert np.sqrt(np.mean(audio**2)) > 0.005 and np.abs(audio).max() > 0.05, "the reply audio is silent"
    transcript_done = [e for e in events if e.type == "response.output_audio_transcript.done"]
    assert len(transcript_done) == 1 and transcript_done[0].transcript.strip()
    assert transcript_done[0].response_id == done.response.id
    assert types.index("response.output_audio.delta") < types.index("response.output_audio_transcript.done")


# -- 2. barge-in through the server ------------------------------------------------------------
def test_barge_in_cancels_the_reply_and_keeps_what_was_heard(server: InProcessServer) -> None:
    (clip_a, _), (clip_b, reference_b) = CLIP_A, CLIP_B

    async def scenario() -> dict[str, Any]:
        client = await RawClient.open(server.ws_url)
        log = client.log
        try:
            created = await log.wait_for("session.created", WAIT_S)
            session = server.session(created["session"]["id"])
            replies: list[AssistantText] = []  # the LLM's full replies, as generated

            def on_event(event: Event) -> None:
                if isinstance(event, AssistantText):
                    replies.append(event)

            session.bus.subscribe(on_event)
            update = {"instructions": LONG_REPLY, "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
            await client.send({"type": "session.update", "session": update})
            await log.wait_for("session.updated", WAIT_S)

            # turn A, faster than real time; 2 s of silence keeps B out of A's turn-reopening window
            for payload in blocks(np.concatenate([load_clip(clip_a), silence(2.0)]), BLOCK_S):
                await client.send(append_event(payload))
            speech_a = await log.wait_for("input_audio_buffer.speech_started", WAIT_S)
            reply_1 = (await log.wait_for("response.created", WAIT_S))["response"]["id"]

            def of_reply_1(e: dict[str, Any], kind: str) -> bool:
                return e["type"] == kind and (e.get("response_id") or e.get("response", {}).get("id")) == reply_1

            await log.wait_for(lambda e: of_reply_1(e, "response.output_audio.delta"), WAIT_S, what="reply audio")

            # Let the reply play a little (audio arrives SERVER_LEAD_S before it plays), and its whole
            # text be generated, so that "heard" is a non-empty part of a known reply.
            def received_audio_s() -> float:
                return sum(
                    len(base64.b64decode(e["delta"])) / 2 / WIRE_RATE
                    for e in log.events
                    if of_reply_1(e, "response.output_audio.delta")
                )

            def ended() -> bool:
                return any(of_reply_1(e, "response.done") for e in log.events)

            await log.wait_until(
                lambda: ended() or (bool(replies) and received_audio_s() >= PLAYED_BEFORE_BARGE_IN_S + SERVER_LEAD_S),
                WAIT_S,
                "played enough of reply 1",
            )
            assert not ended(), "reply 1 ended before the barge-in: nothing to interrupt"
            full_reply = replies[0].text

            # turn B barges in, streamed in real time like a microphone
            barge_in = len(log.events)
            began = time.monotonic()
            for i, payload in enumerate(blocks(load_clip(clip_b), BLOCK_S)):
                await asyncio.sleep(max(0.0, began + i * BLOCK_S - time.monotonic()))
                await client.send(append_event(payload))
            for payload in blocks(silence(TRAILING_SILENCE_S), BLOCK_S):
                await client.send(append_event(payload))

            speech_b = await log.wait_for("input_audio_buffer.speech_started", WAIT_S, since=barge_in)
            done_1 = await log.wait_for(lambda e: of_reply_1(e, "response.done"), WAIT_S, what="reply 1 done")
            transcript_b = await transcription_of(log, speech_b, WAIT_S, "B's transcription")
            return {
                "events": list(log.events),
                "speech_a": speech_a,
                "speech_b": speech_b,
                "done_1": done_1,
                "transcript_b": transcript_b,
                "reply_1": reply_1,
                "full_reply": full_reply,
                "history": session.llm.chat.items(),
            }
        finally:
            await client.close()

    r = run(scenario())
    events: list[dict[str, Any]] = r["events"]
    assert r["speech_b"]["item_id"] != r["speech_a"]["item_id"], "B reopened A's turn instead of starting one"

    # the first reply was cancelled, and none of its audio left after B's speech start
    assert r["done_1"]["response"]["status"] == "cancelled", r["done_1"]["response"]
    assert r["done_1"]["response"]["status_details"]["reason"] == "turn_detected"
    after_speech_b = events[next(i for i, e in enumerate(events) if e is r["speech_b"]) + 1 :]
    late = [
        e for e in after_speech_b if e["type"] == "response.output_audio.delta" and e["response_id"] == r["reply_1"]
    ]
    assert not late, f"{len(late)} audio deltas of the cancelled reply after speech_started"

    # history keeps only the heard start of reply 1, marked as interrupted
    history: list[dict[str, Any]] = r["history"]
    roles = [item.get("role") for item in history if item.get("type", "message") == "message"]
    assert roles[:2] == ["user", "assistant"], history
    heard_message = str(next(i for i in history if i.get("role") == "assistant")["content"])
    marker = INTERRUPTION_MARKER.strip()
    assert heard_message.endswith(marker), heard_message
    heard = normalize(heard_message[: -len(marker)])
    full = normalize(remove_unspeakable(r["full_reply"]))
    assert full[: len(heard)] == heard, (heard_message, r["full_reply"])
    assert len(heard) < len(full), "the whole reply was kept: it was not cut to what was heard"
    sent = normalize(
        "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == r["reply_1"]
        )
    )
    assert sent[: len(heard)] == heard, "history holds words the client was never sent"

    # B is a turn of its own, transcribed
    text_b = r["transcript_b"]["transcript"]
    assert word_error_rate(reference_b, text_b) <= 0.5, (reference_b, text_b)


# -- 3. text-only replies and manual turns --------------------------------------------------------
def test_text_only_manual_turns(server: InProcessServer) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        client = await RawClient.open(server.ws_url)
        log = client.log
        try:
            created = await log.wait_for("session.created", WAIT_S)
            session = server.session(created["session"]["id"])
            update = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}
            await client.send({"type": "session.update", "session": update})
            updated = await log.wait_for("session.updated", WAIT_S)
            assert updated["session"]["output_modalities"] == ["text"]
            assert updated["session"]["audio"]["input"]["turn_detection"] is None

            since = len(log.events)
            await client.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit_empty"})
            error = await log.wait_for(lambda e: True, WAIT_S, since=since, what="a reply to the empty commit")
            done, parts = await text_turn(client, "What is the capital of France?")
            return error, done, parts, session.llm.chat.items()
        finally:
            await client.close()

    error, done, parts, history = run(scenario())
    assert error["type"] == "error", error
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    assert error["error"]["event_id"] == "evt_commit_empty"

    assert done["response"]["status"] == "completed", done["response"]
    assert done["response"]["output_modalities"] == ["text"]
    kinds = [e["type"] for e in parts]
    assert not [k for k in kinds if "audio" in k], kinds
    deltas = [e["delta"] for e in parts if e["type"] == "response.output_text.delta"]
    text_done = [e for e in parts if e["type"] == "response.output_text.done"]
    assert deltas and len(text_done) == 1, kinds
    assert text_done[0]["text"] == "".join(deltas)
    assert text_done[0]["text"].strip()
    assert kinds.index("response.output_text.done") > max(i for i, k in enumerate(kinds) if k.endswith("text.delta"))
    assert history[-1]["role"] == "assistant" and history[-1]["content"] == text_done[0]["text"].strip()


# -- 4. malformed input -----------------------------------------------------------------------------
KNOWN_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "output_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "conversation.item.delete",
    "response.create",
    "response.cancel",
)
TEXT = st.characters(exclude_categories=("Cs",))  # lone surrogates cannot be sent as UTF-8
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(TEXT, max_size=8), children, max_size=3),
    max_leaves=8,
)
non_objects = json_values.filter(lambda v: not isinstance(v, dict))
non_strings = json_values.filter(lambda v: not isinstance(v, str))
non_lists = json_values.filter(lambda v: not isinstance(v, list))
wrong_objects = json_values.filter(lambda v: v is not None and not isinstance(v, dict))


def not_null(value: Any) -> bool:
    """Not null: a null optional field is "not given" in the protocol's types (session.update
    ``instructions``, ``tools``, ``tool_choice``; response.create ``output_modalities``), so it
    is accepted, not refused."""
    return value is not None


def _is_invalid_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return True
    return False


bad_base64 = st.text(TEXT, min_size=1, max_size=24).filter(_is_invalid_base64)
odd_pcm = st.binary(max_size=15).filter(lambda b: len(b) % 2 == 1).map(lambda b: base64.b64encode(b).decode())
bad_modalities = (
    non_lists
    | st.just([])
    | st.lists(st.text(TEXT, max_size=6), min_size=1, max_size=2).filter(lambda m: not set(m) <= {"audio", "text"})
)

wrong_fields: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.builds(lambda v: {"type": "session.update", "session": v}, non_objects),
    st.builds(lambda v: {"type": "session.update", "session": {"instructions": v}}, non_strings.filter(not_null)),
    st.builds(lambda v: {"type": "session.update", "session": {"output_modalities": v}}, bad_modalities),
    st.builds(lambda v: {"type": "session.update", "session": {"tools": v}}, non_lists.filter(not_null)),
    st.builds(
        lambda v: {"type": "session.update", "session": {"tool_choice": v}},
        json_values.filter(lambda v: not_null(v) and v not in ("auto", "none", "required")),
    ),
    st.builds(lambda v: {"type": "session.update", "session": {"audio": v}}, wrong_objects),
    st.builds(
        lambda side, v: {"type": "session.update", "session": {"audio": {side: v}}},
        st.sampled_from(["input", "output"]),
        wrong_objects,
    ),
    st.builds(
        lambda v: {"type": "session.update", "session": {"audio": {"input": {"turn_detection": v}}}}, wrong_objects
    ),
    st.builds(lambda v: {"type": "input_audio_buffer.append", "audio": v}, non_strings),
    st.builds(lambda v: {"type": "input_audio_buffer.append", "audio": v}, bad_base64 | odd_pcm),
    st.builds(lambda v: {"type": "conversation.item.create", "item": v}, non_objects),
    st.builds(
        lambda v: {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": v}},
        non_lists | st.just([]) | st.lists(non_objects, min_size=1, max_size=2),
    ),
    st.builds(
        lambda v: {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": v}]},
        },
        non_strings,
    ),
    st.builds(
        lambda item_id, end: {"type": "conversation.item.truncate", "item_id": item_id, "audio_end_ms": end},
        json_values,
        json_values,
    ),
    st.builds(lambda v: {"type": "conversation.item.retrieve", "item_id": v}, json_values),
    st.builds(lambda v: {"type": "conversation.item.delete", "item_id": v}, json_values),
    st.builds(lambda v: {"type": "response.cancel", "response_id": v}, json_values.filter(lambda v: v is not None)),
    st.builds(lambda v: {"type": "response.create", "response": v}, wrong_objects),
    st.builds(
        lambda v: {"type": "response.create", "response": {"instructions": v}},
        non_strings.filter(not_null),
    ),
    st.builds(
        lambda v: {"type": "response.create", "response": {"output_modalities": v}}, bad_modalities.filter(not_null)
    ),
)
unknown_types = st.fixed_dictionaries(
    {"type": st.text(TEXT, max_size=30).filter(lambda t: t not in KNOWN_TYPES) | non_strings},
    optional={"payload": json_values},
) | st.dictionaries(st.text(TEXT, max_size=8).filter(lambda k: k not in ("type", "event_id")), json_values, max_size=3)
event_ids = st.none() | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)


@st.composite
def bad_messages(draw: st.DrawFn) -> tuple[str | bytes, str | None]:
    """A frame the server must refuse, and the event_id an ``error`` must echo (None: none given)."""
    kind = draw(st.sampled_from(["non_object", "unknown", "wrong_fields", "not_json", "binary"]))
    if kind == "non_object":
        return json.dumps(draw(non_objects)), None
    if kind == "not_json":
        return draw(st.text(TEXT, max_size=40).filter(_is_not_json)), None
    if kind == "binary":
        return draw(st.binary(max_size=64)), None
    event = dict(draw(unknown_types if kind == "unknown" else wrong_fields))
    event_id = draw(event_ids)
    if event_id is not None:
        event["event_id"] = event_id
    return json.dumps(event), event_id


def _is_not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def test_malformed_input_gets_errors_and_the_connection_stays_open(server: InProcessServer) -> None:
    loop = asyncio.new_event_loop()
    client: RawClient | None = None
    try:
        client = loop.run_until_complete(_open_fuzz_client(server))
        fuzzed = client

        @settings(
            max_examples=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(bad_messages())
        @example(('{"event_id": "evt_no_type"}', "evt_no_type"))
        @example(('{"type": 7, "event_id": "evt_int_type"}', "evt_int_type"))
        @example(('{"type": "response.create", "response": 0, "event_id": "evt_zero"}', "evt_zero"))
        @example(('{"type": "response.create", "response": []}', None))
        @example(('{"type": "session.update", "session": {"audio": false}}', None))
        @example(('{"type": "session.update", "session": {"audio": {"input": "pcm"}}}', None))
        @example(('{"type": "session.update", "session": {"audio": {"output": []}}}', None))
        @example(('{"type": "input_audio_buffer.append", "audio": "AAA"}', None))
        @example(('{"type": "input_audio_buffer.append", "audio": "AA=="}', None))
        @example(("not json", None))
        @example(("[]", None))
        @example((b"\x00\x01", None))
        def refuses(message: tuple[str | bytes, str | None]) -> None:
            frame, event_id = message
            reply = loop.run_until_complete(asyncio.wait_for(_send_and_await_one(fuzzed, frame), WAIT_S))
            assert reply["type"] == "error", (frame, reply)
            assert reply["error"]["code"] and reply["error"]["message"], reply
            if event_id is not None:
                assert reply["error"]["event_id"] == event_id, (frame, reply)
            assert fuzzed.ws.state is State.OPEN

        refuses()
        probe = loop.run_until_complete(
            _send_and_await_one(client, json.dumps({"type": "input_audio_buffer.clear", "event_id": "probe"}))
        )
        assert probe["type"] == "input_audio_buffer.cleared", probe
        assert client.ws.state is State.OPEN
    finally:
        if client is not None:
            loop.run_until_complete(client.close())
        loop.close()

    async def fresh_client() -> dict[str, Any]:
        client = await RawClient.open(server.ws_url)
        try:
            await client.log.wait_for("session.created", WAIT_S)
            await client.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
            await client.log.wait_for("session.updated", WAIT_S)
            done, _ = await text_turn(client, "Say hello.")
            return done
        finally:
            await client.close()

    done = run(fresh_client())
    assert done["response"]["status"] == "completed", done["response"]


async def _open_fuzz_client(srv: InProcessServer) -> RawClient:
    """A connected client whose session has been created."""
    client = await RawClient.open(srv.ws_url)
    await client.log.wait_for("session.created", WAIT_S)
    return client


async def _send_and_await_one(client: RawClient, frame: str | bytes) -> dict[str, Any]:
    """Send one raw frame and return the next server event (after every reply to earlier frames:
    a session.update with one bad field gets an error and then session.updated)."""
    since = len(client.log.events)
    await client.send({"type": "input_audio_buffer.clear"})  # its reply comes after all earlier ones
    await client.log.wait_for("input_audio_buffer.cleared", WAIT_S, since=since, what="the sync probe")
    since = len(client.log.events)
    await client.send(frame)
    return await client.log.wait_for(lambda e: True, WAIT_S, since=since, what=f"a reply to {frame!r}")


# -- 5. a client that drops mid-response -----------------------------------------------------------
def test_disconnect_mid_response_releases_the_session(server: InProcessServer) -> None:
    server.wait_until_idle(WAIT_S)
    threads_before = threading.active_count()

    async def scenario() -> None:
        client = await RawClient.open(server.ws_url)
        try:
            created = await client.log.wait_for("session.created", WAIT_S)
            assert server.session(created["session"]["id"])
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
            await client.send({"type": "conversation.item.create", "item": item})
            await client.send({"type": "response.create"})
            await client.log.wait_for("response.output_audio.delta", WAIT_S)
            client.abort()  # no closing handshake
        finally:
            await client.close()

    run(scenario())
    deadline = time.monotonic() + CLEANUP_S
    while time.monotonic() < deadline and (server.server.sessions or threading.active_count() > threads_before):
        time.sleep(0.05)
    assert not server.server.sessions, "the dropped client's session is still registered"
    assert threading.active_count() <= threads_before, [t.name for t in threading.enumerate()]
    assert not session_threads(), session_threads()


# -- 6. --max_sessions ----------------------------------------------------------------------------------
def test_max_sessions_refuses_the_next_client(guarded_server: InProcessServer) -> None:
    guarded_server.wait_until_idle(WAIT_S)

    async def scenario() -> tuple[dict[str, Any], int | None, list[str], dict[str, Any]]:
        first = await RawClient.open(guarded_server.ws_url, AUTH)
        try:
            await first.log.wait_for("session.created", WAIT_S)
            second = await RawClient.open(guarded_server.ws_url, AUTH)
            try:
                error = await second.log.wait_for("error", WAIT_S)
                await asyncio.wait_for(second.ws.wait_closed(), WAIT_S)
                code = second.ws.close_code
                seen = [e["type"] for e in second.log.events]
            finally:
                await second.close()
        finally:
            await first.close()
        # the slot is free again once the first client has gone
        deadline = time.monotonic() + WAIT_S
        while guarded_server.server.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        third = await RawClient.open(guarded_server.ws_url, AUTH)
        try:
            created = await third.log.wait_for("session.created", WAIT_S)
        finally:
            await third.close()
        return error, code, seen, created

    error, code, seen, created = run(scenario())
    assert error["error"]["code"] == "max_sessions_reached", error
    assert code == CLOSE_TRY_AGAIN_LATER
    assert "session.created" not in seen, seen
    assert created["type"] == "session.created"


# -- 7. --api_key ----------------------------------------------------------------------------------------
def test_api_key_is_required(guarded_server: InProcessServer) -> None:
    guarded_server.wait_until_idle(WAIT_S)

    async def refused(headers: dict[str, str] | None) -> int:
        with pytest.raises(InvalidStatus) as info:
            async with connect(guarded_server.ws_url, additional_headers=headers, open_timeout=WAIT_S):
                pass
        return info.value.response.status_code

    async def accepted() -> dict[str, Any]:
        client = await RawClient.open(guarded_server.ws_url, AUTH)
        try:
            return await client.log.wait_for("session.created", WAIT_S)
        finally:
            await client.close()

    assert run(refused(None)) == 401
    assert run(refused({"Authorization": "Bearer wrong-key"})) == 401
    assert run(refused({"Authorization": API_KEY})) == 401  # not a bearer token
    assert run(accepted())["type"] == "session.created"
