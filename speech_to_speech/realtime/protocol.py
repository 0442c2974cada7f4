"""The OpenAI Realtime protocol's events: decoding, validation errors, ids and error events.

Every client event is checked before it touches the session; a malformed or
unknown event gets an ``error`` event that names the problem (and the
offending ``event_id``), and the session goes on. This module imports nothing
of the session.
"""

from __future__ import annotations

import json
import uuid
from typing import Any


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
    """An ``error`` server event."""
    return {
        "type": "error",
        "error": {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id},
    }


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
