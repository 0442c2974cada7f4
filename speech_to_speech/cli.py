"""Command line and JSON presets.

Flags for each stage come from the fields of its config dataclass (see
:mod:`speech_to_speech.registry`), so a new setting is one dataclass field.
A ``--config`` JSON file supplies defaults with the same keys as the flags;
flags given on the command line win. Unknown keys are an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

from speech_to_speech.registry import REGISTRY, STAGES

#: the embedded, offline defaults
DEFAULT_BACKENDS = {"vad": "silero", "stt": "faster-whisper", "llm": "llama-cpp", "tts": "piper"}


class ConfigError(ValueError):
    """A bad preset file or setting."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit with 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _AppendOverPreset(argparse.Action):
    """Like ``action="append"``, but values from the command line replace a preset's list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*items, values])


@dataclasses.dataclass
class RunConfig:
    """How the pipeline is fed and where its output goes.

    Attributes:
        mode: "local" (microphone/speaker or files) or "server" (realtime WebSocket server).
        host: server bind address.
        port: server port.
        max_sessions: concurrent server sessions; the next client is refused.
        api_key: when set, server clients must send ``Authorization: Bearer <key>``.
        max_message_kb: largest client message the server accepts, KiB.
        input_audio: audio file fed at real-time pace instead of the microphone.
        input_text: typed user turns (skip VAD and STT).
        output_audio: WAV file for the assistant's audio instead of the speaker.
        transcript: JSON Lines file of events.
        input_speed: pace multiplier for --input_audio (1.0 = real time).
        device: "auto", "cpu", "cuda" or "mps" for every stage.
        log_level: Python logging level name.
    """

    mode: str = "local"
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 4
    api_key: str = ""
    max_message_kb: int = 1024
    input_audio: str | None = None
    input_text: list[str] | None = None
    output_audio: str | None = None
    transcript: str | None = None
    input_speed: float = 1.0
    device: str = "auto"
    log_level: str = "warning"


_HELP = {
    "mode": "local: microphone/speaker or files; server: OpenAI Realtime WebSocket server",
    "host": "server: bind address",
    "port": "server: port",
    "max_sessions": "server: concurrent sessions (the next client gets an error and close code 1013)",
    "api_key": "server: require 'Authorization: Bearer KEY' from clients",
    "max_message_kb": "server: largest client message, KiB",
    "input_audio": "audio file (any format/rate soundfile reads) fed like a microphone",
    "input_text": "a user turn as text, skipping VAD/STT (repeat for several turns)",
    "output_audio": "write the assistant's audio to this WAV file, on the input's timeline",
    "transcript": "write events (transcripts, replies, timings) as JSON Lines here",
    "input_speed": "feed --input_audio this many times faster than real time",
    "device": "compute device for every stage: auto, cpu, cuda or mps",
    "log_level": "logging level: debug, info, warning, error",
    "vad_threshold": "speech probability that starts a turn (0-1)",
    "min_silence_ms": "silence that ends a turn, ms",
    "min_speech_ms": "shorter speech is ignored as noise, ms",
    "speech_pad_ms": "audio kept before and after speech, ms",
    "max_speech_ms": "a turn is cut at this length, ms",
    "interrupt_response": "user speech cancels the reply being spoken (barge-in), true/false",
    "turn_grace_ms": "speech resuming within this time after an endpoint reopens the turn, ms (0: off)",
    "stt_model": "STT model folder or hub id (default: embedded Whisper tiny.en)",
    "language": "spoken language code (e.g. en), or auto",
    "stt_compute_type": "STT precision (default, int8, float16, ...)",
    "stt_beam_size": "STT beam width (1 = greedy)",
    "llm_model": "LLM folder, GGUF file or hub id (default: embedded SmolLM2-135M-Instruct)",
    "system_prompt": "the LLM system prompt",
    "max_new_tokens": "maximum tokens per reply",
    "temperature": "sampling temperature (0 = greedy)",
    "history_turns": "user turns kept in the conversation history",
    "stream_batch_sentences": "sentences per TTS batch after the first",
    "tts_voice": "Piper voice .onnx path (default: embedded voice)",
    "stream_words": "feed TTS word by word (engines that take streaming text), true/false",
    "audio_history_turns": "user turns whose audio stays in history (older audio is replaced by text)",
    "compact_history": "summarise old turns in the background instead of dropping them (true/false)",
    "model_name": "model id at the OpenAI-compatible endpoint",
    "responses_api_base_url": "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (empty: OpenAI)",
    "responses_api_api_key": "API key (empty: $OPENAI_API_KEY; loopback URLs need none)",
    "responses_api_stream": "stream responses (true/false)",
    "request_timeout_s": "total request timeout, seconds (connect timeout: min(10, total))",
    "reasoning_effort": "reasoning_effort sent to non-OpenAI endpoints (empty: disable thinking instead)",
    "tts_chunk_ms": "TTS audio chunk size, ms",
}


def parse_bool(text: str | bool) -> bool:
    """Read a flag value as a boolean: true/false, yes/no, on/off, 1/0 (any case).

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _field_type(cls: type, field: dataclasses.Field) -> Any:
    hint = typing.get_type_hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if args else hint
    return parse_bool if kind is bool else kind


