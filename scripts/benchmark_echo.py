#!/usr/bin/env python
"""Interrupting the assistant over its own voice: the browser page with its audio really playing.

A room, made of a private PulseAudio (``speech_to_speech.testing.room.SoundServer``): Chromium plays the
assistant's voice on the default sink, and its microphone hears both the user (LibriVox clips
played into it) and that sink, 40 ms late, at ``--echo_gain`` (the echo of a laptop's speakers).
Chromium is headless but not muted, and its microphone is that room's, so its own echo canceller
(AEC3) works as on a user's machine: it knows what it plays and removes it from what it hears.

The realtime server runs in this process with the embedded VAD, STT and TTS, its LLM the
scripted ``/v1/responses`` endpoint of ``speech_to_speech/testing/responses_server.py`` (a five-sentence story, about
15 s spoken; and "Sure, go ahead." after an interruption), so each trial is quick and the same.
For each condition (the browser's echo canceller on or off, the server's echo gate on or off) the
page types "Tell me a story." ``--trials`` times twice:

- **interruption**: 2 s into the story a LibriVox sentence is played into the microphone. It
  counts as stopped when the story's response ends ``cancelled``; the stop delay runs from the
  start of the sentence to the moment the page sees it cancelled.
- **echo alone**: nobody speaks. A **false stop** is a story that does not end ``completed``;
  **echo turns** are the user turns the page shows meanwhile (the assistant heard itself).

    python scripts/benchmark_echo.py [--trials 10] [--echo_gain 0.7] [--browser_aec on|off|both]
                                     [--echo_gate on|off|both]

Prints one row per condition. Needs ``pulseaudio``, ``pactl``/``paplay``/``parecord`` and
Debian's ``chromium``; exit status 1 when something is missing or a trial could not run.
``tests/test_browser_echo.py`` runs the same room for a few trials.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from speech_to_speech.testing.cdp import Chromium, find_chromium
from speech_to_speech.testing.realtime import InProcessServer
from speech_to_speech.testing.responses_server import STORY_REPLY, Reply, ResponsesServer, Text
from speech_to_speech.testing.room import FRAME_MS, Recording, SoundServer, missing_tools, sound_frames, trimmed
from speech_to_speech.testing.runs import responses_api_flags
from speech_to_speech.testing.speech_data import librivox_clips

PROG = "benchmark_echo.py"
#: what the page types to start each story
REQUEST = "Tell me a story."
#: the reply to an interruption
SHORT_REPLY = Reply([Text(["Sure, go ahead."])])
#: the interruption starts this long after the story becomes audible, s
INTERRUPT_AFTER_S = 2.0
#: the longest wait for a step (the page connected, a reply audible, a reply finished), s
WAIT_S = 120.0
#: the voice counts as stopped at the first quiet stretch this long on the speaker, s (longer than
#: the pauses between its sentences)
STOPPED_QUIET_S = 0.7
#: quiet time between trials, s (the last echo dies away, a late turn shows)
SETTLE_S = 3.0
#: makes the page's microphone ask for no echo canceller (a client without one)
NO_AEC_SCRIPT = """
const ask = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
navigator.mediaDevices.getUserMedia = (c) =>
  ask(c && c.audio ? { ...c, audio: { ...c.audio, echoCancellation: false } } : c);
