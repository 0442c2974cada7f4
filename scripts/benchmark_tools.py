#!/usr/bin/env python
"""Tool-calling benchmark: how well the embedded model calls tools, and what the prefetch saves.

Two parts (``--part accuracy``, ``--part prefetch`` or both, the default):

**(a) accuracy** of the local tool path: a local backend (``--llm_backend``, default the default
``llama-cpp``, which offers tools through the model's own chat template and reads JSON calls;
``transformers``/``mlx-lm`` use ``<code>`` blocks) with its embedded default model
(Qwen2.5-Coder-1.5B-Instruct; ``--llm_model`` picks another, e.g. ``qwen2.5-coder-0.5b``) and the sample tools of
``client/talk/sample_tools.py`` (``get_time``, ``add``), on a fixed set of prompts: ten that need a tool
and six that must not call one (three are the no-tool turns of the conversation benchmark's tool
dialogues). The table gives p(call): the call openers' probability at the reply's first token, which
the call threshold judges (:mod:`handlers.llm.call_threshold`; llama-cpp only). Each prompt is a
fresh conversation, answered in voice mode
(the voice system prompt) and, with ``--modes voice,text``, also in text mode. A prompt passes
when

* a tool prompt produces a call of the expected tool whose arguments are valid (JSON, accepted by
  the tool: ``execute_tool`` returns no ``error``) and match the prompt (the timezone, the two
  addends in either order);
* a no-tool prompt produces no call at all.

Per prompt the table shows the calls made and the verdict ("call rejected: ..." when the model
wrote a ``<code>`` block that the parser skipped, with the parser's reason); the last lines give
the pass rate per mode. Greedy decoding, so reruns on the same machine agree.

**(b) prefetch**: the latency the speculative follow-up saves, measured through the realtime
server running in this process (``speech_to_speech.testing.realtime.InProcessServer``) with the
``responses-api`` backend pointed at the scripted endpoint of ``speech_to_speech/testing/responses_server.py``, so the
numbers are the pipeline's (no model noise). The endpoint first streams "Let me check the weather."
and a call ``get_weather(city="Paris")``, then the follow-up "It is sunny in Paris."; it can wait
``--provider_delay_ms`` before each answer (a provider's time to first token). Each trial is a
fresh WebSocket session: ``session.update`` (the tool, audio output, ``turn_detection`` null), a
user message, ``response.create``, then two client behaviours:

* ``back-to-back``: after the first ``response.done`` the client sends ``function_call_output``
  and at once a plain ``response.create``. Measured: sending the output -> the first
  ``response.output_audio.delta`` of the follow-up.
* ``early output``: the client sends ``function_call_output`` as soon as
  ``response.function_call_arguments.done`` arrives (while the sentence before the call still
  plays) and ``response.create`` at the first ``response.done``. Measured: that
  ``response.done`` -> the first audio delta of the follow-up (the wait the user hears).

Each is run ``--runs`` times with the prefetch on and with it off (the session's
``llm.prefetch`` set to ``None`` through the in-process server object, before the first event).
The table gives p50 and p90 (linear interpolation) in ms, how many follow-ups were claimed from
the prefetch, and the provider requests per trial (2 when the prefetch was used or was off, 3 when
a follow-up was generated twice).

Run from the repository root::

    python scripts/benchmark_tools.py                      # both parts
    python scripts/benchmark_tools.py --part prefetch --runs 10 --provider_delay_ms 0,300

Exit status: 0 when every prefetch trial got its follow-up audio, 1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from speech_to_speech.testing.bench import percentile

#: the weather tool offered in part (b)
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
#: longest wait for one server event in part (b), s
EVENT_TIMEOUT_S = 60.0


# -- (a) accuracy ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One accuracy prompt.

    Attributes:
        prompt: the user's words.
        tool: the tool that should be called, or None when no tool should be.
        expect: checks the decoded arguments of a call of ``tool``.
        what: the expected call, for the table.
    """

    prompt: str
    tool: str | None
    expect: Callable[[dict[str, Any]], bool] = lambda _args: True
    what: str = "no call"


