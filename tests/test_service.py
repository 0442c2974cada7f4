"""The realtime server as a service, with the real embedded models: health and readiness, Origin
checks, and a real Prometheus scraping ``/metrics`` while a spoken conversation runs (with the
OpenTelemetry spans of that conversation, in memory).

The Prometheus test needs Debian's ``prometheus`` binary (``apt-get install prometheus``; CI
installs it) and is skipped only when it is missing.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.exceptions import InvalidStatus

from speech_to_speech.client.realtime import ConnectError
from speech_to_speech.realtime.tracing import Tracing
from speech_to_speech.testing.bench import free_port
from speech_to_speech.testing.realtime import InProcessServer, RawClient, blocks, load_clip, silence
from speech_to_speech.testing.responses_server import ResponsesServer
from tests.helpers import responses_api_flags, two_short_clips

pytestmark = pytest.mark.models

#: the longest any single wait may take on a slow, shared machine, s
WAIT_S = 300.0
#: the browser origin the module's server allows besides its own
ALLOWED = "https://app.example.com"
FOREIGN = "https://evil.example.com"
CLIP, _ = two_short_clips()


def run(scenario: Coroutine[Any, Any, Any], timeout_s: float = 900.0) -> Any:
    """Run a client scenario on a fresh event loop within ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    """Where the module server's spans go."""
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def server(
    provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer], spans: InMemorySpanExporter
) -> InProcessServer:
    """Real VAD, STT and TTS; the LLM on the scripted provider; one extra allowed origin; traced in memory."""
    started = realtime_servers(
        *responses_api_flags(provider.base_url), "--allowed_origins", ALLOWED, "--max_new_tokens", "40"
    )
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    started.server.tracing = Tracing(tracer_provider)  # as --otel would, exported in memory
    return started


def get(port: int, path: str) -> tuple[int, str]:
    """``GET path`` on 127.0.0.1:port: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def request(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> http.client.HTTPResponse:
    """One HTTP request (the response read)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


# -- health and readiness --------------------------------------------------------------------------


def test_health_and_readiness(server: InProcessServer, realtime_servers: Callable[..., InProcessServer]) -> None:
    assert get(server.port, "/healthz") == (200, "ok\n")
    assert get(server.port, "/readyz") == (200, "ready\n")
    # a server that has not loaded its models yet, with room for one session
    small = realtime_servers(*responses_api_flags("http://127.0.0.1:9/v1"), "--max_sessions", "1", warm_up=False)
    assert get(small.port, "/healthz")[0] == 200
    assert get(small.port, "/readyz") == (503, "not ready: models not loaded\n")

    async def scenario() -> tuple[tuple[int, str], tuple[int, str]]:
        client = await RawClient.open(small.ws_url)
        try:
            await client.log.wait_for("session.created", WAIT_S)
            full = await asyncio.to_thread(get, small.port, "/readyz")
        finally:
            await client.close()
        deadline = time.monotonic() + WAIT_S
        while small.server.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return full, await asyncio.to_thread(get, small.port, "/readyz")

    full, after = run(scenario())
    assert full == (503, "not ready: full (1 sessions)\n")
    assert after == (200, "ready\n")


# -- origins ----------------------------------------------------------------------------------------


def test_websocket_origins(server: InProcessServer) -> None:
    own = f"http://127.0.0.1:{server.port}"

    async def handshake(origin: str | None) -> int:
        headers = {"Origin": origin} if origin is not None else None
        try:
            client = await RawClient.open(server.ws_url, headers)
        except ConnectError as exc:
            assert isinstance(exc.__cause__, InvalidStatus), exc
            return exc.__cause__.response.status_code
        try:
            await client.log.wait_for("session.created", WAIT_S)
        finally:
            await client.close()
        return 101

    async def scenario() -> dict[str, int]:
        cases = {"none": None, "own": own, "allowed": ALLOWED, "foreign": FOREIGN, "null": "null"}
        return {name: await handshake(origin) for name, origin in cases.items()}

    assert run(scenario()) == {"none": 101, "own": 101, "allowed": 101, "foreign": 403, "null": 403}
    refused = server.server.metrics.registry.get_sample_value("s2s_sessions_refused_total", {"reason": "origin"})
    assert refused == 2


def test_calls_route_origins(server: InProcessServer) -> None:
    port, path = server.port, "/v1/realtime/calls"
    offer = {"Content-Type": "text/plain"}  # not an SDP offer: 415 once the origin is accepted
    foreign = request(port, "POST", path, {**offer, "Origin": FOREIGN}, b"v=0")
    assert foreign.status == 403
    assert foreign.getheader("Access-Control-Allow-Origin") is None
    preflight = request(port, "OPTIONS", path, {"Origin": FOREIGN, "Access-Control-Request-Method": "POST"})
    assert preflight.status == 403
    allowed = request(port, "OPTIONS", path, {"Origin": ALLOWED, "Access-Control-Request-Method": "POST"})
    assert allowed.status == 204
    assert allowed.getheader("Access-Control-Allow-Origin") == ALLOWED
    posted = request(port, "POST", path, {**offer, "Origin": ALLOWED}, b"v=0")
    assert posted.status == 415 and posted.getheader("Access-Control-Allow-Origin") == ALLOWED
    own = f"http://127.0.0.1:{port}"
    assert request(port, "POST", path, {**offer, "Origin": own}, b"v=0").status == 415
    scripted = request(port, "POST", path, offer, b"v=0")  # no Origin: an SDK or a script
    assert scripted.status == 415 and scripted.getheader("Access-Control-Allow-Origin") is None


