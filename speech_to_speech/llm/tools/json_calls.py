"""Finding the JSON tool calls that chat-template models write (Qwen, Hermes-style templates).

A model prompted through its own chat template with ``tools`` is told to answer
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Small models often
write the same object without the tags: bare, or in a Markdown code fence
(measured with Qwen2.5-Coder-0.5B-Instruct: bare JSON or a ```` ```json ```` block,
never the tags). :class:`JsonCallExtractor` accepts all three forms from a
stream and splits it into ordered ``("text", s)`` and ``("json", payload)`` parts;
:func:`parse_json_calls` turns a payload into ``(name, arguments)`` pairs.
Validation against the session's tools is shared with the ``<code>`` path
(:func:`speech_to_speech.llm.tools.parse.extract_calls`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["JsonCallExtractor", "parse_json_calls"]

TAG_OPEN = "<tool_call>"
TAG_CLOSE = "</tool_call>"
FENCE = "```"
#: what can open a call: the tag, a code fence, or a bare JSON object
OPENERS = (TAG_OPEN, FENCE, "{")


def _held_prefix(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of an opener."""
    best = 0
    for opener in OPENERS:
        for length in range(min(len(text), len(opener) - 1), 0, -1):
            if text.endswith(opener[:length]):
                best = max(best, length)
                break
    return best


def _object_end(text: str, start: int) -> int:
    """Index just past the JSON object that opens at ``text[start] == "{"``, or -1 if unclosed."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return -1


class JsonCallExtractor:
    """Splits a streamed reply into text and JSON tool-call candidates.

    Feed deltas in order, then :meth:`flush` once. Text is released as soon as it
    cannot be the start of a call: only a suffix that could begin ``<tool_call>``,
    a code fence or ``{`` is held back. A candidate ends at ``</tool_call>``, at the
    closing fence, or where a bare object's braces balance (strings and escapes
    respected); it is returned as ``("json", payload)`` with the tags or fence
    removed. The end of the stream closes an open candidate. Not thread-safe; one
    instance per response.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._opener: str | None = None

    def feed(self, delta: str) -> list[tuple[str, str]]:
        """Add the next piece of the stream; return the parts it settles (possibly none)."""
        self._buffer += delta
        parts: list[tuple[str, str]] = []
        while True:
            if self._opener is None:
                found = [(self._buffer.find(o), o) for o in OPENERS if o in self._buffer]
                if not found:
                    hold = _held_prefix(self._buffer)
                    released = self._buffer[: len(self._buffer) - hold]
                    if released:
                        parts.append(("text", released))
                    self._buffer = self._buffer[len(self._buffer) - hold :]
                    return parts
                start, opener = min(found)
                if start:
                    parts.append(("text", self._buffer[:start]))
                self._buffer = self._buffer[start:]
                self._opener = opener
            payload, rest = self._close()
            if payload is None:
                return parts
            parts.append(("json", payload))
            self._buffer, self._opener = rest, None

    def _close(self) -> tuple[str | None, str]:
        """``(payload, rest)`` if the open candidate is complete, else ``(None, "")``."""
        buffer = self._buffer
        if self._opener == TAG_OPEN:
            end = buffer.find(TAG_CLOSE, len(TAG_OPEN))
            return (None, "") if end < 0 else (buffer[len(TAG_OPEN) : end], buffer[end + len(TAG_CLOSE) :])
        if self._opener == FENCE:
            end = buffer.find(FENCE, len(FENCE))
            if end < 0:
                return None, ""
            body = buffer[len(FENCE) : end]
            newline = body.find("\n")  # drop the info string ("json") of the fence
            if newline >= 0 and "{" not in body[:newline]:
                body = body[newline + 1 :]
            return body, buffer[end + len(FENCE) :]
        end = _object_end(buffer, 0)
        return (None, "") if end < 0 else (buffer[:end], buffer[end:])

    def flush(self) -> list[tuple[str, str]]:
        """End of stream: an open candidate becomes a ``json`` part; held text is released."""
        rest, opener = self._buffer, self._opener
        self._buffer, self._opener = "", None
        if opener is None:
            return [("text", rest)] if rest else []
        body = rest[len(opener) :] if opener != "{" else rest
        if opener == FENCE and "\n" in body:
            head, _, tail = body.partition("\n")
            body = tail if "{" not in head else body
        return [("json", body)]


def parse_json_calls(payload: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[(name, arguments), ...]`` from a candidate, or None if it is not a tool call.

    Accepts one object or a list of objects, each ``{"name": str, "arguments": obj}``
    (``"parameters"`` is taken for ``"arguments"``; arguments given as a JSON string
    are decoded). Never raises.
    """
    try:
        value = json.loads(payload.strip())
    except (json.JSONDecodeError, ValueError):
        return None
    objects = value if isinstance(value, list) else [value]
    calls: list[tuple[str, dict[str, Any]]] = []
    for obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append((obj["name"], arguments))
    return calls
