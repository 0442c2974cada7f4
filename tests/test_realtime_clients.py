"""The realtime server with the clients people use, each unchanged and with its default settings.

Four clients talk to the in-process server (the embedded VAD, STT and TTS; the LLM is the
``responses-api`` backend on a scripted endpoint, :class:`Assistant`): the official ``openai``
SDK, the OpenAI Agents SDK (``agents.realtime.RealtimeAgent``), Pipecat
(``OpenAIRealtimeLLMService``) and LiveKit (``livekit.plugins.openai.realtime.RealtimeModel``).
Each does a text turn, an audio turn on a LibriVox clip with server-side turn detection, and a
tool call whose result the assistant speaks; LiveKit also syncs its chat context (items added
and deleted) and truncates a reply. Every connection goes through a :class:`ValidatingProxy`:
each server event must validate against the openai SDK's server-event union, and no client may
be sent an ``error``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from speech_to_speech.testing.realtime import WIRE_RATE, InProcessServer, load_clip, silence
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, librivox_clips, word_error_rate
from tests.realtime_proxy import ValidatingProxy

pytestmark = pytest.mark.models  # the server loads the embedded VAD, STT and TTS

#: the longest a step of a scenario may take on a slow, shared machine, s
WAIT_S = 120.0
#: the whole scenario of one client, s
SCENARIO_S = 600.0
#: what the scripted assistant says
GREETING = "Nice to hear from you."
SAID_BEFORE_CALL = "Let me check the weather."
FOLLOW_UP = "It is sunny in Paris."
HEARD = "I heard you."
WEATHER = {"sky": "sunny", "celsius": 21}
INSTRUCTIONS = "You are a weather assistant. Answer in one short sentence."


class Assistant(ResponsesServer):
    """The scripted LLM: its reply depends on the request, not on the order of requests.

    A request ending in a tool result gets :data:`FOLLOW_UP`; one whose last user message asks
    about the weather gets :data:`SAID_BEFORE_CALL` and a ``get_weather(city="Paris")`` call;
    a typed "hello" gets :data:`GREETING`; anything else (speech) gets :data:`HEARD`.
    """

    def next_reply(self) -> Reply:
        with self._lock:
            items = self.requests[-1].body.get("input") or []
        if items and items[-1].get("type") == "function_call_output":
            return Reply([Text(["It is sunny ", "in Paris."])])
        text = _last_user_text(items).lower()
        if "weather" in text:
            return Reply([Text(["Let me check ", "the weather."]), Call("get_weather", '{"city": "Paris"}')])
        if "hello" in text:
            return Reply([Text(["Nice to hear ", "from you."])])
        return Reply([Text(["I heard ", "you."])])


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return " ".join(str(p.get("text") or p.get("transcript") or "") for p in content or [])
    return ""


@pytest.fixture(scope="module")
def provider() -> Iterator[Assistant]:
    """The LLM endpoint of the module's ``server`` (the conftest fixture): an :class:`Assistant`."""
    with Assistant() as assistant:
        yield assistant


@pytest.fixture(scope="module")
def clip() -> tuple[np.ndarray, str]:
    """The shortest LibriVox clip as int16 at the wire rate, and its reference transcript."""
    import soundfile as sf

    path, reference = min(librivox_clips().items(), key=lambda kv: sf.info(str(kv[0])).duration)
    return load_clip(path), reference


def speech_then_silence(clip: np.ndarray, silence_s: float = 3.0) -> bytes:
    """The clip followed by silence, as pcm16 bytes: enough for the server's turn detection to
    end the turn (``semantic_vad`` waits up to 2 s for a sentence its end-of-turn model finds
    unfinished; ``server_vad`` ends it after ``--min_silence_ms``)."""
    return np.concatenate([clip, silence(silence_s)]).astype("<i2").tobytes()


def chunks(data: bytes, chunk_s: float = 0.1) -> Iterator[bytes]:
    size = 2 * round(chunk_s * WIRE_RATE)
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``condition`` on the loop until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return result


def assert_clean(proxy: ValidatingProxy) -> None:
    """Every server event validated against the SDK, and no client was sent an error."""
    assert not proxy.nonconforming, proxy.nonconforming
    errors = proxy.received("error")
    assert not errors, errors


def spoken_transcripts(proxy: ValidatingProxy) -> list[str]:
    return [e["transcript"] for e in proxy.received("response.output_audio_transcript.done")]


def user_transcripts(proxy: ValidatingProxy) -> list[str]:
    return [e["transcript"] for e in proxy.received("conversation.item.input_audio_transcription.completed")]


