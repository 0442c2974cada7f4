"""Metrics and traces of the realtime server, fed by a session's events (no models, no server).

A scripted sequence of pipeline events, as a session's stages publish them, goes on an
:class:`EventBus`; the Prometheus figures (:mod:`speech_to_speech.realtime.telemetry`) and the
OpenTelemetry spans (:mod:`speech_to_speech.realtime.tracing`, in memory and over OTLP/HTTP to a
receiver started here) must say what those events said.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from speech_to_speech.core.events import (
    AssistantText,
    BargeIn,
    EngineWait,
    EventBus,
    FirstAudio,
    FirstToken,
    ReplyResumed,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)
from speech_to_speech.realtime.telemetry import ServerMetrics
from speech_to_speech.realtime.tracing import Tracing, tracing_from_args, tracing_wanted
from tests.otlp_receiver import OTLPReceiver

T0 = 1000.0  # a monotonic time, s


def conversation(bus: EventBus) -> None:
    """Publish three turns: a spoken one, a backchannel during its reply, a typed one that is interrupted.

    Turn 1: speech ends at T0+1.0, endpoint 200 ms later, STT 150 ms, LLM request at T0+1.36,
    first token 100 ms later, first audio at T0+1.7 (TTFA 340 ms, voice-to-voice 700 ms).
    """
    bus.publish(SpeechStarted(1, time=T0))
    bus.publish(SpeechStopped(1, endpoint_delay_ms=200.0, duration_ms=1000.0, time=T0 + 1.2))
    bus.publish(UserTranscript(1, text="hello there", stt_ms=150.0, time=T0 + 1.35))
    bus.publish(ResponseStarted(1, speech_end_time=T0 + 1.0, time=T0 + 1.36))
    bus.publish(FirstToken(1, ttft_ms=100.0, time=T0 + 1.46))
    bus.publish(EngineWait(0, wait_ms=30.0, time=T0 + 1.4))
    bus.publish(FirstAudio(1, time=T0 + 1.7))
    bus.publish(SpeechStarted(2, pauses_reply=True, time=T0 + 2.0))
    bus.publish(ReplyResumed(2, reason="backchannel", text="yeah", time=T0 + 2.5))
    bus.publish(AssistantText(1, text="Hi! How can I help?", time=T0 + 1.8))
    bus.publish(
        ResponseDone(1, text="Hi! How can I help?", usage={"input_tokens": 21, "output_tokens": 9}, time=T0 + 3)
    )
    bus.publish(ResponseStarted(3, time=T0 + 4.0))
    bus.publish(FirstToken(3, ttft_ms=50.0, time=T0 + 4.05))
    bus.publish(FirstAudio(3, time=T0 + 4.2))
    bus.publish(BargeIn(4, reason="words", text="stop", time=T0 + 4.5))
    bus.publish(ResponseInterrupted(3, heard_text="Well", time=T0 + 4.5))
    bus.publish(AssistantText(3, text="Well, let me see.", time=T0 + 4.6))
    bus.publish(ResponseDone(3, text="Well", error="cancelled", time=T0 + 4.6))


# -- Prometheus -----------------------------------------------------------------------------------


def test_session_events_become_the_metrics() -> None:
    metrics = ServerMetrics(webrtc_calls=lambda: 2)
    bus = EventBus()
    session = metrics.session("websocket", bus)
    value = metrics.registry.get_sample_value
    ws = {"transport": "websocket"}
    assert value("s2s_sessions_active", ws) == 1
    conversation(bus)
    session.on_server_event({"type": "response.done", "response": {"status": "completed"}})
    session.on_server_event({"type": "response.done", "response": {"status": "cancelled"}})
    session.on_server_event({"type": "error", "error": {"code": "invalid_event", "message": "bad"}})
    session.on_server_event({"type": "response.output_audio.delta", "delta": ""})  # not counted

    # two responses ended: one spoken turn (every latency) and one typed (no STT, no voice-to-voice)
    assert value("s2s_ttft_seconds_count", ws) == 2
    assert value("s2s_ttft_seconds_sum", ws) == pytest.approx(0.15)
    assert value("s2s_stt_seconds_count", ws) == 1
    assert value("s2s_stt_seconds_sum", ws) == pytest.approx(0.15)
    assert value("s2s_endpoint_delay_seconds_sum", ws) == pytest.approx(0.2)
    assert value("s2s_voice_to_voice_seconds_count", ws) == 1
    assert value("s2s_voice_to_voice_seconds_sum", ws) == pytest.approx(0.7)
    assert value("s2s_ttfa_seconds_sum", ws) == pytest.approx(0.34 + 0.2)
    assert value("s2s_voice_to_voice_seconds_bucket", {**ws, "le": "0.5"}) == 0
    assert value("s2s_voice_to_voice_seconds_bucket", {**ws, "le": "0.75"}) == 1
    assert value("s2s_llm_engine_wait_seconds_sum") == pytest.approx(0.03)
    assert value("s2s_barge_ins_total", ws) == 1
    assert value("s2s_backchannels_total", {**ws, "reason": "backchannel"}) == 1
    assert value("s2s_responses_total", {**ws, "status": "completed"}) == 1
    assert value("s2s_responses_total", {**ws, "status": "cancelled"}) == 1
    assert value("s2s_errors_total", {"code": "invalid_event"}) == 1
    assert value("s2s_webrtc_calls_active") == 2
    assert value("s2s_voice_to_voice_seconds_count", {"transport": "webrtc"}) is None

    session.close()
    session.close()  # idempotent
    assert value("s2s_sessions_active", ws) == 0
    metrics.refuse("max_sessions")
    assert value("s2s_sessions_refused_total", {"reason": "max_sessions"}) == 1

    text = metrics.exposition().decode()
    assert "# TYPE s2s_voice_to_voice_seconds histogram" in text
    assert 's2s_responses_total{status="completed",transport="websocket"} 1.0' in text
    if "process_resident_memory_bytes" in text:  # prometheus-client's process collector (Linux)
        assert value("process_resident_memory_bytes") > 10e6


def test_every_histogram_has_distinct_increasing_buckets() -> None:
    """Each series' ``le`` bounds, as scraped, rise strictly (a repeated bound is a duplicate sample)."""
    metrics = ServerMetrics()
    bus = EventBus()
    metrics.session("websocket", bus)
    conversation(bus)
    bounds: dict[str, list[float]] = {}
    for line in metrics.exposition().decode().splitlines():
        match = re.match(r'(s2s_\w+)_bucket\{(.*)le="([^"]+)"', line)
        if match:
            bounds.setdefault(match.group(1) + match.group(2), []).append(float(match.group(3)))
    assert "s2s_llm_engine_wait_seconds" in bounds and len(bounds) > 5
    for series, les in bounds.items():
        assert les == sorted(set(les)), (series, les)


