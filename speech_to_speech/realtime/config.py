"""A session's configuration: what ``session.update`` may set, and the session object it reports.

:func:`apply_update` reads a ``session.update`` already validated against the SDK's
``RealtimeSessionCreateRequest`` and returns the new :class:`SessionConfig` with the
problems it found, one :class:`~speech_to_speech.realtime.protocol.ProtocolError` per
offending field: a field the server does not support (another audio format, a speed,
noise reduction, a prompt, ...) is reported and left as it was while the rest of the
update applies.

Turn detection starts as in local mode (``semantic_vad`` with the end-of-turn model installed,
see :meth:`SessionConfig.from_args`), and a client may change it. ``server_vad`` drives the
session's VAD endpointer directly (turns end on
``silence_duration_ms`` of silence); ``semantic_vad`` ends them with the Smart Turn
end-of-turn model (:mod:`speech_to_speech.turns.turn_detection`, through the VAD's
``set_eagerness``): at once when it judges the user done after a 200 ms pause, else after
the silence bound of its ``eagerness`` (low 4 s, medium and auto 2 s, high 1 s). Without
the model installed, ``semantic_vad`` ends turns on silence too (logged).
"""

from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass, field, replace
from typing import Any

from openai.types.realtime import RealtimeSessionCreateRequest

from speech_to_speech.realtime.protocol import ProtocolError, check_tools
from speech_to_speech.realtime.wire import WIRE_RATE
from speech_to_speech.turns.turn_detection import TurnModelUnavailable, resolve_turn_detection

#: ``semantic_vad`` eagerness values (``auto`` is ``medium``)
EAGERNESS = ("low", "medium", "high", "auto")


@dataclass(frozen=True)
class TurnDetection:
    """Server-side turn detection as the client configured it.

    Attributes:
        type: ``"server_vad"`` or ``"semantic_vad"``.
        threshold: speech probability threshold of the VAD, in (0, 1).
        silence_duration_ms: silence that ends a turn.
        prefix_padding_ms: audio kept before the detected start of speech.
        create_response: a detected turn gets a response.
        interrupt_response: speech cuts the response being played (barge-in).
        eagerness: ``semantic_vad`` only: how soon a turn the end-of-turn model judged
            unfinished ends (see :data:`~speech_to_speech.turns.turn_detection.EAGERNESS_MAX_SILENCE_MS`),
            handed to the VAD through :meth:`vad_settings`.
    """

    type: str
    threshold: float
    silence_duration_ms: int
    prefix_padding_ms: int
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None

    def wire(self) -> dict[str, Any]:
        """The protocol object (``audio.input.turn_detection``)."""
        if self.type == "semantic_vad":
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness or "auto",
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "silence_duration_ms": self.silence_duration_ms,
            "prefix_padding_ms": self.prefix_padding_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }

    def vad_settings(self) -> dict[str, Any]:
        """What the VAD stage takes: its config fields, ``create_response`` and ``eagerness``."""
        return {
            "vad_threshold": self.threshold,
            "min_silence_ms": self.silence_duration_ms,
            "speech_pad_ms": self.prefix_padding_ms,
            "interrupt_response": self.interrupt_response,
            "create_response": self.create_response,
            "eagerness": self.eagerness if self.type == "semantic_vad" else None,
        }


