"""The input's echo canceller (WebRTC AEC3 from the livekit wheel) on real speech: the assistant's
Piper voice comes back through a simulated room (60 ms late, -6 dB, a reverberant tail) while a
LibriVox speaker, as loud as that echo, talks over its second half; and its wiring into the pipeline."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import soxr

from speech_to_speech.core.audio import rms
from speech_to_speech.pipeline.builder import Ends, PipelineError, _canceller
from speech_to_speech.speech.echo_cancel import ECHO_CORRELATION, EchoCanceller
from speech_to_speech.speech.playback import PlaybackReference
from speech_to_speech.testing.speech_data import word_error_rate

RATE = 16_000
#: the VAD's block and the speaker's, samples (16 kHz in, 24 kHz out)
IN_BLOCK, OUT_BLOCK, OUT_RATE = 512, 480, 24_000
STORY = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman "
    "who told stories to the children every evening."
)


def room_response(seed: int = 1) -> np.ndarray:
    """A speaker-to-microphone impulse response: 60 ms of travel, -6 dB, a 150 ms decaying tail."""
    rng = np.random.default_rng(seed)
    response = np.zeros(int(0.25 * RATE), dtype=np.float32)
    direct = int(0.06 * RATE)
    response[direct] = 0.5
    length = int(0.15 * RATE)
    decay = np.exp(-np.arange(length) / (0.03 * RATE))
    response[direct + 32 : direct + 32 + length] += (rng.standard_normal(length) * decay * 0.05).astype(np.float32)
    return response


def speech_fraction(samples: np.ndarray) -> float:
    """Share of the 32 ms chunks that Silero VAD scores as speech (p > 0.5)."""
    import torch
    from silero_vad import load_silero_vad

    model = load_silero_vad()
    scores = [
        float(model(torch.from_numpy(np.ascontiguousarray(samples[i : i + 512])), RATE))
        for i in range(0, len(samples) - 511, 512)
    ]
    return float(np.mean(np.array(scores) > 0.5)) if scores else 0.0


def transcribe(samples: np.ndarray) -> str:
    """What the embedded Whisper tiny.en hears in 16 kHz ``samples``."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from speech_to_speech.turns.stt import STTConfig
    from tests.helpers import new_stage

    stt = new_stage(FasterWhisperSTTHandler, config=STTConfig(), name="stt")
    stt.load()
    return stt.transcribe(samples, RATE)[0]


def play_through_room(
    voice: np.ndarray, near: np.ndarray, canceller: EchoCanceller | None, reference: PlaybackReference
) -> np.ndarray:
    """Feed ``near`` (the microphone, 16 kHz) in the VAD's blocks, the voice (24 kHz) going out in the
    speaker's blocks up to each block's arrival; the input as the VAD would see it."""
    t0, played, out = 100.0, 0, []
    for start in range(0, len(near) - IN_BLOCK + 1, IN_BLOCK):
        arrived = t0 + (start + IN_BLOCK) / RATE
        while played < len(voice) and played / OUT_RATE <= (start + IN_BLOCK) / RATE:
            reference.add(voice[played : played + OUT_BLOCK], OUT_RATE, t0 + played / OUT_RATE)
            played += OUT_BLOCK
        block = near[start : start + IN_BLOCK]
        out.append(canceller.process(block, arrived) if canceller is not None else block)
    return np.concatenate(out)


