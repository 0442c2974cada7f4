"""The echo guard: a spoken reply may not read the user's words back.

Small local models answer a statement by repeating it ("He might even have been made amiable
himself." -> the same sentence), or open with "Yes," and then repeat it, even when the system
prompt forbids both. The guard works on the logits, so it holds whatever the prompt does:

1. **Opening.** The reply's first token may not be the first token of any of the user's first
   :data:`OPENING_WORDS` words (as written, capitalised, with and without a leading space).
2. **Runs.** The reply may not copy more than :data:`MAX_COPIED_TOKENS` consecutive tokens of
   the user's message: once its last ``MAX_COPIED_TOKENS`` tokens match somewhere in the user's
   tokens, the token that follows them there is banned. A quote, a read-back or a paraphrase that
   keeps whole phrases has to leave the user's wording; an answer that reuses a few of the
   question's words ("the capital of France is Paris") is untouched. Numbers are exempt: a run
   that holds a token with a digit is no copy, and a digit is never banned (Qwen writes numbers
   one digit a token, so "the sum of 17 and 25" copies 7 tokens of "add 17 and 25"; without the
   exemption the guard made the 1.5B say "the sum of 17 and 24 is 41").

:class:`EchoGuard` is a llama-cpp-python logits processor (``(input_ids, scores) -> scores``,
``input_ids`` the prompt and the completion so far, ``scores`` the next token's logits, a float32
array of the vocabulary's size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: The opening rule covers the user's first this many words. Two, because after "And" alone the
#: 0.5B dropped it and echoed the rest. Tried on LibriVox statements as first turns with
#: Qwen2.5-Coder-1.5B and the voice prompt (temperature 0): 2 of 3 read back without the guard,
#: 1 of 5 with it. The cost: a reply cannot open with the user's own first words ("Good
#: morning!" is answered "Morning! ...").
OPENING_WORDS = 2
#: The run rule: at most this many consecutive tokens of the user's message in a row. Six lets an
#: answer restate a question's phrase ("12 times 4 is 48" is 5 Qwen tokens of "What is 12 times
#: 4?") and stops a read-back after about four words.
MAX_COPIED_TOKENS = 6


def opening_tokens(text: str, tokenize: Callable[[str], list[int]], words: int = OPENING_WORDS) -> set[int]:
    """The first token of each of the first ``words`` words of ``text``, as they would start a
    reply: with and without a leading space, as written and capitalised.

    Args:
        text: the user's message.
        tokenize: text -> token ids, without BOS and without parsing special tokens.
        words: how many of the user's words are covered.
    """
    found: set[int] = set()
    for word in text.split()[:words]:
        for form in {word, word.capitalize()}:
            for spelled in (form, " " + form):
                ids = tokenize(spelled)
                if ids:
                    found.add(ids[0])
    return found


class EchoGuard:
    """Logits processor for one completion: the opening and run rules of this module.

    Args:
        prompt_length: tokens of the prompt (the completion starts after them).
        opening: token ids the completion may not start with (:func:`opening_tokens`).
        user_tokens: the user's message as token ids (with a leading space, as mid-sentence words
            are tokenised); empty turns the run rule off.
        numeric: the ids among ``user_tokens`` whose text holds a digit (exempt from the run rule).
        max_run: longest allowed run of copied tokens (:data:`MAX_COPIED_TOKENS`).
    """

    def __init__(
        self,
        prompt_length: int,
        opening: set[int],
        user_tokens: Sequence[int] = (),
        numeric: set[int] | frozenset[int] = frozenset(),
        max_run: int = MAX_COPIED_TOKENS,
    ) -> None:
        self.prompt_length = prompt_length
        self.opening = np.array(sorted(opening), dtype=np.int64)
        self.max_run = max_run
        # every run of max_run user tokens without a digit -> the tokens that follow it there (not
        # digits): built once per reply, so each generated token costs one dict lookup
        self._follows: dict[tuple[int, ...], set[int]] = {}
        user = list(user_tokens)
        for i in range(len(user) - max_run if max_run > 0 else 0):
            run, after = tuple(user[i : i + max_run]), user[i + max_run]
            if after not in numeric and not numeric.intersection(run):
                self._follows.setdefault(run, set()).add(after)

    def banned(self, completion: Sequence[int]) -> set[int]:
        """The tokens that may not come next after ``completion`` (the reply's tokens so far)."""
        if not len(completion):
            return {int(token) for token in self.opening}
        if len(completion) < self.max_run or not self._follows:
            return set()
        return self._follows.get(tuple(int(t) for t in completion[-self.max_run :]), set())

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        banned = self.banned(input_ids[self.prompt_length :])
        if banned:
            scores[np.fromiter(banned, dtype=np.int64)] = -np.inf
        return scores
