"""Dialogues and deterministic scoring of :mod:`benchmark_quality` (pure functions, no models).

The dialogues live in ``scripts/data/quality_dialogues.json`` (:func:`load_dialogues`). Every
turn has a ``kind``, which decides how its reply is scored by :func:`score_turn`:

- ``fact``, ``followup``, ``number``, ``memory``: one of the turn's expected facts is in the reply
  (:func:`has_fact`: case-insensitive, whole words, hyphens read as spaces, thousands commas
  dropped; a fact written in digits also matches its words: "48" or "forty eight", "7.5" or
  "seven point five");
- ``statement``, ``smalltalk``: a reaction, not a repeat: the reply is not empty, not an echo
  (:func:`is_echo` of the words the server heard), not a refusal (:data:`REFUSAL`: "I can't
  assist with that" is no reaction to "my sister is getting married") and not a bare yes or no
  (:data:`BARE_YES_NO`: "Yes, it is." answers a question nobody asked; it is no reaction to "He
  might even have been made amiable himself.");
- ``shorter`` ("shorter please"): at most :data:`SHORTER_MAX_SHARE` of the previous reply's words,
  on its subject (:func:`is_shorter`);
- ``repeat`` ("say that again"): most of the previous reply's content words again
  (:func:`repeat_overlap` at least :data:`REPEAT_MIN`);
- ``tool``: a call of the expected tool with matching arguments (:func:`call_matches`), and one
  of the facts when the turn has any.

A turn of a dialogue that offers tools but whose kind is not ``tool`` must not call one. Every
kind needs a reply that is not empty, from a response that did not fail.

**Echo score** (:func:`echo_score`): both texts are tokenised (:func:`tokens`: lower case,
hyphens as spaces, runs of letters (of any script) and digits with inner apostrophes, a trailing possessive
``'s`` dropped), the words of :data:`STOP_WORDS` are removed, and the score is
``|U ∩ R| / |U|`` over the *sets* of remaining (content) words of the user's turn ``U`` and
the reply ``R``; 0 when the user said no content word. Above :data:`ECHO_FLAG` the reply is an
echo (:func:`is_echo`: it repeats most of what the user said) when it also shares at least
:data:`ECHO_MIN_WORDS` content words or adds none of its own: "How are you doing?" -> "I'm doing
well!" shares the one content word the user said, adds "well", and is no echo; "Okay, wish me
luck" -> "Okay, wish me luck." is one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speech_to_speech.testing import REPO_ROOT

#: the dialogues of the benchmark
DIALOGUES_FILE = REPO_ROOT / "scripts" / "data" / "quality_dialogues.json"
#: the per-language dialogues (``benchmark_quality.py --languages``): fact questions in French,
#: German, Spanish and, as the control, English, each said by espeak-ng in its language
LANGUAGE_DIALOGUES_FILE = DIALOGUES_FILE.with_name("language_dialogues.json")
#: a reply whose echo score is above this repeats the user (an echo)
ECHO_FLAG = 0.5
#: an echo shares at least this many content words with the user's turn (or adds none)
ECHO_MIN_WORDS = 2
#: "say that again": the share of the previous reply's content words the reply must have
REPEAT_MIN = 0.6
#: kinds scored by their expected facts
FACT_KINDS = ("fact", "followup", "number", "memory")
#: a refusal, which is no reaction to a statement
REFUSAL = re.compile(r"\b(?:can't|cannot|can not|unable to|not able to)\s+(?:assist|help)\b", re.IGNORECASE)
#: a reply that is only a yes or no, maybe with a pronoun and an auxiliary verb ("Yes, it is.",
#: "Yes, she did.", "No, it isn't.", "Yes."): the answer to a yes/no question, no reaction to news
BARE_YES_NO = re.compile(
    r"^\W*(?:yes|yeah|yep|no|nope)\b(?:\W+(?:it|he|she|they|i|you|we|that|this|there)\s+"
    r"(?:is|was|are|were|am|do|does|did|has|have|had|can|could|will|would)(?:n't|\s+not)?)?\W*$",
    re.IGNORECASE,
)
#: a reply to "shorter, please" has at most this share of the previous reply's words: the 1.5B
#: answered 67 words with 57 and 56 with 55 (the same reply less its last clause), which a listener
#: does not hear as shorter
SHORTER_MAX_SHARE = 2 / 3
#: ... and at least this share of its content words: "I'm sorry, but I can't assist with that."
#: is shorter, and no answer
SHORTER_MIN_OVERLAP = 0.15
#: kinds that need a reaction (a comment or a question), not a repeat
REACTION_KINDS = ("statement", "smalltalk")
#: every kind and its category in the report
CATEGORIES: dict[str, str] = {
    "fact": "facts",
    "followup": "follow-ups",
    "number": "numbers",
    "memory": "memory",
    "statement": "statements/small talk",
    "smalltalk": "statements/small talk",
    "shorter": "instructions",
    "repeat": "instructions",
    "tool": "tool calls",
}
#: the voices a dialogue may be said in
VOICES = ("piper", "espeak")


#: function words left out of the echo score (a short list: articles, pronouns, auxiliaries,
#: prepositions, conjunctions, greetings and fillers)
def _words(text: str) -> list[str]:
    """The whitespace-separated words of ``text`` (for the word lists below)."""
    return text.split()


STOP_WORDS = frozenset(
    _words(
        """
    a an the and or but so if then than of to in on at for from with by about as into up out over
    is am are was were be been being do does did done have has had will would can could should may
    might must shall i me my mine myself you your yours he him his she her it its we us our they them
    their this that these those there here what which who whom whose when where why how not no yes
    oh ah um uh okay ok just very really too also all some any please hi hello hey thanks thank
    i'm i've i'll i'd you're you've you'll you'd he's she's it's we're we've they're they've that's
    there's what's who's don't doesn't didn't isn't aren't wasn't weren't can't couldn't won't let's
    """
    )
)
_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
_ONES += "seventeen eighteen nineteen"
ONES = _words(_ONES)
TENS = _words("_ _ twenty thirty forty fifty sixty seventy eighty ninety")


@dataclass(frozen=True)
class Turn:
    """One user turn of a dialogue.

    Attributes:
        kind: how the reply is scored (see the module docstring).
        say: the words synthesised in the dialogue's voice (for a clip: its transcript, synthesised
            only when the clip is not installed).
        clip: a LibriVox clip stem of pocketsphinx-testdata ("" for synthesised speech).
        facts: accepted facts (any one must be in the reply).
        call: ``(tool, values)``: ``get_time`` with accepted timezones, ``add`` with its two addends.
    """

    kind: str
    say: str = ""
    clip: str = ""
    facts: tuple[str, ...] = ()
    call: tuple[str, tuple[Any, ...]] | None = None


@dataclass(frozen=True)
class Dialogue:
    """A conversation run as one realtime session."""

    name: str
    voice: str
    turns: tuple[Turn, ...]
    tools: bool = False
    language: str = "en"


def load_dialogues(path: Path = DIALOGUES_FILE) -> list[Dialogue]:
    """The dialogues of ``path`` (see ``about`` in the file).

    Raises:
        ValueError: an unknown kind or voice, a turn with neither ``say`` nor ``clip``, a fact
            turn without facts, a tool turn without a call, a Piper dialogue not in English (the
            embedded voice speaks English only).
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    dialogues = []
    for d in data["dialogues"]:
        turns = []
        for t in d["turns"]:
            call = (t["call"][0], tuple(t["call"][1])) if "call" in t else None
            turn = Turn(t["kind"], t.get("say", ""), t.get("clip", ""), tuple(t.get("facts", ())), call)
            where = f"{d['name']!r} turn {len(turns) + 1}"
            if turn.kind not in CATEGORIES:
                raise ValueError(f"{where}: unknown kind {turn.kind!r}")
            if not (turn.say or turn.clip):
                raise ValueError(f"{where}: needs 'say' or 'clip'")
            if turn.kind in FACT_KINDS and not turn.facts:
                raise ValueError(f"{where}: a {turn.kind} turn needs facts")
            if (turn.kind == "tool") != (turn.call is not None):
                raise ValueError(f"{where}: 'call' goes with kind 'tool' only, and it needs one")
            turns.append(turn)
        if d["voice"] not in VOICES:
            raise ValueError(f"{d['name']!r}: unknown voice {d['voice']!r}")
        language = str(d.get("language", "en"))
        if d["voice"] == "piper" and language != "en":
            raise ValueError(f"{d['name']!r}: the Piper voice speaks English, not {language!r}")
        dialogues.append(Dialogue(d["name"], d["voice"], tuple(turns), bool(d.get("tools", False)), language))
    return dialogues


