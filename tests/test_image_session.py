"""Images through the realtime server: ``conversation.item.create`` with an ``input_image`` part.

Two servers, one LLM each (model-free, so what reached the model can be checked exactly): one
that cannot see (``turn-script``, text only) and one that can (``seeing-echo``, which records the
messages it got). STT and TTS are fakes; the VAD is the embedded Silero (typed items skip it).
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from speech_to_speech.testing.fakes import SeeingEcho
from speech_to_speech.testing.realtime import InProcessServer, RawClient

WAIT_S = 60.0
TEXT_ONLY = {"session": {"type": "realtime", "output_modalities": ["text"]}}


#: model-free STT and TTS (registered by speech_to_speech.testing.fakes)
FAKES = ("--stt", "fake-stt", "--tts", "fake-tts")


def png_url(size: tuple[int, int] = (12, 8)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 120, 200)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def user_item(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def image(url: str, detail: str = "auto") -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, "detail": detail}


async def turn(client: RawClient, item: dict[str, Any], event_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Create ``item`` and ask for a response; every event up to ``response.done``, and that event."""
    since = len(client.log.events)
    await client.send({"type": "conversation.item.create", "event_id": event_id, "item": item})
    await client.send({"type": "response.create"})
    done = await client.log.wait_for("response.done", WAIT_S, since=since)
    return client.log.events[since:], done


def reply_text(done: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "") for item in done["response"]["output"] for part in item.get("content", [])
    ).strip()


def user_items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user items the server added."""
    return [e["item"] for e in events if e["type"] == "conversation.item.added" and e["item"].get("role") == "user"]


def errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["error"] for e in events if e["type"] == "error"]


@pytest.fixture(scope="module")
def blind(realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    return realtime_servers("--llm_backend", "turn-script", *FAKES)


@pytest.fixture(scope="module")
def seeing(blind: InProcessServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    return realtime_servers("--llm_backend", "seeing-echo", *FAKES)


def test_a_model_that_cannot_see_says_so_and_answers_the_text(blind: InProcessServer) -> None:
    async def scenario() -> None:
        client = await RawClient.open(blind.ws_url)
        try:
            await client.send({"type": "session.update", **TEXT_ONLY})
            events, done = await turn(client, user_item(text("Hello"), image(png_url())), "evt_img")
            (error,) = errors(events)
            assert error["code"] == "unsupported_content"
            assert error["event_id"] == "evt_img" and error["param"] == "item.content.1"
            assert "does not accept images" in error["message"]
            (added,) = user_items(events)
            assert added["content"] == [text("Hello")]
            assert reply_text(done) == "You said: Hello."

            # an image alone: nothing is created, and the conversation goes on
            since = len(client.log.events)
            await client.send({"type": "conversation.item.create", "item": user_item(image(png_url()))})
            await client.log.wait_for("error", WAIT_S, since=since)
            events, done = await turn(client, user_item(text("Still there")), "evt_text")
            assert not errors(events)
            assert reply_text(done) == "You said: Still there."
            assert [item["content"] for item in user_items(client.log.events[since:])] == [[text("Still there")]]
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_model_that_sees_gets_the_image(seeing: InProcessServer) -> None:
    SeeingEcho.seen.clear()
    url = png_url()

    async def scenario() -> None:
        client = await RawClient.open(seeing.ws_url)
        try:
            await client.send({"type": "session.update", **TEXT_ONLY})
            events, done = await turn(client, user_item(text("What is this?"), image(url, "low")), "evt_img")
            assert not errors(events)
            (added,) = user_items(events)
            assert added["content"][1] == {"type": "input_image", "image_url": url, "detail": "low"}
            assert reply_text(done) == "I see 1 image."

            # a bad image: one error naming it, nothing created, the session answers on
            events, done = await turn(client, user_item(image("data:image/png;base64,aGVsbG8=")), "evt_bad")
            (error,) = errors(events)
            assert (error["code"], error["event_id"]) == ("invalid_image", "evt_bad")
            assert error["param"] == "item.content.0.image_url" and "not a readable image/png" in error["message"]
            assert not user_items(events)
            assert reply_text(done) == "I see 1 image."  # the first image is still in history
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
    last_user = [m for m in SeeingEcho.seen[0] if m["role"] == "user"][-1]
    assert last_user["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]
