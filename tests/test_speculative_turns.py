"""Speculative turns and partial transcripts without models: the endpointer, the VAD stage,
the holding queues, the STT stage around a fake engine, and transcript deltas."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.audio import CHUNK_SAMPLES
from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import (
    Event,
    EventBus,
    SpeechStarted,
    SpeechStopped,
    TurnSpeculated,
    TurnSuperseded,
    UserTranscript,
    UserTranscriptDelta,
)
from speech_to_speech.core.messages import (
    END_OF_STREAM,
    AudioOutput,
    EndOfResponse,
    PartialSpeech,
    SpeechSegment,
    Transcript,
    TTSInput,
)
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.core.speculation import SpeculativeTurns
from speech_to_speech.testing.fakes import FakeSTT, VADRig, vad_chunks
from speech_to_speech.turns.endpointer import BY_TEXT
from speech_to_speech.turns.speculation import HoldUntilConfirmed
from speech_to_speech.turns.stt import STTConfig, TranscriptDeltas, trim_repeats
from speech_to_speech.turns.turn_detection import TurnVerdict
from speech_to_speech.turns.vad import RESUMED, Endpoint, Endpointer, Speculation, TranscriptEndsTurn, VADConfig
from tests.test_vad_endpointer import CONFIG, MS_PER_CHUNK, PAD, SILENCE, SPEECH, chunk_indices, run

# 10 silent chunks end a turn (CONFIG); 4 send it on speculatively
SPECULATIVE = dataclasses.replace(CONFIG, speculative_silence_ms=int(4 * MS_PER_CHUNK))
SPEC_CHUNKS = 4


# -- the endpointer ------------------------------------------------------------------------------
def test_a_short_pause_speculates_and_the_endpoint_confirms_it() -> None:
    onset, speech = 5, 10
    results = run(Endpointer(SPECULATIVE), [SILENCE] * onset + [SPEECH] * speech + [SILENCE] * 20)
    kinds = [type(r).__name__ if not isinstance(r, str) else r for _, r in results]
    assert kinds == ["start", "Speculation", "Endpoint"]
    (at_spec, speculation), (at_end, endpoint) = results[1], results[2]
    assert isinstance(speculation, Speculation) and isinstance(endpoint, Endpoint)
    assert at_spec == onset + speech + SPEC_CHUNKS - 1  # as soon as the short pause was heard
    assert at_end == onset + speech + 10 - 1
    assert endpoint.confirms_speculation
    # the speculative audio is what the endpoint sends: the same speech with the same padding
    assert np.array_equal(speculation.samples, endpoint.samples)
    assert speculation.speech_end_offset == endpoint.speech_end_offset
    assert chunk_indices(endpoint.samples) == list(range(onset - PAD, onset + speech + PAD))


def test_speech_after_a_speculation_resumes_then_speculates_again() -> None:
    probabilities = [SILENCE] * 3 + [SPEECH] * 8 + [SILENCE] * 6 + [SPEECH] * 8 + [SILENCE] * 12
    results = run(Endpointer(SPECULATIVE), probabilities)
    kinds = [type(r).__name__ if not isinstance(r, str) else r for _, r in results]
    assert kinds == ["start", "Speculation", RESUMED, "Speculation", "Endpoint"]
    assert results[2][0] == 3 + 8 + 6  # the first speech chunk after the pause
    first, second, endpoint = results[1][1], results[3][1], results[4][1]
    assert isinstance(first, Speculation) and isinstance(second, Speculation) and isinstance(endpoint, Endpoint)
    assert len(second.samples) > len(first.samples)
    assert np.array_equal(second.samples[: len(first.samples)], first.samples)  # one utterance, growing
    assert endpoint.confirms_speculation and np.array_equal(endpoint.samples, second.samples)


def test_no_speculation_for_pauses_shorter_than_speculative_silence() -> None:
    probabilities = [SPEECH] * 8 + [SILENCE] * (SPEC_CHUNKS - 1) + [SPEECH] * 8 + [SILENCE] * 3
    assert [r for _, r in run(Endpointer(SPECULATIVE), probabilities)] == ["start"]


@pytest.mark.parametrize("speculative_ms", [0, int(10 * MS_PER_CHUNK), int(20 * MS_PER_CHUNK)])
def test_speculation_off_when_zero_or_not_shorter_than_min_silence(speculative_ms: int) -> None:
    config = dataclasses.replace(CONFIG, speculative_silence_ms=speculative_ms)
    results = run(Endpointer(config), [SPEECH] * 8 + [SILENCE] * 20)
    assert [type(r).__name__ if not isinstance(r, str) else r for _, r in results] == ["start", "Endpoint"]
    assert not results[1][1].confirms_speculation  # type: ignore[union-attr]


def test_no_speculation_on_noise_shorter_than_min_speech() -> None:
    results = run(Endpointer(SPECULATIVE), [SPEECH] * 3 + [SILENCE] * 20)
    assert [r for _, r in results] == ["start"]


def test_flush_after_a_speculation_confirms_it() -> None:
    endpointer = Endpointer(SPECULATIVE)
    results = run(endpointer, [SPEECH] * 8 + [SILENCE] * 5)
    assert isinstance(results[-1][1], Speculation)
    endpoint = endpointer.flush()
    assert isinstance(endpoint, Endpoint) and endpoint.confirms_speculation


def test_max_speech_cut_on_resumed_speech_does_not_confirm() -> None:
    # the cut falls on the chunk where speech resumes after the pause
    config = dataclasses.replace(SPECULATIVE, max_speech_ms=int(16 * MS_PER_CHUNK))
    results = run(Endpointer(config), [SPEECH] * 10 + [SILENCE] * 5 + [SPEECH] * 3)
    assert isinstance(results[1][1], Speculation)
    at, endpoint = results[2]
    assert at == 15 and isinstance(endpoint, Endpoint) and not endpoint.confirms_speculation


# -- the VAD stage -----------------------------------------------------------------------------
def run_speculative_vad(
    probabilities: list[float], config: VADConfig = SPECULATIVE, turns: bool = True
) -> tuple[list[Any], list[Event], Gate, SpeculativeTurns]:
    rig = VADRig.build(config, vad_chunks(probabilities))
    vad, inq, outq, gate = rig.vad, rig.inq, rig.outq, rig.gate
    speculation = SpeculativeTurns(gate)
    if turns:
        vad.speculation = speculation
    out: list[Any] = []

    def drain() -> None:  # an STT that keeps up
        while not out or out[-1] is not END_OF_STREAM:
            out.append(outq.get(timeout=2.0))

    consumer = threading.Thread(target=drain, daemon=True)
    consumer.start()
    vad.start()
    for item in rig.items:  # paced, so that the consumer empties the queue between chunks
        inq.put(item)
        time.sleep(0.005)
    inq.put(END_OF_STREAM)
    vad.join(5.0)
    consumer.join(5.0)
    assert not vad.is_alive() and not consumer.is_alive()
    return out[:-1], rig.events, gate, speculation


def test_vad_sends_a_speculative_segment_that_the_endpoint_confirms() -> None:
    out, events, gate, speculation = run_speculative_vad([SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 16)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    assert len(segments) == 1, "the confirmed endpoint sends no second segment"
    segment = segments[0]
    assert segment.speculative and segment.stamp.revision == 0 and gate.admits(segment.stamp)
    assert len(segment.samples) == (10 + 2 * PAD) * 512
    assert [type(e) for e in events] == [SpeechStarted, TurnSpeculated, SpeechStopped]
    assert not speculation.is_pending(segment.stamp)  # confirmed
    assert not speculation.was_superseded(segment.stamp)


def test_vad_supersedes_a_speculative_segment_when_speech_resumes() -> None:
    probabilities = [SILENCE] * 4 + [SPEECH] * 10 + [SILENCE] * 6 + [SPEECH] * 10 + [SILENCE] * 3
    out, events, gate, speculation = run_speculative_vad(probabilities)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    # speculative rev 0, rev 1 speculative again after the second pause... which the stream's end confirms
    first, second = segments[0], segments[-1]
    assert first.speculative and first.stamp.revision == 0
    assert second.stamp.turn_id == first.stamp.turn_id and second.stamp.revision == 1
    assert not gate.admits(first.stamp) and gate.admits(second.stamp)
    assert speculation.was_superseded(first.stamp) and not speculation.is_pending(first.stamp)
    assert np.array_equal(second.samples[: len(first.samples)], first.samples)  # the whole utterance
    kinds = [type(e) for e in events]
    assert kinds[:3] == [SpeechStarted, TurnSpeculated, TurnSuperseded]
    assert kinds.count(SpeechStarted) == 1, "speaking on is not a new speech start (no barge-in)"
    superseded = next(e for e in events if isinstance(e, TurnSuperseded))
    assert superseded.turn_id == first.stamp.turn_id and superseded.revision == 1


def test_vad_without_a_hold_does_not_speculate() -> None:
    out, events, _, _ = run_speculative_vad([SPEECH] * 10 + [SILENCE] * 16, turns=False)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    assert len(segments) == 1 and not segments[0].speculative
    assert not any(isinstance(e, TurnSpeculated) for e in events)


def test_vad_sends_partials_during_speech_only() -> None:
    config = dataclasses.replace(SPECULATIVE, partial_interval_ms=int(4 * MS_PER_CHUNK), max_speech_ms=10_000)
    out, _, _, _ = run_speculative_vad([SILENCE] * 2 + [SPEECH] * 17 + [SILENCE] * 16, config)
    everything = [item for item in out if isinstance(item, PartialSpeech)]
    partials = [p for p in everything if p.speech_end_offset < 0]
    assert len(partials) == 4  # every 4 chunks of speech: after 4, 8, 12, 16
    # and once the speech stopped (2 silent chunks), the final pass ahead, over all of it
    ahead = [p for p in everything if p.speech_end_offset >= 0]
    assert len(ahead) == 1 and ahead[0].speech_end_offset == 19 * CHUNK_SAMPLES
    assert ahead[0].stamp == partials[0].stamp and len(ahead[0].samples) > len(partials[-1].samples)
    lengths = [len(p.samples) for p in partials]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4
    assert all(p.stamp == partials[0].stamp for p in partials)
    for p in partials:
        assert p.deadline == pytest.approx(p.time + SPECULATIVE.speculative_silence_ms / 1000)
    # partials come before the turn's segment
    last = max(i for i, item in enumerate(out) if isinstance(item, PartialSpeech))
    assert isinstance(out[last + 1], SpeechSegment)


# -- the holds ------------------------------------------------------------------------
def open_turn() -> tuple[Gate, SpeculativeTurns, Stamp]:
    """A gate, its speculative turns, and a new turn opened speculatively."""
    gate = Gate()
    turns = SpeculativeTurns(gate)
    stamp = gate.new_turn_stamp()
    turns.open(stamp)
    return gate, turns, stamp


def hold_for(turns: SpeculativeTurns) -> HoldUntilConfirmed:
    """The hold stage on ``turns``'s gate, driven through ``process`` (nothing queued)."""
    return HoldUntilConfirmed(
        stop_event=threading.Event(),
        input_queue=None,
        output_queue=StageQueue(8),
        gate=turns.gate,
        bus=EventBus(),
        turns=turns,
    )


