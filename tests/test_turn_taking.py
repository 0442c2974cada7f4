"""Turn-taking on real speech with the real models: semantic end of turn (Silero + Smart Turn),
backchannels that leave a reply playing, real interruptions that cut it.

The VAD, the end-of-turn model, faster-whisper and Piper are the embedded models; the LLM
is scripted (:class:`speech_to_speech.testing.turns.ScriptedLLM`), so what history holds can be checked
exactly. User utterances other than LibriVox are synthesised with the embedded Piper voice,
its sampling noise off (the same audio every run).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.events import (
    AssistantText,
    BargeIn,
    FirstAudio,
    ReplyResumed,
    ResponseDone,
    ResponseInterrupted,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)
from speech_to_speech.llm.prompts import INTERRUPTION_MARKER
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.speech.text import remove_unspeakable
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, normalize, word_error_rate
from speech_to_speech.testing.turns import (
    LONG_REPLY,
    QUESTION,
    TurnRun,
    librivox_speech,
    mid_phrase_cuts,
    offline_endpoints,
    silence,
    speech_only,
    synthesize,
)
from speech_to_speech.turns.turn_detection import smart_turn_installed

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(not smart_turn_installed(), reason="the Smart Turn model is not installed (smart-turn extra)"),
]

#: sentences the end-of-turn model hears as finished (falling, sentence-final prosody)
FINISHED = ("sense_and_sensibility_01_austen_64kb-0920", "sense_and_sensibility_01_austen_64kb-0890")
#: "unless to be rather cold hearted and rather selfish is to be ill disposed"
SECOND_HALF = "sense_and_sensibility_01_austen_64kb-0890"
#: the most time the assistant's audio may go on after the user starts speaking, s
STOP_WITHIN_S = 0.1
#: how long the reply has been playing when the user speaks, s
PLAYING_S = 1.0


def clips(*names: str) -> list[tuple[np.ndarray, str]]:
    available = librivox_speech()
    missing = [name for name in names if name not in available]
    if missing:
        pytest.skip(f"LibriVox clips not installed (pocketsphinx-testdata): {missing}")
    return [available[name] for name in names]


def test_a_finished_sentence_endpoints_sooner_than_with_the_silence_rule() -> None:
    for samples, reference in clips(*FINISHED):
        audio = np.concatenate([silence(0.3), samples, silence(2.5)])
        smart = offline_endpoints(audio)
        plain = offline_endpoints(audio, ["--turn_detection", "silence"])
        assert len(smart) == 1 and len(plain) == 1, (reference, smart, plain)
        assert smart[0].by == "model" and plain[0].by == "silence"
        assert smart[0].probability is not None and smart[0].probability >= 0.5
        # on the input's timeline (the model's compute time, which a busy machine stretches, aside)
        assert smart[0].decided_ms - smart[0].speech_end_ms <= 300, smart[0]
        assert plain[0].delay_ms >= 450, plain[0]  # --min_silence_ms 500, in 32 ms chunks
        assert smart[0].decided_ms < plain[0].decided_ms - 150, (smart[0], plain[0])


def test_a_1_5_s_pause_mid_sentence_stays_one_turn(tmp_path: Path) -> None:
    ((samples, reference),) = clips(SECOND_HALF)
    # "Unless to be rather cold hearted and rather | selfish is to be ill disposed": the pause falls
    # where neither the model (P ~0.2) nor the words ("... and rather...") say the turn is over
    cut = next(c for c in mid_phrase_cuts(samples) if c.last_word in ("rather", "and"))
    rest = samples[len(cut.samples) :]
    audio = np.concatenate([silence(0.3), cut.samples, silence(1.5), rest, silence(2.5)])
    # offline: the silence rule ends the turn in the pause, the end-of-turn model waits
    assert len(offline_endpoints(audio, ["--turn_detection", "silence"])) == 2
    endpoints = offline_endpoints(audio)
    assert len(endpoints) == 1 and endpoints[0].by == "model", endpoints
    # and end to end: one turn, answered once, with the whole sentence
    run = TurnRun(tmp_path)
    run.script([audio])
    run.go()
    assert {e.turn_id for e in run.events(SpeechStarted)} == {1}, run.events(SpeechStarted)
    final = run.events(UserTranscript, 1)
    assert len(final) == 1, run.events(UserTranscript)
    assert word_error_rate(reference, final[0].text) <= TRANSCRIPT_WER_MAX, final[0].text
    assert run.llm_stage.heard[-1] == final[0].text
    assert [e.turn_id for e in run.events(ResponseDone)] == [1]
    assert run.history() == [("user", final[0].text), ("assistant", f"You said: {final[0].text.rstrip('.')}.")]


def test_a_finished_statement_the_model_doubts_ends_by_its_words(tmp_path: Path) -> None:
    # Smart Turn gives this Piper rendition P ~0.04 (unfinished); its transcript is a whole sentence
    audio = np.concatenate([silence(0.3), synthesize("I'm thinking about baking bread this weekend."), silence(2.5)])
    run = TurnRun(tmp_path)
    run.script([audio])
    run.go()
    (stopped,) = run.events(SpeechStopped)
    assert stopped.endpoint_by == "text", stopped  # not the 2 s silence bound
    assert stopped.turn_probability is not None and stopped.turn_probability < 0.7
    assert [e.turn_id for e in run.events(ResponseDone)] == [1]


def test_a_pause_inside_a_number_stays_one_turn(tmp_path: Path) -> None:
    # "My number is 555." reads finished but for its last word: a number goes on after a pause
    first, second = synthesize("My number is five five five"), synthesize("one two three four.")
    audio = np.concatenate([silence(0.3), first, silence(1.2), second, silence(2.5)])
    run = TurnRun(tmp_path)
    run.script([audio])
    run.go()
    assert {e.turn_id for e in run.events(SpeechStarted)} == {1}, run.events(SpeechStarted)
    (final,) = run.events(UserTranscript, 1)
    digits = "".join(ch for ch in final.text if ch.isdigit())
    words = normalize(final.text)
    assert ("555" in digits or words.count("five") >= 3) and ("1234" in digits or "four" in words), final.text
    assert [e.turn_id for e in run.events(ResponseDone)] == [1]


def reply_is_playing(run: TurnRun, seconds: float) -> Any:
    """A condition: turn 1's reply has been audible for ``seconds``."""

    def playing() -> bool:
        first = run.events(FirstAudio, 1)
        return bool(first) and time.monotonic() >= first[0].time + seconds

    return playing


