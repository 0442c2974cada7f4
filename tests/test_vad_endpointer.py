"""Endpointing on synthetic chunk probabilities, and the VAD stage around it."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import (
    Event,
    FirstAudio,
    ResponseStarted,
    SpeechDiscarded,
    SpeechStarted,
    SpeechStopped,
    StageError,
)
from speech_to_speech.core.messages import END_OF_STREAM, AudioChunk, SpeechSegment
from speech_to_speech.testing.fakes import FakeVAD, VADRig, vad_chunks
from speech_to_speech.turns.interruptions import Interruptions
from speech_to_speech.turns.vad import CHUNK_SAMPLES, SAMPLE_RATE, Endpoint, Endpointer, VADConfig

MS_PER_CHUNK = 1000 * CHUNK_SAMPLES / SAMPLE_RATE  # 32 ms

SILENCE, SPEECH, WEAK = 0.0, 0.9, 0.4  # WEAK: below the start threshold, above the stop threshold

# in chunks: 5 of speech minimum, 10 of silence to end a turn, 3 of padding, 100 at most
CONFIG = VADConfig(
    vad_threshold=0.5,
    min_silence_ms=int(10 * MS_PER_CHUNK),
    min_speech_ms=int(5 * MS_PER_CHUNK),
    speech_pad_ms=int(3 * MS_PER_CHUNK),
    max_speech_ms=int(100 * MS_PER_CHUNK),
    speculative_silence_ms=0,  # plain endpointing here; speculative turns and partials are tested below
    partial_interval_ms=0,
)
PAD, SILENCE_CHUNKS = 3, 10


def marked(index: int) -> np.ndarray:
    """A chunk whose every sample holds its own index, so segments can be decoded back to chunk indices."""
    return np.full(CHUNK_SAMPLES, float(index), dtype=np.float32)


def chunk_indices(samples: np.ndarray) -> list[int]:
    assert samples.dtype == np.float32
    assert len(samples) % CHUNK_SAMPLES == 0
    blocks = samples.reshape(-1, CHUNK_SAMPLES)
    assert (blocks == blocks[:, :1]).all(), "chunks must be kept whole"
    return [int(v) for v in blocks[:, 0]]


def run(endpointer: Endpointer, probabilities: list[float]) -> list[tuple[int, str | Endpoint]]:
    """Feed one marked chunk per probability; return (chunk index, result) for every non-None result."""
    results = []
    for i, p in enumerate(probabilities):
        result = endpointer.feed(marked(i), p)
        if result is not None:
            results.append((i, result))
    return results


def endpoints(results: list[tuple[int, str | Endpoint]]) -> list[Endpoint]:
    return [r for _, r in results if isinstance(r, Endpoint)]


def test_speech_shorter_than_min_speech_is_ignored() -> None:
    endpointer = Endpointer(CONFIG)
    results = run(endpointer, [SILENCE] * 5 + [SPEECH] * 4 + [SILENCE] * 30)
    assert [r for _, r in results] == ["start"]
    assert not endpointer.in_speech
    assert endpointer.flush() is None


def test_speech_then_silence_yields_one_endpoint_with_preroll_and_padding() -> None:
    onset, speech, trailing = 20, 10, 25
    endpointer = Endpointer(CONFIG)
    results = run(endpointer, [SILENCE] * onset + [SPEECH] * speech + [SILENCE] * trailing)

    assert results[0] == (onset, "start")
    found = endpoints(results)
    assert len(found) == 1
    assert len(results) == 2
    # decided as soon as min_silence_ms of silence followed the speech
    assert results[1][0] == onset + speech + SILENCE_CHUNKS - 1

    indices = chunk_indices(found[0].samples)
    last_speech = onset + speech - 1
    assert indices == list(range(onset - PAD, last_speech + PAD + 1))  # pre-roll, speech, end padding
    assert found[0].speech_end_offset == (last_speech + 1) * CHUNK_SAMPLES
    assert endpointer.flush() is None


def test_no_preroll_beyond_stream_start() -> None:
    endpointer = Endpointer(CONFIG)
    found = endpoints(run(endpointer, [SILENCE] + [SPEECH] * 8 + [SILENCE] * 12))
    assert len(found) == 1
    assert chunk_indices(found[0].samples) == list(range(0, 9 + PAD))


def test_short_pause_and_weak_chunks_stay_in_one_utterance() -> None:
    probabilities = [SILENCE] * 5 + [SPEECH] * 6 + [SILENCE] * 5 + [WEAK] * 2 + [SPEECH] * 3 + [SILENCE] * 15
    endpointer = Endpointer(CONFIG)
    results = run(endpointer, probabilities)
    assert [r for _, r in results if isinstance(r, str)] == ["start"]
    found = endpoints(results)
    assert len(found) == 1
    last_speech = 5 + 6 + 5 + 2 + 3 - 1
    assert chunk_indices(found[0].samples) == list(range(5 - PAD, last_speech + PAD + 1))


def test_preroll_for_speech_resuming_right_after_an_endpoint() -> None:
    # the turn ends on the 10th silent chunk and the user speaks again at once: the next
    # utterance still gets its pre-roll, taken from the silence that the first one trimmed
    probabilities = [SILENCE] * 10 + [SPEECH] * 8 + [SILENCE] * SILENCE_CHUNKS + [SPEECH] * 8 + [SILENCE] * 12
    found = endpoints(run(Endpointer(CONFIG), probabilities))
    assert len(found) == 2
    first, second = (chunk_indices(e.samples) for e in found)
    assert first == list(range(10 - PAD, 18 + PAD))
    onset = 10 + 8 + SILENCE_CHUNKS
    assert second == list(range(onset - PAD, onset + 8 + PAD))
    assert not set(first) & set(second)


def test_weak_chunks_do_not_start_speech() -> None:
    endpointer = Endpointer(CONFIG)
    assert run(endpointer, [WEAK] * 40) == []
    assert not endpointer.in_speech


def test_flush_returns_utterance_in_progress() -> None:
    endpointer = Endpointer(CONFIG)
    results = run(endpointer, [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 5)
    assert endpoints(results) == []
    assert endpointer.in_speech
    end = endpointer.flush()
    assert isinstance(end, Endpoint)
    # trailing silence is trimmed to the padding here too
    assert chunk_indices(end.samples) == list(range(4 - PAD, 4 + 8 + PAD))
    assert not endpointer.in_speech
    assert endpointer.flush() is None


def test_flush_drops_too_short_utterance() -> None:
    endpointer = Endpointer(CONFIG)
    run(endpointer, [SPEECH] * 3)
    assert endpointer.flush() is None


def test_max_speech_cuts_and_loses_nothing() -> None:
    total, max_chunks = 50, 20
    endpointer = Endpointer(dataclasses.replace(CONFIG, max_speech_ms=int(max_chunks * MS_PER_CHUNK)))
    results = run(endpointer, [SPEECH] * total)
    found = endpoints(results)
    assert len(found) == total // max_chunks
    assert all(len(e.samples) == max_chunks * CHUNK_SAMPLES for e in found)
    tail = endpointer.flush()
    assert tail is not None
    pieces = [*found, tail]
    assert [i for e in pieces for i in chunk_indices(e.samples)] == list(range(total))


def test_threshold_must_be_a_probability() -> None:
    with pytest.raises(ValueError):
        Endpointer(VADConfig(vad_threshold=1.5))


# -- the VAD stage ---------------------------------------------------------------------------


def run_vad(
    items: list[AudioChunk], config: VADConfig = CONFIG, gate: Gate | None = None
) -> tuple[list[object], list[Event], Gate, FakeVAD]:
    """Run a :class:`FakeVAD` on ``items`` to the end of the stream: what it sent, its events, gate and stage."""
    rig = VADRig.build(config, items, out_size=16, gate=gate)
    out = rig.run(timeout_s=2.0)
    return out, rig.events, rig.gate, rig.vad


def test_vad_stage_emits_one_segment_with_fresh_turn() -> None:
    probabilities = [SILENCE] * 10 + [SPEECH] * 10 + [SILENCE] * 16
    items = vad_chunks(probabilities)
    out, events, gate, vad = run_vad(items)

    assert vad.scored == len(probabilities)  # 1024-sample items were re-blocked into 512-sample chunks
    assert out[-1] is END_OF_STREAM
    segments = out[:-1]
    assert len(segments) == 1
    segment = segments[0]
    assert isinstance(segment, SpeechSegment)
    assert segment.sample_rate == SAMPLE_RATE
    assert len(segment.samples) == (10 + 2 * PAD) * CHUNK_SAMPLES
    assert segment.stamp.turn_id == 1 and segment.stamp.revision == 0
    assert segment.stamp.generation == gate.scope.generation
    assert gate.admits(segment.stamp)
    assert gate.turns.latest_revision(segment.stamp.turn_id) == 0
    assert segment.stream_end_offset == 20 * CHUNK_SAMPLES
    # the speech ends with the segment's last loud 20 ms frame (core.audio.speech_end_index): the
    # segment starts at stream sample 3584, so at sample 3584 + 21 x 320 = 10304, which arrived in
    # item 10 (samples 10240-11263, its time that of its last sample)
    assert segment.speech_end_time == pytest.approx(items[10].time - (11264 - 10304) / SAMPLE_RATE)
    assert segment.endpoint_time >= segment.speech_end_time

    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechStopped]
    assert all(e.turn_id == segment.stamp.turn_id for e in events)
    stopped = events[1]
    assert isinstance(stopped, SpeechStopped)
    assert stopped.duration_ms == pytest.approx(1000 * len(segment.samples) / SAMPLE_RATE)
    assert stopped.endpoint_delay_ms >= 0


def test_vad_stage_new_turn_per_utterance_and_flush_at_end() -> None:
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 12 + [SPEECH] * 2 + [SILENCE] * 12 + [SPEECH] * 6
    no_grace = dataclasses.replace(CONFIG, turn_grace_ms=0)
    out, events, _, _ = run_vad(vad_chunks(probabilities, per_item=3), no_grace)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    # the 2-chunk blip is noise; the last utterance is still in progress at the end and is flushed
    assert len(segments) == 2
    assert segments[0].stamp.turn_id < segments[1].stamp.turn_id
    assert len(segments[1].samples) == (PAD + 6) * CHUNK_SAMPLES
    stopped = [e.turn_id for e in events if isinstance(e, SpeechStopped)]
    assert stopped == [s.stamp.turn_id for s in segments]
    assert out[-1] is END_OF_STREAM


def test_vad_stage_reports_wrong_sample_rate() -> None:
    bad = AudioChunk(np.zeros(CHUNK_SAMPLES, dtype=np.float32), 8_000, time.monotonic())
    out, events, _, _ = run_vad([bad, *vad_chunks([SPEECH] * 8)])
    errors = [e for e in events if isinstance(e, StageError)]
    assert len(errors) == 1 and "16000" in errors[0].message
    assert sum(isinstance(item, SpeechSegment) for item in out) == 1  # it carried on


def test_speech_resuming_within_grace_reopens_the_turn() -> None:
    # 12 silent chunks end the first utterance; speech resumes 2 chunks (64 ms) later
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 14 + [SPEECH] * 6 + [SILENCE] * 14
    out, events, gate, _ = run_vad(vad_chunks(probabilities), dataclasses.replace(CONFIG, turn_grace_ms=500))
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    assert len(segments) == 2
    first, second = segments
    assert second.stamp.turn_id == first.stamp.turn_id and second.stamp.revision == first.stamp.revision + 1
    assert not gate.admits(first.stamp) and gate.admits(second.stamp)  # the first revision is superseded
    assert len(second.samples) > len(first.samples)  # transcribed together with the earlier audio
    assert np.array_equal(second.samples[: len(first.samples)], first.samples)
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    assert [e.revision for e in starts] == [0, 1]


def test_speech_resuming_within_grace_does_not_reopen_a_turn_whose_reply_is_audible() -> None:
    """Local mode, speakers on: the reply's first sound comes ~150 ms after the endpoint, before the
    echo canceller has found its echo; that echo, heard as speech within the grace, reopened the
    turn and cancelled its own reply (3 of 8 stories in the room benchmark). Once the reply is
    audible, speech is judged over it (paused, words decide) and the reply stays valid."""
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 14 + [SPEECH] * 6 + [SILENCE] * 14
    rig = VADRig.build(dataclasses.replace(CONFIG, turn_grace_ms=500), vad_chunks(probabilities), out_size=16)
    rig.vad.interruptions = Interruptions(rig.bus)
    rig.bus.subscribe(rig.vad.replies.on_event)  # the pipeline: ReplyProgress messages, in the VAD's thread
    answered: list[int] = []

    def reply_plays_at_the_endpoint(event: Event) -> None:
        if isinstance(event, SpeechStopped) and not answered:
            answered.append(event.turn_id)
            rig.bus.publish(ResponseStarted(event.turn_id))
            rig.bus.publish(FirstAudio(event.turn_id))

    rig.bus.subscribe(reply_plays_at_the_endpoint)
    out = rig.run(timeout_s=2.0)
    first = next(item for item in out if isinstance(item, SpeechSegment))
    starts = [e for e in rig.events if isinstance(e, SpeechStarted)]
    assert [(e.turn_id == first.stamp.turn_id, e.revision, e.pauses_reply) for e in starts] == [
        (True, 0, False),
        (False, 0, True),
    ]
    assert rig.gate.admits(first.stamp)  # the reply to it is not cancelled


def test_speech_after_grace_is_a_new_turn_and_barges_in() -> None:
    gate = Gate()
    earlier = gate.new_turn_stamp()  # e.g. a reply still being spoken
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 40 + [SPEECH] * 6 + [SILENCE] * 14
    out, _, gate, _ = run_vad(vad_chunks(probabilities), dataclasses.replace(CONFIG, turn_grace_ms=300), gate)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    assert len(segments) == 2 and segments[0].stamp.turn_id != segments[1].stamp.turn_id
    assert not gate.admits(earlier)  # speech start bumped the generation
    assert segments[1].stamp.generation > segments[0].stamp.generation


def test_no_barge_in_when_interrupt_response_is_off() -> None:
    gate = Gate()
    earlier = gate.new_turn_stamp()
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 14
    run_vad(vad_chunks(probabilities), dataclasses.replace(CONFIG, interrupt_response=False), gate)
    assert gate.admits(earlier)


def test_speech_that_never_pauses_is_cut_into_turns_of_at_most_max_speech() -> None:
    """Continuous speech (babble: other people talking in the room) is cut every ``max_speech_ms``
    into turns of their own: a cut is no pause, so the speech after it does not reopen the turn and
    grow it without bound (it grew by 30 s a cut, to a 300 s turn and a 28 s STT pass, in babble)."""
    max_chunks = 20
    config = dataclasses.replace(CONFIG, max_speech_ms=int(max_chunks * MS_PER_CHUNK), turn_grace_ms=700)
    out, _, _, _ = run_vad(vad_chunks([SILENCE] * 5 + [SPEECH] * 90 + [SILENCE] * 20), config)
    segments = [item for item in out if isinstance(item, SpeechSegment)]
    lengths = [len(s.samples) for s in segments]
    assert len(segments) >= 4
    assert all(length <= (max_chunks + PAD) * CHUNK_SAMPLES for length in lengths), lengths
    assert len({s.stamp.turn_id for s in segments}) == len(segments)


def test_the_end_of_speech_is_the_last_frame_within_30_db_of_the_peak() -> None:
    """core.audio.speech_end_index, the one definition of the end of speech (the VAD's and every
    benchmark's): a breath 40 dB below the speech after it is not speech; the speech's own last
    frame is, to the 20 ms frame."""
    from speech_to_speech.core.audio import speech_end_index

    rng = np.random.default_rng(0)
    samples = (0.0005 * rng.standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
    t = np.arange(12_000) / SAMPLE_RATE
    samples[8_000:20_000] += (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)  # speech, 0.5-1.25 s
    samples[20_000:24_000] += (0.003 * np.sin(2 * np.pi * 220 * t[:4_000])).astype(np.float32)  # -40 dB
    end = speech_end_index(samples, SAMPLE_RATE)
    assert end is not None and 20_000 <= end <= 20_000 + 320
    assert speech_end_index(np.zeros(100, np.float32), SAMPLE_RATE) is None  # not one whole frame


@pytest.mark.parametrize("index", range(5))
def test_digital_silence_around_real_speech_does_not_move_its_end(index: int) -> None:
    """A LibriVox clip padded with zeros (a file's padding, a quiet sound server) ends where the clip
    alone does: its own background after the last word is the floor, not speech (it was 20-380 ms
    of speech when the zeros made the floor 0)."""
    import soundfile as sf

    from speech_to_speech.core.audio import speech_end_index
    from speech_to_speech.testing.speech_data import librivox_clips

    clips = list(librivox_clips())
    if index >= len(clips):
        pytest.skip("pocketsphinx-testdata's LibriVox clips are not installed")
    speech, rate = sf.read(str(clips[index]), dtype="float32")
    alone = speech_end_index(speech, rate)
    padded = np.concatenate([np.zeros(rate // 2, np.float32), speech, np.zeros(rate, np.float32)])
    assert alone is not None and speech_end_index(padded, rate) == rate // 2 + alone


def test_a_blip_that_paused_a_reply_is_dropped_after_a_short_silence() -> None:
    """A blip of the voice's echo that paused a reply gives it back after SHORT_SPEECH_DROP_MS of
    silence (5 chunks), not min_silence_ms (10 here): the reply's stutter is that much shorter."""
    endpointer = Endpointer(CONFIG)
    assert run(endpointer, [SILENCE] * 3 + [SPEECH]) == [(3, "start")]
    endpointer.drop_short_after()  # the VAD does this when the speech pauses a reply
    run(endpointer, [SPEECH] + [SILENCE] * 4)
    assert endpointer.in_speech
    run(endpointer, [SILENCE])
    assert not endpointer.in_speech  # dropped: too short to be a turn


def test_a_word_that_paused_a_reply_keeps_the_silence_bound() -> None:
    """Longer than a blip (BLIP_MS): "Wait," of "Wait, stop." must not be dropped at its comma."""
    endpointer = Endpointer(CONFIG)
    run(endpointer, [SPEECH])
    endpointer.drop_short_after()
    run(endpointer, [SPEECH] * 3 + [SILENCE] * 9)
    assert endpointer.in_speech
    assert endpoints(run(endpointer, [SPEECH] * 4 + [SILENCE] * SILENCE_CHUNKS))  # "stop.": one turn


def test_the_vad_drops_a_blip_during_a_reply_soon() -> None:
    """Through the stage: a 2-chunk blip during a reply, 7 silent chunks, then words. The blip is
    dropped (too short) before the words, which pause the reply again as speech of their own;
    with the 10-chunk bound the words would have joined the blip's utterance."""
    probabilities = [SILENCE] * 4 + [SPEECH] * 8 + [SILENCE] * 14  # the user's turn, then its reply plays
    probabilities += [SPEECH] * 2 + [SILENCE] * 7 + [SPEECH] * 8 + [SILENCE] * 14
    rig = VADRig.build(CONFIG, vad_chunks(probabilities), out_size=16)
    rig.vad.interruptions = Interruptions(rig.bus)
    rig.bus.subscribe(rig.vad.replies.on_event)  # the pipeline: ReplyProgress messages, in the VAD's thread

    def reply_plays_at_the_endpoint(event: Event) -> None:
        if isinstance(event, SpeechStopped) and not any(isinstance(e, ResponseStarted) for e in rig.events):
            rig.bus.publish(ResponseStarted(event.turn_id))
            rig.bus.publish(FirstAudio(event.turn_id))

    rig.bus.subscribe(reply_plays_at_the_endpoint)
    rig.run(timeout_s=2.0)
    kinds = [type(e).__name__ for e in rig.events if isinstance(e, (SpeechStarted, SpeechDiscarded))]
    assert kinds == ["SpeechStarted", "SpeechStarted", "SpeechDiscarded", "SpeechStarted"], kinds
    assert [e.pauses_reply for e in rig.events if isinstance(e, SpeechStarted)] == [False, True, True]
