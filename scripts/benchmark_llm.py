"""LLM backend benchmark: load time, TTFT, time to first sentence and tokens/s per backend.

Every backend answers the same fixed set of short voice-assistant prompts
(:data:`PROMPTS`), driven exactly as the pipeline drives its LLM stage: the handler
class from the registry is built with a fresh ``Gate`` and ``EventBus``,
:meth:`setup` is called once, and each prompt is a fresh
:class:`~speech_to_speech.core.messages.Transcript` (a new turn stamp) whose
:meth:`process` generator is consumed to its :class:`EndOfResponse`. The
conversation history is reset before every prompt, so prompts are independent::

    python scripts/benchmark_llm.py                      # transformers, mlx-lm, chat-completions
    python scripts/benchmark_llm.py --backends transformers --repeats 3
    python scripts/benchmark_llm.py --backends chat-completions,responses-api \\
        --base_url http://127.0.0.1:8000/v1 --model_name my-model

Each backend runs in a fresh Python subprocess (this script in its hidden child mode,
which prints one JSON line), so load times are those of a cold start and do not depend
on which libraries an earlier backend already imported.

For ``chat-completions`` without ``--base_url`` the script starts
``python -m llama_cpp.server`` itself on a free loopback port, serving the embedded
SmolLM2-135M-Instruct GGUF (:func:`handlers.llm.embedded.embedded_gguf`) under the alias
``smollm2``, and stops it afterwards. ``responses-api`` needs ``--base_url`` pointing at an
endpoint that serves ``/v1/responses`` (llama-cpp-python's server does not); without one it
is reported as skipped.

What is measured (``time.monotonic()`` differences inside the child):

- **load s**: wall time of ``handler.setup()`` (imports, model load and the handler's own
  warm-up generation). For the remote backends this is only the client creation; the time
  the script's llama.cpp server took to become ready is shown in the note column instead.
  A one-time GGUF to safetensors conversion of the embedded model (see
  :mod:`handlers.llm.embedded`) is done by the parent before any timing.
- **TTFT ms** (time to first token): request start (the handler's ``ResponseStarted``
  event) -> first non-empty ``TextDelta``, as reported by the handler's ``FirstToken``
  event on the bus.
- **1st sentence ms**: request start -> the first ``TTSInput`` yielded by ``process()``,
  i.e. the first text the TTS stage would receive. The sentence splitter holds the last
  sentence back until more text arrives, so for a one-sentence reply this is the end of
  generation. Turns that failed (where the handler speaks a fallback line) have none.
- **tok/s**: output tokens / generation time, where generation time is request start ->
  last ``TextDelta`` (so it includes prompt processing). Output tokens come from the
  provider's ``Usage`` event when the backend reports one, else from re-tokenising the raw
  reply with the model's tokenizer, else from whitespace-separated words; the token column
  and the table footer say which. The local backends re-tokenise with their own tokenizer.
  llama-cpp-python's server sends no usage on streamed responses, so with the script's own
  server the embedded model's ``tokenizer.json`` (from the cached conversion, the same
  vocabulary as the GGUF) is used; for ``--base_url`` endpoints pass ``--tokenizer``.

``p50``/``p90`` are percentiles (linear interpolation) over all measured turns of a
backend; tok/s is the mean over turns. ``--warmup`` extra requests per backend run
before the measured ones and are not counted. ``-`` means no value.

Exit status: 0 when every requested backend answered at least one prompt without error,
1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

#: the repository root (this file lives in ``scripts/``)
from speech_to_speech.testing.bench import REPO_ROOT, free_port, percentile

PROG = "benchmark_llm.py"
#: the fixed user prompts, short questions as a voice assistant hears them
PROMPTS = (
    "What's a good way to fall asleep faster?",
    "How long should I boil an egg for a soft yolk?",
    "Can you explain why the sky is blue?",
    "Give me a quick idea for dinner tonight.",
    "What's the difference between weather and climate?",
)
#: the untimed warm-up prompt
WARMUP_PROMPT = "Hi there, how are you?"
DEFAULT_BACKENDS = "transformers,mlx-lm,chat-completions"
#: the model alias the script's llama.cpp server serves
SERVER_ALIAS = "smollm2"
#: prefix of the one result line a child prints on stdout
RESULT_PREFIX = "BENCHMARK_LLM_RESULT "
#: backends that talk to an OpenAI-compatible server
REMOTE_BACKENDS = ("responses-api", "chat-completions")
#: how the output tokens were counted → footer text
TOKEN_SOURCES = {
    "usage": "provider-reported Usage.output_tokens",
    "tokenizer": "reply re-tokenised with the model's tokenizer (approximate: detokenised text, no EOS)",
    "words": "whitespace-separated words of the reply (an approximation, NOT tokens)",
}


# -- results ----------------------------------------------------------------------------------


@dataclass
class TurnResult:
    """One measured prompt.

    Attributes:
        prompt: the user text.
        reply: the assistant text (as committed to history).
        ttft_ms: request start -> first text delta, ms.
        first_sentence_ms: request start -> first ``TTSInput``, ms.
        gen_s: request start -> last text delta, s.
        output_tokens: tokens of the reply (see ``token_source``).
        token_source: a key of :data:`TOKEN_SOURCES`.
        error: the ``EndOfResponse`` error, if any.
    """

    prompt: str
    reply: str = ""
    ttft_ms: float | None = None
    first_sentence_ms: float | None = None
    gen_s: float | None = None
    output_tokens: int | None = None
    token_source: str = ""
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens per second of generation time, None when unknown."""
        if not self.output_tokens or not self.gen_s:
            return None
        return self.output_tokens / self.gen_s


