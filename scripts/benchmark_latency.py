"""Latency benchmark: run the file mode over LibriVox clips and tabulate per-turn latencies.

Each clip is fed to the pipeline as ``--input_audio CLIP --output_audio TMP.wav`` at
real-time pace (the default ``--input_speed 1.0``), exactly like::

    python s2s_pipeline.py --input_audio CLIP --output_audio TMP.wav [EXTRA FLAGS]

Every clip runs in a fresh Python subprocess (this script in its hidden child mode, which
calls :func:`speech_to_speech.main.run` and prints one JSON line), so model load time and
peak memory are those of a cold start of one run, not shared between clips.

Clips come from the Debian package ``pocketsphinx-testdata``
(``/usr/share/pocketsphinx/test/data/librivox/*.wav``, located with ``dpkg -L``), or from
``--clips_dir``. Flags after ``--`` are passed to the pipeline unchanged, e.g.::

    python scripts/benchmark_latency.py --limit 3 -- --llm_backend transformers --device cpu

What is measured (all times are ``time.monotonic()`` differences inside the child):

- **endpoint ms** (VAD endpoint delay): end of user speech (arrival of the last audio chunk
  the VAD scored as speech) -> the VAD's endpoint decision. Dominated by ``--min_silence_ms``.
- **STT ms**: time the STT stage spent transcribing the endpointed segment.
- **TTFT ms** (time to first token): LLM request start -> first token from the LLM.
- **TTFA ms** (time to first audio): LLM request start -> first assistant audio at the sink.
- **v2v ms** (voice-to-voice latency): end of user speech -> first assistant audio at the
  sink; roughly endpoint + STT + TTFA plus queueing.
- **load max s / load sum s**: per-stage model load (setup) seconds as reported in
  :attr:`RunSummary.load_seconds`. Stages load in parallel threads, so the *max* approximates
  the wall-clock time the pipeline waits before it starts listening; the *sum* is the total
  of the (overlapping) per-stage times. Stages that do not time their setup count as 0.
- **RSS MB**: peak resident set size of the child process (``getrusage`` ``ru_maxrss``, the
  larger of the process itself and any processes it waited for), in MiB.

Latency columns have one row per assistant turn (a clip can yield several turns; extra turns
are labelled ``clip#N``); load and RSS are per run and shown on the run's first row. The
``p50``/``p90`` rows are percentiles (linear interpolation, ``numpy.percentile``) over all
turns for latency columns and over all successful runs for load and RSS. ``-`` means no value
(e.g. a clip in which the VAD found no speech, or a failed run).

Exit status: 0 when every run succeeded, 1 when no clips were found or any run failed,
2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the repository root (this file lives in ``scripts/``)
REPO_ROOT = Path(__file__).resolve().parent.parent
#: where pocketsphinx-testdata installs its LibriVox clips on Debian and Ubuntu
DEFAULT_CLIPS_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")
#: the Debian package that ships the clips
CLIPS_PACKAGE = "pocketsphinx-testdata"
#: prefix of the one result line a child prints on stdout
RESULT_PREFIX = "BENCHMARK_RESULT "
#: per-turn latency columns: (TurnMetrics attribute, header)
LATENCY_COLUMNS = (
    ("endpoint_delay_ms", "endpoint ms"),
    ("stt_ms", "STT ms"),
    ("ttft_ms", "TTFT ms"),
    ("ttfa_ms", "TTFA ms"),
    ("voice_to_voice_ms", "v2v ms"),
)
#: per-run columns: (RunResult attribute, header)
RUN_COLUMNS = (("load_max_s", "load max s"), ("load_sum_s", "load sum s"), ("peak_rss_mb", "RSS MB"))
PROG = "benchmark_latency.py"


@dataclass
class RunResult:
    """What one child run reported (or why it failed).

    Attributes:
        clip: the clip's file stem.
        turns: per-turn latency dicts (keys of :data:`LATENCY_COLUMNS`, values ms or None).
        load_seconds: setup seconds per stage name.
        peak_rss_mb: peak resident set size of the child, MiB.
        error: a one-line reason when the run failed, else None.
    """

    clip: str
    turns: list[dict[str, float | None]] = field(default_factory=list)
    load_seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float | None = None
    error: str | None = None

    @property
    def load_max_s(self) -> float | None:
        """The longest per-stage load, s (≈ wall time of the parallel load phase)."""
        return max(self.load_seconds.values()) if self.load_seconds else None

    @property
    def load_sum_s(self) -> float | None:
        """The sum of per-stage loads, s."""
        return sum(self.load_seconds.values()) if self.load_seconds else None


# -- child mode ---------------------------------------------------------------------------


def peak_rss_mb() -> float:
    """Peak RSS of this process and its waited-for children, MiB."""
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    # ru_maxrss is in KiB on Linux and in bytes on macOS
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def run_child(clip: str, output_audio: str, extra: list[str]) -> int:
    """Run the pipeline once on ``clip`` and print one :data:`RESULT_PREFIX` JSON line.

    Returns:
        The exit status: 0 on success, 1 when the pipeline rejected its input.
    """
    sys.path.insert(0, str(REPO_ROOT))
    from speech_to_speech.cli import parse_args
    from speech_to_speech.main import run
    from speech_to_speech.pipeline import PipelineError
    from speech_to_speech.registry import BackendUnavailableError, UnknownBackendError

    args = parse_args(["--input_audio", clip, "--output_audio", output_audio, *extra])
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    try:
        summary = run(args)
    except (PipelineError, UnknownBackendError, BackendUnavailableError, FileNotFoundError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    result = {
        "turns": [{name: getattr(turn, name) for name, _ in LATENCY_COLUMNS} for turn in summary.turns],
        "load_seconds": summary.load_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


# -- parent mode --------------------------------------------------------------------------


def find_clips(clips_dir: str | None) -> list[Path]:
    """The ``*.wav`` clips in ``clips_dir``, or those of pocketsphinx-testdata, sorted."""
    if clips_dir is not None:
        return sorted(Path(clips_dir).glob("*.wav"))
    try:
        listing = subprocess.run(
            ["dpkg", "-L", CLIPS_PACKAGE], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    clips = [Path(line) for line in listing.splitlines() if "/librivox/" in line and line.endswith(".wav")]
    clips = [clip for clip in clips if clip.is_file()]
    return sorted(clips) if clips else sorted(DEFAULT_CLIPS_DIR.glob("*.wav"))


def run_clip(clip: Path, extra: list[str], workdir: Path, timeout_s: float) -> RunResult:
    """Run one clip in a fresh child process and collect its result."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(clip),
        str(workdir / f"{clip.stem}.wav"),
        "--",
        *extra,
    ]
    result = RunResult(clip.stem)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        result.error = f"timed out after {timeout_s:.0f} s"
        return result
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        stderr = [line for line in proc.stderr.splitlines() if line.strip()]
        result.error = f"exit {proc.returncode}: {stderr[-1] if stderr else 'no result line'}"
        return result
    data: dict[str, Any] = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result.turns = data["turns"]
    result.load_seconds = data["load_seconds"]
    result.peak_rss_mb = data["peak_rss_mb"]
    return result


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (linear interpolation), None if empty."""
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class Table:
    """Collects rows and prints them with aligned columns; an empty row prints as a blank line."""

    def __init__(self, headers: list[str]) -> None:
        self.headers = headers
        self.rows: list[list[str]] = []

    def add(self, row: list[str]) -> None:
        """Append a row of already formatted cells (or ``[]`` for a blank line)."""
        self.rows.append(row)

    def print(self) -> None:
        """Print the header, a rule and the rows (first column left-aligned, others right)."""
        filled = [self.headers, *(row for row in self.rows if row)]
        widths = [max(len(row[i]) for row in filled) for i in range(len(self.headers))]

        def line(row: list[str]) -> str:
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            return "  ".join(cells).rstrip()

        print(line(self.headers))
        print("  ".join("-" * w for w in widths))
        for row in self.rows:
            print(line(row) if row else "")


def _run_cells(values: list[float | None]) -> list[str]:
    """Format per-run values in :data:`RUN_COLUMNS` order (seconds to 0.1, MiB to 1)."""
    return [_cell(v, 0 if name == "peak_rss_mb" else 1) for v, (name, _) in zip(values, RUN_COLUMNS, strict=True)]


def report(results: list[RunResult]) -> None:
    """Print one row per turn (or failed/empty run), then p50 and p90 rows."""
    table = Table(["clip"] + [h for _, h in LATENCY_COLUMNS] + [h for _, h in RUN_COLUMNS])
    no_latency = ["-"] * len(LATENCY_COLUMNS)
    for result in results:
        per_run = _run_cells([getattr(result, name) for name, _ in RUN_COLUMNS])
        if not result.turns:  # failed, or no speech/response
            table.add([result.clip, *no_latency, *per_run])
        for index, turn in enumerate(result.turns):
            label = result.clip if index == 0 else f"{result.clip}#{index + 1}"
            latencies = [_cell(turn.get(name), 0) for name, _ in LATENCY_COLUMNS]
            table.add([label, *latencies, *(per_run if index == 0 else [""] * len(RUN_COLUMNS))])
    ok = [r for r in results if r.error is None]
    turns = [turn for r in ok for turn in r.turns]
    table.add([])
    for q in (50, 90):
        latency = [percentile([t[n] for t in turns if t.get(n) is not None], q) for n, _ in LATENCY_COLUMNS]
        per_run_q = [percentile([v for r in ok if (v := getattr(r, n)) is not None], q) for n, _ in RUN_COLUMNS]
        table.add([f"p{q}", *(_cell(v, 0) for v in latency), *_run_cells(per_run_q)])
    table.print()
    print(
        f"\n{len(turns)} turn(s) from {len(results)} run(s), {len(ok)} succeeded. "
        "load max/sum s: the longest / the total of the per-stage model setup times (stages load in parallel). "
        "RSS MB: peak RSS of the run's process."
    )
    for result in results:
        if result.error is not None:
            print(f"FAILED {result.clip}: {result.error}")
        elif not result.turns:
            print(f"NO TURNS {result.clip}: the pipeline produced no response")


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` at the first ``--`` into (own flags, pipeline flags)."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's own flags (pipeline flags go after ``--``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Voice-to-voice latency benchmark over LibriVox clips (one fresh process per clip). "
        "Flags after -- go to s2s_pipeline.py.",
    )
    parser.add_argument("--clips_dir", help=f"folder of *.wav clips (default: the {CLIPS_PACKAGE} LibriVox clips)")
    parser.add_argument("--limit", type=int, metavar="N", help="run only the first N clips")
    parser.add_argument("--timeout_s", type=float, default=600.0, help="seconds allowed per run (default 600)")
    parser.add_argument("--child", nargs=2, metavar=("CLIP", "OUT_WAV"), help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.child:
        return run_child(args.child[0], args.child[1], extra)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")

    # reject bad pipeline flags once, here, instead of once per clip
    sys.path.insert(0, str(REPO_ROOT))
    from speech_to_speech.cli import parse_args

    parse_args(["--input_audio", "clip.wav", "--output_audio", "out.wav", *extra])

    clips = find_clips(args.clips_dir)[: args.limit]
    if not clips:
        where = args.clips_dir or f"{DEFAULT_CLIPS_DIR} (package {CLIPS_PACKAGE})"
        print(
            f"{PROG}: error: no *.wav clips found in {where}; install {CLIPS_PACKAGE} or pass --clips_dir",
            file=sys.stderr,
        )
        return 1

    print(f"{len(clips)} clip(s) from {clips[0].parent}, pipeline flags: {' '.join(extra) or '(defaults)'}")
    results = []
    with tempfile.TemporaryDirectory(prefix="s2s-bench-") as tmp:
        for number, clip in enumerate(clips, 1):
            print(f"[{number}/{len(clips)}] {clip.name} ...", file=sys.stderr, flush=True)
            results.append(run_clip(clip, extra, Path(tmp), args.timeout_s))
    print()
    report(results)
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
