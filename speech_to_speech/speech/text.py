"""Text for speech: removing unspeakable characters and streaming sentence splitting.

Sentence boundaries come from NLTK's Punkt tokenizer (Kiss & Strunk, 2006,
"Unsupervised Multilingual Sentence Boundary Detection"). NLTK's pretrained
Punkt tables are a separate download, so to work offline out of the box we
build the tokenizer from parameters: a list of common English abbreviations
written for this project. CJK sentence-final punctuation, which Punkt does not
know, is split on as well.

Splitting happens here, once: :class:`SentenceStreamer` decides every chunk
the TTS stage receives (the TTS stage speaks each chunk as it comes and never
re-splits it). Only the first chunk of a reply may end before a sentence does
(see :func:`first_chunk_end`), so that speech starts as early as possible: at
the first clause boundary, or else at a word gap after three or four words, never
inside a date, number, time, abbreviation, name or quotation.
"""

from __future__ import annotations

import itertools
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
    ave blvd hwy apt p.s ph.d m.d b.a m.a d.c viz cf
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
#: a comma or semicolon right after a letter ("Yes," "Oh," "Well;"): a clause boundary known the
#: moment it is written, without waiting for the space (one token, ~50-70 ms of the 1.5B on 2 cores)
#: where no quotation or bracket is open (see :func:`_letter_comma_decided`). After a digit ("1,000")
#: or for a colon ("3:30", "http:") the general rule waits for what follows.
_LETTER_COMMA = re.compile(r"(?<=[^\W\d_])[,;]")

#: words a reply's first chunk needs before it may end at a clause boundary. With the embedded
#: 1.5B (the default) decoding ~20-30 tokens/s on 2 cores, each word more in the first chunk is
#: ~50-75 ms more before the first sound. One word: a reaction's "Oh," / "Sure," / "Well," is spoken
#: at once, and the rest of its sentence is the second chunk, released alone as soon as it is
#: complete (:class:`SentenceStreamer`). On the 10 spoken turns (``benchmark_latency.py --spoken``,
#: 2026-12-04, back to back, with that second-chunk rule): voice-to-voice p50 1,045 -> 976 ms, p90
#: 1,375 -> 1,099 ms against two words; the pause after "Oh," / "Sure," in the reply's audio was
#: 340 / 480 ms (320 / 340 ms with two words). Earlier (2026-12-03) going from 4 clause / 5 gap
#: words to 2 / 3 brought p50 from 1,785 to 1,307 ms.
FIRST_CLAUSE_MIN_WORDS = 1

#: words a long second sentence needs before it may end early (at a clause boundary or word gap,
#: by the first chunk's rules). "Sure!" and then a 26-word sentence left 2.6 s of silence in a reply
#: (the sentence took ~1.3 s to write beside TTS and ~0.4 s to synthesise, "Sure!" plays ~0.4 s);
#: eight words (~0.6 s to write) keep short sentences whole
SECOND_CUT_MIN_WORDS = 8


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: words a reply's first chunk needs before it may end at a plain word gap, when no clause
#: boundary came first: one more than a clause needs, since a cut with no punctuation is heard
#: more as a break in the phrase ("The capital of Australia | is Canberra."); see above for the
#: cost of each word.
FIRST_CUT_MIN_WORDS = 3

#: word gaps (from the FIRST_CUT_MIN_WORDS-th word on, gaps inside protected spans not counted)
#: among which the first chunk's cut is chosen. A gap before a conjunction, preposition or relative
#: word (see :func:`_gap_score`) is taken at once; else the better of these gaps once the last one
#: is known: the first chunk ends after 3-4 words (more only around protected spans or quotations).
FIRST_CUT_WINDOW = 2