def test_two_servers_do_not_share_counters() -> None:
    first, second = ServerMetrics(), ServerMetrics()
    first.refuse("draining")
    assert first.registry.get_sample_value("s2s_sessions_refused_total", {"reason": "draining"}) == 1
    assert second.registry.get_sample_value("s2s_sessions_refused_total", {"reason": "draining"}) is None


# -- OpenTelemetry ------------------------------------------------------------------------------


def traced(tracing: Tracing) -> None:
    """One session on ``tracing``, its metrics first (as the server subscribes them), then the conversation."""
    bus = EventBus()
    metrics = ServerMetrics().session("websocket", bus)  # publishes TurnMetrics (turn.user_bot_latency_seconds)
    trace = tracing.session("sess_1", "websocket", bus)
    conversation(bus)
    trace.close()
    metrics.close()


def test_spans_of_a_session_in_memory() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced(Tracing(provider))
    spans = exporter.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}

    def parent_name(span: Any) -> str | None:
        return by_id[span.parent.span_id].name if span.parent is not None else None

    tree = sorted((span.name, parent_name(span)) for span in spans)
    # turn 2 was a backchannel: no turn of its own; turn 3 was typed: no STT
    assert tree == sorted(
        [
            ("conversation", None),
            ("turn", "conversation"),
            ("stt", "turn"),
            ("llm", "turn"),
            ("tts", "turn"),
            ("turn", "conversation"),
            ("llm", "turn"),
            ("tts", "turn"),
        ]
    )
    assert len({span.context.trace_id for span in spans}) == 1
    turns = sorted((s for s in spans if s.name == "turn"), key=lambda s: s.attributes["turn.number"])
    first, second = turns
    assert first.attributes["turn.was_interrupted"] is False
    assert first.attributes["turn.user_bot_latency_seconds"] == pytest.approx(0.7)
    assert second.attributes["turn.was_interrupted"] is True
    assert "turn.user_bot_latency_seconds" not in second.attributes
    assert (first.end_time - first.start_time) / 1e9 == pytest.approx(3.0, abs=1e-3)  # speech start → done
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == first.context.span_id}
    llm, stt, tts = children["llm"], children["stt"], children["tts"]
    assert llm.attributes["metrics.ttfb"] == pytest.approx(0.1)
    assert llm.attributes["gen_ai.usage.input_tokens"] == 21
    assert llm.attributes["gen_ai.usage.output_tokens"] == 9
    assert (stt.end_time - stt.start_time) / 1e9 == pytest.approx(0.15, abs=1e-3)
    assert tts.attributes["metrics.ttfb"] == pytest.approx(0.24)  # first token → first audio
    assert stt.start_time >= first.start_time and llm.end_time <= first.end_time
    session = next(s for s in spans if s.name == "conversation")
    assert session.attributes["session.id"] == "sess_1"
    assert session.attributes["s2s.transport"] == "websocket"
    assert session.attributes["conversation.turns"] == 2


def test_tracing_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing_from_args(argparse.Namespace(otel=False)) is None
    assert tracing_wanted(argparse.Namespace(otel=True))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing_wanted(argparse.Namespace(otel=False))


def test_spans_reach_an_otlp_http_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "s2s-test")
        tracing = tracing_from_args(argparse.Namespace(otel=False))  # on because of the variable
        assert tracing is not None
        traced(tracing)
        tracing.shutdown()  # flushes the batch
        spans = receiver.wait_for("conversation")
    assert set(receiver.paths) == {"/v1/traces"}
    assert {service for _, _, services in spans for service in services} == {"s2s-test"}
    assert sorted(name for name, _, _ in spans) == sorted(
        ["conversation", "turn", "stt", "llm", "tts", "turn", "llm", "tts"]
    )
    llm = [attributes for name, attributes, _ in spans if name == "llm"]
    usage = {"gen_ai.usage.input_tokens": 21, "gen_ai.usage.output_tokens": 9}
    assert [usage.items() <= a.items() for a in llm].count(True) == 1  # the typed turn reported no usage
    turns = sorted((a for name, a, _ in spans if name == "turn"), key=lambda a: a["turn.number"])
    assert [t["turn.was_interrupted"] for t in turns] == [False, True]
    assert turns[0]["turn.user_bot_latency_seconds"] == pytest.approx(0.7)


def test_a_server_without_tracing_never_imports_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from speech_to_speech.pipeline.cli import parse_args\n"
        "from speech_to_speech.realtime.server import RealtimeServer\n"
        "server = RealtimeServer(parse_args(['--mode', 'server', '--port', '0']))\n"
        "assert server.tracing is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
