"""Other people talking in the room are not the user (speech_to_speech/turns/background.py).

Real speech through Silero VAD and the VAD stage's endpointer: each LibriVox clip read over the
other four mixed as babble, or over pink noise, at 10 dB SNR, with the noise before and after it.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import soundfile as sf

from handlers.vad.silero_vad import SileroVADHandler
from speech_to_speech.core.events import SpeechStarted, SpeechStopped
from speech_to_speech.core.messages import AudioChunk
from speech_to_speech.pipeline.builder import Ends, _background
from speech_to_speech.pipeline.running import PipelineError
from speech_to_speech.testing.noise import make_noise, speech_rms
from speech_to_speech.testing.runs import BusLog, new_stage
from speech_to_speech.testing.speech_data import librivox_clips
from speech_to_speech.turns.background import BackgroundGate
from speech_to_speech.turns.vad import SAMPLE_RATE, VADConfig

pytestmark = pytest.mark.models
CLIPS = list(librivox_clips())
#: the noise heard before and after the reader, s
AROUND_S = 4.0
#: the room's level under the reader, dB (issue 29's rooms)
SNR_DB = 10.0

needs_five_readers = pytest.mark.skipif(len(CLIPS) < 5, reason="babble needs pocketsphinx-testdata's 5 LibriVox clips")


def heard(audio: np.ndarray, gate: bool | BackgroundGate) -> list[tuple[float, float]]:
    """The turns the VAD stage finds in ``audio`` (16 kHz float32), as (start, end) in s, with a
    new gate (True), none (False) or the one given."""
    config = VADConfig(turn_grace_ms=0, speculative_silence_ms=0)
    background = gate if isinstance(gate, BackgroundGate) else BackgroundGate() if gate else None
    vad = new_stage(SileroVADHandler, config=config, background=background)
    vad.load()
    log = BusLog(vad.bus)
    block = 1_600  # 100 ms, as a microphone delivers
    for start in range(0, len(audio), block):
        list(vad.process(AudioChunk(audio[start : start + block], SAMPLE_RATE, 0.0)))
    list(vad.on_end_of_stream())
    starts = [event.audio_ms / 1000 for event in log.of(SpeechStarted)]
    ends = [event.audio_ms / 1000 for event in log.of(SpeechStopped)]
    return list(zip(starts, ends + [len(audio) / SAMPLE_RATE] * (len(starts) - len(ends)), strict=True))


def reader_in(
    noise_kind: str, index: int, lead_s: float = AROUND_S, snr_db: float = SNR_DB
) -> tuple[np.ndarray, float, float]:
    """Clip ``index`` read over ``noise_kind`` at ``snr_db``: (audio, reader's start, end in s)."""
    speech, rate = sf.read(str(CLIPS[index]), dtype="float32")
    assert rate == SAMPLE_RATE
    total = len(speech) + int((lead_s + AROUND_S) * SAMPLE_RATE)
    others = [clip for i, clip in enumerate(CLIPS) if i != index]
    level = speech_rms(CLIPS[index]) * 10 ** (-snr_db / 20)
    # the readers' first words, not their silent starts, at the beginning: a room already talking
    noise = np.roll(make_noise(noise_kind, total / SAMPLE_RATE, voices=others), -SAMPLE_RATE)
    audio = noise[:total] * level
    begin = int(lead_s * SAMPLE_RATE)
    audio[begin : begin + len(speech)] += speech
    return audio.astype(np.float32), lead_s, lead_s + len(speech) / SAMPLE_RATE


@needs_five_readers
@pytest.mark.parametrize("index", range(5))
def test_other_people_talking_start_no_turn_and_the_reader_is_heard(index: int) -> None:
    audio, start, end = reader_in("babble", index)
    without = heard(audio, gate=False)
    # Silero takes the room's talk for the user: a turn from the first second, held long after them
    assert without[0][0] < 1.5 and without[-1][1] > end + 2.0, without
    turns = heard(audio, gate=True)
    assert len(turns) == 1, turns
    ((begin, finish),) = turns
    assert start <= begin <= start + 0.6, turns
    assert end - 0.8 <= finish <= end + 1.0, turns  # without the gate: 3-4 s after them


@needs_five_readers
@pytest.mark.parametrize("noise", ["quiet", "pink"])
def test_a_quiet_room_or_a_fan_changes_nothing(noise: str) -> None:
    for index in range(5):
        if noise == "pink":
            audio, _, _ = reader_in("pink", index)
        else:
            speech, _ = sf.read(str(CLIPS[index]), dtype="float32")
            hiss = np.random.default_rng(index).standard_normal(len(speech) + 8 * SAMPLE_RATE) * 1e-3
            audio = hiss.astype(np.float32)
            audio[4 * SAMPLE_RATE : 4 * SAMPLE_RATE + len(speech)] += speech
        without, turns = heard(audio, gate=False), heard(audio, gate=True)
        assert len(turns) == len(without) == 1, (index, without, turns)
        assert abs(turns[0][0] - without[0][0]) <= 0.1 and abs(turns[0][1] - without[0][1]) <= 0.3, (without, turns)


@needs_five_readers
def test_talk_that_starts_in_a_quiet_room_becomes_the_room() -> None:
    """A television switched on: one long turn at first, then the room; the user is heard over it."""
    audio, start, end = reader_in("babble", 0, lead_s=16.0)
    audio[: 3 * SAMPLE_RATE] = np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE) * 1e-4
    turns = heard(audio, gate=True)
    assert len(turns) == 2, turns
    (talk_start, talk_end), (begin, finish) = turns
    assert 3.0 <= talk_start <= 3.5 and talk_end <= talk_start + 11.0, turns
    assert start <= begin <= start + 0.6 and end - 0.8 <= finish <= end + 1.0, turns
    # without the gate the room's talk and the user are one turn, cut only by max_speech_ms
    assert len(heard(audio, gate=False)) == 1


