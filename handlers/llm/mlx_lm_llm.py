"""mlx-lm: Apple Silicon (Metal), and Linux CPU through ``mlx[cpu]``.

The default model is the embedded Qwen2.5-Coder-0.5B-Instruct, converted once into a
float32 safetensors folder (see :mod:`handlers.llm.embedded`); ``--llm_model`` also
takes an MLX model folder or a hub id such as
``mlx-community/Qwen2.5-1.5B-Instruct-4bit``.

Linux CPU: the BLAS. The Linux wheel of ``mlx[cpu]`` (mlx-cpu 0.32.4) bundles the
netlib *reference* BLAS (``mlx_cpu.libs/libblas-*.so.3.10.0``: plain loops, one thread)
and sends every float32 matrix product to its ``cblas_sgemm``; mlx's own bfloat16,
float16 and quantised kernels are not vectorised on x86 either. That, not the model
size, the prompt or the thread count, made the embedded model take 30-100 s to its
first token: the 159-token prompt of a first turn was evaluated at 1.7-3 tokens/s.
Measured on the 2-core AMD EPYC target while other work shared it (wall times vary with
that load), one 159x896 by 896x4864 product (an MLP projection over that prompt) and
one 1x896 by 896x4864 product (the same for one generated token):

=========================================  ===============================  ============
weights and kernel                         159 tokens                       1 token, CPU
=========================================  ===============================  ============
float32, bundled reference BLAS            1390-1870 ms, 0.7-1.0 GFLOP/s    4.1 ms
bfloat16 / float16 (mlx's own kernel)      690-1180 ms, 1.2-2.0 GFLOP/s     4.5 / 14 ms
4-bit / 8-bit (``mx.quantized_matmul``)    1740-1960 ms, 0.7-0.8 GFLOP/s    4.1 / 4.8 ms
float32, MKL ``cblas_sgemm`` (below)       117-128 ms, 11-12 GFLOP/s        1.8 ms
=========================================  ===============================  ============

So on Linux, before mlx is first imported, :func:`bind_optimised_blas` loads an
optimised ``cblas_sgemm`` into the process's global symbol scope: the one exported by
CTranslate2's library (Intel MKL on x86-64; ``ctranslate2`` is a core dependency, the
STT's engine). libmlx, loaded afterwards, then binds its ``cblas_sgemm`` to it, because
the dynamic linker searches the global scope before a library's own dependencies. The
weights stay float32: with the MKL product that is the fastest format mlx has on a Linux
CPU (table above), also for one token at a time. Once ``mlx.core`` is imported the
binding is fixed (Python loads extensions with ``RTLD_NOW``), so a process that imported
mlx earlier keeps the slow BLAS (logged as a warning). ``S2S_MLX_BLAS=0`` turns the
binding off.

Prompt reuse (:class:`MLXPromptCache`), as llama-cpp does: the KV cache of the previous
request is kept, the next request evaluates only the tokens after the longest common
prefix, and the system prompt of a spoken reply (147 tokens) is evaluated at load. A turn
then evaluates its new user message and the reply before it (12-17 tokens for a short
question), not the whole prompt.

Measured (``--input_text "Name one planet."``, embedded model, 2 cores, load average about
2-3 from other work): before, ready in 27.7 s, first token after 53.0-55.4 s; after, ready
in 7.8-8.7 s (of the LLM's load: torch import 1.2 s, weights 2.8 s, system prompt 2.3 s),
first token after 0.62-0.70 s. Generation runs at about 5 tokens/s: float32 reads 2.5 GB
of weights per token (llama-cpp's Q4_K_M reads a fifth of that). A spoken question
(``tests/data/question-capital.wav``, load average 3-9): first token 0.7-1.0 s after the
transcript, voice to voice 1.3-2.0 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# transformers (mlx_lm's tokenizers) is imported here, where the pipeline is built, not in load():
# on Python 3.11 a thread that imports it while another thread still runs its __init__ gets the
# module object that transformers then replaces with its lazy module, and fails with "cannot import
# name 'AutoTokenizer' from 'transformers'" (the VAD stage's Smart Turn imports it at the same time:
# every spoken run failed so). Once imported, its lazy submodule imports are safe from any thread.
import transformers  # noqa: F401

from handlers.llm.embedded import resolve_model, wants_compact_prompt
from handlers.llm.llama_cpp_llm import PromptStats
from speech_to_speech.core.events import EngineWait
from speech_to_speech.core.shared import shared_model
from speech_to_speech.llm.local import LocalLLMHandler

logger = logging.getLogger(__name__)

#: environment variable; ``0`` keeps mlx's bundled BLAS on Linux (see :func:`bind_optimised_blas`)
BLAS_ENV = "S2S_MLX_BLAS"
#: MKL threads for mlx's matrix products. mlx's CPU backend runs everything else on one
#: thread, and a second MKL thread mostly waits for a core: with 2 threads the 147-token
#: system prompt took 8.8 s of CPU (24.8 s wall), with 1 thread 1.8 s (4.2 s wall), on the
#: 2-core target shared with other work; it also leaves the other core to STT and TTS.
#: The setting is MKL's, for all of CTranslate2's copy of it: the STT (faster-whisper) runs its
#: products on one thread too, which is its default (``--stt_cpu_threads 1``); with more STT
#: threads, only its MKL products stay on one.
BLAS_THREADS = 1

_blas_lock = threading.Lock()
_blas_done = False
#: the library bound by :func:`bind_optimised_blas`, kept referenced so it stays loaded
_blas_library: ctypes.CDLL | None = None


def _package_folders(name: str) -> list[Path]:
    """The folders of package ``name`` (several for a namespace package), without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(folder) for folder in spec.submodule_search_locations]