#: words a cut may come just before: they start a clause or phrase (conjunctions, relative and
#: question words, prepositions but "of", which belongs to the noun before it).
_CUT_BEFORE = _word_set(
    """
    and but or nor so yet because since although though while whereas when whenever where wherever
    if unless until after before once as than that which who whom whose whether what why how
    to in on at with for from by into onto through during without within between across like
"""
)
#: words that lean on the next one: a cut just after one splits a phrase ("the | capital",
#: "is | about", "and | then"): articles, determiners, prepositions, conjunctions, auxiliaries.
_LEANS_RIGHT = _word_set(
    """
    a an the this that these those my your his her its our their some any no every each all both such
    of to in on at by for from with about into onto over under than as like per via without within
    between among across around through during after before until since near toward towards upon
    and but or nor so because if when while where although though whether which who what how why
    i we he she they will would can could should must may might shall do does did is are was were am
    be been being has have had not very too more most less quite really just also only even
    approximately nearly almost roughly
"""
)
#: words that lean on the word before so much that the first chunk never ends before one ("capital | of")
_LEANS_LEFT = frozenset({"of", "too", "either"})
_MONTHS = _word_set(
    """
    january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
"""
)
_WEEKDAYS = _word_set(
    """
    monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri sat sun
"""
)
#: titles before a name, with or without their period ("Dr Smith", "Dr. Smith")
_TITLES = _word_set("mr mrs ms mx dr prof sir st mt rev sgt capt lt gen col gov sen pres")
#: abbreviations that introduce what follows: a comma after one ("e.g., apples") ends no clause
_INTRODUCERS = frozenset({"e.g", "i.e", "viz", "cf"})
#: signs for "number" and the like, which Punkt takes for a sentence end before a digit ("No. 5")
_NUMBER_SIGNS = frozenset({"no", "nos", "vol", "fig", "pp", "op"})
#: words after which the word-gap rule gives up: gaps so far were all protected (a long title-case
#: name, a list of numbers); the first clause or sentence ends the chunk. Scanning costs ~8 us a
#: word on each delta (measured on 2 cores), so this bounds the rule's cost for a long sentence.
_FIRST_CUT_GIVE_UP_WORDS = 20
#: words of :data:`_CUT_BEFORE` that still belong with a number before them ("9 | to 5", "3 | or 4")
_RANGE_WORDS = frozenset({"to", "or", "through", "until", "by"})
_OPENERS = "\"'([{"
_CLOSERS = "\"')]}"
_NUMBER_START = re.compile(r"[$€£¥#+-]?\d")
_INITIALS = re.compile(r"[^\W\d_](?:\.[^\W\d_])*")
_WORD = re.compile(r"\S+")
_NEXT_WORD = re.compile(r"\s*(\S+)(\s)?")


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


def split_sentences(text: str, continued: bool = False) -> list[str]:
    """Split ``text`` into sentences (Punkt plus CJK terminators), stripped, non-empty.

    A sentence Punkt ends with a sign for "number" ("Room No." of "Room No. 5 is free") goes on
    into the next one when that starts with a digit, unless the sign is the whole sentence ("Is
    it? No. 5 came."): then it is taken for the word "No", except at the start of a ``continued``
    text, the rest of a sentence whose start was cut off ("The winner, | No. 5, ran").
    """
    sentences: list[str] = []
    for sentence in _punkt().tokenize(text):
        for part in _CJK_SPLIT.split(sentence):
            part = part.strip()
            if not part:
                continue
            if (
                sentences
                and part[0].isdigit()
                and _ends_with_number_sign(sentences[-1], continued and len(sentences) == 1)
            ):
                sentences[-1] += " " + part
            else:
                sentences.append(part)
    return sentences


def _ends_with_number_sign(sentence: str, alone: bool) -> bool:
    words = sentence.lower().split()
    return (alone or len(words) > 1) and words[-1].endswith(".") and words[-1][:-1] in _NUMBER_SIGNS


def _word_count(text: str) -> int:
    return sum(1 for word in text.split() if is_speakable(word))


def _bare(word: str) -> str:
    """``word`` lower-cased, without quotes, brackets and ``,;:`` around it (a final period stays)."""
    return word.lower().lstrip(_OPENERS).rstrip(_CLOSERS + ",;:")


def _is_abbreviation(word: str) -> bool:
    """True when ``word`` ends with the period of an abbreviation or of initials ("Dr.", "U.S.", "J.")."""
    bare = _bare(word)
    if not bare.endswith("."):
        return False
    base = bare[:-1]
    return base in ENGLISH_ABBREVIATIONS or base in _NUMBER_SIGNS or bool(_INITIALS.fullmatch(base))