# -- the official openai SDK ---------------------------------------------------------------------------
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_openai_sdk(server: InProcessServer, provider: Assistant, clip: tuple[np.ndarray, str]) -> None:
    from openai import AsyncOpenAI

    samples, reference = clip

    async def scenario() -> ValidatingProxy:
        async with ValidatingProxy(f"ws://127.0.0.1:{server.port}") as proxy:
            client = AsyncOpenAI(base_url=f"{proxy.http_url}/v1", api_key="test")
            async with client.realtime.connect(model="s2s") as conn:
                reader = asyncio.create_task(_drain(conn))

                def done(n: int) -> bool:
                    return len(proxy.received("response.done")) >= n

                tools = [WEATHER_TOOL]
                await conn.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS, "tools": tools})
                # 1. a text turn
                text = {"type": "input_text", "text": "Hello there."}
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
                await conn.response.create(response={"metadata": {"turn": "text"}})
                await until(lambda: done(1), "the reply to the text turn")
                # 2. an audio turn with server VAD
                for chunk in chunks(speech_then_silence(samples)):
                    await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await until(lambda: done(2), "the reply to the audio turn")
                # 3. a tool call, answered by the client, and the spoken follow-up
                text = {"type": "input_text", "text": "What is the weather in Paris?"}
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
                await conn.response.create()
                call = await until(lambda: proxy.received("response.function_call_arguments.done"), "the function call")
                output = {"type": "function_call_output", "call_id": call[0]["call_id"], "output": json.dumps(WEATHER)}
                await conn.conversation.item.create(item=output)
                await until(lambda: done(3), "the response with the call")
                await conn.response.create()
                await until(lambda: done(4), "the follow-up")
                reader.cancel()
            return proxy

    proxy = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    assert_clean(proxy)
    assert spoken_transcripts(proxy) == [GREETING, HEARD, SAID_BEFORE_CALL, FOLLOW_UP]
    [heard] = user_transcripts(proxy)
    assert word_error_rate(reference, heard) <= TRANSCRIPT_WER_MAX, (reference, heard)
    dones = [e["response"] for e in proxy.received("response.done")]
    assert [d["status"] for d in dones] == ["completed"] * 4
    assert dones[0]["metadata"] == {"turn": "text"} and proxy.received("response.created")[0]["response"]["metadata"]
    assert all(d["usage"]["total_tokens"] == d["usage"]["input_tokens"] + d["usage"]["output_tokens"] for d in dones)
    # every item was added and done, in one order that previous_item_id tells
    added = proxy.received("conversation.item.added")
    done_ids = [e["item"]["id"] for e in proxy.received("conversation.item.done")]
    assert sorted(e["item"]["id"] for e in added) == sorted(done_ids) and len(set(done_ids)) == len(done_ids)
    assert [e["previous_item_id"] for e in added] == [None] + [e["item"]["id"] for e in added[:-1]]
    kinds = [(e["item"]["type"], e["item"].get("role")) for e in added]
    assert kinds[:5] == [("message", "user"), ("message", "assistant")] * 2 + [("message", "user")]
    # the message with the words before the call comes first, then the call, as the model produced
    # them; the call is announced as soon as it exists, before those words have played, so the
    # client may answer it (its output item) before that message item is done
    assert kinds[5:8] == [("message", "assistant"), ("function_call", None), ("function_call_output", None)]
    assert kinds[8:] == [("message", "assistant")]
    assert all(e["item"]["status"] for e in added)


async def _drain(conn: Any) -> None:
    """Read the connection's events (the proxy records them)."""
    async for _ in conn:
        pass


