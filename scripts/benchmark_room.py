#!/usr/bin/env python
"""Local mode with its speakers on, in a room you can measure: its own echo, and noise.

A room, made of a private PulseAudio (``speech_to_speech.testing.room.SoundServer``): ``python s2s_pipeline.py``
in live mode plays on the default sink and its microphone hears that sink ``ECHO_MS`` late at
``--echo_gain`` (a laptop's speakers, no headphones), plus one reflection :data:`REFLECTION_MS`
later at :data:`REFLECTION_GAIN` of it (a little reverberation), plus, when asked, noise played
into the microphone at ``--snr_db`` under the user's speech: ``pink`` (a fan), ``music``
(synthesised chords with a melody), ``babble`` (four LibriVox speakers at once), playing from
before the program starts listening (a room that was noisy already). The program's
LLM is the scripted ``/v1/responses`` endpoint of ``speech_to_speech/testing/responses_server.py`` (a five-sentence
story, about 15 s spoken; "Sure, go ahead." after an interruption), so each trial is quick and
the same; its VAD, STT and TTS are the embedded ones. Per condition (the echo canceller on or off,
each noise):

- **story** (first): a spoken request, then nobody speaks. A **false stop** is a story the program
  cut (a barge-in recorded: it heard its own voice, or the noise, as the user). The first story is
  the canceller's first: AEC3 has not yet converged, the hardest time not to hear itself.
- **interruption**: the same request; 2 s after the speaker starts playing the story, a LibriVox
  sentence is played into the microphone. It counts as heard when the program records a
  barge-in; the **quiet delay** runs from the start of the sentence (found in the microphone's
  recording by cross-correlation) to the start of the speaker's first 0.7 s of silence (the voice
  stopped).
- **question**: a LibriVox clip alone: the word error rate of what the program heard, and the
  end-of-turn delay it reported (the silence it waited for, ``endpoint_delay_ms``).

It also prints the canceller's CPU time per second of audio, measured here on the same speech
(``EchoCanceller.process`` with the voice playing, one core).

    python scripts/benchmark_room.py [--trials 5] [--echo_gain 0.7] [--echo_cancel on|off|both]
                                     [--noise none,pink,music,babble] [--snr_db 10]

Needs ``pulseaudio``, ``pactl``/``paplay``/``parecord``; exit status 1 when something is missing
or a condition could not run. ``tests/test_room_echo.py`` runs a short scenario of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from speech_to_speech.testing.noise import NOISES, make_noise, speech_rms
from speech_to_speech.testing.responses_server import STORY_REPLY, Reply, ResponsesServer, Text
from speech_to_speech.testing.room import (
    ECHO_MS,
    FRAME_MS,
    TAP_RATE,
    LiveProgram,
    SoundServer,
    missing_tools,
    sound_after,
    sound_frames,
    trimmed,
    wait_for_quiet,
)
from speech_to_speech.testing.runs import responses_api_flags
from speech_to_speech.testing.speech_data import librivox_clips, word_error_rate

PROG = "benchmark_room.py"
#: what the user asks for, said by espeak-ng into the microphone
REQUEST = "Tell me a story."
#: the reply to an interruption
SHORT_REPLY = Reply([Text(["Sure, go ahead."])])
#: the reflection: this much later than the direct echo, at this share of its volume
REFLECTION_MS, REFLECTION_GAIN = 80, 0.4
#: the interruption starts this long after the story becomes audible, s
INTERRUPT_AFTER_S = 2.0
#: how long after the interruption has been said its barge-in may still come, s (the words decide)
DECISION_S = 5.0
#: the voice counts as stopped at the first quiet stretch this long on the speaker, s
STOPPED_QUIET_S = 0.7
#: the longest wait for a step, s
WAIT_S = 90.0
#: quiet time between trials, s
SETTLE_S = 2.0


# -- one condition -------------------------------------------------------------------------------------


@dataclass
class Condition:
    """One room setting and what happened in it."""

    echo_cancel: bool
    noise: str
    snr_db: float | None
    interruptions: list[float | None] = field(default_factory=list)  # quiet delay, ms; None: not heard
    false_stops: int = 0
    skipped: int = 0  # interruptions left out: the story was not playing when the sentence started
    resumed: int = 0  # stories paused by speech the program then judged not the user's, and resumed
    stories: int = 0
    wers: list[float] = field(default_factory=list)
    endpoint_ms: list[float] = field(default_factory=list)
    error: str | None = None


class Room:
    """The sound server with its echo and reflection, the program, its transcript and recordings."""

    def __init__(self, workdir: Path, echo_gain: float, flags: list[str]) -> None:
        self.workdir = workdir
        self.server = SoundServer(workdir, echo_gain=echo_gain)
        self.server.reflect(REFLECTION_MS, echo_gain * REFLECTION_GAIN)
        self.speaker = self.server.record(workdir / "speaker.wav", "speaker.monitor")
        self.mic = self.server.record(workdir / "mic.wav", "mic.monitor")  # what the microphone hears
        self.transcript = workdir / "transcript.jsonl"
        self.program = LiveProgram(self.server.env, ["--transcript", str(self.transcript), *flags])
        self._noise: subprocess.Popen[bytes] | None = None

    def records(self, kind: str) -> list[dict]:
        lines = self.transcript.read_text().splitlines() if self.transcript.exists() else []
        return [r for r in map(json.loads, lines) if r.get("event") == kind]

    def play_noise(self, path: Path) -> None:
        self._noise = subprocess.Popen(["paplay", "--device=mic", str(path)], env=self.server.env)

    def close(self) -> None:
        if self._noise is not None:
            self._noise.terminate()
        if self.program.process.poll() is None:
            self.program.interrupt()
        self.server.close()

    def say_at(self, sentence: Path) -> float:
        """Play ``sentence`` into the microphone; when it started, s on the speaker's recording.

        Found in the microphone's recording (under the echo) by cross-correlation with the
        sentence, then moved to the speaker recording's timeline by the two recordings' offset,
        so paplay's start-up time is not counted as the program's."""
        offsets = []
        for _ in range(5):
            offsets.append(self.speaker.seconds() - self.mic.seconds())
            time.sleep(0.01)
        called = self.mic.seconds()
        self.server.say(sentence)
        time.sleep(0.5)
        said, _ = sf.read(str(sentence), dtype="float32")
        said = said[:TAP_RATE]
        heard = self.mic.samples()
        start = max(0, int((called - 0.2) * TAP_RATE))
        window = heard[start : start + 4 * TAP_RATE]
        size = 1 << int(np.ceil(np.log2(len(window) + len(said))))
        correlation = np.fft.irfft(np.fft.rfft(window, size) * np.conj(np.fft.rfft(said, size)), size)
        onset = (start + int(np.argmax(correlation[: len(window)]))) / TAP_RATE
        return onset + statistics.median(offsets)

    def speaker_quiet_from(self, after_s: float, quiet_s: float = STOPPED_QUIET_S) -> float | None:
        """Start of the first ``quiet_s`` of silence on the speaker at or after ``after_s``, s."""
        frames = sound_frames(self.speaker.samples())
        first, run = int(after_s * 1000 / FRAME_MS), round(quiet_s * 1000 / FRAME_MS)
        for i in range(first, len(frames) - run + 1):
            if not frames[i : i + run].any():
                return i * FRAME_MS / 1000
        return None

    def wait_quiet(self, quiet_s: float = 1.5) -> bool:
        """Wait until the speaker has been silent ``quiet_s`` (a reply has ended)."""
        return wait_for_quiet(self.speaker, quiet_s, WAIT_S)

    def start_story(self, request: Path) -> float | None:
        """Ask for the story; when its voice starts on the speaker, s (None: it did not)."""
        before = self.speaker.seconds()
        self.server.say(request)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            started = sound_after(self.speaker.samples(), before)
            if started is not None:
                return started
            time.sleep(0.1)
        return None


def run_condition(condition: Condition, args: argparse.Namespace, workdir: Path) -> None:
    """Every trial of ``condition`` in a fresh room and program."""
    provider = ResponsesServer().start()
    flags = [
        *responses_api_flags(provider.base_url, "story"),
        "--echo_cancel",
        "auto" if condition.echo_cancel else "false",
        "--background_gate",
        args.background_gate,
    ]
    clips = list(librivox_clips().items())
    noise_file = None
    if condition.noise != "none":
        level = speech_rms(clips[0][0]) * 10 ** (-condition.snr_db / 20)  # type: ignore[operator]
        noise_file = workdir / f"noise-{condition.noise}.wav"
        seconds = (args.trials + args.stories) * 60 + 180
        sf.write(str(noise_file), make_noise(condition.noise, seconds) * level, TAP_RATE)
    room = Room(workdir, args.echo_gain, flags)
    try:
        if noise_file is not None:  # a room that was noisy before the program started listening
            room.play_noise(noise_file)
        if not room.program.wait_listening(300):
            condition.error = "the program did not start: " + " | ".join(room.program.lines[-5:])
            return
        request = workdir / "request.wav"
        subprocess.run(["espeak-ng", "-w", str(request), REQUEST], check=True)
        # the stories first: the canceller's first story, before AEC3 has converged, is where it is
        # likeliest to take its own voice for the user; the interruptions then find it converged
        for _ in range(args.stories):
            provider.script(STORY_REPLY, SHORT_REPLY)
            barge_ins, resumes = len(room.records("barge_in")), len(room.records("reply_resumed"))
            if room.start_story(request) is None:
                continue
            room.wait_quiet(2.0)
            condition.stories += 1
            if len(room.records("barge_in")) > barge_ins:
                condition.false_stops += 1
                stops = [(r.get("reason"), r.get("text")) for r in room.records("barge_in")[barge_ins:]]
                print(f"  false stop: {stops}", file=sys.stderr, flush=True)
            resumed = room.records("reply_resumed")[resumes:]
            if resumed:  # the story stopped for a moment: what the program heard instead of its voice
                condition.resumed += 1
                heard = [(r.get("reason"), r.get("text"), round(r.get("paused_ms", 0))) for r in resumed]
                print(f"  paused and resumed: {heard}", file=sys.stderr, flush=True)
            time.sleep(SETTLE_S)
        for trial in range(args.trials):
            provider.script(STORY_REPLY, SHORT_REPLY)
            clip, _ = clips[trial % len(clips)]
            sentence, _ = trimmed(clip, workdir)
            barge_ins = len(room.records("barge_in"))
            started = room.start_story(request)
            if started is None:
                condition.interruptions.append(None)
                continue
            while room.speaker.seconds() < started + INTERRUPT_AFTER_S:
                time.sleep(0.05)
            said_at = room.say_at(sentence)
            deadline = time.monotonic() + DECISION_S  # the verdict on speech during a reply may come after it
            while len(room.records("barge_in")) <= barge_ins and time.monotonic() < deadline:
                time.sleep(0.1)
            heard = len(room.records("barge_in")) > barge_ins
            playing = sound_frames(room.speaker.samples())[
                int((said_at - 0.5) * 1000 / FRAME_MS) : int(said_at * 1000 / FRAME_MS)
            ]
            if not heard and not playing.any():  # the story was not playing: no interruption to judge
                print(f"  trial {trial + 1}: the story was over before the sentence; left out", file=sys.stderr)
                condition.skipped += 1
                room.wait_quiet()
                continue
            if not heard:  # why: what the program made of it
                said = [(r["event"], r.get("text") or r.get("reason")) for r in room.records("user_transcript")[-2:]]
                said += [("reply_resumed", r.get("reason")) for r in room.records("reply_resumed")[-1:]]
                print(f"  not heard: {clip.name}; latest: {said}", file=sys.stderr, flush=True)
            room.wait_quiet()  # the speaker's recording lags the program: it must hold the pause first
            quiet = room.speaker_quiet_from(said_at)
            condition.interruptions.append((quiet - said_at) * 1000 if heard and quiet is not None else None)
            time.sleep(SETTLE_S)
        provider.script(Reply([Text(["Okay."])]))
        for clip, reference in clips[: args.questions]:
            sentence, _ = trimmed(clip, workdir)
            count = len(room.records("user_transcript"))
            room.server.say(sentence)
            deadline = time.monotonic() + 30
            while len(room.records("user_transcript")) <= count and time.monotonic() < deadline:
                time.sleep(0.1)
            heard = room.records("user_transcript")[count:]
            condition.wers.append(word_error_rate(reference, " ".join(r["text"] for r in heard)))
            room.wait_quiet()
            metrics = [r for r in room.records("speech_stopped") if r.get("endpoint_delay_ms") is not None]
            if metrics:
                condition.endpoint_ms.append(float(metrics[-1]["endpoint_delay_ms"]))
            ended = {k: v for k, v in (metrics[-1] if metrics else {}).items() if k.startswith("endpoint")}
            said = " | ".join(r["text"] for r in heard)
            print(f"  question {clip.name}: heard {said!r}; {ended}", file=sys.stderr, flush=True)
            time.sleep(SETTLE_S)
    finally:
        room.close()
        provider.stop()


def canceller_cpu_ms() -> float:
    """CPU time of :class:`EchoCanceller` per second of audio, ms (the Piper voice playing, one core)."""
    import soxr

    from speech_to_speech.speech.echo_cancel import EchoCanceller
    from speech_to_speech.speech.playback import PlaybackReference
    from speech_to_speech.testing.turns import synthesize

    voice = synthesize(" ".join(item.text for item in STORY_REPLY.output if isinstance(item, Text)))
    reference = PlaybackReference()
    canceller = EchoCanceller(reference)
    played = soxr.resample(voice, TAP_RATE, 24_000).astype(np.float32)
    start = time.process_time()
    for i in range(0, len(voice) - 511, 512):
        reference.add(played[i * 3 // 2 : (i + 512) * 3 // 2], 24_000, i / TAP_RATE)
        canceller.process(voice[i : i + 512] * 0.3, (i + 512) / TAP_RATE)
    return (time.process_time() - start) * 1000 / (len(voice) / TAP_RATE)


def report(conditions: list[Condition], file: Any = None) -> None:
    """One row per condition (on ``file``, default stdout)."""
    from speech_to_speech.testing.bench import cell, percentile, print_table

    rows = []
    for c in conditions:
        heard = [d for d in c.interruptions if d is not None]
        rows.append(
            [
                "on" if c.echo_cancel else "off",
                c.noise if c.noise == "none" else f"{c.noise} {c.snr_db:g} dB",
                f"{len(heard)}/{len(c.interruptions)}",
                cell(percentile(heard, 50)),
                f"{c.false_stops}/{c.stories}",
                str(c.resumed),
                cell(statistics.mean(c.wers), 2) if c.wers else "-",
                cell(percentile(c.endpoint_ms, 50)),
                c.error or "",
            ]
        )
    headers = ["canceller", "noise", "interruptions heard", "quiet p50 ms", "false stops", "paused, resumed"]
    headers += ["WER", "end of turn p50"]
    if file is None:
        print_table([*headers, "error"], rows)
        return
    for row in rows:
        print("  " + " | ".join(f"{h}: {v}" for h, v in zip([*headers, "error"], row, strict=True)), file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="interruptions per condition")
    parser.add_argument("--stories", type=int, default=3, help="stories left to play per condition")
    parser.add_argument("--questions", type=int, default=3, help="LibriVox questions per condition")
    parser.add_argument("--echo_gain", type=float, default=0.7, help="the echo's PulseAudio volume (1.0: 100 %%)")
    parser.add_argument("--echo_cancel", choices=("on", "off", "both"), default="both")
    parser.add_argument("--noise", default="none", help=f"comma-separated: none, {', '.join(NOISES)}")
    parser.add_argument(
        "--background_gate",
        choices=("auto", "false"),
        default="auto",
        help="the program's --background_gate (auto, its default: on for its microphone; false: off)",
    )
    parser.add_argument("--snr_db", type=float, default=10.0, help="noise level under the user's speech, dB")
    args = parser.parse_args(argv)
    noises = [n.strip() for n in args.noise.split(",") if n.strip()]
    if any(n not in ("none", *NOISES) for n in noises):
        parser.error(f"--noise takes none, {', '.join(NOISES)}")
    missing = missing_tools()
    if missing:
        print(f"{PROG}: error: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    cancels = {"on": [True], "off": [False], "both": [True, False]}[args.echo_cancel]
    conditions = [Condition(c, n, None if n == "none" else args.snr_db) for n in noises for c in cancels]
    for condition in conditions:
        label = f"canceller {'on' if condition.echo_cancel else 'off'}, noise {condition.noise}"
        print(f"{label} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="s2s-room-") as tmp:
            run_condition(condition, args, Path(tmp))
        report([condition], file=sys.stderr)  # as it comes: a long run keeps what it measured
    print(
        f"\nthe room: the echo at {args.echo_gain:g} volume, {ECHO_MS} ms late, a reflection {REFLECTION_MS} ms later;"
        f" the background gate {'on' if args.background_gate == 'auto' else 'off'}"
    )
    report(conditions)
    print(f"\nthe canceller's CPU time: {canceller_cpu_ms():.1f} ms per second of audio (one core)")
    return 1 if any(c.error for c in conditions) else 0


if __name__ == "__main__":
    raise SystemExit(main())
