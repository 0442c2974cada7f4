"""The llama.cpp engine runs on this machine, and an engine that crashes is reported, not fatal.

``llama-cpp-python`` is built from source on each machine, and some releases segfault on some
CPUs in their first multi-token evaluation (:mod:`handlers.llm.engine_check`). The check runs in a
child process; ``conftest.py`` runs it before any test and, on a crash, fails the first test here
and skips the rest with the same message.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from handlers.llm.engine_check import ENGINE, check_engine, installed_version, pinned_version, reinstall_command
from tests.conftest import engine_check


def test_the_installed_engine_evaluates_a_multi_token_prompt() -> None:
    result = engine_check()
    assert result.ok, f"{result.summary()}\nreinstall it: {reinstall_command()}\n{result.output[-2000:]}"
    assert "evaluated and generated" in result.output


def test_the_installed_engine_is_the_pinned_release() -> None:
    pinned = pinned_version()
    assert pinned is not None, f"pyproject.toml pins no exact {ENGINE} release (it is built from source)"
    assert installed_version() == pinned, f"installed {installed_version()}, pinned {pinned}: {reinstall_command()}"


def fake_interpreter(tmp_path: Path, body: str) -> str:
    """An executable that stands in for ``python``: runs ``body`` (sh) whatever it is asked."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_native_crash_is_reported_with_its_signal_and_version(tmp_path: Path) -> None:
    # a real SIGSEGV in the child, as a crashing engine build dies
    dump = "Fatal Python error: Segmentation fault\n\nCurrent thread (most recent call first):\n"
    dump += '  File "/venv/llama_cpp/llama.py", line 648 in eval\n  File "/repo/engine_check.py", line 9 in evaluate'
    python = fake_interpreter(tmp_path, f"printf '{dump}\\n' >&2; kill -SEGV $$")
    result = check_engine(python=python, timeout_s=30)
    assert not result.ok
    assert result.returncode == -11
    assert result.how == "crashed with SIGSEGV"
    summary = result.summary()
    assert summary.startswith(f"{ENGINE} ")
    assert summary.endswith(
        "crashed with SIGSEGV (Fatal Python error: Segmentation fault, in eval at /venv/llama_cpp/llama.py:648)"
    )


def test_a_failing_child_and_a_hang_are_reported(tmp_path: Path) -> None:
    failing = check_engine(python=fake_interpreter(tmp_path, "echo 'no module llama_cpp' >&2; exit 1"), timeout_s=30)
    assert (failing.ok, failing.how) == (False, "exited with status 1")
    assert "no module llama_cpp" in failing.summary()
    os.remove(tmp_path / "python")
    hang = 'case "$*" in *engine_check*) exec sleep 30;; esac; exit 1'  # the version query answers at once
    hanging = check_engine(python=fake_interpreter(tmp_path, hang), timeout_s=1)
    assert (hanging.ok, hanging.returncode) == (False, 124)
    assert "timed out" in hanging.summary()


def test_the_reinstall_hint_names_the_pinned_release() -> None:
    pinned = pinned_version()
    if pinned is None:
        pytest.fail(f"no exact {ENGINE} pin")
    assert reinstall_command() == f"pip install --force-reinstall --no-cache-dir --no-deps {ENGINE}=={pinned}"
