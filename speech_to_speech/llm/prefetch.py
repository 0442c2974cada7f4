"""Speculative prefetch of the tool follow-up response.

When a client answers every pending tool call, it almost always asks for a response next. Rather than
wait for that ``response.create``, the follow-up generation can start at once, *hidden*: nothing is
announced and nothing reaches TTS or the client. A later plain ``response.create`` (no overrides
other than ``metadata``) *claims* it and the output produced so far flows at once; any other event
that changes the context (``session.update``, ``conversation.item.create``, a new transcription, a
VAD interruption, a failure) *discards* it as if it never happened.

The hard part is discarding cleanly. A hidden generation has three kinds of side effects:

* provisional history items: undoable, so a discard runs the *rollback* callback(s);
* irreversible history work (stripping images, trimming or summarising old turns): must not happen
  for a response nobody asked for, so the worker hands it to :meth:`ResponsePrefetchTransaction.complete`
  and it is *deferred* until the claim (and dropped on discard);
* an open provider connection: a discard runs the *abort* callback(s) to close it.

Two classes (the held events and outputs are the LLM stage's
:class:`~speech_to_speech.llm.hidden_response.HiddenResponse`):

* :class:`ResponsePrefetchTransaction`: the decision (claimed or discarded), taken once, atomically,
  under one lock;
* :class:`PrefetchCoordinator`: one per session; at most one prefetch worker at a time and the
  session's open (claimable) transaction.
"""

from __future__ import annotations

import copy
import enum
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: the one ``response.create`` field a claim ignores: it does not change what the model generates
IGNORED_FINGERPRINT_FIELDS = frozenset({"metadata"})


def fingerprint_of(response_options: dict | None) -> dict:
    """The part of ``response.create`` options that decides what is generated (all but ``metadata``).

    Args:
        response_options: the ``response`` object of a ``response.create`` event, or ``None``.

    Returns:
        A deep copy of the options without the ignored fields; ``{}`` for ``None``.

    Raises:
        TypeError: ``response_options`` is neither a dict nor ``None``.
    """
    if response_options is None:
        return {}
    if not isinstance(response_options, dict):
        raise TypeError(f"response options must be a dict or None, got {type(response_options).__name__}")
    return {k: copy.deepcopy(v) for k, v in response_options.items() if k not in IGNORED_FINGERPRINT_FIELDS}


class PrefetchState(enum.Enum):
    """Where a :class:`ResponsePrefetchTransaction` stands.

    ``PENDING`` and ``COMPLETED`` are open (claimable); ``CLAIMED`` and ``DISCARDED`` are decisions
    and final. ``COMPLETED`` means the hidden generation finished before anyone decided; its cleanup
    is deferred until the decision.
    """

    PENDING = "pending"
    CLAIMED = "claimed"
    DISCARDED = "discarded"
    COMPLETED = "completed"


_OPEN_STATES = (PrefetchState.PENDING, PrefetchState.COMPLETED)

#: what a discard has to run once decided: (abort callbacks, rollback callbacks)
_Undo = tuple[list[Callable[[], None]], list[Callable[[], None]]]