def passed_on(hold: HoldUntilConfirmed, item: Any, into: list[Any]) -> threading.Thread:
    """A thread that hands ``item`` to ``hold`` and puts what it lets through in ``into``."""
    thread = threading.Thread(target=lambda: into.extend(hold.process(item)), daemon=True)
    thread.start()
    return thread


def test_wait_after_holds_the_producer_of_a_pending_turn_until_the_endpoint() -> None:
    _, turns, stamp = open_turn()
    done = threading.Event()
    threading.Thread(
        target=lambda: (turns.wait_after(TTSInput(stamp, "First sentence."), threading.Event(), 0.05), done.set()),
        daemon=True,
    ).start()
    assert not done.wait(0.2), "the producer (the LLM) waits for the endpoint after its output"
    turns.confirm(stamp)
    assert done.wait(1.0)
    # a confirmed turn and a response end never wait
    turns.wait_after(TTSInput(stamp, "Second."), threading.Event())
    other = turns.gate.new_turn_stamp()
    turns.open(other)
    turns.wait_after(EndOfResponse(other), threading.Event())


def test_wait_after_wakes_on_supersession() -> None:
    gate, turns, stamp = open_turn()
    done = threading.Event()
    threading.Thread(
        target=lambda: (turns.wait_after(TTSInput(stamp, "Hi."), threading.Event(), 0.05), done.set()), daemon=True
    ).start()
    time.sleep(0.1)
    gate.turns.revise(stamp.turn_id)
    turns.discard(stamp)
    assert done.wait(1.0)


