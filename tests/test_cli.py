"""Command line, JSON presets and the errors a user sees from s2s_pipeline.py."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speech_to_speech.llm.prompts import build_voice_system_prompt
from speech_to_speech.pipeline.builder import build_pipeline
from speech_to_speech.pipeline.cli import (
    DEFAULT_BACKENDS,
    LIMITS,
    HelpFormatter,
    Limit,
    RunConfig,
    build_parser,
    parse_args,
    stage_config_classes,
)
from speech_to_speech.pipeline.registry import UnknownBackendError
from tests.helpers import run_pipeline

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
    assert args.llm_backend == DEFAULT_BACKENDS["llm"]
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


@pytest.mark.parametrize("flag", ["--llm_backend", "--tts", "--vad", "--stt"])
def test_unknown_backend_is_a_bad_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args([flag, "nope", "--input_text", "hi"])
    assert excinfo.value.code == 2
    assert "nope" in single_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("dest", ["llm_backend", "tts"])
def test_unknown_backend_raises_when_building(dest: str) -> None:
    args = parse_args(["--input_text", "hi", "--device", "cpu"])
    setattr(args, dest, "nope")  # e.g. a Namespace built by code, not by the parser
    with pytest.raises(UnknownBackendError, match="nope"):
        build_pipeline(args)


# -- ranges: one table, checked for flags and presets alike ------------------------------------------


def numeric_fields() -> dict[str, tuple[type, Any]]:
    """Every int/float setting: name -> (type, default)."""
    found: dict[str, tuple[type, Any]] = {}
    for cls in [RunConfig, *stage_config_classes()]:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kind = hints[field.name]
            if kind in (int, float):
                found[field.name] = (kind, field.default)
    return found


def test_every_numeric_setting_has_a_range_and_its_default_is_in_it() -> None:
    fields = numeric_fields()
    assert {"max_new_tokens", "input_speed", "min_silence_ms", "port", "temperature"} <= set(fields)
    missing = sorted(set(fields) - set(LIMITS))
    assert not missing, f"add these to cli.LIMITS: {missing}"
    for name, (_, default) in fields.items():
        assert LIMITS[name].admits(default), (name, default, str(LIMITS[name]))


def test_limit_bounds() -> None:
    positive, unit = Limit(0, low_open=True), Limit(0, 1, low_open=True, high_open=True)
    assert positive.admits(0.001) and not positive.admits(0) and not positive.admits(float("nan"))
    assert unit.admits(0.5) and not unit.admits(0) and not unit.admits(1)
    assert Limit(0, 65535).admits(0) and Limit(0, 65535).admits(65535) and not Limit(0, 65535).admits(65536)
    assert (str(positive), str(Limit(1)), str(Limit(0, 65535))) == ("> 0", ">= 1", "0-65535")


BAD_VALUES = [
    ("max_new_tokens", "-5"),
    ("max_new_tokens", "0"),
    ("max_new_tokens", "3.5"),
    ("input_speed", "-1"),
    ("input_speed", "0"),
    ("min_silence_ms", "-100"),
    ("min_speech_ms", "-1"),
    ("speech_pad_ms", "-1"),
    ("max_speech_ms", "0"),
    ("turn_grace_ms", "-1"),
    ("vad_threshold", "0"),
    ("vad_threshold", "1.5"),
    ("temperature", "-0.1"),
    ("temperature", "nan"),
    ("port", "-1"),
    ("port", "65536"),
    ("max_sessions", "0"),
    ("max_message_kb", "0"),
    ("metrics_port", "65536"),
    ("drain_timeout_s", "-1"),
    ("otel", "maybe"),
    ("history_turns", "0"),
    ("audio_history_turns", "-1"),
    ("image_history_turns", "-1"),
    ("stream_batch_sentences", "0"),
    ("stt_beam_size", "0"),
    ("request_timeout_s", "0"),
    ("tts_chunk_ms", "0"),
    ("device", "gpu"),
    ("log_level", "loud"),
    ("interrupt_response", "maybe"),
    ("mode", "cloud"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_flag_value_exits_2(name: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args([f"--{name}", value])
    assert excinfo.value.code == 2
    line = single_error_line(capsys.readouterr().err)
    assert line.startswith("s2s_pipeline.py: error: ") and f"--{name}" in line


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_preset_value_exits_2(tmp_path: Path, name: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    raw: Any = value
    if name in LIMITS:  # as a JSON number where it is one
        try:
            raw = json.loads(value)
        except json.JSONDecodeError:
            raw = value
    preset = write_preset(tmp_path, {name: raw})
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", preset])
    assert excinfo.value.code == 2
    line = single_error_line(capsys.readouterr().err)
    assert "preset.json" in line and name in line


@pytest.mark.parametrize("data", [{"max_new_tokens": 40.5}, {"max_new_tokens": True}, {"stt_model": 3}])
def test_preset_value_of_the_wrong_json_type_exits_2(
    tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["--config", write_preset(tmp_path, data)])
    assert excinfo.value.code == 2
    single_error_line(capsys.readouterr().err)


def test_good_edge_values_are_accepted(tmp_path: Path) -> None:
    args = parse_args(["--port", "0", "--turn_grace_ms", "0", "--temperature", "0", "--device", "CUDA:1"])
    assert (args.port, args.turn_grace_ms, args.temperature, args.device) == (0, 0, 0.0, "cuda:1")
    preset = write_preset(tmp_path, {"vad_threshold": 0.3, "input_speed": 2, "log_level": "INFO"})
    args = parse_args(["--config", preset])
    assert (args.vad_threshold, args.input_speed, args.log_level) == (0.3, 2.0, "info")


# -- help ---------------------------------------------------------------------------------------------


def test_help_shows_each_default_once() -> None:
    parser = build_parser()
    formatter = HelpFormatter("s2s_pipeline.py")
    for action in parser._actions:
        text = formatter._get_help_string(action) % {**vars(action), "prog": "s2s_pipeline.py"}
        assert text.count("default:") <= 1, (action.dest, text)
        assert "(default: )" not in text and "default: None" not in text, (action.dest, text)
    stt = next(a for a in parser._actions if a.dest == "stt_model")
    assert "default: embedded Whisper tiny.en" in formatter._get_help_string(stt)
    tokens = next(a for a in parser._actions if a.dest == "max_new_tokens")
    assert formatter._get_help_string(tokens).endswith("(>= 1; default: 96)")


def test_help_names_the_system_prompt_and_exit_codes() -> None:
    result = run_entry_point("--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--print_system_prompt" in text and "You are a helpful, friendly voice assistant." in text
    assert "1 runtime failure" in text and "2 bad flags" in text


def test_print_system_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    from speech_to_speech.main import main

    # the default embedded 1.5B gets the full voice prompt, the fast 0.5B the compact one
    assert main(["--print_system_prompt", "--system_prompt", "You are a pirate."]) == 0
    out = capsys.readouterr().out
    assert out.strip() == build_voice_system_prompt("You are a pirate.").strip()
    argv = ["--print_system_prompt", "--system_prompt", "You are a pirate.", "--llm_model", "qwen2.5-coder-0.5b"]
    assert main(argv) == 0
    compact = capsys.readouterr().out
    assert compact.strip() == build_voice_system_prompt("You are a pirate.", compact=True).strip()
    assert compact.startswith("You are a pirate.") and "VOICE RULES" not in compact
    assert "You are a pirate." in out and "VOICE RULES" in out


# -- the entry point, as a user runs it -----------------------------------------------------------


def run_entry_point(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_pipeline(*argv, timeout=60)


#: the entry point with the ``echo`` (no model to load: :class:`speech_to_speech.testing.fakes.HelloLLM`)
#: and ``needs-extra`` (:class:`speech_to_speech.testing.fakes.NeedsExtraLLM`) LLM backends registered
ECHO_ENTRY = (
    "import sys\n"
    "from speech_to_speech.llm.stage import LLMConfig\n"
    "from speech_to_speech.pipeline.registry import Backend, register\n"
    "FAKES = 'speech_to_speech.testing.fakes'\n"
    "register(Backend('echo', 'llm', LLMConfig, FAKES + ':HelloLLM', summary='test echo'))\n"
    "register(Backend('needs-extra', 'llm', LLMConfig, FAKES + ':NeedsExtraLLM', extra='some-extra'))\n"
    "from speech_to_speech.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def run_echo_entry_point(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ECHO_ENTRY, "--llm_backend", "echo", "--device", "cpu", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_error(result: subprocess.CompletedProcess[str], status: int) -> str:
    """Exit ``status``, exactly one ``error:`` line on stderr and no traceback; returns that line."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("s2s_pipeline.py: error: "), errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--max_new_tokens", "-5"], "--max_new_tokens"),
        (["--input_speed", "-1"], "--input_speed"),
        (["--min_silence_ms", "-100"], "--min_silence_ms"),
        (["--llm_backend", "nope"], "nope"),
    ],
)
def test_entry_point_bad_flags_exit_2(flags: list[str], named: str) -> None:
    result = run_entry_point(*flags, "--input_text", "hi")
    line = assert_one_error(result, 2)
    assert named in line and result.stdout == ""
    assert single_error_line(result.stderr) == line


