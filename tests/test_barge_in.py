"""Barge-in on real speech, in process, with the real embedded models.

A scripted source plays one LibriVox clip, waits until the assistant's reply is
audibly playing, then plays a second clip over it. The reply must stop at once,
the LLM's history must keep only the words that were heard, and the second
utterance must get its own transcript and reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.events import (
    AssistantText,
    FirstAudio,
    ResponseDone,
    ResponseInterrupted,
    SpeechStarted,
    UserTranscript,
)
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.pipeline.cli import DEFAULT_BACKENDS
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.speech.text import remove_unspeakable
from speech_to_speech.testing.speech_data import normalize, word_error_rate
from speech_to_speech.testing.turns import TurnRun
from speech_to_speech.turns.vad import SAMPLE_RATE
from tests.helpers import BusLog, two_short_clips

pytestmark = pytest.mark.models

#: the longest any single wait may take on a slow, shared machine, s
WAIT_S = 300.0
#: the whole run is stopped after this (a hang fails the test instead of blocking it), s
RUN_LIMIT_S = 900.0
#: how long the reply has been playing when the user barges in, s
PLAYING_BEFORE_BARGE_IN_S = 0.6
#: silence after the second clip: endpointing plus margin, s
TAIL_SILENCE_S = 3.0
#: the most time turn 1's audio may still reach the sink after the user started speaking, s
CUT_WITHIN_S = 0.1


@dataclass
class BargeIn:
    """When the user barges in: the scripted source asks :meth:`when_playing` (silence until it holds),
    then :meth:`mark` (at once), then plays clip B.

    Attributes:
        began: monotonic time when clip B began (None before).
        reply_was_playing: whether turn 1's reply was still unfinished when clip B began.
    """

    log: BusLog
    began: float | None = None
    reply_was_playing: bool = False

    def when_playing(self) -> bool:
        """Turn 1's reply is fully written and its audio has been playing for a while.

        The whole reply text is waited for too: a reply still being generated when the user barges
        in is cancelled before it is written, so it would have no AssistantText to compare with.
        """
        first_audio = self.log.of(FirstAudio, 1)
        return (
            bool(first_audio)
            and bool(self.log.of(AssistantText, 1))
            and time.monotonic() >= first_audio[0].time + PLAYING_BEFORE_BARGE_IN_S
        )

    def mark(self) -> bool:
        """Record the moment clip B begins; True (it sends no silence)."""
        self.reply_was_playing = not self.log.of(ResponseDone, 1)
        self.began = time.monotonic()
        return True


def assistant_messages(items: list[dict[str, Any]]) -> list[str]:
    """The text of each assistant message in history items, oldest first."""
    return [
        str(item.get("content"))
        for item in items
        if item.get("type", "message") == "message" and item.get("role") == "assistant"
    ]


def test_barge_in_cuts_the_reply_to_what_was_heard(tmp_path: Path) -> None:
    (clip_a, _), (clip_b, reference_b) = two_short_clips()
    # the default LLM (the embedded model)
    run = TurnRun(tmp_path, ["--max_new_tokens", "80"], llm=DEFAULT_BACKENDS["llm"], run_limit_s=RUN_LIMIT_S)
    log = run.log
    cue = BargeIn(log)
    tail = np.zeros(int(TAIL_SILENCE_S * SAMPLE_RATE), dtype=np.float32)
    parts = [load_audio(clip_a), cue.when_playing, cue.mark, load_audio(clip_b), tail]
    source = run.script(parts, wait_s=WAIT_S)
    began = time.monotonic()
    run.go()  # no thread stuck, no stage error
    history = run.llm_stage.chat.items()
    assert time.monotonic() - began < RUN_LIMIT_S, "the run hung and was stopped by the watchdog"
    assert not source.waited_out, f"turn 1's reply never played; events: {[e.kind for e in log.events]}"
    assert cue.began is not None
    assert cue.reply_was_playing, "turn 1's reply ended before the barge-in: nothing to interrupt"

    # the second utterance opened turn 2, with the speech start that interrupted turn 1
    assert [e.turn_id for e in log.of(SpeechStarted) if e.time < cue.began] == [1]
    barge_in = [e for e in log.of(SpeechStarted) if e.time >= cue.began]
    assert barge_in and barge_in[0].turn_id == 2 and barge_in[0].revision == 0, log.of(SpeechStarted)
    speech_started = barge_in[0].time

    # the reply was interrupted and stopped at once
    ended = log.of(ResponseDone, 1)
    assert ended and ended[0].time >= speech_started, "turn 1's reply ended before the user barged in"
    interrupted = log.of(ResponseInterrupted, 1)
    assert len(interrupted) == 1, log.of(ResponseInterrupted)
    turn1 = [d.time for d in run.deliveries if d.stamp.turn_id == 1]
    assert turn1, "no audio of turn 1 reached the sink"
    late = [t - speech_started for t in turn1 if t > speech_started + CUT_WITHIN_S]
    assert not late, f"turn 1 audio delivered {max(late) * 1000:.0f} ms after the user started speaking"

    # what was heard is the start of the full reply
    replies = log.of(AssistantText, 1)
    assert len(replies) == 1 and replies[0].error is None
    full_reply = replies[0].text
    heard = interrupted[0].heard_text
    assert heard.strip(), "the reply was playing: some words must have been heard"
    heard_words = normalize(heard)
    reply_words = normalize(remove_unspeakable(full_reply))
    assert reply_words[: len(heard_words)] == heard_words, (heard, full_reply)
    assert len(heard_words) < len(reply_words), "the whole reply was heard: it was not interrupted"
    assert interrupted[0].audio_end_ms > 0

    # the history keeps the heard words, marked as interrupted, not the full reply
    messages = assistant_messages(history)
    assert len(messages) == 2, history
    assert messages[0] == (heard + INTERRUPTION_MARKER).strip()
    assert messages[0] != full_reply

    # the second utterance was transcribed and answered with audio
    transcripts = log.of(UserTranscript, 2)
    assert len(transcripts) == 1, log.of(UserTranscript)
    assert word_error_rate(reference_b, transcripts[0].text) <= 0.5, (reference_b, transcripts[0].text)
    answers = log.of(AssistantText, 2)
    assert len(answers) == 1 and answers[0].text.strip() and answers[0].error is None
    assert messages[1] == answers[0].text
    assert log.of(FirstAudio, 2)
    assert any(d.stamp.turn_id == 2 for d in run.deliveries)
    assert [e.turn_id for e in log.of(ResponseDone)] == [1, 2]
    assert (tmp_path / "out.wav").is_file()
