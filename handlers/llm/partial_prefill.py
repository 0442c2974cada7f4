"""Prefill from partial transcripts: the user's words are in the KV cache before the turn ends.

While the user speaks, the streaming STT publishes partial transcripts
(:class:`~speech_to_speech.core.events.UserTranscriptDelta`). For each, the prompt the turn will have
(system prompt, history, the user's words so far) is rendered up to the end of those words and
evaluated into llama.cpp's KV cache on a background thread. When the endpoint comes, the real
request shares that prefix (:meth:`LlamaEngine.cached_prefix`), so only the words the partial did
not have, the end of the user message and the assistant header are evaluated: the prompt
processing that would have come after the endpoint happened while the user was still talking.

Rules that keep it harmless:

* Only the latest partial counts: a newer one replaces one not yet evaluated.
* The engine is taken only when free (never waited for): a reply being generated, by this session
  or another sharing the engine, always goes first, and a partial that finds the engine busy is
  skipped. The prompt is evaluated :data:`STEP_TOKENS` tokens at a time, and evaluation stops
  between two steps as soon as a reply wants the engine or a newer partial came, and pauses
  while critical work runs (:data:`~speech_to_speech.core.priority.CRITICAL`: the STT pass after
  an endpoint, the end-of-turn model), going on :data:`AFTER_CRITICAL_S` after it is done (the reply
  to an endpoint just judged asks for the engine then), so that work done ahead never
  delays what the user waits for and is still done (a new system prompt is ~300 tokens, seconds
  of evaluation for the 1.5B).
* The last :data:`HOLD_BACK_TOKENS` tokens of the partial are not evaluated: the last word may
  still grow ("Spai" → "Spain") and BPE may merge it differently with what follows. A partial
  that reads finished (it ends a sentence: ``.``, ``?``, ``!``) is the likely final transcript: its
  whole prompt is evaluated, the end of the user message and the assistant header included
  (``prompt_for`` renders it so), and a request with those words evaluates one token instead of
  ~7 (on 2 cores: ~33 ms instead of ~167 ms for the 1.5B; small batches cost ~22 ms a token).
* A wrong guess costs nothing but the work: the real request re-evaluates from where its tokens
  and the cache part ways.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from speech_to_speech.core.priority import CRITICAL

logger = logging.getLogger(__name__)

#: tokens at the end of a partial transcript's prompt left for the real request (the last word may
#: still change, and its tokens with it)
HOLD_BACK_TOKENS = 2
#: tokens evaluated in one step: the longest that a reply or critical work waits for the engine.
#: Small batches gain little from batching on 2 cores (the 1.5B after a 400-token prefix: 1 token
#: 33 ms, 2 54 ms, 3 76 ms, 8 179 ms, 12 216 ms; 2026-12-04), so a step of 3 costs ~10 % of
#: throughput and bounds the wait at ~80 ms instead of the ~160 ms a reply waited behind 8
#: (the prefill of the last partial, resumed after the end-of-turn model, met the request)
STEP_TOKENS = 3
#: how often a prefill waiting for critical work looks again whether a reply or a newer partial
#: came (then it gives up), s
CRITICAL_POLL_S = 0.02
#: after critical work, the prefill waits this long more before it takes the engine, s. The
#: end-of-turn model's "done" is critical work, and its reply asks for the engine ~20 ms after it
#: (the segment goes through the STT stage first); a step taken in between made the reply wait for
#: it: on a 2-core Intel Xeon, 164 ms behind a 3-token step on the one core left (2026-12-07)
AFTER_CRITICAL_S = 0.04
#: how often that wait looks whether a reply or a newer partial came, s
SETTLE_POLL_S = 0.005


class Engine(Protocol):
    """What the prefill needs of :class:`handlers.llm.llama_cpp_llm.LlamaEngine`."""

    lock: threading.Lock

    def tokenize(self, prompt: str) -> list[int]: ...

    @property
    def wanted(self) -> bool: ...

    def evaluate_ahead(
        self, tokens: list[int], step: int = 0, may_continue: Callable[[], bool] | None = None
    ) -> int: ...


class PartialPrefill:
    """Evaluates the prompt of the turn being spoken into the KV cache, from its partial transcripts.

    Args:
        engine: the shared llama.cpp engine.
        prompt_for: the prompt text up to the end of the user's words so far, for a partial
            transcript, or the whole prompt of the request when the text reads finished (see
            :func:`reads_finished`); None: nothing to evaluate. Called on the prefill thread.
        name: thread name prefix.

    Attributes:
        evaluated_tokens: tokens evaluated ahead in all (for statistics and tests).
        skipped_busy: partials skipped because the engine was busy.
    """

    def __init__(self, engine: Engine, prompt_for: Callable[[str], str | None], name: str) -> None:
        self.engine = engine
        self.prompt_for = prompt_for
        self.evaluated_tokens = 0
        self.skipped_busy = 0
        self._pending: str | None = None
        self._busy = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"{name}:prefill", daemon=True)
        self._thread.start()

    def submit(self, partial_text: str) -> None:
        """Evaluate ahead for ``partial_text`` (replaces a partial not yet evaluated). Never blocks."""
        with self._changed:
            self._pending = partial_text
            self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every submitted partial has been evaluated or skipped; False on time-out."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is None and not self._busy, timeout_s)

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the prefill thread (a partial being evaluated finishes first)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._pending is None and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                text, self._pending, self._busy = self._pending, None, True
            try:
                self._prefill(text)
            except Exception:  # a failed guess must never reach the conversation
                logger.debug("prefill from a partial transcript failed", exc_info=True)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _may_continue(self) -> bool:
        """Go on evaluating ahead: no reply wants the engine, no newer partial, no critical work."""
        return not (self.engine.wanted or self._pending is not None or self._closed or CRITICAL.busy)

    def _prefill(self, text: str) -> None:
        prompt = self.prompt_for(text)
        if not prompt:
            return
        tokens = self.engine.tokenize(prompt)
        if not reads_finished(text):
            tokens = tokens[:-HOLD_BACK_TOKENS]
        if not tokens:
            return
        evaluated = 0
        while True:
            self._wait_for_critical()
            if self._superseded() or not self.engine.lock.acquire(blocking=False):
                self.skipped_busy += evaluated == 0
                break
            try:
                done = self.engine.evaluate_ahead(tokens, STEP_TOKENS, self._may_continue)
            finally:
                self.engine.lock.release()
            evaluated += done
            if done == 0 or not CRITICAL.busy:  # all of it is in the cache, or something newer came
                break
        self.evaluated_tokens += evaluated
        logger.debug("prefill: %d tokens of %r evaluated ahead", evaluated, text[-40:])

    def _wait_for_critical(self) -> None:
        """Critical work first: wait while it runs and :data:`AFTER_CRITICAL_S` after it ends (a reply
        that it let through asks for the engine then); a reply or a newer partial ends the wait."""
        seen, quiet_since = False, 0.0
        while not self._superseded():
            if CRITICAL.busy:
                seen = True
                CRITICAL.wait_clear(CRITICAL_POLL_S)
                quiet_since = time.monotonic()
            elif not seen or time.monotonic() - quiet_since >= AFTER_CRITICAL_S:
                return
            else:
                time.sleep(SETTLE_POLL_S)

    def _superseded(self) -> bool:
        """A reply wants the engine, a newer partial came, or the prefill is closing."""
        return self.engine.wanted or self._pending is not None or self._closed


def reads_finished(text: str) -> bool:
    """Whether a partial transcript ends a sentence (``.``, ``?`` or ``!``, closing quotes
    allowed): its turn may well be over, and its words be the final transcript's."""
    return text.rstrip().rstrip("\"')”’").endswith((".", "?", "!"))
