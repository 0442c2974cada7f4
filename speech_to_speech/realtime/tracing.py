"""OpenTelemetry traces of the realtime server: opt in, free when off.

On with ``--otel true`` or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) environment variable; spans then go by OTLP/HTTP
(protobuf) to that endpoint (default ``http://localhost:4318``), named by ``OTEL_SERVICE_NAME``
(default ``speech-to-speech``). The ``opentelemetry`` packages (the ``otel`` extra) are imported
only then: when tracing is off, :func:`tracing_from_args` returns None and no session subscribes
anything.

The spans are those Pipecat users chart, built from the events the pipeline already publishes
(nothing here times anything). A turn's spans are made when its response ends, with the times the
events carried, so a turn that never got a reply (a backchannel, noise) leaves no span::

    conversation                 one per session (session.id, s2s.transport)
    └── turn                     user speech start (or the request) → response done
        │                        turn.number, turn.was_interrupted, turn.user_bot_latency_seconds
        ├── stt                  the final transcription pass
        ├── llm                  request → the LLM's last output; metrics.ttfb (first token, s),
        │                        gen_ai.usage.input_tokens, gen_ai.usage.output_tokens
        └── tts                  first token → last audio delivered; metrics.ttfb (first token → first audio, s)
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from speech_to_speech.core.events import (
    AssistantText,
    EmptyTranscript,
    Event,
    EventBus,
    FirstAudio,
    FirstToken,
    ReplyResumed,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SpeechDiscarded,
    SpeechStarted,
    TurnMetrics,
    UserTranscript,
)

#: the environment variables that turn tracing on (the OTLP exporter reads them too)
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
#: the instrumentation scope of the spans
TRACER_NAME = "speech_to_speech.realtime"


def tracing_wanted(args: argparse.Namespace) -> bool:
    """``--otel true``, or an OTLP endpoint in the environment."""
    return bool(getattr(args, "otel", False)) or any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def tracing_from_args(args: argparse.Namespace) -> Tracing | None:
    """The server's tracing, or None when it is off (then nothing of OpenTelemetry is imported).

    Raises:
        RuntimeError: tracing is asked for but the ``otel`` extra is not installed (one line).
    """
    if not tracing_wanted(args):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(
            f"tracing (--otel or $OTEL_EXPORTER_OTLP_ENDPOINT) needs the otel extra: "
            f"pip install 'speech-to-speech[otel]' ({exc})"
        ) from None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "speech-to-speech"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider)


class Tracing:
    """Makes the spans of every session through ``provider`` (an SDK ``TracerProvider``).

    Args:
        provider: where spans go; tests give one with an in-memory exporter.
    """

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)

    def session(self, session_id: str, transport: str, bus: EventBus) -> SessionTrace:
        """Open the ``conversation`` span of one session and follow its events on ``bus``."""
        return SessionTrace(self.tracer, session_id, transport, bus)

    def shutdown(self) -> None:
        """Export what is pending and stop (at the server's exit)."""
        self.provider.shutdown()


def _epoch_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` time as OpenTelemetry's nanoseconds since the epoch."""
    return time.time_ns() - time.monotonic_ns() + round(monotonic_s * 1e9)


@dataclass
class _Turn:
    """What one turn's events said so far (monotonic s, or None)."""

    start: float | None = None
    speech_end: float | None = None
    stt: tuple[float, float] | None = None
    request: float | None = None
    first_token: float | None = None
    ttft_s: float | None = None
    llm_end: float | None = None
    llm_error: str | None = None
    first_audio: float | None = None
    interrupted: bool = False
    latency_s: float | None = None


class SessionTrace:
    """The spans of one session (see the module's docstring). Thread-safe: events come from the
    stages' threads."""

    def __init__(self, tracer: Any, session_id: str, transport: str, bus: EventBus) -> None:
        from opentelemetry import trace  # the caller made a tracer, so the package is there

        self._trace = trace
        self.tracer = tracer
        self.span = tracer.start_span(
            "conversation",
            attributes={"session.id": session_id, "conversation.id": session_id, "s2s.transport": transport},
        )
        self._turns: dict[int, _Turn] = {}
        self._number = 0
        self._lock = threading.Lock()
        self._closed = False
        bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Record ``event``; a turn's spans are made at its :class:`ResponseDone`."""
        with self._lock:
            if self._closed or event.turn_id == 0:
                return
            if isinstance(event, (ReplyResumed, EmptyTranscript, SpeechDiscarded)):
                self._turns.pop(event.turn_id, None)  # no reply to it: no turn span
                return
            turn = self._turns.setdefault(event.turn_id, _Turn())
            if isinstance(event, SpeechStarted):
                turn.start = turn.start if turn.start is not None else event.time
            elif isinstance(event, UserTranscript) and event.stt_ms is not None:
                turn.stt = (event.time - event.stt_ms / 1000, event.time)
            elif isinstance(event, ResponseStarted):
                turn.request, turn.speech_end = event.time, event.speech_end_time
            elif isinstance(event, FirstToken):
                turn.first_token, turn.ttft_s = event.time, event.ttft_ms / 1000
            elif isinstance(event, AssistantText):
                turn.llm_end, turn.llm_error = event.time, event.error
            elif isinstance(event, FirstAudio):
                turn.first_audio = event.time
            elif isinstance(event, ResponseInterrupted):
                turn.interrupted = True
            elif isinstance(event, TurnMetrics) and event.voice_to_voice_ms is not None:
                turn.latency_s = event.voice_to_voice_ms / 1000
            elif isinstance(event, ResponseDone):
                self._turns.pop(event.turn_id, None)
                if turn.request is not None:
                    self._number += 1
                    self._finish(turn, event, self._number)

    def _finish(self, t: _Turn, done: ResponseDone, number: int) -> None:
        # the user's speech start; no later than its end (audio sent faster than real time is
        # endpointed on its own timeline) nor than the request (a typed turn starts there)
        assert t.request is not None
        start = min(x for x in (t.start, t.speech_end, t.request) if x is not None)
        attributes: dict[str, Any] = {"turn.number": number, "turn.was_interrupted": t.interrupted}
        if t.latency_s is not None:
            attributes["turn.user_bot_latency_seconds"] = t.latency_s
        parent = self._trace.set_span_in_context(self.span)
        span = self.tracer.start_span("turn", context=parent, start_time=_epoch_ns(start), attributes=attributes)
        inside = self._trace.set_span_in_context(span)

        def child(name: str, begin: float, end: float, **attrs: Any) -> Any:
            step = self.tracer.start_span(name, context=inside, start_time=_epoch_ns(begin), attributes=attrs)
            step.end(end_time=_epoch_ns(max(end, begin)))
            return step

        if t.stt is not None:
            child("stt", *t.stt)
        llm: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        if t.ttft_s is not None:
            llm["metrics.ttfb"] = t.ttft_s
        for key in ("input_tokens", "output_tokens"):
            if key in done.usage:
                llm[f"gen_ai.usage.{key}"] = int(done.usage[key])
        llm_span = self.tracer.start_span("llm", context=inside, start_time=_epoch_ns(t.request), attributes=llm)
        error = t.llm_error or done.error
        if error and error != "cancelled":
            llm_span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
        llm_span.end(end_time=_epoch_ns(max(t.llm_end or done.time, t.request)))
        if t.first_token is not None and t.first_audio is not None:
            child("tts", t.first_token, done.time, **{"metrics.ttfb": max(t.first_audio - t.first_token, 0.0)})
        span.end(end_time=_epoch_ns(max(done.time, start)))

    def close(self) -> None:
        """End the session's span (idempotent); turns without a reply leave none."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._turns.clear()
            self.span.set_attribute("conversation.turns", self._number)
        self.span.end()
