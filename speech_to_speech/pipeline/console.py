"""Presentation: per-turn metrics, console output and the JSON Lines transcript."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from speech_to_speech.core.events import (
    AssistantText,
    BargeIn,
    Event,
    EventBus,
    FirstAudio,
    FirstToken,
    ReplyResumed,
    ResponseDone,
    ResponseStarted,
    SpeechStopped,
    StageError,
    TurnMetrics,
    UserTranscript,
    UserTranscriptDelta,
)

#: how :class:`ConsoleReporter` names the reasons of :class:`ReplyResumed`
_RESUME_REASONS = {
    "backchannel": "backchannel",
    "false_start": "false start",
    "echo": "its own echo",
    "no_words": "no words",
    "too_short": "too short",
}


@dataclass
class _TurnTimes:
    speech_end: float | None = None
    endpoint_delay_ms: float | None = None
    endpoint_by: str | None = None
    stt_ms: float | None = None
    request: float | None = None
    ttft_ms: float | None = None
    first_audio: float | None = None
    voice: str | None = None


#: the events :class:`MetricsCollector` times a turn by
_TIMED = (SpeechStopped, ReplyResumed, UserTranscript, ResponseStarted, FirstToken, FirstAudio, ResponseDone)


class MetricsCollector:
    """Turns timing events into one :class:`TurnMetrics` per finished response.

    Publishes the metrics on the same bus and keeps them in :attr:`turns`. A turn that
    got no response (a backchannel during a reply, :class:`ReplyResumed`) is forgotten.
    """

    def __init__(self, bus: EventBus, keep_last: int | None = None) -> None:
        self.bus = bus
        self.keep_last = keep_last
        self.turns: list[TurnMetrics] = []
        self._times: dict[int, _TurnTimes] = {}
        self._lock = threading.Lock()
        bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Record ``event``; on :class:`ResponseDone` publish the turn's metrics."""
        if not isinstance(event, _TIMED):
            return  # (its own TurnMetrics, among others: no empty times left behind for a finished turn)
        with self._lock:
            times = self._times.setdefault(event.turn_id, _TurnTimes())
            if isinstance(event, SpeechStopped):
                times.endpoint_delay_ms = event.endpoint_delay_ms
                times.endpoint_by = event.endpoint_by
            elif isinstance(event, ReplyResumed):
                self._times.pop(event.turn_id, None)
                return
            elif isinstance(event, UserTranscript):
                times.stt_ms = event.stt_ms
            elif isinstance(event, ResponseStarted):
                times.request = event.time
                times.speech_end = event.speech_end_time
            elif isinstance(event, FirstToken):
                times.ttft_ms = event.ttft_ms
            elif isinstance(event, FirstAudio):
                times.first_audio = event.time
                if event.engine:
                    times.voice = " ".join(filter(None, (event.engine, event.language)))
            elif isinstance(event, ResponseDone):
                metrics = self._metrics(event.turn_id, self._times.pop(event.turn_id))
                self.turns.append(metrics)
                if self.keep_last is not None:
                    del self.turns[: -self.keep_last or None]
            else:
                return
        if isinstance(event, ResponseDone):
            self.bus.publish(metrics)

    def metrics_of(self, turn_id: int) -> TurnMetrics | None:
        """Turn ``turn_id``'s latencies so far (while its response plays) or when it finished; None if unknown."""
        with self._lock:
            times = self._times.get(turn_id)
            if times is not None:
                return self._metrics(turn_id, times)
            return next((m for m in reversed(self.turns) if m.turn_id == turn_id), None)

    @staticmethod
    def _metrics(turn_id: int, t: _TurnTimes) -> TurnMetrics:
        def ms(end: float | None, start: float | None) -> float | None:
            return None if end is None or start is None else (end - start) * 1000

        return TurnMetrics(
            turn_id,
            stt_ms=t.stt_ms,
            ttft_ms=t.ttft_ms,
            ttfa_ms=ms(t.first_audio, t.request),
            voice_to_voice_ms=ms(t.first_audio, t.speech_end) if t.stt_ms is not None else None,
            endpoint_delay_ms=t.endpoint_delay_ms,
            endpoint_by=t.endpoint_by,
            voice=t.voice,
        )


#: :func:`latency_metadata`'s keys → the :class:`TurnMetrics` field each carries
LATENCY_KEYS = {
    "s2s_endpoint_ms": "endpoint_delay_ms",
    "s2s_stt_ms": "stt_ms",
    "s2s_ttft_ms": "ttft_ms",
    "s2s_ttfa_ms": "ttfa_ms",
    "s2s_voice_to_voice_ms": "voice_to_voice_ms",
}


def latency_metadata(metrics: TurnMetrics | None) -> dict[str, str]:
    """A turn's latencies as string metadata (``response.done``'s ``response.metadata``).

    Whole milliseconds under :data:`LATENCY_KEYS` (a stage that did not run is left out, e.g. STT
    for a typed turn) and ``s2s_endpoint_by``, what ended the user's turn.
    """
    if metrics is None:
        return {}
    values = {key: getattr(metrics, name) for key, name in LATENCY_KEYS.items()}
    out = {key: str(round(value)) for key, value in values.items() if value is not None}
    if metrics.endpoint_by:
        out["s2s_endpoint_by"] = metrics.endpoint_by
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


