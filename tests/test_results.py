"""docs/results.json and the figure tables rendered from it (README.md, docs/benchmarks.md)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from speech_to_speech.testing import REPO_ROOT
from speech_to_speech.testing.results import BEGIN, END, command_line, newest, read, record, render, rendered
from tests.helpers import load_module

LATENCY = {
    "clips": 10,
    "v2v_p50_ms": 1234.4,
    "v2v_p90_ms": 1500.0,
    "v2v_min_ms": 900.0,
    "v2v_max_ms": 1700.0,
    "stt_p50_ms": 100.0,
    "peak_rss_mb": 2500.0,
}


def entry(date: str, **figures: float) -> dict:
    return {
        "key": "latency-spoken",
        "date": date,
        "machine": "2-core test CPU",
        "load": [0.1, 0.5],
        "command": "python scripts/benchmark_latency.py --spoken",
        "figures": {**LATENCY, **figures},
    }


def test_the_newest_record_of_a_key_is_rendered_with_its_date_and_machine() -> None:
    table = render([entry("2026-12-03", v2v_p50_ms=999.0), entry("2026-12-01", v2v_p50_ms=5000.0)])
    rows = [line for line in table.splitlines() if "voice-to-voice" in line]
    assert len(rows) == 1
    assert "p50 999 ms" in rows[0] and "5,000" not in rows[0]
    assert "2026-12-03" in rows[0] and "2-core test CPU" in rows[0] and "load 0.1-0.5" in rows[0]
    assert (
        newest([entry("2026-12-03"), entry("2026-12-03", v2v_p50_ms=1.0)])["latency-spoken"]["figures"]["v2v_p50_ms"]
        == 1.0
    )  # the same day: the later record


def test_a_block_is_replaced_between_its_markers_only() -> None:
    text = f"before\n{BEGIN}\nold table\n{END}\nafter\n"
    new = rendered(text, "| new |")
    assert new == f"before\n{BEGIN}\n| new |\n{END}\nafter\n"
    assert rendered(new, "| new |") == new
    with pytest.raises(ValueError):
        rendered("no markers here", "| new |")


def test_a_record_is_appended_with_today_and_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    record("latency-spoken", "cmd", LATENCY, 0.25, path)
    record("latency-spoken", "cmd", {**LATENCY, "v2v_p50_ms": 1.0}, 0.5, path)
    records = read(path)
    assert [r["figures"]["v2v_p50_ms"] for r in records] == [1234.4, 1.0]
    assert records[0]["date"] == datetime.date.today().isoformat()
    assert "core" in records[0]["machine"] and records[0]["load"][0] == 0.25
    assert json.loads(path.read_text())[1]["key"] == "latency-spoken"


def test_readme_and_benchmarks_are_rendered_from_the_results_file() -> None:
    render_results = load_module(REPO_ROOT / "scripts" / "render_results.py", "render_results_under_test")
    assert render_results.main(["--check"]) == 0, "run python scripts/render_results.py"
    table = render(read())
    for path in render_results.TARGETS:
        assert table in path.read_text(encoding="utf-8")


def test_a_recorded_command_leaves_out_where_it_wrote() -> None:
    argv = ["--spoken", "--json", "/tmp/x.json", "--record", "--waterfall=a.png", "--", "--llm_model", "m"]
    assert command_line("benchmark_latency.py", argv) == (
        "python scripts/benchmark_latency.py --spoken --record -- --llm_model m"
    )
