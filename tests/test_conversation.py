"""Spoken turns with the real models: the KV cache is reused, and statements are not read back.

The pipeline runs in this process on LibriVox speech (file mode, real time), so its llama.cpp
stage can be asked what each request cost:

* the user's words were evaluated while they were spoken (prefill from partial transcripts,
  :mod:`handlers.llm.partial_prefill`), so after the endpoint only a few tokens are left;
* the second turn reuses everything the first one evaluated (system prompt, turn, reply);
* the fast 0.5B never reads a statement back (the echo guard: not its opening words, no run of
  more than six of its tokens); the 1.5B, the model to choose for sense, answers it with a
  reaction (echo score at most 0.5), and says it listens only to a user who announces a reading
  (Piper speech: news, then "Let me read you a sentence from the book.").
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from handlers.llm.embedded import EMBEDDED_MODELS
from handlers.llm.llama_cpp_llm import LlamaCppLLMHandler
from handlers.llm.partial_prefill import PartialPrefill
from speech_to_speech.core.events import AssistantText, Event, EventBus, UserTranscript, UserTranscriptDelta
from speech_to_speech.llm.serialize import template_messages, to_chat_messages
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.testing.speech_data import librivox_clips
from tests.helpers import run_local

pytestmark = pytest.mark.models

#: silence between the two spoken turns, s: longer than the first reply takes to be spoken
GAP_S = 9.0
#: words that carry no content, for the echo score (the share of the user's words in the reply)
STOP_WORDS = frozenset(
    (
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "with",
        "is",
        "was",
        "be",
        "been",
        "have",
        "has",
        "had",
        "i",
        "you",
        "he",
        "she",
        "it",
    )
)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower()) if w not in STOP_WORDS}


def echo_score(user: str, reply: str) -> float:
    """The share of the user's content words that the reply repeats (0: none, 1: all)."""
    said = content_words(user)
    return len(said & content_words(reply)) / len(said) if said else 0.0


def two_turns(tmp_path: Path) -> Path:
    """Two LibriVox statements, one after the other with :data:`GAP_S` of silence between."""
    clips = sorted(librivox_clips(), key=lambda path: sf.info(str(path)).duration)
    first, second = clips[-1], clips[0]  # the longest statement first: many partial transcripts
    audio = [sf.read(str(path), dtype="float32")[0] for path in (first, second)]
    rate = sf.info(str(first)).samplerate
    joined = np.concatenate([audio[0], np.zeros(int(GAP_S * rate), np.float32), audio[1]])
    path = tmp_path / "two-turns.wav"
    sf.write(str(path), joined, rate)
    return path


def run_conversation(tmp: Path, *flags: str) -> dict[str, Any]:
    """The two LibriVox statements through the whole pipeline in file mode; its events and LLM stage."""
    if len(librivox_clips()) < 2:
        pytest.skip("needs two LibriVox clips: apt-get install pocketsphinx-testdata")
    return run_file(two_turns(tmp), tmp, *flags)


def run_file(path: Path, tmp: Path, *flags: str) -> dict[str, Any]:
    """The speech of ``path`` through the whole pipeline in file mode; its events and LLM stage."""
    args = parse_args(["--input_audio", str(path), "--output_audio", str(tmp / "out.wav"), *flags])
    bus = EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    pipeline = run_local(args, bus)
    llm = next(stage for stage in pipeline.stages if isinstance(stage, LlamaCppLLMHandler))
    return {"llm": llm, "events": events}


@pytest.fixture(scope="module")
def conversation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The default models, with the fast 0.5B as the LLM."""
    return run_conversation(tmp_path_factory.mktemp("conversation"), "--llm_model", "qwen2.5-coder-0.5b")


def needs_1_5b() -> None:
    """Skip unless the embedded Qwen2.5-Coder-1.5B is installed."""
    if not all(importlib.util.find_spec(part) for part in EMBEDDED_MODELS["qwen2.5-coder-1.5b"].parts):
        pytest.skip("the Qwen2.5-Coder-1.5B parts are not installed")


@pytest.fixture(scope="module")
def conversation_1_5b(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The embedded Qwen2.5-Coder-1.5B as the LLM (the default)."""
    needs_1_5b()
    return run_conversation(tmp_path_factory.mktemp("conversation-1-5b"), "--llm_model", "qwen2.5-coder-1.5b")


def turns(conversation: dict[str, Any]) -> list[tuple[str, str]]:
    """(what the user said, as heard; the reply) per turn."""
    events = conversation["events"]
    users = [e.text for e in events if isinstance(e, UserTranscript) and e.stt_ms is not None]
    replies = [e.text for e in events if isinstance(e, AssistantText)]
    assert len(replies) == 2, replies
    return list(zip(users, replies, strict=True))


