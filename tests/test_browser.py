"""The browser page at ``/``, in a real headless Chromium, talking to the server over WebRTC.

Chromium's fake microphone plays a WAV file: LibriVox clip A, five seconds of silence, clip B (which
lands while the assistant is still answering A), then silence. The page connects (microphone with
echo cancellation, noise suppression and gain control; SDP offer POSTed to ``/v1/realtime/calls``)
and must show: both transcripts, the first reply cut off where B interrupted it, the second reply as
it is spoken, a voice-to-voice latency per turn and the speaking indicator's states; the server must
have received the audio over WebRTC. Screenshots (mid-conversation and at the end) are kept in the
folder printed at the end of the test (``$S2S_TEST_ARTIFACTS``, else pytest's temporary folder).
A second browser checks the messages for a missing API key, a server error and a lost connection,
and a third one the message for a denied microphone.

The browser is Debian's ``chromium``, driven over the DevTools protocol (:mod:`speech_to_speech.testing.cdp`). Without
it the tests are skipped, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speech_to_speech.realtime.media import MEDIA_RATE
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.cdp import Chromium, find_chromium
from speech_to_speech.testing.realtime import InProcessServer
from speech_to_speech.testing.responses_server import STORY_REPLY, Reply, ResponsesServer, Text
from speech_to_speech.testing.speech_data import normalize, word_error_rate
from tests.helpers import responses_api_flags, two_short_clips

pytestmark = pytest.mark.models

#: the longest wait for one step of the conversation, s (a slow, shared machine)
WAIT_S = 240.0
API_KEY = "s2s-page-key"
#: silence before clip A (the page is connecting meanwhile), between A and B, and after B, s
LEAD_S, GAP_S, TAIL_S = 3.0, 5.0, 60.0
SHORT_REPLY = Reply([Text(["Hello there, ", "this is the second reply. ", "It has two sentences."])])
CLIP_A, CLIP_B = two_short_clips()
if CLIP_B == CLIP_A:  # only the bundled clip: say it twice
    CLIP_B = CLIP_A


def chromium_or_skip() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return binary


def run(scenario: Coroutine[Any, Any, Any], timeout_s: float = 900.0) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``$S2S_TEST_ARTIFACTS`` or a pytest temporary folder (kept for 3 runs)."""
    folder = os.environ.get("S2S_TEST_ARTIFACTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("browser")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def guarded(
    server: InProcessServer, provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]
) -> InProcessServer:
    """A second server that wants an API key (the models are already loaded by ``server``)."""
    return realtime_servers(*responses_api_flags(provider.base_url, "m"), "--api_key", API_KEY, warm_up=False)


def microphone_file(folder: Path, *parts: np.ndarray) -> Path:
    """A 48 kHz mono 16-bit WAV for Chromium's fake microphone."""
    path = folder / "microphone.wav"
    sf.write(path, np.concatenate(parts), MEDIA_RATE, subtype="PCM_16")
    return path


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * MEDIA_RATE), dtype=np.float32)


def fake_microphone(wav: Path | None, deny: bool = False) -> list[str]:
    flags = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream" + ("=deny" if deny else "")]
    if wav is not None:
        flags.append(f"--use-file-for-fake-audio-capture={wav}%noloop")
    return flags


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """Print ``line`` in pytest's output, also without ``-s``."""
    with capsys.disabled():
        print(f"\n{line}", flush=True)


PAGE_STATE = """JSON.stringify({
  who: document.getElementById("who").className,
  message: document.getElementById("message").textContent,
  errors: s2s.errors,
  whoLog: s2s.whoLog,
  events: s2s.events,
  users: [...document.querySelectorAll(".turn.user .text")].map((e) => [e.className, e.textContent]),
  userLabels: [...document.querySelectorAll(".turn.user .role")].map((e) => e.textContent),
  replies: [...document.querySelectorAll(".turn.assistant")].map((e) => ({
    text: e.querySelector(".text").textContent,
    interrupted: e.classList.contains("interrupted"),
    latency: (e.querySelector(".latency") || {}).textContent || "",
  })),
  responses: [...s2s.responses.values()].map((r) => ({
    status: r.status, audible: r.audible, firstAudioAt: r.firstAudioAt, firstShownAt: r.firstShownAt || 0,
    cut: r.cut, finished: r.finished,
  })),
  turns: s2s.turns.map((t) => ({ stoppedAt: t.stoppedAt, v2v: t.v2vMs })),
})"""