"""
RESPONSES = "[...s2s.responses.values()]"


@dataclass
class Trial:
    """One story: interrupted by a sentence, or left to play with its echo alone.

    Attributes:
        kind: ``"interruption"`` or ``"echo"``.
        status: how the story's response ended (``completed``, ``cancelled``, ...).
        stop_ms: interruption: from the start of the sentence until the page saw the story
            cancelled, ms (None if it was not). The voice pauses as soon as speech starts and
            the words decide (see ``audio_stop_ms``); this is the decision.
        audio_stop_ms: interruption: from the start of the sentence until the speaker went quiet
            (the first :data:`STOPPED_QUIET_S` of silence on its recording), ms.
        echo_turns: user turns the page showed during the story that nobody spoke.
        heard: interruption: what the server transcribed of the sentence.
    """

    kind: str
    status: str
    stop_ms: float | None = None
    audio_stop_ms: float | None = None
    echo_turns: int = 0
    heard: str = ""


@dataclass
class Condition:
    """The browser's echo canceller and the server's echo gate, and the trials run with them."""

    browser_aec: bool
    echo_gate: bool
    trials: list[Trial] = field(default_factory=list)
    #: why the trials stopped early (the page never settled: the assistant kept answering its echo)
    stuck: str = ""

    @property
    def name(self) -> str:
        return f"browser AEC {'on' if self.browser_aec else 'off'}, echo gate {'on' if self.echo_gate else 'off'}"

    def row(self) -> str:
        interruptions = [t for t in self.trials if t.kind == "interruption"]
        echoes = [t for t in self.trials if t.kind == "echo"]
        stopped = [t for t in interruptions if t.status == "cancelled"]
        false_stops = sum(t.status != "completed" for t in echoes)
        delays = [t.stop_ms for t in stopped if t.stop_ms is not None]
        delay = f"{statistics.median(delays):.0f}" if delays else "-"
        quiet = [t.audio_stop_ms for t in stopped if t.audio_stop_ms is not None]
        audio = f"{statistics.median(quiet):.0f}" if quiet else "-"
        echo_turns = sum(t.echo_turns for t in echoes)
        stuck = f" | stopped after {len(interruptions)} trials: {self.stuck}" if self.stuck else ""
        return (
            f"{self.name:34} | {len(stopped)} of {len(interruptions)} stopped | {false_stops} of {len(echoes)} "
            f"false stops | {echo_turns} echo turns | voice quiet p50 {audio} ms | cancelled p50 {delay} ms{stuck}"
        )


class EchoRoom:
    """The room (sound server with an echo), the realtime server and the page, connected.

    Use :meth:`open` (an async context manager); then :meth:`interruption` and :meth:`echo_alone`.
    """

    def __init__(self, sound: SoundServer, provider: ResponsesServer, browser: Chromium, speaker: Recording) -> None:
        self.sound = sound
        self.speaker = speaker
        self.provider = provider
        self.browser = browser

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, workdir: Path, echo_gain: float, browser_aec: bool, echo_gate: bool) -> AsyncIterator[EchoRoom]:
        """The room in ``workdir``, with the page connected to a fresh server.

        Raises:
            RuntimeError: the sound server or Chromium is missing, or the page did not connect.
        """
        binary = find_chromium()
        missing = missing_tools() + ([] if binary else ["chromium"])
        if missing or binary is None:
            raise RuntimeError("missing: " + ", ".join(missing))
        sound = SoundServer(workdir, echo_gain=echo_gain)
        provider = ResponsesServer().start()
        server: InProcessServer | None = None
        browser: Chromium | None = None
        try:
            flags = (*responses_api_flags(provider.base_url, "story"), "--echo_gate", str(echo_gate).lower())
            server = await asyncio.to_thread(InProcessServer(*flags).start)
            profile = workdir / f"profile-{time.monotonic_ns()}"
            browser = Chromium(binary, profile, ["--use-fake-ui-for-media-stream"], mute_audio=False, env=sound.env)
            await browser.start()
            if not browser_aec:
                await browser.call("Page.addScriptToEvaluateOnNewDocument", source=NO_AEC_SCRIPT)
            await browser.open(f"http://127.0.0.1:{server.port}/")
            await browser.evaluate("document.getElementById('connect').click()")
            await browser.wait_for("window.s2s.connected && window.s2s.live", WAIT_S, "connected")
            speaker = sound.record(workdir / "speaker.wav", "speaker.monitor")
            await asyncio.sleep(SETTLE_S)
            yield cls(sound, provider, browser, speaker)
        finally:
            if browser is not None:
                await browser.close()
            if server is not None:
                await asyncio.to_thread(server.stop)
                await asyncio.to_thread(server.wait_until_idle)
            provider.stop()
            sound.close()

    async def _story(self) -> int:
        """Type the request once the page is idle; return the story's index among the responses."""
        await self._settle()
        self.provider.script(STORY_REPLY, SHORT_REPLY)
        index = int(await self.browser.evaluate("s2s.responses.size"))
        await self.browser.evaluate(f"document.getElementById('text-input').value = {json.dumps(REQUEST)}")
        await self.browser.evaluate("document.getElementById('composer').requestSubmit()")
        audible = f"s2s.responses.size > {index} && {RESPONSES}[{index}].audible"
        try:
            await self.browser.wait_for(audible, WAIT_S, "the story audible")
        except TimeoutError:
            state = await self.browser.evaluate(
                f"JSON.stringify({{message: document.getElementById('message').textContent, "
                f"responses: {RESPONSES}.map((r) => r.status), log: s2s.events.slice(-12), "
                "users: [...document.querySelectorAll('.turn.user .text')].map((e) => e.textContent)})"
            )
            raise TimeoutError(f"the story never became audible: {state}") from None
        return index

    async def _settle(self) -> None:
        """Wait until the page has shown "listening" for :data:`SETTLE_S` in a row, every response finished."""
        idle = f"{RESPONSES}.every((r) => r.finished) && document.getElementById('who').className.includes('listening')"
        deadline = time.monotonic() + WAIT_S
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < SETTLE_S:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never settled within {WAIT_S:g} s")
            if not await self.browser.evaluate(idle):
                quiet_since = time.monotonic()
            await asyncio.sleep(0.05)

    async def _status(self, index: int) -> str:
        return str(await self.browser.evaluate(f"{RESPONSES}[{index}].status || ''"))

    async def _spoken_turns(self) -> list[str]:
        texts = await self.browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('.turn.user:not(.typed) .text')].map((e) => e.textContent))"
        )
        return list(json.loads(texts))

    async def interruption(self, clip: Path) -> Trial:
        """A story, interrupted :data:`INTERRUPT_AFTER_S` in by ``clip`` played into the microphone."""
        index = await self._story()
        await asyncio.sleep(INTERRUPT_AFTER_S)
        before = len(await self._spoken_turns())
        mark = self.speaker.seconds()
        started = time.monotonic()
        speaking = asyncio.create_task(asyncio.to_thread(self.sound.say, clip))
        stop_ms = None
        while time.monotonic() - started < WAIT_S:
            if await self.browser.evaluate(f"{RESPONSES}[{index}].finished"):
                if await self._status(index) == "cancelled":
                    stop_ms = (time.monotonic() - started) * 1000
                break
            await asyncio.sleep(0.05)
        await speaking
        await self._settle()
        turns = await self._spoken_turns()
        status, heard = await self._status(index), " / ".join(turns[before:])
        return Trial("interruption", status, stop_ms, self._quiet_after(mark), heard=heard)

    def _quiet_after(self, mark_s: float) -> float | None:
        """From ``mark_s`` into the speaker's recording to its first :data:`STOPPED_QUIET_S` of silence, ms."""
        sound = sound_frames(self.speaker.samples())
        first, run = round(mark_s * 1000 / FRAME_MS), round(STOPPED_QUIET_S * 1000 / FRAME_MS)
        quiet = ~sound[first:]
        for i in range(len(quiet) - run + 1):
            if quiet[i : i + run].all():
                return i * FRAME_MS
        return None

    async def echo_alone(self) -> Trial:
        """A story played to its end with nobody speaking (only its echo reaches the microphone)."""
        before = len(await self._spoken_turns())
        index = await self._story()
        await self.browser.wait_for(f"{RESPONSES}[{index}].finished", WAIT_S, "the story finished")
        await self._settle()
        echo_turns = len(await self._spoken_turns()) - before
        return Trial("echo", await self._status(index), echo_turns=echo_turns)


