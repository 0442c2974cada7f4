"""Barge-in on real speech, in process, with the real embedded models.

A scripted source plays one LibriVox clip, waits until the assistant's reply is
audibly playing, then plays a second clip over it. The reply must stop at once,
the LLM's history must keep only the words that were heard, and the second
utterance must get its own transcript and reply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speech_to_speech.audio_io import StreamClock, load_audio
from speech_to_speech.cancel import Stamp
from speech_to_speech.cli import parse_args
from speech_to_speech.events import (
    AssistantText,
    EventBus,
    FirstAudio,
    ResponseDone,
    ResponseInterrupted,
    SpeechStarted,
    StageError,
    UserTranscript,
)
from speech_to_speech.handler import BaseHandler
from speech_to_speech.llm import BaseLLMHandler
from speech_to_speech.messages import END_OF_STREAM, AudioChunk, AudioOutput
from speech_to_speech.pipeline import build_pipeline
from speech_to_speech.prompts import INTERRUPTION_MARKER
from speech_to_speech.text import remove_unspeakable
from speech_to_speech.vad import CHUNK_SAMPLES, SAMPLE_RATE
from tests.helpers import BusLog, two_short_clips
from tests.speech_utils import normalize, word_error_rate

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


class ScriptedSource(BaseHandler):
    """Feeds clip A, silence until the reply has played a little, clip B, silence, then the end of the stream.

    Audio goes out in :data:`CHUNK_SAMPLES` chunks at real-time pace on one
    continuous stream, as a microphone would deliver it.

    Attributes:
        barge_in_time: monotonic time when the first chunk of clip B was sent (None before).
        reply_was_playing: whether turn 1's reply was still unfinished when clip B began.
        waited_out: set when the wait for the reply timed out.
    """

    def __init__(
        self,
        *args: Any,
        clip_a: np.ndarray,
        clip_b: np.ndarray,
        clock: StreamClock,
        log: BusLog,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, input_queue=None, **kwargs)
        self.clip_a = clip_a
        self.clip_b = clip_b
        self.clock = clock
        self.log = log
        self.offset = 0
        self.barge_in_time: float | None = None
        self.reply_was_playing = False
        self.waited_out = False

    def _send(self, chunk: np.ndarray) -> bool:
        """Send one chunk when it is due on the stream's clock; False when stopping."""
        due = self.clock.start + (self.offset + len(chunk)) / SAMPLE_RATE
        delay = due - time.monotonic()
        if delay > 0 and self.stop_event.wait(delay):
            return False
        sent = self.emit(AudioChunk(chunk, SAMPLE_RATE, time.monotonic(), self.offset))
        self.offset += len(chunk)
        return sent

    def _play(self, samples: np.ndarray) -> bool:
        """Send ``samples`` at real-time pace; False when stopping."""
        return all(self._send(samples[i : i + CHUNK_SAMPLES]) for i in range(0, len(samples), CHUNK_SAMPLES))

    def _silence_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Send silence until ``condition()`` holds; False on timeout or stop."""
        silence = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline or not self._send(silence):
                return False
        return True

    def _reply_is_playing(self) -> bool:
        """Turn 1's reply is fully written and its audio has been playing for a while."""
        first_audio = self.log.of(FirstAudio, 1)
        return (
            bool(first_audio)
            and bool(self.log.of(AssistantText, 1))
            and time.monotonic() >= first_audio[0].time + PLAYING_BEFORE_BARGE_IN_S
        )

    def _loop(self) -> None:
        self.clock.restart()
        if not self._play(self.clip_a):
            return
        # Wait for the whole reply text too: a reply still being generated when the user barges in
        # is cancelled before it is written, so it would have no AssistantText to compare with.
        if not self._silence_until(self._reply_is_playing, WAIT_S):
            self.waited_out = not self.stop_event.is_set()
        else:
            self.reply_was_playing = not self.log.of(ResponseDone, 1)
            self.barge_in_time = time.monotonic()
            if not self._play(self.clip_b):
                return
        if not self._play(np.zeros(int(TAIL_SILENCE_S * SAMPLE_RATE), dtype=np.float32)):
            return
        assert self.output_queue is not None
        self.output_queue.put_unless_stopped(END_OF_STREAM, self.stop_event)


def assistant_messages(items: list[dict[str, Any]]) -> list[str]:
    """The text of each assistant message in history items, oldest first."""
    return [
        str(item.get("content"))
        for item in items
        if item.get("type", "message") == "message" and item.get("role") == "assistant"
    ]


def test_barge_in_cuts_the_reply_to_what_was_heard(tmp_path: Path) -> None:
    (clip_a, _), (clip_b, reference_b) = two_short_clips()
    out = tmp_path / "out.wav"
    args = parse_args(["--input_audio", str(clip_a), "--output_audio", str(out), "--max_new_tokens", "80"])
    bus = EventBus()
    log = BusLog(bus)
    pipeline = build_pipeline(args, bus)

    original = pipeline.stages[0]
    source = ScriptedSource(
        output_queue=original.output_queue,
        stop_event=pipeline.stop_event,
        gate=pipeline.gate,
        bus=bus,
        clip_a=load_audio(clip_a),
        clip_b=load_audio(clip_b),
        clock=pipeline.clock,
        log=log,
        name="source:scripted",
    )
    pipeline.stages[0] = source

    deliveries: list[tuple[float, Stamp]] = []
    sink = pipeline.sink
    write = sink.write

    def recording_write(samples: np.ndarray, item: AudioOutput, start: float) -> None:
        deliveries.append((time.monotonic(), item.stamp))
        write(samples, item, start)

    sink.write = recording_write  # type: ignore[method-assign]
    llm = next(stage for stage in pipeline.stages if isinstance(stage, BaseLLMHandler))

    watchdog = threading.Timer(RUN_LIMIT_S, pipeline.stop_event.set)
    watchdog.daemon = True
    watchdog.start()
    began = time.monotonic()
    try:
        pipeline.start()
        pipeline.wait()
    finally:
        watchdog.cancel()
        stuck = pipeline.stop()
    history = llm.chat.items()
    assert time.monotonic() - began < RUN_LIMIT_S, "the run hung and was stopped by the watchdog"
    assert not stuck, f"threads still running: {stuck}"
    assert not log.of(StageError), log.of(StageError)
    assert not source.waited_out, f"turn 1's reply never played; events: {[e.kind for e in log.events]}"
    assert source.barge_in_time is not None
    assert source.reply_was_playing, "turn 1's reply ended before the barge-in: nothing to interrupt"

    # the second utterance opened turn 2, with the speech start that interrupted turn 1
    assert [e.turn_id for e in log.of(SpeechStarted) if e.time < source.barge_in_time] == [1]
    barge_in = [e for e in log.of(SpeechStarted) if e.time >= source.barge_in_time]
    assert barge_in and barge_in[0].turn_id == 2 and barge_in[0].revision == 0, log.of(SpeechStarted)
    speech_started = barge_in[0].time

    # the reply was interrupted and stopped at once
    ended = log.of(ResponseDone, 1)
    assert ended and ended[0].time >= speech_started, "turn 1's reply ended before the user barged in"
    interrupted = log.of(ResponseInterrupted, 1)
    assert len(interrupted) == 1, log.of(ResponseInterrupted)
    turn1 = [t for t, stamp in deliveries if stamp.turn_id == 1]
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
    assert any(stamp.turn_id == 2 for _, stamp in deliveries)
    assert [e.turn_id for e in log.of(ResponseDone)] == [1, 2]
    assert out.is_file()
