"""The runtime's layout is its architecture (docs/architecture.md, "Layout"): every module sits in a
wing, and imports run only down the wings' order, never back up or sideways between siblings."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from speech_to_speech.core import audio

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "speech_to_speech"
#: each wing's level; a module may import its own wing and wings of a strictly lower level
LEVELS = {"core": 0, "speech": 1, "turns": 2, "llm": 2, "pipeline": 3, "realtime": 4, "client": 5, "testing": 6}
#: modules allowed at the top of the package: the entry point sits above every wing
TOP_LEVEL = {"__init__", "main"}
#: the limit of docs/architecture.md ("no file over 600 lines")
MAX_LINES = 600


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def wing_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def imported_wings(path: Path) -> list[tuple[int, str]]:
    """(line, wing) of every ``speech_to_speech.<wing>`` import in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.level == 0 else []
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import"
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "speech_to_speech" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_module_sits_in_a_known_wing() -> None:
    stray = [
        str(p.relative_to(PACKAGE))
        for p in modules()
        if (wing_of(p) is None and p.stem not in TOP_LEVEL) or (wing_of(p) not in LEVELS and wing_of(p) is not None)
    ]
    assert stray == []


def test_imports_run_only_down_the_wings() -> None:
    wrong = []
    for path in modules():
        wing = wing_of(path)
        if wing is None:
            continue  # the entry point may import anything
        for line, target in imported_wings(path):
            if target == wing:
                continue
            if target not in LEVELS or LEVELS[target] >= LEVELS[wing]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {target}")
    assert wrong == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from speech_to_speech.realtime.session import RealtimeSession\n")
    assert imported_wings(bad) == [(2, "realtime")]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_the_line_limit(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_one_pcm16_codec_rounds_and_round_trips() -> None:
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 0.75 / 32767], dtype=np.float32)
    ints = audio.float_to_int16(samples)
    assert ints.tolist() == [0, 16384, -16384, 32767, -32767, 32767, 1]  # rounded, clipped
    back = audio.pcm16_to_float(audio.float_to_pcm16(samples))
    assert back.dtype == np.float32
    assert np.max(np.abs(back[:5] - samples[:5])) < 1 / 32767
    with pytest.raises(ValueError, match="even number"):
        audio.pcm16_to_float(b"\x00\x01\x02")


def edge_modules() -> list[Path]:
    """Every module that may touch audio at an edge: the package, the backends and the benchmarks."""
    return sorted([*modules(), *(ROOT / "handlers").rglob("*.py"), *(ROOT / "scripts").glob("*.py")])


def test_no_other_module_scales_pcm16_itself() -> None:
    """32767/32768 appear only in core/audio.py: every edge converts through the one codec."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in edge_modules()
        if p != PACKAGE / "core" / "audio.py" and ("32767" in p.read_text() or "32768" in p.read_text())
    ]
    assert offenders == []


def test_one_streaming_resampler() -> None:
    """soxr's streaming resampler is built only by core/audio.py's StreamResampler."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in edge_modules()
        if p != PACKAGE / "core" / "audio.py" and "ResampleStream" in p.read_text()
    ]
    assert offenders == []


def test_stream_resampler_is_continuous_across_chunks() -> None:
    """Chunk by chunk (and flushed) gives what one pass over the whole stream gives."""
    rate_in, rate_out = 24_000, 16_000
    tone = np.sin(2 * np.pi * 440 * np.arange(rate_in) / rate_in).astype(np.float32)
    stream = audio.StreamResampler(rate_in, rate_out)
    pieces = [stream.process(tone[i : i + 999]) for i in range(0, len(tone), 999)] + [stream.flush()]
    chunked = np.concatenate(pieces)
    whole = audio.StreamResampler(rate_in, rate_out).process(tone, last=True)
    assert abs(len(chunked) - rate_out) <= 1 and len(chunked) == len(whole)
    assert np.max(np.abs(chunked - whole)) < 1e-4
    same = audio.StreamResampler(16_000, 16_000, dtype="int16")
    assert same.process(np.array([1, 2, 3], dtype=np.int16)).tolist() == [1, 2, 3]
    converter = audio.RateConverter(16_000)
    from_24k = converter.process(tone, 24_000)  # one second at 24 kHz ...
    from_48k = converter.process(np.repeat(tone, 2), 48_000)  # ... and one at 48 kHz, its own stream
    assert 15_500 <= len(from_24k) <= 16_000 and 15_500 <= len(from_48k) <= 16_000
