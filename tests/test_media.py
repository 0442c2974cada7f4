"""OutputAudioBuffer: the assistant's audio on its way out of a WebRTC track, frame by frame."""

from __future__ import annotations

import threading

import numpy as np

from speech_to_speech.realtime.media import MEDIA_RATE, OutputAudioBuffer


def test_frames_are_20_ms_of_queued_audio_then_silence() -> None:
    buffer = OutputAudioBuffer()
    assert buffer.frame_samples == MEDIA_RATE // 50
    buffer.push(np.full(1500, 0.5, dtype=np.float32))
    first, audio1 = buffer.next_frame()
    second, audio2 = buffer.next_frame()
    third, audio3 = buffer.next_frame()
    assert (audio1, audio2, audio3) == (True, True, False)
    assert np.all(first == 0.5)
    assert np.all(second[: 1500 - 960] == 0.5) and np.all(second[1500 - 960 :] == 0)
    assert not third.any()
    assert buffer.sent_samples == 3 * 960


def test_callbacks_run_when_their_audio_leaves_in_queue_order() -> None:
    buffer = OutputAudioBuffer(frame_samples=100)
    calls: list[str] = []
    buffer.push(np.ones(150, dtype=np.float32), on_start=lambda: calls.append("a starts"))
    buffer.push(np.ones(30, dtype=np.float32), on_start=lambda: calls.append("b starts"))
    buffer.mark(lambda: calls.append("after b"))
    buffer.push(np.ones(100, dtype=np.float32), on_start=lambda: calls.append("c starts"))
    buffer.next_frame()
    assert calls == ["a starts"]
    buffer.next_frame()  # the rest of a, all of b, the mark behind b and the start of c
    assert calls == ["a starts", "b starts", "after b", "c starts"]
    buffer.next_frame()
    assert len(calls) == 4


def test_a_mark_on_an_empty_buffer_runs_at_once() -> None:
    buffer = OutputAudioBuffer()
    ran = threading.Event()
    buffer.mark(ran.set)
    assert ran.is_set()


def test_a_chunk_that_becomes_invalid_is_not_sent_further() -> None:
    buffer = OutputAudioBuffer(frame_samples=100)
    current = {"valid": True}
    buffer.push(np.ones(250, dtype=np.float32), valid=lambda: current["valid"])
    buffer.push(np.full(50, 0.25, dtype=np.float32))  # a later reply, still valid
    frame, _ = buffer.next_frame()
    assert np.all(frame == 1)
    current["valid"] = False  # barge-in: the generation moved on
    frame, audio = buffer.next_frame()
    assert audio and np.all(frame[:50] == 0.25) and not frame[50:].any()
    assert buffer.queued_s == 0


def test_clear_drops_the_audio_and_keeps_the_marks() -> None:
    buffer = OutputAudioBuffer(frame_samples=100)
    ended: list[str] = []
    buffer.push(np.ones(1000, dtype=np.float32))
    buffer.mark(lambda: ended.append("end"))
    assert buffer.queued_s > 0
    assert buffer.clear() is True
    assert buffer.clear() is False
    frame, audio = buffer.next_frame()
    assert not audio and not frame.any()
    assert ended == ["end"]
