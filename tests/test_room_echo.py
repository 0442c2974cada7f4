"""Local mode with its speakers on, in ``scripts/benchmark_room.py``'s PulseAudio room: the
microphone hears the speaker (70 % volume, 40 ms late, and a reflection). With the echo canceller
(`--echo_cancel auto`) LibriVox sentences said over the story interrupt it at once, and a story left alone plays
to its end: the program does not take its own voice for the user's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.helpers import load_module

pytestmark = pytest.mark.models

room = load_module(Path(__file__).resolve().parents[1] / "scripts" / "benchmark_room.py", "benchmark_room")


def test_speech_over_the_story_interrupts_it_and_its_own_echo_does_not(tmp_path: Path) -> None:
    missing = room.missing_tools()
    if missing:
        pytest.skip(f"no sound server here ({', '.join(missing)}; .ci/run installs them)")
    condition = room.Condition(echo_cancel=True, noise="none", snr_db=None)
    args = argparse.Namespace(trials=3, stories=1, questions=0, echo_gain=0.7, background_gate="false")
    room.run_condition(condition, args, tmp_path)
    assert condition.error is None, condition.error
    # the sentences are heard and quiet the voice soon (p50 345-580 ms with the canceller, 4-5 of 5
    # heard in the benchmark; without it, here, 3 of 4 were heard, two of them only after 2.4 and
    # 3.8 s, when a pause in the story let them through)
    soon = [ms for ms in condition.interruptions if ms is not None and ms < 2000]
    assert len(soon) >= 2, condition
    assert condition.stories == 1 and condition.false_stops == 0, condition


def test_music_in_the_room_is_not_taken_for_a_loud_echo(tmp_path: Path) -> None:
    """Music at 10 dB under the user, the canceller on: the sentences over the story are heard.
    When the echo gate learned the music as echo, its bar stood over the user's speech and 3 of 5,
    then 2 of 3, sentences were heard (``turns/echo.ROOM_PERCENTILE``); after, 35 of 35 on a 2-core
    AMD EPYC, and on a 2-core Intel Xeon 10 of 10 in the benchmark and 2 of 3 here once (2026-12-07),
    so five sentences, at least four heard: the old gate's rate passes that one time in three."""
    missing = room.missing_tools()
    if missing:
        pytest.skip(f"no sound server here ({', '.join(missing)}; .ci/run installs them)")
    condition = room.Condition(echo_cancel=True, noise="music", snr_db=10.0)
    args = argparse.Namespace(trials=5, stories=1, questions=0, echo_gain=0.7, background_gate="auto")
    room.run_condition(condition, args, tmp_path)
    assert condition.error is None, condition.error
    # (a trial may be left out when the story ended first); the voice quiet within 2 s for most (one
    # trial in a fresh clone took 2.1-2.6 s, twice: the quiet delay spreads widely from run to run)
    heard = [ms for ms in condition.interruptions if ms is not None]
    assert len(condition.interruptions) >= 4 and len(heard) >= len(condition.interruptions) - 1, condition
    assert sum(ms < 2000 for ms in heard) >= len(heard) - 1, condition
    assert condition.stories == 1 and condition.false_stops == 0, condition
