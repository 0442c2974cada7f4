"""llama.cpp in process (``llama-cpp-python``): the default LLM on a CPU.

The model is a GGUF file (default: the embedded Qwen2.5-Coder-1.5B-Instruct
Q4_K_M; ``--llm_model qwen2.5-coder-0.5b`` picks the faster embedded 0.5B, see
:mod:`handlers.llm.embedded`). The chat is rendered with the model's
own chat template (read from the GGUF metadata, rendered with Jinja2 in a
sandbox), tools included: the model gets them the way it was trained to, and
its calls are read whether it writes ``<tool_call>`` tags, a code fence or bare
JSON (:class:`~speech_to_speech.llm.tools.json_calls.JsonCallExtractor`).

Two logits processors shape a reply: a spoken reply to the user gets the echo guard
(:mod:`handlers.llm.echo_guard`), and, when tools are offered and the model has one (the embedded
table's ``call_threshold``), a tool-call threshold (:mod:`handlers.llm.call_threshold`). Embedded
models marked ``compact_prompt`` (the 0.5B) get the compact voice system prompt (so they do with
``transformers`` and ``mlx-lm``).

Prompt reuse: llama.cpp keeps the KV cache of the previous request and
evaluates only the tokens after the longest common prefix. The system prompt is
evaluated at start-up, and history is serialised the same way every turn, so a
turn evaluates only what is new since the last one (reported in
:attr:`LlamaCppLLMHandler.last_prompt` and at debug level).

One :class:`Llama` context is shared by all sessions of a process; a lock lets
one generation run at a time. A response waiting for it counts that wait against its
``--first_token_timeout_s`` (then the user hears a short apology instead of silence); the
evaluation of its prompt's new tokens gets time of its own on top
(:meth:`LlamaCppLLMHandler.first_token_deadline_s`).
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import io
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llama_cpp import LogitsProcessorList

from handlers.llm.call_threshold import (
    CALL_PREFIX,
    CALL_SHAPE_JUDGED_CHARS,
    BanCalls,
    CallThreshold,
    ForcedPrefix,
    invents_numbers,
    opener_tokens,
    starts_no_call,
)
from handlers.llm.echo_guard import EchoGuard, opening_tokens
from handlers.llm.embedded import embedded_model, resolve_gguf
from handlers.llm.partial_prefill import PartialPrefill, reads_finished
from speech_to_speech.core.events import EngineWait
from speech_to_speech.core.priority import CORES, available_cores
from speech_to_speech.core.shared import shared_model
from speech_to_speech.llm.api import LLMRequest, ProviderEvent, TextDelta, ToolCall, Usage
from speech_to_speech.llm.local import LocalLLMHandler
from speech_to_speech.llm.prompts import TOOL_RESULT_NOTE
from speech_to_speech.llm.serialize import template_messages, to_chat_messages
from speech_to_speech.llm.tools.json_calls import JsonCallExtractor
from speech_to_speech.llm.tools.prompt import function_tool_spec

logger = logging.getLogger(__name__)

#: seconds between checks of a response's ``should_stop`` while it waits for the engine
LOCK_POLL_S = 0.05
#: requests whose prompt statistics a handler keeps (:attr:`LlamaCppLLMHandler.prompts`)
PROMPTS_KEPT = 32
#: the slowest prompt evaluation the first-token deadline allows for, tokens/s: the embedded 1.5B
#: evaluated 28-55 tokens/s with 2 threads on a 2-core AMD EPYC VM (2026-12-03; 343 tokens in 6.3 s
#: at best), and a session's first turn with tools, ~500 new tokens, still ran out of 6 s + 500/40 s
PREFILL_FLOOR_TOKENS_PER_S = 20.0
#: ChatML, for GGUF files that carry no chat template
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Qwen2.5's own chat template (e.g. in the embedded Qwen2.5-Coder-1.5B-Instruct GGUF) writes the
#: tool-call example with doubled braces inside a Jinja string literal, where they are no escape: the
#: prompt shows ``{{"name": ...}}`` and the model copies it, an object that is not JSON (measured with
#: the 1.5B, temperature 0, 8 requests with one or two tools: 4 answered so and their calls were lost;
#: with single braces all 8 parsed). Templates holding this text get single braces, which makes the
#: 1.5B's template identical to the 0.5B's.
QWEN_DOUBLED_CALL_EXAMPLE = '{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}'


def repair_template(source: str) -> str:
    """``source`` with Qwen2.5's doubled-brace tool-call example written with single braces.

    See :data:`QWEN_DOUBLED_CALL_EXAMPLE`; any other template is returned unchanged.
    """
    return source.replace(QWEN_DOUBLED_CALL_EXAMPLE, QWEN_DOUBLED_CALL_EXAMPLE[1:-1])


def default_threads() -> int:
    """Threads for llama.cpp: every core this process may use, at most 4.

    On 2 cores both go to the LLM while nothing else runs: it is on the critical path until the
    first sentence exists (measured: 2 threads 39 tokens/s, 1 thread 24 tokens/s for the embedded
    model). While another stage uses a core (TTS writing the first sentence while the LLM writes
    the next, a partial STT pass), the engine drops to the threads left
    (:data:`~speech_to_speech.core.priority.CORES`, see :meth:`LlamaEngine.fit_threads`).
    """
    return max(1, min(4, available_cores()))


@dataclass
class PromptStats:
    """What the last request cost: ``prompt_tokens`` in all, ``reused_tokens`` of them from the KV cache."""

    prompt_tokens: int
    reused_tokens: int

    @property
    def evaluated_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


class LlamaEngine:
    """One loaded model: the ``llama_cpp.Llama`` context, its chat template and a lock.

    Every evaluation (prompt and generation) runs on one thread of the engine's own
    (:meth:`on_engine_thread`), whichever thread asks for it. llama.cpp's CPU backend runs each
    evaluation as an OpenMP parallel region, and libgomp keeps a team of threads for every thread
    that ever started one; while an earlier team's thread is alive, a second thread's evaluations
    run at about half speed (2 cores, the embedded 1.5B, 2 threads: 54-65 ms a token against
    30-36 ms on the first team's thread). The pipeline evaluated on three: the LLM stage's at
    start-up (the system prompt), the partial-transcript prefill's, and each reply's provider
    reader, which wrote 52-91 ms a token; on this one thread, 30-33 ms.

    Args:
        model_path: GGUF file.
        n_ctx: context window, tokens.
        n_threads: threads for generation and prompt processing.
    """

    def __init__(self, model_path: str, n_ctx: int, n_threads: int) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from llama_cpp import Llama

        # verbose=False would make llama-cpp-python point the process's stdout and stderr file
        # descriptors at /dev/null while it loads, swallowing what other threads print meanwhile
        # (the console's "ready" lines of the other stages). Load verbosely instead, with only this
        # thread's Python-level stderr captured (logging handlers keep their own stream), then quiet.
        from llama_cpp._logger import set_verbose

        with contextlib.redirect_stderr(io.StringIO()):
            self.llm = Llama(
                model_path=model_path,
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_batch=512,
                verbose=True,
            )
        set_verbose(False)  # native logs: errors only from now on
        self.llm.verbose = False  # no per-request prints (prefix-match hits, timings)
        # free the native model before interpreter shutdown tears down the binding's globals
        # (its __del__ fails then, printing a traceback at every exit)
        atexit.register(self.llm.close)
        #: the threads asked for, and those the context runs now (see :meth:`fit_threads`)
        self.n_threads = n_threads
        self._threads_now = n_threads
        self.lock = threading.Lock()
        self._evaluator = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama.cpp")
        self._waiting = 0  # replies waiting for the lock
        self._waiting_lock = threading.Lock()
        metadata = self.llm.metadata
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(repair_template(metadata.get("tokenizer.chat_template") or FALLBACK_TEMPLATE))
        self.bos = self._token_text(self.llm.token_bos())
        self.eos = self._token_text(self.llm.token_eos())
        self.add_bos = metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
        #: token ids that start a tool call (see :mod:`handlers.llm.call_threshold`)
        self.call_openers = opener_tokens(
            lambda text: self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        )

    def on_engine_thread(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` run on the engine's evaluation thread; its result (or exception).
        The caller holds :attr:`lock`, so calls never queue behind one another."""
        return self._evaluator.submit(call, *args).result()

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="ignore")

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for ``messages`` (Chat Completions shape) and Chat-shape ``tools``."""
        return self.template.render(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos,
            eos_token=self.eos,
        )

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of ``prompt``; special tokens in it are parsed as such."""
        add_bos = self.add_bos and not (self.bos and prompt.startswith(self.bos))
        return self.llm.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the KV cache already holds (at least one is always re-evaluated)."""
        cached = self.llm._input_ids[: self.llm.n_tokens].tolist()
        common = 0
        for a, b in zip(cached, tokens[:-1], strict=False):
            if a != b:
                break
            common += 1
        return common

    def prefill(self, prompt: str) -> None:
        """Evaluate ``prompt`` into the KV cache (e.g. the system prompt at start-up); waits for the engine."""
        tokens = self.tokenize(prompt)
        with self.lock:
            self.evaluate_ahead(tokens)

    def evaluate_ahead(self, tokens: list[int], step: int = 0, may_continue: Callable[[], bool] | None = None) -> int:
        """Evaluate ``tokens`` into the KV cache, keeping the prefix of them it already holds.

        The caller holds :attr:`lock`. A cache that already holds all of ``tokens`` (and perhaps
        more after them) is left as it is.

        Args:
            tokens: the prompt's token ids.
            step: evaluate this many tokens at a time (0: all at once).
            may_continue: asked before each step but the first; False stops there (the steps
                evaluated so far stay in the cache).

        Returns:
            The number of tokens evaluated.
        """
        cached = self.llm._input_ids[: self.llm.n_tokens].tolist()
        common = 0
        for a, b in zip(cached, tokens, strict=False):
            if a != b:
                break
            common += 1
        if common == len(tokens):
            return 0
        self.llm.n_tokens = common
        rest = tokens[common:]
        size = step if step > 0 else len(rest)
        evaluated = 0
        for start in range(0, len(rest), size):
            if start and may_continue is not None and not may_continue():
                break
            self.fit_threads()
            self.on_engine_thread(self.llm.eval, rest[start : start + size])
            evaluated += len(rest[start : start + size])
        return evaluated

    def fit_threads(self) -> None:
        """Run the next evaluation on the cores other stages leave free (at least one thread).

        The caller holds :attr:`lock`. llama.cpp's threads meet at every operation of a token, so a
        thread whose core another stage is using stalls them all: on 2 cores beside a Piper
        synthesis, 2 threads wrote 9-11 tokens/s and 1 thread 16-20
        (:mod:`speech_to_speech.core.priority`). Changing the count costs nothing
        (``llama_set_n_threads`` only sets what the next decode uses).
        """
        threads = CORES.free(self.n_threads)
        if threads != self._threads_now:
            self.llm._ctx.set_n_threads(threads, threads)
            self._threads_now = threads

    @property
    def wanted(self) -> bool:
        """A reply is waiting for :attr:`lock` (work done ahead should give the engine up)."""
        return self._waiting > 0

    def echo_guard(self, prompt_length: int, user_text: str) -> EchoGuard:
        """The :class:`~handlers.llm.echo_guard.EchoGuard` of a spoken reply to ``user_text``."""

        def plain(text: str) -> list[int]:
            return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

        user = plain(" " + user_text.strip())
        numeric = {t for t in user if any(c.isdigit() for c in self._token_text(t))}
        return EchoGuard(prompt_length, opening_tokens(user_text, plain), user, numeric)

    def stream(
        self,
        tokens: list[int],
        max_tokens: int,
        temperature: float,
        should_stop: Callable[[], bool],
        on_start: Callable[[PromptStats], None],
        processors: Sequence[Callable[[Any, Any], Any]] = (),
        on_finish: Callable[[str], None] | None = None,
    ) -> Iterator[str]:
        """Yield text pieces of the completion of ``tokens``; stop once ``should_stop()``.

        Holds the engine's lock while generating; ``on_start`` receives the prompt's
        cache statistics once the lock is held. While another session holds the lock,
        ``should_stop()`` is checked every :data:`LOCK_POLL_S` (a response given up on, e.g.
        past its first-token time-out, never takes the engine). ``processors``: logits processors
        (``(input_ids, scores) -> scores``), applied in order, e.g. the echo guard
        (:meth:`echo_guard`) and a :class:`~handlers.llm.call_threshold.CallThreshold`.
        ``on_finish`` receives llama.cpp's finish reason ("stop", or "length" at ``max_tokens``).
        """
        logits_processor = LogitsProcessorList(list(processors)) if processors else None
        with self._waiting_lock:
            self._waiting += 1
        try:
            while not self.lock.acquire(timeout=LOCK_POLL_S):
                if should_stop():
                    return
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        try:
            if should_stop():
                return
            on_start(PromptStats(len(tokens), self.cached_prefix(tokens)))
            self.fit_threads()  # the prompt is evaluated at the first step, on the cores free then
            chunks = self.llm.create_completion(  # a generator: each next() evaluates, on the engine's thread
                prompt=tokens,
                max_tokens=max_tokens,
                temperature=temperature,
                repeat_penalty=1.1,
                stream=True,
                logits_processor=logits_processor,
            )
            try:
                while (chunk := self.on_engine_thread(next, chunks, None)) is not None:
                    if should_stop():
                        return
                    choice = chunk["choices"][0]
                    if choice.get("finish_reason") and on_finish is not None:
                        on_finish(choice["finish_reason"])
                    text = choice["text"]
                    if text:
                        yield text
                    self.fit_threads()  # each step evaluates the next token: on the cores free now
            finally:
                self.on_engine_thread(chunks.close)
        finally:
            self.lock.release()


def _echo_guarded(request: LLMRequest, messages: list[dict[str, Any]]) -> bool:
    """Whether the reply to ``request`` may not open with the user's first words: a spoken reply
    to a user message (not to a tool result)."""
    last = messages[-1] if messages else {}
    return request.wants_audio and last.get("role") == "user" and isinstance(last.get("content"), str)


def _messages(request: LLMRequest) -> list[dict[str, Any]]:
    """The request's chat messages for the chat template; the newest tool result, when it ends
    them, carries :data:`~speech_to_speech.llm.prompts.TOOL_RESULT_NOTE` (the template shows it
    as a user turn)."""
    messages = template_messages(request.chat_messages())
    if messages and messages[-1].get("role") == "tool" and isinstance(messages[-1].get("content"), str):
        messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n{TOOL_RESULT_NOTE}"}
    return messages


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    """Jinja's ``tojson`` as chat templates expect it (no HTML escaping, Unicode kept)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat Responses-shape function tools → the nested Chat shape chat templates take."""
    nested = []
    for tool in tools:
        spec = function_tool_spec(tool)
        if spec is not None:
            name, description, parameters = spec
            nested.append(
                {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
            )
    return nested


class LlamaCppLLMHandler(LocalLLMHandler):
    """Streams replies from a GGUF model with llama.cpp, reusing the cached prompt prefix.

    Attributes:
        last_prompt: token statistics of the latest request (None before the first).
        prompts: those of the latest :data:`PROMPTS_KEPT` requests, oldest first.
    """

    native_tools = True  # tools go through the model's own chat template

    #: ends the partial user text in a rendered prompt, to cut the prompt there (a private-use character)
    _PARTIAL_END = "\ue000"

    def load(self) -> None:
        path = resolve_gguf(self.config.llm_model, lambda message: logger.info("%s", message))
        threads = getattr(self.config, "llm_threads", 0) or default_threads()
        n_ctx = getattr(self.config, "llm_context", 4096)
        self.engine: LlamaEngine = shared_model(
            ("llama-cpp", str(path), n_ctx, threads), lambda: LlamaEngine(str(path), n_ctx, threads)
        )
        model = embedded_model(self.config.llm_model or "")
        #: the tool-call threshold of the model (None: none; see :mod:`handlers.llm.call_threshold`)
        self.call_threshold = model.call_threshold if model is not None else None
        self.compact_voice_prompt = model is not None and model.compact_prompt
        self.last_prompt: PromptStats | None = None
        #: the call openers' probability at the first token of the last reply that offered tools
        #: under a call threshold (None: no such reply yet); benchmark_tools.py prints it
        self.last_call_probability: float | None = None
        self.prompts: collections.deque[PromptStats] = collections.deque(maxlen=PROMPTS_KEPT)
        # the system prompt of a plain spoken reply goes into the KV cache now, not on the first turn
        system = {"role": "system", "content": self.system_prompt(True, None)}
        self.engine.prefill(self.engine.render([system], None, add_generation_prompt=False))
        # the user's words go into the KV cache while they are spoken (handlers.llm.partial_prefill)
        self.partial_prefill = PartialPrefill(self.engine, self._prompt_so_far, self.name)

    def cleanup(self) -> None:
        prefill = getattr(self, "partial_prefill", None)
        if prefill is not None:
            prefill.close()
        super().cleanup()

    def prepare_prompt(self) -> None:
        """The instructions or tools changed (a realtime ``session.update``): evaluate the new system
        prompt and history into the KV cache ahead, as for a partial transcript, so that the first
        turn after the change does not wait for it (~300 tokens: seconds for the 1.5B on 2 cores)."""
        self.partial_prefill.submit("")

    def on_partial_transcript(self, text: str) -> None:
        """Evaluate the prompt so far into the KV cache, on the prefill thread (never blocks)."""
        self.partial_prefill.submit(text)

    def _prompt_so_far(self, text: str) -> str | None:
        """The prompt of a spoken turn whose words so far are ``text``, up to their end (None: no
        cut), or the whole prompt, assistant header included, when ``text`` reads finished (see
        :func:`~handlers.llm.partial_prefill.reads_finished`).

        Rendered as :meth:`events` renders the real request (the same system prompt, history,
        tools and template), with the partial text as the new user message.
        """
        finished = reads_finished(text)
        content = text.strip() if finished else text.strip() + self._PARTIAL_END
        user = {"type": "message", "role": "user", "content": content}
        system = self.system_prompt(True, None, None, self.tools, self.tool_choice)
        tools = chat_tools(self.tools) if self.tools and self.tool_choice != "none" else []
        messages = template_messages(to_chat_messages(system, [*self.chat.items(), user]))
        prompt = self.engine.render(messages, tools)
        if finished:
            return prompt
        end = prompt.find(self._PARTIAL_END)
        return prompt[:end] if end > 0 else None

    def first_token_deadline_s(self, request: LLMRequest) -> float | None:
        """``--first_token_timeout_s`` plus the time the prompt's tokens not in the KV cache take
        to evaluate at :data:`PREFILL_FLOOR_TOKENS_PER_S`: a long new prompt (a session's own
        instructions, ~350 tokens) is work, not a stall, and must not end in the apology."""
        base = super().first_token_deadline_s(request)
        if base is None:
            return None
        tools = chat_tools(request.tools) if request.tool_choice != "none" else []
        tokens = self.engine.tokenize(self.engine.render(_messages(request), tools))
        return base + (len(tokens) - self.engine.cached_prefix(tokens)) / PREFILL_FLOOR_TOKENS_PER_S

    def _shaped_call(
        self,
        tokens: list[int],
        request: LLMRequest,
        should_stop: Callable[[], bool],
        processors: list[Callable[[Any, Any], Any]],
        threshold: CallThreshold,
    ) -> list[ProviderEvent]:
        """A forced call that did not start as one (:func:`starts_no_call`), written again with
        :data:`CALL_PREFIX` forced as its first tokens: the model picks the tool and its arguments.

        Returns:
            its events (checked by the caller as every forced call's are).
        """
        prefix = self.engine.llm.tokenize(CALL_PREFIX.encode("utf-8"), add_bos=False)
        again = [p for p in processors if p is not threshold] + [ForcedPrefix(len(tokens), prefix)]
        extractor, events, written = JsonCallExtractor(), [], []
        pieces = self.engine.stream(
            tokens, request.max_output_tokens, request.temperature, should_stop, lambda _stats: None, again
        )
        for text in pieces:
            written.append(text)
            new = list(self._tool_events(extractor.feed(text), request.tools))
            events += new
            if any(isinstance(event, ToolCall) for event in new):
                pieces.close()  # the call is written: what the model adds after it is not wanted
                break
        else:
            events += self._tool_events(extractor.flush(), request.tools)
        logger.debug("%s: the call written again: %r", self.name, "".join(written))
        return events

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        tools = chat_tools(request.tools) if request.tool_choice != "none" else []
        messages = _messages(request)
        prompt = self.engine.render(messages, tools)
        tokens = self.engine.tokenize(prompt)
        started = time.monotonic()

        def on_start(stats: PromptStats) -> None:
            self.last_prompt = stats
            self.prompts.append(stats)
            self.bus.publish(EngineWait(0, wait_ms=(time.monotonic() - started) * 1000))
            logger.debug(
                "%s: prompt %d tokens, %d from the KV cache, %d evaluated (waited %.0f ms for the engine)",
                self.name,
                stats.prompt_tokens,
                stats.reused_tokens,
                stats.evaluated_tokens,
                (time.monotonic() - started) * 1000,
            )

        processors: list[Callable[[Any, Any], Any]] = []
        if _echo_guarded(request, messages):
            processors.append(self.engine.echo_guard(len(tokens), str(messages[-1]["content"])))
        threshold = None
        if tools and request.tool_choice == "auto" and self.call_threshold and messages[-1].get("role") == "user":
            threshold = CallThreshold(len(tokens), self.engine.call_openers, self.call_threshold)
            processors.append(threshold)
        finish: list[str] = []  # the last stream's finish reason
        pieces = self.engine.stream(
            tokens, request.max_output_tokens, request.temperature, should_stop, on_start, processors, finish.append
        )
        reply: list[str] = []
        if not tools:
            for text in pieces:
                reply.append(text)
                yield TextDelta(text)
        else:
            extractor = JsonCallExtractor()
            held: list[ProviderEvent] = []  # a forced call's events, until its arguments are checked
            shape_open = True  # a forced call's first characters are still to be judged
            for text in itertools.chain(pieces, [None]):
                if text is not None:
                    reply.append(text)
                    if threshold is not None and threshold.forced and shape_open:
                        so_far = "".join(reply)
                        if starts_no_call(so_far):
                            pieces.close()  # not shaped as a call: written again as one, below
                            held, reply = self._shaped_call(tokens, request, should_stop, processors, threshold), []
                            break
                        shape_open = len(so_far) < CALL_SHAPE_JUDGED_CHARS
                parts = extractor.feed(text) if text is not None else extractor.flush()
                for event in self._tool_events(parts, request.tools):
                    if threshold is not None and threshold.forced:
                        held.append(event)
                    else:
                        yield event
            # a forced call that names no known tool (the parser skipped it) or makes up its numbers
            # is undone: the reply is generated again with the call openers banned
            user_text = str(messages[-1].get("content") or "")
            calls = [e for e in held if isinstance(e, ToolCall)]
            if (
                threshold is not None
                and threshold.forced
                and (not calls or any(invents_numbers(call.arguments, user_text) for call in calls))
            ):
                note = "%s: the forced tool call %s (%r) was undone; answering without one"
                logger.info(note, self.name, calls, "".join(reply))
                held, reply, extractor = [], [], JsonCallExtractor()
                again = [p for p in processors if p is not threshold] + [
                    BanCalls(len(tokens), self.engine.call_openers)
                ]
                for text in self.engine.stream(
                    tokens,
                    request.max_output_tokens,
                    request.temperature,
                    should_stop,
                    lambda _stats: None,
                    again,
                    finish.append,
                ):
                    reply.append(text)
                    yield from self._tool_events(extractor.feed(text), request.tools)
                yield from self._tool_events(extractor.flush(), request.tools)
            yield from held
        if threshold is not None:
            self.last_call_probability = threshold.probability
            logger.debug(
                "%s: p(call) %.4f at the first token (forced: %s)",
                self.name,
                threshold.probability or 0.0,
                threshold.forced,
            )
        completion = self.engine.llm.tokenize("".join(reply).encode("utf-8"), add_bos=False) if reply else []
        yield Usage(len(tokens), len(completion), at_token_limit=finish[-1:] == ["length"])
