"""Semantic end of turn: after a short pause, a model judges from the audio whether the user is done.

``--turn_detection`` picks how a turn ends:

* ``smart_turn``: after ``speculative_silence_ms`` of silence (200 ms), the Smart Turn
  model (:mod:`handlers.turn.smart_turn`) scores the utterance; ``p >= turn_threshold``
  ends the turn at once, otherwise it ends after ``turn_max_silence_ms`` of silence
  (2 s), unless speech resumes first and continues it;
* ``silence``: the plain VAD rule, ``min_silence_ms`` of silence;
* ``auto`` (the default): ``smart_turn`` when its model is installed (the ``smart-turn``
  extra), else ``silence``.

The model runs in the VAD stage, once per pause (about 30 ms on one core), never per chunk:
the endpoint cannot be decided before its answer, and the chunks that arrive meanwhile wait
in the VAD's input queue and are scored in well under a millisecond each afterwards.

Like the registry, this module names the model's handler by import path and imports it
only when it is used (``speech_to_speech`` never imports ``handlers`` at import time).
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from speech_to_speech.core.shared import shared_model

logger = logging.getLogger(__name__)

#: values of ``--turn_detection``
TURN_DETECTION_MODES = ("auto", "smart_turn", "silence")
#: the module of the Smart Turn model wrapper (imported lazily)
SMART_TURN_MODULE = "handlers.turn.smart_turn"
#: the realtime protocol's ``semantic_vad`` eagerness → the silence bound of an unfinished turn, ms
#: (OpenAI's own bounds are 8, 4 and 2 s; these keep their proportions around our 2 s default)
EAGERNESS_MAX_SILENCE_MS = {"low": 4000, "medium": 2000, "auto": 2000, "high": 1000}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: words after which a sentence goes on even when Whisper writes a full stop after them ("I want
#: to go to the.", "My number is 555."): articles, determiners, possessives, prepositions,
#: conjunctions, fillers and "been", which end no finished English statement. Other auxiliaries
#: can ("than he was.", "Yes, I can.").
CONTINUATION_WORDS = _words(
    """
    a an the my your his her its our their this that these those some any every each
    of to in on at by for from with about into onto over under than as like per via
    and but or nor so because if when while where although though whether then been being
    have has had might may must could would should shall do does did
    um uh er erm hmm mm ah
    """
)
#: what :func:`transcript_ends_turn` finds
FINISHED_QUESTION, FINISHED_STATEMENT = "question", "statement"
#: a finished statement whose pause Smart Turn scored at least this P(done) (under its threshold)
#: ends after the question's silence, not the statement's: the words and the model both lean to
#: done. LibriVox sentences read whole scored 0.11-0.18 at their end, and the one mid-phrase cut whose
#: transcript read finished ("unless to be rather cold-hearted in wrath.") 0.04; clip 0930 over
#: WebRTC (Opus) scored 0.48 and waited 1,066 ms for the statement rule (2026-12-07)
STATEMENT_LIKELY_P = 0.4
#: number words: a pause after one is a pause inside a number ("my number is five five five ...")
NUMBER_WORDS = _words(
    """
    zero oh one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred
    thousand million billion point
    """
)
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")

#: what to run for a missing model
INSTALL_HINT = "install it with: pip install 'speech-to-speech[smart-turn]', or use --turn_detection silence"


class TurnModelUnavailable(FileNotFoundError):
    """``--turn_detection smart_turn`` was asked for but its model is not installed."""


class EndOfTurnModel(Protocol):
    """What :class:`TurnDetector` needs of a model."""

    def probability(self, samples: np.ndarray) -> float:
        """P(the turn is complete) for float32 mono ``samples`` at 16 kHz."""
        ...


def smart_turn_installed() -> bool:
    """Whether the Smart Turn model file can be found (reads no model, imports no pipecat)."""
    try:
        module = importlib.import_module(SMART_TURN_MODULE)
    except ImportError:
        return False
    return module.smart_turn_model_path() is not None


def transcript_ends_turn(text: str) -> str | None:
    """Whether a transcript reads as a finished turn: a question, or a sentence whose end does not
    lean on more words.

    Whisper punctuates what it hears, so a finished question ends with "?"; a statement often
    ends with "." or "!", but tiny.en leaves the last one out of short passes ("I'm thinking about
    baking bread this weekend"), so no punctuation counts as a statement too. A statement is not
    taken as finished when its last word is a number (a pause inside a phone number or a sum:
    "My number is 555.") or one of :data:`CONTINUATION_WORDS` ("I'd like to go to the."), or when
    it trails off ("...", "…") or ends with a comma, colon or dash.

    Args:
        text: the transcript of the utterance so far.

    Measured on the embedded Whisper tiny.en's transcripts (0.2 s of silence after the speech): all
    13 finished Piper turns read finished; of 12 LibriVox sentences cut mid-phrase, only one ("... how
    much their money.", misheard), which the end-of-turn model ended anyway; the 4 finished turns the
    model gave P < 0.3 ("I'm thinking about baking bread this weekend.": 0.04) all read finished.
    With the auxiliaries "have", "might", ... as continuation words (2026-12-03, ``benchmark_turns.py``
    (a)): 2 of 10 LibriVox cuts read finished, both misheard with an invented end ("He was not an
    idiot.", "... cold-hearted in wrath."), as many as the end-of-turn model alone ends early.

    Returns:
        :data:`FINISHED_QUESTION` or :data:`FINISHED_STATEMENT` when the words say the turn is
        over, else None.
    """
    text = text.strip().rstrip("\"'”’)]")
    if not text or text.endswith(("...", "…")) or text[-1] in ",;:-–—、，":
        return None
    words = _WORD.findall(text.lower())
    if not words:
        return None
    if text[-1] in "?？":
        return FINISHED_QUESTION
    last = words[-1]
    if any(c.isdigit() for c in last) or last in NUMBER_WORDS or last in CONTINUATION_WORDS:
        return None
    return FINISHED_STATEMENT


def resolve_turn_detection(mode: str) -> str:
    """The mode that will run: ``auto`` becomes ``smart_turn`` or ``silence``.

    Raises:
        ValueError: an unknown mode.
        TurnModelUnavailable: ``smart_turn`` without its model.
    """
    mode = mode.strip().lower()
    if mode not in TURN_DETECTION_MODES:
        raise ValueError(f"--turn_detection must be one of {', '.join(TURN_DETECTION_MODES)}, got {mode!r}")
    if mode == "silence":
        return mode
    installed = smart_turn_installed()
    if mode == "smart_turn" and not installed:
        raise TurnModelUnavailable(f"--turn_detection smart_turn: the Smart Turn model is missing; {INSTALL_HINT}")
    if mode == "auto" and not installed:
        logger.info("Smart Turn model not installed: turns end after --min_silence_ms of silence")
    return "smart_turn" if installed else "silence"


@dataclass
class TurnVerdict:
    """One judgement of :class:`TurnDetector`.

    Attributes:
        complete: the probability reached the threshold.
        probability: P(the turn is complete), 0-1.
        ms: how long the model took, ms.
    """

    complete: bool
    probability: float
    ms: float


class TurnDetector:
    """Judges whether an utterance is a finished turn.

    Args:
        model: an end-of-turn model (e.g. ``SmartTurnModel``).
        threshold: a probability at or above this is "complete" (0-1).

    Attributes:
        calls: how many judgements were made.
    """

    def __init__(self, model: EndOfTurnModel, threshold: float = 0.5) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"turn_threshold must be in (0, 1), got {threshold}")
        self.model = model
        self.threshold = threshold
        self.calls = 0

    def judge(self, samples: np.ndarray) -> TurnVerdict:
        """Score float32 mono 16 kHz ``samples`` (the utterance up to now, trailing pause included)."""
        started = time.monotonic()
        probability = float(self.model.probability(samples))
        self.calls += 1
        return TurnVerdict(probability >= self.threshold, probability, (time.monotonic() - started) * 1000)


def load_turn_detector(mode: str, threshold: float = 0.5) -> TurnDetector | None:
    """The detector for ``--turn_detection mode`` (None for plain silence), its model loaded once
    per process (server sessions share it).

    Raises:
        ValueError, TurnModelUnavailable: see :func:`resolve_turn_detection`.
    """
    if resolve_turn_detection(mode) == "silence":
        return None
    module: Any = importlib.import_module(SMART_TURN_MODULE)

    def load() -> EndOfTurnModel:
        model = module.SmartTurnModel()
        model.probability(np.zeros(module.SAMPLE_RATE, dtype=np.float32))  # the first call is slow (~150 ms)
        return model

    try:
        model = shared_model(("smart_turn", "v3.2"), load)
    except FileNotFoundError as exc:
        raise TurnModelUnavailable(f"Smart Turn: {exc}; {INSTALL_HINT}") from None
    return TurnDetector(model, threshold)
