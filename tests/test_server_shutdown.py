"""The realtime server's stop is bounded: a client that never finishes its handshake cannot hold it."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from speech_to_speech.realtime.server import SHUTDOWN_GRACE_S, handler_tasks
from speech_to_speech.testing.realtime import InProcessServer

#: websockets' open timeout, s: how long a half-open connection held a stop before
WEBSOCKETS_OPEN_TIMEOUT_S = 10.0
#: a server that loads nothing before a session starts (its LLM is a provider that is never asked)
NO_SESSION_FLAGS = ("--llm_backend", "chat-completions", "--responses_api_base_url", "http://127.0.0.1:9/v1")


def test_a_half_open_connection_does_not_hold_the_stop(caplog: pytest.LogCaptureFixture) -> None:
    # no session ever starts (the handshake never comes), so no model is needed
    server = InProcessServer(*NO_SESSION_FLAGS, warm_up=False).start()
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # TCP only: no HTTP request
    try:
        ws_server = server.server._server
        assert ws_server is not None
        deadline = time.monotonic() + 30
        while not handler_tasks(ws_server) and time.monotonic() < deadline:  # until the loop accepted it
            time.sleep(0.01)
        assert handler_tasks(ws_server), "the server never accepted the connection"
        with caplog.at_level(logging.WARNING, logger="speech_to_speech.realtime.server"):
            began = time.monotonic()
            server.stop(timeout_s=30)
            took = time.monotonic() - began
    finally:
        silent.close()
    assert not server._thread.is_alive()
    assert SHUTDOWN_GRACE_S < WEBSOCKETS_OPEN_TIMEOUT_S / 2
    # the grace period plus scheduling, far from the open timeout even on a busy machine
    assert took < WEBSOCKETS_OPEN_TIMEOUT_S * 0.8, took
    assert any("still open" in record.getMessage() for record in caplog.records)


def test_an_idle_server_stops_without_warnings(caplog: pytest.LogCaptureFixture) -> None:
    server = InProcessServer(*NO_SESSION_FLAGS, warm_up=False).start()
    with caplog.at_level(logging.WARNING, logger="speech_to_speech.realtime.server"):
        server.stop(timeout_s=30)
    assert not server._thread.is_alive()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