@dataclass
class BackendResult:
    """What one backend run reported (or why it did not run).

    Attributes:
        backend: the registry name.
        load_s: ``setup()`` seconds, None when it failed or did not run.
        error: a one-line reason when the backend could not be benchmarked.
        note: extra information for the table (e.g. server start time).
        turns: the measured prompts.
    """

    backend: str
    load_s: float | None = None
    error: str | None = None
    note: str = ""
    turns: list[TurnResult] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendResult:
        """Rebuild a result from its :func:`dataclasses.asdict` form."""
        turns = [TurnResult(**turn) for turn in data.get("turns", [])]
        return cls(data["backend"], data.get("load_s"), data.get("error"), data.get("note", ""), turns)

    @property
    def ok_turns(self) -> list[TurnResult]:
        """Turns answered without error."""
        return [turn for turn in self.turns if turn.error is None]


@dataclass
class ChildSpec:
    """Everything a child needs to benchmark one backend (sent as JSON on its command line)."""

    backend: str
    prompts: list[str]
    repeats: int = 1
    warmup: int = 1
    llm_model: str = ""
    max_new_tokens: int = 96
    device: str = "cpu"
    base_url: str = ""
    model_name: str = SERVER_ALIAS
    api_key: str = ""
    request_timeout_s: float = 60.0
    tokenizer_file: str = ""


