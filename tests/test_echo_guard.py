"""The echo guard's rules on token ids (handlers/llm/echo_guard.py), with a word-per-token tokenizer."""

from __future__ import annotations

import numpy as np

from handlers.llm.echo_guard import EchoGuard, opening_tokens

VOCAB: dict[str, int] = {}


def tokenize(text: str) -> list[int]:
    """One id per word; every word but an unspaced first one is spelled with its leading space."""
    pieces = [(" " if i or text.startswith(" ") else "") + word for i, word in enumerate(text.split())]
    return [VOCAB.setdefault(piece, len(VOCAB)) for piece in pieces]


def test_opening_tokens_cover_the_first_words_in_every_form() -> None:
    ids = opening_tokens("and mister john dashwood", tokenize)
    expected = {tokenize(form)[0] for form in ("and", " and", "And", " And", "mister", " mister", "Mister", " Mister")}
    assert ids == expected
    assert tokenize("John")[0] not in ids  # the third word is not covered


def test_the_first_token_may_not_open_with_the_user_s_words() -> None:
    guard = EchoGuard(prompt_length=3, opening={7, 9}, user_tokens=[1, 2, 3, 4])
    scores = np.zeros(16, dtype=np.float32)
    guard(np.array([0, 0, 0]), scores)
    assert np.isneginf(scores[[7, 9]]).all()
    assert np.isfinite(np.delete(scores, [7, 9])).all()
    later = np.zeros(16, dtype=np.float32)
    guard(np.array([0, 0, 0, 5]), later)  # the second token is free
    assert np.isfinite(later).all()


def test_a_run_longer_than_the_limit_is_cut() -> None:
    user = [10, 11, 12, 13, 14, 15]
    guard = EchoGuard(prompt_length=2, opening=set(), user_tokens=user, max_run=3)
    assert guard.banned([10, 11]) == set()  # two copied tokens: free
    assert guard.banned([5, 10, 11, 12]) == {13}  # three copied: the fourth is banned
    assert guard.banned([11, 12, 13]) == {14}
    assert guard.banned([10, 12, 13]) == set()  # not a run of the user's tokens
    assert guard.banned([13, 14, 15]) == set()  # the user's last tokens: nothing follows them
    scores = np.zeros(20, dtype=np.float32)
    guard(np.array([0, 0, 5, 10, 11, 12]), scores)
    assert np.isneginf(scores[13]) and np.isfinite(np.delete(scores, 13)).all()


def test_every_place_a_run_occurs_bans_its_continuation() -> None:
    guard = EchoGuard(prompt_length=0, opening=set(), user_tokens=[1, 2, 3, 1, 2, 4], max_run=2)
    assert guard.banned([1, 2]) == {3, 4}


def test_no_run_rule_without_user_tokens_or_limit() -> None:
    assert EchoGuard(0, set(), [], max_run=2).banned([1, 2, 3]) == set()
    assert EchoGuard(0, set(), [1, 2, 3], max_run=0).banned([1, 2]) == set()


def test_numbers_are_no_copy() -> None:
    """Digits are exempt: "the sum of 17 and 25" may copy the user's "17 and 25" whole."""
    user = [20, 1, 7, 21, 2, 5]  # " add", "1", "7", " and", "2", "5"
    guard = EchoGuard(0, set(), user, numeric={1, 7, 2, 5}, max_run=2)
    assert guard.banned([30, 1, 7]) == set()  # a run holding a digit
    assert guard.banned([7, 21]) == set()
    words = EchoGuard(0, set(), [40, 41, 42, 3], numeric={3}, max_run=2)
    assert words.banned([40, 41]) == {42}
    assert words.banned([41, 42]) == set()  # what follows is a digit: never banned
