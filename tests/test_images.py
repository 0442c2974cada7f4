"""Images in the conversation: the check every client image passes, history, its bound, and the
request bodies of the two OpenAI-compatible backends (against the scripted server)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from handlers.llm.openai_compatible import ChatCompletionsHandler, ResponsesAPIHandler
from speech_to_speech.core.messages import EndOfResponse, Transcript
from speech_to_speech.llm import images
from speech_to_speech.llm.api import LLMConfig, OpenAICompatibleConfig
from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.images import ImageError, check_image, open_image
from speech_to_speech.llm.items import EARLIER_IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER, ChatItemError, has_part
from speech_to_speech.llm.serialize import to_chat_messages, to_responses_input
from speech_to_speech.realtime import image_items
from speech_to_speech.realtime.conversation import to_history
from speech_to_speech.realtime.image_items import ImageChecks, image_indices, image_urls, without_images
from speech_to_speech.realtime.protocol import ProtocolError
from speech_to_speech.testing.fakes import SeeingEcho
from speech_to_speech.testing.responses_server import Reply, ResponsesServer, Text
from tests.helpers import new_stage


def data_url(fmt: str = "PNG", size: tuple[int, int] = (8, 6), mime: str | None = None) -> str:
    """A real image of ``size`` pixels encoded as ``fmt``, as a base64 data URL (``mime`` overrides the type)."""
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format=fmt)
    mime = mime or f"image/{fmt.lower()}"
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def image_item(item_id: str, text: str | None = "What is this?", url: str | None = None) -> dict[str, Any]:
    """A protocol user message with an image (and a text part unless ``text`` is None)."""
    content: list[dict[str, Any]] = [{"type": "input_image", "image_url": url or data_url(), "detail": "low"}]
    if text is not None:
        content.insert(0, {"type": "input_text", "text": text})
    return {"id": item_id, "type": "message", "role": "user", "content": content}


# -- the check ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_accepted_formats_pass_and_are_measured(fmt: str) -> None:
    info = check_image(data_url(fmt, (10, 4)))
    assert (info.mime, info.width, info.height) == (f"image/{fmt.lower()}", 10, 4)
    assert info.size > 0
    assert open_image(data_url(fmt, (10, 4))).size == (10, 4)
    assert open_image(data_url(fmt)).mode == "RGB"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://example.com/cat.png", "must be a data URL"),
        ("data:image/png,notbase64", "base64 data URL"),
        ("data:text/plain;base64,aGVsbG8=", "'text/plain' are not supported"),
        ("data:image/bmp;base64,Qk0=", "'image/bmp' are not supported"),
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("data:image/png;base64,", "empty"),
        ("data:image/png;base64," + base64.b64encode(b"hello, not a picture").decode(), "not a readable image/png"),
        (data_url("JPEG", mime="image/png"), "declared image/png but its data is JPEG"),
    ],
)
def test_a_bad_image_is_refused_naming_the_problem(url: str, says: str) -> None:
    with pytest.raises(ImageError, match=says):
        check_image(url)


def test_a_damaged_image_is_refused() -> None:
    raw = base64.b64decode(data_url("PNG", (64, 64)).split(",", 1)[1])
    damaged = raw[:40] + bytes(len(raw) - 40)  # the header survives, the pixel data does not
    with pytest.raises(ImageError, match="image/png"):
        check_image("data:image/png;base64," + base64.b64encode(damaged).decode())


def test_a_truncated_jpeg_and_an_animation_are_refused() -> None:
    raw = base64.b64decode(data_url("JPEG", (64, 48)).split(",", 1)[1])
    with pytest.raises(ImageError, match="image/jpeg image is damaged"):
        check_image("data:image/jpeg;base64," + base64.b64encode(raw[: len(raw) * 2 // 3]).decode())
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(ImageError, match="animated"):
        check_image("data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode())


def test_size_and_pixel_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    url = data_url("PNG", (40, 30))
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 50)  # bytes: the PNG is larger
    with pytest.raises(ImageError, match="larger than"):
        check_image(url)
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10 * 1024 * 1024)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 40 * 30 - 1)
    with pytest.raises(ImageError, match="40x30 pixels"):
        check_image(url)


# -- protocol items and history ----------------------------------------------------------------------
def test_an_image_item_keeps_its_parts_in_history() -> None:
    url = data_url()
    assert to_history(image_item("i", url=url)) == {
        "id": "i",
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": url, "detail": "low"},
        ],
    }
    alone = to_history({**image_item("j", text=None), "content": [{"type": "input_image", "image_url": url}]})
    assert alone["content"] == [{"type": "input_image", "image_url": url, "detail": "auto"}]
    Chat().add_item(alone)  # a valid history item


def test_a_bad_image_item_is_a_protocol_error_naming_the_part() -> None:
    with pytest.raises(ProtocolError) as info:
        to_history(image_item("i", url="data:image/png;base64,aGVsbG8="))
    assert info.value.code == "invalid_image"
    assert info.value.param == "item.content.1.image_url"
    assert "not a readable image/png" in info.value.message
    with pytest.raises(ProtocolError) as info:
        to_history({"id": "a", "type": "message", "role": "assistant", "content": [{"type": "input_image"}]})
    assert info.value.code == "unsupported_content"


def test_images_can_be_left_out_of_an_item() -> None:
    item = image_item("i")
    assert image_indices(item) == [1]
    assert without_images(item)["content"] == [{"type": "input_text", "text": "What is this?"}]
    assert without_images(image_item("j", text=None)) is None
    assert image_indices({"id": "t", "type": "message", "role": "user", "content": [{"type": "input_text"}]}) == []


def test_images_checked_ahead_are_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checks a message's images in a worker thread (``ImageChecks.check_ahead``); the
    session's ``to_history`` then takes the verdicts instead of decoding on the event loop."""
    good, bad = data_url(), "data:image/png;base64,aGVsbG8="
    checks = ImageChecks()
    event = {"type": "conversation.item.create", "item": image_item("i", url=good)}
    event["item"]["content"].append({"type": "input_image", "image_url": bad})
    checks.check_ahead(json.dumps(event))
    calls: list[str] = []
    monkeypatch.setattr(image_items, "check_image", lambda url: calls.append(url))
    assert checks(good).mime == "image/png"
    with pytest.raises(ImageError, match="not a readable"):
        checks(bad)
    assert calls == []
    checks(good)  # a verdict is handed over once; then the image is checked where asked
    assert calls == [good]
    assert image_urls("not json") == image_urls('{"type": "session.update"}') == []


