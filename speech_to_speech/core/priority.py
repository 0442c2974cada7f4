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

:data:`CORES` counts the threads of other stages that are using a core right now (a TTS
synthesis, a partial STT pass, and all critical work), so that the LLM, which can use every core, takes
only those left (:meth:`CoreUse.free`). Why: llama.cpp's threads wait for each other at every
operation of a token, so one of two threads sharing its core with Piper stalls both. Measured on
the 2-core target (Qwen2.5-Coder-1.5B Q4_K_M, 2026-12-04): alone, 2 threads write 30 tokens/s and
1 thread 19; beside a Piper synthesis on one intra-op thread, 2 threads write 9-11 tokens/s and 1
thread 16-20 (and evaluate an 18-token prompt in 495 ms against 728 ms).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator


class CoreUse:
    """How many threads of other stages are using a core now. Thread-safe.

    Args:
        cores: the cores of this machine (default: those this process may run on).
    """

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores or available_cores()
        self._in_use = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def using(self, threads: int = 1) -> Iterator[None]:
        """Mark the body as ``threads`` threads busy on cores (nests; any thread)."""
        with self._lock:
            self._in_use += threads
        try:
            yield
        finally:
            with self._lock:
                self._in_use -= threads

    @property
    def in_use(self) -> int:
        """Threads of other stages on a core now."""
        return self._in_use

    def free(self, wanted: int) -> int:
        """How many of ``wanted`` threads to run now: those the cores left free allow, at least one."""
        return max(1, min(wanted, self.cores - self._in_use))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: the process's use of its cores by threads other than the LLM's (every session shares them)
CORES = CoreUse()


class CriticalPath:
    """A count of critical work in progress, and a wait for none. Thread-safe.

    Args:
        cores: where critical work also marks the core it runs on (each body is one thread).
    """

    def __init__(self, cores: CoreUse) -> None:
        self.cores = cores
        self._active = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Mark the body as critical work on one core (nests; any thread)."""
        with self._changed:
            self._active += 1
        try:
            with self.cores.using():
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
CRITICAL = CriticalPath(CORES)