def test_hold_until_confirmed_releases_on_confirmation() -> None:
    _, turns, stamp = open_turn()
    hold, out = hold_for(turns), []
    chunk = AudioOutput(stamp, np.zeros(160, dtype=np.float32), 16_000, "Hi")
    thread = passed_on(hold, chunk, out)
    time.sleep(0.2)
    assert not out and hold.held == 1, "audio of an unconfirmed turn is held"
    released = time.monotonic()
    turns.confirm(stamp)
    thread.join(1.0)
    assert out == [chunk]
    assert time.monotonic() - released < 0.05, "confirmation lets it through at once"


def test_hold_until_confirmed_drops_a_superseded_revision_and_its_end() -> None:
    gate, turns, stamp = open_turn()
    hold, out = hold_for(turns), []
    thread = passed_on(hold, AudioOutput(stamp, np.zeros(160, dtype=np.float32), 16_000), out)
    time.sleep(0.1)
    gate.turns.revise(stamp.turn_id)
    turns.discard(stamp)
    thread.join(1.0)
    assert out == [] and hold.dropped == 1
    assert list(hold.process(EndOfResponse(stamp, error="cancelled"))) == []
    assert hold.dropped == 2, "nothing of a superseded speculative response reaches the sink"
    # the end of an ordinary cancelled response still passes (a stale chunk is dropped where it is emitted)
    other = gate.new_turn_stamp()
    gate.scope.cancel()
    assert hold.emit(EndOfResponse(other, error="cancelled"))
    assert not hold.emit(AudioOutput(other, np.zeros(1, dtype=np.float32), 16_000))