def _protected(prev: str, nxt: str) -> bool:
    """True when the gap between two whole words is inside a span spoken as one.

    Such spans: a number with what follows it ("Jan 1, | 1980", "1 | January", "3,500 | people",
    "10 | a.m.", "3.5 | percent", "9 | to 5"; but "1980 | in Ohio" is free, see
    :data:`_RANGE_WORDS`); a number after a month, a "number" sign or a word leaning on it ("Jan |
    1", "No. | 5", "about | 330"); a weekday before a month; a title before a name ("Dr | Smith");
    a run of capitalised words ("John | Smith", "New | York").
    """
    p, n = _bare(prev), _bare(nxt)
    if any(char.isdigit() for char in p):
        return n not in _CUT_BEFORE or n in _RANGE_WORDS
    if _NUMBER_START.match(n) and (p in _MONTHS or p.rstrip(".") in _NUMBER_SIGNS or p in _LEANS_RIGHT):
        return True
    if p.rstrip(".") in _TITLES or (p in _WEEKDAYS and n in _MONTHS):
        return True
    return prev.lstrip(_OPENERS)[:1].isupper() and nxt.lstrip(_OPENERS)[:1].isupper()


def _gap_score(prev: str, nxt: str) -> int | None:
    """How good the gap between two whole words is for the first chunk to end at, for speech.

    Returns:
        2 before a conjunction, preposition or relative word ("... Canberra | and not Sydney",
        "... the distance | that light travels"); 1 at another gap; 0 where it splits a phrase
        (after a word of :data:`_LEANS_RIGHT`); None where the chunk may not end: before "of"
        (:data:`_LEANS_LEFT`), inside a protected span (see :func:`_protected`), after a sentence
        end, an abbreviation or a clause boundary (the clause rule decides those), before the last
        word of a sentence, or next to a word with nothing to say ("-").
    """
    if not (is_speakable(prev) and is_speakable(nxt)) or _protected(prev, nxt):
        return None
    if prev.rstrip(_CLOSERS)[-1:] in ".!?…,;:\u2014\u2013-":
        return None
    if nxt.rstrip(_CLOSERS)[-1:] in ".!?…" and not _is_abbreviation(nxt):
        return None
    p, n = _bare(prev), _bare(nxt)
    if n in _LEANS_LEFT:
        return None
    if p in _LEANS_RIGHT:
        return 0
    return 2 if n in _CUT_BEFORE else 1


def _word_gap_cut(text: str, min_words: int, window: int) -> tuple[int, int] | None:
    """The first chunk's end at a word gap, as (length of ``text`` needed to decide it, the end).

    Scans the gaps after the ``min_words``-th word: takes the first gap of score 2 (see
    :func:`_gap_score`), or else, once ``window`` gaps that may end the chunk are known, the best:
    the last gap of score 1 (the chunk is as long as the wait allows, and a plain gap late in a
    phrase more often follows its head: "the design team | starts"), or else the first gap of
    score 0 (where every place splits a phrase, the chunk stays short). A gap is known once the
    word after it is whole (whitespace follows it), so a word that may still grow is never judged,
    and the decision never depends on text past that point. Past :data:`_FIRST_CUT_GIVE_UP_WORDS`
    words with no end found the rule gives up (and costs nothing more per delta).
    """
    count, seen = 0, []
    for word, nxt in itertools.pairwise(_WORD.finditer(text)):
        count += is_speakable(word.group())
        if count < min_words:
            continue
        if count > _FIRST_CUT_GIVE_UP_WORDS:
            return None
        if nxt.end() >= len(text):
            return None
        score = _gap_score(word.group(), nxt.group())
        if score is None or text.count('"', 0, word.end()) % 2:  # never inside a quotation
            continue
        seen.append((score, word.end()))
        if score == 2 or len(seen) >= window:
            best = max(score for score, _ in seen)
            cuts = [cut for score, cut in seen if score == best]
            return nxt.end() + 1, cuts[-1] if best else cuts[0]
    return None


