"""The inbound side of the OpenAI Realtime protocol: validation and dispatch.

Every client event is checked before it touches the session; a malformed or
unknown event gets an ``error`` event that names the problem (and the
offending ``event_id``), and the session goes on.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speech_to_speech.realtime.session import RealtimeSession


class ProtocolError(ValueError):
    """A client event the server cannot act on.

    Attributes:
        code: machine-readable reason (e.g. ``"unknown_event"``).
        message: what a person needs to fix it.
        event_id: the offending client event's ``event_id``, when known.
    """

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id


def new_id(prefix: str) -> str:
    """A unique id such as ``resp_1f2e…`` (prefix + 20 hex digits)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def error_event(
    code: str, message: str, event_id: str | None = None, kind: str = "invalid_request_error"
) -> dict[str, Any]:
    """An ``error`` server event."""
    return {
        "type": "error",
        "error": {"type": kind, "code": code, "message": message, "param": None, "event_id": event_id},
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


def dispatch(session: RealtimeSession, event: dict[str, Any]) -> None:
    """Apply one parsed client event to ``session``.

    Raises:
        ProtocolError: unknown event type or invalid fields.
    """
    kind = event["type"]
    if kind == "session.update":
        session.update_session(event.get("session"))
    elif kind == "input_audio_buffer.append":
        session.append_audio(event.get("audio"))
    elif kind == "input_audio_buffer.commit":
        session.commit_audio()
    elif kind == "input_audio_buffer.clear":
        session.clear_audio()
    elif kind == "conversation.item.create":
        session.create_item(event.get("item"))
    elif kind == "conversation.item.truncate":
        session.truncate(event.get("item_id"), event.get("audio_end_ms"))
    elif kind == "response.create":
        session.create_response(event.get("response"))
    elif kind == "response.cancel":
        session.cancel_response()
    else:
        raise ProtocolError("unknown_event", f"unsupported client event type {kind!r}")