def stage_config_classes() -> list[type]:
    """Every distinct config dataclass used by registered backends, in stage order."""
    seen: list[type] = []
    for stage in STAGES:
        for backend in REGISTRY[stage].values():
            if backend.config_cls not in seen:
                seen.append(backend.config_cls)
    return seen


def build_parser() -> OneLineParser:
    """The full command-line parser."""
    parser = OneLineParser(
        prog="s2s_pipeline.py",
        description="speech-to-speech: a low-latency voice agent (VAD -> STT -> LLM -> TTS).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", metavar="PATH.json", help="load a JSON preset (flags override it)")
    for stage, flag in (("vad", "--vad"), ("stt", "--stt"), ("llm", "--llm_backend"), ("tts", "--tts")):
        names = sorted(REGISTRY[stage])
        parser.add_argument(flag, default=DEFAULT_BACKENDS[stage], help=f"{stage} backend: {', '.join(names)}")
    run = parser.add_argument_group("input and output")
    for field in dataclasses.fields(RunConfig):
        flag = f"--{field.name}"
        if field.name == "input_text":
            run.add_argument(flag, action=_AppendOverPreset, metavar="TEXT", help=_HELP[field.name])
        elif field.name == "mode":
            run.add_argument(flag, choices=("local", "server"), default=field.default, help=_HELP[field.name])
        else:
            run.add_argument(flag, type=_field_type(RunConfig, field), default=field.default, help=_HELP[field.name])
    seen: set[str] = set()
    for cls in stage_config_classes():
        group = parser.add_argument_group(cls.__name__.replace("Config", "") + " settings")
        for field in dataclasses.fields(cls):
            if field.name in seen:  # shared by several configs (e.g. language, LLM subclasses)
                continue
            seen.add(field.name)
            group.add_argument(
                f"--{field.name}", type=_field_type(cls, field), default=field.default, help=_HELP.get(field.name, "")
            )
    return parser


def load_preset(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read a JSON preset and check its keys against the parser's options.

    Raises:
        ConfigError: unreadable file, invalid JSON, not an object, or unknown keys.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object")
    known = {action.dest for action in parser._actions} - {"help", "config"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(unknown)}")
    if isinstance(data.get("input_text"), str):  # one turn, not one turn per character
        data["input_text"] = [data["input_text"]]
    return data


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse flags (and a ``--config`` preset); exit 2 with one line on any error."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        try:
            parser.set_defaults(**load_preset(pre.config, parser))
        except ConfigError as exc:
            parser.error(str(exc))
    return parser.parse_args(argv)


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    """Build the dataclass ``cls`` from the matching attributes of ``args``."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})
