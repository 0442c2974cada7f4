"""OutputAudioBuffer: the assistant's audio on its way out of a WebRTC track, frame by frame."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

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


def test_recall_takes_back_the_unsent_audio_after_the_last_mark() -> None:
    buffer = OutputAudioBuffer(frame_samples=100)
    recalled: list[tuple[str, int, bool]] = []

    def on_recall(name: str) -> Callable[[int, bool], None]:
        return lambda unsent, started: recalled.append((name, unsent, started))

    buffer.push(np.full(150, 0.1, dtype=np.float32), on_recall=on_recall("ended"))
    buffer.mark(lambda: None)  # the end of a response: its audio plays out
    buffer.push(np.full(150, 0.2, dtype=np.float32), on_recall=on_recall("playing"))
    buffer.push(np.full(300, 0.3, dtype=np.float32), on_recall=on_recall("waiting"))
    for _ in range(2):  # 150 of "ended", 50 of "playing"
        buffer.next_frame()
    assert buffer.recall() == 100 + 300
    assert recalled == [("playing", 100, True), ("waiting", 300, False)]
    frame, audio = buffer.next_frame()
    assert not audio and not frame.any()
    assert buffer.recall() == 0


def test_recall_keeps_the_audio_of_a_response_that_has_ended() -> None:
    buffer = OutputAudioBuffer(frame_samples=100)
    ended: list[str] = []
    buffer.push(np.full(250, 0.1, dtype=np.float32))
    buffer.mark(lambda: ended.append("end"))
    assert buffer.recall() == 0
    sent = [buffer.next_frame()[0] for _ in range(3)]
    assert np.count_nonzero(np.concatenate(sent)) == 250 and ended == ["end"]


def test_a_response_taken_back_unsays_exactly_the_words_not_sent() -> None:
    from speech_to_speech.core.cancel import Gate
    from speech_to_speech.core.messages import AudioOutput
    from speech_to_speech.realtime.conversation import Conversation
    from speech_to_speech.realtime.responses import ResponseOutput

    buffer, gate = OutputAudioBuffer(frame_samples=100), Gate()
    output = ResponseOutput(lambda event, stamp=None: None, gate, Conversation(), lambda: None, buffer)
    stamp = gate.new_turn_stamp()
    output.start(stamp.turn_id, ["audio"])
    for word in ("Once", " upon", " a", " time"):
        samples = np.full(150, 0.2, dtype=np.float32)
        output.on_audio(AudioOutput(stamp, samples, buffer.rate, word), samples)
    for _ in range(2):  # "Once" sent, 50 samples of " upon"
        buffer.next_frame()
    assert buffer.recall() == 100 + 150 + 150
    response = output._responses[stamp.turn_id]
    # " upon" had started: its words stay, once; " a" and " time" are unsaid
    assert response.transcript == ["Once", " upon"]
    assert [words for _, words in response.spoken] == ["Once", " upon"]
    assert response.audio_ms == pytest.approx(1000 * 200 / buffer.rate)


def test_the_track_sends_nothing_while_the_assistant_is_silent() -> None:
    """After a short silent tail the outbound track pauses (no packets: 12 % of a server core
    saved per call); the next reply goes out on the clock, after a silent primer that takes the
    encoder's stale stamp, and a microphone track (``continuous``) keeps sending silence."""
    import asyncio

    from aiortc.codecs.opus import OpusEncoder

    from speech_to_speech.realtime.webrtc import SILENT_TAIL_FRAMES, OutputTrack

    async def scenario() -> tuple[list[int], float, list[int], list[int], int]:
        buffer = OutputAudioBuffer()
        track = OutputTrack(buffer)
        frames = [await track.recv() for _ in range(SILENT_TAIL_FRAMES)]  # the tail, then nothing
        waiting = asyncio.ensure_future(track.recv())
        await asyncio.sleep(0.3)
        assert not waiting.done(), "a frame was sent while nothing was queued"
        clock_at_push = track._pts  # the frame time the track's clock had reached
        buffer.push(np.full(960, 0.5, dtype=np.float32))
        primer = await waiting
        voiced = await track.recv()
        latency = voiced.pts - clock_at_push  # frame times that passed before the reply's frame
        encoder = OpusEncoder()  # the stamps aiortc's sender would put on these frames
        stamps = [encoder.encode(frame)[1] for frame in [*frames, primer, voiced]]
        levels = [int(np.abs(frame.to_ndarray()).max()) for frame in (primer, voiced)]
        microphone = OutputTrack(OutputAudioBuffer(), continuous=True)
        sent = 0
        for _ in range(SILENT_TAIL_FRAMES + 3):
            await asyncio.wait_for(microphone.recv(), 0.5)
            sent += 1
        return [f.pts for f in [*frames, primer, voiced]], latency, stamps, levels, sent

    pts, latency, stamps, levels, sent = asyncio.run(scenario())
    step = 960
    assert pts[:SILENT_TAIL_FRAMES] == [i * step for i in range(SILENT_TAIL_FRAMES)]
    # the pause is on the clock: ~0.3 s of frame times passed unsent
    assert pts[-1] - pts[SILENT_TAIL_FRAMES - 1] >= 0.25 * MEDIA_RATE and pts[-2] == pts[-1] - step
    assert levels == [0, 16384], levels  # the primer is silence, the reply's frame its audio
    assert stamps[-1] == pts[-1], stamps  # the reply's packet carries its own time
    # no frame time waited before the reply's first frame (at most the one in progress): counted on
    # the track's clock, not the wall clock, which a busy machine stretches (0.46 s once in a full run)
    assert latency <= step, latency
    assert sent == SILENT_TAIL_FRAMES + 3