def test_when_confirmed_runs_now_later_or_never() -> None:
    gate = Gate()
    turns = SpeculativeTurns(gate)
    ran: list[str] = []
    plain = gate.new_turn_stamp()
    turns.when_confirmed(plain, lambda: ran.append("plain"))
    pending = gate.new_turn_stamp()
    turns.open(pending)
    turns.when_confirmed(pending, lambda: ran.append("pending"))
    assert ran == ["plain"]
    turns.confirm(pending)
    assert ran == ["plain", "pending"]
    dropped = gate.new_turn_stamp()
    turns.open(dropped)
    turns.when_confirmed(dropped, lambda: ran.append("dropped"))
    turns.discard(dropped)
    turns.when_confirmed(dropped, lambda: ran.append("dropped late"))
    assert ran == ["plain", "pending"]


# -- the STT stage -------------------------------------------------------------------------------
def make_stt(**kwargs: Any) -> tuple[FakeSTT, StageQueue, list[Event], Gate]:
    gate, bus = Gate(), EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    inq = StageQueue(8)
    stt = FakeSTT(threading.Event(), inq, None, gate, bus, config=STTConfig(), name="stt:fake", **kwargs)
    return stt, inq, events, gate


def partial(gate: Gate, seconds: float, deadline_s: float = 10.0, stamp: Any = None) -> PartialSpeech:
    now = time.monotonic()
    samples = np.zeros(int(seconds * 16_000), dtype=np.float32)
    return PartialSpeech(stamp or gate.stamp(1, 0), samples, 16_000, now, now + deadline_s)


def test_partials_publish_deltas_as_words_become_stable() -> None:
    stt, _, events, gate = make_stt(text="one two three four five")
    gate.turns.new_turn()
    for seconds in (1, 2, 3, 4):
        assert list(stt.process(partial(gate, seconds))) == []
    deltas = [e for e in events if isinstance(e, UserTranscriptDelta)]
    assert [d.text for d in deltas] == ["one", "one two", "one two three", "one two three four"]
    assert "".join(d.delta for d in deltas) == "one two"  # agreed by two partials and not the last word
    out = list(stt.process(SpeechSegment(gate.stamp(1, 0), np.zeros(5 * 16_000, np.float32), 16_000, 0.0, 0.0)))
    assert isinstance(out[0], Transcript) and out[0].text == "one two three four five"
    final = [e for e in events if isinstance(e, UserTranscript)]
    assert len(final) == 1 and final[0].delta == " three four five"


def test_a_partial_is_skipped_when_the_stt_is_behind() -> None:
    stt, inq, events, gate = make_stt()
    gate.turns.new_turn()
    inq.put(SpeechSegment(gate.stamp(1, 0), np.zeros(16_000, np.float32), 16_000, 0.0, 0.0))
    list(stt.process(partial(gate, 1)))
    assert stt.calls == 0 and stt.partials_skipped == 1
    assert not any(isinstance(e, UserTranscriptDelta) for e in events)


