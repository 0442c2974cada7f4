"""Fixtures shared by the test modules (plain helpers are in ``tests/helpers.py``)."""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from handlers.llm.engine_check import EngineCheck, check_engine, reinstall_command
from tests.helpers import responses_api_flags

if TYPE_CHECKING:
    from speech_to_speech.testing.realtime import InProcessServer
    from speech_to_speech.testing.responses_server import ResponsesServer

#: the test that reports an engine which cannot run here (every other test is skipped then)
ENGINE_TEST = "tests/test_engine.py"


@cache
def engine_check() -> EngineCheck:
    """The installed llama.cpp engine's first multi-token evaluation, run once in a child process."""
    return check_engine()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """If the llama.cpp engine crashes here, fail one named test and skip the rest.

    Many tests load the engine in this process; a native crash there (a release that does not run
    on this CPU) would kill pytest with a bare "Segmentation fault". The child-process check runs
    first instead: :data:`ENGINE_TEST` fails with the signal and version, everything else is skipped
    with the same reason.
    """
    result = engine_check()
    if result.ok:
        return
    reason = f"{result.summary()}; reinstall it: {reinstall_command()}"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if not item.nodeid.startswith(ENGINE_TEST):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def realtime_servers() -> Iterator[Callable[..., InProcessServer]]:
    """Starts in-process realtime servers for the module: ``realtime_servers(*flags, warm_up=True)``.

    Each is a started :class:`~speech_to_speech.testing.realtime.InProcessServer`; at the module's end every
    one is stopped, last started first, and waited for until its sessions and their threads are
    gone (a stage thread still in native code when the interpreter exits can abort it).
    """
    from speech_to_speech.testing.realtime import InProcessServer  # the server modules load only where used

    started: list[InProcessServer] = []

    def start(*flags: str, warm_up: bool = True) -> InProcessServer:
        server = InProcessServer(*flags, warm_up=warm_up).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()
        server.wait_until_idle()


@pytest.fixture(scope="module")
def provider() -> Iterator[ResponsesServer]:
    """The scripted ``/v1/responses`` endpoint (:class:`~speech_to_speech.testing.responses_server.ResponsesServer`)
    for the module.

    Stopping it at the module's end also ends any scripted stall.
    """
    from speech_to_speech.testing.responses_server import ResponsesServer

    with ResponsesServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(provider: ResponsesServer, realtime_servers: Callable[..., InProcessServer]) -> InProcessServer:
    """The realtime server in process (real VAD, STT and TTS), its LLM ``responses-api`` on :func:`provider`."""
    return realtime_servers(*responses_api_flags(provider.base_url))


@pytest.fixture(scope="session")
def sample_tools() -> ModuleType:
    """The example tool module ``speech_to_speech.client.talk.sample_tools`` (get_time, add)."""
    return importlib.import_module("speech_to_speech.client.talk.sample_tools")


@pytest.fixture(scope="session")
def talk() -> ModuleType:
    """``s2s-talk``'s command line module (``speech_to_speech.client.talk.cli``)."""
    return importlib.import_module("speech_to_speech.client.talk.cli")


@pytest.fixture
def console_out(talk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """Everything s2s-talk prints on its console; also shortens its settle time for fast tests."""
    buffer = io.StringIO()
    original = talk.Console
    monkeypatch.setattr(talk, "Console", lambda: original(buffer))
    monkeypatch.setattr(talk, "SETTLE_S", 0.1)
    yield buffer
