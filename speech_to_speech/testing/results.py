"""One results file for every published figure: ``docs/results.json``.

A benchmark run with ``--record`` appends a record (its key, the date, the machine, the load
average at start and end, the command and its figures); ``scripts/render_results.py`` renders the
README's and ``docs/benchmarks.md``'s figure tables from the newest record of each key, between
``<!-- results:begin -->`` and ``<!-- results:end -->``, so that the two cannot drift apart (a
test checks that they are rendered). Voice-to-voice is always the end of the user's speech in the
audio to the first reply audio; any other interval is named for what it is.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speech_to_speech.testing import REPO_ROOT

#: the results file
RESULTS_FILE = REPO_ROOT / "docs" / "results.json"
#: where rendered tables go, in files that hold the markers
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def machine() -> str:
    """This machine in a few words: cores and CPU model (``/proc/cpuinfo``), e.g. "2-core AMD EPYC 7B13"."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()}-core {model}"


def load_average() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


#: flags that only name where a run writes its output: left out of a recorded command
OUTPUT_FLAGS = ("--json", "--log", "--server_log", "--waterfall", "--audio_cache")


def command_line(script: str, argv: list[str]) -> str:
    """``python scripts/<script> ARGS`` as recorded: the flags of :data:`OUTPUT_FLAGS` and their
    values left out (they change no figure)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in OUTPUT_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in OUTPUT_FLAGS)):
            kept.append(arg)
    return " ".join([f"python scripts/{script}", *kept])


def read(path: Path = RESULTS_FILE) -> list[dict[str, Any]]:
    """Every record of ``path`` (empty when there is no file)."""
    if not path.is_file():
        return []
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of records")
    return records


def record(
    key: str, command: str, figures: dict[str, Any], load_start: float, path: Path = RESULTS_FILE
) -> dict[str, Any]:
    """Append a record of today's run of ``command`` to ``path``; return it.

    Args:
        key: what was measured (one row of the tables), e.g. ``"latency-spoken"``.
        command: the benchmark's command line.
        figures: the numbers, by name (ms, counts, fractions; None for not measured).
        load_start: the load average when the run started (the end is read now).
    """
    entry = {
        "key": key,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load": [load_start, load_average()],
        "command": command,
        "figures": figures,
    }
    records = [*read(path), entry]
    path.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return entry


def newest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest record of each key (the later one in the file on the same date)."""
    latest: dict[str, dict[str, Any]] = {}
    for entry in records:
        if entry["key"] not in latest or entry["date"] >= latest[entry["key"]]["date"]:
            latest[entry["key"]] = entry
    return latest


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):,.0f} ms"


def _latency(what: str) -> Callable[[dict[str, Any]], tuple[str, str]]:
    def row(f: dict[str, Any]) -> tuple[str, str]:
        text = (
            f"p50 {_ms(f['v2v_p50_ms'])}, p90 {_ms(f['v2v_p90_ms'])} ({_ms(f['v2v_min_ms'])}-{_ms(f['v2v_max_ms'])} "
            f"over {f['clips']} clips); STT p50 {_ms(f['stt_p50_ms'])}; peak RSS {f['peak_rss_mb']:,.0f} MB"
        )
        return f"voice-to-voice, local mode, {what}", text

    return row


def _quality(f: dict[str, Any]) -> tuple[str, str]:
    text = (
        f"{f['right']}/{f['turns']} right ({100 * f['right'] / f['turns']:.0f} %): "
        f"facts {f['facts_right']}/{f['facts']}, "
        f"statements {f['statements_right']}/{f['statements']}, tool turns {f['tools_right']}/{f['tools']}; "
        f"{f['echoed']} of {f['statements']} statements echoed; first audio p50 {_ms(f['first_audio_p50_ms'])}, "
        f"p90 {_ms(f['first_audio_p90_ms'])}"
    )
    return "conversation benchmark (spoken turns, the default model)", text


def _concurrency(f: dict[str, Any]) -> tuple[str, str]:
    parts = [
        f"{level} session{'s' if level != '1' else ''}: p50 {_ms(v['v2v_p50_ms'])}, p90 {_ms(v['v2v_p90_ms'])} "
        f"(after speech_stopped p50 {_ms(v['after_stop_p50_ms'])})"
        for level, v in f["levels"].items()
    ]
    return "voice-to-voice, realtime server (WebSocket clients at once)", "; ".join(parts)


#: how each key becomes a table row: figures -> (what, figures as text)
ROWS: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "latency-spoken": _latency("10 spoken turns (Piper voice)"),
    "latency-librivox": _latency("LibriVox statements"),
    "quality": _quality,
    "server-concurrency": _concurrency,
}


def render(records: list[dict[str, Any]]) -> str:
    """The figures table (Markdown) from the newest record of each key, in :data:`ROWS` order."""
    latest = newest(records)
    lines = ["| what | figures | measured |", "|---|---|---|"]
    for key, row in ROWS.items():
        entry = latest.get(key)
        if entry is None:
            continue
        what, text = row(entry["figures"])
        load = "-".join(f"{x:g}" for x in entry["load"])
        lines.append(f"| {what} | {text} | `{entry['command']}`, {entry['date']}, {entry['machine']}, load {load} |")
    return "\n".join(lines)


def rendered(text: str, table: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by ``table``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return text[: start + len(BEGIN)] + "\n" + table + "\n" + text[end:]
