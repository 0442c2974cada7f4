"""Helpers shared by several test modules (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import soundfile as sf

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import Event, EventBus
from speech_to_speech.core.messages import EndOfResponse
from tests.speech_utils import librivox_clips

T = TypeVar("T")

#: the repository root
REPO_ROOT = Path(__file__).resolve().parents[1]


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


def wait_until(condition: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll ``condition`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


def new_stage(cls: type[T], **kwargs: Any) -> T:
    """A stage of class ``cls`` built as the pipeline builds one, with its own stop event, gate and bus.

    ``kwargs`` go to the constructor (``config``, ``name``, ``device``...); the queues are None
    unless given (``input_queue``, ``output_queue``): the stage is driven through ``process``.
    """
    kwargs.setdefault("input_queue", None)
    kwargs.setdefault("output_queue", None)
    return cls(stop_event=threading.Event(), gate=Gate(), bus=EventBus(), **kwargs)


def run_local(args: Any, bus: EventBus) -> Any:
    """Build local mode's pipeline from parsed ``args``, run it to the end of its input file and
    stop it; return it (its stages hold what the run left, e.g. the LLM's history)."""
    from speech_to_speech.pipeline.builder import build_pipeline

    pipeline = build_pipeline(args, bus)
    pipeline.start()
    try:
        pipeline.wait()
    finally:
        pipeline.stop()
    return pipeline


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


def responses_api_flags(base_url: str, model: str = "test-model") -> tuple[str, ...]:
    """The flags that make the LLM ``responses-api`` on ``base_url`` (e.g. a scripted :class:`ResponsesServer`)."""
    return ("--llm_backend", "responses-api", "--responses_api_base_url", base_url, "--model_name", model)


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


class BusLog:
    """Records every event published on an :class:`EventBus` and wakes waiters when one arrives."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        self._changed = threading.Condition()
        bus.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, kind: type[Event], turn_id: int | None = None) -> list[Any]:
        """Events of type ``kind`` (for ``turn_id`` when given), in publication order."""
        with self._changed:
            return [e for e in self.events if isinstance(e, kind) and (turn_id is None or e.turn_id == turn_id)]

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Block until ``condition()`` holds (re-checked on each event), ``stop`` is set or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return condition()
                self._changed.wait(min(left, 0.05))
            return True


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
