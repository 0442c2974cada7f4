"""The per-turn latencies that ``response.done`` carries in ``response.metadata`` (the page shows them)."""

from __future__ import annotations

from speech_to_speech.core.events import (
    EventBus,
    FirstAudio,
    FirstToken,
    ResponseDone,
    ResponseStarted,
    SpeechStopped,
    UserTranscript,
)
from speech_to_speech.pipeline.console import MetricsCollector, latency_metadata


def test_a_spoken_turn_while_it_plays_and_after() -> None:
    bus = EventBus()
    metrics = MetricsCollector(bus, keep_last=1)
    bus.publish(SpeechStopped(1, endpoint_delay_ms=310.4, endpoint_by="model", time=10.0))
    bus.publish(UserTranscript(1, text="hi", stt_ms=95.2, time=10.4))
    bus.publish(ResponseStarted(1, speech_end_time=9.69, time=10.5))
    bus.publish(FirstToken(1, ttft_ms=420.0, time=10.92))
    bus.publish(FirstAudio(1, time=11.11))
    playing = latency_metadata(metrics.metrics_of(1))
    assert playing == {
        "s2s_endpoint_ms": "310",
        "s2s_stt_ms": "95",
        "s2s_ttft_ms": "420",
        "s2s_ttfa_ms": "610",
        "s2s_voice_to_voice_ms": "1420",
        "s2s_endpoint_by": "model",
    }
    bus.publish(ResponseDone(1, time=12.0))  # the turn is finished: the same numbers, kept
    assert latency_metadata(metrics.metrics_of(1)) == playing
    assert all(isinstance(v, str) for v in playing.values())  # the SDK's metadata is str → str


def test_a_typed_turn_has_no_stt_and_old_turns_are_forgotten() -> None:
    bus = EventBus()
    metrics = MetricsCollector(bus, keep_last=1)
    for turn in (1, 2):
        bus.publish(ResponseStarted(turn, time=1.0))
        bus.publish(FirstToken(turn, ttft_ms=200.0))
        bus.publish(FirstAudio(turn, time=1.5))
        bus.publish(ResponseDone(turn, time=2.0))
    assert latency_metadata(metrics.metrics_of(2)) == {"s2s_ttft_ms": "200", "s2s_ttfa_ms": "500"}
    assert metrics.metrics_of(1) is None and latency_metadata(None) == {}
