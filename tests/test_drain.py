"""SIGTERM drains a real server process: the reply in progress finishes, then the client gets an
``error`` (``server_shutting_down``) and a clean 1001 close, and the process exits 0.

The server runs as ``s2s_pipeline.py --mode server`` (real VAD, STT and TTS; its LLM the scripted
provider's long story), with ``OTEL_EXPORTER_OTLP_ENDPOINT`` aimed at a receiver here, so the
session's spans must also have been exported by the time the process has exited.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speech_to_speech.client.realtime import ConnectError
from speech_to_speech.realtime.server import CLOSE_GOING_AWAY, SHUTTING_DOWN
from speech_to_speech.testing.realtime import RawClient
from speech_to_speech.testing.responses_server import STORY_REPLY, ResponsesServer
from tests.helpers import responses_api_flags
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[1]
#: the longest any single wait may take on a slow, shared machine, s
WAIT_S = 300.0
LISTENING = re.compile(r"listening on ws://[^:]+:(\d+)/v1/realtime")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, OTLPReceiver]]:
    """A server process (its LLM on a scripted provider telling a long story), traced to a receiver."""
    with ResponsesServer() as provider, OTLPReceiver() as receiver:
        provider.script(STORY_REPLY)
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "drain-test"}
        command = [sys.executable, "s2s_pipeline.py", "--mode", "server", "--port", "0", "--device", "cpu"]
        command += [*responses_api_flags(provider.base_url), "--drain_timeout_s", "120"]
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            output: list[str] = []
            deadline = time.monotonic() + WAIT_S
            port = None
            assert process.stdout is not None
            while port is None:
                line = process.stdout.readline()
                assert line or process.poll() is None, "".join(output)
                assert time.monotonic() < deadline, "".join(output)
                output.append(line)
                match = LISTENING.search(line)
                port = int(match.group(1)) if match else None
            yield process, port, receiver
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(30)


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sigterm_mid_reply_finishes_it_then_closes_1001(
    served: tuple[subprocess.Popen[str], int, OTLPReceiver],
) -> None:
    process, port, receiver = served
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    assert readyz(port) == 200

    async def scenario() -> tuple[list[dict[str, Any]], int | None, int, str, float, float]:
        client = await RawClient.open(url)
        log = client.log
        await log.wait_for("session.created", WAIT_S)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
        await client.send({"type": "conversation.item.create", "item": item})
        await client.send({"type": "response.create"})
        await log.wait_for("response.output_audio.delta", WAIT_S)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)  # mid-reply
        # draining: not ready, and a new client is turned away
        deadline = time.monotonic() + 30
        while (status := await asyncio.to_thread(readyz, port)) != 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        try:
            late = await RawClient.open(url)
            await late.close()
            refused = "accepted"
        except ConnectError as exc:
            refused = str(exc)
        await log.wait_for("error", WAIT_S)
        await asyncio.wait_for(client.ws.wait_closed(), WAIT_S)
        closed = time.monotonic()
        events = list(log.events)
        await client.close()
        return events, client.ws.close_code, status, refused, signalled, closed

    events, code, status, refused, signalled, closed = asyncio.run(asyncio.wait_for(scenario(), 900))
    types = [e["type"] for e in events]
    assert status == 503
    assert "HTTP 503" in refused, refused
    done = [e for e in events if e["type"] == "response.done"]
    assert len(done) == 1 and done[0]["response"]["status"] == "completed", done
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert "fell asleep" in transcript  # the whole story was told, not cut at the signal
    error = events[-1]
    assert error["type"] == "error" and error["error"]["code"] == SHUTTING_DOWN, types[-5:]
    assert types.index("response.done") < len(types) - 1
    assert code == CLOSE_GOING_AWAY
    assert closed - signalled > 1.0  # the reply played on after the signal
    assert process.wait(60) == 0
    # the session's spans were exported before the process ended
    spans = receiver.wait_for("conversation", timeout_s=5)
    names = sorted(name for name, _, _ in spans)
    assert names == ["conversation", "llm", "tts", "turn"], names
    assert {service for _, _, services in spans for service in services} == {"drain-test"}