async def page_state(browser: Chromium) -> dict[str, Any]:
    import json

    return dict(json.loads(await browser.evaluate(PAGE_STATE)))


def test_a_spoken_conversation_in_the_browser(
    server: InProcessServer, provider: ResponsesServer, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = chromium_or_skip()
    provider.script(STORY_REPLY, SHORT_REPLY)
    (clip_a, reference_a), (clip_b, reference_b) = CLIP_A, CLIP_B
    a, b = load_audio(clip_a, MEDIA_RATE), load_audio(clip_b, MEDIA_RATE)
    wav = microphone_file(artifacts, silence(LEAD_S), a, silence(GAP_S), b, silence(TAIL_S))
    shots: dict[str, Path] = {}

    async def scenario() -> dict[str, Any]:
        browser = await Chromium(binary, artifacts / "profile-conversation", fake_microphone(wav)).start()
        try:
            await browser.open(f"http://127.0.0.1:{server.port}/")
            await browser.evaluate("document.getElementById('connect').click()")
            await browser.wait_for("window.s2s.connected", WAIT_S, "connected")
            (call,) = list(server.server.calls.values())
            session = next(iter(server.server.sessions))
            webrtc = session.media is call.media
            # the second reply is being spoken, after the first was cut off by clip B
            await browser.wait_for(
                "s2s.responses.size >= 2 && [...s2s.responses.values()][1].audible"
                " && [...s2s.responses.values()][1].shown.length > 0",
                WAIT_S,
                "the second reply spoken",
            )
            shots["mid-conversation"] = await browser.screenshot(artifacts / "mid-conversation.png")
            mid = await page_state(browser)
            await browser.wait_for("[...s2s.responses.values()][1].finished", WAIT_S, "the second reply finished")
            await asyncio.sleep(0.3)
            shots["end"] = await browser.screenshot(artifacts / "end.png")
            end = await page_state(browser)
            received_s = call.received_s
            await browser.evaluate("document.getElementById('disconnect').click()")
            await asyncio.to_thread(server.wait_until_idle)
            after = await page_state(browser)
            return {
                "mid": mid,
                "end": end,
                "after": after,
                "received_s": received_s,
                "webrtc": webrtc,
                "console": browser.console,
            }
        finally:
            await browser.close()

    r = run(scenario())
    for name, path in shots.items():
        report(capsys, f"browser screenshot ({name}): {path}")
    end = r["end"]

    # the server got the microphone over WebRTC and answered on the same peer connection
    assert r["webrtc"], "the session's audio did not go out on the call's track"
    assert r["received_s"] >= LEAD_S + (len(a) + len(b)) / MEDIA_RATE, r["received_s"]
    assert not end["errors"] and not [c for c in r["console"] if c.startswith("exception")], (end, r["console"])

    # the page shows both transcripts (final, not the live partials any more)
    (class_a, text_a), (class_b, text_b) = end["users"][:2]
    assert "final" in class_a and "final" in class_b, end["users"]
    assert word_error_rate(reference_a, text_a) <= 0.6, (reference_a, text_a)
    assert word_error_rate(reference_b, text_b) <= 0.6, (reference_b, text_b)
    assert "conversation.item.input_audio_transcription.delta" in end["events"]
    # with the language the server heard (the embedded tiny.en hears English) next to "you"
    assert end["userLabels"][:2] == ["you · en", "you · en"], end["userLabels"]

    # reply 1 was cut where B began: marked, a strict prefix of the scripted story
    first, second = end["replies"][:2]
    first_state, second_state = end["responses"][:2]
    assert first["interrupted"] and first_state["status"] == "cancelled", (first, first_state)
    shown = normalize(first["text"])
    full = normalize(STORY_REPLY.output[0].text)
    assert shown and full[: len(shown)] == shown and len(shown) < len(full), first["text"]
    # reply 2 was shown in full, as it was spoken: no word before its audio was heard
    assert normalize(second["text"]) == normalize(SHORT_REPLY.output[0].text), second
    assert second_state["status"] == "completed" and not second["interrupted"]
    for state in (first_state, second_state):
        assert state["audible"] and state["firstShownAt"] >= state["firstAudioAt"] - 50, state
    # the mid-conversation view: the second reply partly shown while the assistant speaks
    assert "assistant" in r["mid"]["who"], r["mid"]["who"]
    assert len(normalize(r["mid"]["replies"][1]["text"])) <= len(normalize(second["text"]))

    # a voice-to-voice latency per answered turn
    for reply in (first, second):
        match = re.fullmatch(r"voice-to-voice (\d+) ms", reply["latency"])
        assert match and 100 <= int(match.group(1)) <= 15000, reply
    # the speaking indicator went through every state, in conversation order
    log = end["whoLog"]
    steps = ["listening", "user", "thinking", "assistant", "user", "thinking", "assistant", "listening"]
    position = 0
    for state_name in log:
        if position < len(steps) and state_name == steps[position]:
            position += 1
    assert position == len(steps), log

    # disconnecting ends the session on the server
    assert r["after"]["message"] == "Disconnected." and "idle" in r["after"]["who"], r["after"]
    latencies = [reply["latency"] for reply in (first, second)]
    report(capsys, f"browser transcripts: {text_a!r}, {text_b!r}; latencies: {latencies}")


def test_the_page_explains_what_went_wrong(
    guarded: InProcessServer, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing API key (then the key entered: connected), a server error, a lost connection, a denied microphone."""
    binary = chromium_or_skip()
    quiet = microphone_file(artifacts, silence(30.0))
    url = f"http://127.0.0.1:{guarded.port}/"
    message = "document.getElementById('message').textContent"

    async def scenario() -> dict[str, str]:
        out: dict[str, str] = {}
        browser = await Chromium(binary, artifacts / "profile-errors", fake_microphone(quiet)).start()
        try:
            await browser.open(url)
            await browser.evaluate("document.getElementById('connect').click()")
            out["no_key"] = await browser.wait_for(f"s2s.errors.length && {message}", WAIT_S, "an error shown")
            await browser.evaluate(f"document.getElementById('api-key').value = {API_KEY!r}")
            await browser.evaluate("document.getElementById('connect').click()")
            await browser.wait_for("s2s.sessionId", WAIT_S, "a session")
            out["connected"] = await browser.evaluate(message)
            out["url_has_key"] = str(API_KEY in await browser.evaluate("location.href"))
            await browser.evaluate("s2s.channel.send(JSON.stringify({type: 'no.such.event'}))")
            out["server_error"] = await browser.wait_for(
                f"{message}.startsWith('Server error') && {message}", WAIT_S, "the server error shown"
            )
            (call_id,) = list(guarded.server.calls)
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(guarded.server.hangup(call_id), guarded._loop)  # type: ignore[arg-type]
            )
            out["lost"] = await browser.wait_for(
                f"{message}.startsWith('Connection lost') && {message}", WAIT_S, "the lost connection shown"
            )
            await browser.screenshot(artifacts / "connection-lost.png")
        finally:
            await browser.close()
        denied = await Chromium(binary, artifacts / "profile-denied", fake_microphone(None, deny=True)).start()
        try:
            await denied.open(url)
            await denied.evaluate(f"document.getElementById('api-key').value = {API_KEY!r}")  # asked before the mic
            await denied.evaluate("document.getElementById('connect').click()")
            out["denied"] = await denied.wait_for(f"s2s.errors.length && {message}", WAIT_S, "an error shown")
        finally:
            await denied.close()
        return out

    r = run(scenario())
    report(capsys, f"browser screenshot (connection lost): {artifacts / 'connection-lost.png'}")
    assert "needs an API key" in r["no_key"], r
    assert r["connected"].startswith("Connected"), r
    assert r["url_has_key"] == "False"
    assert "no.such.event" in r["server_error"] or "unknown" in r["server_error"].lower(), r
    assert "server closed the connection" in r["lost"], r
    assert "Microphone access was denied" in r["denied"], r
    guarded.wait_until_idle()
