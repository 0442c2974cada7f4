"""Which thread calls a stage's methods: the check behind "no stage calls another stage's methods".

A stage (a :class:`~speech_to_speech.core.handler.BaseHandler`) owns its thread and the threads
started inside its methods (a provider reader, the partial prefill worker, a prefetch drain,
whichever thread called the method) or by threads it owns. Control reaches it as a message
handled in that thread, or through the gate's stamp (``docs/architecture.md``, "Control").
:class:`ThreadOwnership` patches every method of every stage class while it is entered, and
records each call made, while the stage's thread runs (between its ``setup`` and its end), from a
thread the stage does not own: another stage's, an event loop's, a timer another stage started.
None is allowed.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from speech_to_speech.core.handler import BaseHandler


@dataclass(frozen=True)
class ForeignCall:
    """A stage method called from a thread the stage does not own.

    Attributes:
        stage: the stage's thread name.
        method: ``Class.method``, the class that defines it.
        thread: the calling thread's name.
    """

    stage: str
    method: str
    thread: str


def _stage_classes() -> list[type]:
    """Every :class:`BaseHandler` subclass imported so far (the base included), and the other
    classes they are made of (e.g. the LLM stage's
    :class:`~speech_to_speech.llm.hidden_response.FollowUpAhead`), :class:`threading.Thread` and
    ``object`` left out."""
    found, todo = [], [BaseHandler]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    parts = [base for cls in found for base in cls.__mro__ if base not in (threading.Thread, object)]
    return list(dict.fromkeys([*found, *parts]))


class ThreadOwnership:
    """Records calls of stage methods from threads their stage does not own (a context manager).

    Enter it before the pipeline is built (bus subscriptions made in ``__init__`` must bind the
    patched methods); import the stage classes to watch first (subclasses defined later are not
    patched). Thread-safe.

    Attributes:
        calls: every :class:`ForeignCall`, in order (the same one once).
    """

    #: methods of :class:`threading.Thread` and the life cycle that other threads call by design
    NOT_CHECKED = frozenset(("run", "start", "join", "is_alive", "setup", "cleanup"))

    def __init__(self, parts: tuple[type, ...] = ()) -> None:
        """Args:
        parts: classes of objects a stage holds as attributes and owns with its thread (e.g. the
            LLM stage's :class:`~speech_to_speech.llm.prefetch.PrefetchCoordinator`): their methods
            are watched too, as the holding stage's.
        """
        self.parts = parts
        self._holder: dict[int, BaseHandler] = {}  # id of a part -> the running stage that holds it
        self._scanned: set[int] = set()  # ids of the stages whose parts are known
        self.calls: list[ForeignCall] = []  # each foreign call once
        self.checked = 0  # calls of running stages' methods watched (a sanity count)
        self._lock = threading.Lock()
        self._owner: dict[threading.Thread, threading.Thread] = {}  # a started thread -> its stage
        self._patched: list[tuple[type, str, Any]] = []
        self._local = threading.local()  # per thread: the stages whose methods are running in it

    def owner(self, thread: threading.Thread) -> threading.Thread | None:
        """The stage that owns ``thread`` (itself, if it is a stage), or None."""
        with self._lock:
            seen: set[threading.Thread] = set()
            while thread not in seen:
                if isinstance(thread, BaseHandler):
                    return thread
                seen.add(thread)
                parent = self._owner.get(thread)
                if parent is None:
                    return None
                thread = parent
            return None

    def __enter__(self) -> ThreadOwnership:
        original_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            inside = getattr(self._local, "stages", None)
            with self._lock:  # started inside a stage's method: the stage's worker, whoever called it
                self._owner[thread] = inside[-1] if inside else threading.current_thread()
            original_start(thread)

        self._patch(threading.Thread, "start", original_start, start)
        thread_names = set(vars(threading.Thread))
        for cls in _stage_classes():
            for name, function in list(vars(cls).items()):
                if name.startswith("__") or name in self.NOT_CHECKED or name in thread_names:
                    continue
                if inspect.isfunction(function):
                    self._patch(cls, name, function, self._checked(cls, name, function))
        for cls in self.parts:
            for name, function in list(vars(cls).items()):
                if not name.startswith("__") and inspect.isfunction(function):
                    self._patch(cls, name, function, self._part_checked(cls, name, function))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in reversed(self._patched):
            setattr(cls, name, original)
        self._patched.clear()

    def _patch(self, cls: type, name: str, original: Any, replacement: Any) -> None:
        self._patched.append((cls, name, original))
        setattr(cls, name, replacement)

    def _checked(self, cls: type, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        label = f"{cls.__name__}.{name}"

        @functools.wraps(function)
        def checked(stage: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(stage, BaseHandler):
                return function(stage, *args, **kwargs)
            ready = getattr(stage, "ready", None)
            if ready is not None and ready.is_set() and stage.is_alive():
                self.checked += 1
                self._find_parts(stage)
                caller = threading.current_thread()
                if self.owner(caller) is not stage:
                    self._record(ForeignCall(stage.name, label, caller.name))
            inside = self._local.__dict__.setdefault("stages", [])
            inside.append(stage)
            try:
                return function(stage, *args, **kwargs)
            finally:
                inside.pop()

        return checked

    def _find_parts(self, stage: BaseHandler) -> None:
        """Note which watched parts ``stage`` holds (once, when it runs)."""
        if id(stage) in self._scanned or not self.parts:
            return
        self._scanned.add(id(stage))
        for value in list(vars(stage).values()):
            if isinstance(value, self.parts):
                self._holder[id(value)] = stage

    def _part_checked(self, cls: type, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        label = f"{cls.__name__}.{name}"

        @functools.wraps(function)
        def checked(part: Any, *args: Any, **kwargs: Any) -> Any:
            stage = self._holder.get(id(part))
            if stage is not None and stage.is_alive():
                self.checked += 1
                caller = threading.current_thread()
                if self.owner(caller) is not stage:
                    self._record(ForeignCall(stage.name, label, caller.name))
            return function(part, *args, **kwargs)

        return checked

    def _record(self, call: ForeignCall) -> None:
        with self._lock:
            if call not in self.calls:
                self.calls.append(call)

    def report(self) -> Iterator[str]:
        """One line per foreign call: ``stage: Class.method from thread``."""
        for call in list(self.calls):
            yield f"{call.stage}: {call.method} from {call.thread}"
