"""The assistant's own voice heard back by the microphone (echo), without models: the playback
reference, the VAD's echo gate, the judge's echo check, and where the pipeline wires them.
The browser in a room with a real echo is ``tests/test_browser_echo.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.audio import CHUNK_SAMPLES, SAMPLE_RATE
from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import (
    BargeIn,
    EventBus,
    FirstAudio,
    ReplyResumed,
    ReplyWords,
    ResponseStarted,
    SpeechStarted,
    UserTranscriptDelta,
)
from speech_to_speech.core.messages import END_OF_STREAM, AudioChunk, EndOfResponse
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.pipeline.builder import SESSION, Ends, build
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.realtime.media import OutputAudioBuffer
from speech_to_speech.speech.playback import REFERENCE_BLOCK_S, PlaybackReference
from speech_to_speech.testing.fakes import FakeVAD, RecordingSink
from speech_to_speech.testing.judge import JudgeRig
from speech_to_speech.turns.backchannel import is_echo
from speech_to_speech.turns.echo import LEARN_MIN_CHUNKS, MAX_DELAY_S, EchoGate
from speech_to_speech.turns.vad import BaseVADHandler
from tests.helpers import responses_api_flags, wait_until
from tests.test_playback import audio, rig_factory  # noqa: F401 (rig_factory: a fixture)
from tests.test_vad_endpointer import CONFIG

STORY = "Once upon a time there was a small village by the sea. Every morning the fishermen rowed out."
RNG = np.random.default_rng(7)


def noise(level: float, samples: int = CHUNK_SAMPLES) -> np.ndarray:
    """Gaussian noise of RMS ``level`` (float32)."""
    return (RNG.standard_normal(samples) * level).astype(np.float32)


def voice(reference: PlaybackReference, seconds: float, level: float, start: float) -> None:
    """The assistant's voice played from ``start`` for ``seconds`` at RMS ``level``."""
    reference.add(noise(level, round(seconds * SAMPLE_RATE)), SAMPLE_RATE, start)


def feed(gate: EchoGate, chunks: list[np.ndarray], start: float, probability: float = 0.9) -> list[float]:
    """The gate's scores of 32 ms chunks arriving one after another from ``start``."""
    step = CHUNK_SAMPLES / SAMPLE_RATE
    return [gate.filter(chunk, start + i * step, probability) for i, chunk in enumerate(chunks)]


