"""Turn-taking benchmark: endpoint delay and false cut-offs, backchannels and interruptions.

::

    python scripts/benchmark_turns.py              # everything (about 3 minutes on 2 cores)
    python scripts/benchmark_turns.py --skip_live  # (a) only: endpointing, offline (about 30 s)

(a) **Endpointing**, offline (the real Silero VAD stage, and Smart Turn unless
    ``--turn_detection silence``, fed faster than real time; delays on the input's own
    timeline plus the model's real compute time). *Finished turns*: the LibriVox sentences of
    ``pocketsphinx-testdata`` cut to their speech, then 2.5 s of silence. *Unfinished turns*:
    the same sentences cut mid-phrase (at a word end between 50 and 70 % of the speech, after
    a word a phrase cannot end on: "an", "to", "had", ...; at the quietest 10 ms near it), then
    the same silence. **Endpoint delay**: from where the VAD heard speech end to the endpoint
    decision. **False cut-off**: an unfinished turn ended before 1.5 s of silence (a user who
    pauses that long mid-sentence would have the first half answered); **split**: a finished
    sentence ended at one of its own pauses. Rows per mode and Smart Turn threshold.
(b) **Backchannels during a long reply**, in real time through the whole local pipeline
    (Silero, Smart Turn, faster-whisper, Piper; a scripted LLM that answers the spoken question
    with a 19 s reply): "Yeah.", "Uh huh.", "Mm hmm.", "Okay.", "Right." played one after
    another while the reply plays, 1.5 s after it resumed, as Piper renditions (its sampling
    noise on: a new rendition each time) and, when ``espeak-ng`` is installed, in its voice.
    **Cancelled**: the backchannel cut the reply (a BargeIn); **resume delay**: from the end of
    the backchannel's audio to the reply playing again; **stop**: from the VAD hearing the
    speech to the sink pausing, and **onset->stop** from the first loud sample of the
    utterance (its VAD detection included) to the same.
(c) **Real interruptions** ("Wait, stop.", "No, that is not what I asked.", "Hold on a
    second."), each 1 s into a fresh reply to the question: cancelled or not, the stop time
    as in (b), and the decision time (speech start to the BargeIn).

(d) **Through the realtime server** (``--skip_server`` leaves it out): (b) and (c) again, the
    client a microphone over WebSocket (real-time audio), the server's default turn detection.
    **Cancelled**: ``speech_started`` was reported (clients stop playback on it) or the reply
    was cancelled; **deltas stop**: from the utterance's first block sent to the last audio
    delta before the pause (what the client holds then, up to the server's 250 ms lead, plays
    out); **resume delay**: from its last block sent to the reply's audio coming back.

Goals (issue 10): endpoint delay p50 <= 250 ms on finished turns with false cut-offs <= 10 %;
no backchannel cancels a reply; a real interruption stops the audio within 100 ms.
Exit status: 0 when every run worked, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speech_to_speech.core.events import BargeIn, FirstAudio, ReplyPaused, ReplyResumed, ResponseDone, SpeechStarted
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.bench import cell, percentile, print_table
from speech_to_speech.testing.realtime import EventTimeout
from speech_to_speech.testing.turns import (
    LONGER_REPLY,
    QUESTION,
    ScriptedLLM,
    TurnRun,
    librivox_speech,
    mid_phrase_cuts,
    offline_endpoints,
    silence,
    speech_only,
    synthesize,
)

#: silence after each offline clip, s
TAIL_S = 2.5
#: a pause mid-sentence this long must not end the turn (false cut-off), ms
MID_PAUSE_MS = 1500
BACKCHANNELS = ("Yeah.", "Uh huh.", "Mm hmm.", "Okay.", "Right.")
INTERRUPTIONS = ("Wait, stop.", "No, that is not what I asked.", "Hold on a second.")
#: how long the reply plays (again) before the next backchannel or interruption, s
PLAY_S = 1.5
#: the synthesised utterances keep this much audio before their first loud frame, s
ONSET_MARGIN_S = 0.03


# -- (a) endpointing --------------------------------------------------------------------------------
@dataclass
class Row:
    """One mode's endpointing numbers."""

    name: str
    finished_delays: list[float]
    finished_split: int
    finished_n: int
    cut_early: int
    unfinished_n: int


