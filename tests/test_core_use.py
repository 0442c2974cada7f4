"""The LLM runs on the cores other stages leave free (speech_to_speech/core/priority.py CORES):
stages mark the core they use while they synthesise, transcribe or judge, and llama.cpp drops to
the threads left while they do."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from speech_to_speech.core.messages import PartialSpeech, SpeechSegment, TTSInput
from speech_to_speech.core.priority import CORES, CoreUse
from speech_to_speech.speech.tts import TTSConfig
from speech_to_speech.testing.fakes import FakeSTT, FakeTTS
from speech_to_speech.testing.runs import new_stage
from speech_to_speech.turns.stt import STTConfig


def test_the_llm_gets_the_cores_left_and_always_one() -> None:
    cores = CoreUse(cores=2)
    assert cores.free(2) == 2 and cores.free(4) == 2 and cores.free(1) == 1
    with cores.using():
        assert cores.in_use == 1 and cores.free(2) == 1
        with cores.using():  # two stages at once: the LLM still runs, on one thread
            assert cores.in_use == 2 and cores.free(2) == 1
        assert cores.free(2) == 1
    assert cores.in_use == 0 and cores.free(2) == 2
    with pytest.raises(RuntimeError), cores.using(threads=2):
        raise RuntimeError("a failing synthesis")
    assert cores.in_use == 0  # released on errors too


class CountingTTS(FakeTTS):
    """Records how many cores were marked in use while it synthesised."""

    def synthesize(self, text: str) -> Any:
        self.seen = CORES.in_use
        yield from super().synthesize(text)


class CountingSTT(FakeSTT):
    """Records how many cores were marked in use during each pass (final and partial)."""

    seen: list[int]

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> tuple[str, str | None]:
        self.seen.append(CORES.in_use)
        return super().transcribe(samples, sample_rate)

    def transcribe_partial(self, samples: np.ndarray, sample_rate: int) -> str:
        self.seen.append(CORES.in_use)
        return super().transcribe(samples, sample_rate)[0]


def test_tts_and_stt_mark_their_core_while_they_work() -> None:
    before = CORES.in_use
    tts = new_stage(CountingTTS, config=TTSConfig(), name="tts")
    tts.setup()
    out = list(tts.process(TTSInput(tts.gate.new_turn_stamp(), "Hello there.")))
    assert out and tts.seen == before + 1
    assert CORES.in_use == before

    stt = new_stage(CountingSTT, config=STTConfig(), name="stt")
    stt.setup()
    stt.seen = []
    stamp = stt.gate.new_turn_stamp()
    speech = np.zeros(32_000, dtype=np.float32)
    now = time.monotonic()
    stt._partial(PartialSpeech(stamp, speech, 16_000, time=now, deadline=now + 10))
    list(stt.process(SpeechSegment(stamp, speech, 16_000, speech_end_time=now, endpoint_time=now)))
    assert stt.seen == [before + 1, before + 1]  # the partial pass, then the final one
    assert CORES.in_use == before


@pytest.mark.models
def test_llama_cpp_writes_on_the_threads_left_while_another_stage_works() -> None:
    import llama_cpp

    from handlers.llm.embedded import resolve_gguf
    from handlers.llm.llama_cpp_llm import LlamaEngine

    if CORES.cores < 2:
        pytest.skip("one core: the LLM always runs one thread")
    engine = LlamaEngine(str(resolve_gguf("qwen2.5-coder-0.5b")), n_ctx=512, n_threads=2)
    ctx = engine.llm.ctx

    def threads() -> tuple[int, int]:
        return llama_cpp.llama_n_threads(ctx), llama_cpp.llama_n_threads_batch(ctx)

    tokens = engine.tokenize("<|im_start|>user\nCount from one to twenty.<|im_end|>\n<|im_start|>assistant\n")
    seen: list[tuple[int, int]] = []
    pieces: list[str] = []
    stream = engine.stream(tokens, 12, 0.0, lambda: False, lambda stats: None)
    with CORES.using(threads=CORES.cores - 1):  # every core but one is busy
        pieces.append(next(stream))
        seen.append(threads())
    pieces.append(next(stream))  # the stage is done: the next tokens run on both again
    seen.append(threads())
    pieces += list(stream)
    assert seen == [(1, 1), (2, 2)]
    assert "".join(pieces).strip()  # it wrote on, on one thread and then on two
