"""Latency benchmark: voice-to-voice of the real program, the compute floor, a naive baseline, idle cost.

One run over the LibriVox clips of ``pocketsphinx-testdata`` (``dpkg -L pocketsphinx-testdata``,
with the reference ``transcription`` beside them) reports::

    python scripts/benchmark_latency.py                  # every clip, default backends
    python scripts/benchmark_latency.py --limit 2        # a quick check
    python scripts/benchmark_latency.py -- --llm_model other.gguf   # flags after -- go to the program

(a) **Voice-to-voice, from the audio.** Each clip runs through the real main command, in a
    fresh process, fed at real-time pace like a microphone::

        python s2s_pipeline.py --input_audio CLIP --output_audio OUT.wav [FLAGS AFTER --]

    ``OUT.wav`` is on the input's timeline, so voice-to-voice is read from the two files, not
    from the program's clocks: **end of speech** in the input is the end of the last 20 ms frame
    whose RMS is above ``max(peak RMS - 30 dB, 2.5 x noise floor)`` (noise floor: the 10th
    percentile of frame RMS), and **first reply audio** is the first output sample with
    ``|x| > 0.001`` (-60 dBFS). ``v2v log`` is what the program itself printed
    (``[turn 1] ... voice-to-voice N ms``), with its STT, TTFT and TTFA; **RSS** is the peak
    resident memory of that process (``os.wait4``).
(b) **Compute floor** of the same backends and flags (built from the registry as the CLI
    builds them, no pipeline, no queues, models loaded once in this process and warmed up by
    one untimed turn): STT of the whole
    clip + LLM from request to its first chunk for TTS (the product's own sentence streamer: the
    first clause or sentence) + TTS of that chunk (the faster of two syntheses).
(c) **Naive sequential baseline** on the same models: STT, then the whole reply, then all of it
    synthesised; its first audio would come only then.

    ``v2v/floor`` and ``v2v/base`` are per-clip ratios of (a) to (b) and (c). Floor and baseline
    are compute only; (a) also holds the VAD's endpointing silence (``--min_silence_ms``), which
    any system that endpoints on silence waits for, shown on the summary line.
(d) **Idle cost** of the main command, CPU % of one core averaged over ``--idle_s`` seconds
    (psutil, else ``/proc``) once its models are loaded, and its peak RSS: ``server`` is
    ``--mode server`` with no client (ready when its port accepts); ``listening`` is file mode
    on a long recording of room noise (-60 dBFS), i.e. VAD running with nobody speaking (ready
    when it prints ``ready`` or its CPU falls under 25 %).

Tables have one row per clip and p50/p90 rows (linear interpolation); the last lines give the
load average at start and end (numbers from a busy machine mean little) and compare with the
goals (v2v p50 <= 800 ms, v2v <= 0.5 x baseline, idle <= 3 % of a core, RSS <= 1.5 GB).
``--json PATH`` also writes every number. Exit status: 0 when every run worked, 1 otherwise,
2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speech_to_speech.testing.bench import (
    REPO_ROOT,
    Child,
    build_handler,
    cell,
    find_clips,
    first_sound_s,
    free_port,
    one_line,
    percentile,
    print_table,
    read_mono,
    read_transcripts,
    speech_end_s,
    split_extra,
)
from speech_to_speech.testing.results import load_average
from speech_to_speech.testing.speech_data import word_error_rate

PROG = "benchmark_latency.py"
MAIN = str(REPO_ROOT / "s2s_pipeline.py")
#: the goals of the latency work: voice-to-voice p50 and p90 (issue 27), the rest from issue 9
GOAL_V2V_MS, GOAL_V2V_P90_MS, GOAL_RATIO, GOAL_IDLE_PCT, GOAL_RSS_MB = 1000.0, 1400.0, 0.5, 3.0, 1536.0
#: natural spoken turns said by the embedded Piper voice (``--spoken``)
SPOKEN_TURNS = Path(__file__).resolve().parent / "data" / "spoken_turns.txt"
METRICS_LINE = re.compile(r"^\[turn (\d+)\] STT (.+?) \| TTFT (.+?) \| TTFA (.+?) \| voice-to-voice (.+)$")


@dataclass
class ClipResult:
    """Everything measured on one clip (times in ms; None when not measured)."""

    clip: str
    reference: str = ""
    heard: str = ""
    reply: str = ""
    turns: int = 0
    v2v_ms: float | None = None
    log: dict[str, float | None] = field(default_factory=dict)
    rss_mb: float | None = None
    error: str | None = None
    stt_text: str = ""
    wer: float | None = None
    stt_ms: float | None = None
    llm_first_ms: float | None = None
    tts_first_ms: float | None = None
    llm_all_ms: float | None = None
    tts_all_ms: float | None = None
    first_chunk: str = ""

    @property
    def floor_ms(self) -> float | None:
        parts = (self.stt_ms, self.llm_first_ms, self.tts_first_ms)
        return None if None in parts else sum(parts)  # type: ignore[arg-type]

    @property
    def base_ms(self) -> float | None:
        parts = (self.stt_ms, self.llm_all_ms, self.tts_all_ms)
        return None if None in parts else sum(parts)  # type: ignore[arg-type]

    def ratio(self, other: float | None) -> float | None:
        return self.v2v_ms / other if self.v2v_ms is not None and other else None


# -- reading the audio ----------------------------------------------------------------------


def _ms(text: str) -> float | None:
    match = re.match(r"\s*(\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


# -- (a) the main command on each clip -----------------------------------------------------


def run_pipeline(result: ClipResult, clip: Path, extra: list[str], workdir: Path, timeout_s: float) -> None:
    """Run the main command on ``clip``; fill in voice-to-voice from the audio, the log and RSS."""
    out = workdir / f"{clip.stem}.reply.wav"
    child = Child([sys.executable, MAIN, "--input_audio", str(clip), "--output_audio", str(out), *extra])
    status, result.rss_mb = child.finish(timeout_s)
    if status != 0 or not out.is_file():
        result.error = child.failure()
        return
    for line in child.stdout:
        if match := re.match(r"^\[turn (\d+)\] (user|assistant): (.*)$", line):
            result.turns = max(result.turns, int(match.group(1)))
            if match.group(1) == "1":
                setattr(result, "heard" if match.group(2) == "user" else "reply", match.group(3))
        elif (match := METRICS_LINE.match(line)) and match.group(1) == "1":
            names = ("stt_ms", "ttft_ms", "ttfa_ms", "v2v_ms")
            result.log = {name: _ms(value) for name, value in zip(names, match.groups()[1:], strict=True)}
    end = speech_end_s(*read_mono(clip))
    reply = first_sound_s(*read_mono(out))
    if end is None or reply is None:
        result.error = "no speech in the input" if end is None else "no reply audio in the output"
        return
    result.v2v_ms = (reply - end) * 1000


# -- (b) floor and (c) baseline: the stages directly ------------------------------------------


def measure_compute(results: list[ClipResult], clips: list[Path], extra: list[str]) -> str | None:
    """Fill in STT, LLM and TTS times per clip; returns an error line, or None."""
    from speech_to_speech.core.messages import EndOfResponse, Transcript, TTSInput
    from speech_to_speech.pipeline.cli import parse_args
    from speech_to_speech.speech.audio_io import load_audio

    args = parse_args(["--input_audio", str(clips[0]), "--output_audio", "unused.wav", *extra])
    try:
        stt, llm, tts = (build_handler(stage, args) for stage in ("stt", "llm", "tts"))
        for handler in (stt, llm, tts):
            handler.setup()
    except Exception as exc:
        return f"loading the models failed: {one_line(exc)}"

    def timed_synthesis(text: str) -> float:  # the faster of two runs: a floor, not a first call
        times = []
        for _ in range(2):
            start = time.monotonic()
            for _ in tts.synthesize(text):
                pass
            times.append((time.monotonic() - start) * 1000)
        return min(times)

    for _ in llm.process(Transcript(llm.gate.new_turn_stamp(), "Hello!", language="en")):
        pass  # one untimed turn: the floor is warm compute, not a first call
    for result, clip in zip(results, clips, strict=True):
        samples = load_audio(clip)
        start = time.monotonic()
        text, _ = stt.transcribe(samples, 16_000)
        result.stt_ms = (time.monotonic() - start) * 1000
        result.stt_text = text
        result.wer = word_error_rate(result.reference, text) if result.reference else None
        llm.chat.reset()  # every clip is a first turn, as in a fresh program
        chunks: list[str] = []
        start = time.monotonic()
        for item in llm.process(Transcript(llm.gate.new_turn_stamp(), text, language="en")):
            if isinstance(item, TTSInput):
                if not chunks:
                    result.llm_first_ms = (time.monotonic() - start) * 1000
                chunks.append(item.text)
            elif isinstance(item, EndOfResponse):
                result.llm_all_ms = (time.monotonic() - start) * 1000
        if chunks:
            result.first_chunk = chunks[0]
            result.tts_first_ms = timed_synthesis(chunks[0])
            result.tts_all_ms = timed_synthesis(" ".join(chunks))
        print(f"  compute {clip.stem}: {text!r} -> first chunk {result.first_chunk!r}", file=sys.stderr, flush=True)
    for handler in (stt, llm, tts):
        handler.cleanup()
    return None


# -- (d) idle cost ----------------------------------------------------------------------------


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def measure_idle(mode: str, extra: list[str], workdir: Path, idle_s: float, timeout_s: float) -> dict[str, Any]:
    """CPU % of one core over ``idle_s`` once loaded, and peak RSS, of the main command idling in ``mode``."""
    import numpy as np
    import soundfile as sf

    if mode == "server":
        port = free_port()
        child = Child([sys.executable, MAIN, "--mode", "server", "--host", "127.0.0.1", "--port", str(port), *extra])
        is_ready = lambda: _accepts(port)  # noqa: E731
    else:
        noise = np.random.default_rng(0).normal(0.0, 1e-3, int(16_000 * (idle_s + 30))).astype(np.float32)
        sf.write(str(workdir / "room.wav"), noise, 16_000)
        out = str(workdir / "room.reply.wav")
        command = [sys.executable, MAIN, "--input_audio", str(workdir / "room.wav"), "--output_audio", out, *extra]
        child = Child(command, ready=r"^ready\b")
        began = time.monotonic()

        def is_ready() -> bool:
            if child.ready.is_set():
                return True
            cpu = child.cpu_percent(1.0)
            return time.monotonic() - began > 5 and cpu is not None and cpu < 25

    deadline = time.monotonic() + timeout_s
    while child.running() and time.monotonic() < deadline and not is_ready():
        time.sleep(0.5)
    cpu = None
    if child.running() and time.monotonic() < deadline:
        time.sleep(1.0)  # let the start settle
        cpu = child.cpu_percent(idle_s)
    child.signal()
    _, rss = child.finish(30)
    error = None if cpu is not None else f"never idle: {child.failure()}"
    return {"mode": mode, "cpu_pct": cpu, "rss_mb": rss, "error": error}


# -- report -------------------------------------------------------------------------------------


def _table(results: list[ClipResult], headers: list[str], numbers: list[list[float | None]], digits: list[int]) -> None:
    """One row per clip, then p50 and p90 rows over the clips that have a value."""
    rows = [
        [r.clip, *(cell(v, d) for v, d in zip(row, digits, strict=True))]
        for r, row in zip(results, numbers, strict=True)
    ]
    rows.append([])
    columns = list(zip(*numbers, strict=True))
    for q in (50, 90):
        values = [percentile([v for v in column if v is not None], q) for column in columns]
        rows.append([f"p{q}", *(cell(v, d) for v, d in zip(values, digits, strict=True))])
    print_table(headers, rows)


def latency_figures(results: list[ClipResult]) -> dict[str, Any]:
    """Voice-to-voice from the audio files (p50, p90, range), the program's STT p50 and the peak RSS,
    for docs/results.json."""
    v2v = [r.v2v_ms for r in results if r.v2v_ms is not None]
    stt = [r.log["stt_ms"] for r in results if r.log.get("stt_ms") is not None]
    return {
        "clips": len(v2v),
        "v2v_p50_ms": percentile(v2v, 50),
        "v2v_p90_ms": percentile(v2v, 90),
        "v2v_min_ms": min(v2v, default=None),
        "v2v_max_ms": max(v2v, default=None),
        "stt_p50_ms": percentile(stt, 50),
        "peak_rss_mb": max((r.rss_mb for r in results if r.rss_mb is not None), default=0.0),
    }


def report(results: list[ClipResult], idle: list[dict[str, Any]], extra: list[str], load: float) -> None:
    """Print the tables and the goal lines."""
    print("(a) the main command, voice-to-voice read from the audio files")
    log = [[r.log.get(k) for k in ("v2v_ms", "stt_ms", "ttft_ms", "ttfa_ms")] for r in results]
    numbers = [[r.turns, r.v2v_ms, *values, r.rss_mb] for r, values in zip(results, log, strict=True)]
    headers = ["clip", "turns", "v2v ms", "v2v log", "STT log", "TTFT log", "TTFA log", "RSS MB"]
    _table(results, headers, numbers, [0] * 7)

    if any(r.stt_ms is not None for r in results):
        print("\n(b) compute floor and (c) naive sequential baseline, same models, no pipeline (ms)")
        numbers = [
            [r.wer, r.stt_ms, r.llm_first_ms, r.tts_first_ms, r.floor_ms, r.llm_all_ms, r.tts_all_ms, r.base_ms]
            for r in results
        ]
        numbers = [[*row, r.ratio(r.floor_ms), r.ratio(r.base_ms)] for r, row in zip(results, numbers, strict=True)]
        headers = ["clip", "WER", "STT", "LLM 1st", "TTS 1st", "floor", "LLM all", "TTS all", "base"]
        _table(results, [*headers, "v2v/floor", "v2v/base"], numbers, [2, 0, 0, 0, 0, 0, 0, 0, 2, 2])

    if idle:
        print("\n(d) the main command idle, models loaded")
        rows = [[i["mode"], cell(i["cpu_pct"], 1), cell(i["rss_mb"], 0), i["error"] or ""] for i in idle]
        print_table(["mode", "CPU % of a core", "RSS MB", "note"], rows)

    from speech_to_speech.pipeline.cli import parse_args

    silence = parse_args(["--input_text", "x", *extra]).min_silence_ms
    v2v = percentile([r.v2v_ms for r in results if r.v2v_ms is not None], 50)
    ratio = percentile([x for r in results if (x := r.ratio(r.base_ms)) is not None], 50)
    idle_max = max((i["cpu_pct"] for i in idle if i["cpu_pct"] is not None), default=None)
    rss = max((x for x in [*(r.rss_mb for r in results), *(i["rss_mb"] for i in idle)] if x is not None), default=None)

    def goal(name: str, value: float | None, limit: float, unit: str, digits: int = 0) -> str:
        verdict = "-" if value is None else ("ok" if value <= limit else "MISSED")
        return f"  {name}: {cell(value, digits)}{unit} (goal <= {limit:g}{unit}) {verdict}"

    print(f"\ngoals ({len(results)} clip(s); v2v holds the VAD's {silence} ms endpointing silence)")
    end, cores = load_average(), os.cpu_count()
    print(f"  load average at start {load:.2f}, at end {end:.2f}: on {cores} cores, a quiet machine is ~0")
    print(goal("voice-to-voice p50", v2v, GOAL_V2V_MS, " ms"))
    v2v_p90 = percentile([r.v2v_ms for r in results if r.v2v_ms is not None], 90)
    print(goal("voice-to-voice p90", v2v_p90, GOAL_V2V_P90_MS, " ms"))
    print(goal("v2v / naive baseline p50", ratio, GOAL_RATIO, "x", 2))
    print(goal("idle CPU, worst mode", idle_max, GOAL_IDLE_PCT, " % of a core", 1))
    print(goal("peak RSS, worst run", rss, GOAL_RSS_MB, " MiB"))
    for r in results:
        print(f"  {r.clip}: heard {r.heard!r} (reference {r.reference!r}); reply {r.reply[:100]!r}")
        if r.error:
            print(f"  FAILED {r.clip}: {r.error}")


# -- main -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Voice-to-voice from the audio files, compute floor, naive baseline and idle cost over the "
        "LibriVox clips. Flags after -- go to s2s_pipeline.py (and build the floor's models).",
    )
    parser.add_argument("--clips_dir", help="folder of *.wav clips (default: the pocketsphinx-testdata LibriVox clips)")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N clips")
    parser.add_argument("--timeout_s", type=float, default=600.0, help="seconds allowed per program run")
    parser.add_argument("--idle_s", type=float, default=10.0, help="seconds of idle CPU sampling per mode")
    parser.add_argument("--no_compute", action="store_true", help="skip (b) and (c)")
    parser.add_argument("--no_idle", action="store_true", help="skip (d)")
    parser.add_argument("--json", metavar="PATH", help="also write every number here")
    parser.add_argument(
        "--record",
        action="store_true",
        help="append voice-to-voice to docs/results.json (key latency-spoken, or latency-librivox on those clips)",
    )
    parser.add_argument(
        "--spoken",
        action="store_true",
        help=f"clips: the natural turns of {SPOKEN_TURNS.name}, said by the embedded Piper voice",
    )
    parser.add_argument(
        "--waterfall",
        metavar="PNG",
        help="(e) run each clip in this process too and draw where each turn's time goes (table and PNG)",
    )
    return parser


def spoken_clips(folder: Path) -> list[Path]:
    """The lines of :data:`SPOKEN_TURNS`, said by the embedded Piper voice into 16 kHz WAV files in
    ``folder`` (0.3 s of silence before; the program adds the silence after), with a ``transcription``
    file beside them as the LibriVox folder has."""
    import numpy as np
    import soundfile as sf

    from speech_to_speech.testing.turns import synthesize

    lines = [line.strip() for line in SPOKEN_TURNS.read_text(encoding="utf-8").splitlines()]
    texts = [line for line in lines if line and not line.startswith("#")]
    clips, references = [], []
    for number, text in enumerate(texts, 1):
        path = folder / f"spoken-{number:02d}.wav"
        sf.write(str(path), np.concatenate([np.zeros(4800, np.float32), synthesize(text)]), 16_000)
        clips.append(path)
        references.append(f"{text} ({path.stem})")
    (folder / "transcription").write_text("\n".join(references) + "\n", encoding="utf-8")
    return clips


def waterfall(clips: list[Path], extra: list[str], workdir: Path, png: Path, name: str) -> list[Any]:
    """(e) The waterfall of every clip's turns, run in this process: printed and drawn to ``png``."""
    from speech_to_speech.testing.waterfall import plot_waterfall, print_waterfall, run_clip

    turns = []
    for number, clip in enumerate(clips, 1):
        print(f"[{number}/{len(clips)}] {clip.name}: waterfall ...", file=sys.stderr, flush=True)
        turns += run_clip(clip, extra, workdir / f"{clip.stem}.waterfall.wav")
    print("\n(e) the waterfall: ms after the end of speech, in this process (event clock)")
    print_waterfall(turns)
    title = f"{name}, {len(clips)} clip(s); flags: {' '.join(extra) or '(defaults)'}; {time.strftime('%Y-%m-%d')}"
    try:
        plot_waterfall(turns, png, title)
        print(f"waterfall drawn to {png}")
    except ImportError:
        print("no PNG: matplotlib is not installed (pip install matplotlib)")
    return turns