def endpointing(flags: list[str], name: str, finished: list[np.ndarray], unfinished: list[np.ndarray]) -> Row:
    delays, split = [], 0
    for samples in finished:
        found = offline_endpoints(np.concatenate([silence(0.3), samples, silence(TAIL_S)]), flags)
        split += len(found) > 1
        if found:
            delays.append(found[-1].delay_ms)
    early = 0
    for samples in unfinished:
        found = offline_endpoints(np.concatenate([silence(0.3), samples, silence(TAIL_S)]), flags)
        early += bool(found) and found[0].decided_ms - found[0].speech_end_ms < MID_PAUSE_MS
    return Row(name, delays, split, len(finished), early, len(unfinished))


def with_transcripts(row: Row, flags: list[str], finished: list[np.ndarray], unfinished: list[np.ndarray]) -> Row:
    """``row``'s mode plus the text end of turn (:class:`~speech_to_speech.turns.vad.TranscriptEndsTurn`):
    where the model has not ended a turn by the text rule's silence, the speech is transcribed as
    the speculative pass does (the STT stage of the defaults, tiny.en) and, when its transcript
    reads finished (:func:`~speech_to_speech.turns.turn_detection.transcript_ends_turn`), the turn
    ends after ``--turn_question_silence_ms`` / ``--turn_statement_silence_ms`` of silence."""
    from speech_to_speech.testing.bench import build_handler
    from speech_to_speech.turns.turn_detection import FINISHED_QUESTION, transcript_ends_turn

    args = parse_args(flags)
    stt = build_handler("stt", args)
    stt.setup()

    def text_rule_ms(samples: np.ndarray) -> float | None:
        finished = transcript_ends_turn(stt.transcribe(samples, 16_000)[0])
        if finished is None:
            return None
        return args.turn_question_silence_ms if finished == FINISHED_QUESTION else args.turn_statement_silence_ms

    delays, split = [], 0
    for samples in finished:
        found = offline_endpoints(np.concatenate([silence(0.3), samples, silence(TAIL_S)]), flags)
        split += len(found) > 1
        if found:
            text_ms = text_rule_ms(samples) if found[-1].delay_ms > args.turn_question_silence_ms else None
            delays.append(min(found[-1].delay_ms, text_ms) if text_ms else found[-1].delay_ms)
    early = 0
    for samples in unfinished:
        found = offline_endpoints(np.concatenate([silence(0.3), samples, silence(TAIL_S)]), flags)
        model_ms = found[0].decided_ms - found[0].speech_end_ms if found else None
        text_ms = text_rule_ms(samples)
        ends = [x for x in (model_ms, text_ms) if x is not None]
        early += bool(ends) and min(ends) < MID_PAUSE_MS
    return Row(f"{row.name} + transcript", delays, split, len(finished), early, len(unfinished))


def run_endpointing(thresholds: list[float]) -> list[Row]:
    clips = librivox_speech()
    finished = [samples for samples, _ in clips.values()]
    unfinished = []
    for name, (samples, _) in clips.items():
        cuts = mid_phrase_cuts(samples)
        print(f"  {name}: {len(cuts)} mid-phrase cut(s) after {[c.last_word for c in cuts]}")
        unfinished += [c.samples for c in cuts]
    rows = [endpointing(["--turn_detection", "silence"], "silence (min_silence_ms 500)", finished, unfinished)]
    for threshold in thresholds:
        flags = ["--turn_detection", "smart_turn", "--turn_threshold", str(threshold)]
        rows.append(endpointing(flags, f"smart_turn, threshold {threshold:g}", finished, unfinished))
    # the defaults: the model at its default threshold, and the transcript of the pause
    default = parse_args([]).turn_threshold
    smart = next(r for r in rows if r.name == f"smart_turn, threshold {default:g}")
    rows.append(with_transcripts(smart, [], finished, unfinished))
    return rows


def print_endpointing(rows: list[Row]) -> None:
    table = []
    for row in rows:
        table.append(
            [
                row.name,
                cell(percentile(row.finished_delays, 50)),
                cell(percentile(row.finished_delays, 90)),
                f"{row.finished_split}/{row.finished_n}",
                f"{row.cut_early}/{row.unfinished_n} ({100 * row.cut_early / max(1, row.unfinished_n):.0f} %)",
            ]
        )
    print_table(["(a) endpointing", "finished p50 ms", "finished p90 ms", "split", "false cut-offs"], table)