async def run_condition(condition: Condition, trials: int, echo_gain: float, workdir: Path) -> Condition:
    """Run ``trials`` interruptions and ``trials`` stories with their echo alone, alternating."""
    clips = sorted(librivox_clips())
    async with EchoRoom.open(workdir, echo_gain, condition.browser_aec, condition.echo_gate) as room:
        for i in range(trials):
            clip, _ = trimmed(clips[i % len(clips)], workdir)
            try:
                done = [await room.interruption(clip), await room.echo_alone()]
            except TimeoutError as exc:  # the assistant keeps answering its own echo: nothing settles
                condition.stuck = str(exc)
                print(f"  {condition.name}: trial {i + 1}: {exc}; the condition ends here", flush=True)
                return condition
            for trial in done:
                condition.trials.append(trial)
                detail = f" (heard {trial.heard!r})" if trial.kind == "interruption" else ""
                outcome = f"{trial.status}, {trial.echo_turns} echo turns{detail}"
                print(f"  {condition.name}: {trial.kind} {i + 1}: {outcome}", flush=True)
    return condition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="interruptions (and as many echo-only stories)")
    parser.add_argument("--echo_gain", type=float, default=0.7, help="echo volume (PulseAudio, 1.0 = 100 %%)")
    parser.add_argument("--browser_aec", choices=("on", "off", "both"), default="both")
    parser.add_argument("--echo_gate", choices=("on", "off", "both"), default="both")
    parser.add_argument("--debug", action="store_true", help="log what the echo gate sets aside")
    args = parser.parse_args(argv)
    if args.debug:
        logging.basicConfig(format="%(relativeCreated)8.0f %(message)s")
        logging.getLogger("speech_to_speech.turns.echo").setLevel(logging.DEBUG)
        logging.getLogger("speech_to_speech.turns.interruptions").setLevel(logging.INFO)
    choose = {"on": [True], "off": [False], "both": [True, False]}
    conditions = [Condition(aec, gate) for aec in choose[args.browser_aec] for gate in choose[args.echo_gate]]
    per = f"{args.trials} interruptions and {args.trials} stories alone per condition"
    print(f"{PROG}: {per}, echo gain {args.echo_gain}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="s2s-echo-") as tmp:
            for condition in conditions:
                asyncio.run(run_condition(condition, args.trials, args.echo_gain, Path(tmp)))
    except (RuntimeError, TimeoutError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    for condition in conditions:
        print(condition.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
