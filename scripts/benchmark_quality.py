"""Conversation-quality check: does the LLM answer spoken questions right, briefly and speakably?

Each candidate model answers the same spoken-style questions (:data:`QUESTIONS`, written the
way Whisper transcribes speech), each as a first typed turn (history reset before every one)
through the LLM backend, built from the registry exactly as the CLI builds it, with the
product's voice system prompt (the turn wants audio, so the backend uses
:func:`speech_to_speech.prompts.build_voice_system_prompt`). Every reply is scored
automatically:

- **fact**: one of the question's expected facts appears in the reply (case-insensitive, whole
  words, hyphens read as spaces: "eight" or "8" for a spider's legs);
- **brief**: at most :data:`MAX_SENTENCES` sentences, counted by the product's own sentence
  splitter (:func:`speech_to_speech.text.split_sentences`);
- **plain**: no markdown (bold/italic marks, backticks, headings, list bullets or numbers at a
  line start, links), which a voice cannot say;
- **all**: the three together.

Also timed: request -> first chunk for TTS (``1st ms``) and -> end of the reply (``reply ms``).
Candidates are GGUF files (or anything ``--llm_model`` takes) for one ``--llm_backend`` (default:
the CLI's default backend); the backend's default model is the candidate ``default``. Flags after
``--`` go to the CLI (e.g. ``-- --temperature 0 --max_new_tokens 64``)::

    python scripts/benchmark_quality.py                            # the default backend and model
    python scripts/benchmark_quality.py --llm_model default --llm_model other.gguf --verbose

Prints one row per candidate (percent of replies passing each check, mean words per reply,
p50 times), then the questions each candidate got wrong. Exit status: 0 when every candidate
loaded, 1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import build_handler, cell, one_line, percentile, print_table

PROG = "benchmark_quality.py"
#: the most sentences a spoken reply to a simple question should have
MAX_SENTENCES = 2
#: (question as STT would write it, facts of which one must appear in the reply)
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What's the capital of France?", ("paris",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("What's the boiling point of water in Celsius?", ("100", "one hundred", "a hundred")),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("Which planet is called the red planet?", ("mars",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What's the biggest ocean on Earth?", ("pacific",)),
    ("What color do you get when you mix blue and yellow?", ("green",)),
    ("What gas do plants take in from the air?", ("carbon dioxide", "co2")),
    ("How many minutes are in an hour?", ("sixty", "60")),
    ("What's the chemical symbol for gold?", ("au",)),
    ("Which animal is known as the king of the jungle?", ("lion", "lions")),
    ("What's the tallest mountain in the world?", ("everest",)),
    ("What language do people speak in Brazil?", ("portuguese",)),
    ("What's two plus three?", ("five", "5")),
    ("Who painted the Mona Lisa?", ("leonardo", "da vinci")),
    ("What's the freezing point of water in Fahrenheit?", ("32", "thirty two")),
    ("What's the capital of Japan?", ("tokyo",)),
    ("What do bees make?", ("honey",)),
    ("How many sides does a triangle have?", ("three", "3")),
    ("What's the opposite of hot?", ("cold",)),
    ("Um, what's the largest planet in our solar system?", ("jupiter",)),
)
_MARKDOWN = re.compile(
    r"\*\*|__|\*[^*\s][^*]*\*|`|^\s*#{1,6}\s|^\s*[-*+•]\s|^\s*\d+[.)]\s|\[[^\]]+\]\([^)]*\)", re.MULTILINE
)


@dataclass
class Answer:
    """One reply and its scores."""

    question: int
    reply: str = ""
    error: str | None = None
    fact: bool = False
    brief: bool = False
    plain: bool = False
    first_ms: float | None = None
    reply_ms: float | None = None

    @property
    def passed(self) -> bool:
        return self.fact and self.brief and self.plain


def has_fact(reply: str, facts: tuple[str, ...]) -> bool:
    """True when one of ``facts`` is in ``reply`` as whole words (case and hyphens ignored)."""
    text = reply.lower().replace("-", " ")
    return any(re.search(rf"(?<!\w){re.escape(fact)}(?!\w)", text) for fact in facts)


def score(answer: Answer, facts: tuple[str, ...]) -> Answer:
    """Fill in the three checks of ``answer``."""
    from speech_to_speech.text import split_sentences

    answer.fact = has_fact(answer.reply, facts)
    answer.brief = 0 < len(split_sentences(answer.reply)) <= MAX_SENTENCES
    answer.plain = _MARKDOWN.search(answer.reply) is None
    return answer


@dataclass
class Candidate:
    """One model's results."""

    model: str
    backend: str
    load_s: float | None = None
    error: str | None = None
    answers: list[Answer] | None = None


