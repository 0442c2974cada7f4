"""Speculative decoding with llama.cpp in process: does it pay on a small CPU? (issue 18)

The target is the embedded Qwen2.5-Coder-1.5B-Instruct Q4_K_M (``--llm_model qwen2.5-coder-1.5b``),
driven as :class:`handlers.llm.llama_cpp_llm.LlamaEngine` drives it: the same ``Llama``
construction (n_ctx 4096, n_batch 512, ``--threads`` threads), the voice system prompt in the KV
cache, the model's own chat template, temperature 0, repeat penalty 1.1, the echo guard on the
first token, at most ``--max_tokens`` tokens. Configurations (rows of the table):

- ``1.5B``: the target alone (the reference for outputs and speed-ups).
- ``1.5B + 0.5B k=K tT``: llama-cpp-python's ``Llama(draft_model=...)`` with
  :class:`GreedyDraftModel`: the embedded Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the same tokenizer)
  proposes K tokens greedily, with its own KV cache kept across calls (only the tokens after the
  longest common prefix with its last call are evaluated, like ``LlamaEngine.evaluate_ahead``) and
  the target's repeat penalty applied to the reply so far; the draft runs on T threads (the
  target is idle meanwhile).
- ``1.5B + lookup n=N``: llama-cpp-python's ``LlamaPromptLookupDecoding(num_pred_tokens=N)``:
  the continuation of the last 1-2 tokens' earliest earlier occurrence in the context, no model.
- ``0.5B alone``: the draft model answering by itself (2 threads): the speed a smaller model gives.

What is measured, per turn (``time.perf_counter()``): **TTFT** request start → first token;
**8th tok** request start → 8th token (≈ the first 5-7 words, what the first audio chunk needs;
the last token's time for a shorter reply); **tok/s** the reply's tokens / (last token − request
start), and the decode rate (tokens after the first / time after the first); **accept** accepted
/ proposed draft tokens (proposals cut off by the end of the reply not counted); **tok/pass**
tokens gained per verifying target pass (1 + accepted / draft calls); **draft ms** time spent
in the draft per reply; **same** replies identical, token for token, to the target alone's.

Request start: with ``--mode prefilled`` (default) the prompt up to the end of the user's words is
already in the KV caches (target and draft), as ``handlers.llm.partial_prefill`` leaves it while
the user speaks; the timed part evaluates the rest (``<|im_end|>`` … ``assistant``) and
generates. With ``--mode cold`` the system prompt and the history are cached and the last user
message is evaluated inside the timed part (by the draft at its first call, after the first
token). Before every run both caches are cut back to the system prompt and the cached part is
evaluated again (not timed), so every configuration starts from the same KV values: llama.cpp's
logits depend a little on how the tokens were batched (evaluating a reply in one batch and one
token at a time differ by up to ~0.5 in a logit), so a greedy reply can flip at a near-tie when
the verifying batches differ, or when the cache was filled in other chunks.
In both, the prompt is evaluated without all-token logits (``_logits_all`` off) and
``draft_model`` / ``_logits_all`` are switched on only for the generation: a ``Llama`` with a
draft model computes and copies the logits of every evaluated token, prompt included (see the
``naive`` RSS row), and must be built with ``logits_all=True`` (llama-cpp-python 0.3.16 sizes its
score array by the argument, so a prompt past ``n_batch`` tokens fails otherwise).

Other agents may be using the CPU: every round goes through the turns, and each turn through
every configuration in a rotated order (A, B, C, B, C, A, ...), so load drifts hit all alike.
The table gives, per configuration, the mean over turns of the per-turn minimum and median over
``--rounds`` rounds; "vs 1.5B" is the geometric mean over turns of the per-turn median ratio
(negative = faster); **same** counts the turns whose replies were identical to the 1.5B's first
one in every round. After the table: the cost of one forward pass (the 1.5B verifying 1-7
tokens, the 0.5B proposing one on 1 and 2 threads), which decides whether a draft can pay: it
does when (1 + accepted tokens per pass) × one 1-token pass exceeds k draft steps plus one
(k+1)-token verification. Peak RSS (``VmHWM``): this process (both models, everything run) and
a child per single model and for the naive integration (``Llama(draft_model=...,
logits_all=True)``, system prompt evaluated with all logits, then 2 turns through
``create_completion``)::

    python scripts/benchmark_speculative.py                    # prefilled, 3 rounds, all configurations
    python scripts/benchmark_speculative.py --mode cold --rounds 2
    python scripts/benchmark_speculative.py --configs base,draft4t2,lookup4 --per_turn
    python scripts/benchmark_speculative.py --no_rss

Measured (issue 18; 2 cores, other processes at load ~2, 3 rounds, prefilled): it does not pay.
The 1.5B reached its 8th token in 424 ms (median; min 393); with the 0.5B draft the best was
k=2 on 2 threads, 802 ms (+82 %), k=4/6 and 1 draft thread worse (+113 % to +238 %); prompt lookup
n=2 656 ms (+50 %), acceptance 4-13 %. TTFT is unchanged (the first token is the target's alone).
The forward passes say why, whatever the acceptance: on 2 cores the 1.5B is compute-bound, so
verifying 3 tokens costs 2.1 one-token passes and 5 tokens 3.3, and a 0.5B step costs 0.55 of
a 1.5B pass (its 151,936-token output layer does not shrink), so even a draft that is always
right loses (k=2: 2 × 0.55 + 2.1 = 3.2 passes for 3 tokens). Cold mode: +50 % (k=2), +20 %
(lookup n=2). Replies matched the 1.5B's in 6-7 of 8 turns: the others flipped at near-ties
(top-2 logit margins of 0.02 and 0.003 where checked) because batched verification changes
the logits slightly.
Peak RSS: 1.5B alone 1.9 GB, with the draft 2.6 GB, the naive integration 3.1 GB.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import LogitsProcessorList
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from handlers.llm.embedded import resolve_gguf
from handlers.llm.llama_cpp_llm import LlamaEngine
from speech_to_speech.llm.prompts import build_voice_system_prompt
from speech_to_speech.testing.bench import REPO_ROOT, print_table

TARGET = "qwen2.5-coder-1.5b"
DRAFT = ""  # the default embedded model: Qwen2.5-Coder-0.5B-Instruct
N_CTX = 4096
REPEAT_PENALTY = 1.1  # LlamaEngine.stream's
#: tokens the 8th-token column waits for
NTH = 8

#: voice turns: (history as (user, assistant) pairs, the user's words)
TURNS: list[tuple[list[tuple[str, str]], str]] = [
    ([], "What's the capital of Australia?"),
    ([], "Can you tell me how long it takes to boil an egg?"),
    ([], "I just adopted a puppy from the shelter yesterday."),
    ([], "What's the difference between a virus and a bacterium?"),
    (
        [("What's the tallest mountain in the world?", "Mount Everest, at about 8,849 meters above sea level.")],
        "And how long does it take to climb it?",
    ),
    ([], "My flight to Tokyo got cancelled this morning."),
    ([], "How do I say thank you in Japanese?"),
    (
        [("I'm making pasta for dinner tonight.", "Sounds delicious! What kind of sauce are you making?")],
        "A simple tomato sauce with garlic and basil.",
    ),
]
WARMUP_TURN: tuple[list[tuple[str, str]], str] = ([], "Hi there, how are you today?")


def common_prefix(a: npt.NDArray[np.intc] | list[int], b: npt.NDArray[np.intc] | list[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class GreedyDraftModel(LlamaDraftModel):
    """A second ``Llama`` proposing ``k`` tokens greedily, its KV cache kept across calls.

    Each call evaluates only the tokens after the longest common prefix of ``input_ids`` with what
    its cache holds (at least the last one, for its logits), then takes ``k`` argmax steps, each
    with the target's repeat penalty over the reply so far (:attr:`prompt_length` marks where the
    reply starts; llama.cpp's sampler penalises only the tokens it sampled, the last
    ``penalty_last_n``), stopping after an end-of-generation token.
    """

    def __init__(self, llm: Any, k: int, repeat_penalty: float = REPEAT_PENALTY, penalty_last_n: int = 64) -> None:
        self.llm = llm
        self.k = k
        self.repeat_penalty = repeat_penalty
        self.penalty_last_n = penalty_last_n
        self.prompt_length = 0
        self.n_vocab = llm.n_vocab()

    def _logits(self) -> npt.NDArray[np.single]:
        pointer = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        llm = self.llm
        common = min(common_prefix(llm.input_ids[: llm.n_tokens], input_ids), len(input_ids) - 1)
        llm.n_tokens = common
        llm.eval(input_ids[common:].tolist())
        reply = input_ids[self.prompt_length :].tolist()
        out: list[int] = []
        for step in range(self.k):
            logits = self._logits()
            recent = (reply + out)[-self.penalty_last_n :]
            if recent and self.repeat_penalty != 1.0:
                ids = np.unique(np.array(recent, dtype=np.intc))
                values = logits[ids]
                logits[ids] = np.where(values > 0, values / self.repeat_penalty, values * self.repeat_penalty)
            token = int(np.argmax(logits))
            out.append(token)
            if llama_cpp.llama_token_is_eog(llm._model.vocab, token) or step == self.k - 1:
                break
            llm.eval([token])
        return np.array(out, dtype=np.intc)


class RecordedDraft(LlamaDraftModel):
    """Wraps a draft model: records each call's context length and proposal, and the time spent."""

    def __init__(self, inner: LlamaDraftModel) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []
        self.seconds = 0.0

    def reset(self, prompt_length: int) -> None:
        self.calls = []
        self.seconds = 0.0
        if isinstance(self.inner, GreedyDraftModel):
            self.inner.prompt_length = prompt_length

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        start = time.perf_counter()
        draft = self.inner(input_ids, **kwargs)
        self.seconds += time.perf_counter() - start
        self.calls.append((len(input_ids), [int(t) for t in draft]))
        return draft

    def acceptance(self, prompt_length: int, generated: list[int]) -> tuple[int, int, int]:
        """(proposed, accepted, calls): proposals checked against the reply the target produced."""
        proposed = accepted = calls = 0
        for length, draft in self.calls:
            start = length - prompt_length
            truth = generated[start:]
            checked = min(len(draft), len(truth))
            if checked == 0:
                continue
            calls += 1
            proposed += checked
            accepted += common_prefix(draft[:checked], truth[:checked])
        return proposed, accepted, calls