def longest_copied_run(said: str, reply: str) -> int:
    """The most consecutive words of ``said`` that ``reply`` repeats in the same order."""
    a, b = re.findall(r"[a-z0-9']+", said.lower()), re.findall(r"[a-z0-9']+", reply.lower())
    best = 0
    for i in range(len(a)):
        for j in range(len(b)):
            k = 0
            while i + k < len(a) and j + k < len(b) and a[i + k] == b[j + k]:
                k += 1
            best = max(best, k)
    return best


def test_the_user_words_are_evaluated_while_spoken(conversation: dict[str, Any]) -> None:
    llm: LlamaCppLLMHandler = conversation["llm"]
    events = conversation["events"]
    users = [e.text for e in events if isinstance(e, UserTranscript) and e.stt_ms is not None]
    assert len(users) == 2, users
    if any(isinstance(e, UserTranscriptDelta) and e.text.strip() for e in events):
        assert llm.partial_prefill.evaluated_tokens > 0  # the partials of the real speech were evaluated ahead


def test_after_a_partial_only_its_missing_words_are_left_to_evaluate(conversation: dict[str, Any]) -> None:
    """How many tokens are left after the endpoint depends on when the last partial came (a busy
    machine skips partial passes); here the partial is given, the words of the first spoken turn
    without their last two, and the final request is the one the LLM stage would make."""
    llm: LlamaCppLLMHandler = conversation["llm"]
    heard = next(e.text for e in conversation["events"] if isinstance(e, UserTranscript) and e.stt_ms is not None)
    partial = " ".join(heard.split()[:-2])
    user = {"type": "message", "role": "user", "content": heard}
    system = llm.system_prompt(True, None, None, llm.tools, llm.tool_choice)
    messages = template_messages(to_chat_messages(system, [*llm.chat.items(), user]))
    tokens = llm.engine.tokenize(llm.engine.render(messages, None))  # as the stage renders the request
    before = llm.engine.cached_prefix(tokens)
    prefill = PartialPrefill(llm.engine, llm._prompt_so_far, "test")  # the stage's own closed with the pipeline
    try:
        prefill.submit(partial)
        assert prefill.wait_idle(60)
    finally:
        prefill.close()
    assert prefill.evaluated_tokens > 0
    after = llm.engine.cached_prefix(tokens)
    user_tokens = len(llm.engine.tokenize(heard))
    assert after > before
    assert len(tokens) - after < user_tokens / 2, (len(tokens), before, after, user_tokens)


def test_the_second_turn_reuses_the_first_ones_prefix(conversation: dict[str, Any]) -> None:
    prompts = list(conversation["llm"].prompts)
    assert len(prompts) == 2, prompts
    assert prompts[1].reused_tokens >= prompts[0].prompt_tokens  # system prompt, turn 1 and its reply


def test_the_fast_model_never_reads_a_spoken_statement_back(conversation: dict[str, Any]) -> None:
    """The echo guard's promise on real speech: no reply opens with the user's first words or copies a
    long run of them (six tokens at most; the 0.5B still paraphrases statements, see docs/benchmarks.md)."""
    for said, reply in turns(conversation):
        assert reply.strip(), said
        first = re.findall(r"[a-z0-9']+", reply.lower())[0]
        assert first not in re.findall(r"[a-z0-9']+", said.lower())[:2], (said, reply)
        assert longest_copied_run(said, reply) <= 5, (said, reply)


def test_a_spoken_statement_gets_a_reaction_not_a_repeat(conversation_1_5b: dict[str, Any]) -> None:
    """With the 1.5B (the model to choose for sense): a reaction, not a repeat or paraphrase."""
    for said, reply in turns(conversation_1_5b):
        assert reply.strip(), said
        assert echo_score(said, reply) <= 0.5, (said, reply)


#: news told to the assistant, then an announcement that a line will be read (Piper speech)
NEWS, ANNOUNCEMENT = "My sister just moved to Lisbon.", "Let me read you a sentence from the book."
#: how a reply says it is waiting for what the user will read
LISTENING = re.compile(r"\b(go ahead|listening)\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def announced(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """NEWS, then ANNOUNCEMENT, spoken by the embedded Piper voice, through the pipeline with the 1.5B."""
    needs_1_5b()
    from speech_to_speech.testing.turns import silence, synthesize

    tmp = tmp_path_factory.mktemp("announced")
    path = tmp / "announced.wav"
    audio = [silence(0.5), synthesize(NEWS), silence(GAP_S), synthesize(ANNOUNCEMENT), silence(2.0)]
    sf.write(str(path), np.concatenate(audio), 16_000)
    return turns(run_file(path, tmp))


def test_news_gets_a_reaction_and_only_an_announcement_gets_listening(announced: list[tuple[str, str]]) -> None:
    """A rule for users who announce a reading ("Listen to this line.") made the 1.5B say "Go ahead."
    to news as well ("My sister just moved to Lisbon.", 2026-12-07): news gets a reaction, the
    announcement a reply that it listens."""
    (news, news_reply), (announcement, announcement_reply) = announced
    assert not LISTENING.search(news_reply), (news, news_reply)
    assert LISTENING.search(announcement_reply), (announcement, announcement_reply)
