"""The scoring of scripts/benchmark_quality.py (speech_to_speech/testing/scoring.py): pure functions, no models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speech_to_speech.testing import scoring

Turn = scoring.Turn


# -- echo score ---------------------------------------------------------------------------------


def test_echo_score_of_a_repeat_is_one() -> None:
    user = "He was not an ill disposed young man."
    assert scoring.echo_score(user, "He was not an ill-disposed young man.") == 1.0
    assert scoring.score_turn(Turn("statement", clip="x"), user, "He was not an ill-disposed young man.").echoed


def test_echo_score_of_a_paraphrase_that_reuses_most_words_is_an_echo() -> None:
    user = "It has been raining here all week."
    reply = "So it has been raining all week where you are."
    assert scoring.content_words(user) == {"raining", "week"}  # both come back
    assert scoring.echo_score(user, reply) == 1.0
    verdict = scoring.score_turn(Turn("statement", "x"), user, reply)
    assert not verdict.right and verdict.why.startswith("echo")


def test_echo_score_of_a_paraphrase_with_new_words_is_low() -> None:
    user = "I saw a fox in my garden this morning."
    reply = "What a lovely surprise! Foxes are shy animals; did it stay long?"
    assert scoring.echo_score(user, reply) == 0.0  # "fox" and "foxes" differ: exact word forms


def test_echo_score_of_a_real_reaction_passes() -> None:
    user = "My sister is getting married next month."
    reply = "Congratulations to her! Are you helping with the wedding plans?"
    assert scoring.echo_score(user, reply) == 0.0
    verdict = scoring.score_turn(Turn("statement", "x"), user, reply)
    assert verdict.right and not verdict.echoed


def test_echo_score_is_the_share_of_the_users_content_words() -> None:
    user = "I'm planning a trip to Japan next spring."  # content: planning, trip, japan, next, spring
    assert scoring.content_words(user) == {"planning", "trip", "japan", "next", "spring"}
    assert scoring.echo_score(user, "A trip to Japan sounds wonderful!") == pytest.approx(2 / 5)
    assert scoring.echo_score("Hello! How are you?", "Hi!") == 0.0  # no content word said


def test_one_shared_word_is_no_echo_when_the_reply_adds_its_own() -> None:
    user, reply = "Hello! How are you doing today?", "I'm doing well, thanks! How about you?"
    assert scoring.echo_score("Hello! How are you doing?", reply) == 1.0  # "doing", the one content word
    assert scoring.echo_score(user, reply) == 0.5
    assert not scoring.is_echo("Hello! How are you doing?", reply)  # one word shared, "well" added
    assert scoring.score_turn(Turn("smalltalk", "x"), "How are you doing?", reply).right


def test_a_reply_that_adds_nothing_is_an_echo() -> None:
    assert scoring.is_echo("Okay, wish me luck!", "Okay, wish me luck.")  # two words: wish, luck
    assert scoring.is_echo("Okay with me look", "Okay with me look.")  # one word, nothing added
    verdict = scoring.score_turn(Turn("smalltalk", "x"), "Okay with me look", "Okay with me look.")
    assert not verdict.right and verdict.echoed


def test_an_echo_is_above_half() -> None:
    assert scoring.score_turn(Turn("statement", "x"), "I love green tea.", "Green tea is great.").echoed  # 2/3
    verdict = scoring.score_turn(Turn("statement", "x"), "I love tea.", "Tea is great.")  # 1/2
    assert verdict.echo == 0.5 and not verdict.echoed and verdict.right


def test_tokens_keep_contractions_and_drop_possessives() -> None:
    words = ["austen", "novel", "isn't", "long", "it's", "short"]
    assert scoring.tokens("Austen's novel isn't long—it's SHORT") == words
    assert "ill" in scoring.content_words("He was not ill disposed, I'll say")
    assert "i'll" not in scoring.content_words("I'll say")


def test_a_refusal_is_no_reaction() -> None:
    user = "My sister is getting married next month."
    verdict = scoring.score_turn(Turn("statement", "x"), user, "I'm sorry, but I can’t assist with that.")
    assert not verdict.right and verdict.why == "refusal"
    assert scoring.score_turn(Turn("statement", "x"), user, "Wonderful! Can I help you plan anything?").right


@pytest.mark.parametrize(
    ("reply", "bare"),
    [
        ("Yes, it is.", True),
        ("Yes, she did.", True),
        ("No, it isn’t.", True),
        ("Yes.", True),
        ("Yeah, that was.", True),
        ("Yes, it was a hard time for him.", False),
        ("Yes, a puppy.", False),
        ("Yes! What a lovely line.", False),
        ("No way, that's wonderful!", False),
        ("Oh, nice! Where is it?", False),
    ],
)
def test_a_bare_yes_or_no_is_no_reaction(reply: str, bare: bool) -> None:
    user = "He might even have been made amiable himself."
    verdict = scoring.score_turn(Turn("statement", "x"), user, reply)
    assert verdict.right is not bare
    assert (verdict.why == "a bare yes or no") is bare
    # a yes/no question's answer stays right
    assert scoring.score_turn(Turn("fact", "x", facts=("it is",)), "Is a tomato a fruit?", "Yes, it is.").right


def test_empty_reply_is_wrong_for_every_kind() -> None:
    for turn in (Turn("statement", "x"), Turn("fact", "x", facts=("paris",)), Turn("repeat", "x")):
        verdict = scoring.score_turn(turn, "hello", "  ")
        assert not verdict.right and verdict.why == "no reply"


def test_a_failed_response_is_wrong_whatever_it_says() -> None:
    fallback = "Sorry, I'm a bit slow right now. Could you say that again?"
    verdict = scoring.score_turn(Turn("smalltalk", "x"), "Hello! How are you?", fallback, failed=True)
    assert not verdict.right and verdict.why == "response failed"
    assert scoring.score_turn(Turn("smalltalk", "x"), "Hello! How are you?", fallback).right


# -- facts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "facts", "expected"),
    [
        ("The capital of France is Paris.", ("paris",), True),
        ("PARIS!", ("paris",), True),
        ("Parisian cafes are nice.", ("paris",), False),  # whole words only
        ("Twelve times four is 48.", ("48",), True),
        ("Twelve times four is forty-eight.", ("48",), True),
        ("It is forty eight", ("48",), True),
        ("It is 480.", ("48",), False),
        ("Water boils at 100 degrees.", ("100",), True),
        ("Water boils at a hundred degrees.", ("100",), True),
        ("Water boils at one hundred degrees.", ("100",), True),
        ("It is 100.5 degrees.", ("100",), False),
        ("100C, 212F", ("100",), True),  # a temperature's unit
        ("100C, 212F", ("212",), True),
        ("It boils at 212°F.", ("212",), True),
        ("The 100th day.", ("100",), False),
        ("It is 100cm long.", ("100",), False),
        ("That makes 1,200 cups.", ("1200",), True),
        ("The sum is 7.5.", ("7.5",), True),
        ("The sum is seven point five.", ("7.5",), True),
        ("The sum is 7.", ("7.5",), False),
        ("Plants take in carbon dioxide.", ("carbon dioxide", "co2"), True),
        ("Plants take in CO2.", ("carbon dioxide", "co2"), True),
        ("Plants take in oxygen.", ("carbon dioxide", "co2"), False),
    ],
)
def test_has_fact(reply: str, facts: tuple[str, ...], expected: bool) -> None:
    assert scoring.has_fact(reply, facts) is expected


def test_number_words() -> None:
    assert scoring.number_words(0) == "zero"
    assert scoring.number_words(15) == "fifteen"
    assert scoring.number_words(48) == "forty eight"
    assert scoring.number_words(70) == "seventy"
    assert scoring.number_words(212) == "two hundred twelve"
    assert scoring.number_words(1200) == "one thousand two hundred"
    assert scoring.number_words(3.25) == "three point two five"
    assert scoring.number_words(-1) is None and scoring.number_words(1.234) is None


def test_fact_and_memory_turns_are_scored_by_their_facts() -> None:
    memory = Turn("memory", "Do you remember my name?", facts=("david",))
    assert scoring.score_turn(memory, "Do you remember my name?", "Of course, you're David.").right
    verdict = scoring.score_turn(memory, "Do you remember my name?", "I'm sorry, I don't know.")
    assert not verdict.right and verdict.why == "missing fact (david)"


# -- instructions ----------------------------------------------------------------------------------

LONG = "The Moon is Earth's only natural satellite. It orbits us every 27 days and causes the tides."


def test_shorter_needs_fewer_words_than_the_previous_reply() -> None:
    shorter = Turn("shorter", "Shorter, please.")
    assert scoring.is_shorter(LONG, "The Moon orbits Earth.")
    # the same reply less its last words, and a shorter refusal, are not what was asked for
    assert not scoring.is_shorter(LONG, "The Moon is Earth's only natural satellite. It orbits us every 27 days.")
    assert not scoring.is_shorter(LONG, "I'm sorry, but I can't assist with that.")
    assert scoring.score_turn(shorter, "Shorter please.", "The Moon orbits Earth.", previous=LONG).right
    same = scoring.score_turn(shorter, "Shorter please.", LONG, previous=LONG)
    words = scoring.word_count(LONG)
    assert not same.right and same.why == f"not shorter ({words} vs {words})"
    assert not scoring.is_shorter(LONG, "")


def test_say_that_again_needs_most_of_the_previous_reply() -> None:
    repeat = Turn("repeat", "Say that again.")
    assert scoring.repeat_overlap(LONG, LONG) == 1.0
    again = "Sure: the Moon is Earth's only natural satellite; it orbits us every 27 days and causes tides."
    assert scoring.score_turn(repeat, "Say that again.", again, previous=LONG).right
    other = scoring.score_turn(repeat, "Say that again.", "Sure, what would you like me to repeat?", previous=LONG)
    assert not other.right and other.why.startswith("not a repeat")
    assert scoring.repeat_overlap("", "anything") == 0.0
    assert scoring.repeat_overlap("Yes.", "Yes!") == 1.0  # no content word: all words count


# -- tools -------------------------------------------------------------------------------------------


def test_call_matches() -> None:
    tokyo = ("get_time", ("Asia/Tokyo",))
    assert scoring.call_matches("get_time", {"timezone": "asia/tokyo"}, tokyo)
    assert not scoring.call_matches("get_time", {"timezone": "Europe/Paris"}, tokyo)
    assert not scoring.call_matches("get_time", {}, tokyo)  # absent: UTC
    assert scoring.call_matches("get_time", {}, ("get_time", ("UTC",)))
    add = ("add", (17, 25))
    assert scoring.call_matches("add", {"a": 25, "b": 17.0}, add)
    assert not scoring.call_matches("add", {"a": 25, "b": 18}, add)
    assert not scoring.call_matches("add", {"a": "x", "b": 17}, add)
    assert not scoring.call_matches("get_time", {"a": 17, "b": 25}, add)


def test_tool_turns_need_the_call_and_their_facts() -> None:
    turn = Turn("tool", "Can you add seventeen and twenty five?", facts=("42",), call=("add", (17, 25)))
    calls = [("add", {"a": 17, "b": 25})]
    assert scoring.score_turn(turn, "add 17 and 25", "That's 42.", calls=calls, tools_offered=True).right
    no_fact = scoring.score_turn(turn, "add 17 and 25", "Done.", calls=calls, tools_offered=True)
    assert no_fact.why == "missing fact (42)"
    no_call = scoring.score_turn(turn, "add 17 and 25", "It's 42.", calls=[], tools_offered=True)
    assert not no_call.right and "calls: none" in no_call.why


def test_other_turns_must_not_call_tools_when_tools_are_offered() -> None:
    turn = Turn("fact", "What's the capital of Spain?", facts=("madrid",))
    calls = [("get_time", {"timezone": "Europe/Madrid"})]
    verdict = scoring.score_turn(turn, "capital of Spain?", "Madrid.", calls=calls, tools_offered=True)
    assert not verdict.right and verdict.why == "called a tool: get_time"
    assert scoring.score_turn(turn, "capital of Spain?", "Madrid.", calls=[], tools_offered=True).right


# -- the dialogues -------------------------------------------------------------------------------------


def test_the_dialogues_load_and_cover_every_category() -> None:
    dialogues = scoring.load_dialogues()
    turns = [t for d in dialogues for t in d.turns]
    assert len(dialogues) >= 10 and len(turns) >= 60
    assert set(scoring.CATEGORIES.values()) == {scoring.CATEGORIES[t.kind] for t in turns}
    assert {d.voice for d in dialogues} == set(scoring.VOICES)
    assert any(t.clip for t in turns)
    assert all(d.tools for d in dialogues if any(t.kind == "tool" for t in d.turns))


def test_load_dialogues_rejects_bad_turns(tmp_path: Path) -> None:
    def write(turn: dict[str, Any]) -> Path:
        path = tmp_path / "d.json"
        path.write_text(json.dumps({"dialogues": [{"name": "d", "voice": "piper", "turns": [turn]}]}))
        return path

    with pytest.raises(ValueError, match="unknown kind"):
        scoring.load_dialogues(write({"kind": "joke", "say": "x"}))
    with pytest.raises(ValueError, match="needs facts"):
        scoring.load_dialogues(write({"kind": "fact", "say": "x"}))
    with pytest.raises(ValueError, match="'say' or 'clip'"):
        scoring.load_dialogues(write({"kind": "statement"}))
    with pytest.raises(ValueError, match="'call'"):
        scoring.load_dialogues(write({"kind": "tool", "say": "x"}))