class AlwaysActing(BackgroundGate):
    """The gate as it was before it learnt to stand aside: the level rules whatever the room."""

    def _update_acting(self) -> None:
        self.acting = True


@needs_five_readers
def test_under_a_loud_fan_the_gate_stands_aside() -> None:
    """Pink noise at 6 dB SNR: the level rules would cut the reader's soft words; the gate, which
    knows the room is not talking, leaves every turn as the VAD alone finds it."""
    cut = 0
    for index in range(5):
        audio, _, _ = reader_in("pink", index, snr_db=6.0)
        without = heard(audio, gate=False)
        gate = BackgroundGate()
        assert heard(audio, gate) == without, index
        assert not gate.acting
        always = heard(audio, AlwaysActing())
        cut += len(always) != len(without) or abs(always[-1][1] - without[-1][1]) > 0.3
    assert cut >= 1  # what it would have done (clip 2: its last 1.6 s were lost)


@needs_five_readers
def test_the_gate_acts_while_the_room_talks_and_stands_aside_once_it_stops() -> None:
    """Babble, then 10 s under the assistant's voice (the canceller's suppressor holds the room
    down: here, near silence), then the room quiet: the gate keeps acting through the voice."""
    vad = new_stage(SileroVADHandler, config=VADConfig())
    vad.load()
    gate = BackgroundGate()
    babble = make_noise("babble", 8.0, voices=CLIPS[1:]) * speech_rms(CLIPS[0]) * 10 ** (-SNR_DB / 20)
    hush = np.random.default_rng(1).standard_normal(18 * SAMPLE_RATE) * 1e-3
    room = np.concatenate([babble, hush]).astype(np.float32)
    chunks_per_s = SAMPLE_RATE / 512
    acting = []
    for index, start in enumerate(range(0, len(room) - 512, 512)):
        chunk = room[start : start + 512]
        voice = 8 * chunks_per_s <= index < 18 * chunks_per_s
        gate.filter(chunk, vad.speech_probability(chunk), in_speech=False, voice_playing=voice)
        acting.append(gate.acting)
    assert all(acting[: int(18 * chunks_per_s)])  # the talk from the first chunk, and under the voice
    assert not any(acting[int(24 * chunks_per_s) :])  # quiet again, the voice silent


def test_on_by_default_and_auto_is_a_raw_microphone_only() -> None:
    assert VADConfig().background_gate == "auto"

    def ends(raw_input: bool) -> Ends:
        return Ends(sink=lambda queue, shared: None, raw_input=raw_input)  # type: ignore[arg-type, return-value]

    def args(value: str) -> argparse.Namespace:
        return argparse.Namespace(background_gate=value)

    assert isinstance(_background(args("auto"), ends(raw_input=True)), BackgroundGate)
    assert _background(args("auto"), ends(raw_input=False)) is None  # a file, a session's client
    assert isinstance(_background(args("true"), ends(raw_input=False)), BackgroundGate)
    assert _background(args("false"), ends(raw_input=True)) is None
    with pytest.raises(PipelineError, match="--background_gate must be auto, true or false"):
        _background(args("maybe"), ends(raw_input=True))