# -- words ------------------------------------------------------------------------------------


def tokens(text: str) -> list[str]:
    """Lower-case words of ``text``: hyphens as spaces, inner apostrophes kept, a trailing ``'s`` of a
    word that is not a stop word dropped ("Austen's" -> "austen", "it's" stays)."""
    text = text.lower().replace("’", "'").replace("-", " ")
    words = re.findall(r"[^\W_]+(?:'[^\W_]+)*", text)  # letters of any script: "océan", "größte"
    return [w[:-2] if w.endswith("'s") and w not in STOP_WORDS else w for w in words]


def content_words(text: str) -> set[str]:
    """The set of :func:`tokens` of ``text`` that are not :data:`STOP_WORDS`."""
    return {w for w in tokens(text) if w not in STOP_WORDS}


def echo_score(user: str, reply: str) -> float:
    """Share of the user's content words that the reply repeats: ``|U ∩ R| / |U|`` (0 if ``U`` is empty)."""
    said = content_words(user)
    return len(said & content_words(reply)) / len(said) if said else 0.0


def is_echo(user: str, reply: str) -> bool:
    """The reply repeats the user: :func:`echo_score` above :data:`ECHO_FLAG`, and at least
    :data:`ECHO_MIN_WORDS` content words in common or no content word the user did not say."""
    said, answered = content_words(user), content_words(reply)
    shared = said & answered
    return echo_score(user, reply) > ECHO_FLAG and (len(shared) >= ECHO_MIN_WORDS or answered <= said)


