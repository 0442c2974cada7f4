"""The prefill from partial transcripts gives way to critical work and then finishes its prompt
(handlers/llm/partial_prefill.py), on an engine that records what it evaluated."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from handlers.llm.partial_prefill import AFTER_CRITICAL_S, STEP_TOKENS, PartialPrefill
from speech_to_speech.core.priority import CRITICAL


class StepEngine:
    """A KV cache as a list of tokens; each step of evaluation waits until the test lets it go."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cache: list[int] = []
        self.wanted = False
        self.steps = threading.Semaphore(0)  # one release: one step may run
        self.stepped = threading.Event()

    def tokenize(self, prompt: str) -> list[int]:
        return [ord(c) for c in prompt]

    def evaluate_ahead(self, tokens: list[int], step: int = 0, may_continue: Callable[[], bool] | None = None) -> int:
        common = next((i for i, (a, b) in enumerate(zip(self.cache, tokens, strict=False)) if a != b), None)
        common = min(len(self.cache), len(tokens)) if common is None else common
        del self.cache[common:]
        evaluated = 0
        for start in range(common, len(tokens), step):
            if start > common and may_continue is not None and not may_continue():
                break
            self.steps.acquire()
            self.cache += tokens[start : start + step]
            evaluated += len(tokens[start : start + step])
            self.stepped.set()
        return evaluated


def test_a_prompt_paused_by_critical_work_is_finished_after_it() -> None:
    engine = StepEngine()
    prompt = "x" * (5 * STEP_TOKENS + 2)  # 5 steps after the held-back tokens
    prefill = PartialPrefill(engine, lambda text: prompt, "test")
    try:
        prefill.submit("")
        engine.steps.release()  # the first step runs...
        assert engine.stepped.wait(5)
        with CRITICAL.running():  # ...then an STT pass starts: no step runs while it does
            for _ in range(4):
                engine.steps.release()
            assert not prefill.wait_idle(0.3)
            # (a step that had passed its check before the pass began may still run)
            assert len(engine.cache) <= 2 * STEP_TOKENS
        assert prefill.wait_idle(5)  # it went on once the pass was done
        assert len(engine.cache) == len(prompt) - 2 and prefill.evaluated_tokens == len(prompt) - 2
    finally:
        prefill.close()


def test_nothing_is_evaluated_while_critical_work_runs() -> None:
    engine = StepEngine()
    prefill = PartialPrefill(engine, lambda text: "z" * (2 * STEP_TOKENS + 2), "test")
    try:
        with CRITICAL.running():
            prefill.submit("")
            for _ in range(2):
                engine.steps.release()
            assert not prefill.wait_idle(0.3) and engine.cache == []
        assert prefill.wait_idle(5) and len(engine.cache) == 2 * STEP_TOKENS
    finally:
        prefill.close()


def test_a_reply_that_wants_the_engine_ends_the_wait() -> None:
    engine = StepEngine()
    prefill = PartialPrefill(engine, lambda text: "y" * (3 * STEP_TOKENS + 2), "test")
    try:
        prefill.submit("")
        engine.steps.release()
        assert engine.stepped.wait(5)
        with CRITICAL.running():
            engine.wanted = True  # the reply goes first; what was evaluated stays
            engine.steps.release()  # (a step that had passed its check before)
            assert prefill.wait_idle(5)
        assert len(engine.cache) <= 2 * STEP_TOKENS
    finally:
        prefill.close()


def test_a_reply_right_after_critical_work_finds_the_engine_free() -> None:
    """The end-of-turn model's verdict is critical work, and the reply to that endpoint asks for
    the engine a few ms later: the prefill waits a moment after critical work before its next step,
    so that the reply does not wait behind it."""
    engine = StepEngine()
    prefill = PartialPrefill(engine, lambda text: "w" * (2 * STEP_TOKENS + 2), "test")
    try:
        with CRITICAL.running():
            prefill.submit("")
            engine.steps.release()  # a step could run at once...
            time.sleep(0.1)
        time.sleep(AFTER_CRITICAL_S / 4)  # ...once the critical work is over, but the reply comes first
        engine.wanted = True
        assert prefill.wait_idle(5)
        assert engine.cache == [] and prefill.evaluated_tokens == 0
    finally:
        prefill.close()
