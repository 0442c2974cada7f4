"""The shared TTS stage: each TTSInput spoken whole, the reply's leading silence skipped, words on chunks."""

from __future__ import annotations

import threading

import numpy as np

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import EventBus
from speech_to_speech.core.messages import AudioOutput, EndOfResponse, TTSInput
from speech_to_speech.speech.tts import TTSConfig, trim_leading_silence
from speech_to_speech.testing.fakes import FakeTTS


def make_tts() -> tuple[FakeTTS, Gate]:
    """A set-up :class:`FakeTTS` (300 ms of silence, then 10 ms of sound per character; 1 sample = 1 ms)."""
    gate = Gate()
    tts = FakeTTS(threading.Event(), None, None, gate, EventBus(), config=TTSConfig(tts_chunk_ms=100), name="tts")
    tts.setup()
    return tts, gate


def audio_of(outputs: list[object]) -> np.ndarray:
    return np.concatenate([o.samples for o in outputs if isinstance(o, AudioOutput)])


def test_leading_silence_trimmed_to_a_few_ms() -> None:
    audio = np.concatenate([np.zeros(500), np.full(100, 0.2)]).astype(np.float32)
    trimmed = trim_leading_silence(audio, 16_000)
    assert len(trimmed) == 100 + 160  # 10 ms of the silence kept at 16 kHz
    silent = np.zeros(50, dtype=np.float32)
    assert trim_leading_silence(silent, 16_000) is silent


def test_first_audio_of_a_reply_skips_the_silence_later_chunks_keep_it() -> None:
    tts, gate = make_tts()
    stamp = gate.new_turn_stamp()
    first = list(tts.process(TTSInput(stamp, "Paris is the capital of France,")))
    second = list(tts.process(TTSInput(stamp, "and it is lovely. Yes.")))
    assert len(audio_of(first)) == 10 + 10 * len("Paris is the capital of France,")
    assert audio_of(first)[10] == 0.5
    assert len(audio_of(second)) == 300 + 10 * len("and it is lovely. Yes.")  # a pause between chunks is kept
    # each TTSInput is synthesised whole, as the sentence streamer cut it
    assert tts.asked == ["Paris is the capital of France,", "and it is lovely. Yes."]
    # every word is on some chunk, the first of the response without a leading space
    words = "".join(o.text for o in first + second if isinstance(o, AudioOutput))
    assert words == "Paris is the capital of France, and it is lovely. Yes."


def test_every_response_starts_without_silence() -> None:
    tts, gate = make_tts()
    one = gate.new_turn_stamp()
    assert len(audio_of(list(tts.process(TTSInput(one, "Hi."))))) == 10 + 30
    assert list(tts.process(EndOfResponse(one))) == [EndOfResponse(one)]
    two = gate.new_turn_stamp()
    assert len(audio_of(list(tts.process(TTSInput(two, "Hello."))))) == 10 + 60