def word_count(text: str) -> int:
    """Words of a reply, as the report counts them (whitespace-separated)."""
    return len(text.split())


def number_words(value: float) -> str | None:
    """``value`` in English words ("forty eight", "seven point five", "one thousand two hundred"),
    for 0 <= value < 1,000,000 with at most two decimals; None otherwise."""
    if value < 0 or value >= 1_000_000 or round(value, 2) != value:
        return None
    whole = int(value)
    if whole != value:
        decimals = f"{value:.2f}".split(".")[1].rstrip("0")
        return f"{number_words(whole)} point {' '.join(ONES[int(d)] for d in decimals)}"
    if whole < 20:
        return ONES[whole]
    if whole < 100:
        return TENS[whole // 10] + ("" if whole % 10 == 0 else " " + ONES[whole % 10])
    if whole < 1000:
        rest = whole % 100
        return f"{ONES[whole // 100]} hundred" + ("" if rest == 0 else f" {number_words(rest)}")
    rest = whole % 1000
    return f"{number_words(whole // 1000)} thousand" + ("" if rest == 0 else f" {number_words(rest)}")


def fact_variants(fact: str) -> list[str]:
    """``fact`` lower-cased, hyphens as spaces, and, for a number in digits, its words too."""
    fact = fact.lower().replace("-", " ").strip()
    variants = [fact]
    if re.fullmatch(r"\d+(?:\.\d+)?", fact) and (words := number_words(float(fact))):
        variants.append(words)
        if words.startswith("one hundred"):
            variants.append("a" + words[3:])  # "a hundred"
    return variants


def has_fact(reply: str, facts: tuple[str, ...] | list[str]) -> bool:
    """True when one of ``facts`` is in ``reply`` as whole words (see :func:`fact_variants`).

    Case and hyphens are ignored and thousands separators dropped ("1,200" reads "1200"); a
    number does not match inside a longer one ("100" is not in "100.5" nor in "1000"), and may
    carry a temperature's unit ("100C", "212°F", "300K"; not "100th").
    """
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", reply.lower().replace("’", "'").replace("-", " "))
    text = " ".join(text.split())
    for fact in facts:
        for variant in fact_variants(fact):
            unit = r"(?:°?[cfk]\b)|" if re.fullmatch(r"[\d.]+", variant) else ""
            if re.search(rf"(?<![\w.]){re.escape(variant)}(?:{unit}(?!\w|\.\d))", text):
                return True
    return False


def repeat_overlap(previous: str, reply: str) -> float:
    """Share of the previous reply's content words found in ``reply`` (all its words when it has no
    content word); 0 when the previous reply was empty."""
    before = content_words(previous) or set(tokens(previous))
    if not before:
        return 0.0
    return len(before & set(tokens(reply))) / len(before)


def is_shorter(previous: str, reply: str) -> bool:
    """True when ``reply`` has words, at most :data:`SHORTER_MAX_SHARE` as many as ``previous``,
    and keeps at least :data:`SHORTER_MIN_OVERLAP` of its content words (:func:`repeat_overlap`):
    the same answer, clearly shorter; not a refusal, and not the same reply less a sentence."""
    words = word_count(reply)
    return 0 < words <= SHORTER_MAX_SHARE * word_count(previous) and (
        repeat_overlap(previous, reply) >= SHORTER_MIN_OVERLAP
    )


def call_matches(name: str, arguments: dict[str, Any], expected: tuple[str, tuple[Any, ...]]) -> bool:
    """True when the call ``name(arguments)`` is the expected one.

    ``get_time``: its ``timezone`` (absent: UTC) is one of the expected names, case-insensitive;
    ``add``: ``a`` and ``b`` are the two expected numbers in either order; any other tool: the
    same name and the arguments' values, in order, equal the expected values.
    """
    tool, values = expected
    if name != tool:
        return False
    if tool == "get_time":
        return str(arguments.get("timezone", "UTC")).lower() in {str(v).lower() for v in values}
    if tool == "add":
        try:
            return sorted([float(arguments["a"]), float(arguments["b"])]) == sorted(float(v) for v in values)
        except (KeyError, TypeError, ValueError):
            return False
    return tuple(arguments.values()) == tuple(values)


# -- one turn ---------------------------------------------------------------------------------


@dataclass
class Verdict:
    """The score of one reply: right or not, why not, its echo score, whether it is an echo
    (:func:`is_echo`), and its length in words."""

    right: bool
    why: str = ""
    echo: float = 0.0
    echoed: bool = False
    words: int = 0
    flags: list[str] = field(default_factory=list)


def score_turn(
    turn: Turn,
    heard: str,
    reply: str,
    previous: str = "",
    calls: list[tuple[str, dict[str, Any]]] | None = None,
    tools_offered: bool = False,
    failed: bool = False,
) -> Verdict:
    """Score ``reply`` to ``turn`` (see the module docstring).

    Args:
        heard: what the server transcribed of the user's speech (the echo score uses it).
        previous: the assistant's reply to the turn before (for ``shorter`` and ``repeat``).
        calls: the tool calls the turn made, ``(name, decoded arguments)``.
        tools_offered: the session offered tools (then a turn of another kind must not call one).
        failed: no response of the turn completed (the server said a fallback line, if anything):
            the turn is wrong whatever the reply says.
    """
    calls = calls or []
    plain = reply.replace("’", "'")  # typographic apostrophes as the patterns write them
    verdict = Verdict(False, echo=echo_score(heard, reply), echoed=is_echo(heard, reply), words=word_count(reply))
    if verdict.echoed:
        verdict.flags.append(f"echo {verdict.echo:.2f}")
    if failed:
        verdict.why = "response failed"
    elif not reply.strip():
        verdict.why = "no reply"
    elif turn.kind in FACT_KINDS:
        verdict.why = "" if has_fact(reply, turn.facts) else f"missing fact ({' / '.join(turn.facts)})"
    elif turn.kind in REACTION_KINDS and verdict.echoed:
        verdict.why = f"echo ({verdict.echo:.2f} of the user's content words)"
    elif turn.kind in REACTION_KINDS and REFUSAL.search(plain):
        verdict.why = "refusal"
    elif turn.kind in REACTION_KINDS and BARE_YES_NO.match(plain.strip()):
        verdict.why = "a bare yes or no"
    elif turn.kind == "shorter":
        verdict.why = "" if is_shorter(previous, reply) else f"not shorter ({verdict.words} vs {word_count(previous)})"
    elif turn.kind == "repeat":
        overlap = repeat_overlap(previous, reply)
        verdict.why = "" if overlap >= REPEAT_MIN else f"not a repeat ({overlap:.2f} of the previous reply)"
    elif turn.kind == "tool":
        assert turn.call is not None
        if not any(call_matches(name, args, turn.call) for name, args in calls):
            made = ", ".join(f"{n}({json.dumps(a)})" for n, a in calls) or "none"
            verdict.why = f"expected {turn.call[0]}{list(turn.call[1])}, calls: {made}"
        elif turn.facts and not has_fact(reply, turn.facts):
            verdict.why = f"missing fact ({' / '.join(turn.facts)})"
    if not verdict.why and tools_offered and turn.kind != "tool" and calls:
        verdict.why = "called a tool: " + ", ".join(name for name, _ in calls)
    verdict.right = not verdict.why
    return verdict