def test_a_partial_that_would_delay_the_final_is_skipped() -> None:
    stt, _, _, gate = make_stt(delay_s=0.1)
    gate.turns.new_turn()
    list(stt.process(partial(gate, 1)))  # learns that a pass takes ~100 ms
    assert stt.calls == 1
    list(stt.process(partial(gate, 1, deadline_s=0.05)))  # the final could arrive in 50 ms
    assert stt.calls == 1 and stt.partials_skipped == 1
    list(stt.process(partial(gate, 1, deadline_s=0.5)))
    assert stt.calls == 2


def test_the_final_pass_done_ahead_is_the_transcript_of_the_segment_that_ends_there() -> None:
    stt, _, events, gate = make_stt(text="one two three")
    stamp = gate.new_turn_stamp()
    now = time.monotonic()
    speech = np.zeros(3 * 16_000, np.float32)
    # the speech stopped at sample 48,000 (a partial is skipped past its deadline, this pass is not)
    list(stt.process(PartialSpeech(stamp, speech, 16_000, now, now - 1.0, speech_end_offset=48_000)))
    assert stt.calls == 1
    assert [e.text for e in events if isinstance(e, UserTranscriptDelta)] == ["one two three"]
    padded = np.zeros(3 * 16_000 + 3_200, np.float32)  # the segment: the same speech, its padding after
    out = list(stt.process(SpeechSegment(stamp, padded, 16_000, now, now, stream_end_offset=48_000)))
    assert stt.calls == 1 and stt.finals_ahead == 1  # no second pass
    assert isinstance(out[0], Transcript) and out[0].text == "one two three"
    # speech went on after that pause: the segment that ends later is transcribed anew
    list(stt.process(PartialSpeech(stamp, speech, 16_000, now, now, speech_end_offset=48_000)))
    longer = np.zeros(5 * 16_000, np.float32)
    out = list(stt.process(SpeechSegment(stamp, longer, 16_000, now, now, stream_end_offset=70_000)))
    assert stt.calls == 3 and stt.finals_ahead == 1


def test_stale_partials_are_not_transcribed() -> None:
    stt, _, _, gate = make_stt()
    stamp = gate.new_turn_stamp()
    gate.scope.cancel()
    list(stt.process(partial(gate, 1, stamp=stamp)))
    assert stt.calls == 0


def test_a_speculative_transcript_goes_on_at_once_and_is_announced_on_confirmation() -> None:
    stt, _, events, gate = make_stt()
    stt.speculation = turns = SpeculativeTurns(gate)
    stamp = gate.new_turn_stamp()
    turns.open(stamp)
    segment = SpeechSegment(stamp, np.zeros(16_000, np.float32), 16_000, 0.0, 0.0, speculative=True)
    out = list(stt.process(segment))
    assert len(out) == 1 and isinstance(out[0], Transcript)  # the LLM starts now
    assert not any(isinstance(e, UserTranscript) for e in events)  # nobody is told yet
    turns.confirm(stamp)
    assert [e.text for e in events if isinstance(e, UserTranscript)] == ["hello"]

    # superseded: never announced
    other = gate.new_turn_stamp()
    turns.open(other)
    list(stt.process(SpeechSegment(other, np.zeros(16_000, np.float32), 16_000, 0.0, 0.0, speculative=True)))
    gate.turns.revise(other.turn_id)
    turns.discard(other)
    assert [e.turn_id for e in events if isinstance(e, UserTranscript)] == [stamp.turn_id]


# -- text helpers --------------------------------------------------------------------------------
def test_transcript_deltas_follow_whisper_partials() -> None:
    deltas = TranscriptDeltas()
    partials = [
        "and Mr. John.",
        "Mr. John Dash",
        "Mr. John Dash would had",
        "Mr. John Dashwood had then",
        "Mr. John Dashwood had then leisure to-",
        "Mr. John Dashwood had then leisure to consider...",
    ]
    announced = "".join(deltas.partial(1, p) for p in partials)
    assert announced == "Mr. John Dashwood had then leisure"  # never a half-heard word ("Dash")
    rest = deltas.final(1, "And Mr. John Dashwood had then leisure to consider how much.")
    assert rest == " to consider how much."  # found again after the word the partials missed
    assert deltas.final(2, "Hello there.") == "Hello there."  # no partials: everything
    deltas.partial(3, "one two three")
    deltas.partial(3, "one two three four")
    assert deltas.final(3, "completely different") == ""  # deltas cannot be taken back