@dataclass(frozen=True)
class SessionConfig:
    """The effective configuration of one session (defaults from the server's flags)."""

    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    voice: str = "joe"
    turn_detection: TurnDetection | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"
    max_output_tokens: int | str = "inf"
    transcription: dict[str, Any] = field(default_factory=dict)
    tracing: str | None = None
    noise_reduction: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SessionConfig:
        """The configuration a new session starts with: turn detection as in local mode,
        ``semantic_vad`` when ``--turn_detection`` resolves to the end-of-turn model, else
        ``server_vad`` on ``--min_silence_ms`` of silence."""
        try:
            semantic = resolve_turn_detection(args.turn_detection) == "smart_turn"
        except (ValueError, TurnModelUnavailable):
            semantic = False
        kind, eagerness = ("semantic_vad", "auto") if semantic else ("server_vad", None)
        vad = TurnDetection(kind, args.vad_threshold, args.min_silence_ms, args.speech_pad_ms, eagerness=eagerness)
        return cls(turn_detection=vad, transcription={"model": args.stt})

    def stt_language(self, default: str) -> str:
        """The STT's language setting for this session: ``transcription.language`` when set, else
        ``transcription.languages`` as a candidate list, else ``default`` (the server's ``--language``)."""
        if self.transcription.get("language"):
            return str(self.transcription["language"])
        if self.transcription.get("languages"):
            return ",".join(self.transcription["languages"])
        return default

    @property
    def wants_audio(self) -> bool:
        return self.output_modalities != ("text",)

    def session_object(self, session_id: str, model: str) -> dict[str, Any]:
        """The session as ``session.created`` / ``session.updated`` describe it."""
        pcm = {"type": "audio/pcm", "rate": WIRE_RATE}
        return {
            "type": "realtime",
            "id": session_id,
            "object": "realtime.session",
            "model": model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "audio": {
                "input": {
                    "format": pcm,
                    "turn_detection": None if self.turn_detection is None else self.turn_detection.wire(),
                    "transcription": dict(self.transcription),
                    "noise_reduction": None if self.noise_reduction is None else {"type": self.noise_reduction},
                },
                "output": {"format": pcm, "voice": self.voice, "speed": 1.0},
            },
            "tools": copy.deepcopy(self.tools),
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens,
            "tracing": self.tracing,
        }


#: session fields the server reads; any other field set to a value is reported as unsupported
_SESSION_FIELDS = {"type", "model", "instructions", "output_modalities", "audio", "tools", "tool_choice"}
_SESSION_FIELDS |= {"max_output_tokens", "tracing"}


def check_modalities(modalities: Any, param: str) -> tuple[str, ...]:
    """``output_modalities`` as a tuple: ``("audio",)`` or ``("text",)`` (both: audio with a transcript).

    Raises:
        ProtocolError: empty, or not made of "audio" and "text".
    """
    if not isinstance(modalities, list) or not modalities or not set(modalities) <= {"audio", "text"}:
        raise ProtocolError("invalid_value", "'output_modalities' must be ['audio'] or ['text']", param=param)
    return ("text",) if modalities == ["text"] else ("audio",)


def apply_update(
    config: SessionConfig, update: RealtimeSessionCreateRequest, args: argparse.Namespace
) -> tuple[SessionConfig, list[ProtocolError]]:
    """``config`` with what ``update`` sets; the problems found, one per field (those fields unchanged)."""
    problems: list[ProtocolError] = []
    changes: dict[str, Any] = {}
    raw = update.model_dump(exclude_unset=True)

    def check(param: str, apply: Any) -> None:
        try:
            apply()
        except ProtocolError as exc:
            exc.param = exc.param or param
            problems.append(exc)

    for name in sorted(set(raw) - _SESSION_FIELDS):
        if raw[name] not in (None, [], {}):
            problems.append(_unsupported(f"session.{name}"))
    if update.instructions is not None:
        changes["instructions"] = update.instructions
    if "output_modalities" in raw:
        check(
            "session.output_modalities",
            lambda: changes.update(
                output_modalities=check_modalities(raw["output_modalities"], "session.output_modalities")
            ),
        )
    if "tools" in raw or "tool_choice" in raw:
        tools = raw.get("tools") if raw.get("tools") is not None else config.tools
        tool_choice = raw.get("tool_choice") if raw.get("tool_choice") is not None else config.tool_choice

        def set_tools() -> None:
            check_tools(tools, tool_choice)
            changes.update(tools=copy.deepcopy(tools), tool_choice=tool_choice)

        check("session.tools", set_tools)
    if "max_output_tokens" in raw and raw["max_output_tokens"] is not None:
        changes["max_output_tokens"] = raw["max_output_tokens"]
    if isinstance(raw.get("tracing"), dict):
        problems.append(_unsupported("session.tracing", "tracing configurations are not supported (only 'auto')"))
    elif "tracing" in raw:
        changes["tracing"] = raw["tracing"]
    audio = raw.get("audio") or {}
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    for side, part in (("input", audio_in), ("output", audio_out)):
        fmt = part.get("format")
        if fmt is not None and (fmt.get("type", "audio/pcm") != "audio/pcm" or fmt.get("rate", WIRE_RATE) != WIRE_RATE):
            message = f"only audio/pcm at {WIRE_RATE} Hz is supported"
            problems.append(ProtocolError("unsupported_audio_format", message, param=f"session.audio.{side}.format"))
    if "noise_reduction" in audio_in:
        check(
            "session.audio.input.noise_reduction",
            lambda: changes.update(noise_reduction=_noise_reduction(audio_in["noise_reduction"])),
        )
    if audio_in.get("transcription") is not None:
        check(
            "session.audio.input.transcription",
            lambda: changes.update(transcription=_transcription(config, audio_in["transcription"], args)),
        )
    if audio_out.get("speed") not in (None, 1, 1.0):
        problems.append(_unsupported("session.audio.output.speed", "only speed 1.0 is supported"))
    if audio_out.get("voice") is not None:
        changes["voice"] = str(audio_out["voice"]) if isinstance(audio_out["voice"], str) else config.voice
    if "turn_detection" in audio_in:
        check(
            "session.audio.input.turn_detection",
            lambda: changes.update(turn_detection=_turn_detection(config, audio_in["turn_detection"], args, problems)),
        )
    return replace(config, **changes), problems