def bundles_reference_blas() -> bool:
    """Whether the installed mlx uses the reference BLAS bundled in its Linux wheel (``mlx_cpu.libs``)."""
    for folder in _package_folders("mlx"):
        libs = folder.parent / "mlx_cpu.libs"
        if any(libs.glob("libblas*.so*")) and not any(libs.glob("*openblas*")):
            return True
    return False


def optimised_blas_candidates() -> list[Path]:
    """Shared libraries of installed packages that may export an optimised ``cblas_sgemm``, best first.

    CTranslate2's library (a core dependency): its Linux x86-64 wheels link Intel MKL
    statically and export its CBLAS functions.
    """
    candidates: list[Path] = []
    for folder in _package_folders("ctranslate2"):
        candidates.extend(sorted((folder.parent / "ctranslate2.libs").glob("libctranslate2*.so*")))
    return candidates


def bind_optimised_blas() -> Path | None:
    """Make an optimised ``cblas_sgemm`` global before mlx is imported (Linux; once per process).

    Does nothing (returns None) off Linux, when ``S2S_MLX_BLAS=0``, when the installed
    mlx does not bundle the reference BLAS, or when no candidate library exports
    ``cblas_sgemm``; warns when ``mlx.core`` is already imported (too late to bind).

    torch is imported first: its ``libtorch_cpu`` links another copy of MKL whose
    exported symbols have the same names (1,578 of them), and, loaded after the
    promotion, it would bind its MKL calls to CTranslate2's copy. Apart from standard
    library template instances, libmlx shares only ``cblas_sgemm`` with CTranslate2's
    library (its bundled LAPACK also ``sgemm_``, ``isamax_``, ``xerbla_``, which MKL
    implements); the libraries of the other core dependencies share nothing else that
    matters.

    Returns:
        The library now providing ``cblas_sgemm``, or None.
    """
    global _blas_done, _blas_library
    with _blas_lock:
        if _blas_done:
            return Path(_blas_library._name) if _blas_library is not None else None
        _blas_done = True
        if not sys.platform.startswith("linux") or os.environ.get(BLAS_ENV, "1") == "0":
            return None
        if not bundles_reference_blas():
            return None
        if "mlx.core" in sys.modules:
            logger.warning(
                "mlx was imported before the mlx-lm backend loaded: its matrix products keep the reference "
                "BLAS of the mlx[cpu] wheel (about 10x slower); see handlers/llm/mlx_lm_llm.py"
            )
            return None
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401  (binds torch's own MKL first; see above)
        for path in optimised_blas_candidates():
            try:
                probe = ctypes.CDLL(str(path))
                if not hasattr(probe, "cblas_sgemm"):
                    continue
                _blas_library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                logger.debug("cannot load %s", path, exc_info=True)
                continue
            # MKL's own setting (its service layer; the public mkl_set_num_threads is not exported):
            # process-wide for this copy of MKL, ahead of OpenMP's count, which a thread that mlx
            # starts would otherwise take from the core count
            set_threads = getattr(_blas_library, "mkl_serv_set_num_threads", None)
            if set_threads is not None:
                set_threads.argtypes = [ctypes.c_int]
                set_threads(BLAS_THREADS)
            logger.info("mlx-lm: float32 matrix products use cblas_sgemm from %s", path.name)
            return path
        logger.warning("mlx-lm: no optimised BLAS found; mlx[cpu] keeps its reference BLAS (slow)")
        return None


def _token_ids(encoded: Any) -> list[int]:
    """Token ids from ``apply_chat_template`` (a list, or a mapping with ``input_ids``)."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


class MLXPromptCache:
    """One model's KV cache and the tokens it holds, reused across requests (longest common prefix).

    Shared by all sessions of a process, like the model; use it under the handler's
    generation lock.

    Attributes:
        cache: mlx-lm's per-layer caches (``make_prompt_cache``).
        tokens: the token ids whose keys and values the cache holds, in order.
    """

    def __init__(self, model: Any) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        self.model = model
        self.cache: list[Any] = make_prompt_cache(model)
        self.tokens: list[int] = []

    def _reset(self) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        self.cache = make_prompt_cache(self.model)
        self.tokens = []

    def _offset(self) -> int | None:
        offsets = {getattr(c, "offset", None) for c in self.cache}
        return offsets.pop() if len(offsets) == 1 and None not in offsets else None

    def keep(self, count: int) -> int:
        """Keep only the first ``count`` cached tokens; returns how many are kept (0 if it cannot trim)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        offset = self._offset()
        if offset is None or len(self.tokens) != offset:
            self._reset()
            return 0
        count = min(count, offset)
        if count < offset:
            if not can_trim_prompt_cache(self.cache):
                self._reset()
                return 0
            trim_prompt_cache(self.cache, offset - count)
            del self.tokens[count:]
        return count

    def prepare(self, tokens: list[int], evaluate_one: bool = True) -> PromptStats:
        """Trim the cache to its longest common prefix with ``tokens``.

        Args:
            tokens: the whole prompt.
            evaluate_one: leave at least the last token to evaluate (generation needs
                the logits of the prompt's last token).

        Returns:
            The prompt's size and how many of its tokens the cache already holds.
        """
        common = 0
        for cached, token in zip(self.tokens, tokens, strict=False):
            if cached != token:
                break
            common += 1
        if evaluate_one:
            common = max(0, min(common, len(tokens) - 1))
        return PromptStats(len(tokens), self.keep(common))

    def record(self, tokens: list[int]) -> None:
        """After evaluating or generating: the cache holds ``tokens`` (as many of them as it has).

        A cache holding more than ``tokens`` (the end-of-sequence token a reply stopped on,
        which the caller never sees) is trimmed back to them.
        """
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        offset = self._offset()
        if offset is None:
            self._reset()
            return
        self.tokens = list(tokens[:offset])
        if offset > len(tokens):
            if can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, offset - len(tokens))
            else:
                self._reset()

    def prefill(self, tokens: list[int]) -> PromptStats:
        """Evaluate ``tokens`` into the cache (e.g. the system prompt at load)."""
        import mlx.core as mx

        stats = self.prepare(tokens, evaluate_one=False)
        if stats.evaluated_tokens:
            self.model(mx.array(tokens[stats.reused_tokens :])[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
        self.record(tokens)
        return stats


class MLXLMHandler(LocalLLMHandler):
    """Streams replies with ``mlx_lm.stream_generate``; stops between tokens when cancelled.

    Attributes:
        last_prompt: token statistics of the latest request (None before the first).
    """

    # MLX streams belong to the thread that made them: generate on the stage's own thread
    # (so no first-token time-out for this backend)
    events_in_helper_thread = False

    def load(self) -> None:
        bind_optimised_blas()
        from mlx_lm import load

        self.compact_voice_prompt = wants_compact_prompt(self.config.llm_model or "")
        source = resolve_model(self.config.llm_model)
        self.model, self.tokenizer = shared_model(("mlx-lm", source), lambda: load(source))
        # one generation at a time per process: MLX streams are not shared across threads
        self._generate_lock = shared_model(("mlx-lm-lock",), threading.Lock)
        self._prompt_cache: MLXPromptCache = shared_model(("mlx-lm-cache", source), lambda: MLXPromptCache(self.model))
        self.last_prompt: PromptStats | None = None
        # the system prompt of a plain spoken reply goes into the KV cache now, not on the first turn
        system = [{"role": "system", "content": self.system_prompt(True, None)}]
        try:
            tokens = _token_ids(self.tokenizer.apply_chat_template(system, add_generation_prompt=False))
        except Exception:  # a chat template without a system role: warm up on a tiny request instead
            logger.debug("%s: cannot render a system message alone", self.name, exc_info=True)
            for _ in self.stream([{"role": "user", "content": "Hi"}], lambda: False, max_new_tokens=2):
                pass
            return
        with self._generate_lock:
            self._prompt_cache.prefill(tokens)

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_repetition_penalty, make_sampler

        prompt = _token_ids(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        waiting = time.monotonic()
        with self._generate_lock:
            # one engine for every session of the process: how long this reply waited for it
            self.bus.publish(EngineWait(0, wait_ms=(time.monotonic() - waiting) * 1000))
            cache = self._prompt_cache
            stats = cache.prepare(prompt)
            self.last_prompt = stats
            logger.debug(
                "%s: prompt %d tokens, %d from the KV cache, %d evaluated",
                self.name,
                stats.prompt_tokens,
                stats.reused_tokens,
                stats.evaluated_tokens,
            )
            held = list(prompt)
            try:
                for response in stream_generate(
                    self.model,
                    self.tokenizer,
                    mx.array(prompt[stats.reused_tokens :]),
                    max_tokens=max_new_tokens or self.config.max_new_tokens,
                    sampler=make_sampler(temp=self.config.temperature),
                    logits_processors=[make_repetition_penalty(1.1)],
                    prompt_cache=cache.cache,
                ):
                    # the last response repeats the final token; an end-of-sequence token is never shown
                    if response.finish_reason is None or response.finish_reason == "length":
                        held.append(int(response.token))
                    if should_stop():
                        return
                    if response.text:
                        yield response.text
            finally:
                cache.record(held)
