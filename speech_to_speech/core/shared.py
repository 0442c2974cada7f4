"""Process-wide sharing of loaded models.

In server mode every session has its own stages and state, but the models
behind them are loaded once and shared. Backends load through
:func:`shared_model`; in local mode it simply loads once.

Memory of closed sessions (:func:`freeze_loaded`, :func:`release_memory`). A session's
objects form reference cycles (stages, bus, queues, sockets), so they are freed by the cyclic
garbage collector, not when the session closes. With the models loaded, a process holds ~300,000
objects, and CPython starts a full collection only once the objects that survived since the last
one reach a quarter of that: about every 40 sessions. Meanwhile the closed sessions and the
native memory they hold (tensors, HTTP clients, buffers) pile up, and a full collection takes
110-170 ms with the GIL held (measured on 2 cores). So the server freezes what the models loaded
(``gc.freeze()``: never scanned again), and once a closed session's threads have ended it
collects (a few ms over what is left) and hands free heap pages back to the system (glibc
``malloc_trim``). It also caps glibc's malloc arenas (:func:`limit_malloc_arenas`; the default
is 8 per core): every session adds six threads, and freed memory scattered over many arenas is
retained.

Measured (sequential sessions, each connect, ``session.update``, one typed turn with a spoken
reply, close; default VAD, STT and TTS; 2 cores), with the embedded LLM, RSS from session 10 to
60: 1203 -> 1250 MB before, still climbing; 1215 -> 1224 MB with the Silero model shared (see
``handlers/vad/silero_vad.py``), the collection and the trim; 1172 -> 1195 MB with the arena cap
too, a one-off step of ~20 MB near session 15 included (Piper's memory-pattern planner, now off:
see ``handlers/tts/piper_tts.py``); then +2 MB from session 10 to 50. With a scripted LLM, from
session 10 to 100: 621 -> 659 MB before, 577 -> 578 MB after.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

_models: dict[Hashable, Any] = {}
_locks: dict[Hashable, threading.Lock] = {}
_guard = threading.Lock()


def shared_model(key: Hashable, load: Callable[[], T]) -> T:
    """Return the object cached under ``key``, calling ``load()`` once if there is none.

    Concurrent callers with the same key wait for a single load; different keys
    load in parallel. A ``load`` that raises caches nothing.
    """
    with _guard:
        if key in _models:
            return _models[key]
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        with _guard:
            if key in _models:
                return _models[key]
        value = load()
        with _guard:
            _models[key] = value
        return value


def clear_shared_models() -> None:
    """Forget every cached model (tests; freeing memory)."""
    with _guard:
        _models.clear()
        _locks.clear()


def freeze_loaded() -> None:
    """Collect, then move every object alive now (loaded models, imports) out of the garbage
    collector's sight, so that later collections only scan what sessions create. Call once, after
    the models are loaded."""
    gc.collect()
    gc.freeze()


#: glibc's ``mallopt`` parameter for the arena cap
M_ARENA_MAX = -8


def limit_malloc_arenas(count: int | None = None) -> bool:
    """Cap glibc's malloc arenas at ``count`` (default: the cores this process may use, at least 2),
    unless ``MALLOC_ARENA_MAX`` is set in the environment. Call before the threads that load the
    models start. Does nothing off glibc.

    Returns:
        True if the cap was set.
    """
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    if count is None:
        try:
            count = len(os.sched_getaffinity(0))
        except AttributeError:
            count = os.cpu_count() or 2
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_ARENA_MAX, max(2, count)))


_malloc_trim: Any = None


def _any_alive(idents: Collection[int]) -> bool:
    return bool(idents) and any(thread.ident in idents for thread in threading.enumerate())


def wait_for_threads(idents: Collection[int], timeout_s: float = 10.0) -> bool:
    """Wait until none of the threads ``idents`` (thread idents) is alive, at most ``timeout_s`` s.

    Returns:
        True if they all ended in time.
    """
    deadline = time.monotonic() + timeout_s
    while _any_alive(idents) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _any_alive(idents)


def release_memory(threads: Collection[int] = (), timeout_s: float = 10.0) -> int:
    """Free unreachable objects now and return free heap memory to the system (after a session
    closed). On glibc, ``malloc_trim(0)`` releases free pages of every malloc arena; elsewhere only
    the collection runs.

    Args:
        threads: idents of threads to wait for first (at most ``timeout_s``): a session's stage
            threads reach the session, so it is only garbage once they have ended. Idents, not
            thread objects, so that nothing here keeps the session alive.
        timeout_s: the longest wait for them, s.

    Returns:
        The number of unreachable objects found.
    """
    wait_for_threads(threads, timeout_s)
    global _malloc_trim
    found = gc.collect()
    if _malloc_trim is None:
        _malloc_trim = False
        if sys.platform.startswith("linux"):
            try:
                _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
                _malloc_trim.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):  # not glibc (e.g. musl has no malloc_trim)
                logger.debug("malloc_trim is not available; free heap pages stay with the process")
    if _malloc_trim:
        _malloc_trim(0)
    return found
