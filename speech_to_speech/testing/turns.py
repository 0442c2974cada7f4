"""Helpers for turn-taking tests and ``scripts/benchmark_turns.py``: real speech, real models.

* speech: LibriVox clips cut to their speech, the same clips cut mid-phrase, and short
  utterances synthesised with the embedded Piper voice (backchannels, "wait, stop");
* :func:`offline_endpoints`: the real VAD stage (Silero, and Smart Turn unless told
  otherwise) fed a recording chunk by chunk, faster than real time, with the endpoint
  delay measured on the stream's own timeline (plus the model's real compute time);
* :class:`TurnRun`: the local pipeline on a scripted real-time input
  (:class:`~speech_to_speech.testing.fakes.ScriptedSource`), recording its events and every chunk of audio
  delivered to the sink; its LLM is :class:`~speech_to_speech.testing.fakes.ScriptedLLM` unless told (a long fixed
  reply to a question, so there is a reply to talk over, and a short one quoting anything else).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from speech_to_speech.core.cancel import Gate, Stamp
from speech_to_speech.core.events import Event, EventBus, SpeechStopped, StageError
from speech_to_speech.core.messages import AudioChunk, AudioOutput
from speech_to_speech.core.queues import StageQueue
from speech_to_speech.llm.local import LocalLLMHandler
from speech_to_speech.pipeline.builder import Pipeline, build_pipeline
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.speech.audio_io import load_audio
from speech_to_speech.testing import REPO_ROOT
from speech_to_speech.testing.fakes import LONG_REPLY, ScriptedLLM, ScriptedSource, replace_stage
from speech_to_speech.testing.runs import BusLog
from speech_to_speech.testing.speech_data import librivox_clips
from speech_to_speech.turns.vad import CHUNK_SAMPLES, SAMPLE_RATE, VADConfig

__all__ = [
    "CONTINUES",
    "LONGER_REPLY",
    "LONG_REPLY",
    "QUESTION",
    "SPEECH_LEVEL",
    "Cut",
    "Delivery",
    "OfflineEndpoint",
    "ScriptedLLM",
    "ScriptedSource",
    "TurnRun",
    "librivox_speech",
    "mid_phrase_cuts",
    "offline_endpoints",
    "silence",
    "speech_bounds",
    "speech_only",
    "synthesize",
]

#: a longer reply than :data:`LONG_REPLY` (about 19 s), for several backchannels in one reply
LONGER_REPLY = (
    f"{LONG_REPLY} The city is famous for its museums, its cafes and its wide old streets. "
    "Many visitors come every year to see the tower, the cathedral and the gardens along the river."
)
#: the question the runs ask (3.3 s, "Hi there! What is the capital of France?")
QUESTION = REPO_ROOT / "tests" / "data" / "question-capital.wav"
#: 20 ms frames above this share of the loudest frame count as speech
SPEECH_LEVEL = 0.05
#: words after which a phrase cannot end (a cut there leaves the turn obviously unfinished)
CONTINUES = {
    "a", "an", "the", "to", "of", "in", "on", "for", "and", "or", "but", "his", "her", "their", "my",
    "had", "has", "have", "was", "were", "is", "be", "been", "might", "would", "could", "more", "than",
    "not", "very", "rather", "how", "if", "unless", "he", "she", "they", "much", "there", "then",
}  # fmt: skip


def speech_bounds(samples: np.ndarray, rate: int = SAMPLE_RATE) -> tuple[int, int]:
    """(first, last + 1) sample of the frames louder than :data:`SPEECH_LEVEL` of the loudest (20 ms frames)."""
    frame = rate // 50
    frames = samples[: len(samples) // frame * frame].reshape(-1, frame)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = np.flatnonzero(rms > SPEECH_LEVEL * rms.max())
    return int(loud[0]) * frame, (int(loud[-1]) + 1) * frame


def speech_only(samples: np.ndarray, margin_s: float = 0.05) -> np.ndarray:
    """``samples`` cut to their speech, ``margin_s`` kept on each side."""
    start, end = speech_bounds(samples)
    margin = int(margin_s * SAMPLE_RATE)
    return samples[max(0, start - margin) : end + margin]


def librivox_speech() -> dict[str, tuple[np.ndarray, str]]:
    """Every LibriVox clip (name → speech-only 16 kHz audio, reference transcript)."""
    return {path.stem: (speech_only(load_audio(path)), ref) for path, ref in sorted(librivox_clips().items())}


@dataclass
class Cut:
    """An utterance cut mid-phrase.

    Attributes:
        samples: the audio up to the cut (16 kHz), no silence after it.
        fraction: where the cut falls in the speech, 0-1.
        last_word: the word before the cut.
    """

    samples: np.ndarray
    fraction: float
    last_word: str


def mid_phrase_cuts(samples: np.ndarray, low: float = 0.5, high: float = 0.7) -> list[Cut]:
    """Cuts of ``samples`` (speech only) at word ends between ``low`` and ``high`` of the speech,
    after a word that cannot end a phrase (:data:`CONTINUES`), each at the quietest point near
    that word end (a pause when the reader made one). Word ends come from the embedded Whisper."""
    from faster_whisper import WhisperModel

    from handlers.stt.faster_whisper_stt import embedded_model_path

    model = WhisperModel(embedded_model_path(), device="cpu", compute_type="int8", cpu_threads=1)
    segments, _ = model.transcribe(samples, language="en", word_timestamps=True, beam_size=1, vad_filter=False)
    words = [w for s in segments for w in (s.words or [])]
    if not words:
        return []
    first, last = words[0].start, words[-1].end
    frame = SAMPLE_RATE // 100
    cuts = []
    for word in words[:-1]:
        fraction = (word.end - first) / max(1e-6, last - first)
        name = re.sub(r"[^a-z']", "", word.word.lower())
        if not low <= fraction <= high or name not in CONTINUES:
            continue
        # the quietest 10 ms frame within 60 ms of the word's end
        around = int(word.end * SAMPLE_RATE)
        lo, hi = max(0, around - 6 * frame), min(len(samples) - frame, around + 6 * frame)
        energies = [float(np.mean(samples[i : i + frame] ** 2)) for i in range(lo, hi, frame)]
        at = lo + frame * int(np.argmin(energies)) if energies else around
        cuts.append(Cut(samples[:at], fraction, name))
    return cuts


def synthesize(text: str, noisy: bool = False, length_scale: float = 1.0) -> np.ndarray:
    """``text`` spoken by the embedded Piper voice, 16 kHz float32, cut to its speech.

    Args:
        text: what to say.
        noisy: with Piper's usual sampling noise (another rendition every call); off, the
            same audio every time.
        length_scale: > 1 speaks slower.
    """
    import soxr
    from piper.config import SynthesisConfig

    from handlers.tts.piper_tts import embedded_voice, load_voice
    from speech_to_speech.core.shared import shared_model

    paths = embedded_voice()
    voice = shared_model(("piper", *paths, False), lambda: load_voice(paths[0], paths[1]))
    config = SynthesisConfig(
        noise_scale=0.667 if noisy else 0.0, noise_w_scale=0.8 if noisy else 0.0, length_scale=length_scale
    )
    chunks = list(voice.synthesize(text, syn_config=config))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    audio = soxr.resample(audio, chunks[0].sample_rate, SAMPLE_RATE).astype(np.float32)
    return speech_only(audio, margin_s=0.03)


def silence(seconds: float) -> np.ndarray:
    """``seconds`` of digital silence at 16 kHz."""
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


# -- endpointing offline ---------------------------------------------------------------------------


@dataclass
class OfflineEndpoint:
    """One endpoint found by :func:`offline_endpoints`.

    Attributes:
        speech_end_ms: where the VAD heard speech end, ms into the input.
        decided_ms: where the endpoint was decided, ms into the input.
        delay_ms: decided - speech end, plus the compute time of the model call that decided (ms).
        by: what ended the turn (see :class:`~speech_to_speech.core.events.SpeechStopped`).
        probability: the model's last P(complete), or None.
    """

    speech_end_ms: float
    decided_ms: float
    delay_ms: float
    by: str
    probability: float | None


def offline_endpoints(samples: np.ndarray, flags: list[str] | None = None) -> list[OfflineEndpoint]:
    """Feed ``samples`` (16 kHz) through the real Silero VAD stage, as fast as it goes.

    Args:
        samples: the input, silence after the speech included.
        flags: command-line flags for the VAD settings (e.g. ``["--turn_detection", "silence"]``).
    """
    from handlers.vad.silero_vad import SileroVADHandler
    from speech_to_speech.pipeline.cli import config_from_args

    args = parse_args(flags or [])
    config = config_from_args(VADConfig, args)
    bus, gate = EventBus(), Gate()
    stopped: list[SpeechStopped] = []
    bus.subscribe(lambda e: stopped.append(e) if isinstance(e, SpeechStopped) else None)
    vad = SileroVADHandler(threading.Event(), StageQueue(1), StageQueue(64), gate, bus, config=config, name="vad")
    vad.semantic_turns = True
    vad.setup()
    model_ms: list[float] = [0.0]
    detector = vad.turn_detector
    if detector is not None:
        judge = detector.judge

        def timed(audio: np.ndarray) -> Any:
            verdict = judge(audio)
            model_ms[0] = verdict.ms
            return verdict

        detector.judge = timed  # type: ignore[method-assign]
    found: list[OfflineEndpoint] = []
    for offset in range(0, len(samples) - CHUNK_SAMPLES + 1, CHUNK_SAMPLES):
        before = len(stopped)
        chunk = AudioChunk(samples[offset : offset + CHUNK_SAMPLES], SAMPLE_RATE, time.monotonic(), offset)
        for _ in vad.process(chunk) or ():
            pass
        for event in stopped[before:]:
            decided_ms = 1000 * (offset + CHUNK_SAMPLES) / SAMPLE_RATE
            compute = model_ms[0] if event.endpoint_by == "model" else 0.0
            delay = decided_ms - event.audio_ms + compute
            found.append(OfflineEndpoint(event.audio_ms, decided_ms, delay, event.endpoint_by, event.turn_probability))
    for _ in vad.on_end_of_stream() or ():
        pass
    for event in stopped[len(found) :]:
        found.append(OfflineEndpoint(event.audio_ms, 1000 * len(samples) / SAMPLE_RATE, 0.0, event.endpoint_by, None))
    return found


# -- the pipeline on scripted input ------------------------------------------------------------------


@dataclass
class Delivery:
    """A chunk handed to the sink's output: when, its stamp and its play interval (monotonic s)."""

    time: float
    stamp: Stamp
    start: float
    duration: float


