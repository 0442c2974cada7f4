"""Text for speech: removing unspeakable characters and streaming sentence splitting.

Sentence boundaries come from NLTK's Punkt tokenizer (Kiss & Strunk, 2006,
"Unsupervised Multilingual Sentence Boundary Detection"). NLTK's pretrained
Punkt tables are a separate download, so to work offline out of the box we
build the tokenizer from parameters: a list of common English abbreviations
written for this project. CJK sentence-final punctuation, which Punkt does not
know, is split on as well.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import lru_cache

from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

#: Lower-case abbreviations (without their final period) that do not end a sentence.
#: Abbreviations that are also common words ("sat", "no", "sun", "mar") are left out on
#: purpose: wrongly joining two sentences delays the first audio of a reply.
_ABBREVIATIONS = """
    mr mrs ms mx dr prof sr jr st mt ft rev sgt capt lt cmdr gov sen pres
    u.s u.k u.n e.u a.m p.m e.g i.e etc vs approx dept inc ltd corp
    jan feb apr jun jul aug sep sept oct nov dec tue tues thu thur thurs fri
    ave blvd hwy apt p.s ph.d m.d b.a m.a d.c
"""
ENGLISH_ABBREVIATIONS = frozenset(_ABBREVIATIONS.split())

_CURLY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": ", "})
_SPEAKABLE_PUNCT = set(".,;:!?'\"-()%&/$€£¥@+=")
_CJK_PUNCT = set("。，、；：！？「」『』（）《》〈〉…・")
_MARKDOWN_RUN = re.compile(r"(\*{1,3}|_{2,3}|`{1,3}|~~|^#{1,6}\s*|^\s*[-*+]\s+|^\s*>\s*)", re.MULTILINE)
_SPACES = re.compile(r"[ \t]{2,}")
_CJK_SPLIT = re.compile(r"(?<=[。！？])")
_HAS_WORD = re.compile(r"\w", re.UNICODE)


def remove_unspeakable(text: str) -> str:
    """Keep only what a TTS engine can say.

    Keeps letters and marks of every script, digits, whitespace, common
    punctuation and CJK punctuation; removes markdown marks, emoji and other
    symbols; turns curly quotes and dashes into plain ones.

    Args:
        text: raw LLM text.

    Returns:
        The filtered text (possibly empty). Whitespace is preserved so that
        streamed pieces still join correctly.
    """
    text = _MARKDOWN_RUN.sub("", text.translate(_CURLY))
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category[0] in "LMN" or char.isspace() or char in _SPEAKABLE_PUNCT or char in _CJK_PUNCT:
            out.append(char)
    return _SPACES.sub(" ", "".join(out))


def is_speakable(text: str) -> bool:
    """True when ``text`` has at least one letter or digit (not only punctuation)."""
    return bool(_HAS_WORD.search(text.replace("_", "")))


@lru_cache(maxsize=1)
def _punkt() -> PunktSentenceTokenizer:
    params = PunktParameters()
    params.abbrev_types = set(ENGLISH_ABBREVIATIONS)
    return PunktSentenceTokenizer(params)


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (Punkt plus CJK terminators), stripped, non-empty."""
    sentences: list[str] = []
    for sentence in _punkt().tokenize(text):
        sentences.extend(part.strip() for part in _CJK_SPLIT.split(sentence) if part.strip())
    return sentences


class SentenceStreamer:
    """Turns a stream of text deltas into complete sentences as early as possible.

    The last sentence Punkt finds may be unfinished, so it stays buffered (with
    its trailing whitespace) until more text arrives or :meth:`flush` is called.

    Args:
        batch_sentences: sentences per batch after the first; the first complete
            sentence is always released alone, at once, to cut time to first audio.
    """

    def __init__(self, batch_sentences: int = 1) -> None:
        if batch_sentences < 1:
            raise ValueError("batch_sentences must be >= 1")
        self.batch_sentences = batch_sentences
        self._buffer = ""
        self._batch: list[str] = []
        self._sent_first = False

    def push(self, delta: str) -> Iterator[str]:
        """Add ``delta``; yield batches of complete sentences (joined with spaces)."""
        self._buffer += delta
        sentences = split_sentences(self._buffer)
        if len(sentences) < 2:
            return
        trailing = self._buffer[len(self._buffer.rstrip()) :]
        for sentence in sentences[:-1]:
            yield from self._add(sentence)
        self._buffer = sentences[-1] + trailing

    def _add(self, sentence: str) -> Iterator[str]:
        self._batch.append(sentence)
        if not self._sent_first or len(self._batch) >= self.batch_sentences:
            self._sent_first = True
            batch, self._batch = " ".join(self._batch), []
            yield batch

    def flush(self) -> Iterator[str]:
        """Yield whatever is pending: the batch so far plus the buffered tail."""
        tail = self._buffer.strip()
        self._buffer = ""
        if tail:
            self._batch.extend(split_sentences(tail) or [tail])
        if self._batch:
            batch, self._batch = " ".join(self._batch), []
            self._sent_first = True
            yield batch


class WordStreamer:
    """Re-chunks a stream of text deltas into whole words, for TTS engines that take streaming text.

    A word is released once the whitespace after it arrives; it carries a single
    leading space (except the very first word), so joining the words rebuilds the
    text with runs of whitespace collapsed. :meth:`flush` releases the last word.
    Splitting words across deltas would make such engines mispronounce them.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._first = True

    def push(self, delta: str) -> Iterator[str]:
        """Add ``delta``; yield every word it completed."""
        self._buffer += delta
        parts = re.split(r"\s+", self._buffer)
        self._buffer = parts.pop()  # unfinished (or empty, after trailing whitespace)
        for word in parts:
            if word:
                yield from self._emit(word)

    def flush(self) -> Iterator[str]:
        """Yield the last, unterminated word, if any."""
        word, self._buffer = self._buffer, ""
        if word:
            yield from self._emit(word)

    def _emit(self, word: str) -> Iterator[str]:
        yield word if self._first else " " + word
        self._first = False