# -- (b), (c) live -------------------------------------------------------------------------------------
def espeak(text: str) -> np.ndarray | None:
    """``text`` in espeak-ng's en-us voice at 16 kHz, or None without espeak-ng."""
    if shutil.which("espeak-ng") is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "say.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "170", "-w", str(path), text], check=True)
        return speech_only(load_audio(path), margin_s=0.03)


@dataclass
class Trial:
    """One utterance played during a reply."""

    voice: str
    text: str
    cancelled: bool
    stop_ms: float | None
    onset_stop_ms: float | None
    resume_delay_ms: float | None
    decision_ms: float | None
    #: what decided: the verdict's reason and the transcript it judged ("" where not known)
    verdict: str = ""


def reply_playing_again(run: TurnRun, seconds: float) -> Any:
    """A condition: the reply is playing, and has been for ``seconds`` since it started or resumed."""

    def ready() -> bool:
        marks = [e for e in run.log.events if isinstance(e, (FirstAudio, ReplyPaused, ReplyResumed, BargeIn))]
        if not marks or isinstance(marks[-1], (ReplyPaused, BargeIn)):
            return bool(marks) and isinstance(marks[-1], BargeIn)  # cut: nothing to wait for
        return time.monotonic() >= marks[-1].time + seconds

    return ready


def live_trials(tmp: Path, voice: str, utterances: list[tuple[str, np.ndarray]], fresh_reply: bool) -> list[Trial]:
    """Play ``utterances`` during replies; one reply for all (backchannels) or one each (interruptions)."""
    ScriptedLLM.long_reply = LONGER_REPLY
    run = TurnRun(tmp)
    question = speech_only(load_audio(QUESTION))
    parts: list[Any] = []
    spans: list[int] = []  # index into parts of each utterance
    for i, (_, samples) in enumerate(utterances):
        if fresh_reply or i == 0:
            if i:  # the answer to the interruption has ended: the question starts a turn of its own
                parts.append(lambda: not run.pipeline.replies or not run.pipeline.replies.turns())
            parts += [question, nth_reply_playing(run, sum(p is question for p in parts))]
        else:
            parts.append(reply_playing_again(run, PLAY_S))
        spans.append(len(parts))
        parts += [samples, silence(0.2)]
    parts += [lambda: len(run.log.of(ResponseDone)) >= (len(utterances) * 2 if fresh_reply else 1), silence(0.3)]
    source = run.script(parts, wait_s=40.0)
    run.go()
    trials = []
    starts = run.log.of(SpeechStarted)
    bounds = [source.wall_time(source.marks[index][0]) for index in spans] + [float("inf")]
    for n, ((text, _), index) in enumerate(zip(utterances, spans, strict=True)):
        begin_t, end_t = source.wall_time(source.marks[index][0]), source.wall_time(source.marks[index][1])
        started = next((e for e in starts if begin_t - 0.1 <= e.time <= end_t + 0.3), None)
        # what happened to the reply after this utterance began, before the next one did
        window = [e for e in run.log.events if begin_t - 0.1 <= e.time < bounds[n + 1] - 0.1]
        verdict = next((e for e in window if isinstance(e, (ReplyResumed, BargeIn))), None)
        pause = next((p for p in run.pauses if started is not None and p >= started.time - 0.01), None)
        trials.append(
            Trial(
                voice,
                text,
                isinstance(verdict, BargeIn),
                None if pause is None or started is None else (pause - started.time) * 1000,
                None if pause is None else (pause - begin_t - ONSET_MARGIN_S) * 1000,
                (verdict.time - end_t) * 1000 if isinstance(verdict, ReplyResumed) else None,
                verdict.decision_ms if isinstance(verdict, BargeIn) else None,
                f"{verdict.reason} {verdict.text!r}" if verdict is not None else "none",
            )
        )
    return trials


def nth_reply_playing(run: TurnRun, n: int) -> Any:
    """A condition: the ``n``-th reply to the question (0-based) has played :data:`PLAY_S`."""

    def ready() -> bool:
        first = [e for e in run.log.of(FirstAudio) if e.turn_id in _long_reply_turns(run)]
        return len(first) > n and time.monotonic() >= first[n].time + PLAY_S

    return ready


def _long_reply_turns(run: TurnRun) -> set[int]:
    return {e.turn_id for e in run.log.of(SpeechStarted) if not e.pauses_reply and e.revision == 0}


