"""llama.cpp in process (``llama-cpp-python``): the default LLM on a CPU.

The model is a GGUF file (default: the embedded Qwen2.5-Coder-0.5B-Instruct
Q4_K_M; ``--llm_model qwen2.5-coder-1.5b`` picks the embedded 1.5B, see
:mod:`handlers.llm.embedded`). The chat is rendered with the model's
own chat template (read from the GGUF metadata, rendered with Jinja2 in a
sandbox), tools included: the model gets them the way it was trained to, and
its calls are read whether it writes ``<tool_call>`` tags, a code fence or bare
JSON (:class:`~speech_to_speech.tools.json_calls.JsonCallExtractor`).

Prompt reuse: llama.cpp keeps the KV cache of the previous request and
evaluates only the tokens after the longest common prefix. The system prompt is
evaluated at start-up, and history is serialised the same way every turn, so a
turn evaluates only what is new since the last one (reported in
:attr:`LlamaCppLLMHandler.last_prompt` and at debug level).

One :class:`Llama` context is shared by all sessions of a process; a lock lets
one generation run at a time. A response waiting for it counts that wait against its
``--first_token_timeout_s`` (then the user hears a short apology instead of silence).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from handlers.llm.embedded import resolve_gguf
from speech_to_speech.llm_api import LLMRequest, ProviderEvent, TextDelta, Usage
from speech_to_speech.local_llm import LocalLLMHandler
from speech_to_speech.serialize import template_messages
from speech_to_speech.shared import shared_model
from speech_to_speech.tools.json_calls import JsonCallExtractor
from speech_to_speech.tools.prompt import function_tool_spec

logger = logging.getLogger(__name__)

#: seconds between checks of a response's ``should_stop`` while it waits for the engine
LOCK_POLL_S = 0.05
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

    On 2 cores both go to the LLM: it is on the critical path until the first
    sentence exists, and STT (before it) and TTS (after it) mostly run while it
    waits (measured: 2 threads 39 tokens/s, 1 thread 24 tokens/s for the embedded model).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


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
        self.lock = threading.Lock()
        metadata = self.llm.metadata
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(repair_template(metadata.get("tokenizer.chat_template") or FALLBACK_TEMPLATE))
        self.bos = self._token_text(self.llm.token_bos())
        self.eos = self._token_text(self.llm.token_eos())
        self.add_bos = metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"

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
        """Evaluate ``prompt`` into the KV cache (e.g. the system prompt at start-up)."""
        tokens = self.tokenize(prompt)
        with self.lock:
            reused = self.cached_prefix(tokens)
            self.llm.n_tokens = reused
            self.llm.eval(tokens[reused:])

    def stream(
        self,
        tokens: list[int],
        max_tokens: int,
        temperature: float,
        should_stop: Callable[[], bool],
        on_start: Callable[[PromptStats], None],
    ) -> Iterator[str]:
        """Yield text pieces of the completion of ``tokens``; stop once ``should_stop()``.

        Holds the engine's lock while generating; ``on_start`` receives the prompt's
        cache statistics once the lock is held. While another session holds the lock,
        ``should_stop()`` is checked every :data:`LOCK_POLL_S` (a response given up on, e.g.
        past its first-token time-out, never takes the engine).
        """
        while not self.lock.acquire(timeout=LOCK_POLL_S):
            if should_stop():
                return
        try:
            if should_stop():
                return
            on_start(PromptStats(len(tokens), self.cached_prefix(tokens)))
            chunks = self.llm.create_completion(
                prompt=tokens,
                max_tokens=max_tokens,
                temperature=temperature,
                repeat_penalty=1.1,
                stream=True,
            )
            try:
                for chunk in chunks:
                    if should_stop():
                        return
                    text = chunk["choices"][0]["text"]
                    if text:
                        yield text
            finally:
                chunks.close()
        finally:
            self.lock.release()


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
    """

    native_tools = True  # tools go through the model's own chat template

    def load(self) -> None:
        path = resolve_gguf(self.config.llm_model, lambda message: logger.info("%s", message))
        threads = getattr(self.config, "llm_threads", 0) or default_threads()
        n_ctx = getattr(self.config, "llm_context", 4096)
        self.engine: LlamaEngine = shared_model(
            ("llama-cpp", str(path), n_ctx, threads), lambda: LlamaEngine(str(path), n_ctx, threads)
        )
        self.last_prompt: PromptStats | None = None
        # the system prompt of a plain spoken reply goes into the KV cache now, not on the first turn
        system = {"role": "system", "content": self.system_prompt(True, None)}
        self.engine.prefill(self.engine.render([system], None, add_generation_prompt=False))

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        tools = chat_tools(request.tools) if request.tool_choice != "none" else []
        prompt = self.engine.render(template_messages(request.chat_messages()), tools)
        tokens = self.engine.tokenize(prompt)
        started = time.monotonic()

        def on_start(stats: PromptStats) -> None:
            self.last_prompt = stats
            logger.debug(
                "%s: prompt %d tokens, %d from the KV cache, %d evaluated (waited %.0f ms for the engine)",
                self.name,
                stats.prompt_tokens,
                stats.reused_tokens,
                stats.evaluated_tokens,
                (time.monotonic() - started) * 1000,
            )

        pieces = self.engine.stream(tokens, request.max_output_tokens, request.temperature, should_stop, on_start)
        reply: list[str] = []
        if not tools:
            for text in pieces:
                reply.append(text)
                yield TextDelta(text)
        else:
            extractor = JsonCallExtractor()
            for text in pieces:
                reply.append(text)
                yield from self._tool_events(extractor.feed(text), request.tools)
            yield from self._tool_events(extractor.flush(), request.tools)
        completion = self.engine.llm.tokenize("".join(reply).encode("utf-8"), add_bos=False) if reply else []
        yield Usage(len(tokens), len(completion))