def main(argv: list[str] | None = None) -> int:
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    from speech_to_speech.pipeline.cli import parse_args

    parse_args(["--input_audio", "clip.wav", "--output_audio", "out.wav", *extra])  # bad flags fail here, once
    spoken_dir = tempfile.TemporaryDirectory(prefix="s2s-spoken-")
    clips = (spoken_clips(Path(spoken_dir.name)) if args.spoken else find_clips(args.clips_dir))[: args.limit]
    if not clips:
        print(
            f"{PROG}: error: no *.wav clips found; install pocketsphinx-testdata or pass --clips_dir", file=sys.stderr
        )
        return 1
    references = read_transcripts(clips)
    results = [ClipResult(clip.stem, reference=references.get(clip.stem, "")) for clip in clips]
    load = load_average()
    print(f"{len(clips)} clip(s) from {clips[0].parent}; program flags: {' '.join(extra) or '(defaults)'}")
    idle: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="s2s-bench-") as tmp:
        for number, (result, clip) in enumerate(zip(results, clips, strict=True), 1):
            print(f"[{number}/{len(clips)}] {clip.name}: the main command ...", file=sys.stderr, flush=True)
            run_pipeline(result, clip, extra, Path(tmp), args.timeout_s)
        name = "spoken turns (Piper)" if args.spoken else str(clips[0].parent)
        turns = waterfall(clips, extra, Path(tmp), Path(args.waterfall), name) if args.waterfall else []
        if not args.no_idle:
            for mode in ("server", "listening"):
                print(f"idle: {mode} ...", file=sys.stderr, flush=True)
                idle.append(measure_idle(mode, extra, Path(tmp), args.idle_s, args.timeout_s))
    compute_error = None
    if not args.no_compute:
        print("compute floor and baseline ...", file=sys.stderr, flush=True)
        compute_error = measure_compute(results, clips, extra)
    print()
    report(results, idle, extra, load)
    if compute_error:
        print(f"FAILED compute floor: {compute_error}")
    if args.json:
        data = {
            "clips": [asdict(r) | {"floor_ms": r.floor_ms, "base_ms": r.base_ms} for r in results],
            "idle": idle,
            "waterfall": [asdict(t) for t in turns],
        }
        Path(args.json).write_text(json.dumps(data, indent=1))
    failed = compute_error or any(r.error for r in results) or any(i["error"] for i in idle)
    if args.record and not failed and (args.spoken or args.clips_dir is None):
        from speech_to_speech.testing.results import command_line, record

        key = "latency-spoken" if args.spoken else "latency-librivox"
        command = command_line("benchmark_latency.py", sys.argv[1:])
        entry = record(key, command, latency_figures(results), load)
        print(f"recorded in docs/results.json: {entry['figures']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
