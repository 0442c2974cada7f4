"""The tool-call threshold (handlers/llm/call_threshold.py) on logits, with a made-up vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from handlers.llm.call_threshold import (
    CALL_OPENERS,
    BanCalls,
    CallThreshold,
    ForcedPrefix,
    invents_numbers,
    opener_tokens,
    starts_no_call,
)

OPENERS = {3, 4}


def logits_with(probabilities: dict[int, float], size: int = 8) -> np.ndarray:
    """Logits whose softmax is ``probabilities`` (the rest of the mass spread over the other ids)."""
    rest = (1.0 - sum(probabilities.values())) / (size - len(probabilities))
    p = np.full(size, rest)
    for token, value in probabilities.items():
        p[token] = value
    return np.log(p).astype(np.float32)


def test_openers_are_the_one_token_spellings() -> None:
    vocab = {"<tool_call>": [7], "{": [3], '{"': [4], "```": [5, 5]}  # a fence of two tokens is no opener
    assert opener_tokens(lambda text: vocab.get(text, [])) == {7, 3, 4}
    assert "<tool_call>" in CALL_OPENERS and '{"' in CALL_OPENERS


def test_a_call_with_enough_probability_is_made() -> None:
    guard = CallThreshold(prompt_length=5, openers=OPENERS, threshold=0.01)
    scores = logits_with({0: 0.9, 3: 0.004, 4: 0.008})
    out = guard(np.zeros(5), scores)
    assert guard.forced and guard.probability == pytest.approx(0.012, rel=1e-3)
    assert np.isneginf(np.delete(out, [3, 4])).all()
    assert out[4] > out[3]  # which opener stays the model's choice


def test_an_unlikely_call_is_left_alone() -> None:
    guard = CallThreshold(prompt_length=5, openers=OPENERS, threshold=0.01)
    scores = logits_with({0: 0.9, 3: 0.004, 4: 0.004})
    before = scores.copy()
    guard(np.zeros(5), scores)
    assert not guard.forced and guard.probability == pytest.approx(0.008, rel=1e-3)
    assert np.array_equal(scores, before)


def test_only_the_first_token_is_decided() -> None:
    guard = CallThreshold(prompt_length=5, openers=OPENERS, threshold=0.01)
    scores = logits_with({3: 0.5})
    before = scores.copy()
    guard(np.zeros(6), scores)  # the second token of the reply
    assert guard.probability is None and np.array_equal(scores, before)


def test_banned_tokens_do_not_count() -> None:
    """Tokens an earlier processor banned (-inf) are out of the softmax."""
    guard = CallThreshold(prompt_length=1, openers=OPENERS, threshold=0.5)
    scores = np.array([0.0, -np.inf, -np.inf, 0.0, -np.inf, -np.inf, -np.inf, -np.inf], dtype=np.float32)
    assert guard.call_probability(scores) == pytest.approx(0.5)


def test_made_up_numbers_are_told_from_numbers_the_user_said() -> None:
    assert invents_numbers('{"a": 5, "b": 3}', "Hi, I need some help with a few numbers.")
    assert invents_numbers('{"values": [{"x": 2.5}]}', "Can you help me with a sum?")  # at any depth
    assert not invents_numbers('{"a": 17, "b": 25}', "What is 17 plus 25?")
    assert not invents_numbers('{"a": 17, "b": 25}', "Can you add seventeen and twenty five?")
    assert not invents_numbers('{"a": 0.5, "b": 4}', "Add a half and Four.")
    assert not invents_numbers('{"timezone": "Asia/Tokyo"}', "What time is it in Tokyo?")  # no number in it
    assert not invents_numbers('{"enabled": true}', "Turn it on.")  # a boolean is no number
    assert not invents_numbers("not json {", "Hello there.")  # left to the tool's own check


def test_banned_calls_leave_the_first_token_to_words() -> None:
    ban = BanCalls(prompt_length=5, openers=OPENERS)
    scores = logits_with({3: 0.9, 0: 0.05})
    out = ban(np.zeros(5), scores.copy())
    assert np.isneginf(out[[3, 4]]).all() and int(np.argmax(out)) == 0
    later = logits_with({3: 0.9})
    assert np.array_equal(ban(np.zeros(6), later.copy()), later)  # only the first token


@pytest.mark.parametrize(
    ("text", "no_call"),
    [
        ('{"name": "get_time", "arguments"', False),
        ('<tool_call>\n{"name": "add"', False),
        ('```json\n[{"name": "add", "arguments": {}}]', False),
        ('{"na', False),  # too little to judge yet
        ('{"timezone": "Europe/London", "iso"', True),  # a made-up tool result, not a call
        ("<tool_call>\nThe time in London is", True),
    ],
)
def test_a_forced_call_is_judged_by_its_first_characters(text: str, no_call: bool) -> None:
    assert starts_no_call(text) is no_call


def test_a_forced_prefix_writes_its_tokens_then_lets_the_model_choose() -> None:
    forced = ForcedPrefix(prompt_length=5, prefix=[3, 6])
    first = forced(list(range(5)), logits_with({0: 0.9}))
    second = forced(list(range(6)), logits_with({0: 0.9}))
    third = forced(list(range(7)), logits_with({0: 0.9}))
    assert int(np.argmax(first)) == 3 and np.isinf(first[np.arange(8) != 3]).all()
    assert int(np.argmax(second)) == 6
    assert int(np.argmax(third)) == 0 and np.isfinite(third).all()