def print_live(title: str, trials: list[Trial], interruptions: bool, server: bool = False) -> None:
    """One table row per trial; ``server``: the columns of (d) (no sink times, no verdict text)."""
    last = "decision ms" if interruptions else "resume delay ms"
    if server:
        last = "speech_started after ms" if interruptions else last
    header = [title, "cancelled", "deltas stop ms" if server else "stop ms"]
    header += [last] if server else ["onset->stop ms", last, "verdict"]
    rows = []
    for t in trials:
        row = [f"{t.voice}: {t.text}", "yes" if t.cancelled else "no", cell(t.stop_ms)]
        if not server:
            row.append(cell(t.onset_stop_ms))
        row.append(cell(t.decision_ms if interruptions else t.resume_delay_ms))
        rows.append(row if server else [*row, t.verdict])
    print_table(header, rows)


# -- (d) through the realtime server ------------------------------------------------------------------


def server_trials(server: Any, voice: str, utterances: list[tuple[str, np.ndarray]], fresh_reply: bool) -> list[Trial]:
    """Say ``utterances`` over WebSocket during the server's reply to the question: all during one
    reply (backchannels, 3 s apart) or each during a reply of its own (interruptions).

    Trial fields here: ``stop_ms`` is from the utterance's first block sent to the last audio
    delta before the reply's audio paused (what the client had then, at most ``ClientSink.lead_s``,
    plays out); ``resume_delay_ms`` from its last block sent to the reply's audio coming back;
    ``decision_ms`` from its first block to ``speech_started`` (sent only for an interruption).
    """
    from speech_to_speech.testing.realtime import audio_arrivals, longest_gap, talk_over_reply

    ScriptedLLM.long_reply = LONGER_REPLY
    question = speech_only(load_audio(QUESTION))
    batches = [utterances] if not fresh_reply else [[u] for u in utterances]
    trials = []
    for batch in batches:
        responses = 2 if fresh_reply else 1

        def ended(events: list[dict[str, Any]], responses: int = responses) -> bool:
            return sum(e["type"] == "response.done" for e in events) >= responses

        talk = talk_over_reply(server.ws_url, question, [s for _, s in batch], ended, server=server, every_s=3.0)
        r = asyncio.run(asyncio.wait_for(talk, 120))
        first = next(e for e in r.events if e["type"] == "response.created")["response"]["id"]
        arrivals = audio_arrivals(r.events, r.times, first)
        starts = [t for e, t in zip(r.events, r.times, strict=True) if e["type"] == "input_audio_buffer.speech_started"]
        done = next(e for e in r.events if e["type"] == "response.done" and e["response"]["id"] == first)
        for (text, _), (began, ended_at) in zip(batch, r.said[1:], strict=True):
            gap, gap_start = longest_gap(arrivals, began, began + 2.9)
            after = [t for t, _ in arrivals if t > gap_start + gap - 0.01]
            reported = [t for t in starts if began - 0.1 <= t <= began + 2.9]
            cancelled = bool(reported) or (fresh_reply and done["response"]["status"] == "cancelled")
            trials.append(
                Trial(
                    voice,
                    text,
                    cancelled,
                    (gap_start - began) * 1000 if gap >= 0.2 or cancelled else None,
                    None,
                    (after[0] - ended_at) * 1000 if after and not cancelled else None,
                    (reported[0] - began) * 1000 if reported else None,
                )
            )
    return trials