def test_entry_point_bad_preset_value_exits_2(tmp_path: Path) -> None:
    result = run_entry_point("--config", write_preset(tmp_path, {"max_new_tokens": -5}), "--input_text", "hi")
    line = assert_one_error(result, 2)
    assert "preset.json" in line and "max_new_tokens" in line


def test_entry_point_missing_input_audio(tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    result = run_entry_point("--input_audio", str(missing), "--device", "cpu")
    assert "missing.wav" in assert_one_error(result, 1)


def test_entry_point_input_audio_not_audio(tmp_path: Path) -> None:
    not_audio = tmp_path / "notes.txt"
    not_audio.write_text("this is not audio\n" * 20, encoding="utf-8")
    result = run_entry_point("--input_audio", str(not_audio), "--device", "cpu")
    assert "notes.txt" in assert_one_error(result, 1)


def test_entry_point_input_audio_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "recordings"
    folder.mkdir()
    line = assert_one_error(run_entry_point("--input_audio", str(folder), "--device", "cpu"), 1)
    assert "directory" in line and "recordings" in line and "not found" not in line


def test_entry_point_missing_output_folder(tmp_path: Path) -> None:
    result = run_echo_entry_point("--input_text", "hi", "--output_audio", str(tmp_path / "nowhere" / "out.wav"))
    assert "nowhere" in assert_one_error(result, 1)


def test_entry_point_backend_that_cannot_load_names_its_extra(tmp_path: Path) -> None:
    flags = ["--input_text", "hi", "--output_audio", str(tmp_path / "out.wav"), "--llm_backend", "needs-extra"]
    line = assert_one_error(run_echo_entry_point(*flags), 1)
    assert "some_engine" in line and "pip install 'speech-to-speech[some-extra]'" in line


@pytest.mark.parametrize("seconds", [1.0, 0.0])
def test_entry_point_no_speech_is_reported_and_still_writes_the_wav(tmp_path: Path, seconds: float) -> None:
    silent = tmp_path / "silence.wav"
    sf.write(str(silent), np.zeros(int(seconds * 16_000), dtype=np.float32), 16_000)
    out = tmp_path / "reply.wav"
    result = run_echo_entry_point("--input_audio", str(silent), "--output_audio", str(out), "--input_speed", "4")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error:" not in result.stderr
    assert f"no speech detected in {silent}" in result.stdout
    assert "user:" not in result.stdout
    info = sf.info(str(out))  # a valid WAV (silence)
    assert info.samplerate == 16_000 and info.channels == 1
    audio, _ = sf.read(str(out), dtype="float32")
    assert not np.any(np.abs(audio) > 0.01)


def test_entry_point_shows_loading_progress(tmp_path: Path) -> None:
    result = run_echo_entry_point("--input_text", "hi", "--output_audio", str(tmp_path / "out.wav"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("loading models")
    assert any(line.split() == ["llm", "echo", "test", "echo"] for line in lines), lines
    ready = [i for i, line in enumerate(lines) if line.startswith("ready in ")]
    assert len(ready) == 1, lines
    for stage in ("llm:echo ready", "tts:piper ready"):
        assert any(stage in line for line in lines[: ready[0]]), lines
    assert ready[0] < next(i for i, line in enumerate(lines) if "user: hi" in line)  # before the first turn


def test_error_inside_a_turn_is_shown_once_without_traceback(tmp_path: Path) -> None:
    flags = ["--input_text", "please fail", "--output_audio", str(tmp_path / "out.wav")]
    result = run_echo_entry_point(*flags)
    assert result.returncode == 0, result.stderr
    both = result.stdout + result.stderr
    assert "Traceback" not in both
    assert both.count("the echo model broke down") == 1, both
    assert "[turn 1] assistant error: RuntimeError: the echo model broke down" in result.stdout

    debug = run_echo_entry_point(*flags, "--log_level", "debug")
    assert debug.returncode == 0, debug.stderr
    assert "Traceback" in debug.stderr and "the echo model broke down" in debug.stderr


class _SlowStream(io.StringIO):
    """A stream that lets other threads run between writes, as a terminal's does under load."""

    def write(self, text: str) -> int:
        time.sleep(0.0005)
        return super().write(text)

    def isatty(self) -> bool:
        return False


def test_console_lines_from_many_threads_never_interleave() -> None:
    """Events published from several stage threads at once still print one whole line each."""
    from speech_to_speech.core.events import AssistantText, EventBus, UserTranscript, UserTranscriptDelta
    from speech_to_speech.pipeline.console import ConsoleReporter

    bus = EventBus()
    stream = _SlowStream()
    ConsoleReporter(bus, stream)

    def publish(kind: int) -> None:
        for turn in range(40):
            if kind == 0:
                bus.publish(UserTranscript(turn, text="Where did I say I moved to?"))
            elif kind == 1:
                bus.publish(AssistantText(turn, text="You said you moved to Boston."))
            else:
                bus.publish(UserTranscriptDelta(turn, text="Where did I"))

    threads = [threading.Thread(target=publish, args=(kind,)) for kind in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 120
    pattern = re.compile(
        r"^\[turn \d+\] (user: Where did I say I moved to\?|assistant: You said you moved to Boston\.|"
        r"user \(partial\): Where did I)$"
    )
    assert all(pattern.match(line) for line in lines), [line for line in lines if not pattern.match(line)][:3]
