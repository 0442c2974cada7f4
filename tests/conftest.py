"""Fixtures shared by the test modules (plain helpers are in ``tests/helpers.py``)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from tests.helpers import REPO_ROOT, load_module

if TYPE_CHECKING:
    from tests.realtime_harness import InProcessServer


@pytest.fixture(scope="module")
def realtime_servers() -> Iterator[Callable[..., InProcessServer]]:
    """Starts in-process realtime servers for the module: ``realtime_servers(*flags, warm_up=True)``.

    Each is a started :class:`~tests.realtime_harness.InProcessServer`; at the module's end every
    one is stopped, last started first, and waited for until its sessions and their threads are
    gone (a stage thread still in native code when the interpreter exits can abort it).
    """
    from tests.realtime_harness import InProcessServer  # the server modules load only where used

    started: list[InProcessServer] = []

    def start(*flags: str, warm_up: bool = True) -> InProcessServer:
        server = InProcessServer(*flags, warm_up=warm_up).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()
        server.wait_until_idle()


@pytest.fixture(scope="session")
def sample_tools() -> ModuleType:
    """``scripts/sample_tools.py`` (get_time, add), imported from its path."""
    return load_module(REPO_ROOT / "scripts" / "sample_tools.py", "sample_tools_under_test")


@pytest.fixture(scope="session")
def talk() -> ModuleType:
    """``scripts/talk.py``, imported from its path."""
    return load_module(REPO_ROOT / "scripts" / "talk.py", "talk_under_test")


@pytest.fixture
def console_out(talk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """Everything talk.py prints on its console; also shortens its settle time for fast tests."""
    buffer = io.StringIO()
    original = talk.Console
    monkeypatch.setattr(talk, "Console", lambda: original(buffer))
    monkeypatch.setattr(talk, "SETTLE_S", 0.1)
    yield buffer