def _clause_decided(text: str, match: re.Match[str]) -> int | None:
    """The length of ``text`` needed to tell that a match of :data:`_CLAUSE_END` is a clause
    boundary; None when it is not one, or while the text after it is too short to tell.

    Not boundaries: punctuation between numbers ("Jan 1, 1980", "1939\u20131945", "1 - 2"; known
    when the next character comes), a comma after "e.g." and the like, and a comma between a
    weekday and a month ("Monday, January 1"; known when the next word is whole).
    """
    before = text[: match.start()].rstrip()
    after = _NEXT_WORD.match(text, match.end())
    if before[-1:].isdigit():
        if after is None:
            return None
        return None if after.group(1)[0].isdigit() else after.start(1) + 1
    prev = _bare(before.split()[-1]) if before.split() else ""
    if match.group()[0] == "," and prev.rstrip(".") in _INTRODUCERS:
        return None
    if match.group()[0] == "," and prev in _WEEKDAYS:
        if after is None or after.group(2) is None:
            return None
        return None if _bare(after.group(1)) in _MONTHS else after.end()
    return match.end() + 1


def _balanced(text: str) -> bool:
    """No quotation or bracket is open at the end of ``text`` (a clause mark after it is not followed
    by a closing one)."""
    return text.count('"') % 2 == 0 and text.count("(") <= text.count(")") and text.count("[") <= text.count("]")


def _letter_comma_decided(text: str, match: re.Match[str]) -> int | None:
    """The length of ``text`` needed to tell that a match of :data:`_LETTER_COMMA` is a clause
    boundary: the mark itself, whatever follows it, where no quotation or bracket is open
    before it (else a closing mark may follow: the general rule waits for the space) and the word
    before it is not one after which the comma may belong to what follows ("e.g.,", "Monday,").
    None: the general rule decides."""
    before = text[: match.start()]
    words = before.split()
    prev = _bare(words[-1]) if words else ""
    if prev in _INTRODUCERS or prev in _WEEKDAYS or not _balanced(before):
        return None
    return match.end()


def _clause_cut(text: str, min_words: int) -> tuple[int, int] | None:
    """The first chunk's end at a clause boundary, as (length of ``text`` needed to decide it, the end)."""
    best: tuple[int, int] | None = None
    for match in _LETTER_COMMA.finditer(text):
        if _word_count(text[: match.end()]) < min_words:
            continue
        decided = _letter_comma_decided(text, match)
        if decided is not None:
            best = (decided, match.end())
            break
    for match in _CLAUSE_END.finditer(text):
        if best is not None and match.start() >= best[0]:
            break
        if _word_count(text[: match.end()]) < min_words:
            continue
        decided = _clause_decided(text, match)
        if decided is not None and (best is None or decided < best[0]):
            best = (decided, match.end())
    return best


def first_chunk_end(
    text: str,
    clause_words: int = FIRST_CLAUSE_MIN_WORDS,
    cut_words: int = FIRST_CUT_MIN_WORDS,
    window: int = FIRST_CUT_WINDOW,
) -> int | None:
    """Where the first chunk of a reply may end before its first sentence does.

    The rule: the chunk ends at the first clause boundary (``,`` ``;`` ``:`` or a dash, see
    :data:`_CLAUSE_END`) with at least ``clause_words`` words before it, or at a word gap after at
    least ``cut_words`` words (see :func:`_word_gap_cut`), whichever can be decided from less text;
    on a tie, the later end. Never inside a protected span (a date, number, time, abbreviation or
    name, see :func:`_protected` and :func:`_clause_decided`), and never when a sentence ends first
    (that sentence is the first chunk). The result depends only on the text needed to decide it, so
    any way of cutting a reply into streamed deltas gives the same first chunk.

    Args:
        text: the reply so far.
        clause_words: words needed before a clause boundary; 0 turns off both rules.
        cut_words: words needed before a word gap; 0 turns off the word-gap rule.
        window: gaps considered for the word-gap rule (see :data:`FIRST_CUT_WINDOW`).

    Returns:
        The index in ``text`` just after the end (before the whitespace there), or None.
    """
    if clause_words < 1:
        return None
    found = [_clause_cut(text, clause_words)]
    if cut_words >= 1:
        found.append(_word_gap_cut(text, cut_words, max(window, 1)))
    ready = [cut for cut in found if cut is not None]
    if not ready:
        return None
    decided, end = min(ready, key=lambda cut: (cut[0], -cut[1]))
    if len(split_sentences(text[:decided])) > 1:
        return None
    return end