# -- a real Prometheus ------------------------------------------------------------------------------


@pytest.fixture
def prometheus(server: InProcessServer, tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping the module's server every second; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: s2s\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.port}']\n"
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
    """An instant query through Prometheus's HTTP API: (labels, value) per series."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]


def wait_for_value(url: str, promql: str, check: Callable[[float], bool], timeout_s: float = 60) -> float:
    """Poll ``promql`` until its single series' value passes ``check``; that value."""
    deadline = time.monotonic() + timeout_s
    result: list[tuple[dict[str, str], float]] = []
    while time.monotonic() < deadline:
        result = query(url, promql)
        if len(result) == 1 and check(result[0][1]):
            return result[0][1]
        time.sleep(0.5)
    raise AssertionError(f"{promql}: {result}")


def test_prometheus_scrapes_a_spoken_conversation(
    server: InProcessServer, prometheus: str, spans: InMemorySpanExporter
) -> None:
    server.wait_until_idle(WAIT_S)
    spans.clear()
    registry = server.server.metrics.registry
    ws = {"transport": "websocket"}
    before = registry.get_sample_value("s2s_voice_to_voice_seconds_count", ws) or 0.0
    sum_before = registry.get_sample_value("s2s_voice_to_voice_seconds_sum", ws) or 0.0

    async def scenario() -> dict[str, Any]:
        client = await RawClient.open(server.ws_url)
        try:
            await client.log.wait_for("session.created", WAIT_S)
            audio = np.concatenate([load_clip(CLIP[0]), silence(2.5)])
            for payload in blocks(audio, 0.1):
                await client.send({"type": "input_audio_buffer.append", "audio": payload})
            done = await client.log.wait_for("response.done", WAIT_S)
            # while the session is open, Prometheus sees it
            active = await asyncio.to_thread(
                wait_for_value, prometheus, 's2s_sessions_active{transport="websocket"}', lambda v: v >= 1
            )
            assert active >= 1
        finally:
            await client.close()
        return done

    done = run(scenario())
    assert done["response"]["status"] == "completed", done
    # every figure read back through Prometheus's query API
    assert wait_for_value(prometheus, 'up{job="s2s"}', lambda v: v == 1) == 1
    v2v = 's2s_voice_to_voice_seconds_count{transport="websocket"}'
    assert wait_for_value(prometheus, v2v, lambda v: v >= before + 1) >= before + 1
    for name in ("s2s_stt_seconds", "s2s_ttft_seconds", "s2s_ttfa_seconds", "s2s_endpoint_delay_seconds"):
        assert wait_for_value(prometheus, f'{name}_count{{transport="websocket"}}', lambda v: v >= 1) >= 1
        assert wait_for_value(prometheus, f'{name}_sum{{transport="websocket"}}', lambda v: v > 0) > 0
    # the latency Prometheus reports is the one the server measured
    mean = wait_for_value(prometheus, f"{v2v.replace('_count', '_sum')} / {v2v}", lambda v: v > 0)
    local_sum = registry.get_sample_value("s2s_voice_to_voice_seconds_sum", {"transport": "websocket"})
    local_count = registry.get_sample_value("s2s_voice_to_voice_seconds_count", {"transport": "websocket"})
    assert mean == pytest.approx(local_sum / local_count, rel=1e-6)
    assert 0 < mean < 60
    completed = 's2s_responses_total{transport="websocket",status="completed"}'
    assert wait_for_value(prometheus, completed, lambda v: v >= 1) >= 1
    assert wait_for_value(prometheus, 's2s_sessions_active{transport="websocket"}', lambda v: v == 0) == 0
    assert wait_for_value(prometheus, 'process_resident_memory_bytes{job="s2s"}', lambda v: v > 50e6) > 50e6
    p50 = "histogram_quantile(0.5, sum by (le) (s2s_voice_to_voice_seconds_bucket))"
    assert 0 < wait_for_value(prometheus, p50, lambda v: v > 0) <= 10

    # the same conversation as spans: conversation > turn > stt, llm, tts
    deadline = time.monotonic() + WAIT_S
    while not any(s.name == "conversation" for s in spans.get_finished_spans()) and time.monotonic() < deadline:
        time.sleep(0.05)
    finished = spans.get_finished_spans()
    names = sorted(s.name for s in finished)
    assert names == ["conversation", "llm", "stt", "tts", "turn"], names
    turn = next(s for s in finished if s.name == "turn")
    assert turn.attributes["turn.number"] == 1 and turn.attributes["turn.was_interrupted"] is False
    # this conversation's one voice-to-voice time, as the histogram got it
    assert turn.attributes["turn.user_bot_latency_seconds"] == pytest.approx(local_sum - sum_before, rel=1e-6)
    llm = next(s for s in finished if s.name == "llm")
    usage = done["response"]["usage"]
    assert llm.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert llm.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert llm.attributes["metrics.ttfb"] > 0


def test_metrics_on_a_port_of_their_own(realtime_servers: Callable[..., InProcessServer]) -> None:
    port = free_port()
    separate = realtime_servers(
        *responses_api_flags("http://127.0.0.1:9/v1"), "--metrics_port", str(port), warm_up=False
    )
    status, text = get(port, "/metrics")
    assert status == 200 and "# TYPE s2s_sessions_refused_total counter" in text
    assert get(separate.port, "/metrics")[0] == 404  # not on the server's own port then
    assert get(separate.port, "/healthz")[0] == 200