def _timezone(*names: str) -> Callable[[dict[str, Any]], bool]:
    """Arguments whose ``timezone`` is one of ``names`` (case-insensitive; absent counts as UTC)."""
    wanted = {n.lower() for n in names}
    return lambda args: str(args.get("timezone", "UTC")).lower() in wanted


def _addends(a: float, b: float) -> Callable[[dict[str, Any]], bool]:
    """Arguments ``a`` and ``b`` equal to the two numbers, in either order."""

    def check(args: dict[str, Any]) -> bool:
        try:
            return sorted([float(args["a"]), float(args["b"])]) == sorted([a, b])
        except (KeyError, TypeError, ValueError):
            return False

    return check


CASES: list[Case] = [
    Case("What time is it in Tokyo?", "get_time", _timezone("Asia/Tokyo"), "get_time Asia/Tokyo"),
    Case("What's the time in Paris right now?", "get_time", _timezone("Europe/Paris"), "get_time Europe/Paris"),
    Case(
        "Tell me the current time in New York.", "get_time", _timezone("America/New_York"), "get_time America/New_York"
    ),
    Case("What time is it in London?", "get_time", _timezone("Europe/London"), "get_time Europe/London"),
    Case("What is the current UTC time?", "get_time", _timezone("UTC", "Etc/UTC"), "get_time UTC (or none)"),
    Case("What is 17 plus 25?", "add", _addends(17, 25), "add 17, 25"),
    Case("Add 3.5 and 4.", "add", _addends(3.5, 4), "add 3.5, 4"),
    Case("Please add 120 and 80.", "add", _addends(120, 80), "add 120, 80"),
    Case("What's the sum of 9 and 16?", "add", _addends(9, 16), "add 9, 16"),
    Case("Can you add 1000 and 234 for me?", "add", _addends(1000, 234), "add 1000, 234"),
    Case("Tell me a short joke.", None),
    Case("What is the capital of France?", None),
    Case("Say hello to my friend Anna.", None),
    # the turns of the conversation benchmark's tool dialogues that must not call a tool
    Case("Hi, I need some help with a few numbers.", None),
    Case("Thanks! What's the capital of Spain?", None),
    Case("Great, that's all I needed.", None),
]


