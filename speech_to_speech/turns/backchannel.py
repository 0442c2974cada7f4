"""Telling a backchannel ("yeah", "mm-hmm") or a false start from a real interruption.

When the user speaks while the assistant is talking, the reply is paused at once;
what was said then decides what happens: a short acknowledgement, or noise with
no words, lets the reply resume; anything else is an interruption. This module
is the "what was said" part, a pure function of the transcript.

The word lists are the acknowledgement tokens of conversation-analysis work on
English backchannels (continuers and acknowledgement tokens: "mm-hmm", "uh-huh",
"yeah", "right", "okay", "I see"...), with their usual spellings in Whisper
transcripts ("Mm-hmm.", "Uh-huh.", "Mhm."), plus the common equivalents in the
other languages the embedded voice stack is used with (es, fr, de, it, pt).
"""

from __future__ import annotations

import re
import unicodedata

#: at most this many words for a backchannel ("yeah yeah", "oh okay", "I see")
MAX_BACKCHANNEL_WORDS = 3

_ENGLISH = {
    "yeah", "yea", "yes", "yep", "yup", "ya", "ok", "okay", "kay", "right", "alright", "sure", "cool",
    "mhm", "mmhm", "mmhmm", "mhmm", "mm", "mmm", "hmm", "hm", "uhhuh", "uhuh", "ah", "aha", "oh", "ooh",
    "wow", "nice", "great", "good", "gotcha", "true", "totally", "exactly", "indeed", "huh", "uh", "um",
    "see", "i", "got", "it", "makes", "sense", "really", "and",
}  # fmt: skip
#: words that only count inside a phrase ("I see", "got it", "makes sense"), never alone
_PHRASE_ONLY = {"i", "see", "got", "it", "makes", "sense", "and"}
_OTHER = {
    "es": {"sí", "si", "vale", "claro", "ajá", "aja", "bueno", "ya", "ok", "okay", "mhm"},
    "fr": {"oui", "ouais", "d'accord", "daccord", "ok", "okay", "ah", "bon", "voilà", "mhm", "hum"},
    "de": {"ja", "jaja", "genau", "okay", "ok", "stimmt", "klar", "aha", "mhm", "hm"},
    "it": {"sì", "si", "certo", "ok", "okay", "esatto", "già", "mhm", "ah"},
    "pt": {"sim", "tá", "ta", "certo", "ok", "okay", "pois", "é", "mhm", "ah"},
}
#: a hummed or grunted continuer, however Whisper spells it: "Mm", "MMMM", "Mm-mm", "M-H-N",
#: "hmmm", "uhh", "umm", "ahh" (nasal sounds, or a vowel and h/m, and nothing else)
_HUMMED = re.compile(r"[mhn]*m[mhn]*|[aeou]+h+|u+m+")
#: where one acknowledgement of a run ends ("Uh-huh. Mm-hmm.", "okay, right")
_CLAUSE_END = re.compile(r"[.!?,;…]+")
#: transcripts Whisper gives for noise, breath or silence (hallucinations), treated as no words
_NON_SPEECH = {"", "you", "thank you", "thanks for watching", "bye"}


def _words(text: str) -> list[str]:
    """Lower-case words of ``text`` without punctuation; hyphenated forms joined ("uh-huh" → "uhhuh")."""
    text = unicodedata.normalize("NFC", text).lower()
    text = re.sub(r"(?<=\w)[-‐‑](?=\w)", "", text)
    text = re.sub(r"\[[^\]]*\]|\([^)]*\)", " ", text)  # [BLANK_AUDIO], (coughs)
    return re.findall(r"[\w']+", text)


def is_false_start(text: str) -> bool:
    """Whether a transcript has no words worth answering (noise, a breath, a Whisper hallucination)."""
    words = _words(text)
    return not words or " ".join(words) in _NON_SPEECH


def is_backchannel(text: str, language: str | None = "en") -> bool:
    """Whether ``text`` is only an acknowledgement (at most :data:`MAX_BACKCHANNEL_WORDS` words).

    Args:
        text: the STT transcript of what the user said during the reply.
        language: ISO 639-1 code of the transcript; English words count in every language.

    A run of acknowledgements, each a sentence or clause of its own, is one too ("Uh-huh.
    Mm-hmm. Okay. Right.": the user went on acknowledging within one turn, which a turn
    reopened by each new one transcribes whole).

    Returns:
        True for e.g. "Yeah.", "Mm-hmm.", "uh huh", "Okay, right.", "I see", "MMMM.", "M-H-N.",
        "Uh-huh. Mm-hmm. Okay. Right."; False for anything with content ("yeah but wait", "stop",
        "no", "Yeah. Stop.") and for empty text (see :func:`is_false_start`).
    """
    words = _words(text)
    if len(words) > MAX_BACKCHANNEL_WORDS:
        parts = [part for part in _CLAUSE_END.split(text) if _words(part)]
        return len(parts) > 1 and all(is_backchannel(part, language) for part in parts)
    if not words:
        return False
    joined = "".join(words)
    if joined in ("uhhuh", "mmhmm", "mhm", "mmhm"):  # "uh huh", "mm hmm" written apart
        return True
    vocabulary = _ENGLISH | _OTHER.get((language or "en").split("-")[0], set())
    # a word of the list, or hummed however Whisper spells it ("MMMM.", "M-H-N.", "Uh-huh. Mm-mm.")
    if not all(word in vocabulary or _HUMMED.fullmatch(word) for word in words):
        return False
    return not all(word in _PHRASE_ONLY for word in words) or " ".join(words) in ("i see", "got it", "makes sense")


#: at least this share of a transcript's words must be words the voice just played for it to be
#: the voice's echo (Whisper on an uncancelled echo of "Once upon a time" heard "Once a pot.": 2
#: of 3; a real interruption shares its small words at most: "and mister john dashwood had then
#: leisure ..." shares 2 of 22 with the story it interrupted)
ECHO_WORD_SHARE = 0.6


def is_echo(text: str, played: str) -> bool:
    """Whether a transcript only repeats what the assistant's voice just said (its echo).

    Args:
        text: the STT transcript of what was heard during the reply.
        played: the words the voice played shortly before and while it was heard.

    Returns:
        True when at least :data:`ECHO_WORD_SHARE` of the transcript's words are among
        ``played``'s (e.g. "Once a pot." after "Once upon a time there was"); False for a
        transcript with no words (see :func:`is_false_start`) or nothing played.
    """
    words, voice = _words(text), set(_words(played))
    if not words or not voice:
        return False
    return sum(word in voice for word in words) >= ECHO_WORD_SHARE * len(words)
