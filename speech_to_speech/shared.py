"""Process-wide sharing of loaded models.

In server mode every session has its own stages and state, but the models
behind them are loaded once and shared. Backends load through
:func:`shared_model`; in local mode it simply loads once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

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
