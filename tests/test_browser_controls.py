"""The page's controls, states and phone layout, in a real headless Chromium (see :mod:`tests.test_browser`).

One browser holds a conversation: the microphone opens only once the call is up (nothing is
captured while the page says "connecting…"); the first spoken turn's reply carries the server's
latency breakdown; Disconnect in the middle of the user's next sentence leaves no live partial
transcript, and Connect again starts below a divider with the indicator on "listening"; the mute
button; a typed message gets a reply; the event log lists both ways of the data channel; then the
same page in a 390×844 phone viewport: no horizontal overflow, 44 px buttons in a header that stays
in view when the page is scrolled to the end. Another pair of browsers, on a server with an API key
and one session, gets distinct messages for a missing key, a wrong key (the microphone unopened
both times), Enter in the key box, and a full server. Screenshots go to the artifacts folder.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from speech_to_speech.realtime.media import MEDIA_RATE
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.cdp import Chromium
from speech_to_speech.testing.realtime import InProcessServer
from speech_to_speech.testing.responses_server import Reply, ResponsesServer, Text
from tests.helpers import responses_api_flags
from tests.test_browser import (
    API_KEY,
    CLIP_A,
    CLIP_B,
    SHORT_REPLY,
    WAIT_S,
    chromium_or_skip,
    fake_microphone,
    microphone_file,
    report,
    run,
    silence,
)

pytestmark = pytest.mark.models

TYPED_REPLY = Reply([Text(["It is sunny today. ", "Enjoy it."])])
#: counts the page's getUserMedia calls and what the page showed at each (installed before the page loads)
MIC_PROBE = """
window.micCalls = [];
const devices = navigator.mediaDevices;
const open = devices.getUserMedia.bind(devices);
devices.getUserMedia = (constraints) => {
  window.micCalls.push({
    connected: Boolean(window.s2s && s2s.connected),
    trackOnCall: Boolean(window.s2s && s2s.sender && s2s.sender.track),
    who: document.getElementById("who-text").textContent,
  });
  return open(constraints);
};
"""
#: what the tests read off the page
VIEW = """JSON.stringify({
  who: document.getElementById("who-text").textContent,
  message: document.getElementById("message").textContent,
  errors: s2s.errors,
  micCalls: window.micCalls,
  timeline: s2s.timeline,
  live: document.querySelectorAll(".turn .text.live").length,
  stale: [...document.querySelectorAll(".turn .text.stale")].map((e) => e.textContent),
  dividers: document.querySelectorAll(".divider").length,
  typed: [...document.querySelectorAll(".turn.user.typed .text")].map((e) => e.textContent),
  replies: [...document.querySelectorAll(".turn.assistant")].map((e) => ({
    text: e.querySelector(".text").textContent,
    breakdown: (e.querySelector(".breakdown") || {}).textContent || "",
  })),
  log: [...document.querySelectorAll("#event-list li")].map((li) => li.className + " " + li.dataset.type),
  logShown: !document.getElementById("event-log").hidden,
  mics: document.getElementById("mic-select").options.length,
  muted: document.getElementById("mute").getAttribute("aria-pressed"),
})"""
#: the phone layout's measurements
LAYOUT = """JSON.stringify((() => {
  const header = document.querySelector("header").getBoundingClientRect();
  const title = document.createRange();
  title.selectNodeContents(document.querySelector("h1"));
  return {
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    buttons: [...document.querySelectorAll("header button")].map((b) => b.getBoundingClientRect().height),
    titleLines: title.getClientRects().length,
    scrollable: document.documentElement.scrollHeight - window.innerHeight,
    scrollY: window.scrollY,
    headerTop: header.top,
    headerBottom: header.bottom,
    topIsHeader: Boolean(document.elementFromPoint(20, 10).closest("header")),
  };
})())"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (``$S2S_TEST_ARTIFACTS`` is used by :mod:`tests.test_browser`)."""
    return tmp_path_factory.mktemp("browser-controls")


@pytest.fixture(scope="module")
def small(
    server: InProcessServer, provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]
) -> InProcessServer:
    """A server with an API key and room for one session (the models are already loaded by ``server``)."""
    flags = (*responses_api_flags(provider.base_url, "m"), "--api_key", API_KEY, "--max_sessions", "1")
    return realtime_servers(*flags, warm_up=False)


async def open_page(binary: str, profile: Path, wav: Path, url: str) -> Chromium:
    """A browser with a fake microphone playing ``wav``, the microphone probe installed, on ``url``."""
    browser = await Chromium(binary, profile, fake_microphone(wav)).start()
    await browser.call("Page.addScriptToEvaluateOnNewDocument", source=MIC_PROBE)
    await browser.open(url)
    return browser