def first_clause_end(text: str, min_words: int = FIRST_CLAUSE_MIN_WORDS) -> int | None:
    """Where the first chunk of a reply may end at a clause boundary: :func:`first_chunk_end`
    without the word-gap rule. A comma or semicolon after a letter is one at once ("Oh,"); other
    boundaries need the whitespace (or, after a number, the next character) after them, so a
    streamed "1," of "1,000" or "3:" of "3:30" is never one.

    Returns:
        The index in ``text`` just after the boundary, or None.
    """
    return first_chunk_end(text, min_words, 0)


def sentence_ended(text: str, continued: bool = False) -> bool:
    """Whether ``text`` is one sentence whose end is known without the text after it: it ends with
    "!" or "?" right after a letter, or with "." after a word that is no abbreviation, initial or
    sign for "number" ("Jupiter." but not "Dr.", "J." or "No."), and no quotation or bracket is
    open. Punkt needs the next word to tell the rest; this lets a reply's first chunk ("Jupiter.")
    go to TTS as its last token is written instead of with the next one (~50-70 ms of the 1.5B on
    2 cores). The price: a name with a dot in it whose first part ends the first sentence so far
    ("Try weather." of "Try weather.com") is spoken as two chunks.

    Args:
        text: a reply's text so far (trailing whitespace allowed).
        continued: ``text`` is the rest of a sentence whose start was cut off (see
            :func:`split_sentences`).
    """
    stripped = text.rstrip()
    if len(stripped) < 2 or stripped[-1] not in ".!?" or not stripped[-2].isalpha():
        return False
    if stripped[-1] == "." and _is_abbreviation(stripped.split()[-1]):
        return False
    return _balanced(stripped) and len(split_sentences(stripped, continued)) == 1


#: text that ends a sentence: terminal punctuation, maybe closing quotes or brackets, then spaces
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*\s*$")


