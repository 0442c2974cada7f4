"""The browser page's "Attach image", in a real headless Chromium (Debian's ``chromium`` over the
DevTools protocol, :mod:`speech_to_speech.testing.cdp`), against realtime servers with model-free backends.

A large photo (3000 x 2000 pixels of noise, which JPEG compresses badly) is chosen in the page's
file input (``DOM.setFileInputFiles``, as a person picking a file). The page must shrink it to a
JPEG that fits one data channel message and send it as ``conversation.item.create`` with an
``input_image`` part: the server's conversation then holds it, and a model that sees
(``seeing-echo``) answers a question about it. A server whose model cannot see (``turn-script``)
refuses it with an error the page shows, marking the image not seen.

Without chromium the tests are skipped, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from speech_to_speech.llm.images import check_image
from speech_to_speech.testing.cdp import Chromium
from speech_to_speech.testing.realtime import InProcessServer
from tests.test_browser import chromium_or_skip, fake_microphone, microphone_file, silence
from tests.test_image_session import FAKES

WAIT_S = 120.0
#: the page's IMAGE_MAX_CHARS (speech_to_speech/realtime/static/images.js)
PAGE_MAX_CHARS = 200_000
MESSAGE = "document.getElementById('message').textContent"


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photo") / "photo.png"
    noise = np.random.default_rng(0).integers(0, 256, (2000, 3000, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path)
    return path


@pytest.fixture(scope="module")
def seeing(realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    return realtime_servers("--llm_backend", "seeing-echo", *FAKES)


@pytest.fixture(scope="module")
def blind(seeing: InProcessServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    return realtime_servers("--llm_backend", "turn-script", *FAKES, warm_up=False)


async def connected_page(binary: str, folder: Path, server: InProcessServer) -> Chromium:
    quiet = microphone_file(folder, silence(30.0))
    browser = await Chromium(binary, folder / "profile", fake_microphone(quiet)).start()
    await browser.open(f"http://127.0.0.1:{server.port}/")
    await browser.evaluate("document.getElementById('connect').click()")
    await browser.wait_for("s2s.sessionId && !document.getElementById('attach').disabled", WAIT_S, "connected")
    return browser


async def choose_file(browser: Chromium, path: Path) -> None:
    """Pick ``path`` in the page's image input, as a person would (the input's change event fires)."""
    root = await browser.call("DOM.getDocument")
    found = await browser.call("DOM.querySelector", nodeId=root["root"]["nodeId"], selector="#image-file")
    await browser.call("DOM.setFileInputFiles", files=[str(path)], nodeId=found["nodeId"])


def image_items(server: InProcessServer) -> list[dict[str, Any]]:
    """The image parts of every item in the server's sessions' conversations."""
    parts = []
    for session in list(server.server.sessions):
        for item in session.conversation.items():
            parts += [p for p in item.get("content") or [] if p.get("type") == "input_image"]
    return parts


def test_the_page_sends_an_attached_photo_and_the_model_sees_it(
    seeing: InProcessServer, photo: Path, tmp_path: Path
) -> None:
    binary = chromium_or_skip()

    async def scenario() -> dict[str, Any]:
        browser = await connected_page(binary, tmp_path, seeing)
        try:
            assert await browser.evaluate("document.getElementById('image-file').accept") == "image/*"
            assert await browser.evaluate("document.getElementById('image-file').getAttribute('capture')")
            await choose_file(browser, photo)
            sent = await browser.wait_for("s2s.images.length && JSON.stringify(s2s.images[0])", WAIT_S, "sent")
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not image_items(seeing):
                assert asyncio.get_running_loop().time() < deadline, "the server never got the image"
                await asyncio.sleep(0.1)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is it?"}]}
            # a typed question, answered in text (the fake voice's audio carries no words to show)
            text_only = {"type": "realtime", "output_modalities": ["text"]}
            await browser.evaluate(
                f"s2s.channel.send(JSON.stringify({{type: 'session.update', session: {text_only!r}}}));"
                f"s2s.channel.send(JSON.stringify({{type: 'conversation.item.create', item: {item!r}}}));"
                "s2s.channel.send(JSON.stringify({type: 'response.create'}))"
            )
            reply = await browser.wait_for(
                "[...document.querySelectorAll('.turn.assistant .text')].map((e) => e.textContent).join('|')",
                WAIT_S,
                "a reply",
            )
            shot = await browser.screenshot(tmp_path / "attached-image.png", full_page=False)
            print(f"\nbrowser screenshot (image and reply): {shot}")
            return {"sent": sent, "reply": reply, "errors": await browser.evaluate("s2s.errors")}
        finally:
            await browser.close()

    r = asyncio.run(asyncio.wait_for(scenario(), 300))
    sent = json.loads(r["sent"])
    assert max(sent["width"], sent["height"]) <= 1024 and sent["width"] / sent["height"] == pytest.approx(1.5, 0.01)
    assert sent["chars"] <= PAGE_MAX_CHARS and sent["refused"] is None
    (part,) = image_items(seeing)
    assert part["detail"] == "auto" and part["image_url"].startswith("data:image/jpeg;base64,")
    info = check_image(part["image_url"])
    assert (info.width, info.height) == (sent["width"], sent["height"])
    assert r["reply"] == "I see 1 image." and not r["errors"], r


def test_a_model_that_cannot_see_refuses_the_photo_on_the_page(
    blind: InProcessServer, photo: Path, tmp_path: Path
) -> None:
    binary = chromium_or_skip()

    async def scenario() -> dict[str, Any]:
        browser = await connected_page(binary, tmp_path, blind)
        try:
            await choose_file(browser, photo)
            shown = await browser.wait_for(f"s2s.errors.length && {MESSAGE}", WAIT_S, "the refusal shown")
            refused = await browser.wait_for("s2s.images.length && s2s.images[0].refused", WAIT_S, "marked")
            marked = await browser.evaluate("document.querySelector('.turn.image').className")
            return {"shown": shown, "refused": refused, "marked": marked}
        finally:
            await browser.close()

    r = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert "does not accept images" in r["shown"] and "unsupported_content" in r["shown"], r
    assert "does not accept images" in r["refused"] and "refused" in r["marked"], r
    assert not image_items(blind)


def test_image_limits_in_the_page_match_the_server() -> None:
    script = (Path(__file__).resolve().parent.parent / "speech_to_speech/realtime/static/images.js").read_text()
    assert f"const IMAGE_MAX_CHARS = {PAGE_MAX_CHARS};" in script
    # the item, echoed back in conversation.item.added, must fit one 256 KiB data channel message
    assert PAGE_MAX_CHARS + 2048 < 256 * 1024
