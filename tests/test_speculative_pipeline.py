"""Speculative turns and partial transcripts on real speech, in process.

Silero VAD, faster-whisper and Piper are the real embedded models; the LLM is a
scripted echo (:class:`speech_to_speech.testing.fakes.EchoLLM`: instant and deterministic), so the tests
can check exactly what history holds and which audio reached the sink, and so a
speculative reply is fully generated inside the short pause: the case in which only
the hold keeps it from being heard and written to history.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.events import (
    AssistantText,
    FirstAudio,
    ResponseDone,
    ResponseStarted,
    SpeechStopped,
    TurnSpeculated,
    TurnSuperseded,
    UserTranscript,
    UserTranscriptDelta,
)
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.fakes import EchoLLM, ScriptedSource
from speech_to_speech.testing.speech_data import (
    LIBRIVOX_DIR,
    TRANSCRIPT_WER_MAX,
    librivox_clips,
    normalize,
    word_error_rate,
)
from speech_to_speech.testing.turns import TurnRun, speech_only
from speech_to_speech.turns.speculation import HoldUntilConfirmed
from speech_to_speech.turns.vad import SAMPLE_RATE

pytestmark = pytest.mark.models

FIRST = "sense_and_sensibility_01_austen_64kb-0880"  # "he was not an ill disposed young man"
SECOND = "sense_and_sensibility_01_austen_64kb-0930"  # "he might even have been made amiable himself"
#: a 1.5 s silence bound that the transcript's words do not shorten (tiny.en may hear the first
#: clip as a finished statement, or even as a question)
LONG_PAUSE = ("--min_silence_ms", "1500", "--turn_statement_silence_ms", "0", "--turn_question_silence_ms", "0")


def clip(name: str) -> tuple[np.ndarray, str]:
    """A LibriVox clip cut to its speech (20 ms frames above 5% of the loudest, 50 ms kept around)."""
    clips = {path.stem: (path, ref) for path, ref in librivox_clips().items()}
    if name not in clips:
        pytest.skip(f"{name} is not installed (pocketsphinx-testdata, {LIBRIVOX_DIR})")
    path, reference = clips[name]
    return speech_only(load_audio(path), margin_s=0.05), reference


@dataclass
class Run(TurnRun):
    """The local pipeline (with the echo LLM unless told) on ``audio``, and the hold at its sink's door.

    Attributes:
        hold: the stage in front of the sink, which holds a speculative turn's audio until it is confirmed.
    """

    llm: str = "speculative-echo"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hold = self.pipeline.stage("hold", HoldUntilConfirmed)

    def replace_source(self, parts: list[Any]) -> ScriptedSource:
        """Replace the file source by one that plays ``parts`` (waiting 5 s at most on a condition)."""
        return self.script(parts, wait_s=5.0)


def check_superseded(run: Run, reference: str) -> None:
    """Turn 1 was sent on speculatively, superseded by more speech, and answered once, whole."""
    speculated = run.log.of(TurnSpeculated, 1)
    superseded = run.log.of(TurnSuperseded, 1)
    assert speculated and superseded, [e.kind for e in run.log.events]
    assert speculated[0].revision == 0 and superseded[0].revision == 1
    final = run.log.of(UserTranscript, 1)
    assert len(final) == 1, "only the final revision's transcript is announced"
    assert word_error_rate(reference, final[0].text) <= TRANSCRIPT_WER_MAX, (reference, final[0].text)
    assert run.llm_stage.heard[-1] == final[0].text
    # nothing of the superseded revision reached the sink; the final one did
    revisions = {d.stamp.revision for d in run.deliveries if d.stamp.turn_id == 1}
    assert revisions == {run.log.of(TurnSuperseded, 1)[-1].revision}, revisions
    assert [e.turn_id for e in run.log.of(ResponseDone)] == [1]
    assert [e.text for e in run.log.of(AssistantText, 1)] == [EchoLLM.reply_to(final[0].text)]
    # history holds the final revision only
    assert run.history() == [("user", final[0].text), ("assistant", EchoLLM.reply_to(final[0].text))]


def test_a_speculative_reply_the_user_talks_over_is_never_heard_nor_kept(tmp_path: Path) -> None:
    """The reply to the first words is synthesised and held while the user pauses; more speech drops it."""
    first, reference_a = clip(FIRST)
    second, reference_b = clip(SECOND)
    # a long endpoint, so the pause can wait until the speculative audio is held at the sink's door
    run = Run(tmp_path, [*LONG_PAUSE], audio=first)
    source = run.replace_source([first, lambda: run.hold.held > 0, second, np.zeros(2 * SAMPLE_RATE, np.float32)])
    run.go()
    assert not source.waited_out, "the speculative reply's audio was never held"
    assert run.hold.dropped > 0, "the held audio of the superseded revision was dropped"
    # the speculative revision really ran: the LLM answered the first clip's words alone
    assert len(run.llm_stage.heard) == 2, run.llm_stage.heard
    assert word_error_rate(reference_a, run.llm_stage.heard[0]) <= TRANSCRIPT_WER_MAX, run.llm_stage.heard
    check_superseded(run, f"{reference_a} {reference_b}")


def test_the_embedded_llm_s_speculative_reply_is_dropped_from_history(tmp_path: Path) -> None:
    """The same with llama.cpp and the embedded model: its reply to the first words is held, then dropped."""
    first, reference_a = clip(FIRST)
    second, reference_b = clip(SECOND)
    # silence alone ends the turn: with the default Smart Turn (the first clip is a whole sentence)
    # the held reply was released instead of dropped (0 dropped, with and without this session's
    # changes, on the locked package set); the endpoint must wait for the user to go on
    # the fast 0.5B: the test is about the hold, which the 1.5B's slower first sentence (seconds on a
    # busy machine) can miss inside the pause the source waits through
    # the endpoint's 6 s leaves the speculative reply over 5 s to reach the hold (the source waits
    # 5 s at most): with 3 s the hold was missed once in CI (its cause not seen; it passed alone)
    flags = ["--min_silence_ms", "6000", "--max_new_tokens", "40", "--turn_detection", "silence"]
    flags += ["--llm_model", "qwen2.5-coder-0.5b"]
    run = Run(tmp_path, flags, llm="llama-cpp", audio=first)
    source = run.replace_source([first, lambda: run.hold.held > 0, second, np.zeros(7 * SAMPLE_RATE, np.float32)])
    run.go()
    assert not source.waited_out, "the speculative reply's audio was never held"
    assert run.hold.dropped > 0
    assert run.log.of(TurnSpeculated, 1)[0].revision == 0 and run.log.of(TurnSuperseded, 1)
    final = run.log.of(UserTranscript, 1)
    replies = run.log.of(AssistantText, 1)
    assert len(final) == 1 and len(replies) == 1 and replies[0].error is None, [e.kind for e in run.log.events]
    assert word_error_rate(f"{reference_a} {reference_b}", final[0].text) <= TRANSCRIPT_WER_MAX
    assert run.history() == [("user", final[0].text), ("assistant", replies[0].text)]
    superseded = run.log.of(TurnSuperseded, 1)[-1].revision
    assert {d.stamp.revision for d in run.deliveries if d.stamp.turn_id == 1} == {superseded}


def test_two_clips_with_a_300_ms_pause_are_one_turn(tmp_path: Path) -> None:
    """Default settings: the pause sends the turn on speculatively; the second clip supersedes it."""
    first, reference_a = clip(FIRST)
    second, reference_b = clip(SECOND)
    pause = np.zeros(int(0.3 * SAMPLE_RATE), dtype=np.float32)
    run = Run(tmp_path, [], audio=np.concatenate([first, pause, second]))
    run.go()
    check_superseded(run, f"{reference_a} {reference_b}")


def test_the_confirmed_endpoint_releases_audio_computed_during_the_pause(tmp_path: Path) -> None:
    first, reference = clip(FIRST)
    audio = np.concatenate([first, np.zeros(3 * SAMPLE_RATE, np.float32)])
    run = Run(tmp_path, [*LONG_PAUSE], audio=audio)
    run.go()
    stopped = run.log.of(SpeechStopped, 1)
    assert run.log.of(TurnSpeculated, 1) and len(stopped) == 1
    endpoint = stopped[0].time
    # the reply was generated and synthesised before the endpoint, but not heard before it
    assert run.log.of(ResponseStarted, 1)[0].time < endpoint
    assert run.hold.held > 0
    assert run.deliveries and min(d.time for d in run.deliveries) >= endpoint
    first_audio = run.log.of(FirstAudio, 1)[0].time
    assert first_audio - endpoint < 0.15, f"first audio {1000 * (first_audio - endpoint):.0f} ms after the endpoint"
    transcripts = run.log.of(UserTranscript, 1)
    assert len(transcripts) == 1 and transcripts[0].time >= endpoint
    assert word_error_rate(reference, transcripts[0].text) <= TRANSCRIPT_WER_MAX
    assert run.history() == [("user", transcripts[0].text), ("assistant", EchoLLM.reply_to(transcripts[0].text))]


def test_partial_transcripts_arrive_before_the_final_one(tmp_path: Path) -> None:
    clips = {path.stem: (path, ref) for path, ref in librivox_clips().items()}
    path, reference = clips.get("sense_and_sensibility_01_austen_64kb-0870", next(iter(clips.values())))
    samples = load_audio(path)
    run = Run(tmp_path, ["--speculative_silence_ms", "0"], audio=samples)
    run.go()
    final = run.log.of(UserTranscript, 1)
    partials = run.log.of(UserTranscriptDelta, 1)
    assert len(final) == 1
    assert word_error_rate(reference, final[0].text) <= 0.25, (reference, final[0].text)
    expected = 2 if len(samples) > 4 * SAMPLE_RATE else 1
    assert len(partials) >= expected, [e.kind for e in run.log.events]
    assert all(p.time < final[0].time for p in partials)
    # each partial is a start of what was said, and they grow
    words = normalize(reference)
    for p in partials:
        heard = normalize(p.text)
        assert heard and len(set(heard) & set(words)) >= len(heard) // 2, (p.text, reference)
    assert [p.audio_ms for p in partials] == sorted(p.audio_ms for p in partials)
    # deltas only add words, and with the final's own delta they are a part of the final text
    announced = "".join(p.delta for p in partials) + final[0].delta
    assert normalize(announced) == normalize(final[0].text)[-len(normalize(announced)) :]
