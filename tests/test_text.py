"""Text for speech: filtering unspeakable characters and streaming sentence splitting."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speech_to_speech.speech.text import (
    SentenceStreamer,
    first_chunk_end,
    first_clause_end,
    is_speakable,
    remove_unspeakable,
    split_sentences,
)
from speech_to_speech.speech.words import WordStreamer

# -- remove_unspeakable -----------------------------------------------------------------------


def test_markdown_marks_removed() -> None:
    text = "# Title\n**Bold** and *it* and `code` and ~~gone~~\n- item one\n> quoted line"
    assert remove_unspeakable(text) == "Title\nBold and it and code and gone\nitem one\nquoted line"


def test_emoji_and_symbols_removed() -> None:
    out = remove_unspeakable("Great job 😀🎉! Done ✓ → next ©")
    assert not re.search(r"[\U0001F300-\U0001FAFF✓→©]", out)
    assert out.split() == ["Great", "job", "!", "Done", "next"]


def test_other_scripts_kept() -> None:
    for text in ("café naïve", "Ελληνικά", "Привет, мир!", "العربية", "हिन्दी", "日本語のテキスト"):
        assert remove_unspeakable(text) == text


def test_cjk_and_punctuation_kept() -> None:
    assert remove_unspeakable("你好，世界！今天好吗？「是的」。") == "你好，世界！今天好吗？「是的」。"
    assert remove_unspeakable("Well, yes: 50% (maybe) - it's $5 & ok?") == "Well, yes: 50% (maybe) - it's $5 & ok?"


def test_curly_quotes_normalised() -> None:
    text = "\u201cHi,\u201d she said. It\u2019s \u2018fine\u2019."
    assert remove_unspeakable(text) == "\"Hi,\" she said. It's 'fine'."


def test_whitespace_preserved_for_streaming() -> None:
    # streamed pieces must still join with their spaces once filtered
    assert remove_unspeakable(" there ") == " there "
    assert remove_unspeakable("a\nb") == "a\nb"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("hello", True), ("5", True), ("你好", True), ("Ж", True), ("", False), ("   ", False), ("...", False),
     ("!?", False), ("___", False), ("-- ,", False), ("。！", False)],
)  # fmt: skip
def test_is_speakable(text: str, expected: bool) -> None:
    assert is_speakable(text) is expected


# -- split_sentences -----------------------------------------------------------------------------


def test_decimal_numbers_do_not_split() -> None:
    assert split_sentences("Pi is 3.14 and e is 2.718.") == ["Pi is 3.14 and e is 2.718."]


def test_abbreviations_do_not_split() -> None:
    assert split_sentences("Dr. Smith met me in the U.S. on Jan. 5.") == ["Dr. Smith met me in the U.S. on Jan. 5."]


def test_plain_sentences_split_and_strip() -> None:
    assert split_sentences("  Hello there.  How are you? Fine!  ") == ["Hello there.", "How are you?", "Fine!"]


def test_cjk_sentences_split() -> None:
    assert split_sentences("你好。今天天气很好！你呢？") == ["你好。", "今天天气很好！", "你呢？"]


def test_empty_text_has_no_sentences() -> None:
    assert split_sentences("") == []
    assert split_sentences("   ") == []


# -- SentenceStreamer ------------------------------------------------------------------------------


def stream(
    text_pieces: list[str], batch_sentences: int = 1, first_clause_words: int = 4, first_cut_words: int = 5
) -> tuple[list[tuple[int, str]], list[str]]:
    """Push every piece; return (index of piece when released, batch) pairs and the flushed batches."""
    streamer = SentenceStreamer(batch_sentences, first_clause_words, first_cut_words)
    released = [(i, batch) for i, piece in enumerate(text_pieces) for batch in streamer.push(piece)]
    return released, list(streamer.flush())


def tokens(text: str) -> list[str]:
    """Split ``text`` like an LLM tokenizer might: words with their leading space."""
    return re.findall(r"\s*\S+", text)


def test_first_sentence_released_alone_as_its_stop_is_written() -> None:
    pieces = ["Hello", " there", ".", " How", " are", " you", "?", " Fine", "."]
    released, flushed = stream(pieces, batch_sentences=3)
    # "there." is no abbreviation: the sentence is over with its stop, not with the next word
    assert released[0] == (pieces.index("."), "Hello there.")
    # the second chunk is released alone too, once its sentence is complete: the listener waits for it
    assert released[1:] == [(pieces.index("?"), "How are you?")]
    assert flushed == ["Fine."]


@pytest.mark.parametrize(
    ("pieces", "first", "at"),
    [
        (["Jupiter", ".", " It", " is", " big", "."], "Jupiter.", 1),
        (["Dr", ".", " Smith", " is", " here", "."], "Dr. Smith is here.", 5),  # not at "Dr."
        (["Room", " No", ".", " 5", " is", " free", "."], "Room No. 5 is free.", 6),  # a sign for "number"
        (["Plan", " B", ".", " Then", " C", "."], "Plan B. Then C.", None),  # an initial: Punkt joins them
        (["Pi", " is", " 3", ".", "14", "."], "Pi is 3.14.", None),  # a decimal point; after a digit: waits
        (['"', "Go", ".", '"', " Yes", "."], '"Go."', 4),  # inside a quotation: with the next word
        (["Really", "?", " Yes", "."], "Really?", 1),
    ],
)  # fmt: skip
def test_when_a_first_sentence_is_known_to_be_over(pieces: list[str], first: str, at: int | None) -> None:
    """The first chunk, and the piece it was released with (None: at the end of the stream)."""
    released, flushed = stream(pieces, batch_sentences=3)
    assert ([batch for _, batch in released] + flushed)[0] == first
    assert (released[0][0] if released and released[0][1] == first else None) == at


def test_later_batches_respect_batch_sentences() -> None:
    text = "One is here. Two is here. Three is here. Four is here. Five is here. Six is here."
    released, flushed = stream(tokens(text), batch_sentences=2)
    batches = [batch for _, batch in released] + flushed
    assert batches == [
        "One is here.",
        "Two is here.",
        "Three is here. Four is here.",
        "Five is here. Six is here.",
    ]
    # every batch but the last is released before the stream ends
    assert len(released) == 3


def test_batches_of_one_release_each_sentence() -> None:
    released, flushed = stream(tokens("A cat slept. A dog ran. A bird flew."))
    assert [batch for _, batch in released] == ["A cat slept.", "A dog ran."]
    assert flushed == ["A bird flew."]


def test_missing_space_between_sentences() -> None:
    # the first sentence is known to be over at its stop ("one." is no abbreviation): the rest follows
    released, flushed = stream(list("Sentence one.Sentence two"))
    assert released == [(len("Sentence one.") - 1, "Sentence one.")]
    assert flushed == ["Sentence two"]
    # after the second chunk, a missing space keeps Punkt's one sentence, to the end of the stream
    released, flushed = stream(list("One. Two. Sentence three.Sentence four"))
    assert [batch for _, batch in released] == ["One.", "Two."]
    assert " ".join(flushed).split() == ["Sentence", "three.Sentence", "four"]


def test_flush_twice_yields_nothing_more() -> None:
    streamer = SentenceStreamer()
    list(streamer.push("Hi there"))
    assert list(streamer.flush()) == ["Hi there"]
    assert list(streamer.flush()) == []


def test_drop_unfinished_discards_only_an_unfinished_tail_after_released_text() -> None:
    streamer = SentenceStreamer(batch_sentences=2)
    pieces = ["The moon orbits Earth.", " It has craters.", " It has no air.", " Its light is"]
    assert [c for piece in pieces for c in streamer.push(piece)] == ["The moon orbits Earth.", "It has craters."]
    assert streamer.drop_unfinished() == "Its light is"
    assert list(streamer.flush()) == ["It has no air."]  # the batched whole sentence still goes
    # a finished tail, and a reply that is all tail, are kept
    for pieces in (["Hi there.", " Bye now."], ["It was a dark and stormy"]):
        streamer = SentenceStreamer()
        out = [c for piece in pieces for c in streamer.push(piece)]
        assert streamer.drop_unfinished() == ""
        assert " ".join(out + list(streamer.flush())) == "".join(pieces)


def test_refuses_zero_batch() -> None:
    with pytest.raises(ValueError):
        SentenceStreamer(0)


@pytest.mark.parametrize("batch_sentences", [1, 2, 3])
@pytest.mark.parametrize("split", ["words", "chars"])
def test_nothing_lost(batch_sentences: int, split: str) -> None:
    text = (
        "Dr. Smith arrived at 3.30 p.m. yesterday. Pi is 3.14 and e is 2.718! Did you see the U.S. team? "
        'Yes, I did. It was great, really great.\nThe end is near. "Quoted," she said. One more thing: no final stop'
    )
    pieces = tokens(text) if split == "words" else list(text)
    released, flushed = stream(pieces, batch_sentences)
    out = [batch for _, batch in released] + flushed
    assert len(out) > 2  # it really was streamed in several batches
    assert all(batch == batch.strip() and batch for batch in out)
    assert " ".join(out).split() == text.split()


@pytest.mark.parametrize("split", ["words", "chars"])
def test_nothing_lost_cjk(split: str) -> None:
    text = "你好。今天天气很好！我们去公园吧？ Sure, let's go. 好的。"
    pieces = tokens(text) if split == "words" else list(text)
    released, flushed = stream(pieces)
    out = [batch for _, batch in released] + flushed
    assert out[0] == "你好。"
    assert "".join("".join(out).split()) == "".join(text.split())


# -- the first chunk may end at a clause boundary ----------------------------------------------


def chunks(
    text: str, split: str = "words", batch_sentences: int = 2, first_clause_words: int = 4, first_cut_words: int = 5
) -> list[str]:
    pieces = tokens(text) if split == "words" else list(text)
    released, flushed = stream(pieces, batch_sentences, first_clause_words, first_cut_words)
    return [batch for _, batch in released] + flushed


def test_first_clause_released_as_soon_as_its_comma_is_written() -> None:
    pieces = tokens("Paris is the capital of France, and it is known for its museums. It is lovely.")
    released, flushed = stream(pieces, batch_sentences=2)
    assert released[0] == (pieces.index(" France,"), "Paris is the capital of France,")
    # the rest of the clipped sentence is the second chunk, released alone as soon as it is complete
    assert released[1] == (pieces.index(" museums."), "and it is known for its museums.")
    assert [batch for _, batch in released[2:]] + flushed == ["It is lovely."]


@pytest.mark.parametrize("split", ["words", "chars"])
@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("A spider has eight legs; insects have six. Both are small.", "A spider has eight legs;"),
        ("Here is the simple answer: eight legs. Spiders are arachnids.", "Here is the simple answer:"),
        ("Spiders have eight legs - insects have six. Both are small.", "Spiders have eight legs -"),
        ("Spiders have eight legs -- insects have six. Both are small.", "Spiders have eight legs --"),
        ("Spiders have eight legs\u2014insects have six. Both are small.", "Spiders have eight legs\u2014"),
        ("Spiders have eight legs \u2013 insects have six. Both are small.", "Spiders have eight legs \u2013"),
        ('"Spiders have eight legs," she said. Yes.', '"Spiders have eight legs,"'),
        ("(Spiders have eight legs), she said. Yes.", "(Spiders have eight legs),"),
    ],
)  # fmt: skip
def test_clause_boundaries(text: str, first: str, split: str) -> None:
    out = chunks(text, split)
    assert out[0] == first
    # nothing lost (a dash between two words may gain a space)
    assert "".join("".join(out).split()) == "".join(text.split())


@pytest.mark.parametrize("split", ["words", "chars"])
def test_numbers_are_not_clause_boundaries(split: str) -> None:
    text = "The big show costs 1,000 dollars and starts at 3:30 today, so come early. See you."
    # the clause rule alone (the word-gap rule off) passes over "1,000" and "3:30" to the comma
    assert chunks(text, split, first_cut_words=0)[0] == "The big show costs 1,000 dollars and starts at 3:30 today,"
    # with the word-gap rule, the chunk ends before "and" after the number and its noun
    assert chunks(text, split)[0] == "The big show costs 1,000 dollars"
    assert chunks("The meeting starts at 3:30 sharp. Be there.", split)[0] == "The meeting starts at 3:30 sharp."
    assert chunks("We sold 12,500,000 copies in 2024. Wow.", split)[0] == "We sold 12,500,000 copies in 2024."


@pytest.mark.parametrize("split", ["words", "chars"])
def test_too_short_a_clause_waits_for_the_next_boundary_or_the_sentence(split: str) -> None:
    assert chunks("Sure, I can help with that. What is it?", split) == ["Sure, I can help with that.", "What is it?"]
    out = chunks("Well, yes, spiders have eight legs, and insects six. Ok.", split)
    assert out[0] == "Well, yes, spiders have eight legs,"


def test_hyphenated_words_are_not_dashes() -> None:
    assert chunks("A well-known fact-checker says so. Yes.")[0] == "A well-known fact-checker says so."


def test_only_the_first_chunk_is_a_clause() -> None:
    text = "Paris is the capital of France, and it is old, big, and lovely. Rome is old too, very old. Yes."
    assert chunks(text, batch_sentences=1) == [
        "Paris is the capital of France,",
        "and it is old, big, and lovely.",
        "Rome is old too, very old.",
        "Yes.",
    ]


def test_a_sentence_that_ends_first_is_the_first_chunk() -> None:
    out = chunks("Hi there. Paris is the capital of France, and it is lovely. Yes.", batch_sentences=3)
    assert out == ["Hi there.", "Paris is the capital of France, and it is lovely.", "Yes."]


def test_clause_rule_can_be_turned_off() -> None:
    text = "Paris is the capital of France, and it is lovely. Yes."
    assert chunks(text, first_clause_words=0) == ["Paris is the capital of France, and it is lovely.", "Yes."]


def test_first_clause_end_positions() -> None:
    assert first_clause_end("One two three four, five") == len("One two three four,")
    assert first_clause_end("One two three four,") == len("One two three four,")  # a comma after a word
    assert first_clause_end("It costs 1,") is None  # after a digit: "1,000"?
    assert first_clause_end("It starts at 3:") is None  # a colon waits: "3:30", "http://"
    assert first_clause_end('He said "yes,') is None  # a quotation is open: '"yes,"' may follow
    assert first_clause_end("You should eat e.g.,") is None
    assert first_clause_end("It was a cold Monday,") is None  # "Monday, January 1"?
    assert first_clause_end("One two three, four", min_words=4) is None
    assert first_clause_end("One, two three") == len("One,")  # one word is enough by default ("Oh, nice!")
    assert first_clause_end("One, two three", min_words=2) is None
    assert first_clause_end("One two three, four five six seven, eight", min_words=6) == len(
        "One two three, four five six seven,"
    )
    assert first_clause_end("Hi. One two three four, five") is None


# -- the first chunk may end at a word gap, never inside a protected span ----------------------


def deltas(text: str, split: str) -> list[str]:
    """``text`` cut into streamed deltas: "chars", "words" (with their leading space), "whole", or
    pieces of a fixed size ("3", "7")."""
    if split == "chars":
        return list(text)
    if split == "words":
        return tokens(text)
    if split == "whole":
        return [text]
    size = int(split)
    return [text[i : i + size] for i in range(0, len(text), size)]


def all_chunks(pieces: list[str], batch_sentences: int = 1) -> list[str]:
    released, flushed = stream(pieces, batch_sentences)
    return [batch for _, batch in released] + flushed


SPLITS = ["chars", "words", "whole", "3", "7"]
REPLIES = [
    "The capital of Australia is Canberra and not Sydney as many people assume because it was a compromise.",
    "Your next meeting with the design team starts at 10:30 tomorrow morning in the small conference room.",
    "My birthday is Jan 1, 1980. What is yours?",
    "Abraham Lincoln was born on February 12, 1809, in a log cabin in Kentucky.",
    "He was born on 1 January 1980 in a small town near the coast of Maine.",
    "You should ask Dr. Smith about the results because she ran the tests last week.",
    "A coffee costs $3.50 here but only 3.5% of people buy one every single day.",
    "The train leaves from platform No. 5 at noon and arrives two hours later.",
    "Sure, I can help with that. What would you like to cook tonight?",
    "Paris.",
]


@pytest.mark.parametrize("text", REPLIES)
def test_any_deltas_give_the_same_chunks(text: str) -> None:
    expected = all_chunks(deltas(text, "chars"))
    for split in SPLITS:
        assert all_chunks(deltas(text, split)) == expected, split
    assert " ".join(expected).split() == text.split()


@pytest.mark.parametrize("split", SPLITS)
def test_a_date_is_never_split(split: str) -> None:
    assert all_chunks(deltas("My birthday is Jan 1, 1980.", split)) == ["My birthday is Jan 1, 1980."]
    out = all_chunks(deltas("My birthday is Jan 1, 1980. What is yours?", split))
    assert out == ["My birthday is Jan 1, 1980.", "What is yours?"]
    out = all_chunks(deltas("My birthday is January 1, 1980, and I was born in Ohio.", split))
    assert out == ["My birthday is January 1, 1980,", "and I was born in Ohio."]


@pytest.mark.parametrize("split", ["chars", "words", "whole"])
@pytest.mark.parametrize(
    "text",
    [
        "The capital of Australia is Canberra and not Sydney as many people assume because it was built there.",
        "I set a timer for fifteen minutes and I will let you know when it is done in a little while.",
        "Tomorrow will be mostly sunny with a high of twenty degrees and a light breeze from the west later on.",
        "A light year is the distance that light travels in one year which is about ten trillion kilometers.",
        "Our team has reviewed the new proposal very carefully this week and everyone agrees that it looks good.",
    ],
)  # fmt: skip
def test_a_long_statement_without_commas_starts_with_a_few_words(text: str, split: str) -> None:
    assert len(text.split()) >= 18 and "," not in text
    out = all_chunks(deltas(text, split))
    assert 5 <= len(out[0].split()) <= 7
    assert " ".join(out).split() == text.split()
    assert len(out) == 2  # the rest of the sentence is one chunk


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("The capital of Australia is Canberra and not Sydney.", "The capital of Australia is Canberra"),
        ("A light year is the distance that light travels in one year.", "A light year is the distance"),
        # no conjunction or preposition within reach: the last plain gap of two
        ("Your next meeting with the design team starts at ten tomorrow.", "Your next meeting with the design"),
        # every gap splits a phrase: the first such gap
        ("So, the answer is that the capital of Australia is Canberra.", "So, the answer is that"),
    ],
)  # fmt: skip
def test_the_word_gap_prefers_a_conjunction_or_preposition(text: str, first: str) -> None:
    assert all_chunks(tokens(text))[0] == first


@pytest.mark.parametrize("split", ["chars", "words", "whole"])
@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("He was born on 1 January 1980 in a small town near the coast.", "1 January 1980"),
        ("It was a cold Monday, January 1, 1980 when the new law came into force.", "Monday, January 1, 1980"),
        ("Our small city has 1,000,000 residents and a very big hospital downtown.", "1,000,000 residents"),
        ("In the end about 3,500 people came to the concert in the park.", "about 3,500 people"),
        ("The value of pi is about 3.14 and it never ends or repeats.", "3.14"),
        ("The big store opens at 10:30 in the morning and closes at nine.", "at 10:30"),
        ("The old store opens at 10 a.m. on most days of the week.", "at 10 a.m. on"),
        ("You should go and ask Dr. Smith about the results of your tests.", "Dr. Smith"),
        ("You should go and ask Dr. John Smith about the results of your tests.", "Dr. John Smith"),
        ("You should go and ask Dr Smith about the results of your tests.", "Dr Smith"),
        ("Some of the tastiest fruits e.g. this apple contain a lot of fiber.", "e.g. this"),
        ("Some of the tastiest fruits, e.g., apples, contain a lot of fiber.", "e.g., apples"),
        ("The brand new U.S. policy on trade was announced yesterday.", "U.S. policy"),
        ("A small cup of coffee costs $3.50 here but tea is cheap.", "$3.50 here"),
        ("The rate of inflation rose to 3.5 percent in May and fell in June.", "3.5 percent"),
        ("The train always leaves from platform No. 5 at noon on weekdays.", "No. 5"),
        ("The long war lasted from 1939\u20131945 and changed the world.", "1939\u20131945"),
        ("The store here is open from 9 to 5 on most of the weekdays.", "9 to 5"),
        ("We visited the beautiful city of New York City last summer with friends.", "New York City"),
    ],
)  # fmt: skip
def test_protected_spans_are_never_split(text: str, span: str, split: str) -> None:
    out = all_chunks(deltas(text, split))
    assert len(out) == 2  # the first chunk did end early
    assert any(span in chunk for chunk in out), out
    assert " ".join(out).split() == text.split()


def test_number_signs_do_not_end_sentences() -> None:
    assert split_sentences("Room No. 5 is free. Yes.") == ["Room No. 5 is free.", "Yes."]
    assert split_sentences("See fig. 3 for details.") == ["See fig. 3 for details."]
    assert split_sentences("Is it? No. 5 people came.") == ["Is it?", "No.", "5 people came."]  # "No." alone is a word


@pytest.mark.parametrize("split", SPLITS)
def test_a_short_reply_is_one_chunk(split: str) -> None:
    for text in ("Paris.", "Yes, it is.", "The capital of France is Paris.", "Sure, I can help with that."):
        assert all_chunks(deltas(text, split)) == [text]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("To boil an egg you put it in boiling water for nine minutes.", "To boil an egg"),
        ("Your next meeting with the design team starts at ten tomorrow.", "Your next meeting"),
        ("The capital of Australia is Canberra and not Sydney.", "The capital of Australia"),
        ("There are 366 days in a leap year.", "There are 366 days"),
        ("Well, it depends on the weather, really.", "Well,"),
        ("Oh, that sounds like a busy day! How did you spend it?", "Oh,"),
        ('The play "Romeo and Juliet" was written by Shakespeare.', 'The play "Romeo and Juliet"'),
        ("Jupiter. It is the largest planet.", "Jupiter."),
    ],
)  # fmt: skip
def test_the_default_first_chunk_is_a_clause_or_three_or_four_words(text: str, first: str) -> None:
    """The defaults (for the 1.5B's ~20 tokens/s): a short first phrase (a one-word clause such as "Oh,"),
    never inside a quotation."""
    streamer = SentenceStreamer()
    out = [chunk for piece in tokens(text) for chunk in streamer.push(piece)] + list(streamer.flush())
    assert out[0] == first
    assert " ".join(out).split() == text.split()


def test_a_growing_word_is_never_judged() -> None:
    # "and" may still become "android": the gap before it is judged once whitespace follows it
    assert first_chunk_end("One two three four five and", cut_words=5) is None
    assert first_chunk_end("One two three four five and ", cut_words=5) == len("One two three four five")
    # no such word: the last plain gap of three, once the third is known
    assert first_chunk_end("One two three four five android six seven", cut_words=5, window=3) is None
    seven = "One two three four five android six seven "
    assert first_chunk_end(seven, cut_words=5, window=3) == len("One two three four five android six")


def test_the_word_gap_rule_can_be_turned_off() -> None:
    text = "The capital of Australia is Canberra and not Sydney. Yes."
    assert chunks(text, first_cut_words=0) == ["The capital of Australia is Canberra and not Sydney.", "Yes."]
    assert first_chunk_end(text + " ", cut_words=0) is None


def test_numbers_before_a_clause_mark() -> None:
    assert first_clause_end("My birthday is Jan 1, ") is None  # the year may follow
    assert first_clause_end("My birthday is Jan 1, 1980") is None
    assert first_clause_end("Then on Jan 1, we") == len("Then on Jan 1,")
    assert first_clause_end("The war lasted from 1939 - 1945 and") is None
    assert first_clause_end("It was a cold Monday, Janua") is None  # "January" or another word?
    assert first_clause_end("It was a cold Monday, January ") is None
    assert first_clause_end("It was a cold Monday, and ") == len("It was a cold Monday,")
    assert first_clause_end("You should eat e.g., apples, pears") == len("You should eat e.g., apples,")


_PLAIN_WORDS = ["cats", "sleep", "often", "near", "the", "warm", "window", "and", "dogs", "run", "to", "parks"]
_PIECES = [*_PLAIN_WORDS, "Dr. Smith", "Jan 1, 1980", "3,500 people", "10:30", "No. 5", "so,", "well;", "e.g. this"]


@st.composite
def replies_and_deltas(draw: st.DrawFn) -> tuple[str, list[str]]:
    sentences = []
    for _ in range(draw(st.integers(1, 3))):
        words = [draw(st.sampled_from(_PLAIN_WORDS)), *draw(st.lists(st.sampled_from(_PIECES), max_size=20))]
        # no stop right after "so," or "well;": a comma after a word is a clause boundary whatever follows
        sentence = " ".join(words).rstrip(",;")
        sentences.append(sentence[0].upper() + sentence[1:] + draw(st.sampled_from([".", "!", "?"])))
    text = " ".join(sentences)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12))))
    return text, [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(replies_and_deltas())
def test_random_deltas_give_the_chunks_of_the_whole_text(case: tuple[str, list[str]]) -> None:
    text, pieces = case
    out = all_chunks(pieces)
    assert out == all_chunks([text])
    assert all(chunk and chunk == chunk.strip() for chunk in out)
    assert " ".join(out).split() == text.split()
    for span in ("Dr. Smith", "Jan 1, 1980", "3,500 people", "No. 5", "e.g. this"):
        assert text.count(span) == sum(chunk.count(span) for chunk in out)
    first_sentence = split_sentences(text)[0]
    if out[0] != first_sentence:  # cut early: never a lone word
        assert len(out[0].split()) >= 4


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([w for w in _PLAIN_WORDS if w != "the"]), min_size=12, max_size=25))
def test_a_plain_sentence_starts_with_five_to_seven_words(words: list[str]) -> None:
    text = " ".join(words).capitalize() + "."
    first = all_chunks(tokens(text))[0]
    assert 5 <= len(first.split()) <= 7


# -- word re-chunking for streaming-text TTS ----------------------------------------------


def stream_words(deltas: list[str]) -> list[str]:
    streamer = WordStreamer()
    out = [w for d in deltas for w in streamer.push(d)]
    return out + list(streamer.flush())


def test_words_split_across_deltas_come_out_whole() -> None:
    assert stream_words(["Hel", "lo wor", "ld, how", " are", " you"]) == ["Hello", " world,", " how", " are", " you"]


def test_leading_space_goes_with_the_next_word_and_runs_collapse() -> None:
    words = stream_words(["  foo \n\t bar", "  baz  "])
    assert words == ["foo", " bar", " baz"]
    assert "".join(words) == "foo bar baz"


def test_a_word_is_held_until_whitespace_or_flush() -> None:
    streamer = WordStreamer()
    assert list(streamer.push("wonder")) == []
    assert list(streamer.push("ful")) == []
    assert list(streamer.flush()) == ["wonderful"]
    assert list(streamer.flush()) == []


def test_a_long_second_sentence_after_a_short_first_chunk_ends_early_and_its_rest_comes_alone() -> None:
    """ "Sure!" plays ~0.4 s: a 26-word sentence after it left 2.6 s of silence in a spoken reply."""
    text = (
        "Sure! One fun fact about computers is that they can be programmed to perform complex tasks, "
        "such as recognizing patterns in images or predicting stock prices. They are fast. Very fast. Indeed."
    )
    out = chunks(text, batch_sentences=2, first_clause_words=1, first_cut_words=3)
    assert out[0] == "Sure!"
    assert 8 <= len(out[1].split()) <= 12 and text.split(".")[0].startswith(out[0] + " " + out[1])
    assert out[2].endswith("stock prices.")  # the rest of the sentence, alone
    assert out[3:] == ["They are fast. Very fast.", "Indeed."]  # then batches of two
    assert " ".join(out).split() == text.split()


def test_a_short_second_sentence_or_one_after_a_longer_first_chunk_stays_whole() -> None:
    out = chunks("Oh, that sounds like a busy day! How did you spend it?", first_clause_words=1, first_cut_words=3)
    assert out == ["Oh,", "that sounds like a busy day!", "How did you spend it?"]
    text = "The capital of Australia is Canberra and not Sydney as many people assume because it was a compromise."
    out = chunks(text, first_clause_words=1, first_cut_words=3)
    assert len(out) == 2 and len(out[0].split()) >= 3  # the rest of a 3+-word first chunk is not cut again