def run_server(voices: list[tuple[str, list[tuple[str, np.ndarray]]]]) -> tuple[list[Trial], list[Trial]]:
    """(d): the backchannels and interruptions of (b) and (c), over WebSocket to the server in process."""
    from speech_to_speech.testing.realtime import InProcessServer

    server = InProcessServer("--llm_backend", "turn-script").start()
    try:
        backchannels = [t for voice, said in voices for t in server_trials(server, voice, said, fresh_reply=False)]
        said = [(text, synthesize(text)) for text in INTERRUPTIONS]
        return backchannels, server_trials(server, "piper", said, fresh_reply=True)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip_live", action="store_true", help="only (a), the offline endpointing")
    parser.add_argument("--thresholds", default="0.5,0.7,0.9", help="Smart Turn thresholds for (a)")
    parser.add_argument("--skip_server", action="store_true", help="leave out (d), through the realtime server")
    args = parser.parse_args(argv)
    began = time.monotonic()
    failures = 0
    print("(a) endpointing on LibriVox, offline")
    rows = run_endpointing([float(t) for t in args.thresholds.split(",")])
    print()
    print_endpointing(rows)
    backchannels: list[Trial] = []
    interruptions: list[Trial] = []
    if not args.skip_live:
        voices: list[tuple[str, list[tuple[str, np.ndarray]]]] = [
            ("piper", [(text, synthesize(text, noisy=True)) for text in BACKCHANNELS])
        ]
        spoken = [(text, espeak(text)) for text in BACKCHANNELS]
        if all(samples is not None for _, samples in spoken):
            voices.append(("espeak", [(t, s) for t, s in spoken if s is not None]))
        for voice, utterances in voices:
            with tempfile.TemporaryDirectory() as folder:
                try:
                    backchannels += live_trials(Path(folder), voice, utterances, fresh_reply=False)
                except AssertionError as exc:
                    failures += 1
                    print(f"(b) {voice}: the run failed: {exc}")
        with tempfile.TemporaryDirectory() as folder:
            try:
                said = [(text, synthesize(text)) for text in INTERRUPTIONS]
                interruptions = live_trials(Path(folder), "piper", said, fresh_reply=True)
            except AssertionError as exc:
                failures += 1
                print(f"(c) the run failed: {exc}")
        print()
        print_live("(b) backchannel during a reply", backchannels, interruptions=False)
        print()
        print_live("(c) real interruption", interruptions, interruptions=True)
        if not args.skip_server:
            try:
                server_backchannels, server_interruptions = run_server(voices)
            except (AssertionError, TimeoutError, EventTimeout) as exc:
                failures += 1
                server_backchannels, server_interruptions = [], []
                print(f"(d) the run failed: {exc!r}")
            print()
            print_live("(d) server: backchannel", server_backchannels, interruptions=False, server=True)
            print()
            print_live("(d) server: real interruption", server_interruptions, interruptions=True, server=True)
    print()
    default = parse_args([]).turn_threshold
    smart = next((r for r in rows if r.name == f"smart_turn, threshold {default:g} + transcript"), rows[-1])
    p50 = percentile(smart.finished_delays, 50)
    false_share = 100 * smart.cut_early / max(1, smart.unfinished_n)
    goals = [
        [f"endpoint delay p50, finished (smart_turn {default:g} + transcript)", "<= 250 ms", f"{cell(p50)} ms"],
        [
            f"false cut-offs, unfinished (smart_turn {default:g} + transcript)",
            "<= 10 %",
            f"{false_share:.0f} % ({smart.unfinished_n} turns)",
        ],
    ]
    if not args.skip_live:
        cancelled = sum(t.cancelled for t in backchannels)
        resumes = [t.resume_delay_ms for t in backchannels if t.resume_delay_ms is not None]
        stops = [t.stop_ms for t in interruptions if t.stop_ms is not None]
        onsets = [t.onset_stop_ms for t in interruptions if t.onset_stop_ms is not None]
        goals += [
            ["backchannels that cancelled the reply", "0", f"{cancelled}/{len(backchannels)}"],
            ["resume delay p50 (end of backchannel -> reply)", "-", f"{cell(percentile(resumes, 50))} ms"],
            ["real interruptions that stopped the reply", "all", f"{sum(t.cancelled for t in interruptions)}/3"],
            ["audio stop after the VAD heard speech, max", "<= 100 ms", f"{cell(max(stops) if stops else None)} ms"],
            ["audio stop after the speech's onset, max", "-", f"{cell(max(onsets) if onsets else None)} ms"],
        ]
        if not args.skip_server:
            server_cancelled = sum(t.cancelled for t in server_backchannels)
            server_stops = [t.stop_ms for t in server_interruptions if t.stop_ms is not None]
            goals += [
                [
                    "server: backchannels that cancelled the reply",
                    "0",
                    f"{server_cancelled}/{len(server_backchannels)}",
                ],
                [
                    "server: real interruptions that cancelled it",
                    "all",
                    f"{sum(t.cancelled for t in server_interruptions)}/{len(server_interruptions)}",
                ],
                [
                    "server: audio deltas stop after the speech began, max",
                    "-",
                    f"{cell(max(server_stops) if server_stops else None)} ms",
                ],
            ]
    print_table(["goal", "target", "measured"], goals)
    print(f"\n{time.monotonic() - began:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