def check_paused_at_once(run: TurnRun) -> None:
    """Every speech start during the reply paused the sink within :data:`STOP_WITHIN_S`."""
    starts = [e for e in run.events(SpeechStarted) if e.pauses_reply]
    assert starts and len(run.pauses) == len(starts), (starts, run.pauses)
    for start, paused in zip(starts, run.pauses, strict=True):
        assert paused - start.time < STOP_WITHIN_S, f"paused {1000 * (paused - start.time):.0f} ms after speech"
        late = [d for d in run.deliveries if d.stamp.turn_id == 1 and start.time + STOP_WITHIN_S < d.time < paused]
        assert not late


def test_backchannels_during_a_reply_leave_it_playing_and_are_not_answered(tmp_path: Path) -> None:
    question = speech_only(load_audio(QUESTION))
    yeah, mm_hmm = synthesize("Yeah."), synthesize("Mm hmm.")
    run = TurnRun(tmp_path)
    run.script(
        [
            question,
            reply_is_playing(run, PLAYING_S),
            yeah,
            reply_is_playing(run, PLAYING_S + 3.0),
            mm_hmm,
            lambda: bool(run.events(ResponseDone)),
            silence(0.5),
        ]
    )
    run.go()
    assert run.source is not None and not run.source.waited_out
    resumed = run.events(ReplyResumed)
    assert [e.reason for e in resumed] == ["backchannel", "backchannel"], [e.kind for e in run.log.events]
    # (a reply to "Hi there," endpointed at its pause and reopened by the rest is cut unheard)
    assert not run.events(BargeIn) and not [e for e in run.events(ResponseInterrupted) if e.audio_end_ms > 0]
    check_paused_at_once(run)
    # the reply played to its end, once, and is in history whole; the backchannels are not
    done = [e for e in run.events(ResponseDone) if e.error != "cancelled"]  # (the unheard reply to "Hi there,")
    assert [(e.turn_id, e.error) for e in done] == [(1, None)]
    assert run.llm_stage.heard[-1] == run.events(UserTranscript, 1)[-1].text
    assert run.history() == [("user", run.llm_stage.heard[-1]), ("assistant", LONG_REPLY)]
    # audio resumed after each pause (the reply went on from where it stopped, not from its start)
    for event in resumed:
        after = [d for d in run.deliveries if d.stamp.turn_id == 1 and d.time >= event.time]
        assert after and after[0].time - event.time < 0.2, "no audio right after the resume"
    assert all(d.stamp.turn_id == 1 for d in run.deliveries)


def test_a_real_interruption_cancels_the_reply_and_history_keeps_what_was_heard(tmp_path: Path) -> None:
    question = speech_only(load_audio(QUESTION))
    stop = synthesize("Wait, stop.")
    run = TurnRun(tmp_path)
    run.script(
        [question, reply_is_playing(run, PLAYING_S), stop, lambda: len(run.events(ResponseDone)) >= 2, silence(0.5)]
    )
    run.go()
    assert run.source is not None and not run.source.waited_out
    barge_ins = run.events(BargeIn)
    assert len(barge_ins) == 1 and barge_ins[0].turn_id == 2 and barge_ins[0].reason == "words", barge_ins
    assert not run.events(ReplyResumed)
    check_paused_at_once(run)
    speech = next(e for e in run.events(SpeechStarted) if e.turn_id == 2)
    late = [
        d.time - speech.time for d in run.deliveries if d.stamp.turn_id == 1 and d.time > speech.time + STOP_WITHIN_S
    ]
    assert not late, f"turn 1 audio delivered {1000 * max(late):.0f} ms after the user started speaking"
    # what was heard is the start of the reply, and history holds exactly that
    # (a reply to "Hi there," endpointed at its pause and reopened by the rest is cut unheard first)
    interrupted = [e for e in run.events(ResponseInterrupted, 1) if e.audio_end_ms > 0]
    assert len(interrupted) == 1
    heard = interrupted[0].heard_text
    heard_words, reply_words = normalize(heard), normalize(remove_unspeakable(LONG_REPLY))
    assert heard_words and reply_words[: len(heard_words)] == heard_words and len(heard_words) < len(reply_words)
    stop_text = run.events(UserTranscript, 2)[0].text
    assert word_error_rate("wait stop", stop_text) == 0, stop_text
    assert run.history() == [
        ("user", run.llm_stage.heard[-2]),  # the question's last revision (then "Wait, stop.")
        ("assistant", (heard + INTERRUPTION_MARKER).strip()),
        ("user", stop_text),
        ("assistant", f"You said: {stop_text.rstrip('.')}."),
    ]
    assert [e.turn_id for e in run.events(ResponseDone)][-2:] == [1, 2]
    assert run.events(ResponseDone, 1)[-1].error == "cancelled"
    assert run.events(AssistantText, 2) and any(d.stamp.turn_id == 2 for d in run.deliveries)
