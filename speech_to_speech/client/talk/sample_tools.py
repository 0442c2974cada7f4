"""Example ``--tool-module`` for ``s2s-talk``: the time in a timezone, and adding two numbers.

Use it with::

    s2s-talk --text "What time is it in Tokyo?" --tool-module speech_to_speech.client.talk.sample_tools

A tool module exports ``TOOLS`` (flat Realtime function tools: ``type``, ``name``,
``description``, ``parameters`` as JSON Schema) and ``async def execute_tool(name, arguments)``,
whose result (a string, or anything JSON-serializable) becomes the ``function_call_output``.
Errors the model should see are returned as ``{"error": "..."}``; s2s-talk turns exceptions into
the same shape. Nothing here touches the network.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_time",
        "description": "The current date and time in an IANA timezone (for example 'Europe/Paris').",
        "parameters": {
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "IANA timezone name such as 'America/New_York'; defaults to UTC.",
                    "default": "UTC",
                }
            },
            "required": [],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "add",
        "description": "Add two numbers and return their sum.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number", "description": "First addend."},
                "b": {"type": "number", "description": "Second addend."},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
]


def get_time(timezone: str = "UTC") -> dict[str, Any]:
    """The current local time in ``timezone`` (IANA name); an ``{"error": ...}`` dict if it is unknown."""
    if not isinstance(timezone, str) or not timezone.strip():
        return {"error": "timezone must be a non-empty IANA timezone name such as 'Europe/Paris'"}
    name = timezone.strip()
    try:
        zone: dt.tzinfo = dt.UTC if name.upper() == "UTC" else ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):  # ValueError: malformed keys such as '../etc'
        return {"error": f"unknown timezone: {name!r}"}
    now = dt.datetime.now(zone)
    return {
        "timezone": "UTC" if zone is dt.UTC else name,
        "iso": now.isoformat(timespec="seconds"),
        "time": now.strftime("%H:%M"),
        "date": now.strftime("%A %d %B %Y"),
        "utc_offset": now.strftime("%z"),
    }


def _number(value: Any, label: str) -> float | int:
    """``value`` when it is a finite int or float (not a bool); raises ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{label} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{label} must be finite")
    return value


def add(a: float, b: float) -> dict[str, Any]:
    """The sum of ``a`` and ``b`` (an ``{"error": ...}`` dict when either is not a finite number)."""
    try:
        return {"sum": _number(a, "a") + _number(b, "b")}
    except ValueError as exc:
        return {"error": str(exc)}


_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {"get_time": get_time, "add": add}


async def execute_tool(name: str, arguments: dict[str, Any]) -> Any:
    """Run tool ``name`` with the decoded JSON ``arguments``; unknown tools or arguments give an error dict."""
    function = _FUNCTIONS.get(name)
    if function is None:
        return {"error": f"unknown tool: {name!r}"}
    try:
        return function(**arguments)
    except TypeError as exc:  # missing or unexpected arguments
        return {"error": f"bad arguments for {name}: {exc}"}
