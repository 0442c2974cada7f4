"""History items: their shape, validation and small helpers (see :mod:`speech_to_speech.llm.chat`).

Items are plain dicts in a neutral form close to the OpenAI Responses API:

- message: ``{"id", "type": "message", "role": "user" | "assistant" | "system", "content": str | [part, ...]}``
  where a part is ``{"type": "input_text" | "output_text", "text": str}`` or
  ``{"type": "input_audio", "audio": <base64 str>, "transcript": str | None}`` or
  ``{"type": "input_image", "image_url": <data URL>, "detail": "auto" | "low" | "high"}`` (checked
  on the way in by :func:`speech_to_speech.llm.images.check_image`);
- function call: ``{"id", "type": "function_call", "call_id", "name", "arguments": <JSON string>}``;
- function call output: ``{"id", "type": "function_call_output", "call_id", "output": str}``.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

Item = dict[str, Any]

AUDIO_PLACEHOLDER = "[audio message]"
"""Text standing for an audio part without a transcript when serialising."""

EARLIER_AUDIO_PLACEHOLDER = "[earlier audio message]"
"""Text replacing an old audio part without a transcript in :meth:`Chat.compact_audio_history`."""

IMAGE_PLACEHOLDER = "[an image the user showed]"
"""Text standing for an image part when serialising for a model that reads only text."""

EARLIER_IMAGE_PLACEHOLDER = "[an image the user showed earlier]"
"""Text replacing an old image part in :meth:`Chat.compact_image_history`."""

_DETAILS = ("auto", "low", "high")
_ITEM_TYPES = ("message", "function_call", "function_call_output")
_ROLES = ("user", "assistant", "system")
_TEXT_PART_TYPES = ("input_text", "output_text")


class ChatItemError(ValueError):
    """An item that cannot be added to the history (malformed, duplicate id, or unpaired output)."""


def new_item_id() -> str:
    """A fresh item id: ``"item_"`` followed by a uuid4 in hex."""
    return "item_" + uuid.uuid4().hex


def is_user_message(item: Item) -> bool:
    """Whether ``item`` is a message from the user."""
    return item.get("type") == "message" and item.get("role") == "user"


def has_part(item: Item, kind: str) -> bool:
    """Whether ``item``'s content has a part of type ``kind`` (e.g. ``"input_image"``)."""
    content = item.get("content")
    return isinstance(content, list) and any(part.get("type") == kind for part in content)


def has_audio(item: Item) -> bool:
    """Whether ``item``'s content has an ``input_audio`` part."""
    return has_part(item, "input_audio")


def image_to_text(part: dict) -> dict:
    """An ``input_image`` part as an :data:`EARLIER_IMAGE_PLACEHOLDER` text part; others unchanged."""
    if part.get("type") != "input_image":
        return part
    return {"type": "input_text", "text": EARLIER_IMAGE_PLACEHOLDER}


def audio_to_text(part: dict) -> dict:
    """An ``input_audio`` part as an ``input_text`` part (its transcript, or a placeholder); others unchanged."""
    if part.get("type") != "input_audio":
        return part
    return {"type": "input_text", "text": part.get("transcript") or EARLIER_AUDIO_PLACEHOLDER}


def compact_parts(items: list[Item], kind: str, keep: int, to_text: Callable[[dict], dict]) -> None:
    """In place: parts of type ``kind`` stay in the newest ``keep`` user messages that have one; in
    older user messages every part goes through ``to_text``.

    Raises:
        ValueError: if ``keep`` < 0.
    """
    if keep < 0:
        raise ValueError(f"max_{kind.removeprefix('input_')}_turns must be >= 0, got {keep}")
    kept = 0
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if not (is_user_message(item) and has_part(item, kind)):
            continue
        if kept < keep:
            kept += 1
            continue
        items[index] = {**item, "content": [to_text(part) for part in item["content"]]}


def replace_text(content: str | list[dict], text: str) -> str | list[dict]:
    """``content`` with its text replaced by ``text`` (one text part; audio parts get ``text`` as transcript)."""
    if isinstance(content, str):
        return text
    parts: list[dict] = []
    placed = False
    for part in content:
        if part["type"] in _TEXT_PART_TYPES:
            if not placed:
                parts.append({"type": "input_text", "text": text})
                placed = True
        elif part["type"] == "input_audio":
            parts.append({**part, "transcript": text})
        else:
            parts.append(part)
    if not parts:
        parts.append({"type": "input_text", "text": text})
    return parts


def valid_summary(summary: object) -> bool:
    """Whether a compactor returned two non-empty strings."""
    return (
        isinstance(summary, (tuple, list))
        and len(summary) == 2
        and all(isinstance(text, str) and text.strip() for text in summary)
    )


def _require_str(item: dict, key: str, *, non_empty: bool = False) -> None:
    value = item.get(key)
    if not isinstance(value, str) or (non_empty and not value):
        raise ChatItemError(f"{item.get('type')} item needs a {'non-empty ' if non_empty else ''}string {key!r}")


def validated_copy(item: dict) -> Item:
    """A deep copy of ``item`` with an id, after checking its shape."""
    if not isinstance(item, dict):
        raise ChatItemError(f"an item must be a dict, got {type(item).__name__}")
    stored = copy.deepcopy(item)
    kind = stored.get("type")
    if kind not in _ITEM_TYPES:
        raise ChatItemError(f"unknown item type {kind!r}")
    if stored.get("id") is None:
        stored["id"] = new_item_id()
    _require_str(stored, "id", non_empty=True)
    if kind == "message":
        if stored.get("role") not in _ROLES:
            raise ChatItemError(f"unknown message role {stored.get('role')!r}")
        _validate_content(stored.get("content"))
    elif kind == "function_call":
        _require_str(stored, "call_id", non_empty=True)
        _require_str(stored, "name", non_empty=True)
        stored.setdefault("arguments", "{}")
        _require_str(stored, "arguments")
    else:
        _require_str(stored, "call_id", non_empty=True)
        _require_str(stored, "output")
    return stored


def _validate_content(content: object) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ChatItemError("message content must be a string or a list of parts")
    for part in content:
        if not isinstance(part, dict):
            raise ChatItemError("a content part must be a dict")
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES:
            if not isinstance(part.get("text"), str):
                raise ChatItemError(f"a {kind} part needs a string 'text'")
        elif kind == "input_audio":
            if not isinstance(part.get("audio"), str):
                raise ChatItemError("an input_audio part needs a base64 string 'audio'")
            if part.get("transcript") is not None and not isinstance(part["transcript"], str):
                raise ChatItemError("an input_audio 'transcript' must be a string or None")
        elif kind == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise ChatItemError("an input_image part needs a data URL string 'image_url'")
            if part.get("detail", "auto") not in _DETAILS:
                raise ChatItemError(f"an input_image 'detail' must be one of {_DETAILS}")
        else:
            raise ChatItemError(f"unknown content part type {kind!r}")