class _Collect(logging.Handler):
    """Keeps the messages of the tool-call parser's warnings (skipped ``<code>`` blocks)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass
class CaseResult:
    """What the model did for one :class:`Case` in one mode."""

    case: Case
    mode: str
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    rejected: list[str] = field(default_factory=list)  # <code> blocks the parser skipped, and why
    spoken: str = ""
    #: the call openers' probability at the reply's first token (llama-cpp with a call threshold)
    p_call: float | None = None
    seconds: float = 0.0
    passed: bool = False
    verdict: str = ""


def load_sample_tools() -> ModuleType:
    """The example tool module of ``s2s-talk`` (``speech_to_speech.client.talk.sample_tools``)."""
    from speech_to_speech.client.talk import sample_tools

    return sample_tools


def grade(result: CaseResult, sample: ModuleType) -> None:
    """Set ``passed`` and ``verdict`` of ``result`` (see the module docstring)."""
    case = result.case
    if case.tool is None:
        result.passed = not result.calls
        result.verdict = "ok" if result.passed else "called a tool"
        if result.passed and result.rejected:
            result.verdict = f"ok (a block was rejected: {result.rejected[0]})"
        return
    if not result.calls:
        result.verdict = f"call rejected: {result.rejected[0]}" if result.rejected else "no call"
        return
    wrong = [name for name, _ in result.calls if name != case.tool]
    right = [args for name, args in result.calls if name == case.tool]
    if not right:
        result.verdict = f"wrong tool ({', '.join(wrong)})"
        return
    try:
        args = json.loads(right[0])
    except json.JSONDecodeError:
        result.verdict = "arguments not JSON"
        return
    outcome = asyncio.run(sample.execute_tool(case.tool, args))
    if isinstance(outcome, dict) and "error" in outcome:
        result.verdict = f"invalid arguments: {outcome['error']}"
    elif not case.expect(args):
        result.verdict = "arguments do not match"
    elif wrong:
        result.verdict = "also a wrong tool"
    else:
        result.passed = True
        result.verdict = "ok"


def run_accuracy(args: argparse.Namespace) -> list[CaseResult]:
    """Ask every :data:`CASES` prompt in every mode; returns the graded results."""
    from speech_to_speech.core.cancel import Gate
    from speech_to_speech.core.events import EventBus
    from speech_to_speech.core.messages import ToolCallRequest, Transcript, TTSInput
    from speech_to_speech.pipeline.registry import get_backend

    sample = load_sample_tools()
    backend = get_backend("llm", args.llm_backend)
    handler_cls = backend.load_handler_class()
    # accuracy, not speed: no first-token time-out (a busy machine would turn slow replies into "no call")
    config = backend.config_cls(
        llm_model=args.llm_model,
        max_new_tokens=args.max_new_tokens,
        stream_batch_sentences=1,
        first_token_timeout_s=0,
    )
    llm = handler_cls(
        stop_event=threading.Event(),
        input_queue=None,
        output_queue=None,
        gate=Gate(),
        bus=EventBus(),
        config=config,
        device=args.device,
        name=f"llm:{args.llm_backend}",
    )
    start = time.monotonic()
    llm.setup()
    print(f"model loaded in {time.monotonic() - start:.1f} s", flush=True)
    llm.tools = list(sample.TOOLS)
    results: list[CaseResult] = []
    parse_log = logging.getLogger("speech_to_speech.llm.tools.parse")
    collect = _Collect()
    parse_log.addHandler(collect)
    parse_log.setLevel(logging.WARNING)
    parse_log.propagate = False  # reported in the table instead
    try:
        for mode in args.modes:
            for case in CASES:
                llm.chat.reset()
                result = CaseResult(case, mode)
                collect.messages.clear()
                began = time.monotonic()
                turn = Transcript(llm.gate.new_turn_stamp(), case.prompt, wants_audio=mode == "voice")
                for out in llm.process(turn):
                    if isinstance(out, ToolCallRequest):
                        result.calls.append((out.name, out.arguments))
                    elif isinstance(out, TTSInput):
                        result.spoken += out.text + " "
                result.seconds = time.monotonic() - began
                result.p_call = getattr(llm, "last_call_probability", None)
                if hasattr(llm, "last_call_probability"):
                    llm.last_call_probability = None
                result.rejected = list(collect.messages)
                grade(result, sample)
                results.append(result)
                mark = "PASS" if result.passed else "fail"
                print(f"  [{mode}] {mark} {case.prompt!r}: {result.verdict} ({result.seconds:.1f} s)", flush=True)
    finally:
        parse_log.removeHandler(collect)
        parse_log.propagate = True
        llm.stop_event.set()
        llm.cleanup()
    return results


def print_accuracy(results: list[CaseResult]) -> None:
    """The per-prompt table and the pass rate per mode."""
    print("\n(a) tool-call accuracy, embedded model, sample tools (get_time, add)\n")
    header = f"{'mode':<6} {'prompt':<40} {'expected':<26} {'p(call)':>8} {'calls made':<44} verdict"
    print(header)
    print("-" * len(header))
    for r in results:
        calls = ", ".join(f"{name}({args})" for name, args in r.calls) or "-"
        p_call = "-" if r.p_call is None else f"{r.p_call:.4f}"
        row = f"{r.mode:<6} {_cut(r.case.prompt, 40):<40} {_cut(r.case.what, 26):<26} {p_call:>8} {_cut(calls, 44):<44}"
        print(f"{row} {r.verdict}")
    print()
    for mode in dict.fromkeys(r.mode for r in results):
        of_mode = [r for r in results if r.mode == mode]
        tool = [r for r in of_mode if r.case.tool is not None]
        plain = [r for r in of_mode if r.case.tool is None]
        passed = sum(r.passed for r in of_mode)
        print(
            f"{mode:<6} overall {passed}/{len(of_mode)} ({100 * passed / len(of_mode):.0f}%)"
            f" | tool prompts: right tool with valid arguments {sum(r.passed for r in tool)}/{len(tool)},"
            f" any call {sum(bool(r.calls) for r in tool)}/{len(tool)}"
            f" | no-tool prompts: no call {sum(r.passed for r in plain)}/{len(plain)}"
        )


def _cut(text: str, width: int) -> str:
    """``text`` on one line, shortened to ``width`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- (b) prefetch ------------------------------------------------------------------------------------
@dataclass
class Trial:
    """One prefetch trial."""

    scenario: str
    prefetch: bool
    delay_ms: int
    latency_ms: float | None = None
    claimed: bool = False
    provider_requests: int = 0
    error: str = ""


async def run_trial(server: Any, provider: Any, scenario: str, prefetch: bool, delay_ms: int) -> Trial:
    """One session through the whole tool loop; measures the follow-up's latency (see the docstring)."""
    from openai import AsyncOpenAI

    from speech_to_speech.core.events import Event, ResponseStarted
    from speech_to_speech.testing.realtime import EventLog
    from speech_to_speech.testing.responses_server import Call, Reply, Text

    trial = Trial(scenario, prefetch, delay_ms)
    delay_s = delay_ms / 1000
    provider.script(
        Reply([Text(["Let me check ", "the weather."]), Call("get_weather", '{"city": "Paris"}')], delay_s=delay_s),
        Reply([Text(["It is sunny ", "in Paris."])], delay_s=delay_s),
    )
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x")
    async with client.realtime.connect(model="s2s") as conn:
        log = EventLog(conn.recv)
        try:
            created = await log.wait_for("session.created", EVENT_TIMEOUT_S)
            session = next(s for s in list(server.server.sessions) if s.id == created.session.id)
            claims: list[bool] = []  # each response started: True when a follow-up generated ahead was claimed

            def on_event(event: Event) -> None:
                if isinstance(event, ResponseStarted):
                    claims.append(event.claimed_by is not None)

            session.llm.bus.subscribe(on_event)
            if not prefetch:
                session.llm.prefetch = None
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "tools": [WEATHER_TOOL],  # type: ignore[list-item]
                    "audio": {"input": {"turn_detection": None}},
                }
            )
            await log.wait_for("session.updated", EVENT_TIMEOUT_S)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}
            await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
            await conn.response.create()
            first = (await log.wait_for("response.created", EVENT_TIMEOUT_S)).response.id
            call = await log.wait_for("response.function_call_arguments.done", EVENT_TIMEOUT_S)
            output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
            if scenario == "early output":
                await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
            await log.wait_for(lambda e: e.type == "response.done" and e.response.id == first, EVENT_TIMEOUT_S)
            since = len(log.events)
            t0 = time.monotonic()
            if scenario == "back-to-back":
                await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
            await conn.response.create()
            second = (await log.wait_for("response.created", EVENT_TIMEOUT_S, since=since)).response.id
            await log.wait_for(
                lambda e: e.type == "response.output_audio.delta" and e.response_id == second,
                EVENT_TIMEOUT_S,
                since=since,
            )
            trial.latency_ms = (time.monotonic() - t0) * 1000
            await log.wait_for(lambda e: e.type == "response.done" and e.response.id == second, EVENT_TIMEOUT_S)
            trial.claimed = any(claims[1:])
            trial.provider_requests = len(provider.requests)
        except AssertionError as exc:
            trial.error = str(exc)[:200]
        finally:
            await log.stop()
    return trial


def run_prefetch(args: argparse.Namespace) -> list[Trial]:
    """Every scenario x provider delay x prefetch on/off, ``--runs`` trials each."""
    from speech_to_speech.testing.realtime import InProcessServer
    from speech_to_speech.testing.responses_server import ResponsesServer

    trials: list[Trial] = []
    with ResponsesServer() as provider:
        flags = ["--llm_backend", "responses-api", "--responses_api_base_url", provider.base_url]
        start = time.monotonic()
        server = InProcessServer(*flags).start()
        print(f"realtime server ready in {time.monotonic() - start:.1f} s (VAD, STT and TTS loaded)", flush=True)
        try:
            asyncio.run(_warm(server, provider))
            for delay_ms in args.provider_delay_ms:
                for scenario in ("back-to-back", "early output"):
                    for run in range(args.runs):
                        for prefetch in (True, False):  # interleaved, so drift hits both alike
                            trial = asyncio.run(run_trial(server, provider, scenario, prefetch, delay_ms))
                            trials.append(trial)
                            latency = f"{trial.latency_ms:.0f} ms" if trial.latency_ms is not None else trial.error
                            print(
                                f"  {scenario:<12} delay {delay_ms:>4} ms  prefetch {'on ' if prefetch else 'off'}"
                                f" run {run + 1}: {latency} (claimed={trial.claimed},"
                                f" provider requests={trial.provider_requests})",
                                flush=True,
                            )
        finally:
            server.stop()
    return trials


async def _warm(server: Any, provider: Any) -> None:
    """One unmeasured trial, so first-use costs (TTS, connections) land on no measured one."""
    with contextlib.suppress(Exception):
        await run_trial(server, provider, "back-to-back", True, 0)


def print_prefetch(trials: list[Trial], runs: int) -> None:
    """p50/p90 per scenario, delay and prefetch setting."""
    print(f"\n(b) prefetch saving, realtime server in process, scripted responses-api, N={runs} each\n")
    header = (
        f"{'client behaviour':<16} {'provider delay':>14} {'prefetch':>8} {'p50 ms':>8} {'p90 ms':>8}"
        f" {'claimed':>8} {'requests/trial':>14} {'failed':>6}"
    )
    print(header)
    print("-" * len(header))
    groups: dict[tuple[str, int, bool], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.scenario, t.delay_ms, t.prefetch), []).append(t)
    for (scenario, delay_ms, prefetch), group in groups.items():
        values = [t.latency_ms for t in group if t.latency_ms is not None]
        p50 = f"{percentile(values, 50):.0f}" if values else "-"
        p90 = f"{percentile(values, 90):.0f}" if values else "-"
        requests = sorted({t.provider_requests for t in group})
        print(
            f"{scenario:<16} {delay_ms:>11} ms {'on' if prefetch else 'off':>8} {p50:>8} {p90:>8}"
            f" {sum(t.claimed for t in group):>5}/{len(group):<2} {','.join(map(str, requests)):>14}"
            f" {sum(t.latency_ms is None for t in group):>6}"
        )
    print(
        "\nback-to-back: output sent -> first audio delta of the follow-up (response.create sent with the output)."
        "\nearly output: output sent at the call's announcement; response.done -> first audio delta of the follow-up."
    )


# -- command line ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("accuracy", "prefetch", "both"), default="both")
    parser.add_argument("--modes", default="voice,text", help="accuracy: comma-separated voice and/or text")
    parser.add_argument(
        "--llm_backend", default="llama-cpp", help="accuracy: local backend (llama-cpp, transformers, mlx-lm)"
    )
    parser.add_argument("--llm_model", default="", help="accuracy: model folder, GGUF or hub id ('' = embedded)")
    parser.add_argument("--device", default="cpu", help="accuracy: torch device")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="accuracy: cap per reply")
    parser.add_argument("--runs", type=int, default=5, help="prefetch: trials per setting")
    parser.add_argument(
        "--provider_delay_ms", default="0,300", help="prefetch: comma-separated waits of the scripted provider"
    )
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or not set(args.modes) <= {"voice", "text"}:
        parser.error("--modes takes voice and/or text")
    try:
        args.provider_delay_ms = [int(v) for v in args.provider_delay_ms.split(",") if v]
    except ValueError:
        parser.error("--provider_delay_ms takes comma-separated integers")
    if args.runs < 1 or not args.provider_delay_ms or min(args.provider_delay_ms) < 0:
        parser.error("--runs must be at least 1 and --provider_delay_ms non-negative")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts and print their tables; see the module docstring for the exit status."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    status = 0
    accuracy = run_accuracy(args) if args.part in ("accuracy", "both") else []
    trials = run_prefetch(args) if args.part in ("prefetch", "both") else []
    if accuracy:
        print_accuracy(accuracy)
    if trials:
        print_prefetch(trials, args.runs)
        if any(t.latency_ms is None for t in trials):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
