"""Helpers for the test modules only (the fixtures are in ``conftest.py``; what benchmarks share with the
tests is in :mod:`speech_to_speech.testing`, re-exported here under the names tests use)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import soundfile as sf

from speech_to_speech.core.messages import EndOfResponse
from speech_to_speech.testing.runs import BusLog as BusLog
from speech_to_speech.testing.runs import new_stage as new_stage
from speech_to_speech.testing.runs import responses_api_flags as responses_api_flags
from speech_to_speech.testing.runs import run_local as run_local
from speech_to_speech.testing.runs import wait_until as wait_until
from speech_to_speech.testing.speech_data import librivox_clips

T = TypeVar("T")

#: the repository root
REPO_ROOT = Path(__file__).resolve().parents[1]
#: a function tool the scripted providers call (``get_weather(city)``)
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def load_module(path: Path, name: str) -> ModuleType:
    """Import the file at ``path`` as module ``name`` (registered in sys.modules, imported once)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_pipeline(*flags: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``s2s_pipeline.py`` with ``flags`` from the repository root; the finished process."""
    return subprocess.run(
        [sys.executable, "s2s_pipeline.py", *flags],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def check_prefix_reused(first: Any, second: Any, out: list[Any]) -> None:
    """The second turn's prompt (``second``, a ``last_prompt`` of an in-process model) holds the
    first's (``first``) and reused all of it, evaluating less than half of itself; its reply
    ``out`` ended without error."""
    assert second.prompt_tokens > first.prompt_tokens  # the history grew ...
    assert second.reused_tokens >= first.prompt_tokens - 1  # ... and all of the first prompt was reused
    assert second.evaluated_tokens < 0.5 * second.prompt_tokens, second
    assert isinstance(out[-1], EndOfResponse) and out[-1].error is None


def two_short_clips() -> tuple[tuple[Path, str], tuple[Path, str]]:
    """The two shortest LibriVox clips (path, reference): A starts a conversation, B barges in.

    With only the bundled clip available, it is used for both.
    """
    by_length = sorted(librivox_clips().items(), key=lambda kv: sf.info(str(kv[0])).duration)
    return by_length[0], by_length[1] if len(by_length) > 1 else by_length[0]


@cache
def mlx_import_error() -> str | None:
    """Why ``import mlx.core, mlx_lm`` fails in a fresh interpreter, or None when it works."""
    probe = subprocess.run(
        [sys.executable, "-c", "import mlx.core, mlx_lm"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {probe.returncode}"


def require_mlx() -> None:
    """Skip the test unless mlx-lm imports (asked of a child process: importing mlx in the test process
    would fix its matrix products to the reference BLAS of the ``mlx[cpu]`` wheel before the handler
    can bind an optimised one, see ``handlers/llm/mlx_lm_llm.py``)."""
    error = mlx_import_error()
    if error is not None:
        pytest.skip(f"mlx-lm cannot be imported ({error}); install the 'mlx' extra (mlx-lm, and mlx[cpu] on Linux)")
