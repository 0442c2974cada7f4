"""The OpenAI Realtime protocol's events: decoding, validation errors, ids and error events.

Every client event is checked before it touches the session; a malformed or
unknown event gets an ``error`` event that names the problem (and the
offending ``event_id``), and the session goes on. This module imports nothing
of the session.
"""

from __future__ import annotations

import json
import typing
import uuid
from typing import Any

import pydantic
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent


class ProtocolError(ValueError):
    """A client event the server cannot act on.

    Attributes:
        code: machine-readable reason (e.g. ``"unknown_event"``).
        message: what a person needs to fix it.
        event_id: the offending client event's ``event_id``, when known.
        param: the offending field, when one is to blame.
    """

    def __init__(self, code: str, message: str, event_id: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.param = param


def new_id(prefix: str) -> str:
    """A unique id such as ``resp_1f2e…`` (prefix + 20 hex digits)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def error_event(
    code: str,
    message: str,
    event_id: str | None = None,
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> dict[str, Any]:
    """An ``error`` server event (``event_id`` echoes the offending client event's)."""
    error = {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id}
    return server_event("error", error=error)


def protocol_error_event(exc: ProtocolError) -> dict[str, Any]:
    """The ``error`` event that reports ``exc``."""
    return error_event(exc.code, exc.message, exc.event_id, param=exc.param)


def _models_by_type(union: Any) -> dict[str, type[pydantic.BaseModel]]:
    """The SDK's model class for each event type of a (discriminated) event union."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


#: the openai SDK's model for each client event type (all 11 of the GA protocol)
CLIENT_EVENT_MODELS = _models_by_type(RealtimeClientEvent)
#: the openai SDK's model for each server event type
SERVER_EVENT_MODELS = _models_by_type(RealtimeServerEvent)


def parse_client_event(raw: str | bytes) -> pydantic.BaseModel:
    """Decode one client message and validate it with the SDK's model for its type.

    A ``session`` without a ``type`` is a realtime session, and a ``turn_detection``
    without one is ``server_vad`` (as older clients send them).

    Raises:
        ProtocolError: not JSON, not an object, no string ``type``, an unknown type
            (``unknown_event``) or a field of the wrong shape (``invalid_value``, with
            ``param`` naming it); ``event_id`` is the event's when it has one.
    """
    event = parse_event(raw)
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    model = CLIENT_EVENT_MODELS.get(event["type"])
    if model is None:
        raise ProtocolError("unknown_event", f"unsupported client event type {event['type']!r}", event_id)
    _fill_defaults(event)
    try:
        return model.model_validate(event)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"] if not _is_union_tag(part))
        message = f"{event['type']}: '{param}': {first['msg']}"
        raise ProtocolError("invalid_value", message, event_id, param=param or None) from None


def _is_union_tag(part: Any) -> bool:
    """A pydantic location part that names a union member (``RealtimeSessionCreateRequest``), not a field."""
    return isinstance(part, str) and (part[:1].isupper() or part.startswith("function-"))


def _fill_defaults(event: dict[str, Any]) -> None:
    session = event.get("session")
    if event["type"] == "session.update" and isinstance(session, dict):
        session.setdefault("type", "realtime")
        audio = session.get("audio")
        audio_in = audio.get("input") if isinstance(audio, dict) else None
        turn = audio_in.get("turn_detection") if isinstance(audio_in, dict) else None
        if isinstance(turn, dict):
            turn.setdefault("type", "server_vad")


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event of type ``kind``, built and checked with the SDK's model for it.

    Returns:
        The event as sent (the fields given, an ``event_id`` and the type), JSON-ready.

    Raises:
        pydantic.ValidationError: the fields do not make a valid event (a bug).
    """
    event = SERVER_EVENT_MODELS[kind].model_validate({"type": kind, "event_id": new_id("event"), **fields})
    return event.model_dump(mode="json", exclude_unset=True)


def parse_event(raw: str | bytes) -> dict[str, Any]:
    """Decode one client message.

    Raises:
        ProtocolError: not UTF-8 JSON, not an object, or no string ``type``.
    """
    try:
        event = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("invalid_json", f"message is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "a client event must be a JSON object")
    if not isinstance(event.get("type"), str):
        event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        raise ProtocolError("invalid_event", "a client event needs a string 'type'", event_id)
    return event


def check_tools(tools: Any, tool_choice: Any) -> None:
    """Validate ``tools`` and ``tool_choice`` of a session or a response.

    Raises:
        ProtocolError: tools not a list of named function tools; ``tool_choice`` not
            "auto"/"none"/"required" (the object form is ``tool_choice_not_supported``).
    """
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str) for t in tools
    ):
        raise ProtocolError("invalid_value", "'tools' must be a list of function tools with a name")
    if isinstance(tool_choice, dict):
        raise ProtocolError("tool_choice_not_supported", "tool_choice must be 'auto', 'none' or 'required'")
    if tool_choice not in ("auto", "none", "required"):
        raise ProtocolError("invalid_value", "tool_choice must be 'auto', 'none' or 'required'")