def one_line(exc: BaseException, limit: int = 160) -> str:
    """``Type: message`` of ``exc`` on one line, shortened to ``limit`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- child mode: one backend, in-process ------------------------------------------------------


class TurnProbe:
    """Collects the timings of one response from the bus and the provider event stream.

    Subscribed to the handler's :class:`EventBus` (``ResponseStarted``, ``FirstToken``)
    and fed every ``TextDelta`` by :func:`instrument_events`.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the previous response."""
        self.start: float | None = None
        self.ttft_ms: float | None = None
        self.last_delta: float | None = None
        self.deltas: list[str] = []

    def on_event(self, event: Any) -> None:
        """EventBus subscriber: note request start and first-token latency."""
        from speech_to_speech.core.events import FirstToken, ResponseStarted

        if isinstance(event, ResponseStarted):
            self.start = event.time
        elif isinstance(event, FirstToken):
            self.ttft_ms = event.ttft_ms

    def on_delta(self, text: str) -> None:
        """A text delta left the provider."""
        self.last_delta = time.monotonic()
        self.deltas.append(text)


def instrument_events(handler: Any, probe: TurnProbe) -> None:
    """Wrap ``handler.events`` so that every non-empty ``TextDelta`` is reported to ``probe``.

    The wrapper is an instance attribute, so the base class's ``process()`` calls it
    in place of the backend's method; events pass through unchanged and the inner
    generator is closed when the wrapper is.
    """
    from speech_to_speech.llm.api import LLMRequest, ProviderEvent, TextDelta

    original: Callable[[LLMRequest, Callable[[], bool]], Iterator[ProviderEvent]] = handler.events

    def events(request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        inner = original(request, should_stop)
        try:
            for event in inner:
                if isinstance(event, TextDelta) and event.text:
                    probe.on_delta(event.text)
                yield event
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()

    handler.events = events


@lru_cache(maxsize=4)
def load_tokenizer_file(path: str) -> Any:
    """A ``tokenizers.Tokenizer`` read from a ``tokenizer.json`` file."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def count_tokens(handler: Any, text: str, tokenizer_file: str = "") -> tuple[int, str]:
    """Tokens of ``text`` with the handler's own tokenizer (local backends), else with
    ``tokenizer_file`` (a ``tokenizer.json``, for remote backends), else whitespace words.

    Returns:
        ``(count, source)`` with ``source`` a key of :data:`TOKEN_SOURCES`.
    """
    log = logging.getLogger(__name__)
    encode = getattr(getattr(handler, "tokenizer", None), "encode", None)
    if encode is not None:
        try:
            return len(encode(text, add_special_tokens=False)), "tokenizer"
        except Exception:  # an unexpected tokenizer API: try the next way
            log.debug("handler tokenizer failed", exc_info=True)
    if tokenizer_file:
        try:
            return len(load_tokenizer_file(tokenizer_file).encode(text, add_special_tokens=False).ids), "tokenizer"
        except Exception:
            log.debug("tokenizer file %s failed", tokenizer_file, exc_info=True)
    return len(text.split()), "words"


def run_turn(handler: Any, gate: Any, probe: TurnProbe, prompt: str, tokenizer_file: str = "") -> TurnResult:
    """Answer ``prompt`` as a fresh, independent turn and measure it.

    ``tokenizer_file`` counts the output tokens when the backend reports no usage
    and has no tokenizer of its own (see :func:`count_tokens`).
    """
    from speech_to_speech.core.messages import EndOfResponse, Transcript, TTSInput

    handler.chat.reset()
    probe.reset()
    result = TurnResult(prompt)
    first_sentence: float | None = None
    end: EndOfResponse | None = None
    for item in handler.process(Transcript(gate.new_turn_stamp(), prompt, language="en")):
        if isinstance(item, TTSInput) and first_sentence is None:
            first_sentence = time.monotonic()
        elif isinstance(item, EndOfResponse):
            end = item
    if end is None:
        result.error = "no EndOfResponse"
        return result
    result.reply = end.text
    result.error = end.error
    result.ttft_ms = probe.ttft_ms
    if probe.start is not None:
        if first_sentence is not None and end.error is None:
            result.first_sentence_ms = (first_sentence - probe.start) * 1000
        if probe.last_delta is not None:
            result.gen_s = probe.last_delta - probe.start
    reported = (end.usage or {}).get("output_tokens")
    if reported:
        result.output_tokens, result.token_source = int(reported), "usage"
    elif probe.deltas:
        result.output_tokens, result.token_source = count_tokens(handler, "".join(probe.deltas), tokenizer_file)
    return result


def build_config(spec: ChildSpec, config_cls: type) -> Any:
    """The backend's config dataclass filled from ``spec``."""
    from speech_to_speech.llm.api import OpenAICompatibleConfig

    kwargs: dict[str, Any] = {"llm_model": spec.llm_model, "max_new_tokens": spec.max_new_tokens}
    if issubclass(config_cls, OpenAICompatibleConfig):
        kwargs.update(
            model_name=spec.model_name,
            responses_api_base_url=spec.base_url,
            responses_api_api_key=spec.api_key,
            request_timeout_s=spec.request_timeout_s,
        )
    return config_cls(**kwargs)


