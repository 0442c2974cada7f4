"""The deployment files agree with the server: the Grafana dashboard charts metrics the server
exports, with PromQL Prometheus accepts; the Prometheus config and the Caddyfile are valid (checked
with ``promtool`` and ``caddy`` when they are installed; skipped otherwise)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from speech_to_speech.core.events import EventBus
from speech_to_speech.realtime.telemetry import ServerMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "speech-to-speech.json"
METRIC = re.compile(r"\b((?:s2s|process)_[a-z_]+)")


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def exported_names() -> set[str]:
    """Every sample name a server's /metrics can carry (each labelled series made to exist)."""
    metrics = ServerMetrics()
    session = metrics.session("websocket", EventBus())
    for histogram in metrics.turn_histograms.values():
        histogram.labels("websocket").observe(0.1)
    metrics.engine_wait.observe(0.1)
    metrics.responses.labels("websocket", "completed").inc()
    metrics.errors.labels("x").inc()
    metrics.refused.labels("x").inc()
    metrics.barge_ins.labels("websocket").inc()
    metrics.backchannels.labels("websocket", "backchannel").inc()
    session.close()
    names = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    return names | {"process_resident_memory_bytes"}  # Linux only (prometheus-client's process collector)


def test_the_dashboard_charts_metrics_the_server_exports() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 12
    used = {name for query in queries for name in METRIC.findall(query)}
    exported = exported_names()
    assert used - exported == set()
    # every kind of figure the server reports has a panel
    for needed in (
        "s2s_voice_to_voice_seconds_bucket",
        "s2s_ttft_seconds_bucket",
        "s2s_ttfa_seconds_bucket",
        "s2s_stt_seconds_bucket",
        "s2s_endpoint_delay_seconds_bucket",
        "s2s_sessions_active",
        "s2s_webrtc_calls_active",
        "s2s_sessions_refused_total",
        "s2s_responses_total",
        "s2s_errors_total",
        "s2s_barge_ins_total",
        "s2s_backchannels_total",
        "s2s_llm_engine_wait_seconds_bucket",
        "process_resident_memory_bytes",
    ):
        assert needed in used, needed


def test_the_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": query} for i, query in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prometheus_config_is_valid() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    config = ROOT / "deploy" / "prometheus.yml"
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_caddyfile_is_valid() -> None:
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("caddy is not installed (apt-get install caddy)")
    result = subprocess.run(
        [caddy, "adapt", "--config", str(ROOT / "deploy" / "Caddyfile"), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    route = json.dumps(config["apps"]["http"])
    assert '"s2s-replica"' in route and '"/metrics"' in route


@pytest.mark.parametrize(("profile", "replica", "llm"), [("cpu", "s2s", "llm-cpu"), ("gpu", "s2s-gpu", "llm-gpu")])
def test_the_compose_file_is_valid_for_each_profile(profile: str, replica: str, llm: str, tmp_path: Path) -> None:
    """``docker-compose config`` (Debian's 1.29, which needs no Docker daemon) on the compose file:
    both profiles resolve, with the proxy, Prometheus, Grafana and that profile's LLM server.
    1.29 predates the top-level ``name:`` key (Compose v2 reads it), so a copy without it is checked."""
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    text = (ROOT / "compose.yaml").read_text()
    copy = tmp_path / "compose.yaml"
    copy.write_text(re.sub(r"(?m)^name: .*$", "", text))
    for path in ("Dockerfile", "Dockerfile.cuda", "deploy"):
        (tmp_path / path).symlink_to(ROOT / path)
    result = subprocess.run(
        [compose, "--profile", profile, "-f", str(copy), "config", "--services"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    services = set(result.stdout.split())
    # 1.29 lists every service whatever the profile; each profile's own are among them
    assert {replica, llm, "proxy", "prometheus", "grafana"} <= services, services
