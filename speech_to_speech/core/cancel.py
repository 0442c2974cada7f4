"""Validity of in-flight work: cancel generations, turn revisions and the emit gate.

Every message between stages carries a :class:`Stamp` taken when its work was
created. Before any side effect (putting a message on a queue, publishing an
event, playing audio) the emitter asks the shared :class:`Gate` whether the stamp
is still valid. Two things make a stamp stale:

* the :class:`CancelScope` generation moved on (barge-in, session reset), or
* the :class:`TurnTracker` has seen a newer revision of the same turn (the user
  kept speaking after an endpoint, so the turn was re-transcribed).

:meth:`Gate.cancel` can keep some turns out of a cancel: the user's speech that
caused it (a real interruption, decided only once its words are known) is carried
over to the new generation, so its transcript and reply stay valid.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass


class MessageKind(enum.Enum):
    """How a message on a stage queue behaves when work is cancelled (see :mod:`core.messages`).

    ``DATA``: work for one turn (audio, a transcript, a sentence): dropped once its stamp is stale.
    ``END``: the end of a response: never dropped, so that every response ends exactly once.
    ``CONTROL``: changes how stages behave (a setting, an interruption, the end of the stream):
    carries no stamp, is never stale, and each stage applies it in its own thread, in order.
    """

    DATA = "data"
    END = "end"
    CONTROL = "control"


@dataclass(frozen=True)
class Stamp:
    """The validity token of one piece of work.

    Attributes:
        turn_id: the user turn this work answers (monotonic, starts at 1).
        revision: revision of that turn (0 for the first transcript).
        generation: the :class:`CancelScope` generation current at creation.
    """

    turn_id: int
    revision: int
    generation: int


class CancelScope:
    """A monotonic generation counter; cancelling bumps it.

    Work stamped with an older generation is stale. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0

    @property
    def generation(self) -> int:
        """The current generation (int, starts at 0)."""
        with self._lock:
            return self._generation

    def cancel(self) -> int:
        """Invalidate all work created so far and return the new generation."""
        with self._lock:
            self._generation += 1
            return self._generation

    def is_stale(self, generation: int) -> bool:
        """True when ``generation`` is older than the current one."""
        with self._lock:
            return generation != self._generation


class TurnTracker:
    """Hands out turn ids and tracks the newest revision of each turn. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._latest: dict[int, int] = {}

    def new_turn(self) -> int:
        """Open a new turn at revision 0 and return its id."""
        with self._lock:
            turn_id = next(self._ids)
            self._latest[turn_id] = 0
            return turn_id

    def revise(self, turn_id: int) -> int:
        """Create the next revision of ``turn_id``; older revisions become stale.

        Raises:
            KeyError: if the turn was never opened.
        """
        with self._lock:
            revision = self._latest[turn_id] + 1
            self._latest[turn_id] = revision
            return revision

    def latest_revision(self, turn_id: int) -> int | None:
        """The newest revision of ``turn_id``, or None if unknown."""
        with self._lock:
            return self._latest.get(turn_id)

    def is_current(self, turn_id: int, revision: int) -> bool:
        """True when ``revision`` is the newest revision of ``turn_id``.

        Unknown turns (e.g. created outside this tracker) count as current.
        """
        with self._lock:
            latest = self._latest.get(turn_id)
        return latest is None or latest == revision


class Gate:
    """The single check every emit point uses to drop stale work."""

    def __init__(self, scope: CancelScope | None = None, turns: TurnTracker | None = None) -> None:
        self.scope = scope or CancelScope()
        self.turns = turns or TurnTracker()
        self._lock = threading.Lock()
        #: (turn id, generation) -> the generation that work counts as (see :meth:`cancel`)
        self._carried: dict[tuple[int, int], int] = {}

    def cancel(self, keep_turns: Iterable[int] = ()) -> int:
        """Bump the generation: every stamp so far is stale, except those of ``keep_turns``.

        The kept turns' stamps of the current generation count as the new one (so do those
        carried into it by an earlier cancel): the user's speech that caused this cancel
        stays valid, everything else in flight (the reply it interrupts) does not.

        Returns:
            The new generation.
        """
        keep = set(keep_turns)
        with self._lock:
            current = self.scope.generation
            new = current + 1
            carried = {key: target for key, target in self._carried.items() if target >= current}
            for key, target in list(carried.items()):
                if key[0] in keep and target == current:
                    carried[key] = new
            carried.update({(turn, current): new for turn in keep})
            self._carried = carried  # before the bump, so that kept work is never seen stale
            actual = self.scope.cancel()
            if actual != new:  # someone bumped in between (scope.cancel() called directly)
                self._carried = {key: (actual if target == new else target) for key, target in carried.items()}
            return actual

    def stamp(self, turn_id: int, revision: int = 0) -> Stamp:
        """A stamp for new work on ``turn_id``/``revision`` at the current generation."""
        return Stamp(turn_id, revision, self.scope.generation)

    def new_turn_stamp(self) -> Stamp:
        """Open a new turn and return the stamp of its revision 0."""
        return self.stamp(self.turns.new_turn(), 0)

    def admits(self, stamp: Stamp | None) -> bool:
        """True when work with ``stamp`` may still have side effects.

        A ``None`` stamp (control messages) is always admitted.
        """
        if stamp is None:
            return True
        generation = self._carried.get((stamp.turn_id, stamp.generation), stamp.generation)
        if self.scope.is_stale(generation):
            return False
        return self.turns.is_current(stamp.turn_id, stamp.revision)

    def drops(self, item: object) -> bool:
        """True when ``item`` is stale work to drop: a ``DATA`` message (:class:`MessageKind`; anything
        without a ``kind`` counts as data) whose stamp the gate no longer admits."""
        if getattr(item, "kind", MessageKind.DATA) is not MessageKind.DATA:
            return False
        return not self.admits(getattr(item, "stamp", None))
