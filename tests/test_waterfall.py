"""The latency waterfall (speech_to_speech/testing/waterfall.py): the first-chunk event it reads, the milestones it
derives from a run's events, and the chart it draws."""

from __future__ import annotations

from pathlib import Path

import pytest

from speech_to_speech.core.events import (
    FirstAudio,
    FirstChunk,
    FirstToken,
    ResponseStarted,
    SpeechStopped,
    UserTranscript,
)
from speech_to_speech.core.messages import EndOfResponse, TextOutput, TTSInput
from speech_to_speech.llm.output import LMOutputProcessor
from speech_to_speech.testing.waterfall import Turn, plot_waterfall, turns_from_events
from tests.helpers import new_stage


def test_the_first_phrase_of_each_revision_is_published_once() -> None:
    stage = new_stage(LMOutputProcessor)
    chunks: list[FirstChunk] = []
    stage.bus.subscribe(lambda e: chunks.append(e) if isinstance(e, FirstChunk) else None)
    first = stage.gate.new_turn_stamp()
    # text shown but not spoken is no chunk for TTS
    for item in (TextOutput(first, "Jupiter"), TTSInput(first, "Jupiter."), TTSInput(first, "It is big.")):
        list(stage.process(item))
    list(stage.process(EndOfResponse(first)))
    revision = stage.gate.stamp(first.turn_id, stage.gate.turns.revise(first.turn_id))
    for item in (TTSInput(revision, "Saturn."), TTSInput(revision, "Rings.")):
        list(stage.process(item))
    assert [(c.turn_id, c.revision, c.text) for c in chunks] == [
        (first.turn_id, 0, "Jupiter."),
        (first.turn_id, revision.revision, "Saturn."),
    ]


def test_milestones_are_ms_after_the_end_of_speech_for_the_answered_revision() -> None:
    t = 100.0  # the end of speech, on the event clock (s)
    events = [
        # a speculative revision 0 started 200 ms after the speech ended; revision 1 was answered
        ResponseStarted(1, revision=0, time=t + 0.2),
        FirstToken(1, ttft_ms=50, time=t + 0.25),
        FirstChunk(1, revision=0, text="Paris.", time=t + 0.3),
        SpeechStopped(1, endpoint_delay_ms=400, endpoint_by="text", time=t + 0.4),
        UserTranscript(1, text="What is the capital of France?", stt_ms=90, time=t + 0.41),
        ResponseStarted(1, revision=1, time=t + 0.5),
        FirstToken(1, ttft_ms=100, time=t + 0.6),
        FirstChunk(1, revision=1, text="Paris.", time=t + 0.65),
        FirstAudio(1, time=t + 0.8),
        # a turn that was never answered (no response) is left out
        SpeechStopped(2, endpoint_delay_ms=300, time=t + 5.0),
    ]
    (turn,) = turns_from_events("clip", events)
    got = [turn.endpoint, turn.stt_start, turn.llm_start, turn.first_token, turn.first_chunk, turn.first_audio]
    assert got == pytest.approx([400, 410, 500, 600, 650, 800])
    assert (turn.turn_id, turn.endpoint_by, turn.first_phrase) == (1, "text", "Paris.")
    assert turn.voice_to_voice == pytest.approx(800)


def test_the_chart_is_a_png_with_a_row_per_turn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    turns = [
        Turn("a", 1, "model", endpoint=240, stt_start=250, llm_start=330, first_token=480, first_chunk=520),
        Turn("b", 1, "silence", endpoint=1000, stt_start=-50, llm_start=60, first_token=200, first_chunk=260),
    ]
    turns[0].first_audio, turns[1].first_audio = 700.0, 1100.0
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    plot_waterfall(turns[:1], one, "one turn")
    plot_waterfall(turns, two, "two turns")
    import matplotlib.image

    assert one.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a row per turn: the second chart is taller
    assert matplotlib.image.imread(str(two)).shape[0] > matplotlib.image.imread(str(one)).shape[0]
