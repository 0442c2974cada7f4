"""Who gets the CPU first: work a person is waiting for before work done ahead.

On a small CPU (2 cores) every stage competes for the same cores. Some work is on the
*critical path*: its result is what the user waits for right now (the STT pass after an
endpoint, so the reply can start). Other work is done *ahead*, in case it helps later (the LLM
evaluating the user's words into its KV cache while they are still speaking,
:mod:`handlers.llm.partial_prefill`). Work done ahead must never slow the critical path: it
checks :meth:`CriticalPath.wait_clear` between small steps and waits while critical work runs.

Why: on 2 cores a final STT pass that took 31-57 ms on most turns took 450-680 ms on others
(issue 27), when it ran beside llama.cpp's two threads; the prefill from partial transcripts is the
work that can run there, so it gives way between 8-token steps.

One :data:`CRITICAL` serves the whole process: the cores are shared by every session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class CriticalPath:
    """A count of critical work in progress, and a wait for none. Thread-safe."""

    def __init__(self) -> None:
        self._active = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Mark the body as critical work (nests; any thread)."""
        with self._changed:
            self._active += 1
        try:
            yield
        finally:
            with self._changed:
                self._active -= 1
                self._changed.notify_all()

    @property
    def busy(self) -> bool:
        """Critical work is running now."""
        with self._changed:
            return self._active > 0

    def wait_clear(self, timeout_s: float) -> bool:
        """Block while critical work runs, at most ``timeout_s`` seconds.

        Returns:
            True when none runs (now or after waiting), False on time-out.
        """
        with self._changed:
            return self._changed.wait_for(lambda: self._active == 0, timeout_s)


#: the process's critical path (every pipeline and session shares the cores)
CRITICAL = CriticalPath()