def test_trim_repeats_cuts_whisper_loops() -> None:
    assert trim_repeats("Mr. John Dash would had th th th th") == "Mr. John Dash would had th"
    assert trim_repeats("and Mr. John, Mr. John, Mr. John") == "and Mr. John,"
    assert trim_repeats("I said no no") == "I said no no"


# -- a transcript that reads finished ends the turn sooner ----------------------------------------
#: semantic endpointing: an unfinished turn ends after 30 silent chunks; the pause is reported after 4
SEMANTIC = dataclasses.replace(
    SPECULATIVE,
    turn_max_silence_ms=int(30 * MS_PER_CHUNK),
    turn_question_silence_ms=int(8 * MS_PER_CHUNK),
    turn_statement_silence_ms=int(12 * MS_PER_CHUNK),
)


def test_shorten_ends_the_turn_after_the_shorter_silence_by_text() -> None:
    endpointer = Endpointer(SEMANTIC, semantic=True)
    onset, speech = 2, 10
    results = run(endpointer, [SILENCE] * onset + [SPEECH] * speech + [SILENCE] * SPEC_CHUNKS)
    assert isinstance(results[-1][1], Speculation)
    endpointer.shorten(SEMANTIC.turn_question_silence_ms)
    ended = None
    for i in range(40):
        result = endpointer.feed(np.zeros(512, dtype=np.float32), SILENCE)
        if isinstance(result, Endpoint):
            ended = (SPEC_CHUNKS + i + 1, result)
            break
    assert ended is not None
    silent_chunks, endpoint = ended
    assert silent_chunks == 8 and endpoint.by == BY_TEXT and endpoint.confirms_speculation


def test_speech_after_shorten_restores_the_long_silence_bound() -> None:
    endpointer = Endpointer(SEMANTIC, semantic=True)
    run(endpointer, [SPEECH] * 10 + [SILENCE] * SPEC_CHUNKS)
    endpointer.shorten(SEMANTIC.turn_question_silence_ms)
    results = run(endpointer, [SPEECH] * 5 + [SILENCE] * 29)  # the user spoke on: more words to judge
    assert not [r for _, r in results if isinstance(r, Endpoint)], results
    (_, endpoint), *_ = [(i, r) for i, r in run(endpointer, [SILENCE] * 2) if isinstance(r, Endpoint)]
    assert endpoint.by == "silence"


def test_confirm_runs_its_callbacks_before_releasing_held_output() -> None:
    gate = Gate()
    turns = SpeculativeTurns(gate)
    stamp = gate.new_turn_stamp()
    turns.open(stamp)
    hold, out = hold_for(turns), []
    seen_when_announced: list[bool] = []
    turns.when_confirmed(stamp, lambda: seen_when_announced.append(not out))
    thread = passed_on(hold, TTSInput(stamp, "Jupiter."), out)
    time.sleep(0.05)
    assert not out  # held
    turns.confirm(stamp)
    thread.join(2.0)
    assert seen_when_announced == [True], "the callback ran before the held item was let through"
    assert len(out) == 1


def test_when_revision_confirmed_follows_its_revision() -> None:
    gate = Gate()
    turns = SpeculativeTurns(gate)
    ran: list[str] = []
    first = gate.new_turn_stamp()
    turns.open(first)
    turns.when_revision_confirmed(first.turn_id, first.revision, lambda: ran.append("first"))
    turns.discard(first)  # the user spoke on
    second = gate.stamp(first.turn_id, gate.turns.revise(first.turn_id))
    turns.when_revision_confirmed(first.turn_id, first.revision, lambda: ran.append("late first"))
    turns.when_revision_confirmed(second.turn_id, second.revision, lambda: ran.append("second"))
    assert ran == ["second"]  # never speculative: at once; the superseded one never


def make_upstream_stt(text: str) -> tuple[FakeSTT, StageQueue, StageQueue, Gate, SpeculativeTurns]:
    gate, bus = Gate(), EventBus()
    inq, upstream = StageQueue(8), StageQueue(8)
    speculation = SpeculativeTurns(gate)
    stt = FakeSTT(
        threading.Event(), inq, StageQueue(8), gate, bus, config=STTConfig(), name="stt:fake",
        text=text, speculation=speculation, upstream=upstream,
    )  # fmt: skip
    return stt, inq, upstream, gate, speculation