# -- the playback reference ----------------------------------------------------------------------------
def test_the_reference_keeps_the_voice_level_per_block_and_when_it_played() -> None:
    reference = PlaybackReference()
    reference.add(np.full(SAMPLE_RATE // 2, 0.1, dtype=np.float32), SAMPLE_RATE, start=100.0)
    reference.add(np.full(SAMPLE_RATE // 2, 0.4, dtype=np.float32), SAMPLE_RATE, start=100.5)
    assert reference.level(100.0, 100.4) == pytest.approx(0.1)
    assert reference.level(100.0, 101.0) == pytest.approx(0.4)
    assert reference.level(101.0 + REFERENCE_BLOCK_S, 102.0) == 0.0  # nothing played then
    assert reference.level(99.0, 99.9) == 0.0
    reference.add(np.zeros(160, dtype=np.float32), SAMPLE_RATE, start=200.0)  # much later
    assert reference.level(100.0, 101.0) == 0.0, "levels older than a few seconds are let go"


def test_the_webrtc_track_records_the_voice_as_it_leaves() -> None:
    reference = PlaybackReference()
    media = OutputAudioBuffer(rate=48_000, reference=reference)
    before = time.monotonic()
    media.next_frame()  # nothing queued: silence leaves, no voice
    assert reference.level(before - 1, time.monotonic() + 1) == 0.0
    media.push(np.full(960 * 3, 0.25, dtype=np.float32))
    media.next_frame()
    assert reference.level(before - 1, time.monotonic() + 1) == pytest.approx(0.25)


# -- the echo gate -----------------------------------------------------------------------------------------
def test_no_voice_within_the_echo_delay_leaves_every_score_alone() -> None:
    reference = PlaybackReference()
    gate = EchoGate(reference)
    assert feed(gate, [noise(0.05)] * 3, start=50.0) == [0.9, 0.9, 0.9]
    voice(reference, 1.0, 0.1, start=50.0)
    later = 51.0 + MAX_DELAY_S + 0.05  # the voice ended longer ago than any echo takes
    assert feed(gate, [noise(0.001)] * 3, start=later) == [0.9, 0.9, 0.9]


def test_an_uncancelled_echo_is_set_aside_and_the_user_over_it_is_heard() -> None:
    reference, now = PlaybackReference(), 10.0
    voice(reference, 4.0, 0.1, start=now)
    gate = EchoGate(reference)
    # 2 s of the voice coming back at -9 dB (an echo with no canceller): never speech
    echo = [noise(0.1 * 0.35) for _ in range(62)]
    assert set(feed(gate, echo, start=now + 0.25)) == {0.0}
    assert gate.rejected == len(echo)
    assert 0.2 < gate.coupling < 0.5, gate.coupling
    # the user talks over it as loud as the voice: heard
    user = [noise(0.1 * 0.35) + noise(0.1) for _ in range(5)]
    assert feed(gate, user, start=now + 2.3) == [0.9] * 5


def test_with_an_echo_canceller_even_quiet_speech_over_the_voice_is_heard() -> None:
    reference, now = PlaybackReference(), 20.0
    voice(reference, 4.0, 0.1, start=now)
    gate = EchoGate(reference)
    cancelled = [noise(1e-5) for _ in range(LEARN_MIN_CHUNKS + 10)]  # what AEC3 leaves of the voice
    feed(gate, cancelled, start=now + 0.25, probability=0.0)
    assert gate.coupling < 1e-3
    assert feed(gate, [noise(0.005)], start=now + 1.5) == [0.9]  # speech 26 dB under the voice


def test_before_the_echo_is_measured_the_voice_itself_is_the_bar() -> None:
    reference, now = PlaybackReference(), 30.0
    voice(reference, 1.0, 0.1, start=now)
    gate = EchoGate(reference)
    assert feed(gate, [noise(0.09)], start=now + 0.1) == [0.0]  # as loud as the voice: could be its echo
    assert feed(gate, [noise(0.3)], start=now + 0.2) == [0.9]  # 10 dB louder than the voice: the user


def test_the_users_speech_does_not_teach_the_gate_the_echo_is_loud() -> None:
    reference, now = PlaybackReference(), 40.0
    voice(reference, 4.0, 0.1, start=now)
    gate = EchoGate(reference)
    feed(gate, [noise(1e-5) for _ in range(LEARN_MIN_CHUNKS + 10)], start=now, probability=0.0)
    quiet = gate.coupling
    step = CHUNK_SAMPLES / SAMPLE_RATE
    for i in range(60):  # an utterance over the voice, 2 s
        gate.filter(noise(0.1), now + 1.2 + i * step, 0.9, in_speech=True)
    assert gate.coupling == quiet


def test_the_rooms_noise_is_not_learned_as_echo() -> None:
    """Music in the room 20 dB under the voice, the echo cancelled: speech 10 dB over the music is
    heard over the voice; the echo of a voice with no canceller over the same music is not."""
    reference, now = PlaybackReference(), 60.0
    gate = EchoGate(reference)
    music = 0.1 * 10 ** (-20 / 20)
    feed(gate, [noise(music) for _ in range(60)], start=now - 2.0, probability=0.1)  # before the reply
    assert gate.room_power == pytest.approx(music**2, rel=0.3)
    # the soft edges of the user's words (scored between noise and talk) are not the room's level
    feed(gate, [noise(music * 10) for _ in range(10)], start=now - 0.05 - 10 * 0.032, probability=0.3)
    assert gate.room_power == pytest.approx(music**2, rel=0.3)
    voice(reference, 6.0, 0.1, start=now)
    # the music goes on under the voice; the canceller leaves nothing of the voice above it
    feed(gate, [noise(music) for _ in range(LEARN_MIN_CHUNKS + 30)], start=now + 0.25, probability=0.1)
    assert gate.coupling < 0.03, gate.coupling  # under -30 dB, not the music's -20 dB
    user = [noise(music) + noise(music * 10 ** (10 / 20)) for _ in range(5)]  # 10 dB over the music
    assert feed(gate, user, start=now + 2.5) == [0.9] * 5
    # the same room with no canceller: the echo at -9 dB of the voice is still set aside
    uncancelled = EchoGate(reference)
    feed(uncancelled, [noise(music) for _ in range(60)], start=now - 2.0, probability=0.1)
    echo = [noise(music) + noise(0.1 * 0.35) for _ in range(62)]
    assert set(feed(uncancelled, echo, start=now + 0.25)) == {0.0}


def test_a_room_that_talks_keeps_its_level_in() -> None:
    """Other people talking (the VAD scores the room as speech): their level is not taken out, so
    the gate's bar goes on holding them back under the voice."""
    reference, now = PlaybackReference(), 70.0
    gate = EchoGate(reference)
    talk = 0.1 * 10 ** (-20 / 20)
    feed(gate, [noise(talk) for _ in range(60)], start=now - 2.0, probability=0.9)
    assert gate.room_power == 0.0
    voice(reference, 6.0, 0.1, start=now)
    feed(gate, [noise(talk) for _ in range(LEARN_MIN_CHUNKS + 30)], start=now + 0.25, probability=0.9)
    assert gate.coupling > 0.05, gate.coupling  # the talk under the voice is the bar
    assert feed(gate, [noise(talk)], start=now + 2.5) == [0.0]


def test_the_vad_asks_the_gate_about_every_chunk() -> None:
    reference, now = PlaybackReference(), time.monotonic()
    voice(reference, 3.0, 1.0, start=now - 1.0)
    gate, bus, events = Gate(), EventBus(), []
    bus.subscribe(events.append)
    inq, outq = StageQueue(64), StageQueue(64)
    vad = FakeVAD(threading.Event(), inq, outq, gate, bus, config=CONFIG, name="vad:fake", echo=EchoGate(reference))
    # FakeVAD scores a chunk by its first sample: 0.9 everywhere, an RMS of 0.9 (under the voice's 1.0)
    for i in range(20):
        inq.put(AudioChunk(np.full(CHUNK_SAMPLES, 0.9, dtype=np.float32), SAMPLE_RATE, now, i * CHUNK_SAMPLES))
    inq.put(END_OF_STREAM)
    vad.start()
    vad.join(5)
    assert not [e for e in events if isinstance(e, SpeechStarted)], "the echo started a turn"
    assert vad.echo is not None and vad.echo.rejected == 20


# -- the words: is_echo and the judge ----------------------------------------------------------------------
@pytest.mark.parametrize("heard", ["Once a pot.", "Once upon a time.", "the fishermen rowed out", "Sure. Go ahead."])
def test_a_transcript_of_the_voices_own_words_is_its_echo(heard: str) -> None:
    assert is_echo(heard, STORY + " Sure, go ahead.")


@pytest.mark.parametrize(
    "heard",
    [
        "And Mr. John Dashwood had then leisure to consider how much there might be prudently in his power.",
        "Wait, stop.",
        "What about the city?",
        "",
    ],
)
def test_other_words_are_not(heard: str) -> None:
    assert not is_echo(heard, STORY)
    assert not is_echo("Once upon a time.", "")


def judge(hears_voice: bool) -> JudgeRig:
    """The judge, with the story playing as its reply."""
    rig = JudgeRig.build(hears_voice=hears_voice)
    rig.bus.publish(ReplyWords(rig.reply, text=STORY, at=time.monotonic()))
    return rig


def test_an_echo_of_the_reply_resumes_it_where_the_input_hears_the_voice() -> None:
    j = judge(hears_voice=True)
    turn = j.gate.new_turn_stamp().turn_id
    j.bus.publish(SpeechStarted(turn, pauses_reply=True))
    j.bus.publish(UserTranscriptDelta(turn, text="Once upon a time there"))  # a long partial of the echo
    assert not j.of(BargeIn)
    assert not j.transcript(turn, "Once upon a time.")
    assert [(e.reason, e.text) for e in j.of(ReplyResumed)] == [("echo", "Once upon a time.")]


def test_where_the_input_cannot_hear_the_voice_the_same_words_interrupt() -> None:
    j = judge(hears_voice=False)
    turn = j.gate.new_turn_stamp().turn_id
    j.bus.publish(SpeechStarted(turn, pauses_reply=True))
    assert j.transcript(turn, "Once upon a time?")
    assert [e.reason for e in j.of(BargeIn)] == ["words"]


def test_the_sink_publishes_the_words_as_their_audio_plays(rig_factory: Callable[..., Any]) -> None:  # noqa: F811
    rig = rig_factory(RecordingSink, sample_rate=16_000)
    rig.sink.start()
    stamp = rig.gate.new_turn_stamp()
    rig.feed(audio(stamp, 0.2, text="Once upon a time. "), audio(stamp, 0.2), EndOfResponse(stamp, text="x"))
    assert wait_until(lambda: bool(rig.log.of(ReplyWords)), 10)
    rig.finish()
    (words,) = rig.log.of(ReplyWords)
    assert words.text == "Once upon a time. " and words.at == pytest.approx(rig.sink.writes[0].start)


# -- where the pipeline wires them ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("playback", "flag", "gated"), [(True, "true", True), (True, "false", False), (False, "true", False)]
)
def test_the_vad_gets_the_gate_only_where_the_sink_has_a_reference(playback: bool, flag: str, gated: bool) -> None:
    backends = ["--stt", "fake-stt", "--tts", "fake-tts", *responses_api_flags("http://127.0.0.1:9/v1")]
    args = parse_args([*backends, "--echo_gate", flag])
    ends = Ends(lambda q, shared: RecordingSink(input_queue=q, sample_rate=24_000, **shared.kwargs), source=None)
    if playback:
        ends = Ends(ends.sink, source=None, playback=PlaybackReference())
    pipeline = build(args, ends, SESSION)
    vad = pipeline.stage("vad", BaseVADHandler)
    assert (vad.echo is not None) is gated
    assert pipeline.interruptions is not None and pipeline.interruptions.hears_voice is gated


def test_the_pipeline_tells_the_vad_and_the_judge_in_their_own_queues() -> None:
    """A reply's progress reaches the VAD, and the judge's events the judge, as messages ahead of
    their data, applied in their threads: publishing changes neither stage."""
    backends = ["--stt", "fake-stt", "--tts", "fake-tts", *responses_api_flags("http://127.0.0.1:9/v1")]
    ends = Ends(lambda q, shared: RecordingSink(input_queue=q, sample_rate=24_000, **shared.kwargs), source=None)
    pipeline = build(parse_args(backends), ends, SESSION)
    vad, judge = pipeline.stage("vad", BaseVADHandler), pipeline.stage("judge")
    assert vad.input_queue is not None and judge.input_queue is not None
    pipeline.inputs["audio"].put("an audio block")
    pipeline.bus.publish(ResponseStarted(7))
    pipeline.bus.publish(FirstAudio(7))
    pipeline.bus.publish(SpeechStarted(8, pauses_reply=True))
    assert vad.replies.turns() == [] and pipeline.interruptions is not None and not pipeline.interruptions.paused
    queued = [vad.input_queue.get_nowait() for _ in range(vad.input_queue.qsize())]
    assert [type(m).__name__ for m in queued] == ["ReplyProgress", "ReplyProgress", "str"]
    for message in queued[:2]:
        message.apply(vad)
    assert vad.replies.audible() == [7]
    events = [judge.input_queue.get_nowait() for _ in range(judge.input_queue.qsize())]
    assert [type(m.event).__name__ for m in events] == ["ResponseStarted", "FirstAudio", "SpeechStarted"]  # in order
    for message in events:
        message.apply(judge)
    assert pipeline.interruptions.pending == [8] and pipeline.interruptions.replies.audible() == [7]