def benchmark_backend(spec: ChildSpec) -> BackendResult:
    """Load one backend and run the prompts through it (in this process)."""
    from speech_to_speech.core.cancel import Gate
    from speech_to_speech.core.events import EventBus
    from speech_to_speech.pipeline.registry import get_backend

    result = BackendResult(spec.backend)
    gate, bus, probe = Gate(), EventBus(), TurnProbe()
    bus.subscribe(probe.on_event)
    try:
        backend = get_backend("llm", spec.backend)
        handler_cls = backend.load_handler_class()
        handler = handler_cls(
            stop_event=threading.Event(),
            input_queue=None,
            output_queue=None,
            gate=gate,
            bus=bus,
            config=build_config(spec, backend.config_cls),
            device=spec.device,
        )
        start = time.monotonic()
        handler.setup()
        result.load_s = time.monotonic() - start
    except Exception as exc:
        logging.getLogger(__name__).debug("load failed", exc_info=True)
        result.error = f"load failed: {one_line(exc)}"
        return result
    instrument_events(handler, probe)
    try:
        for index in range(spec.warmup):
            warm = run_turn(handler, gate, probe, WARMUP_PROMPT)
            print(f"[{spec.backend}] warm-up {index + 1}/{spec.warmup}: error={warm.error}", file=sys.stderr)
        total = len(spec.prompts) * spec.repeats
        for index in range(total):
            turn = run_turn(handler, gate, probe, spec.prompts[index % len(spec.prompts)], spec.tokenizer_file)
            result.turns.append(turn)
            tps = turn.tokens_per_s
            print(
                f"[{spec.backend}] {index + 1}/{total}: TTFT {fmt(turn.ttft_ms, 0)} ms, "
                f"1st sentence {fmt(turn.first_sentence_ms, 0)} ms, {turn.output_tokens} tok "
                f"({turn.token_source or '-'}), {fmt(tps, 1)} tok/s, error={turn.error}; "
                f"reply: {turn.reply[:80]!r}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        handler.cleanup()
    return result


def child_main(spec_json: str) -> int:
    """Child mode: benchmark one backend and print one :data:`RESULT_PREFIX` JSON line."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = ChildSpec(**json.loads(spec_json))
    result = benchmark_backend(spec)
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
    return 0


# -- parent mode --------------------------------------------------------------------------------


class LlamaServer:
    """``python -m llama_cpp.server`` on a free loopback port, serving the embedded GGUF.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1`` once started.
        start_s: seconds until ``/v1/models`` answered.
    """

    def __init__(self, threads: int, timeout_s: float = 180.0) -> None:
        self.threads = threads
        self.timeout_s = timeout_s
        self.base_url = ""
        self.start_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        handle, path = tempfile.mkstemp(prefix="llama_server.", suffix=".log")
        os.close(handle)
        self._log_path = Path(path)

    def start(self) -> None:
        """Start the server and wait until it answers.

        Raises:
            RuntimeError: if it exits or does not answer within ``timeout_s`` (with its log tail).
        """
        from handlers.llm.embedded import embedded_gguf

        port = free_port()
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(embedded_gguf()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model_alias",
            SERVER_ALIAS,
            "--n_threads",
            str(self.threads),
            "--n_threads_batch",
            str(self.threads),
            "--verbose",
            "False",
        ]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        begin = time.monotonic()
        with open(self._log_path, "wb") as log:  # the server keeps its own copy of the descriptor
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        while time.monotonic() - begin < self.timeout_s:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=2) as response:
                    if response.status == 200:
                        self.start_s = time.monotonic() - begin
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"llama_cpp.server did not answer within {self.timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        """The last non-empty line of the server's output."""
        try:
            lines = [line for line in self._log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:200] if lines else "(empty log)"

    def stop(self) -> None:
        """Stop the server (terminate, then kill) and delete its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log_path.unlink(missing_ok=True)


def prepare_embedded_model(llm_model: str) -> None:
    """Do the one-time GGUF -> safetensors conversion now, so no load time includes it."""
    if llm_model and not llm_model.endswith(".gguf"):
        return
    try:
        from handlers.llm.embedded import resolve_model

        resolve_model(llm_model)
    except Exception as exc:  # the local backends will report it as a load failure
        print(f"{PROG}: warning: could not prepare the embedded model: {one_line(exc)}", file=sys.stderr)


def embedded_tokenizer_file() -> str:
    """``tokenizer.json`` of the converted embedded model when it exists, else ``""``.

    The conversion reads the tokenizer from the GGUF, so it is the tokenizer the
    script's llama.cpp server uses.
    """
    try:
        from handlers.llm.embedded import converted_gguf_folder, embedded_gguf

        path = converted_gguf_folder(embedded_gguf()) / "tokenizer.json"
    except Exception:
        return ""
    return str(path) if path.is_file() else ""


def run_child(spec: ChildSpec, timeout_s: float) -> BackendResult:
    """Benchmark one backend in a fresh child process and collect its result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout_s, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return BackendResult(spec.backend, error=f"timed out after {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        return BackendResult(spec.backend, error=f"child exited with {proc.returncode} and no result (see stderr)")
    return BackendResult.from_dict(json.loads(lines[-1][len(RESULT_PREFIX) :]))


def benchmark(args: argparse.Namespace, backend: str) -> BackendResult:
    """Benchmark ``backend``, starting a llama.cpp server first when it needs one."""
    spec = ChildSpec(
        backend=backend,
        prompts=list(PROMPTS),
        repeats=args.repeats,
        warmup=args.warmup,
        llm_model=args.llm_model,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        base_url=args.base_url,
        model_name=args.model_name,
        api_key=args.api_key,
        request_timeout_s=args.request_timeout_s,
        tokenizer_file=args.tokenizer,
    )
    if backend not in REMOTE_BACKENDS or args.base_url:
        return run_child(spec, args.timeout_s)
    if backend == "responses-api":
        return BackendResult(backend, error="skipped: needs --base_url of a /v1/responses endpoint")
    server = LlamaServer(args.server_threads)
    try:  # the server is stopped whatever happens, Ctrl-C included
        try:
            server.start()
        except Exception as exc:
            return BackendResult(backend, error=f"server failed: {one_line(exc, 200)}")
        spec.base_url = server.base_url
        spec.model_name = SERVER_ALIAS
        spec.tokenizer_file = spec.tokenizer_file or embedded_tokenizer_file()
        result = run_child(spec, args.timeout_s)
    finally:
        server.stop()
    note = f"llama.cpp server ready in {server.start_s:.1f} s"
    result.note = f"{result.note}; {note}" if result.note else note
    return result


def fmt(value: float | None, digits: int) -> str:
    """``value`` with ``digits`` decimals, or ``-``."""
    return "-" if value is None else f"{value:.{digits}f}"


COLUMNS = (
    "backend",
    "load s",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "1st sent p50 ms",
    "1st sent p90 ms",
    "tok/s mean",
    "out tok mean",
    "tokens",
    "ok",
    "note",
)


def table_row(result: BackendResult) -> list[str]:
    """The cells of ``result``'s row (see :data:`COLUMNS`)."""
    ok = result.ok_turns
    ttft = [t.ttft_ms for t in ok if t.ttft_ms is not None]
    first = [t.first_sentence_ms for t in ok if t.first_sentence_ms is not None]
    tps = [v for v in (t.tokens_per_s for t in ok) if v is not None]
    tokens = [t.output_tokens for t in ok if t.output_tokens is not None]
    sources = sorted({t.token_source for t in ok if t.token_source})
    notes = [result.error] if result.error else []
    failed = [t for t in result.turns if t.error is not None]
    if failed:
        notes.append(f"{len(failed)} failed: {failed[0].error}")
    if result.note:
        notes.append(result.note)
    return [
        result.backend,
        fmt(result.load_s, 1),
        fmt(percentile(ttft, 50), 0),
        fmt(percentile(ttft, 90), 0),
        fmt(percentile(first, 50), 0),
        fmt(percentile(first, 90), 0),
        fmt(sum(tps) / len(tps) if tps else None, 1),
        fmt(sum(tokens) / len(tokens) if tokens else None, 1),
        "+".join(sources) or "-",
        f"{len(ok)}/{len(result.turns)}" if result.turns else "-",
        "; ".join(notes),
    ]


def format_table(results: list[BackendResult], args: argparse.Namespace) -> str:
    """The results table with its footer."""
    rows = [list(COLUMNS), *(table_row(result) for result in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]

    def line(cells: list[str]) -> str:
        head = [cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(cells[:-1])]
        return "  ".join([*head, cells[-1]]).rstrip()

    out = [line(rows[0]), line(["-" * w for w in widths] + ["-" * 4]), *(line(row) for row in rows[1:])]
    used = sorted({t.token_source for r in results for t in r.ok_turns if t.token_source})
    out.append("")
    out.append(
        f"{len(PROMPTS)} prompts x {args.repeats} repeat(s) per backend after {args.warmup} untimed warm-up "
        f"request(s); max_new_tokens={args.max_new_tokens}, greedy, device={args.device}; one child process per "
        "backend."
    )
    out.append(
        "load s = handler.setup(); TTFT = request start -> first text delta; 1st sent = request start -> first "
        "TTSInput; tok/s = output tokens / (request start -> last text delta), mean over turns; p50/p90 over "
        "turns answered without error (ok)."
    )
    for source in used:
        out.append(f"tokens '{source}': {TOKEN_SOURCES[source]}.")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=DEFAULT_BACKENDS, help="comma-separated LLM backend names")
    parser.add_argument("--repeats", type=int, default=1, help="times each prompt is asked (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up requests per backend (default 1)")
    parser.add_argument("--max_new_tokens", type=int, default=96, help="cap on generated tokens (default 96)")
    parser.add_argument("--llm_model", default="", help="model for the local backends ('' = embedded SmolLM2)")
    parser.add_argument("--device", default="cpu", help="device for the local backends (default cpu)")
    parser.add_argument(
        "--base_url", default="", help="OpenAI-compatible endpoint for the remote backends (default: own llama.cpp)"
    )
    parser.add_argument("--model_name", default=SERVER_ALIAS, help="model id sent to --base_url")
    parser.add_argument("--api_key", default="", help="API key for --base_url ('' = $OPENAI_API_KEY or none)")
    parser.add_argument(
        "--tokenizer",
        default="",
        help="tokenizer.json counting output tokens of remote backends that report no usage "
        "(default: the embedded model's with the script's own llama.cpp server, else words)",
    )
    parser.add_argument("--request_timeout_s", type=float, default=60.0, help="remote request timeout, s")
    parser.add_argument(
        "--server_threads", type=int, default=os.cpu_count() or 1, help="llama.cpp server threads (default: all)"
    )
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="limit per backend child process, s")
    parser.add_argument("--json_out", default="", help="also write the raw per-turn results here (JSON)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.max_new_tokens < 1:
        parser.error("--repeats and --max_new_tokens must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Benchmark every requested backend and print the table."""
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child)
    from speech_to_speech.pipeline.registry import REGISTRY

    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    if any(name in REGISTRY["llm"] and name not in REMOTE_BACKENDS for name in backends):
        prepare_embedded_model(args.llm_model)
    results: list[BackendResult] = []
    for name in backends:
        print(f"{PROG}: benchmarking {name} ...", file=sys.stderr, flush=True)
        if name not in REGISTRY["llm"]:
            known = ", ".join(sorted(REGISTRY["llm"]))
            results.append(BackendResult(name, error=f"unknown backend (known: {known})"))
            continue
        results.append(benchmark(args, name))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(result) for result in results], indent=2))
    print(format_table(results, args))
    return 0 if all(result.ok_turns for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