async def click(browser: Chromium, element_id: str) -> None:
    await browser.evaluate(f"document.getElementById({element_id!r}).click()")


async def type_in(browser: Chromium, element_id: str, text: str, enter: bool = False) -> None:
    """Put ``text`` in an input; with ``enter``, press Enter in it (a keydown, as a keyboard sends)."""
    await browser.evaluate(f"(e => {{ e.value = {text!r}; e.focus(); }})(document.getElementById({element_id!r}))")
    if enter:
        await browser.call(
            "Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13
        )


async def view(browser: Chromium) -> dict[str, Any]:
    return dict(json.loads(await browser.evaluate(VIEW)))


async def phone_layout(browser: Chromium, shot: Path) -> dict[str, Any]:
    """The page in a 390×844 phone viewport, scrolled to its end; a screenshot of what shows."""
    await browser.call("Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2, mobile=True)
    await browser.evaluate("new Promise((done) => requestAnimationFrame(() => done(true)))")
    layout = dict(json.loads(await browser.evaluate(LAYOUT)))
    await browser.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    await browser.evaluate("new Promise((done) => setTimeout(() => done(true), 200))")
    scrolled = dict(json.loads(await browser.evaluate(LAYOUT)))
    await browser.screenshot(shot, full_page=False)
    return {"top": layout, "end": scrolled}


def test_controls_a_reconnect_and_the_phone_layout(
    server: InProcessServer, provider: ResponsesServer, shots: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = chromium_or_skip()
    provider.script(SHORT_REPLY, TYPED_REPLY)
    a, b = (load_audio(clip, MEDIA_RATE) for clip, _ in (CLIP_A, CLIP_B))
    wav = microphone_file(shots, silence(1.5), a, silence(12.0), b, silence(60.0))
    url = f"http://127.0.0.1:{server.port}/"
    responses = "[...s2s.responses.values()]"

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        browser = await open_page(binary, shots / "profile-controls", wav, url)
        try:
            await click(browser, "log-toggle")
            await click(browser, "connect")
            out["connecting"] = await view(browser)
            await browser.wait_for("s2s.live", WAIT_S, "the microphone live")
            await browser.wait_for(f"{responses}.some((r) => r.audible && r.shown)", WAIT_S, "a reply spoken")
            await browser.screenshot(shots / "desktop-mid-reply.png", full_page=False)
            await browser.wait_for(f"{responses}.some((r) => r.breakdown)", WAIT_S, "the latency breakdown")
            out["first"] = await view(browser)
            # the user's next sentence: hang up while it is half recognised
            await browser.wait_for("s2s.userSpeaking && s2s.turns.length >= 2", WAIT_S, "the next sentence")
            partial = "s2s.turns.filter((t) => t.transcript === null && t.partial).length"
            with contextlib.suppress(TimeoutError):  # its first words, if they come while it is spoken
                await browser.wait_for(partial, 4.0, "a partial transcript")
            out["partials"] = await browser.evaluate(partial)
            await click(browser, "disconnect")
            out["disconnected"] = await view(browser)
            await click(browser, "connect")
            await browser.wait_for("s2s.live", WAIT_S, "live again")
            out["reconnected"] = await view(browser)
            await click(browser, "mute")
            out["muted"] = await view(browser)
            await type_in(browser, "text-input", "What is the weather like?")
            await browser.evaluate("document.getElementById('composer').requestSubmit()")
            await browser.wait_for(f"{responses}.some((r) => r.breakdown)", WAIT_S, "the typed message's reply")
            out["typed"] = await view(browser)
            await browser.screenshot(shots / "desktop-event-log.png", full_page=False)
            out["phone"] = await phone_layout(browser, shots / "phone-mid-conversation.png")
            await click(browser, "new-conversation")  # hang up, clear the page, call again
            logged = "Boolean(document.querySelector('#event-list [data-type=\"session.created\"]'))"
            fresh = f"s2s.live && s2s.conversations === 3 && {logged}"
            await browser.wait_for(fresh, WAIT_S, "a new conversation")
            out["new"] = await view(browser)
            out["console"] = browser.console
            await click(browser, "disconnect")
        finally:
            await browser.close()
        return out

    r = run(scenario())
    report(capsys, f"browser screenshots: {shots}")
    # nothing is captured before the call is up: one getUserMedia, after the data channel opened
    assert r["connecting"]["who"] == "connecting…" and not r["connecting"]["micCalls"], r["connecting"]
    first = r["first"]
    (call,) = first["micCalls"]
    assert call["connected"] and not call["trackOnCall"] and call["who"] == "connecting…", call
    assert first["timeline"]["micOpenAt"] > first["timeline"]["channelOpenAt"] > first["timeline"]["connectAt"]
    assert not first["errors"] and not [c for c in r["console"] if c.startswith("exception")], r
    assert first["mics"] >= 2, first  # the picker lists the microphones once one is open
    # the spoken turn's reply: the server's breakdown (endpoint, STT, TTFT, TTFA)
    breakdown = first["replies"][0]["breakdown"]
    for part in ("endpoint", "STT", "TTFT", "TTFA"):
        assert f"{part} " in breakdown and " ms" in breakdown, breakdown
    # hung up mid-sentence: no italic partial stays, the unfinished words are marked
    gone = r["disconnected"]
    assert gone["live"] == 0 and gone["who"] == "not connected", gone
    assert len(gone["stale"]) == r["partials"] and all(text.endswith("(cut off)") for text in gone["stale"]), r
    # a second call starts below a divider, listening (not "thinking…" from the call before)
    again = r["reconnected"]
    assert again["dividers"] == 1 and again["live"] == 0, again
    assert again["who"] in ("listening", "you are speaking"), again["who"]
    assert r["muted"]["who"] == "muted" and r["muted"]["muted"] == "true", r["muted"]
    # a typed message: shown as the user's, answered, with TTFT/TTFA but no STT
    typed = r["typed"]
    assert typed["typed"] == ["What is the weather like?"], typed
    reply = typed["replies"][-1]
    assert reply["text"] == TYPED_REPLY.output[0].text, reply
    assert "TTFT" in reply["breakdown"] and "STT" not in reply["breakdown"], reply
    # the event log: both ways, with the typed message's events
    assert typed["logShown"], typed
    for entry in ("out conversation.item.create", "out response.create", "in response.done", "in session.created"):
        assert entry in typed["log"], (entry, typed["log"][-20:])
    # the phone: no sideways scrolling, big buttons, one-line title, the header in view at the end
    top, end = r["phone"]["top"], r["phone"]["end"]
    assert top["overflow"] <= 0 and end["overflow"] <= 0, r["phone"]
    assert min(top["buttons"]) >= 44, top["buttons"]
    assert top["titleLines"] == 1, top
    assert top["scrollable"] > 0 and end["scrollY"] > 0, r["phone"]
    assert abs(end["headerTop"]) < 1 and end["headerBottom"] > 44 and end["topIsHeader"], end
    # New conversation: an empty page (no divider, no turns), an event log that starts again, live
    fresh = r["new"]
    assert fresh["dividers"] == 0 and not fresh["replies"] and not fresh["typed"], fresh
    assert fresh["log"][0] == "in session.created" and fresh["who"] in ("listening", "you are speaking"), fresh
    report(capsys, f"latency breakdowns: {breakdown!r}, typed: {reply['breakdown']!r}")


def test_key_and_full_server_messages(small: InProcessServer, shots: Path) -> None:
    """Missing key, wrong key (Enter submits it; the microphone stays closed), then a full server."""
    binary = chromium_or_skip()
    quiet = microphone_file(shots, silence(30.0))
    url = f"http://127.0.0.1:{small.port}/"

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        first = await open_page(binary, shots / "profile-key", quiet, url)
        try:
            await click(first, "connect")
            await first.wait_for("s2s.errors.length === 1", WAIT_S, "the missing key")
            out["missing"] = await view(first)
            await type_in(first, "api-key", "not-the-key", enter=True)
            await first.wait_for("s2s.errors.length === 2", WAIT_S, "the wrong key")
            out["wrong"] = await view(first)
            await first.screenshot(shots / "wrong-key.png")
            await type_in(first, "api-key", API_KEY, enter=True)
            await first.wait_for("s2s.live", WAIT_S, "connected with the key")
            out["right"] = await view(first)
            second = await open_page(binary, shots / "profile-full", quiet, url)
            try:
                await type_in(second, "api-key", API_KEY)
                await click(second, "connect")
                await second.wait_for("s2s.errors.length", WAIT_S, "the full server")
                out["full"] = await view(second)
            finally:
                await second.close()
            await click(first, "disconnect")
        finally:
            await first.close()
        return out

    r = run(scenario())
    missing, wrong = r["missing"]["message"], r["wrong"]["message"]
    assert "needs an API key" in missing and "refused" in wrong and missing != wrong, (missing, wrong)
    assert not r["missing"]["micCalls"] and not r["wrong"]["micCalls"], r  # asked for the key first
    assert r["right"]["message"].startswith("Connected") and len(r["right"]["micCalls"]) == 1, r["right"]
    assert "server is full" in r["full"]["message"] and not r["full"]["micCalls"], r["full"]
    small.wait_until_idle()