def test_history_refuses_a_malformed_image_part() -> None:
    with pytest.raises(ChatItemError, match="image_url"):
        Chat().add_item({"type": "message", "role": "user", "content": [{"type": "input_image"}]})
    with pytest.raises(ChatItemError, match="detail"):
        part = {"type": "input_image", "image_url": data_url(), "detail": "huge"}
        Chat().add_item({"type": "message", "role": "user", "content": [part]})


def test_older_images_become_a_placeholder() -> None:
    chat = Chat(size=8)
    urls = [data_url(size=(n + 1, 1)) for n in range(3)]
    for n, url in enumerate(urls):
        chat.add_item(to_history(image_item(f"u{n}", text=f"picture {n}", url=url)))
        chat.add_item({"type": "message", "role": "assistant", "content": f"reply {n}"})
    chat.compact_image_history(2)
    contents = [item["content"] for item in chat.items() if item["role"] == "user"]
    assert contents[0] == [
        {"type": "input_text", "text": "picture 0"},
        {"type": "input_text", "text": EARLIER_IMAGE_PLACEHOLDER},
    ]
    assert [part.get("image_url") for part in contents[1] + contents[2]] == [None, urls[1], None, urls[2]]
    chat.compact_image_history(0)
    assert not any(has_part(item, "input_image") for item in chat.items())
    with pytest.raises(ValueError, match="max_image_turns"):
        chat.compact_image_history(-1)


def test_after_each_response_only_the_newest_images_stay() -> None:
    """The LLM stage bounds images after every response (``--image_history_turns``); the model saw them first."""
    llm = new_stage(SeeingEcho, config=LLMConfig(image_history_turns=1), name="llm:seeing")
    llm.setup()
    SeeingEcho.seen.clear()
    for n in range(2):
        llm.chat.add_item(to_history(image_item(f"u{n}", text=f"picture {n}")))

    def turn() -> str:
        out = list(llm.process(Transcript(llm.gate.new_turn_stamp(), "Compare them.", wants_audio=False)))
        return next(m.text for m in out if isinstance(m, EndOfResponse))

    assert turn() == "I see 2 images."
    users = [item for item in llm.chat.items() if item["role"] == "user"]
    assert users[0]["content"][1] == {"type": "input_text", "text": EARLIER_IMAGE_PLACEHOLDER}
    assert users[1]["content"][1]["type"] == "input_image"
    assert turn() == "I see 1 image."
    assert {"role": "user", "content": f"picture 0\n{EARLIER_IMAGE_PLACEHOLDER}"} in SeeingEcho.seen[-1]


# -- serialising ---------------------------------------------------------------------------------------
def test_chat_messages_carry_image_url_parts_only_when_asked() -> None:
    url = data_url()
    items = [to_history(image_item("i", url=url))]
    assert to_chat_messages("", items, images=True) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
            ],
        }
    ]
    assert to_chat_messages("", items) == [{"role": "user", "content": f"What is this?\n{IMAGE_PLACEHOLDER}"}]


def test_responses_input_carries_input_image_parts() -> None:
    url = data_url()
    assert to_responses_input([to_history(image_item("i", url=url))]) == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": url, "detail": "low"},
            ],
        }
    ]


# -- the providers' request bodies ---------------------------------------------------------------------
def ask_about_an_image(cls: type, provider: ResponsesServer, url: str) -> dict[str, Any]:
    """One turn about an image (the image item, then a spoken question) through backend ``cls``; the body sent."""
    provider.script(Reply([Text(["A red square."])]))
    provider.requests.clear()
    config = OpenAICompatibleConfig(model_name="test-model", responses_api_base_url=provider.base_url)
    handler = new_stage(cls, config=config, name=f"llm:{cls.__name__}")
    handler.setup()
    assert handler.accepts_images
    handler.chat.add_item(to_history(image_item("i", text="Look.", url=url)))
    out = list(handler.process(Transcript(handler.gate.new_turn_stamp(), "What colour is it?", wants_audio=False)))
    assert [m.text for m in out if isinstance(m, EndOfResponse)] == ["A red square."]
    (request,) = provider.requests
    return request.body


def test_chat_completions_sends_an_image_url_part(provider: ResponsesServer) -> None:
    url = data_url()
    body = ask_about_an_image(ChatCompletionsHandler, provider, url)
    assert body["messages"][1:] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look."},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
            ],
        },
        {"role": "user", "content": "What colour is it?"},
    ]


def test_responses_api_sends_an_input_image_part(provider: ResponsesServer) -> None:
    url = data_url()
    body = ask_about_an_image(ResponsesAPIHandler, provider, url)
    assert body["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look."},
                {"type": "input_image", "image_url": url, "detail": "low"},
            ],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What colour is it?"}]},
    ]