def _noise_reduction(value: Any) -> str | None:
    """``audio.input.noise_reduction``'s type: ``"near_field"``, ``"far_field"`` or None (off).

    Raises:
        ProtocolError: a type other than those two.
    """
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("near_field", "far_field"):
        message = f"'noise_reduction.type' must be 'near_field' or 'far_field', got {kind!r}"
        raise ProtocolError("invalid_value", message, param="session.audio.input.noise_reduction.type")
    return str(kind)


#: a language code in ``transcription.language`` / ``languages`` (ISO 639-1, or 639-3 as "yue")
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")


def _transcription(config: SessionConfig, value: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The session's ``transcription`` after an update; ``language`` and ``languages`` checked."""
    param = "session.audio.input.transcription"
    language, languages = value.get("language"), value.get("languages")
    if language not in (None, "") and not (isinstance(language, str) and _LANGUAGE_CODE.fullmatch(language)):
        raise ProtocolError(
            "invalid_value",
            f"'language' must be an ISO-639-1 code such as 'fr', got {language!r}",
            param=f"{param}.language",
        )
    if languages is not None and not all(isinstance(c, str) and _LANGUAGE_CODE.fullmatch(c) for c in languages):
        raise ProtocolError(
            "invalid_value", "'languages' must be ISO-639-1 codes such as 'fr'", param=f"{param}.languages"
        )
    return {**config.transcription, **value, "model": args.stt}


def _turn_detection(
    config: SessionConfig, value: dict[str, Any] | None, args: argparse.Namespace, problems: list[ProtocolError]
) -> TurnDetection | None:
    if value is None:
        return None
    param = "session.audio.input.turn_detection"
    current = config.turn_detection or TurnDetection(
        "server_vad", args.vad_threshold, args.min_silence_ms, args.speech_pad_ms
    )
    kind = value.get("type") or "server_vad"
    flags = {k: value[k] for k in ("create_response", "interrupt_response") if value.get(k) is not None}
    if value.get("idle_timeout_ms") is not None:
        problems.append(_unsupported(f"{param}.idle_timeout_ms"))
    if kind == "semantic_vad":
        # the VAD ends the turn as configured on the server's command line; eagerness waits
        # for the end-of-turn model (see TurnDetection.eagerness)
        base = TurnDetection("semantic_vad", args.vad_threshold, args.min_silence_ms, args.speech_pad_ms)
        return replace(base, eagerness=value.get("eagerness") or "auto", **flags)
    threshold = value.get("threshold")
    if threshold is not None and not 0 < threshold < 1:
        raise ProtocolError("invalid_value", "turn_detection.threshold must be in (0, 1)", param=f"{param}.threshold")
    base = current if current.type == "server_vad" else replace(current, type="server_vad", eagerness=None)
    numbers = {
        name: value[key]
        for name, key in (
            ("threshold", "threshold"),
            ("silence_duration_ms", "silence_duration_ms"),
            ("prefix_padding_ms", "prefix_padding_ms"),
        )
        if value.get(key) is not None
    }
    return replace(base, **numbers, **flags)


def _unsupported(param: str, message: str | None = None) -> ProtocolError:
    return ProtocolError("unsupported_parameter", message or f"'{param}' is not supported by this server", param=param)
