"""The server benchmarks' turn (``speech_to_speech.testing.server_runs.speak_one_turn``): voice-to-voice
from the end of the speech sent, and the shorter interval from ``speech_stopped``, on real speech
through the in-process server (real VAD, STT and TTS; the scripted provider answers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from speech_to_speech.testing.realtime import InProcessServer
from speech_to_speech.testing.server_runs import Options, load_clip, speak_one_turn
from speech_to_speech.testing.speech_data import librivox_clips

pytestmark = pytest.mark.models


def test_voice_to_voice_counts_from_the_end_of_the_speech_sent(server: InProcessServer) -> None:
    path = min(librivox_clips(), key=lambda p: Path(p).stat().st_size)
    clip = load_clip(Path(path))
    assert 0.5 < clip.speech_end_s <= clip.duration_s  # the clip's own trailing silence is not speech
    options = Options(server.ws_url, {}, 1.0, False, False, 120.0, 0.0)
    turns = asyncio.run(speak_one_turn(options, "test", "c0", clip, cancel=True))
    answered = [t for t in turns if t.after_stop_ms is not None]
    assert answered, [(t.status, t.v2v_ms) for t in turns]
    last = turns[-1]
    assert last.v2v_ms is not None and last.after_stop_ms is not None, last
    # the end-of-turn wait lies between the end of speech and speech_stopped: voice-to-voice holds it
    assert last.v2v_ms > last.after_stop_ms + 50, last
    assert last.v2v_ms < last.after_stop_ms + 3000, last  # at most the silence fallback and the VAD's lag