@pytest.mark.models
def test_the_voice_is_removed_and_the_user_talking_over_it_is_kept() -> None:
    from speech_to_speech.testing.turns import librivox_speech, synthesize

    voice16 = synthesize(STORY)
    voice24 = soxr.resample(voice16, RATE, OUT_RATE).astype(np.float32)
    echo = np.convolve(voice16, room_response())[: len(voice16)].astype(np.float32)
    user, reference_text = next(iter(librivox_speech().values()))
    user *= rms(echo) / rms(user)  # as loud as the echo (AEC3 hears 46 % of it as speech over the voice; 13 % at -6 dB)
    talk = len(echo) // 2  # the user starts halfway through the story and talks on after it
    near = np.zeros(talk + len(user) + RATE // 2, dtype=np.float32)
    near[: len(echo)] += echo
    near[talk : talk + len(user)] += user
    near += np.random.default_rng(2).standard_normal(len(near)).astype(np.float32) * 1e-3

    reference = PlaybackReference()
    canceller = EchoCanceller(reference)
    cleaned = play_through_room(voice24, near, canceller, reference)
    raw = play_through_room(voice24, near, None, PlaybackReference())
    assert len(cleaned) == len(raw)
    assert canceller.render_frames > 0 and canceller.capture_frames > 0
    # it stood aside until it heard the voice in the input (a 1 s window, two looks 0.25 s apart)
    assert canceller.detector is not None and canceller.detector.found
    assert canceller.detector.correlation is not None and canceller.detector.correlation >= ECHO_CORRELATION
    assert np.array_equal(cleaned[160 : RATE // 2], raw[: RATE // 2 - 160])  # raw, one frame late

    settled = 3 * RATE // 2  # found by 1.25 s; AEC3 has adapted meanwhile
    echo_only = slice(settled, talk)
    attenuation_db = 20 * np.log10(rms(cleaned[echo_only]) / rms(raw[echo_only]))
    assert attenuation_db < -20, f"the echo is only {attenuation_db:.1f} dB lower"
    # the echo alone no longer sounds like speech to the VAD: no interruption by the voice itself
    assert speech_fraction(raw[echo_only]) > 0.5
    assert speech_fraction(cleaned[echo_only]) < 0.05
    # the user over the voice is still speech (an interruption is heard) ...
    assert speech_fraction(cleaned[talk : len(echo)]) > 0.2
    # ... and their words are heard as well as without the canceller (AEC3 holds some of its
    # suppression for a second or two after the voice stops: 2-6 dB here)
    heard = {name: transcribe(audio[talk : talk + len(user)]) for name, audio in (("raw", raw), ("cleaned", cleaned))}
    wer = {name: word_error_rate(reference_text, text) for name, text in heard.items()}
    assert wer["cleaned"] <= max(0.5, wer["raw"] + 0.15), heard


@pytest.mark.models
def test_with_no_echo_path_the_canceller_stands_aside_and_the_user_over_the_voice_is_untouched() -> None:
    """Headphones: the voice plays, none of it reaches the microphone, a reader talks over it. AEC3
    would hold the reader back (26-73 % of their chunks kept as speech); standing aside keeps all."""
    from speech_to_speech.testing.turns import librivox_speech, synthesize

    voice16 = synthesize(STORY)
    voice24 = soxr.resample(voice16, RATE, OUT_RATE).astype(np.float32)
    talk = len(voice16) // 3
    for user, _ in list(librivox_speech().values())[:3]:
        user = user * (0.1 / rms(user))
        near = np.zeros(max(len(voice16), talk + len(user)) + RATE // 2, dtype=np.float32)
        near[talk : talk + len(user)] += user
        near += np.random.default_rng(4).standard_normal(len(near)).astype(np.float32) * 1e-3
        reference = PlaybackReference()
        canceller = EchoCanceller(reference)
        out = play_through_room(voice24, near, canceller, reference)
        assert canceller.detector is not None and not canceller.detector.found
        assert canceller.detector.highest is not None  # it looked while the voice played
        assert canceller.detector.highest < ECHO_CORRELATION
        assert np.array_equal(out[160:], near[: len(out) - 160])  # the raw input, one 10 ms frame late
    # the same reader with the voice's echo in the microphone: found, and cancelled from then on
    echo = np.convolve(voice16, room_response())[: len(voice16)].astype(np.float32)
    near[: len(echo)] += echo
    reference = PlaybackReference()
    canceller = EchoCanceller(reference)
    out = play_through_room(voice24, near, canceller, reference)
    assert canceller.detector is not None and canceller.detector.found
    assert not np.array_equal(out[160:], near[: len(out) - 160])


def test_any_block_size_comes_back_whole_and_one_frame_late() -> None:
    canceller = EchoCanceller(None)  # no voice: only the high-pass filter runs
    rng = np.random.default_rng(3)
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)
    sizes = rng.integers(1, 700, size=200)
    parts, at = [], 0
    for size in sizes:
        block = tone[at : at + size]
        if len(block) == 0:
            break
        out = canceller.process(block, 0.0)
        assert len(out) == len(block)
        parts.append(out)
        at += len(block)
    out = np.concatenate(parts)
    assert not out[:160].any()  # the 10 ms frame of delay
    late = out[160 + RATE // 4 :]
    assert abs(20 * np.log10(rms(late) / rms(tone[RATE // 4 : RATE // 4 + len(late)]))) < 1  # 440 Hz passes


def _args(echo_cancel: str = "auto", noise_suppression: bool = False) -> argparse.Namespace:
    return argparse.Namespace(echo_cancel=echo_cancel, noise_suppression=noise_suppression)


def _ends(playback: PlaybackReference | None, raw_input: bool) -> Ends:
    return Ends(sink=lambda queue, shared: None, playback=playback, raw_input=raw_input)  # type: ignore[arg-type, return-value]


def test_the_canceller_runs_where_a_raw_microphone_hears_the_voice() -> None:
    reference = PlaybackReference()
    local = _canceller(_args(), _ends(reference, raw_input=True))
    assert local is not None and local.echo_cancellation
    # a WebRTC call: the browser cancels its own echo, unless the server is told to as well
    assert _canceller(_args(), _ends(reference, raw_input=False)) is None
    forced = _canceller(_args("true"), _ends(reference, raw_input=False))
    assert forced is not None and forced.echo_cancellation
    assert _canceller(_args("false"), _ends(reference, raw_input=True)) is None
    # a file or a WebSocket client: nothing played that the input hears; noise suppression only
    assert _canceller(_args(), _ends(None, raw_input=False)) is None
    quiet = _canceller(_args(noise_suppression=True), _ends(None, raw_input=False))
    assert quiet is not None and quiet.noise_suppression and not quiet.echo_cancellation
    with pytest.raises(PipelineError, match="--echo_cancel must be auto, true or false"):
        _canceller(_args("yes please"), _ends(reference, raw_input=True))


def test_without_the_livekit_wheel_auto_warns_and_an_explicit_ask_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "livekit", None)  # import livekit fails, as where no wheel exists
    reference = PlaybackReference()
    with caplog.at_level("WARNING"):
        assert _canceller(_args(), _ends(reference, raw_input=True)) is None
    assert "echo gate alone" in caplog.text and "livekit" in caplog.text
    with pytest.raises(PipelineError, match="--echo_cancel false"):
        _canceller(_args("true"), _ends(reference, raw_input=True))
    with pytest.raises(PipelineError, match="livekit"):
        _canceller(_args(noise_suppression=True), _ends(None, raw_input=False))


# -- a realtime session's audio.input.noise_reduction ------------------------------------------------


def _update(session: dict) -> object:
    from openai.types.realtime import RealtimeSessionCreateRequest

    return RealtimeSessionCreateRequest.model_validate({"type": "realtime", **session})


def test_a_session_sets_noise_reduction_and_the_vad_cleans_its_input_so() -> None:
    from speech_to_speech.pipeline.cli import parse_args
    from speech_to_speech.realtime.config import SessionConfig, apply_update
    from speech_to_speech.realtime.controls import InputCleaning, update_controls
    from speech_to_speech.testing.fakes import FakeVAD
    from speech_to_speech.turns.echo import EchoGate
    from speech_to_speech.turns.vad import VADConfig
    from tests.helpers import new_stage

    args = parse_args(["--mode", "server"])
    start = SessionConfig.from_args(args)
    assert start.session_object("s", "m")["audio"]["input"]["noise_reduction"] is None
    far, problems = apply_update(start, _update({"audio": {"input": {"noise_reduction": {"type": "far_field"}}}}), args)
    assert not problems and far.session_object("s", "m")["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    off, problems = apply_update(far, _update({"audio": {"input": {"noise_reduction": None}}}), args)
    assert not problems and off.noise_reduction is None

    controls, _ = update_controls(start, far, args)
    cleaning = [c for c in controls if isinstance(c, InputCleaning)]
    assert cleaning == [InputCleaning("far_field")]
    assert not [c for c in update_controls(far, far, args)[0] if isinstance(c, InputCleaning)]  # unchanged: none

    # a WebRTC call: the VAD's echo gate has the call's playback reference
    vad = new_stage(FakeVAD, config=VADConfig(), name="vad", echo=EchoGate(PlaybackReference()))
    vad._control(InputCleaning("far_field"))
    assert vad.canceller is not None and vad.canceller.echo_cancellation and vad.canceller.noise_suppression
    vad._control(InputCleaning("near_field"))
    assert vad.canceller is not None and not vad.canceller.echo_cancellation and vad.canceller.noise_suppression
    reference = vad.echo.reference
    vad._control(InputCleaning("far_field"))
    assert len(reference._taps) == 1  # the canceller replaced stopped taking the played audio
    vad._control(InputCleaning(None))
    assert vad.canceller is None and not reference._taps
    # a WebSocket client: the server does not see what it plays; far_field suppresses noise only
    socket_vad = new_stage(FakeVAD, config=VADConfig(), name="vad")
    socket_vad._control(InputCleaning("far_field"))
    assert socket_vad.canceller is not None and not socket_vad.canceller.echo_cancellation