@dataclass
class TurnRun:
    """The local pipeline (scripted LLM unless told) on a scripted real-time input.

    Attributes:
        tmp_path: where the input and output files go.
        flags: more command-line flags.
        llm: the LLM backend.
        run_limit_s: the whole run is stopped after this, s.
        audio: the input file's audio (16 kHz), played by the file source unless :meth:`script`
            replaces it; None: 0.1 s of silence.
        deliveries: every chunk handed to the sink's output.
        pauses: monotonic times at which the sink paused.
    """

    tmp_path: Path
    flags: list[str] = field(default_factory=list)
    llm: str = "turn-script"
    run_limit_s: float = 300.0
    audio: np.ndarray | None = None

    def __post_init__(self) -> None:
        path = self.tmp_path / "in.wav"
        sf.write(str(path), silence(0.1) if self.audio is None else self.audio, SAMPLE_RATE)
        argv = ["--input_audio", str(path), "--output_audio", str(self.tmp_path / "out.wav")]
        self.args = parse_args([*argv, "--llm_backend", self.llm, *self.flags])
        self.bus = EventBus()
        self.log = BusLog(self.bus)
        self.pipeline: Pipeline = build_pipeline(self.args, self.bus)
        self.deliveries: list[Delivery] = []
        self.pauses: list[float] = []
        sink: Any = self.pipeline.sink
        write, pause = sink.write, sink.on_pause

        def recording_write(samples: np.ndarray, item: AudioOutput, start: float) -> None:
            self.deliveries.append(Delivery(time.monotonic(), item.stamp, start, len(samples) / sink.sample_rate))
            write(samples, item, start)

        def recording_pause(at: float) -> float:
            self.pauses.append(time.monotonic())
            return pause(at)

        sink.write = recording_write
        sink.on_pause = recording_pause
        self.llm_stage = next(s for s in self.pipeline.stages if isinstance(s, LocalLLMHandler))
        self.source: ScriptedSource | None = None

    def script(self, parts: list[Any], wait_s: float = 60.0) -> ScriptedSource:
        """Replace the file source by one that plays ``parts``."""
        original = self.pipeline.stage("source")
        self.source = ScriptedSource(
            output_queue=original.output_queue,
            stop_event=self.pipeline.stop_event,
            gate=self.pipeline.gate,
            bus=self.bus,
            parts=parts,
            clock=self.pipeline.clock,
            wait_s=wait_s,
            name="source:scripted",
        )
        replace_stage(self.pipeline, "source", self.source)
        return self.source

    def go(self) -> None:
        """Run to the end of the input (at most :attr:`run_limit_s`); no stage may fail."""
        watchdog = threading.Timer(self.run_limit_s, self.pipeline.stop_event.set)
        watchdog.daemon = True
        watchdog.start()
        try:
            self.pipeline.start()
            self.pipeline.wait()
        finally:
            watchdog.cancel()
            stuck = self.pipeline.stop()
        assert not stuck, f"threads still running: {stuck}"
        assert not self.log.of(StageError), self.log.of(StageError)

    def history(self) -> list[tuple[str, str]]:
        """(role, text) of every message in the LLM's history."""
        return [(i["role"], str(i["content"])) for i in self.llm_stage.chat.items() if i.get("type") == "message"]

    def played_s(self, turn_id: int, before: float | None = None) -> float:
        """Seconds of turn ``turn_id``'s audio delivered (that started before ``before``)."""
        return sum(
            d.duration for d in self.deliveries if d.stamp.turn_id == turn_id and (before is None or d.start < before)
        )

    def events(self, kind: type[Event], turn_id: int | None = None) -> list[Any]:
        """Events of ``kind`` (for ``turn_id``)."""
        return self.log.of(kind, turn_id)
