"""The terminal client's console (conversation lines, streamed assistant text) and its
``--transcript`` log (received server events as JSON Lines, audio payloads replaced by sizes)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


class Console:
    """Prints conversation lines; assistant text is streamed on one line per (item, part)."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self._out: TextIO | None = out
        self._open: object | None = None  # key of the line being streamed
        self._streamed: set[object] = set()

    def _write(self, text: str) -> None:
        if self._out is None:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except (BrokenPipeError, ValueError):  # stdout closed (e.g. piped into head): stay quiet
            self._out = None

    def _close_open(self) -> None:
        if self._open is not None:
            self._write("\n")
            self._open = None

    def line(self, text: str) -> None:
        """Print a whole line (ending any streamed line first)."""
        self._close_open()
        self._write(text + "\n")

    def stream(self, key: object, label: str, text: str) -> None:
        """Append streamed ``text`` to the line of ``key`` (reopened with ``label …`` if broken)."""
        if self._open != key:
            self._close_open()
            self._write(f"{label}: " if key not in self._streamed else f"{label} …: ")
            self._open = key
            self._streamed.add(key)
        self._write(text)

    def finish(self, key: object, label: str, full_text: str | None) -> None:
        """End the streamed line of ``key``; print ``full_text`` if nothing was streamed."""
        if key in self._streamed:
            if self._open == key:
                self._close_open()
        elif full_text:
            self.line(f"{label}: {full_text}")
            self._streamed.add(key)


def strip_audio(value: Any, audio_delta: bool = False) -> Any:
    """Copy of an event with base64 audio replaced by ``"<N bytes>"`` (keys ``audio`` / audio ``delta``)."""
    if isinstance(value, dict):
        out = {}
        for key, sub in value.items():
            if isinstance(sub, str) and (key == "audio" or (audio_delta and key == "delta")):
                out[key] = f"<{len(sub) * 3 // 4 - sub.count('=')} bytes>"
            else:
                out[key] = strip_audio(sub)
        return out
    if isinstance(value, list):
        return [strip_audio(sub) for sub in value]
    return value


class TranscriptLog:
    """JSON Lines of received server events (``t`` = seconds since connecting), audio stripped."""

    def __init__(self, path: str | None, t0: float) -> None:
        self._file = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115
        self._t0 = t0

    def write(self, event: dict[str, Any]) -> None:
        """Append one event."""
        if self._file is None:
            return
        record = {"t": round(time.monotonic() - self._t0, 3)}
        record.update(strip_audio(event, audio_delta=event.get("type") == "response.output_audio.delta"))
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
