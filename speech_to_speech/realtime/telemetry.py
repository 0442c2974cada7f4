"""Prometheus metrics of the realtime server (``GET /metrics``, or ``--metrics_port``).

Nothing here times anything: the figures come from what the pipeline already reports. Each
session's :class:`~speech_to_speech.core.events.EventBus` gets a
:class:`~speech_to_speech.pipeline.console.MetricsCollector` (the per-turn
:class:`~speech_to_speech.core.events.TurnMetrics` of local mode) and a :class:`SessionMetrics`,
which also sees every protocol event the session sends (``response.done`` and its status,
``error`` and its code). Latencies are histograms in seconds, labelled by transport
(``websocket`` or ``webrtc``):

====================================================  ==========================================
``s2s_endpoint_delay_seconds``                        end of the user's speech → endpoint decision
``s2s_stt_seconds``                                   the final transcription pass
``s2s_ttft_seconds``                                  LLM request → first token
``s2s_ttfa_seconds``                                  LLM request → first audio at the sink
``s2s_voice_to_voice_seconds``                        end of the user's speech → first audio
``s2s_llm_engine_wait_seconds``                       wait for the in-process LLM engine shared by all sessions
``s2s_sessions_active`` (gauge, transport)            sessions running now
``s2s_webrtc_calls_active`` (gauge)                   WebRTC calls running now
``s2s_sessions_refused_total`` (reason)               ``max_sessions``, ``draining``, ``origin``
``s2s_responses_total`` (transport, status)           ``response.done`` by final status
``s2s_errors_total`` (code)                           ``error`` events by code
``s2s_barge_ins_total`` (transport)                   user speech that cancelled a reply
``s2s_backchannels_total`` (transport, reason)        speech during a reply that did not interrupt it
``process_resident_memory_bytes`` and ``process_*``   the process (prometheus-client's collector, Linux)
====================================================  ==========================================

A server has its own :class:`~prometheus_client.CollectorRegistry`, so servers in one process
(tests) do not share counters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.process_collector import ProcessCollector

from speech_to_speech.core.events import BargeIn, EngineWait, Event, EventBus, ReplyResumed, TurnMetrics
from speech_to_speech.pipeline.console import MetricsCollector

logger = logging.getLogger(__name__)

#: bucket bounds of the latency histograms, s (a voice reply is judged between 0.2 and 3 s)
LATENCY_BUCKETS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
#: TurnMetrics field (ms) → histogram name (s)
_TURN_HISTOGRAMS = {
    "endpoint_delay_ms": ("s2s_endpoint_delay_seconds", "End of user speech to the endpoint decision, s"),
    "stt_ms": ("s2s_stt_seconds", "STT time of a turn's final pass, s"),
    "ttft_ms": ("s2s_ttft_seconds", "LLM request to first token, s"),
    "ttfa_ms": ("s2s_ttfa_seconds", "LLM request to first assistant audio at the sink, s"),
    "voice_to_voice_ms": ("s2s_voice_to_voice_seconds", "End of user speech to first assistant audio, s"),
}
#: the content type of :meth:`ServerMetrics.exposition`
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """Every metric of one server, in its own registry.

    Args:
        webrtc_calls: how many WebRTC calls run now (read at each scrape).
    """

    def __init__(self, webrtc_calls: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.turn_histograms = {
            field: Histogram(name, doc, ["transport"], buckets=LATENCY_BUCKETS_S, registry=r)
            for field, (name, doc) in _TURN_HISTOGRAMS.items()
        }
        self.engine_wait = Histogram(
            "s2s_llm_engine_wait_seconds",
            "Wait for the in-process LLM engine shared by all sessions, s",
            buckets=(0.001, 0.01, *LATENCY_BUCKETS_S),  # LATENCY_BUCKETS_S begins at 0.05
            registry=r,
        )
        self.sessions = Gauge("s2s_sessions_active", "Sessions running now", ["transport"], registry=r)
        self.calls = Gauge("s2s_webrtc_calls_active", "WebRTC calls running now", registry=r)
        self.calls.set_function(lambda: float(webrtc_calls()))
        self.refused = Counter("s2s_sessions_refused", "Sessions refused, by reason", ["reason"], registry=r)
        self.responses = Counter(
            "s2s_responses", "Responses by final status (response.done)", ["transport", "status"], registry=r
        )
        self.errors = Counter("s2s_errors", "error events sent to clients, by code", ["code"], registry=r)
        self.barge_ins = Counter("s2s_barge_ins", "User speech that cancelled a reply", ["transport"], registry=r)
        self.backchannels = Counter(
            "s2s_backchannels",
            "Speech during a reply that did not interrupt it, by reason",
            ["transport", "reason"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, open fds (Linux)
        self._lock = threading.Lock()

    def exposition(self) -> bytes:
        """The text a Prometheus scrape gets (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def refuse(self, reason: str) -> None:
        """Count one session refused for ``reason`` (``max_sessions``, ``draining``, ``origin``)."""
        self.refused.labels(reason).inc()

    def error(self, code: str) -> None:
        """Count one ``error`` event with ``code`` sent outside a session (e.g. a refusal)."""
        self.errors.labels(code or "unknown").inc()

    def session(self, transport: str, bus: EventBus, collect_turns: bool = True) -> SessionMetrics:
        """Start counting one session on ``transport`` (``websocket``/``webrtc``) whose events go on ``bus``.

        ``collect_turns``: put a :class:`MetricsCollector` on ``bus`` to publish each turn's
        :class:`TurnMetrics`; False when the bus has one already (a :class:`RealtimeSession`'s does:
        two would publish every turn twice).
        """
        return SessionMetrics(self, transport, bus, collect_turns)


class SessionMetrics:
    """Feeds :class:`ServerMetrics` from one session's pipeline events and protocol events.

    Counts the session as active until :meth:`close`.
    """

    def __init__(self, metrics: ServerMetrics, transport: str, bus: EventBus, collect_turns: bool = True) -> None:
        self.metrics = metrics
        self.transport = transport
        self._closed = False
        metrics.sessions.labels(transport).inc()
        if collect_turns:
            MetricsCollector(bus)  # publishes TurnMetrics on the bus at each ResponseDone
        bus.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """A pipeline event (any stage's thread)."""
        m, transport = self.metrics, self.transport
        if isinstance(event, TurnMetrics):
            for field, histogram in m.turn_histograms.items():
                value = getattr(event, field)
                if value is not None:
                    histogram.labels(transport).observe(max(value, 0.0) / 1000)
        elif isinstance(event, BargeIn):
            m.barge_ins.labels(transport).inc()
        elif isinstance(event, ReplyResumed):
            m.backchannels.labels(transport, event.reason or "unknown").inc()
        elif isinstance(event, EngineWait):
            m.engine_wait.observe(max(event.wait_ms, 0.0) / 1000)

    def on_server_event(self, event: dict[str, Any]) -> None:
        """A protocol event the session sends to its client (on the event loop)."""
        kind = event.get("type")
        if kind == "response.done":
            status = (event.get("response") or {}).get("status") or "unknown"
            self.metrics.responses.labels(self.transport, status).inc()
        elif kind == "error":
            self.metrics.error((event.get("error") or {}).get("code") or "")

    def close(self) -> None:
        """The session ended (idempotent)."""
        if not self._closed:
            self._closed = True
            self.metrics.sessions.labels(self.transport).dec()
