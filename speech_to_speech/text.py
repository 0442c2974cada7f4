"""Text for speech: removing unspeakable characters and streaming sentence splitting.

Sentence boundaries come from NLTK's Punkt tokenizer (Kiss & Strunk, 2006,
"Unsupervised Multilingual Sentence Boundary Detection"). NLTK's pretrained
Punkt tables are a separate download, so to work offline out of the box we
build the tokenizer from parameters: a list of common English abbreviations
written for this project. CJK sentence-final punctuation, which Punkt does not
know, is split on as well.

Splitting happens here, once: :class:`SentenceStreamer` decides every chunk
the TTS stage receives (the TTS stage speaks each chunk as it comes and never
re-splits it). Only the first chunk of a reply may end before a sentence does,
at a clause boundary (see :func:`first_clause_end`), so that speech starts as
early as possible.
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
#: a clause boundary: ``,`` ``;`` ``:`` (perhaps closing a quote or bracket) followed by
#: whitespace, a spaced hyphen or double hyphen, or an em/en dash followed by anything.
#: The whitespace (or next character) must already have arrived, so a streamed "1," of
#: "1,000" or "3:" of "3:30" is never a boundary.
_CLAUSE_END = re.compile(r"[,;:][\"')\]]*(?=\s)|(?<=\s)--?(?=\s)|[\u2014\u2013](?=.)", re.DOTALL)

#: words a reply's first chunk needs before it may end at a clause boundary. Four words are
#: 1.0-1.3 s of speech for the default voice (Piper "joe" speaks 3.1-4.0 words/s, measured),
#: enough to cover making the next chunk: the rest of the sentence (~10-15 tokens; the embedded
#: LLM writes ~39 tokens/s on 2 cores) and its synthesis (Piper runs at ~0.05x real time, ~18 ms
#: a word), about 0.5 s. Each word fewer would bring the first audio only ~50 ms sooner (one
#: word's tokens plus its synthesis), while "Sure," or "Well, yes," alone would leave a gap
#: before the rest and sound like a stutter.
FIRST_CLAUSE_MIN_WORDS = 4


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


def _word_count(text: str) -> int:
    return sum(1 for word in text.split() if is_speakable(word))


def first_clause_end(text: str, min_words: int = FIRST_CLAUSE_MIN_WORDS) -> int | None:
    """Where the first chunk of a reply may end early: just after a clause boundary.

    The boundary is the earliest ``,`` ``;`` ``:`` or dash (see :data:`_CLAUSE_END`)
    with at least ``min_words`` words before it and no sentence end before it (if a
    sentence ends first, that sentence is the first chunk). Digits around ``,`` or
    ``:`` ("1,000", "3:30") never qualify, since the boundary needs whitespace after it.

    Returns:
        The index in ``text`` just after the boundary, or None.
    """
    if min_words < 1:
        return None
    for match in _CLAUSE_END.finditer(text):
        head = text[: match.end()]
        if len(split_sentences(head)) > 1:
            return None
        if _word_count(head) >= min_words:
            return match.end()
    return None


#: text that ends a sentence: terminal punctuation, maybe closing quotes or brackets, then spaces
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*\s*$")


class SentenceStreamer:
    """Turns a stream of text deltas into chunks for TTS as early as possible.

    The first chunk of a reply is released alone and at once: the first clause of
    at least ``first_clause_words`` words (ended by a comma, semicolon, colon or
    dash, see :func:`first_clause_end`) or else the first complete sentence,
    whichever is ready first. Every later chunk is a batch of ``batch_sentences``
    complete sentences (the rest of a clipped first sentence counts as one).

    The last sentence Punkt finds may be unfinished, so it stays buffered (with
    its trailing whitespace) until more text arrives or :meth:`flush` is called.

    Args:
        batch_sentences: sentences per batch after the first chunk.
        first_clause_words: words the first chunk needs before it may end at a clause
            boundary; 0 keeps the first chunk a whole sentence.
    """

    def __init__(self, batch_sentences: int = 1, first_clause_words: int = FIRST_CLAUSE_MIN_WORDS) -> None:
        if batch_sentences < 1:
            raise ValueError("batch_sentences must be >= 1")
        self.batch_sentences = batch_sentences
        self.first_clause_words = first_clause_words
        self._buffer = ""
        self._batch: list[str] = []
        self._sent_first = False

    def push(self, delta: str) -> Iterator[str]:
        """Add ``delta``; yield chunks: the first clause or sentence, then sentence batches."""
        self._buffer += delta
        if not self._sent_first and (cut := first_clause_end(self._buffer, self.first_clause_words)):
            head, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:].lstrip()
            yield from self._add(head)
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

    def flush_complete(self) -> Iterator[str]:
        """Like :meth:`flush`, but only when the buffered tail ends a sentence (``.``, ``!``,
        ``?`` or ``…``, closing quotes or brackets allowed): for a stream that paused after a
        whole sentence, which otherwise waits for the next text to be released."""
        if _SENTENCE_END.search(self._buffer):
            yield from self.flush()

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