# -- the OpenAI Agents SDK ---------------------------------------------------------------------------
def test_openai_agents_realtime_agent(
    server: InProcessServer, provider: Assistant, clip: tuple[np.ndarray, str]
) -> None:
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    samples, reference = clip
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return json.dumps(WEATHER)

    async def scenario() -> tuple[ValidatingProxy, list[Any], list[Any]]:
        async with ValidatingProxy(f"ws://127.0.0.1:{server.port}") as proxy:
            agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS, tools=[get_weather])
            session = await RealtimeRunner(agent).run(
                model_config={"url": f"{proxy.url}/v1/realtime?model=s2s", "api_key": "test"}
            )
            events: list[Any] = []

            async def collect() -> None:
                async for event in session:
                    events.append(event)

            async with session:
                reader = asyncio.create_task(collect())
                await until(lambda: proxy.received("session.updated"), "session.updated")

                def ends() -> int:
                    return sum(1 for e in events if e.type == "agent_end")

                # 1. a text turn
                await session.send_message("Hello there.")
                await until(lambda: ends() >= 1, "the reply to the text turn")
                # 2. an audio turn: the server's VAD ends it and answers
                for chunk in chunks(speech_then_silence(samples)):
                    await session.send_audio(chunk)
                await until(lambda: ends() >= 2, "the reply to the audio turn")
                # 3. a tool call, run by the agent; its result is spoken
                await session.send_message("What is the weather in Paris?")
                await until(lambda: FOLLOW_UP in spoken_transcripts(proxy), "the spoken follow-up")
                await until(lambda: proxy.received("conversation.item.retrieved"), "a retrieved item")
                # the proxy sees an event before the agent has handled it: the follow-up's
                # agent_end (its response.done, after its output_item.done) says the agent has
                # seen every item of the turn; under load the snapshot otherwise races it
                await until(lambda: ends() >= 4, "the agent's end of the follow-up")
                history = list(session._history)
                reader.cancel()
            return proxy, events, history

    proxy, events, history = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    assert_clean(proxy)
    errors = [e for e in events if e.type == "error"]
    assert not errors, errors

    # the default semantic_vad and the agent's instructions and tools were taken
    updates = proxy.sent("session.update")
    assert updates[0]["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    session_now = proxy.received("session.updated")[-1]["session"]
    assert session_now["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session_now["instructions"] == INSTRUCTIONS
    assert [t["name"] for t in session_now["tools"]] == ["get_weather"]

    assert spoken_transcripts(proxy)[:2] == [GREETING, HEARD]
    [heard] = user_transcripts(proxy)
    assert word_error_rate(reference, heard) <= TRANSCRIPT_WER_MAX, (reference, heard)
    assert calls == ["Paris"]
    assert [e.tool.name for e in events if e.type == "tool_end"] == ["get_weather"]
    assert FOLLOW_UP in spoken_transcripts(proxy)

    # the agent's history: every message complete, the typed ones too
    messages = [i for i in history if i.type == "message"]
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant", "assistant"]
    assert all(getattr(m, "status", "completed") == "completed" for m in messages), messages
    assert proxy.sent("conversation.item.retrieve"), "the agent never retrieved an item"


# -- LiveKit -----------------------------------------------------------------------------------------
async def _livekit_reply(generation: Any) -> tuple[list[str], int, list[Any]]:
    """The texts, the audio samples and the function calls of one LiveKit generation."""
    texts, samples = [], 0
    async for message in generation.message_stream:
        texts.append("".join([t async for t in message.text_stream]))
        async for frame in message.audio_stream:
            samples += frame.samples_per_channel
    calls = [call async for call in generation.function_stream]
    return texts, samples, calls


def test_livekit_realtime_model(server: InProcessServer, provider: Assistant, clip: tuple[np.ndarray, str]) -> None:
    from livekit import rtc
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    from speech_to_speech.llm.prompts import INTERRUPTION_MARKER

    samples, reference = clip

    @llm.function_tool
    async def get_weather(city: str) -> str:
        """The current weather in a city."""
        return json.dumps(WEATHER)

    async def scenario() -> dict[str, Any]:
        async with ValidatingProxy(f"ws://127.0.0.1:{server.port}") as proxy:
            model = RealtimeModel(base_url=f"{proxy.http_url}/v1", api_key="test")
            sess = model.session()
            generations: list[Any] = []
            sess.on("generation_created", generations.append)
            try:
                await until(lambda: proxy.received("session.updated"), "session.updated")
                await sess.update_instructions(INSTRUCTIONS)
                await sess.update_tools([get_weather])

                # 1. a text turn: the user message goes in by a chat-context sync, then generate_reply
                ctx = sess.chat_ctx.copy()
                ctx.add_message(role="user", content="Hello there.")
                await sess.update_chat_ctx(ctx)
                text_reply = await _livekit_reply(await asyncio.wait_for(sess.generate_reply(), WAIT_S))

                # 2. an audio turn: the server's VAD ends it and answers by itself
                for chunk in chunks(speech_then_silence(samples)):
                    n = len(chunk) // 2
                    sess.push_audio(rtc.AudioFrame(chunk, WIRE_RATE, 1, n))
                await until(lambda: len(generations) >= 2, "the reply to the audio turn")
                audio_reply = await _livekit_reply(generations[1])

                # 3. a tool call; its output goes back by a chat-context sync, and the reply is spoken
                ctx = sess.chat_ctx.copy()
                ctx.add_message(role="user", content="What is the weather in Paris?")
                await sess.update_chat_ctx(ctx)
                said, _, calls = await _livekit_reply(await asyncio.wait_for(sess.generate_reply(), WAIT_S))
                ctx = sess.chat_ctx.copy()
                for call in calls:
                    output = json.dumps(WEATHER)
                    ctx.items.append(
                        llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=output, is_error=False)
                    )
                await sess.update_chat_ctx(ctx)
                follow_up = await _livekit_reply(await asyncio.wait_for(sess.generate_reply(), WAIT_S))

                # 4. a chat-context sync that adds a system and an assistant message and drops a user one
                session = next(iter(server.server.sessions))
                ctx = sess.chat_ctx.copy()
                dropped = next(i for i in ctx.items if i.type == "message" and i.role == "user")
                ctx.items.remove(dropped)
                ctx.add_message(role="system", content="The user is in Paris.", id="item_lk_system")
                ctx.add_message(role="assistant", content="Good to know.", id="item_lk_assistant")
                await sess.update_chat_ctx(ctx)
                await until(lambda: any(i["id"] == "item_lk_assistant" for i in session.llm.chat.items()), "history")
                history_after_sync = session.llm.chat.items()

                # 5. a truncate: the user heard only the start of the follow-up
                reply_id = next(
                    e["item"]["id"]
                    for e in reversed(proxy.received("response.output_item.done"))
                    if e["item"]["type"] == "message"
                )
                sess.truncate(message_id=reply_id, modalities=["audio"], audio_end_ms=150)
                await until(lambda: proxy.received("conversation.item.truncated"), "conversation.item.truncated")
                await asyncio.sleep(0.2)
                history = session.llm.chat.items()
                return {
                    "proxy": proxy,
                    "text": text_reply,
                    "audio": audio_reply,
                    "said": said,
                    "calls": calls,
                    "follow_up": follow_up,
                    "dropped": dropped.id,
                    "synced": history_after_sync,
                    "history": history,
                    "reply_id": reply_id,
                    "remote": sess.chat_ctx.copy(),
                }
            finally:
                await sess.aclose()
                await model.aclose()

    r = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    proxy: ValidatingProxy = r["proxy"]
    assert_clean(proxy)

    texts, audio_samples, _ = r["text"]
    assert texts == [GREETING] and audio_samples > 0.3 * WIRE_RATE
    created = proxy.received("response.created")
    assert created[0]["response"]["metadata"]["client_event_id"] == proxy.sent("response.create")[0]["event_id"]
    texts, audio_samples, _ = r["audio"]
    assert texts == [HEARD] and audio_samples > 0.3 * WIRE_RATE
    [heard] = user_transcripts(proxy)
    assert word_error_rate(reference, heard) <= TRANSCRIPT_WER_MAX, (reference, heard)
    assert r["said"] == [SAID_BEFORE_CALL]
    assert [(c.name, json.loads(c.arguments)) for c in r["calls"]] == [("get_weather", {"city": "Paris"})]
    texts, audio_samples, _ = r["follow_up"]
    assert texts == [FOLLOW_UP] and audio_samples > 0.3 * WIRE_RATE

    # the sync: one delete, two creates, each answered; the server's history follows
    assert [e["item_id"] for e in proxy.received("conversation.item.deleted")] == [r["dropped"]]
    synced = {i["id"]: i for i in r["synced"]}
    assert synced["item_lk_system"]["role"] == "system" and synced["item_lk_assistant"]["content"] == "Good to know."
    assert r["dropped"] not in synced
    assert not [i for i in r["synced"] if i.get("role") == "user" and i.get("content") == "Hello there."]
    # no item the server made was sent back (they were all announced with conversation.item.added)
    created_items = [e["item"] for e in proxy.sent("conversation.item.create")]
    assert {i["type"] for i in created_items} <= {"message", "function_call_output"}
    assert not [i for i in created_items if i.get("role") == "assistant" and i["id"] != "item_lk_assistant"]

    # the truncate cut the follow-up in history to what was heard, marked as interrupted
    [truncated] = proxy.received("conversation.item.truncated")
    assert truncated["item_id"] == r["reply_id"] and truncated["audio_end_ms"] == 150
    replies = [i["content"] for i in r["history"] if i.get("role") == "assistant"]
    cut = next(c for c in replies if c.endswith(INTERRUPTION_MARKER.strip()))
    assert len(cut) < len(FOLLOW_UP) + len(INTERRUPTION_MARKER) and FOLLOW_UP not in replies


# -- Pipecat -----------------------------------------------------------------------------------------
def test_pipecat_openai_realtime_llm_service(
    server: InProcessServer, provider: Assistant, clip: tuple[np.ndarray, str]
) -> None:
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import EndFrame, ErrorFrame, InputAudioRawFrame, LLMContextFrame, TTSAudioRawFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.workers.runner import WorkerRunner

    samples, reference = clip
    calls: list[dict[str, Any]] = []

    class Recorder(FrameProcessor):
        """Counts the assistant's audio and keeps every error frame."""

        def __init__(self) -> None:
            super().__init__()
            self.audio_bytes = 0
            self.errors: list[Any] = []

        async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio_bytes += len(frame.audio)
            elif isinstance(frame, ErrorFrame):
                self.errors.append(frame)
            await self.push_frame(frame, direction)

    async def get_weather(params: Any) -> None:
        calls.append(dict(params.arguments))
        await params.result_callback(WEATHER)

    async def scenario() -> tuple[ValidatingProxy, Recorder, Any]:
        async with ValidatingProxy(f"ws://127.0.0.1:{server.port}") as proxy:
            llm = OpenAIRealtimeLLMService(api_key="test", base_url=f"{proxy.url}/v1/realtime?model=s2s")
            llm.register_function("get_weather", get_weather)
            weather = FunctionSchema(
                name="get_weather",
                description="The current weather in a city.",
                properties={"city": {"type": "string"}},
                required=["city"],
            )
            # the typed turn: the context's user message, which asks for the tool
            context = LLMContext(
                messages=[
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": "What is the weather in Paris?"},
                ],
                tools=ToolsSchema(standard_tools=[weather]),
            )
            aggregators = LLMContextAggregatorPair(context)
            recorder = Recorder()
            pipeline = Pipeline([aggregators.user(), llm, recorder, aggregators.assistant()])
            worker = PipelineWorker(pipeline, params=PipelineParams(), cancel_on_idle_timeout=False)
            started = asyncio.Event()

            @worker.event_handler("on_pipeline_started")
            async def _started(worker: Any, frame: Any) -> None:
                started.set()

            runner = WorkerRunner(handle_sigint=False)
            await runner.add_workers(worker)
            running = asyncio.create_task(runner.run())
            try:
                await asyncio.wait_for(started.wait(), WAIT_S)
                await worker.queue_frame(LLMContextFrame(context))
                # 1. + 2. the typed turn: speech, a tool call Pipecat runs, and the spoken follow-up
                await until(lambda: FOLLOW_UP in spoken_transcripts(proxy), "the spoken follow-up")
                await until(lambda: len(proxy.received("response.done")) >= 2, "the follow-up's response.done")
                audio_before = recorder.audio_bytes
                # 3. an audio turn: the server's VAD ends it and answers
                for chunk in chunks(speech_then_silence(samples)):
                    await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=WIRE_RATE, num_channels=1))
                await until(lambda: HEARD in spoken_transcripts(proxy), "the reply to the audio turn")
                await until(lambda: len(proxy.received("response.done")) >= 3, "its response.done")
                await asyncio.sleep(0.2)
                assert recorder.audio_bytes > audio_before, "no audio of the reply to the audio turn"
                await worker.queue_frame(EndFrame())
                await asyncio.wait_for(running, WAIT_S)
            finally:
                if not running.done():
                    running.cancel()
            return proxy, recorder, context

    proxy, recorder, _ = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    assert_clean(proxy)
    assert not recorder.errors, recorder.errors
    assert calls == [{"city": "Paris"}]
    assert spoken_transcripts(proxy) == [SAID_BEFORE_CALL, FOLLOW_UP, HEARD]
    [heard] = user_transcripts(proxy)
    assert word_error_rate(reference, heard) <= TRANSCRIPT_WER_MAX, (reference, heard)
    # the server took the context's instructions and tools, and answered the call Pipecat returned
    session_now = proxy.received("session.updated")[-1]["session"]
    assert session_now["instructions"] == INSTRUCTIONS
    assert [t["name"] for t in session_now["tools"]] == ["get_weather"]
    outputs = [e["item"] for e in proxy.sent("conversation.item.create") if e["item"]["type"] == "function_call_output"]
    assert [json.loads(o["output"]) for o in outputs] == [WEATHER]
    assert recorder.audio_bytes > 0.6 * WIRE_RATE * 2  # some audio of each reply
