"""Backchannels and false starts vs. real interruptions, from the transcript alone."""

from __future__ import annotations

import pytest

from speech_to_speech.turns.backchannel import is_backchannel, is_false_start


@pytest.mark.parametrize(
    "text",
    ["Yeah.", "yeah yeah", "Mm-hmm.", "Mhm.", "uh huh", "Uh-huh.", "Uh-uh.", "Okay.", "Okay, right.", "Right.",
     "I see.", "Got it.", "Oh, okay.", "mm hmm", "Sure."],
)  # fmt: skip
def test_acknowledgements_are_backchannels(text: str) -> None:
    assert is_backchannel(text)


@pytest.mark.parametrize(
    "text",
    ["Wait, stop.", "Stop.", "No.", "Yeah, but what about Tuesday?", "What time is it?", "okay okay okay okay",
     "It.", "and", "", "Hold on a second."],
)  # fmt: skip
def test_anything_with_content_is_not(text: str) -> None:
    assert not is_backchannel(text)


@pytest.mark.parametrize(
    "text", ["MMMM.", "Mm-mm.", "M-H-N.", "Mm, mm.", "hmmm", "Uhh.", "umm", "Ahh.", "Uh-huh. Mm-mm.", "Yeah, mmm."]
)
def test_hummed_continuers_however_whisper_spells_them(text: str) -> None:
    """What Whisper tiny.en writes for a hummed "mm-hmm" (seen on Piper and espeak-ng renditions)."""
    assert is_backchannel(text)


@pytest.mark.parametrize("text", ["Mom.", "me", "him", "hum", "a", "I", "I hope.", "am"])
def test_words_with_those_letters_are_not_hummed(text: str) -> None:
    assert not is_backchannel(text)


def test_other_languages_use_their_words_and_english_ones() -> None:
    assert is_backchannel("Vale, claro.", "es")
    assert is_backchannel("Ouais.", "fr")
    assert is_backchannel("Genau.", "de")
    assert not is_backchannel("Genau.", "en")
    assert is_backchannel("okay", "de")


@pytest.mark.parametrize("text", ["", "  ", "...", "[BLANK_AUDIO]", "(coughs)", "you", "Thank you."])
def test_false_starts_have_no_words(text: str) -> None:
    assert is_false_start(text)


def test_words_are_not_a_false_start() -> None:
    assert not is_false_start("Wait.")
    assert not is_false_start("Yeah.")


@pytest.mark.parametrize("text", ["Uh-huh. Mm-hmm. Okay. Right.", "Okay, right, yeah, sure.", "Yeah. Yeah. I see."])
def test_a_run_of_acknowledgements_is_one(text: str) -> None:
    """What a turn reopened by each new backchannel transcribes (seen in scripts/benchmark_turns.py)."""
    assert is_backchannel(text)


@pytest.mark.parametrize("text", ["Uh-huh. Mm-hmm. Okay. Stop.", "Yeah. Yeah. What time is it?", "okay okay okay okay"])
def test_a_run_with_content_in_it_is_not(text: str) -> None:
    assert not is_backchannel(text)