class ConsoleReporter:
    """Prints user transcripts, replies and per-turn latencies.

    Partial transcripts (while the user speaks) rewrite one line on a terminal and
    are printed as lines otherwise. The metrics line ends with the endpoint delay and
    what ended the turn (``model``: the end-of-turn model; ``silence``: the silence
    bound). Speech during a reply that did not interrupt it gets its own line.

    Args:
        stream: where to print (default stdout).
    """

    def __init__(self, bus: EventBus, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self._tty = self.stream.isatty()
        self._partial_shown = False  # a partial line is on the terminal, without its newline
        # events come from every stage's thread: one line is one write, under this lock (print()
        # writes the text and its newline separately, so two threads' lines could interleave)
        self._lock = threading.Lock()
        bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Print the events a person wants to see."""
        line = None
        if isinstance(event, UserTranscriptDelta):
            partial = f"[turn {event.turn_id}] user (partial): {event.text}"
            with self._lock:
                clear = "\r\033[K" if self._partial_shown else ""
                self.stream.write(clear + partial + ("" if self._tty else "\n"))
                self.stream.flush()
                self._partial_shown = self._tty
        elif isinstance(event, UserTranscript):
            line = f"[turn {event.turn_id}] user: {event.text}"
        elif isinstance(event, AssistantText):
            if event.error and not event.text.strip():
                line = f"[turn {event.turn_id}] assistant error: {event.error}"
            else:
                line = f"[turn {event.turn_id}] assistant: {event.text}" + (
                    f"  (error: {event.error})" if event.error else ""
                )
        elif isinstance(event, TurnMetrics):
            line = (
                f"[turn {event.turn_id}] STT {_fmt(event.stt_ms)} | TTFT {_fmt(event.ttft_ms)} | "
                f"TTFA {_fmt(event.ttfa_ms)} | voice-to-voice {_fmt(event.voice_to_voice_ms)}"
            )
            if event.endpoint_delay_ms is not None:
                line += f" | endpoint {_fmt(event.endpoint_delay_ms)} ({event.endpoint_by or 'silence'})"
            if event.voice:
                line += f" | voice {event.voice}"
        elif isinstance(event, ReplyResumed):
            said = f" {event.text!r}" if event.text else ""
            line = (
                f"[turn {event.turn_id}] {_RESUME_REASONS.get(event.reason, event.reason)}{said}: not answered, "
                f"the reply goes on (paused {_fmt(event.paused_ms)})"
            )
        elif isinstance(event, StageError):
            line = f"[turn {event.turn_id}] {event.stage} error: {event.message}"
        if line is not None:
            with self._lock:
                clear = "\r\033[K" if self._partial_shown else ""
                self.stream.write(clear + line + "\n")
                self.stream.flush()
                self._partial_shown = False

    def no_speech(self, path: str | Path) -> None:
        """Say that the voice activity detector found no speech in the input file ``path``."""
        print(f"no speech detected in {path}: nothing to answer", file=self.stream, flush=True)


class LoadProgress:
    """Start-up lines: what each stage loads, each stage as it becomes ready, then the total.

    Times are wall-clock seconds since this object was made (the program's start,
    imports included), since that is what a person waits.

    Args:
        stream: where to print (default stdout).
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.started = time.monotonic()

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def elapsed_s(self) -> float:
        """Seconds since start."""
        return time.monotonic() - self.started

    def loading(self, stages: list[tuple[str, str, str]]) -> None:
        """Announce the loading of ``stages``: (stage, backend name, what it loads) each."""
        self._print("loading models (the first run also unpacks them; this can take a minute):")
        width = max((len(name) for _, name, _ in stages), default=0)
        for stage, name, what in stages:
            self._print(f"  {stage} {name:<{width}}  {what}".rstrip())

    def stage_ready(self, name: str, load_seconds: float) -> None:
        """A stage (e.g. ``"stt:faster-whisper"``) finished loading after ``load_seconds`` of setup.

        Only model stages (vad, stt, llm, tts) are shown.
        """
        if name.partition(":")[0] in ("vad", "stt", "llm", "tts"):
            self._print(f"  {name} ready ({self.elapsed_s():.1f} s)")

    def ready(self) -> None:
        """Every stage is ready; input starts now."""
        self._print(f"ready in {self.elapsed_s():.1f} s")


class TranscriptWriter:
    """Writes events as JSON Lines: one object per line with an ``event`` key.

    Recorded kinds: speech_stopped (with ``endpoint_delay_ms`` and ``endpoint_by``),
    user_transcript, assistant_text, turn_metrics (the same two fields), reply_resumed
    and barge_in (speech during a reply: resumed, or a real interruption), stage_error.
    Times are ``time.monotonic()`` seconds.

    Args:
        path: the output file (created or truncated).
    """

    KINDS = (SpeechStopped, UserTranscript, AssistantText, TurnMetrics, ReplyResumed, BargeIn, StageError)

    def __init__(self, bus: EventBus, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Append ``event`` if it is one of :attr:`KINDS`."""
        if isinstance(event, self.KINDS):
            with self._lock:
                if not self._file.closed:
                    self._file.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
                    self._file.flush()

    def close(self) -> None:
        """Close the file; later events are ignored."""
        with self._lock:
            self._file.close()


@dataclass
class RunSummary:
    """What a finished run reports (used by the entry point and benchmarks).

    Attributes:
        turns: one entry per finished response.
        load_seconds: setup (model load) seconds per stage name.
        speech_detected: for an input file fed to its end, whether the VAD found any
            speech; None for other runs (typed turns, microphone, stopped early).
    """

    turns: list[TurnMetrics] = field(default_factory=list)
    load_seconds: dict[str, float] = field(default_factory=dict)
    speech_detected: bool | None = None