def ask_all(model: str, backend: str, extra: list[str], repeats: int, verbose: bool) -> Candidate:
    """Load ``model`` with ``backend`` and ask every question ``repeats`` times."""
    from speech_to_speech.cli import parse_args
    from speech_to_speech.messages import EndOfResponse, Transcript, TTSInput
    from speech_to_speech.shared import clear_shared_models

    result = Candidate(model, backend, answers=[])
    flags = ["--input_text", "x", "--llm_backend", backend, *(["--llm_model", model] if model != "default" else [])]
    try:
        llm = build_handler("llm", parse_args([*flags, *extra]))
        start = time.monotonic()
        llm.setup()
        result.load_s = time.monotonic() - start
    except Exception as exc:
        result.error = f"load failed: {one_line(exc)}"
        return result
    try:
        for index in [i for _ in range(repeats) for i in range(len(QUESTIONS))]:
            question, facts = QUESTIONS[index]
            llm.chat.reset()
            answer = Answer(index)
            start = time.monotonic()
            for item in llm.process(Transcript(llm.gate.new_turn_stamp(), question, language="en")):
                if isinstance(item, TTSInput) and answer.first_ms is None:
                    answer.first_ms = (time.monotonic() - start) * 1000
                elif isinstance(item, EndOfResponse):
                    answer.reply_ms = (time.monotonic() - start) * 1000
                    answer.reply, answer.error = item.text.strip(), item.error
            result.answers.append(score(answer, facts))
            if verbose:
                marks = "".join(
                    m if ok else "." for m, ok in zip("FBP", (answer.fact, answer.brief, answer.plain), strict=True)
                )
                print(f"[{Path(model).name}] {marks} {question} -> {answer.reply!r}", file=sys.stderr, flush=True)
    finally:
        llm.cleanup()
        del llm
        clear_shared_models()
        gc.collect()
    return result


def report(candidates: list[Candidate]) -> None:
    """Print the summary table and the missed questions."""

    def pct(answers: list[Answer], check: str) -> str:
        return f"{100 * sum(getattr(a, check) for a in answers) / len(answers):.0f}%" if answers else "-"

    headers = ["model", "backend", "load s", "fact", "brief", "plain", "all", "words", "1st ms p50", "reply ms p50"]
    rows = []
    for c in candidates:
        answers = c.answers or []
        words = sum(len(a.reply.split()) for a in answers) / len(answers) if answers else None
        first = percentile([a.first_ms for a in answers if a.first_ms is not None], 50)
        reply = percentile([a.reply_ms for a in answers if a.reply_ms is not None], 50)
        checks = [pct(answers, check) for check in ("fact", "brief", "plain", "passed")]
        rows.append(
            [Path(c.model).name, c.backend, cell(c.load_s, 1), *checks, cell(words, 1), cell(first), cell(reply)]
        )
    print_table(headers, rows)
    print(
        f"\n{len(QUESTIONS)} questions; fact: an expected fact is in the reply; brief: <= {MAX_SENTENCES} sentences; "
        "plain: no markdown; all: the three together."
    )
    for c in candidates:
        if c.error:
            print(f"FAILED {c.model}: {c.error}")
            continue
        missed = [a for a in c.answers or [] if not a.passed]
        print(f"\n{Path(c.model).name}: {len(missed)} repl{'y' if len(missed) == 1 else 'ies'} missed a check")
        for a in missed:
            why = ", ".join(n for n, ok in (("fact", a.fact), ("brief", a.brief), ("plain", a.plain)) if not ok)
            print(f"  [{why}] {QUESTIONS[a.question][0]} -> {a.reply[:110]!r}" + (f" ({a.error})" if a.error else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    from speech_to_speech.cli import DEFAULT_BACKENDS

    parser = argparse.ArgumentParser(
        prog=PROG, description="Score LLM replies to spoken questions (see the docstring)."
    )
    parser.add_argument(
        "--llm_model", action="append", metavar="PATH", help="a candidate (repeat); 'default' = embedded"
    )
    parser.add_argument("--llm_backend", default=DEFAULT_BACKENDS["llm"], help="the LLM backend for every candidate")
    parser.add_argument("--repeats", type=int, default=1, help="ask every question this many times")
    parser.add_argument("--verbose", action="store_true", help="print every reply as it comes (on stderr)")
    args = parser.parse_args(own)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    models = args.llm_model or ["default"]
    for model in models:
        if model != "default" and not Path(model).exists():
            print(f"{PROG}: warning: {model} is not a file; passing it to the backend as is", file=sys.stderr)
    candidates = []
    for model in models:
        print(f"{Path(model).name} ({args.llm_backend}) ...", file=sys.stderr, flush=True)
        candidates.append(ask_all(model, args.llm_backend, extra, args.repeats, args.verbose))
    print()
    report(candidates)
    return 1 if any(c.error for c in candidates) else 0


if __name__ == "__main__":
    sys.exit(main())