def _run_callbacks(callbacks: list[Callable[[], None]], what: str, key: str) -> None:
    """Run each callback once; log (never raise) a failure so the others still run."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logger.exception("prefetch %s: %s callback failed", key, what)


class ResponsePrefetchTransaction:
    """One hidden, speculative follow-up response. One lock guards the state; three end states.

    The transaction starts ``PENDING``. Exactly one of :meth:`claim` and :meth:`discard` wins; the
    decision is taken under the lock, so two threads racing never both succeed. The hidden
    generation reports its end with :meth:`complete`, which moves an undecided transaction to
    ``COMPLETED`` and defers its cleanup: the cleanup runs on the claim, never on a discard.

    End states:

    * ``CLAIMED``: a matching ``response.create`` took it; its output is public from now on.
    * ``DISCARDED``: anything else happened (or the claim's deferred cleanup failed); its abort and
      rollback callbacks ran, its cleanup never runs.
    * ``COMPLETED``: the generation finished and waits, still claimable, for the decision.

    Callbacks (abort, rollback, cleanup) must not wait on another thread that uses this transaction.
    The claim's cleanups run under the lock (so that a failing cleanup turns the claim into a discard
    with no moment where it looked claimed); abort and rollback callbacks run outside it, after the
    decision. A failing abort or rollback callback is logged and the others still run.

    Attributes:
        key: identifies the response (e.g. the response key its history writes use).
        discard_reason: why it was discarded, or ``None``.
    """

    def __init__(self, key: str, request_fingerprint: dict) -> None:
        """Create an open (``PENDING``) transaction.

        Args:
            key: identifies the hidden response (e.g. its response key in the chat history).
            request_fingerprint: the ``response.create`` options that may claim it; ``metadata`` is
                ignored (removed here), every other field must match exactly. ``{}`` for a plain
                ``response.create``.

        Raises:
            TypeError: ``request_fingerprint`` is not a dict.
        """
        if not isinstance(request_fingerprint, dict):
            raise TypeError(f"request_fingerprint must be a dict, got {type(request_fingerprint).__name__}")
        self.key = key
        self._fingerprint = fingerprint_of(request_fingerprint)
        self._lock = threading.RLock()
        self._decided = threading.Event()
        self._state = PrefetchState.PENDING
        self._completed = False
        self._deferred_cleanup: Callable[[], None] | None = None
        self._aborts: list[Callable[[], None]] = []
        self._rollbacks: list[Callable[[], None]] = []
        self.discard_reason: str | None = None

    def __repr__(self) -> str:
        return f"ResponsePrefetchTransaction(key={self.key!r}, state={self.state.name})"

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> PrefetchState:
        """The current state (see :class:`PrefetchState`)."""
        with self._lock:
            return self._state

    @property
    def fingerprint(self) -> dict:
        """A copy of the options (without ``metadata``) that claim this transaction."""
        return copy.deepcopy(self._fingerprint)

    @property
    def is_claimed(self) -> bool:
        """True once a claim succeeded."""
        return self.state is PrefetchState.CLAIMED

    @property
    def is_discarded(self) -> bool:
        """True once discarded (directly, or because the claim's cleanup failed)."""
        return self.state is PrefetchState.DISCARDED

    @property
    def is_open(self) -> bool:
        """True while neither claimed nor discarded (``PENDING`` or ``COMPLETED``)."""
        return self.state in _OPEN_STATES

    def matches(self, response_options: dict | None) -> bool:
        """Whether a ``response.create`` with these options may claim this transaction.

        ``metadata`` is ignored (it does not change the output); any other difference (instructions,
        tools, tool_choice, modalities, …) means a fresh generation is needed. ``None`` counts as no
        options. Anything that is not a dict or ``None`` never matches.
        """
        try:
            return fingerprint_of(response_options) == self._fingerprint
        except TypeError:
            return False

    def wait_claimed_or_discarded(self, timeout: float | None = None) -> PrefetchState:
        """Block until the transaction is claimed or discarded, or ``timeout`` seconds passed.

        For the hidden worker and for gates downstream (e.g. TTS must not start on a response that
        may still be thrown away).

        Returns:
            The state: ``CLAIMED`` or ``DISCARDED`` once decided; ``PENDING`` or ``COMPLETED`` on
            timeout.
        """
        self._decided.wait(timeout)
        return self.state

    # ------------------------------------------------------------------ registration

    def register_abort(self, abort: Callable[[], None]) -> None:
        """Register how to stop the hidden generation (e.g. close the provider stream).

        Abort callbacks run once, on discard. Registered after the discard, ``abort`` runs at once (in
        this thread). Registered after the claim, it is dropped: the response is public and stopping
        it is ordinary cancellation's job.

        Errors raised by ``abort`` are logged, never raised.
        """
        with self._lock:
            if self._state in _OPEN_STATES:
                self._aborts.append(abort)
                return
            run_now = self._state is PrefetchState.DISCARDED
        if run_now:
            _run_callbacks([abort], "abort", self.key)

    def on_rollback(self, rollback: Callable[[], None]) -> None:
        """Register how to undo this transaction's history writes (e.g. roll back its response key).

        Rollback callbacks run once, on discard (after the abort callbacks). Registered after the
        discard, ``rollback`` runs at once, so a write racing behind the discard is still undone.
        Registered after the claim, it is dropped.

        Errors raised by ``rollback`` are logged, never raised.
        """
        with self._lock:
            if self._state in _OPEN_STATES:
                self._rollbacks.append(rollback)
                return
            run_now = self._state is PrefetchState.DISCARDED
        if run_now:
            _run_callbacks([rollback], "rollback", self.key)

    # ------------------------------------------------------------------ decisions

    def complete(self, cleanup: Callable[[], None]) -> None:
        """Report that the hidden generation finished, with its irreversible cleanup.

        * already claimed: ``cleanup`` runs now, in this thread;
        * already discarded: nothing happens; ``cleanup`` never runs;
        * undecided: the state becomes ``COMPLETED`` and ``cleanup`` is kept for the decision: the
          claim runs it, a discard drops it (and runs the rollback instead).

        Args:
            cleanup: irreversible history work that only a response that was asked for may do
                (e.g. stripping images, trimming or compacting history, finalizing its items).

        Raises:
            RuntimeError: ``complete`` was already called for this transaction.
            Exception: whatever ``cleanup`` raises when it runs now (the transaction stays claimed).
        """
        with self._lock:
            if self._completed:
                raise RuntimeError(f"prefetch {self.key}: complete() called twice")
            self._completed = True
            if self._state is PrefetchState.DISCARDED:
                return
            if self._state is PrefetchState.PENDING:
                self._deferred_cleanup = cleanup
                self._state = PrefetchState.COMPLETED
                return
        cleanup()  # claimed

    def claim(self, deferred_cleanup: Callable[[], None] | None = None) -> bool:
        """Claim the transaction for a matching ``response.create``: its output becomes public.

        Succeeds only while open (``PENDING`` or ``COMPLETED``). It runs, atomically with the
        decision, the cleanup deferred by :meth:`complete` (if any) and then ``deferred_cleanup``
        (if given). If either raises, the claim turns into a discard (abort and rollback callbacks
        run, reason ``"claim cleanup failed"``) and ``False`` is returned: the caller then generates
        as if there had been no prefetch. A second claim returns ``False``.

        Args:
            deferred_cleanup: extra irreversible work of the claimer to do as part of the claim.

        Returns:
            True if this call claimed it; False if it was already claimed or discarded, or the
            cleanup failed.
        """
        with self._lock:
            if self._state not in _OPEN_STATES:
                return False
            cleanups = [c for c in (self._deferred_cleanup, deferred_cleanup) if c is not None]
            self._deferred_cleanup = None
            try:
                for cleanup in cleanups:
                    cleanup()
            except Exception:
                logger.warning("prefetch %s: deferred cleanup failed on claim; discarding", self.key, exc_info=True)
                undo = self._discard_locked("claim cleanup failed")
            else:
                if self._state not in _OPEN_STATES:  # a cleanup discarded it re-entrantly
                    return False
                self._state = PrefetchState.CLAIMED
                self._aborts.clear()
                self._rollbacks.clear()
                self._decided.set()
                return True
        self._run_undo(undo)
        return False

    def discard(self, reason: str) -> bool:
        """Throw the hidden response away, as if it never happened.

        Unless already claimed or discarded: the state becomes ``DISCARDED``, the deferred cleanup is
        dropped (never run), then every abort callback and every rollback callback runs once, in this
        thread, before this returns.

        Args:
            reason: why (for logs), e.g. ``"session.update"``, ``"conversation.item.create"``.

        Returns:
            True if this call discarded it; False if it was already claimed or discarded.
        """
        with self._lock:
            undo = self._discard_locked(reason)
        if undo is None:
            return False
        self._run_undo(undo)
        return True

    def _discard_locked(self, reason: str) -> _Undo | None:
        """Decide the discard (lock held); return the abort and rollback callbacks to run, or None."""
        if self._state not in _OPEN_STATES:
            return None
        self._state = PrefetchState.DISCARDED
        self.discard_reason = reason
        self._deferred_cleanup = None
        aborts, self._aborts = self._aborts, []
        rollbacks, self._rollbacks = self._rollbacks, []
        self._decided.set()
        logger.debug("prefetch %s discarded: %s", self.key, reason)
        return aborts, rollbacks

    def _run_undo(self, undo: _Undo | None) -> None:
        """Run the callbacks returned by :meth:`_discard_locked` (lock not held): aborts, then rollbacks."""
        if undo is None:
            return
        aborts, rollbacks = undo
        _run_callbacks(aborts, "abort", self.key)
        _run_callbacks(rollbacks, "rollback", self.key)


class PrefetchCoordinator:
    """One per session: at most one prefetch worker at a time, and the session's open transaction.

    The worker slot is a ``threading.BoundedSemaphore(1)``: a prefetch holds an extra provider
    connection, and speculation must not multiply them. A started transaction holds the slot until
    :meth:`finished`, which its worker calls exactly once when it exits (extra calls are ignored).

    The open transaction is the one the next plain ``response.create`` may claim (:meth:`take_for`).
    It stays open after its worker finished (a ``COMPLETED`` transaction waits for its claim) and is
    forgotten once claimed or discarded. Transaction callbacks never run under this object's lock.
    """

    def __init__(self) -> None:
        self._slot = threading.BoundedSemaphore(1)
        self._lock = threading.Lock()
        self._running: ResponsePrefetchTransaction | None = None
        self._open: ResponsePrefetchTransaction | None = None

    @property
    def running(self) -> ResponsePrefetchTransaction | None:
        """The transaction whose worker holds the slot, if any."""
        with self._lock:
            return self._running

    @property
    def open_transaction(self) -> ResponsePrefetchTransaction | None:
        """The session's claimable transaction, if any."""
        with self._lock:
            txn = self._open
        return txn if txn is not None and txn.is_open else None

    def try_start(self, key: str, fingerprint: dict) -> ResponsePrefetchTransaction | None:
        """Start a prefetch if the worker slot is free.

        A transaction still open from an earlier prefetch is discarded (reason ``"superseded"``): the
        new one was made from a newer history.

        Args:
            key: the new transaction's key.
            fingerprint: the ``response.create`` options that may claim it (see
                :class:`ResponsePrefetchTransaction`).

        Returns:
            The new, open transaction (which now holds the slot: call :meth:`finished` when its
            worker exits), or ``None`` when a worker is already running.

        Raises:
            TypeError: ``fingerprint`` is not a dict (the slot is not taken then).
        """
        if not self._slot.acquire(blocking=False):
            return None
        try:
            txn = ResponsePrefetchTransaction(key, fingerprint)
        except BaseException:
            self._slot.release()
            raise
        with self._lock:
            previous, self._open = self._open, txn
            self._running = txn
        if previous is not None:
            previous.discard("superseded")
        return txn

    def finished(self, txn: ResponsePrefetchTransaction) -> None:
        """Release the worker slot held by ``txn``; call once when its worker exits.

        Idempotent: a second call, or a call for a transaction that does not hold the slot, does
        nothing (it never raises and never over-releases). The transaction itself stays as it is
        (a ``COMPLETED`` one remains claimable).
        """
        with self._lock:
            if self._running is not txn:
                return
            self._running = None
            self._slot.release()

    def take_for(
        self, response_options: dict | None, deferred_cleanup: Callable[[], None] | None = None
    ) -> ResponsePrefetchTransaction | None:
        """Claim the open transaction for a ``response.create``, if it matches.

        If the options match (see :meth:`ResponsePrefetchTransaction.matches`), the transaction is
        claimed here (running its deferred cleanup and ``deferred_cleanup``) and returned; its output
        is the response. If they do not match, the request asks for a different response, so the
        open transaction is discarded (reason ``"response.create overrides"``) and ``None`` returned.

        Args:
            response_options: the ``response`` object of the ``response.create``, or ``None``.
            deferred_cleanup: passed to :meth:`ResponsePrefetchTransaction.claim`.

        Returns:
            The claimed transaction, or ``None`` (nothing open, no match, or the claim lost a race
            with a discard or its cleanup failed): then generate normally.
        """
        with self._lock:
            txn = self._open
        if txn is None:
            return None
        if not txn.matches(response_options):
            self._forget(txn)
            txn.discard("response.create overrides")
            return None
        claimed = txn.claim(deferred_cleanup)
        self._forget(txn)
        return txn if claimed else None

    def discard_open(self, reason: str) -> None:
        """Discard the open transaction, if any (rollback and abort run before this returns).

        Call it on every event that changes what the hidden response was based on:
        ``session.update``, ``conversation.item.create``, a new transcription, a VAD interruption, a
        failure of the prefetch itself.
        """
        with self._lock:
            txn, self._open = self._open, None
        if txn is not None:
            txn.discard(reason)

    def _forget(self, txn: ResponsePrefetchTransaction) -> None:
        with self._lock:
            if self._open is txn:
                self._open = None
