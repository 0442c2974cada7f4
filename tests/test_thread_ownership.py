"""No stage method is called from a thread its stage does not own.

:class:`~speech_to_speech.testing.threads.ThreadOwnership` watches every stage method while two
real runs go through every stage, on real speech:

* local mode on a spoken question (VAD, STT, the embedded 0.5B through llama.cpp with its partial
  prefill, Piper, the file sink);
* a realtime session (the real VAD, STT and TTS; the LLM a scripted ``/v1/responses`` provider):
  a LibriVox turn whose reply calls a tool, the client's output and ``response.create`` (the
  prefetched follow-up is claimed), and the user talking over the follow-up (a barge-in). The LLM
  stage's prefetch coordinator is watched as a part of that stage: the session discards a
  follow-up generated ahead with a message, not by calling it.

Control reaches a stage as a message handled in its own thread, or through the gate's stamp
(``docs/architecture.md``, "Control"); any call from another thread fails here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import handlers.llm.llama_cpp_llm  # noqa: F401  (stage classes are watched once imported)
from speech_to_speech.client.realtime import session_update
from speech_to_speech.core.events import EventBus
from speech_to_speech.llm.prefetch import PrefetchCoordinator
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.testing.realtime import InProcessServer, Microphone, RawClient
from speech_to_speech.testing.responses_server import Call, Reply, ResponsesServer, Text
from speech_to_speech.testing.runs import run_local
from speech_to_speech.testing.threads import ThreadOwnership
from speech_to_speech.testing.turns import librivox_speech, silence
from tests.helpers import WEATHER_TOOL

pytestmark = pytest.mark.models

DATA = Path(__file__).parent / "data"
WAIT_S = 60.0
LONG_FOLLOW_UP = [
    "It is sunny in Paris today, with a light breeze from the west. ",
    "The afternoon will be warm, and the evening clear and mild, a fine time for a walk by the river.",
]


def check(ownership: ThreadOwnership) -> None:
    report = "\n".join(ownership.report())
    print(report)
    print(f"{ownership.checked} stage method calls watched")
    assert ownership.checked > 100, "nothing was watched: the stage classes were not patched"
    assert not ownership.calls, report


def test_local_mode_calls_no_stage_from_another_stage_thread(tmp_path: Path) -> None:
    args = parse_args(
        [
            "--input_audio", str(DATA / "question-capital.wav"),
            "--output_audio", str(tmp_path / "out.wav"),
            "--llm_model", "qwen2.5-coder-0.5b",
        ]
    )  # fmt: skip
    with ThreadOwnership() as ownership:
        pipeline = run_local(args, EventBus())
    assert pipeline.stages, "the pipeline did not run"
    check(ownership)


def test_a_realtime_session_calls_no_stage_from_another_stage_thread(
    server: InProcessServer, provider: ResponsesServer
) -> None:
    clips = librivox_speech()
    if len(clips) < 2:
        pytest.skip("needs two LibriVox clips: apt-get install pocketsphinx-testdata")
    (question, _), (over, _) = list(clips.values())[:2]
    provider.script(
        Reply([Text(["Let me check ", "the weather."]), Call("get_weather", '{"city": "Paris"}')]),
        Reply([Text(LONG_FOLLOW_UP)]),
        Reply([Text(["Sure, go on."])]),
    )

    async def scenario() -> list[Any]:
        client = await RawClient.open(server.ws_url)
        microphone = Microphone(client)
        try:
            await client.log.wait_for("session.created", WAIT_S)
            detection = {"type": "server_vad", "silence_duration_ms": 500}
            await client.send(session_update(detection, tools=[WEATHER_TOOL]))
            await client.log.wait_for("session.updated", WAIT_S)
            microphone.say(question)
            call = await client.log.wait_for("response.function_call_arguments.done", WAIT_S)
            await client.log.wait_for("response.done", WAIT_S)
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'}
            await client.send({"type": "conversation.item.create", "item": output})
            while len(provider.requests) < 2:  # the follow-up is generated ahead, then claimed
                await asyncio.sleep(0.01)
            since = len(client.log.events)
            await client.send({"type": "response.create"})
            await client.log.wait_for("response.output_audio.delta", WAIT_S, since=since)
            microphone.say(over)  # over the follow-up: paused, judged, interrupted
            microphone.say(silence(1.0))
            cut = await client.log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled",
                WAIT_S,
                since=since,
                what="the follow-up cut",
            )
            after = client.log.events.index(cut) + 1
            await client.log.wait_for("response.done", WAIT_S, since=after, what="the reply to the interruption")
            return list(client.log.events)
        finally:
            await microphone.stop()
            await client.close()

    with ThreadOwnership(parts=(PrefetchCoordinator,)) as ownership:
        events = asyncio.run(asyncio.wait_for(scenario(), 4 * WAIT_S))
        server.wait_until_idle()
    assert not [e for e in events if e["type"] == "error"], events
    assert len(provider.requests) == 3, "the follow-up generated ahead was not claimed (generated twice)"
    check(ownership)
