"""Command line and JSON presets.

Flags for each stage come from the fields of its config dataclass (see
:mod:`speech_to_speech.pipeline.registry`), so a new setting is one dataclass field
(plus, for a number, its valid range in :data:`LIMITS`). A ``--config`` JSON
file supplies defaults with the same keys as the flags; flags given on the
command line win. Unknown keys are an error.

Every value, from a flag or from a preset, is converted and checked while
parsing: a bad one ends the program with one ``error:`` line and exit
status 2, before anything loads.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from speech_to_speech.llm.prompts import DEFAULT_VOICE_PERSONA
from speech_to_speech.pipeline.registry import REGISTRY, STAGES
from speech_to_speech.speech.tts import parse_voices

#: the embedded, offline defaults
DEFAULT_BACKENDS = {"vad": "silero", "stt": "faster-whisper", "llm": "llama-cpp", "tts": "piper"}

#: exit status for bad flags or a bad preset (as argparse uses)
EXIT_USAGE = 2
#: levels accepted by --log_level
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(ValueError):
    """A bad preset file or setting."""


@dataclasses.dataclass(frozen=True)
class Limit:
    """The valid range of a numeric setting, in the setting's own unit.

    Attributes:
        low: smallest valid value (None: no lower bound).
        high: largest valid value (None: no upper bound).
        low_open: ``low`` itself is not valid (``> low`` instead of ``>= low``).
        high_open: ``high`` itself is not valid.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        """True when ``value`` lies in the range (NaN never does)."""
        if math.isnan(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            if not (self.low_open or self.high_open):
                return f"{self.low:g}-{self.high:g}"
            return f"{'>' if self.low_open else '>='} {self.low:g} and {'<' if self.high_open else '<='} {self.high:g}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "any number"


_POSITIVE = Limit(0, low_open=True)
_NON_NEGATIVE = Limit(0)
_AT_LEAST_ONE = Limit(1)

#: the valid range of every numeric setting, by field name (flag name without ``--``), for
#: :class:`RunConfig` and every stage config dataclass; ``tests/test_cli.py`` checks that no
#: int or float field is missing. Units are the fields' own (ms, s, KiB, tokens, ...).
LIMITS: dict[str, Limit] = {
    # input and output (RunConfig)
    "port": Limit(0, 65535),  # 0: any free port (the server prints the one it got)
    "max_sessions": _AT_LEAST_ONE,
    "max_message_kb": _AT_LEAST_ONE,
    "metrics_port": Limit(0, 65535),  # 0: /metrics on the server's own port
    "drain_timeout_s": _NON_NEGATIVE,  # 0: close the sessions at once
    "input_speed": _POSITIVE,  # x real time
    # VAD (VADConfig)
    "vad_threshold": Limit(0, 1, low_open=True, high_open=True),  # a speech probability
    "min_silence_ms": _POSITIVE,
    "min_speech_ms": _NON_NEGATIVE,
    "speech_pad_ms": _NON_NEGATIVE,
    "max_speech_ms": _POSITIVE,
    "turn_grace_ms": _NON_NEGATIVE,  # 0: off
    "speculative_silence_ms": _NON_NEGATIVE,  # 0: off
    "partial_interval_ms": _NON_NEGATIVE,  # 0: off
    "turn_threshold": Limit(0, 1, low_open=True, high_open=True),  # a probability
    "turn_max_silence_ms": _POSITIVE,
    "turn_question_silence_ms": _NON_NEGATIVE,  # 0: off
    "turn_statement_silence_ms": _NON_NEGATIVE,  # 0: off
    "resume_within_ms": _NON_NEGATIVE,  # 0: speech during a reply cancels it at once
    # STT (STTConfig)
    "stt_beam_size": _AT_LEAST_ONE,
    "stt_cpu_threads": _NON_NEGATIVE,  # 0: the engine's default
    # LLM (LLMConfig and its subclasses)
    "max_new_tokens": _AT_LEAST_ONE,
    "temperature": _NON_NEGATIVE,  # 0: greedy
    "history_turns": _AT_LEAST_ONE,
    "stream_batch_sentences": _AT_LEAST_ONE,
    "audio_history_turns": _NON_NEGATIVE,
    "image_history_turns": _NON_NEGATIVE,
    "llm_threads": _NON_NEGATIVE,  # 0: automatic
    "llm_context": Limit(512),  # tokens: the system prompt, history and reply must fit
    "request_timeout_s": _POSITIVE,
    "first_token_timeout_s": _NON_NEGATIVE,  # 0: no limit on the wait for the first token
    "next_token_timeout_s": _NON_NEGATIVE,  # 0: no limit between tokens
    # TTS (TTSConfig)
    "tts_chunk_ms": _POSITIVE,
}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit with 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds each option's valid range and default to its help, once.

    Nothing is added for an empty default (None or ""), nor a default for a
    help text that already says ``default:``.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        extra = []
        limit = LIMITS.get(action.dest)
        if limit is not None:
            extra.append(str(limit))
        default = action.default
        if "default:" not in text and default not in (None, "", argparse.SUPPRESS) and action.nargs != 0:
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            extra.append(f"default: {shown}".replace("%", "%%"))
        return f"{text} ({'; '.join(extra)})" if extra else text


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


class _JoinVoices(argparse.Action):
    """``--tts_voice`` given several times: the values joined with commas (replacing a preset's)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = getattr(self, "_seen", set())
        current = getattr(namespace, self.dest, "") if id(namespace) in seen else ""
        joined = f"{current},{values}" if current and values else (values or current)
        try:
            parse_voices(joined)  # a language named twice across flags
        except ValueError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        self._seen = seen | {id(namespace)}
        setattr(namespace, self.dest, joined)


def parse_tts_voice(value: Any) -> str:
    """Check a ``--tts_voice`` value's form (:func:`~speech_to_speech.speech.tts.parse_voices`).

    Raises:
        argparse.ArgumentTypeError: a malformed entry, the message naming it.
    """
    text = _to_str(value)
    try:
        parse_voices(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclasses.dataclass
class RunConfig:
    """How the pipeline is fed and where its output goes.

    Attributes:
        mode: "local" (microphone/speaker or files) or "server" (realtime WebSocket server).
        host: server bind address.
        port: server port (0: any free port).
        max_sessions: concurrent server sessions; the next client is refused.
        api_key: when set, server clients must send ``Authorization: Bearer <key>``.
        max_message_kb: largest client message the server accepts, KiB.
        ssl_certfile: PEM certificate (chain) for HTTPS/WSS; browsers give the page the
            microphone only over HTTPS or on localhost.
        ssl_keyfile: PEM private key of ``ssl_certfile`` (empty: the key is in that file).
        allowed_origins: comma-separated browser origins (``https://host[:port]``, or ``*``) allowed
            besides the server's own; requests without an ``Origin`` header are not checked.
        metrics_port: port of a separate ``/metrics`` endpoint (0: on the server's port).
        drain_timeout_s: on SIGTERM, how long active responses may take to finish before every
            session is closed (1001), s.
        otel: export OpenTelemetry traces by OTLP/HTTP (also on when ``$OTEL_EXPORTER_OTLP_ENDPOINT`` is set).
        input_audio: audio file fed at real-time pace instead of the microphone.
        input_text: typed user turns (skip VAD and STT).
        output_audio: WAV file for the assistant's audio instead of the speaker.
        transcript: JSON Lines file of events.
        input_speed: pace multiplier for --input_audio (1.0 = real time).
        device: "auto", "cpu", "cuda" (or "cuda:N") or "mps" for every stage.
        log_level: Python logging level name (see :data:`LOG_LEVELS`).
    """

    mode: str = "local"
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 4
    api_key: str = ""
    max_message_kb: int = 1024
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    allowed_origins: str = ""
    metrics_port: int = 0
    drain_timeout_s: float = 30.0
    otel: bool = False
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
    "port": "server: port; 0 picks a free one",
    "max_sessions": "server: concurrent sessions (the next client gets an error and close code 1013)",
    "api_key": "server: require 'Authorization: Bearer KEY' from clients",
    "max_message_kb": "server: largest client message, KiB",
    "ssl_certfile": "server: PEM certificate for https:// and wss:// (browsers need HTTPS for the microphone "
    "on any host but localhost)",
    "ssl_keyfile": "server: PEM private key of --ssl_certfile (empty: the key is in the certificate file)",
    "allowed_origins": "server: comma-separated browser origins allowed besides the server's own "
    "(e.g. https://app.example.com; * allows any); requests without an Origin header are not checked",
    "metrics_port": "server: serve Prometheus /metrics on this port instead of the server's port (0: the same port)",
    "drain_timeout_s": "server: on SIGTERM, how long active responses may finish before sessions close (1001), s",
    "otel": "server: export OpenTelemetry traces by OTLP/HTTP, true/false (on too when $OTEL_EXPORTER_OTLP_ENDPOINT "
    "is set; needs the otel extra)",
    "input_audio": "audio file (any format/rate soundfile reads) fed like a microphone",
    "input_text": "a user turn as text, skipping VAD/STT (repeat for several turns)",
    "output_audio": "write the assistant's audio to this WAV file, on the input's timeline",
    "transcript": "write events (transcripts, replies, timings) as JSON Lines here",
    "input_speed": "feed --input_audio this many times faster than real time",
    "device": "compute device for every stage: auto, cpu, cuda, cuda:N or mps",
    "log_level": f"logging level: {', '.join(LOG_LEVELS)} (debug also shows tracebacks)",
    "vad_threshold": "speech probability that starts a turn",
    "min_silence_ms": "silence that ends a turn, ms",
    "min_speech_ms": "shorter speech is ignored as noise, ms",
    "speech_pad_ms": "audio kept before and after speech, ms",
    "max_speech_ms": "a turn is cut at this length, ms",
    "interrupt_response": "user speech cancels the reply being spoken (barge-in), true/false",
    "turn_grace_ms": "speech resuming within this time after an endpoint reopens the turn, ms; 0 turns it off",
    "speculative_silence_ms": "silence after which the turn is sent on speculatively, before --min_silence_ms "
    "confirms it, ms; 0 turns it off",
    "partial_interval_ms": "while the user speaks, a partial transcript every this much audio, ms; 0 turns it off",
    "turn_detection": "how a turn ends: smart_turn (after --speculative_silence_ms of silence the Smart Turn model "
    "judges whether the user is done), silence (--min_silence_ms of silence), or auto (smart_turn when its model "
    "is installed: the smart-turn extra)",
    "turn_threshold": "smart_turn: P(turn complete) at or above which the turn ends at once",
    "turn_max_silence_ms": "smart_turn: silence that ends a turn the model judged unfinished, ms",
    "turn_question_silence_ms": "smart_turn: silence that ends an unfinished turn whose transcript is a question "
    "(or a finished statement the model nearly judged done), ms",
    "turn_statement_silence_ms": "smart_turn: the same for a finished statement (not ending in a number, 'and', ...)",
    "resume_within_ms": (
        "user speech pauses the reply being spoken; a backchannel or false start judged within this time "
        "(from the start of the speech, or its end once it ended) resumes it, anything else interrupts it, ms; "
        "0: speech interrupts at once"
    ),
    "echo_gate": "where the input can hear the assistant (live mode's speaker, a WebRTC call), speech no louder than "
    "the echo of what it just played is not speech, and a transcript of only its words is its echo",
    "echo_cancel": "WebRTC's echo canceller (AEC3) removes the assistant's voice from the input once heard there: "
    "auto (the default: where a raw microphone can hear the speaker, local mode), true (also on WebRTC calls) or false",
    "noise_suppression": "WebRTC's noise suppression on the input before VAD and STT, true/false",
    "background_gate": "speech no louder than the room's background (a television, other people talking) is not the "
    "user's, while that background is speech: auto (the default: a raw microphone in a room, local mode), true, false",
    "stt_cpu_threads": "STT engine CPU threads; 0 = the engine's default",
    "stt_model": (
        "STT model: whisper-base (embedded, multilingual; the multilingual extra), whisper-tiny.en, a CTranslate2 "
        "folder or a hub id (default: embedded Whisper tiny.en)"
    ),
    "language": (
        "spoken language code (e.g. en), auto (detected per turn; needs a multilingual --stt_model such as "
        "whisper-base), or a comma-separated list to detect among (e.g. en,fr,de,es)"
    ),
    "stt_compute_type": "STT precision (default, int8, float16, ...)",
    "stt_beam_size": "STT beam width (1 = greedy)",
    "llm_model": (
        "LLM folder, GGUF file, hub id, or an embedded model: qwen2.5-coder-1.5b (the default) or "
        "qwen2.5-coder-0.5b (faster, less sense); default: the backend's embedded model, see --llm_backend"
    ),
    "system_prompt": (
        "session instructions (the persona) inside the voice system prompt "
        f"(default: {DEFAULT_VOICE_PERSONA!r}); --print_system_prompt shows the whole prompt"
    ),
    "max_new_tokens": "maximum tokens per reply",
    "temperature": "sampling temperature (0 = greedy)",
    "history_turns": "user turns kept in the conversation history",
    "stream_batch_sentences": "sentences per TTS batch after the first",
    "llm_threads": "llama.cpp threads; 0 = every core, at most 4",
    "llm_context": "llama.cpp context window, tokens",
    "tts_voice": (
        "voice per language, LANG=VOICE (repeatable or comma-separated), and/or a default VOICE: a Piper "
        ".onnx path (piper; default: the embedded English voice, espeak-ng for other languages) or an "
        "espeak-ng voice name (espeak-ng)"
    ),
    "stream_words": "feed TTS word by word (engines that take streaming text), true/false",
    "audio_history_turns": "user turns whose audio stays in history (older audio is replaced by text)",
    "image_history_turns": "user turns whose images stay in history (older images become a text placeholder)",
    "compact_history": "summarise old turns in the background instead of dropping them (true/false)",
    "model_name": "model id at the OpenAI-compatible endpoint",
    "responses_api_base_url": "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (empty: OpenAI)",
    "responses_api_api_key": "API key (empty: $OPENAI_API_KEY; loopback URLs need none)",
    "responses_api_stream": "stream responses (true/false)",
    "request_timeout_s": "longest a whole response may take, s (connect timeout: min(10, this))",
    "first_token_timeout_s": "longest wait for a response's first token, s; then a short apology is spoken; 0 = none",
    "next_token_timeout_s": "longest wait for each token after the first, s; then an apology; 0 = none",
    "reasoning_effort": "reasoning_effort sent to non-OpenAI endpoints (empty: disable thinking instead)",
    "tts_chunk_ms": "TTS audio chunk size, ms",
}

_METAVARS = {int: "N", float: "X", str: "TEXT", bool: "BOOL"}


def parse_bool(text: str | bool) -> bool:
    """Read a flag value as a boolean: true/false, yes/no, on/off, 1/0 (any case).

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    if isinstance(text, bool):
        return text
    value = text.strip().lower() if isinstance(text, str) else None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _to_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}")


def _to_float(value: Any) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value.strip())
    if number is None or not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    return number


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise argparse.ArgumentTypeError(f"expected a string, got {value!r}")
    return value


def value_parser(kind: type, name: str) -> Callable[[Any], Any]:
    """The converter for setting ``name`` of type ``kind`` (int, float, str or bool).

    It takes a command-line string or a JSON value from a preset, converts it and
    checks it against ``LIMITS[name]``, if any.

    Raises (from the returned function):
        argparse.ArgumentTypeError: a value of the wrong type or out of range.
    """
    convert: Callable[[Any], Any] = {int: _to_int, float: _to_float, bool: parse_bool}.get(kind, _to_str)
    limit = LIMITS.get(name)

    def parse(value: Any) -> Any:
        result = convert(value)
        if limit is not None and not limit.admits(result):
            raise argparse.ArgumentTypeError(f"must be {limit}, got {result:g}")
        return result

    parse.__name__ = f"{kind.__name__}_{name}"
    return parse


def parse_device(value: Any) -> str:
    """Check a ``--device`` value: auto, cpu, cuda, cuda:N or mps.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    text = _to_str(value).strip().lower()
    if text in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N or mps, got {value!r}")


def _lower(value: Any) -> str:
    return _to_str(value).strip().lower()


def _field_kind(cls: type, field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def stage_config_classes() -> list[type]:
    """Every distinct config dataclass used by registered backends, in stage order,
    each dataclass base before its subclasses (so shared fields are listed with the base)."""
    seen: list[type] = []
    for stage in STAGES:
        for backend in REGISTRY[stage].values():
            for cls in reversed(backend.config_cls.__mro__):
                if dataclasses.is_dataclass(cls) and cls not in seen:
                    seen.append(cls)
    return seen


def _backend_help(stage: str) -> str:
    entries = [f"{name} = {REGISTRY[stage][name].summary or name}" for name in sorted(REGISTRY[stage])]
    return f"{stage} backend: " + "; ".join(entries)


def build_parser() -> OneLineParser:
    """The full command-line parser."""
    parser = OneLineParser(
        prog="s2s_pipeline.py",
        usage="%(prog)s [--config PATH.json] [--FLAG VALUE ...]",
        description="speech-to-speech: a low-latency voice agent (VAD -> STT -> LLM -> TTS). "
        "Exit status: 0 done, 1 runtime failure (file, device, model), 2 bad flags or preset.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--config", metavar="PATH.json", help="load a JSON preset (flags override it)")
    parser.add_argument(
        "--print_system_prompt",
        action="store_true",
        help="print the system prompt the LLM gets for spoken replies (with --system_prompt applied) and exit",
    )
    for stage, flag in (("vad", "--vad"), ("stt", "--stt"), ("llm", "--llm_backend"), ("tts", "--tts")):
        parser.add_argument(
            flag,
            default=DEFAULT_BACKENDS[stage],
            choices=sorted(REGISTRY[stage]),
            metavar="NAME",
            help=_backend_help(stage),
        )
    run = parser.add_argument_group("input and output")
    for field in dataclasses.fields(RunConfig):
        flag, text = f"--{field.name}", _HELP[field.name]
        if field.name == "input_text":
            run.add_argument(flag, action=_AppendOverPreset, type=_to_str, metavar="TEXT", help=text)
        elif field.name == "mode":
            run.add_argument(flag, choices=("local", "server"), default=field.default, help=text)
        elif field.name == "device":
            run.add_argument(flag, type=parse_device, default=field.default, metavar="DEVICE", help=text)
        elif field.name == "log_level":
            run.add_argument(flag, type=_lower, choices=LOG_LEVELS, default=field.default, metavar="LEVEL", help=text)
        else:
            kind = _field_kind(RunConfig, field)
            paths = ("input_audio", "output_audio", "transcript", "ssl_certfile", "ssl_keyfile")
            metavar = "PATH" if field.name in paths else _METAVARS.get(kind)
            run.add_argument(
                flag, type=value_parser(kind, field.name), default=field.default, metavar=metavar, help=text
            )
    seen: set[str] = set()
    for cls in stage_config_classes():
        group = parser.add_argument_group(cls.__name__.replace("Config", "") + " settings")
        for field in dataclasses.fields(cls):
            if field.name in seen:  # shared by several configs (e.g. language, LLM subclasses)
                continue
            seen.add(field.name)
            kind = _field_kind(cls, field)
            if field.name == "tts_voice":
                group.add_argument(
                    "--tts_voice",
                    action=_JoinVoices,
                    type=parse_tts_voice,
                    default="",
                    metavar="[LANG=]VOICE",
                    help=_HELP["tts_voice"],
                )
                continue
            group.add_argument(
                f"--{field.name}",
                type=value_parser(kind, field.name),
                default=field.default,
                metavar=_METAVARS.get(kind),
                help=_HELP.get(field.name, ""),
            )
    return parser


#: parser destinations that are not settings (not accepted in a preset)
_NOT_SETTINGS = frozenset({"help", "config", "print_system_prompt"})


def _check_preset_value(action: argparse.Action, value: Any) -> Any:
    """Convert and check one preset value as the flag's own parser would."""
    if isinstance(action, _AppendOverPreset):
        items = [value] if isinstance(value, str) else value  # one string: one turn, not one per character
        if not isinstance(items, list):
            raise argparse.ArgumentTypeError(f"expected a string or a list of strings, got {value!r}")
        return [action.type(item) if action.type else item for item in items]
    if action.type is not None:
        value = action.type(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise argparse.ArgumentTypeError(f"invalid choice {value!r} (choose from {choices})")
    return value


def load_preset(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read a JSON preset, check its keys against the parser's options and convert and
    range-check its values exactly as the flags' values are.

    Raises:
        ConfigError: unreadable file, invalid JSON, not an object, unknown keys or a bad value.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file is a directory: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object")
    actions = {action.dest: action for action in parser._actions if action.dest not in _NOT_SETTINGS}
    unknown = sorted(set(data) - set(actions))
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(unknown)}")
    checked = {}
    for key, value in data.items():
        try:
            checked[key] = _check_preset_value(actions[key], value)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{path}: {key}: {exc}") from None
    return checked


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
