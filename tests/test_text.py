"""Text for speech: filtering unspeakable characters and streaming sentence splitting."""

from __future__ import annotations

import re

import pytest

from speech_to_speech.text import (
    SentenceStreamer,
    WordStreamer,
    first_clause_end,
    is_speakable,
    remove_unspeakable,
    split_sentences,
)

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
    text_pieces: list[str], batch_sentences: int = 1, first_clause_words: int = 4
) -> tuple[list[tuple[int, str]], list[str]]:
    """Push every piece; return (index of piece when released, batch) pairs and the flushed batches."""
    streamer = SentenceStreamer(batch_sentences, first_clause_words)
    released = [(i, batch) for i, piece in enumerate(text_pieces) for batch in streamer.push(piece)]
    return released, list(streamer.flush())


def tokens(text: str) -> list[str]:
    """Split ``text`` like an LLM tokenizer might: words with their leading space."""
    return re.findall(r"\s*\S+", text)


def test_first_sentence_released_alone_when_next_starts() -> None:
    pieces = ["Hello", " there", ".", " How", " are", " you", "?", " Fine", "."]
    released, flushed = stream(pieces, batch_sentences=3)
    assert released[0] == (pieces.index(" How"), "Hello there.")
    assert flushed == ["How are you? Fine."]


def test_later_batches_respect_batch_sentences() -> None:
    text = "One is here. Two is here. Three is here. Four is here. Five is here. Six is here."
    released, flushed = stream(tokens(text), batch_sentences=2)
    batches = [batch for _, batch in released] + flushed
    assert batches == [
        "One is here.",
        "Two is here. Three is here.",
        "Four is here. Five is here.",
        "Six is here.",
    ]
    # every batch but the last is released before the stream ends
    assert len(released) == 3


def test_batches_of_one_release_each_sentence() -> None:
    released, flushed = stream(tokens("A cat slept. A dog ran. A bird flew."))
    assert [batch for _, batch in released] == ["A cat slept.", "A dog ran."]
    assert flushed == ["A bird flew."]


def test_missing_space_between_sentences_comes_out_at_flush() -> None:
    released, flushed = stream(list("Sentence one.Sentence two"))
    assert released == []
    assert " ".join(flushed).split() == ["Sentence", "one.Sentence", "two"]


def test_flush_twice_yields_nothing_more() -> None:
    streamer = SentenceStreamer()
    list(streamer.push("Hi there"))
    assert list(streamer.flush()) == ["Hi there"]
    assert list(streamer.flush()) == []


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


def chunks(text: str, split: str = "words", batch_sentences: int = 2, first_clause_words: int = 4) -> list[str]:
    pieces = tokens(text) if split == "words" else list(text)
    released, flushed = stream(pieces, batch_sentences, first_clause_words)
    return [batch for _, batch in released] + flushed


def test_first_clause_released_as_soon_as_the_space_after_its_comma_arrives() -> None:
    pieces = tokens("Paris is the capital of France, and it is known for its museums. It is lovely.")
    released, flushed = stream(pieces, batch_sentences=2)
    assert released[0] == (pieces.index(" and"), "Paris is the capital of France,")
    # the rest of the clipped sentence counts as one sentence of the next batch
    assert [batch for _, batch in released[1:]] + flushed == ["and it is known for its museums. It is lovely."]


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
    out = chunks("The big show costs 1,000 dollars and starts at 3:30 today, so come early. See you.", split)
    assert out[0] == "The big show costs 1,000 dollars and starts at 3:30 today,"
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
    assert out == ["Hi there.", "Paris is the capital of France, and it is lovely. Yes."]


def test_clause_rule_can_be_turned_off() -> None:
    text = "Paris is the capital of France, and it is lovely. Yes."
    assert chunks(text, first_clause_words=0) == ["Paris is the capital of France, and it is lovely.", "Yes."]


def test_first_clause_end_positions() -> None:
    assert first_clause_end("One two three four, five") == len("One two three four,")
    assert first_clause_end("One two three four,") is None  # the space after the comma has not arrived
    assert first_clause_end("One two three, four") is None
    assert first_clause_end("One two three, four five six seven, eight", min_words=6) == len(
        "One two three, four five six seven,"
    )
    assert first_clause_end("Hi. One two three four, five") is None


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
