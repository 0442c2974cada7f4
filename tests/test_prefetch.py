"""Speculative prefetch of the tool follow-up: the transaction, the bounded stream, the coordinator."""

from __future__ import annotations

import threading

import pytest

from speech_to_speech.llm.chat import Chat
from speech_to_speech.llm.prefetch import (
    PrefetchCoordinator,
    PrefetchState,
    ResponsePrefetchTransaction,
    fingerprint_of,
)

WAIT = 5.0  # seconds; only ever an upper bound on waiting for an Event or a thread


class Recorder:
    """Counts calls of named callbacks, in order, from any thread."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def cb(self, name: str):
        def callback() -> None:
            with self._lock:
                self.calls.append(name)

        return callback

    def count(self, name: str) -> int:
        with self._lock:
            return self.calls.count(name)


def failing() -> None:
    raise RuntimeError("cleanup failed")


def txn_with_callbacks(rec: Recorder, key: str = "resp_1") -> ResponsePrefetchTransaction:
    txn = ResponsePrefetchTransaction(key, {})
    txn.register_abort(rec.cb("abort"))
    txn.on_rollback(rec.cb("rollback"))
    return txn


# ---------------------------------------------------------------------- transaction: decisions


def test_new_transaction_is_open_and_pending():
    txn = ResponsePrefetchTransaction("resp_1", {"metadata": {"a": 1}})
    assert txn.state is PrefetchState.PENDING
    assert txn.is_open and not txn.is_claimed and not txn.is_discarded
    assert txn.key == "resp_1"
    assert txn.fingerprint == {}  # metadata is not part of the fingerprint
    assert txn.wait_claimed_or_discarded(0.01) is PrefetchState.PENDING


def test_claim_after_complete_runs_deferred_cleanup_exactly_once():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    txn.complete(rec.cb("cleanup"))
    assert rec.calls == []  # deferred: nobody asked for the response yet
    assert txn.state is PrefetchState.COMPLETED and txn.is_open

    assert txn.claim() is True
    assert rec.calls == ["cleanup"]
    assert txn.state is PrefetchState.CLAIMED and txn.is_claimed and not txn.is_open

    assert txn.claim() is False  # a second claim neither wins nor re-runs the cleanup
    assert txn.discard("late") is False
    assert rec.calls == ["cleanup"]
    assert txn.wait_claimed_or_discarded(0) is PrefetchState.CLAIMED


def test_claim_runs_the_claimers_cleanup_after_the_deferred_one():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    txn.complete(rec.cb("deferred"))
    assert txn.claim(rec.cb("claimer")) is True
    assert rec.calls == ["deferred", "claimer"]


def test_complete_after_claim_runs_cleanup_immediately():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    assert txn.claim() is True
    assert rec.calls == []
    txn.complete(rec.cb("cleanup"))
    assert rec.calls == ["cleanup"]
    assert txn.state is PrefetchState.CLAIMED


def test_complete_twice_is_an_error():
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.complete(lambda: None)
    with pytest.raises(RuntimeError):
        txn.complete(lambda: None)


def test_discard_after_complete_runs_rollback_and_never_cleanup():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    txn.complete(rec.cb("cleanup"))
    assert txn.discard("conversation.item.create") is True
    assert rec.calls == ["abort", "rollback"]
    assert txn.state is PrefetchState.DISCARDED and txn.is_discarded and not txn.is_open
    assert txn.discard_reason == "conversation.item.create"

    assert txn.claim() is False
    assert txn.discard("again") is False
    assert rec.calls == ["abort", "rollback"]  # nothing ran twice, cleanup never


def test_complete_after_discard_never_runs_cleanup():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    assert txn.discard("session.update") is True
    txn.complete(rec.cb("cleanup"))
    assert txn.claim() is False
    assert rec.count("cleanup") == 0
    assert txn.state is PrefetchState.DISCARDED


def test_claim_after_discard_returns_false():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    assert txn.discard("vad interruption") is True
    assert txn.claim(rec.cb("claimer")) is False
    assert rec.count("claimer") == 0
    assert txn.state is PrefetchState.DISCARDED


def test_discard_after_claim_does_nothing():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    assert txn.claim() is True
    assert txn.discard("too late") is False
    assert rec.calls == []
    assert txn.state is PrefetchState.CLAIMED
    assert txn.discard_reason is None


def test_failing_deferred_cleanup_turns_the_claim_into_a_discard():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    txn.complete(failing)
    assert txn.claim() is False
    assert txn.state is PrefetchState.DISCARDED
    assert txn.discard_reason == "claim cleanup failed"
    assert rec.calls == ["abort", "rollback"]
    assert txn.wait_claimed_or_discarded(0) is PrefetchState.DISCARDED
    assert txn.claim() is False  # permanently unclaimable


def test_failing_claimer_cleanup_also_turns_the_claim_into_a_discard():
    rec = Recorder()
    txn = txn_with_callbacks(rec)
    assert txn.claim(failing) is False
    assert txn.state is PrefetchState.DISCARDED
    assert rec.calls == ["abort", "rollback"]


def test_abort_callbacks_run_once_on_discard():
    rec = Recorder()
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.register_abort(rec.cb("abort1"))
    txn.register_abort(rec.cb("abort2"))
    txn.discard("failure")
    txn.discard("failure again")
    assert rec.calls == ["abort1", "abort2"]


def test_abort_registered_after_discard_runs_immediately_once():
    rec = Recorder()
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.discard("session.update")
    txn.register_abort(rec.cb("abort"))
    assert rec.calls == ["abort"]
    txn.discard("again")
    assert rec.calls == ["abort"]


def test_rollback_registered_after_discard_runs_immediately():
    rec = Recorder()
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.discard("session.update")
    txn.on_rollback(rec.cb("rollback"))
    assert rec.calls == ["rollback"]


def test_callbacks_registered_after_claim_never_run():
    rec = Recorder()
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.claim()
    txn.register_abort(rec.cb("abort"))
    txn.on_rollback(rec.cb("rollback"))
    txn.discard("late")
    assert rec.calls == []


def test_a_failing_abort_does_not_stop_the_rollback():
    rec = Recorder()
    txn = ResponsePrefetchTransaction("resp_1", {})
    txn.register_abort(failing)
    txn.register_abort(rec.cb("abort"))
    txn.on_rollback(rec.cb("rollback"))
    assert txn.discard("failure") is True  # the error is logged, not raised
    assert rec.calls == ["abort", "rollback"]


def test_wait_claimed_or_discarded_wakes_a_waiting_worker():
    txn = ResponsePrefetchTransaction("resp_1", {})
    seen: list[PrefetchState] = []
    done = threading.Event()

    def worker() -> None:
        seen.append(txn.wait_claimed_or_discarded(WAIT))
        done.set()

    threading.Thread(target=worker, daemon=True).start()
    assert not done.wait(0.05)  # undecided: the worker keeps waiting
    assert txn.claim() is True
    assert done.wait(WAIT)
    assert seen == [PrefetchState.CLAIMED]


# ---------------------------------------------------------------------- transaction: matching


def test_matches_ignores_metadata_but_not_other_fields():
    txn = ResponsePrefetchTransaction("resp_1", {"metadata": {"source": "prefetch"}})
    assert txn.matches(None)
    assert txn.matches({})
    assert txn.matches({"metadata": {"client": "x"}})
    assert not txn.matches({"instructions": "be brief"})
    assert not txn.matches({"tool_choice": "none", "metadata": {}})
    assert not txn.matches({"tools": []})
    assert not txn.matches("not a dict")  # type: ignore[arg-type]


def test_matches_with_a_non_empty_fingerprint():
    fingerprint = {"modalities": ["text"], "metadata": {"a": 1}}
    txn = ResponsePrefetchTransaction("resp_1", fingerprint)
    fingerprint["modalities"].append("audio")  # the transaction keeps its own copy
    assert txn.fingerprint == {"modalities": ["text"]}
    assert txn.matches({"modalities": ["text"], "metadata": {"b": 2}})
    assert not txn.matches({})
    assert not txn.matches({"modalities": ["text", "audio"]})
    assert fingerprint_of({"metadata": 1, "x": 2}) == {"x": 2}


def test_fingerprint_must_be_a_dict():
    with pytest.raises(TypeError):
        ResponsePrefetchTransaction("resp_1", None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- transaction: races


@pytest.mark.parametrize("completed_first", [False, True])
def test_concurrent_claim_and_discard_exactly_one_wins(completed_first):
    for i in range(300):
        rec = Recorder()
        txn = txn_with_callbacks(rec, key=f"resp_{i}")
        if completed_first:
            txn.complete(rec.cb("cleanup"))
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def claimer(txn=txn, results=results, barrier=barrier) -> None:
            barrier.wait(WAIT)
            results["claim"] = txn.claim()

        def discarder(txn=txn, results=results, barrier=barrier) -> None:
            barrier.wait(WAIT)
            results["discard"] = txn.discard("race")

        threads = [threading.Thread(target=claimer), threading.Thread(target=discarder)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive()

        assert results["claim"] != results["discard"], results  # exactly one, never both
        if results["claim"]:
            assert txn.state is PrefetchState.CLAIMED
            assert rec.count("abort") == 0 and rec.count("rollback") == 0
            assert rec.count("cleanup") == (1 if completed_first else 0)
        else:
            assert txn.state is PrefetchState.DISCARDED
            assert rec.count("abort") == 1 and rec.count("rollback") == 1
            assert rec.count("cleanup") == 0


def test_concurrent_complete_and_claim_runs_cleanup_exactly_once():
    for _ in range(300):
        rec = Recorder()
        txn = ResponsePrefetchTransaction("resp", {})
        barrier = threading.Barrier(2)
        t1 = threading.Thread(target=lambda b=barrier, t=txn, r=rec: (b.wait(WAIT), t.complete(r.cb("cleanup"))))
        t2 = threading.Thread(target=lambda b=barrier, t=txn: (b.wait(WAIT), t.claim()))
        t1.start()
        t2.start()
        t1.join(WAIT)
        t2.join(WAIT)
        assert txn.state is PrefetchState.CLAIMED
        assert rec.count("cleanup") == 1


# ---------------------------------------------------------------------- coordinator


def test_coordinator_allows_one_worker_at_a_time():
    coordinator = PrefetchCoordinator()
    first = coordinator.try_start("resp_1", {})
    assert first is not None and coordinator.running is first
    assert coordinator.try_start("resp_2", {}) is None  # the slot is taken
    coordinator.finished(first)
    assert coordinator.running is None
    second = coordinator.try_start("resp_2", {})
    assert second is not None
    coordinator.finished(second)


def test_coordinator_finished_is_idempotent_and_never_over_releases():
    coordinator = PrefetchCoordinator()
    first = coordinator.try_start("resp_1", {})
    assert first is not None
    coordinator.finished(first)
    coordinator.finished(first)  # no error (a BoundedSemaphore would raise on over-release)
    second = coordinator.try_start("resp_2", {})
    assert second is not None
    coordinator.finished(first)  # a stale call must not free the second worker's slot
    assert coordinator.try_start("resp_3", {}) is None
    coordinator.finished(second)
    assert coordinator.try_start("resp_3", {}) is not None


def test_coordinator_one_worker_under_contention():
    coordinator = PrefetchCoordinator()
    started: list[ResponsePrefetchTransaction] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait(WAIT)
        txn = coordinator.try_start(f"resp_{i}", {})
        if txn is not None:
            with lock:
                started.append(txn)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(started) == 1


def test_coordinator_take_for_claims_a_matching_open_transaction():
    rec = Recorder()
    coordinator = PrefetchCoordinator()
    txn = coordinator.try_start("resp_1", {})
    assert txn is not None
    txn.complete(rec.cb("cleanup"))
    coordinator.finished(txn)  # the worker is done; the transaction stays claimable
    assert coordinator.open_transaction is txn

    assert coordinator.take_for({"metadata": {"x": 1}}) is txn
    assert txn.is_claimed and rec.calls == ["cleanup"]
    assert coordinator.open_transaction is None
    assert coordinator.take_for(None) is None  # taken once only


def test_coordinator_take_for_with_overrides_discards():
    rec = Recorder()
    coordinator = PrefetchCoordinator()
    txn = coordinator.try_start("resp_1", {})
    assert txn is not None
    txn.on_rollback(rec.cb("rollback"))
    assert coordinator.take_for({"instructions": "shout"}) is None
    assert txn.is_discarded and rec.calls == ["rollback"]
    assert coordinator.take_for(None) is None


def test_coordinator_take_for_returns_none_when_the_claim_cleanup_fails():
    coordinator = PrefetchCoordinator()
    txn = coordinator.try_start("resp_1", {})
    assert txn is not None
    txn.complete(failing)
    assert coordinator.take_for(None) is None
    assert txn.is_discarded


def test_coordinator_new_start_supersedes_an_open_transaction():
    coordinator = PrefetchCoordinator()
    old = coordinator.try_start("resp_1", {})
    assert old is not None
    old.complete(lambda: None)
    coordinator.finished(old)
    new = coordinator.try_start("resp_2", {})
    assert new is not None
    assert old.is_discarded and old.discard_reason == "superseded"
    assert coordinator.open_transaction is new


def test_coordinator_discard_open_rolls_back_history():
    chat = Chat(size=8)
    chat.add_item({"type": "message", "role": "user", "content": "what's the weather?"})
    chat.add_item({"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"})
    chat.add_item({"type": "function_call_output", "call_id": "c1", "output": "sunny"})
    before = chat.items()

    coordinator = PrefetchCoordinator()
    txn = coordinator.try_start("resp_prefetch", {})
    assert txn is not None
    txn.on_rollback(lambda: chat.rollback_provisional_generation(txn.key))
    chat.add_provisional_generation_items(
        txn.key, [{"type": "message", "role": "assistant", "content": "It is sunny."}]
    )
    assert len(chat.items()) == len(before) + 1

    coordinator.discard_open("conversation.item.create")
    assert txn.is_discarded and txn.discard_reason == "conversation.item.create"
    assert chat.items() == before
    assert coordinator.open_transaction is None
    assert coordinator.take_for(None) is None
    coordinator.discard_open("nothing open")  # no-op
    coordinator.finished(txn)