@dataclass
class Config:
    key: str
    label: str
    kind: str  # "base", "draft", "lookup", "small"
    k: int = 0
    draft_threads: int = 2


@dataclass
class Sample:
    ttft: float
    nth: float
    total: float
    tokens: int
    decode_rate: float
    proposed: int = 0
    accepted: int = 0
    calls: int = 0
    draft_s: float = 0.0
    reply: list[int] = field(default_factory=list)


def all_configs() -> list[Config]:
    configs = [Config("base", "1.5B", "base")]
    for k in (2, 4, 6):
        for threads in (1, 2):
            configs.append(Config(f"draft{k}t{threads}", f"1.5B + 0.5B k={k} t{threads}", "draft", k, threads))
    for n in (2, 4, 10):
        configs.append(Config(f"lookup{n}", f"1.5B + lookup n={n}", "lookup", n))
    configs.append(Config("small", "0.5B alone", "small"))
    return configs


def messages_for(turn: tuple[list[tuple[str, str]], str], system: str) -> list[dict[str, str]]:
    history, user = turn
    messages = [{"role": "system", "content": system}]
    for asked, answered in history:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    messages.append({"role": "user", "content": user})
    return messages


class Bench:
    """Both engines, the prepared turns and one run per (configuration, turn)."""

    def __init__(self, threads: int, max_tokens: int, mode: str) -> None:
        self.max_tokens = max_tokens
        self.mode = mode
        self.threads = threads
        self.target = LlamaEngine(str(resolve_gguf(TARGET)), N_CTX, threads)
        self.small = LlamaEngine(str(resolve_gguf(DRAFT)), N_CTX, threads)
        llm = self.target.llm
        # a Llama built with logits_all=False holds n_batch rows of scores; speculative eval writes row
        # n_past.. (allocated lazily: only the rows written are ever resident)
        llm.scores = np.ndarray((llm._n_ctx, llm._n_vocab), dtype=np.single)
        self.system = build_voice_system_prompt()
        system_prompt = self.target.render([{"role": "system", "content": self.system}], None, False)
        self.system_length = len(self.target.tokenize(system_prompt))
        for engine in (self.target, self.small):
            engine.evaluate_ahead(engine.tokenize(system_prompt))
        self.greedy = {k: RecordedDraft(GreedyDraftModel(self.small.llm, k)) for k in (2, 4, 6)}
        self.lookup = {n: RecordedDraft(LlamaPromptLookupDecoding(num_pred_tokens=n)) for n in (2, 4, 10)}
        self.turns = [self.prepare(turn) for turn in TURNS]
        self.warmup = self.prepare(WARMUP_TURN)

    def prepare(self, turn: tuple[list[tuple[str, str]], str]) -> dict[str, Any]:
        user = turn[1]
        prompt = self.target.render(messages_for(turn, self.system), None)
        tokens = self.target.tokenize(prompt)
        if self.small.tokenize(prompt) != tokens:
            raise SystemExit("the draft model tokenizes the prompt differently")
        if self.mode == "prefilled":  # up to the end of the user's words
            cached = prompt[: prompt.rfind(user) + len(user)]
        else:  # up to the last user message (the history was evaluated at the turns before)
            cached = self.target.render(messages_for(turn, self.system)[:-1], None, False)
            if not prompt.startswith(cached):
                raise SystemExit("the chat template renders the history differently in a longer chat")
        return {
            "user": user,
            "tokens": tokens,
            "cached": self.target.tokenize(cached),
        }

    def set_draft_threads(self, threads: int) -> None:
        llama_cpp.llama_set_n_threads(self.small.llm._ctx.ctx, threads, threads)

    def run(self, config: Config, turn: dict[str, Any]) -> Sample:
        tokens: list[int] = turn["tokens"]
        engine = self.small if config.kind == "small" else self.target
        llm = engine.llm
        draft: RecordedDraft | None = None
        if config.kind == "draft":
            draft = self.greedy[config.k]
        elif config.kind == "lookup":
            draft = self.lookup[config.k]
        self.set_draft_threads(config.draft_threads if config.kind == "draft" else self.threads)
        # Not timed: the caches as the turn finds them (see the module doc). Everything after the
        # system prompt is evaluated afresh, so every configuration starts from the same KV values
        # (llama.cpp's logits depend slightly on how tokens were batched, see --per_turn).
        for used in (engine, self.small) if config.kind == "draft" else (engine,):
            used.llm.n_tokens = min(used.llm.n_tokens, self.system_length)
            used.evaluate_ahead(turn["cached"])
        prompt_length = len(tokens)
        guard = self.target.echo_guard(prompt_length, turn["user"])  # as LlamaCppLLMHandler's replies

        if draft is not None:
            draft.reset(prompt_length)
        reply: list[int] = []
        times: list[float] = []
        start = time.perf_counter()
        try:
            engine.evaluate_ahead(tokens[:-1])  # the prompt, without all-token logits
            if draft is not None:
                llm.draft_model, llm._logits_all = draft, True
            generator = llm.generate(
                tokens,
                temp=0.0,
                repeat_penalty=REPEAT_PENALTY,
                logits_processor=LogitsProcessorList([guard]),
            )
            for token in generator:
                if llama_cpp.llama_token_is_eog(llm._model.vocab, token):
                    reply.append(token)  # for the acceptance count only
                    break
                reply.append(token)
                times.append(time.perf_counter() - start)
                if len(times) >= self.max_tokens:
                    break
            generator.close()
        finally:
            llm.draft_model, llm._logits_all = None, False
        n = len(times)
        sample = Sample(
            ttft=times[0],
            nth=times[min(NTH, n) - 1],
            total=times[-1],
            tokens=n,
            decode_rate=(n - 1) / (times[-1] - times[0]) if n > 1 else float("nan"),
            reply=reply[:n],
        )
        if draft is not None:
            sample.proposed, sample.accepted, sample.calls = draft.acceptance(prompt_length, reply)
            sample.draft_s = draft.seconds
        return sample


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(bench: Bench, configs: list[Config], results: dict[str, list[list[Sample]]], per_turn: bool) -> None:
    base = results.get("base")
    reference = [samples[0].reply for samples in base] if base else None
    headers = [
        "configuration",
        "TTFT ms min",
        "med",
        "8th tok ms min",
        "med",
        "vs 1.5B",
        "tok/s med",
        "decode tok/s med",
        "accept",
        "tok/pass",
        "draft ms",
        "same",
    ]
    rows = []
    for config in configs:
        turns = results[config.key]

        def per_turn_stat(attr: str, stat: Any, turns: list[list[Sample]] = turns) -> float:
            return statistics.fmean(stat([getattr(s, attr) for s in samples]) for samples in turns)

        flat = [s for samples in turns for s in samples]
        vs = "-"
        if base and config.key != "base":
            ratios = [
                statistics.median(s.nth for s in mine) / statistics.median(s.nth for s in theirs)
                for mine, theirs in zip(turns, base, strict=True)
            ]
            vs = f"{(geomean(ratios) - 1) * 100:+.0f}%"
        proposed = sum(s.proposed for s in flat)
        calls = sum(s.calls for s in flat)
        accept = f"{sum(s.accepted for s in flat) / proposed:.0%}" if proposed else "-"
        per_pass = f"{1 + sum(s.accepted for s in flat) / calls:.2f}" if calls else "-"
        draft_ms = f"{statistics.median(s.draft_s for s in flat) * 1000:.0f}" if proposed else "-"
        same = "-"
        if reference is not None and config.kind != "small":
            same = f"{sum(all(s.reply == ref for s in samples) for samples, ref in zip(turns, reference, strict=True))}"
            same += f"/{len(turns)}"
        rows.append(
            [
                config.label,
                f"{per_turn_stat('ttft', min) * 1000:.0f}",
                f"{per_turn_stat('ttft', statistics.median) * 1000:.0f}",
                f"{per_turn_stat('nth', min) * 1000:.0f}",
                f"{per_turn_stat('nth', statistics.median) * 1000:.0f}",
                vs,
                f"{statistics.median(s.tokens / s.total for s in flat):.1f}",
                f"{statistics.median(s.decode_rate for s in flat if s.tokens > 1):.1f}",
                accept,
                per_pass,
                draft_ms,
                same,
            ]
        )
    print_table(headers, rows)
    if base:
        lengths = [len(samples[0].reply) for samples in base]
        print(f"\n1.5B reply lengths (tokens): {lengths}")
    if per_turn:
        print("\n8th-token ms, median per turn:")
        headers = ["configuration", *[f"t{i + 1}" for i in range(len(bench.turns))]]
        rows = []
        for config in configs:
            medians = [statistics.median(s.nth for s in samples) * 1000 for samples in results[config.key]]
            rows.append([config.label, *[f"{m:.0f}" for m in medians]])
        print_table(headers, rows)
        if base:
            print("\n1.5B replies:")
            for turn, samples in zip(bench.turns, base, strict=True):
                text = bench.target.llm.detokenize(samples[0].reply).decode("utf-8", errors="replace")
                print(f"  {turn['user']!r} -> {text!r}")
        for config in configs:
            if reference is None or config.kind == "small":
                continue
            for i, (samples, ref) in enumerate(zip(results[config.key], reference, strict=True)):
                for s in samples:
                    if s.reply != ref:
                        text = bench.target.llm.detokenize(s.reply).decode("utf-8", errors="replace")
                        print(f"  differs: {config.label}, turn {i + 1}: {text!r}")
                        break


