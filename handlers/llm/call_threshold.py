"""A tool-call threshold: call a tool when the model gives a call a fair chance, not only when a
call is its single most likely start.

Measured with the embedded Qwen2.5-Coder-1.5B-Instruct, the voice system prompt and the sample
tools of ``speech_to_speech/client/talk/sample_tools.py`` (``get_time``, ``add``), greedy: asked "What time is it in
Tokyo?" it answers from memory ("The current date and time in Tokyo is 2023-10-05T14:30:00+09:00"),
although with a one-line system prompt it calls ``get_time``. The voice prompt's rules push the
call down without removing it. The probability of a call opener (``<tool_call>``, ``{``, ``{"``,
a code fence) as the reply's first token separates the two kinds of turns:

======================================  ===========
turn                                    p(call)
======================================  ===========
add 3.5 and 4                           0.358
Please add 120 and 80.                  0.098
What time is it in Tokyo?               0.043
What's the time in London right now?    0.026
Can you add 17 and 25?                  0.019
What's the date today?                  0.014
How much is 1234 plus 4321?             0.013
What is 12 times 4? (no tool for it)    0.0023
Hi, I need some help with a few numbers 0.0013
eight more turns that need no tool      <= 0.0008
======================================  ===========

So with :data:`QWEN_1_5B_CALL_THRESHOLD` = 0.01, every turn that needs a tool calls it and none
that does not. The 0.5B is no candidate: it puts 0.67 on a call for "Hi, I need some help with a
few numbers." and 0.15 for "What's the time in London?", so no threshold separates its turns;
it keeps plain greedy decoding (no threshold).

:class:`CallThreshold` is a llama-cpp-python logits processor for the reply's first token: when
the probability mass of the call openers reaches the threshold, every other token is banned, so
the reply starts a call (which opener stays the model's choice).

A call the threshold forced (the model's own first choice was words) is checked once it is
written: when its arguments hold a number and the user's message holds none (no digit, no number
word), the model made the numbers up, and the reply is generated again with the openers banned
(:func:`invents_numbers`, :class:`BanCalls`). Measured with the answer-first voice prompt:
"Hi, I need some help with a few numbers." has p(call) 0.027-0.062, above every sum the model
answers itself, and the forced call was ``add(a=5, b=3)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

#: Spellings that start a tool call that :class:`~speech_to_speech.llm.tools.json_calls.JsonCallExtractor`
#: reads (the tag, a bare JSON object, a code fence); those that are one token are the call openers.
CALL_OPENERS = ("<tool_call>", "{", '{"', " {", ' {"', "{\n", "```", "```json")
#: the threshold for the embedded Qwen2.5-Coder-1.5B-Instruct (see the module doc)
QWEN_1_5B_CALL_THRESHOLD = 0.01


def opener_tokens(tokenize: Callable[[str], list[int]]) -> set[int]:
    """The ids of :data:`CALL_OPENERS` that ``tokenize`` (special tokens parsed) makes one token."""
    found: set[int] = set()
    for spelling in CALL_OPENERS:
        ids = tokenize(spelling)
        if len(ids) == 1:
            found.add(ids[0])
    return found


class CallThreshold:
    """Logits processor: the reply starts a tool call when its openers reach ``threshold``.

    Args:
        prompt_length: tokens of the prompt (the reply's first token is decided at this length).
        openers: call-opener token ids (:func:`opener_tokens`).
        threshold: probability, 0..1, of the openers together at which a call is made.
    """

    def __init__(self, prompt_length: int, openers: set[int], threshold: float) -> None:
        self.prompt_length = prompt_length
        self.openers = np.array(sorted(openers), dtype=np.int64)
        self.threshold = threshold
        #: whether the threshold made this reply a call (set at the first token)
        self.forced = False
        #: the openers' probability at the first token (None before it)
        self.probability: float | None = None

    def call_probability(self, scores: Any) -> float:
        """The probability of the openers under the softmax of ``scores`` (logits, float32)."""
        logits = np.asarray(scores, dtype=np.float64)
        finite = np.isfinite(logits)
        if not finite.any() or not len(self.openers):
            return 0.0
        top = logits[finite].max()
        weights = np.where(finite, np.exp(logits - top), 0.0)
        return float(weights[self.openers].sum() / weights.sum())

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if len(input_ids) != self.prompt_length or self.threshold <= 0:
            return scores
        self.probability = self.call_probability(scores)
        if self.probability >= self.threshold:
            keep = scores[self.openers].copy()
            scores[:] = -np.inf
            scores[self.openers] = keep
            self.forced = True
        return scores


#: characters of a forced call after its opener by which :func:`starts_no_call` judges it
CALL_SHAPE_CHARS = 10
#: a reply this long has had its shape judged (the longest opener, spaces, CALL_SHAPE_CHARS): the
#: caller stops asking :func:`starts_no_call` at every token after it
CALL_SHAPE_JUDGED_CHARS = 32


def starts_no_call(text: str) -> bool:
    """Whether a forced call's text so far has shown it is no call: once :data:`CALL_SHAPE_CHARS`
    characters follow the opener (the tag, a code fence), a call is a JSON object (or a list of
    them) whose first key is ``"name"``.

    The forced call of "What's the time in London right now?", after a ``get_time`` result in the
    history, opened with a bare ``{`` and wrote a made-up result instead
    (``{"timezone": "Europe/London", "iso": "2026-12-06T13:24:56+00:00", ...``, the 1.5B, 2026-12-06)
    for 6 s, past the first-token time-out: such a reply is stopped here and written again with
    :data:`CALL_PREFIX` forced (:class:`ForcedPrefix`).
    (Forcing the ``<tool_call>`` tag alone instead was tried: the 1.5B then ended the reply after
    the tag in 6 of 6 forced turns.)
    """
    body = text.strip()
    for opener in ("<tool_call>", "```json", "```"):
        body = body.removeprefix(opener).strip()
    if len(body) < CALL_SHAPE_CHARS:
        return False
    return re.match(r'\[?\s*\{\s*"name"\s*:', body) is None


_NUMBER_WORDS_TEXT = """
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand
million billion half quarter dozen first second third point
"""
#: words that say a number in English (with digits, what :func:`invents_numbers` looks for)
NUMBER_WORDS = frozenset(_NUMBER_WORDS_TEXT.split())


def _numbers_in(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, dict):
        return any(_numbers_in(v) for v in value.values())
    if isinstance(value, list):
        return any(_numbers_in(v) for v in value)
    return False


def invents_numbers(arguments: str, user_text: str) -> bool:
    """Whether a call's ``arguments`` (a JSON object) hold a number (a JSON number, at any depth)
    while ``user_text`` holds none: no digit and no word of :data:`NUMBER_WORDS`. Arguments that
    are not JSON are left to the tool's own check (False)."""
    try:
        decoded = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return False
    if not _numbers_in(decoded):
        return False
    words = set(re.findall(r"[a-z]+", user_text.lower()))
    return not re.search(r"\d", user_text) and not (words & NUMBER_WORDS)


class BanCalls:
    """Logits processor: the reply's first token is no call opener (a forced call was undone).

    Args:
        prompt_length: tokens of the prompt.
        openers: call-opener token ids (:func:`opener_tokens`).
    """

    def __init__(self, prompt_length: int, openers: set[int]) -> None:
        self.prompt_length = prompt_length
        self.openers = np.array(sorted(openers), dtype=np.int64)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if len(input_ids) == self.prompt_length and len(self.openers):
            scores[self.openers] = -np.inf
        return scores


#: how a call written again after :func:`starts_no_call` begins (the JSON form the extractor reads)
CALL_PREFIX = '{"name": "'


class ForcedPrefix:
    """Logits processor: the reply's first tokens are ``prefix`` (token ids), then the model's own.

    Args:
        prompt_length: tokens of the prompt.
        prefix: the token ids the reply must start with.
    """

    def __init__(self, prompt_length: int, prefix: list[int]) -> None:
        self.prompt_length = prompt_length
        self.prefix = list(prefix)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        step = len(input_ids) - self.prompt_length
        if 0 <= step < len(self.prefix):
            token = self.prefix[step]
            keep = scores[token]
            scores[:] = -np.inf
            scores[token] = keep if np.isfinite(keep) else 0.0
        return scores
