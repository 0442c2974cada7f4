"""Command line, JSON presets and the errors a user sees from s2s_pipeline.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from speech_to_speech.cli import parse_args
from speech_to_speech.pipeline import build_pipeline
from speech_to_speech.registry import UnknownBackendError

ROOT = Path(__file__).resolve().parents[1]


def write_preset(tmp_path: Path, data: object) -> str:
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def single_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_defaults_without_preset() -> None:
    args = parse_args([])
    assert args.llm_backend == "transformers"
    assert args.temperature == 0.0
    assert args.input_text is None


def test_preset_sets_defaults_and_flags_override(tmp_path: Path) -> None:
    preset = write_preset(
        tmp_path,
        {"temperature": 0.7, "history_turns": 3, "min_silence_ms": 300, "device": "cpu", "tts_chunk_ms": 120},
    )
    args = parse_args(["--config", preset, "--history_turns", "5"])
    assert args.temperature == 0.7
    assert args.min_silence_ms == 300
    assert args.device == "cpu"
    assert args.tts_chunk_ms == 120
    assert args.history_turns == 5  # the flag wins
    assert args.max_new_tokens == parse_args([]).max_new_tokens  # untouched keys keep their defaults


def test_flag_before_config_also_overrides(tmp_path: Path) -> None:
    preset = write_preset(tmp_path, {"temperature": 0.7})
    assert parse_args(["--temperature", "0.2", "--config", preset]).temperature == 0.2


def test_preset_string_values_are_converted(tmp_path: Path) -> None:
    preset = write_preset(tmp_path, {"max_new_tokens": "40"})
    assert parse_args(["--config", preset]).max_new_tokens == 40


def test_input_text_flag_replaces_preset_turns(tmp_path: Path) -> None:
    preset = write_preset(tmp_path, {"input_text": ["from preset"]})
    assert parse_args(["--config", preset]).input_text == ["from preset"]
    assert parse_args(["--config", preset, "--input_text", "a", "--input_text", "b"]).input_text == ["a", "b"]


def test_preset_input_text_string_is_one_turn(tmp_path: Path) -> None:
    preset = write_preset(tmp_path, {"input_text": "hello there"})
    assert parse_args(["--config", preset]).input_text == ["hello there"]


def test_unknown_preset_key_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = write_preset(tmp_path, {"temperature": 0.5, "no_such_setting": 1})
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", preset])
    assert excinfo.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = single_error_line(captured.err)
    assert "no_such_setting" in line
    assert "temperature" not in line


def test_invalid_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"temperature": 0.5,', encoding="utf-8")
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", str(path)])
    assert excinfo.value.code == 2
    line = single_error_line(capsys.readouterr().err)
    assert "JSON" in line and "broken.json" in line


@pytest.mark.parametrize("content", ["[1, 2]", '"text"'])
def test_preset_not_an_object_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    path = tmp_path / "list.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", str(path)])
    assert excinfo.value.code == 2
    single_error_line(capsys.readouterr().err)


def test_missing_preset_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", str(tmp_path / "absent.json")])
    assert excinfo.value.code == 2
    assert "absent.json" in single_error_line(capsys.readouterr().err)


def test_bad_flag_value_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--temperature", "hot"])
    assert excinfo.value.code == 2
    assert "temperature" in single_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flag", ["--llm_backend", "--tts"])
def test_unknown_backend_raises(flag: str) -> None:
    args = parse_args([flag, "nope", "--input_text", "hi", "--device", "cpu"])
    with pytest.raises(UnknownBackendError, match="nope"):
        build_pipeline(args)


# -- the entry point, as a user runs it -----------------------------------------------------------


def run_entry_point(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "s2s_pipeline.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_entry_point_unknown_backend() -> None:
    result = run_entry_point("--llm_backend", "nope", "--input_text", "hi")
    assert result.returncode != 0
    assert "nope" in single_error_line(result.stderr)


def test_entry_point_missing_input_audio(tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    result = run_entry_point("--input_audio", str(missing), "--device", "cpu")
    assert result.returncode != 0
    assert "missing.wav" in single_error_line(result.stderr)


def test_entry_point_input_audio_not_audio(tmp_path: Path) -> None:
    not_audio = tmp_path / "notes.txt"
    not_audio.write_text("this is not audio\n" * 20, encoding="utf-8")
    result = run_entry_point("--input_audio", str(not_audio), "--device", "cpu")
    assert result.returncode != 0
    assert "notes.txt" in single_error_line(result.stderr)
