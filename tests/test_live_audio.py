"""The live microphone/speaker mode as a laptop runs it: ``python s2s_pipeline.py`` through
PortAudio → ALSA → a real PulseAudio server (Debian packages), with a virtual microphone that
plays real speech and a speaker whose output is recorded (``scripts/benchmark_live.py``'s
``SoundServer``). It hears a LibriVox sentence and answers out loud, a second utterance
interrupts a long reply, and Ctrl-C stops it cleanly."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speech_to_speech.testing import room as live
from speech_to_speech.testing.speech_data import TRANSCRIPT_WER_MAX, librivox_clips, word_error_rate
from tests.helpers import wait_until

pytestmark = pytest.mark.models

#: a request for a reply long enough to interrupt (espeak-ng: the LibriVox clips are statements)
LONG_REQUEST = "Tell me a long story about a dragon who lived in the mountains."
#: seconds the program may take to load its models
LOAD_S = 300


@dataclass
class Live:
    server: Any
    program: Any
    tap: Any
    speaker: Any
    transcript: Path
    workdir: Path

    def records(self, kind: str) -> list[dict[str, Any]]:
        lines = self.transcript.read_text().splitlines() if self.transcript.exists() else []
        return [r for r in map(json.loads, lines) if r["event"] == kind]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    missing = live.missing_tools()
    if missing:
        pytest.skip(f"no sound server here ({', '.join(missing)}; .ci/run installs them)")
    workdir = tmp_path_factory.mktemp("live")
    server = live.SoundServer(workdir)
    try:
        tap, speaker = server.record(workdir / "tap.wav"), server.record(workdir / "speaker.wav", "speaker.monitor")
        transcript = workdir / "transcript.jsonl"
        program = live.LiveProgram(server.env, ["--transcript", str(transcript)])
        assert program.wait_listening(LOAD_S), "\n".join(program.lines[-20:])
        yield Live(server, program, tap, speaker, transcript, workdir)
        if program.process.poll() is None:
            program.interrupt()
    finally:
        server.close()


def first_clip() -> tuple[Path, str]:
    clips = librivox_clips()
    return next(iter(clips.items()))


def test_it_hears_a_spoken_sentence_and_answers_out_loud(session: Live) -> None:
    clip, reference = first_clip()
    v2v_ms = live.measure(session.server, session.tap, clip, gap_s=8.0)
    heard = [r["text"] for r in session.records("user_transcript")]
    assert heard and word_error_rate(reference, heard[0]) <= TRANSCRIPT_WER_MAX, heard
    assert session.records("assistant_text"), session.program.lines[-10:]
    # the reply came out of the default sink, after the user stopped speaking
    assert v2v_ms is not None and 0 < v2v_ms < 8000, v2v_ms
    print(f"live voice-to-voice through PulseAudio: {v2v_ms:.0f} ms")


def test_a_second_utterance_interrupts_a_long_reply(session: Live) -> None:
    request = session.workdir / "request.wav"
    subprocess.run(["espeak-ng", "-w", str(request), LONG_REQUEST], check=True)
    turns_before = len(session.records("user_transcript"))
    speaker_before = session.speaker.seconds()
    session.server.say(request)
    # the story starts playing
    assert wait_until(lambda: live.sound_after(session.speaker.samples(), speaker_before) is not None, 30)
    started = live.sound_after(session.speaker.samples(), speaker_before)
    clip, _ = first_clip()
    interruption, _ = live.trimmed(clip, session.workdir)
    assert wait_until(lambda: session.speaker.seconds() > started + 1.5, 10)  # 1.5 s into the story
    session.server.say(interruption)
    assert wait_until(lambda: len(session.records("user_transcript")) >= turns_before + 2, 30)
    # the words decide, and the verdict may come after the transcript is written
    assert wait_until(lambda: bool(session.records("barge_in")), 10), session.program.lines[-10:]
    # the story's audio stopped soon after the user started speaking over it: its first stretch of
    # sound (gaps under 1 s) is the 1.5 s heard, the interruption's detection and the user's own
    # speech mixed in nowhere (this is the speaker alone), far short of a long story
    sound = live.sound_frames(session.speaker.samples())
    start = round(started * 1000 / live.FRAME_MS)
    quiet = np.flatnonzero(~sound[start:])
    gaps = [i for i in quiet if np.all(~sound[start + i : start + i + round(1000 / live.FRAME_MS)])]
    story_s = (gaps[0] if gaps else len(sound) - start) * live.FRAME_MS / 1000
    assert story_s < 3.0, f"the story played {story_s:.1f} s"


def test_ctrl_c_stops_it_cleanly(session: Live) -> None:
    status = session.program.interrupt()
    (session.workdir / "program.log").write_text("\n".join(session.program.lines))
    assert status == 0, "\n".join(line for line in session.program.lines if "ALSA lib" not in line)
    assert any("stopping" in line for line in session.program.lines)
    assert not any("Traceback" in line for line in session.program.lines)