@pytest.mark.parametrize(
    ("text", "tells"),
    [("Where did I say I moved to?", True), ("I had a long day at work today.", True), ("My number is 555.", False)],
)
def test_the_stt_tells_the_vad_when_a_pause_transcript_reads_finished(text: str, tells: bool) -> None:
    stt, _, upstream, gate, speculation = make_upstream_stt(text)
    stamp = gate.new_turn_stamp()
    speculation.open(stamp)
    samples = np.zeros(16_000 * 10, dtype=np.float32)  # ten seconds: the fake says every word
    now = time.monotonic()
    segment = SpeechSegment(stamp, samples, 16_000, now, now, speculative=True)
    assert [type(item) for item in stt.process(segment)] == [Transcript]
    told = [] if upstream.empty() else [upstream.get_nowait()]
    assert bool(told) is tells
    if tells:
        assert isinstance(told[0], TranscriptEndsTurn) and told[0].stamp == stamp
        assert told[0].question is text.endswith("?")
    # an endpointed (not speculative) segment tells nothing: its turn has ended
    assert list(stt.process(SpeechSegment(gate.new_turn_stamp(), samples, 16_000, now, now)))
    assert upstream.empty()


def test_the_vad_ends_a_turn_whose_pause_transcript_reads_finished() -> None:
    # 10 chunks of speech, then 24 silent ones: without the message the turn would go on (30 chunks)
    rig = VADRig.build(SEMANTIC, vad_chunks([SPEECH] * 10 + [SILENCE] * 24))
    rig.vad.load()
    rig.vad.speculation = SpeculativeTurns(rig.gate)
    rig.vad.turn_detector = type("Unfinished", (), {"judge": lambda self, s: TurnVerdict(False, 0.1, 1.0)})()
    rig.vad.endpointer = Endpointer(SEMANTIC, semantic=True)
    out: list[Any] = []
    for item in rig.items:
        out += list(rig.vad.process(item))
        speculative = [s for s in out if isinstance(s, SpeechSegment) and s.speculative]
        if speculative and not any(isinstance(e, TurnSuperseded) for e in rig.events):
            TranscriptEndsTurn(speculative[0].stamp, question=True).apply(rig.vad)
            speculative.clear()
    stopped = [e for e in rig.events if isinstance(e, SpeechStopped)]
    assert len(stopped) == 1 and stopped[0].endpoint_by == BY_TEXT, rig.events
    assert not rig.vad.speculation.is_pending(out[0].stamp)  # confirmed: its reply goes out


@pytest.mark.parametrize(("probability", "silent_chunks"), [(0.1, 12), (0.5, 8)])
def test_a_finished_statement_the_model_leans_to_ends_after_the_questions_silence(
    probability: float, silent_chunks: int
) -> None:
    """A statement's transcript ends the turn after the statement's silence (12 chunks here), or the
    question's (8) when Smart Turn's P(done) at the pause was at least STATEMENT_LIKELY_P (0.4)."""
    rig = VADRig.build(SEMANTIC, vad_chunks([SPEECH] * 10 + [SILENCE] * 24))
    rig.vad.load()
    rig.vad.speculation = SpeculativeTurns(rig.gate)
    verdict = TurnVerdict(False, probability, 1.0)  # under the 0.7 threshold either way
    rig.vad.turn_detector = type("Unsure", (), {"judge": lambda self, s: verdict})()
    rig.vad.endpointer = Endpointer(SEMANTIC, semantic=True)
    told, ended_at = False, None
    for index, item in enumerate(rig.items):
        out = list(rig.vad.process(item))
        speculative = [s for s in out if isinstance(s, SpeechSegment) and s.speculative]
        if speculative and not told:
            TranscriptEndsTurn(speculative[0].stamp, question=False).apply(rig.vad)
            told = True
        if ended_at is None and any(isinstance(e, SpeechStopped) for e in rig.events):
            ended_at = index
    assert told and ended_at is not None, rig.events
    stopped = [e for e in rig.events if isinstance(e, SpeechStopped)]
    assert len(stopped) == 1 and stopped[0].endpoint_by == BY_TEXT
    per_item = len(rig.items[0].samples) // 512  # chunks of 512 samples in each item
    assert (ended_at + 1) * per_item - 10 == silent_chunks