def max_rss_mb() -> float:
    """Peak RSS of this process: ``VmHWM`` (``ru_maxrss`` would include the parent's peak, inherited
    through fork and kept across exec)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pass_costs(bench: Bench, repeats: int) -> None:
    """What one forward pass costs: the 1.5B verifying n tokens (all logits, as speculative decoding
    evaluates them), the 0.5B proposing one, both after the first turn's prompt; configurations
    alternated, ``repeats`` times."""
    prompt = bench.turns[0]["tokens"]
    tokens = bench.turns[3]["tokens"][-8:]  # any tokens
    for engine in (bench.target, bench.small):
        engine.llm.n_tokens = min(engine.llm.n_tokens, bench.system_length)
        engine.evaluate_ahead(prompt)
    cases = [("1.5B", n, bench.threads) for n in (1, 2, 3, 5, 7)] + [("0.5B", 1, t) for t in (1, 2)]
    times: dict[tuple[str, int, int], list[float]] = {case: [] for case in cases}
    for repeat in range(repeats):
        shift = repeat % len(cases)
        for case in cases[shift:] + cases[:shift]:
            model, n, threads = case
            llm = bench.target.llm if model == "1.5B" else bench.small.llm
            if model == "0.5B":
                bench.set_draft_threads(threads)
            llm.n_tokens, llm._logits_all = len(prompt), n > 1
            start = time.perf_counter()
            llm.eval(tokens[:n])
            times[case].append(time.perf_counter() - start)
            llm.n_tokens, llm._logits_all = len(prompt), False
    bench.set_draft_threads(bench.threads)
    single = statistics.median(times[("1.5B", 1, bench.threads)])
    rows = [
        [
            f"{model} t{threads}, {n} token{'s' if n > 1 else ''}",
            f"{min(times[(model, n, threads)]) * 1000:.0f}",
            f"{statistics.median(times[(model, n, threads)]) * 1000:.0f}",
            f"{statistics.median(times[(model, n, threads)]) / single:.2f}",
        ]
        for model, n, threads in cases
    ]
    print(f"\none forward pass ({repeats} alternated repeats):")
    print_table(["pass", "ms min", "med", "x 1.5B 1-token pass"], rows)


def rss_child(which: str, threads: int) -> None:
    """Load ``which`` (1.5b, 0.5b or naive), answer two turns, print the peak RSS as JSON."""
    system = build_voice_system_prompt()
    if which in ("1.5b", "0.5b"):
        engine = LlamaEngine(str(resolve_gguf(TARGET if which == "1.5b" else DRAFT)), N_CTX, threads)
        engine.prefill(engine.render([{"role": "system", "content": system}], None, False))
        for turn in TURNS[:2]:
            tokens = engine.tokenize(engine.render(messages_for(turn, system), None))
            for _ in engine.stream(tokens, 40, 0.0, lambda: False, lambda _stats: None):
                pass
    else:  # Llama(draft_model=...) as its documentation has it: every evaluated token's logits kept
        from llama_cpp import Llama

        small = LlamaEngine(str(resolve_gguf(DRAFT)), N_CTX, threads)
        draft = GreedyDraftModel(small.llm, 4)
        with contextlib.redirect_stderr(io.StringIO()):
            llm = Llama(
                model_path=str(resolve_gguf(TARGET)),
                n_ctx=N_CTX,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=512,
                draft_model=draft,
                logits_all=True,
                verbose=False,
            )
        llm.eval(small.tokenize(small.render([{"role": "system", "content": system}], None, False)))
        for turn in TURNS[:2]:
            tokens = small.tokenize(small.render(messages_for(turn, system), None))
            draft.prompt_length = len(tokens)
            llm.create_completion(prompt=tokens, max_tokens=40, temperature=0.0, repeat_penalty=REPEAT_PENALTY)
        llm.close()
    print(json.dumps({"rss_mb": max_rss_mb()}))


def child_rss(which: str, threads: int) -> str:
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--rss_child", which, "--threads", str(threads)],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=REPO_ROOT,
        )
        return f"{json.loads(done.stdout.strip().splitlines()[-1])['rss_mb']:.0f}"
    except (subprocess.SubprocessError, ValueError, IndexError, KeyError) as exc:
        return f"failed ({type(exc).__name__})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("prefilled", "cold"), default="prefilled")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max_tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2, help="the target's threads (and the 0.5B alone's)")
    parser.add_argument(
        "--configs", default="", help="comma-separated keys (default: all): " + ", ".join(c.key for c in all_configs())
    )
    parser.add_argument("--per_turn", action="store_true", help="also print the 8th-token time per turn and replies")
    parser.add_argument("--pass_repeats", type=int, default=9, help="repeats of the forward-pass timings (0: none)")
    parser.add_argument("--no_rss", action="store_true", help="skip the peak-RSS children")
    parser.add_argument("--rss_child", choices=("1.5b", "0.5b", "naive"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.threads)
        return
    configs = all_configs()
    if args.configs:
        wanted = args.configs.split(",")
        configs = [c for c in configs if c.key in wanted]
        if not configs:
            raise SystemExit(f"no configuration among {wanted}")
    load = time.perf_counter()
    bench = Bench(args.threads, args.max_tokens, args.mode)
    print(
        f"loaded both models in {time.perf_counter() - load:.1f} s; mode {args.mode}, {args.rounds} rounds, "
        f"{len(bench.turns)} turns, max {args.max_tokens} tokens, target threads {args.threads}",
        flush=True,
    )
    for config in configs:  # warm-up: pages the weights in, not counted
        bench.run(config, bench.warmup)
    results: dict[str, list[list[Sample]]] = {c.key: [[] for _ in bench.turns] for c in configs}
    step = 0
    for round_index in range(args.rounds):
        began = time.perf_counter()
        for turn_index, turn in enumerate(bench.turns):
            shift = step % len(configs)
            step += 1
            for config in configs[shift:] + configs[:shift]:
                results[config.key][turn_index].append(bench.run(config, turn))
        load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"round {round_index + 1}: {time.perf_counter() - began:.0f} s, load average {load_average}", flush=True)
    print()
    report(bench, configs, results, args.per_turn)
    if args.pass_repeats:
        pass_costs(bench, args.pass_repeats)
    print(f"\npeak RSS, this process (both models, all configurations run): {max_rss_mb():.0f} MB")
    if not args.no_rss:
        del bench
        for which, label in (
            ("1.5b", "1.5B alone"),
            ("0.5b", "0.5B alone"),
            ("naive", "1.5B + 0.5B, Llama(draft_model=..., logits_all=True), prompt with all logits"),
        ):
            print(f"peak RSS, {label}: {child_rss(which, args.threads)} MB", flush=True)


if __name__ == "__main__":
    main()