class SentenceStreamer:
    """Turns a stream of text deltas into chunks for TTS as early as possible.

    The first chunk of a reply is released alone and at once: it ends where
    :func:`first_chunk_end` says (the first clause of at least ``first_clause_words``
    words, or a word gap after at least ``first_cut_words`` words) or else with the
    first complete sentence, whichever is ready first. The second chunk is released alone
    too, as soon as its sentence is complete (the rest of a clipped first sentence, or the
    sentence after a first one): it is what the listener waits for while the first plays,
    and a short first chunk ("Oh,", "Jupiter.") plays for only 0.3-0.6 s. A long second
    sentence after a first chunk of one or two words ends early as the first chunk may, at a
    clause boundary or word gap after :data:`SECOND_CUT_MIN_WORDS` words, and its rest is
    released alone. Every later chunk is a batch of ``batch_sentences`` complete sentences.

    The last sentence Punkt finds may be unfinished, so it stays buffered (with
    its trailing whitespace) until more text arrives or :meth:`flush` is called.

    Args:
        batch_sentences: sentences per batch after the first chunk.
        first_clause_words: words the first chunk needs before it may end at a clause
            boundary; 0 keeps the first chunk a whole sentence.
        first_cut_words: words the first chunk needs before it may end at a word gap;
            0 lets it end early only at a clause boundary.
    """

    def __init__(
        self,
        batch_sentences: int = 1,
        first_clause_words: int = FIRST_CLAUSE_MIN_WORDS,
        first_cut_words: int = FIRST_CUT_MIN_WORDS,
    ) -> None:
        if batch_sentences < 1:
            raise ValueError("batch_sentences must be >= 1")
        self.batch_sentences = batch_sentences
        self.first_clause_words = first_clause_words
        self.first_cut_words = first_cut_words
        self._buffer = ""
        self._batch: list[str] = []
        self._released = 0  # chunks released so far
        self._first_words = 0  # words of the first chunk
        self._mid_sentence = False  # the buffer starts inside a sentence (after a first chunk cut early)
        self._ended_sentence = False  # a whole sentence was released or batched

    def push(self, delta: str) -> Iterator[str]:
        """Add ``delta``; yield chunks: the first clause or sentence, then sentence batches."""
        self._buffer += delta
        while True:
            cut = self._early_cut()
            if cut is not None:
                head, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:].lstrip()
                self._mid_sentence = True
                yield from self._add(head)
            elif self._released < 2 and not self._batch and sentence_ended(self._buffer, self._mid_sentence):
                # the first or second chunk is a whole sentence: it goes now, not with the next token
                head, self._buffer, self._mid_sentence = self._buffer.strip(), "", False
                yield from self._add(head, alone=True)
                return
            sentences = split_sentences(self._buffer, self._mid_sentence)
            if len(sentences) < 2:
                return
            # the rest of a sentence cut early is released alone: its start is playing
            rest_alone, self._mid_sentence = self._mid_sentence, False
            trailing = self._buffer[len(self._buffer.rstrip()) :]
            for i, sentence in enumerate(sentences[:-1]):
                if self._second_cut_due():  # a whole second sentence may still end early
                    cut = first_chunk_end(
                        " ".join(sentences[i:]) + trailing, SECOND_CUT_MIN_WORDS, SECOND_CUT_MIN_WORDS
                    )
                    if cut is not None and cut < len(sentence):
                        yield from self._add(sentence[:cut].strip())
                        yield from self._add(sentence[cut:].strip(), alone=True)
                        continue
                yield from self._add(sentence, alone=rest_alone and i == 0)
            self._buffer = sentences[-1] + trailing

    def _early_cut(self) -> int | None:
        """Where the buffer's sentence may end before it does: the first chunk's (see
        :func:`first_chunk_end`), or a long second sentence's (see :meth:`_second_cut_due`);
        None: not here."""
        if not self._released:
            return first_chunk_end(self._buffer, self.first_clause_words, self.first_cut_words)
        if self._second_cut_due():
            return first_chunk_end(self._buffer, SECOND_CUT_MIN_WORDS, SECOND_CUT_MIN_WORDS)
        return None

    def _second_cut_due(self) -> bool:
        """The next chunk is the second, after a first chunk of one or two words ("Sure!", "Oh,"),
        whose audio is short: it may end early too."""
        return self._released == 1 and self._first_words < FIRST_CUT_MIN_WORDS and not self._batch

    def _add(self, sentence: str, alone: bool = False) -> Iterator[str]:
        if not self._released and not self._batch:
            self._first_words = len(sentence.split())
        self._ended_sentence = self._ended_sentence or bool(_SENTENCE_END.search(sentence))
        self._batch.append(sentence)
        if alone or self._released < 2 or len(self._batch) >= self.batch_sentences:
            self._released += 1
            batch, self._batch = " ".join(self._batch), []
            yield batch

    def flush_complete(self) -> Iterator[str]:
        """Like :meth:`flush`, but only when the buffered tail ends a sentence (``.``, ``!``,
        ``?`` or ``…``, closing quotes or brackets allowed): for a stream that paused after a
        whole sentence, which otherwise waits for the next text to be released."""
        if _SENTENCE_END.search(self._buffer):
            yield from self.flush()

    def drop_unfinished(self) -> str:
        """Discard the buffered tail when it does not end a sentence and a whole sentence came
        before it (a reply cut at its token cap: "... which is illuminated by" is not spoken);
        return what was discarded ("" if nothing). A reply of one unfinished sentence keeps it."""
        tail = self._buffer.strip()
        if not tail or _SENTENCE_END.search(tail) or not self._ended_sentence:
            return ""
        self._buffer, self._mid_sentence = "", False
        return tail

    def flush(self) -> Iterator[str]:
        """Yield whatever is pending: the batch so far plus the buffered tail."""
        tail = self._buffer.strip()
        self._buffer = ""
        if tail:
            self._batch.extend(split_sentences(tail, self._mid_sentence) or [tail])
        self._mid_sentence = False
        if self._batch:
            batch, self._batch = " ".join(self._batch), []
            self._released += 1
            yield batch
