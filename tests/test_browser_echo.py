"""Interrupting the assistant over its own voice, with the browser page's audio really playing.

The room of ``scripts/benchmark_echo.py``: a private PulseAudio where headless Chromium (not
muted) plays the assistant on the default sink, and its microphone hears a LibriVox sentence
played into it and that sink's output 40 ms late at -9 dB (speakers on). The realtime server runs
here with the embedded VAD, STT and TTS; the LLM is the scripted story of
``speech_to_speech/testing/responses_server.py``.

- With the browser's echo canceller (as the page asks for it), a sentence spoken 2 s into the
  story stops it, and a story left alone plays to its end without the assistant hearing itself.
- Without it (a client that has none), the server's echo gate keeps the story from interrupting
  itself and from being answered; the same room with the gate off is the benchmark's
  comparison, where the assistant answers its own echo.

Skipped without PulseAudio or Chromium, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from speech_to_speech.testing.speech_data import librivox_clips
from tests.helpers import REPO_ROOT, load_module

pytestmark = pytest.mark.models

echo = load_module(REPO_ROOT / "scripts" / "benchmark_echo.py", "benchmark_echo")
#: the echo's volume: 70 % on PulseAudio's cubic scale, -9 dB
ECHO_GAIN = 0.7


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = echo.missing_tools() + ([] if echo.find_chromium() else ["chromium"])
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs these: {', '.join(missing)}")
        pytest.skip(f"no room here ({', '.join(missing)}; .ci/run installs them)")
    return tmp_path_factory.mktemp("echo-room")


def run_room(workdir: Path, browser_aec: bool, interrupt: bool) -> list[echo.Trial]:
    """In a fresh room: an interruption (if ``interrupt``), then a story with its echo alone."""
    clip, _ = echo.trimmed(sorted(librivox_clips())[0], workdir)

    async def scenario() -> list[echo.Trial]:
        async with echo.EchoRoom.open(workdir, ECHO_GAIN, browser_aec, echo_gate=True) as room:
            done = [await room.interruption(clip)] if interrupt else []
            return [*done, await room.echo_alone()]

    return asyncio.run(asyncio.wait_for(scenario(), 600))


def test_with_the_browsers_echo_canceller_speech_stops_the_story_and_its_echo_does_not(workdir: Path) -> None:
    interruption, alone = run_room(workdir, browser_aec=True, interrupt=True)
    assert interruption.status == "cancelled", interruption
    assert interruption.audio_stop_ms is not None and interruption.audio_stop_ms < 3000, interruption
    assert interruption.heard, "the interrupting sentence was not transcribed"
    assert alone.status == "completed" and alone.echo_turns == 0, alone


def test_without_it_the_echo_gate_keeps_the_story_from_answering_itself(workdir: Path) -> None:
    (alone,) = run_room(workdir, browser_aec=False, interrupt=False)
    assert alone.status == "completed", alone
    assert alone.echo_turns == 0, alone
