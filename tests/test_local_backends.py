"""The local LLM backends (llama-cpp, transformers, mlx-lm) with the embedded Qwen2.5-Coder-0.5B-Instruct."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speech_to_speech.core.events import EngineWait
from speech_to_speech.core.messages import EndOfResponse, Transcript, TTSInput
from speech_to_speech.llm.api import LlamaCppConfig
from speech_to_speech.pipeline.registry import get_backend
from tests.helpers import check_prefix_reused, new_stage, require_mlx, run_pipeline

pytestmark = pytest.mark.models

#: the embedded model these tests run
FAST_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module", params=["llama-cpp", "transformers", "mlx-lm"])
def handler(request: pytest.FixtureRequest) -> Any:
    if request.param == "mlx-lm":
        require_mlx()  # checked in a child: importing mlx here first would keep its slow reference BLAS
    backend = get_backend("llm", request.param)
    # the fast embedded 0.5B: these tests check each engine's mechanics, and transformers and mlx-lm
    # run a float32 copy (the default 1.5B's would be 6 GB and several times slower on a CPU)
    config = backend.config_cls(llm_model=FAST_MODEL, max_new_tokens=200, stream_batch_sentences=1)
    llm = new_stage(backend.load_handler_class(), config=config, device="cpu")
    llm.setup()
    return llm


def ask(llm: Any, text: str) -> Transcript:
    return Transcript(llm.gate.new_turn_stamp(), text)


def test_reply_streams_sentences_and_ends_once(handler: Any) -> None:
    handler.chat.reset()
    out = list(handler.process(ask(handler, "What is the capital of France?")))
    spoken = [m.text for m in out if isinstance(m, TTSInput)]
    ends = [m for m in out if isinstance(m, EndOfResponse)]
    assert spoken and all(s.strip() for s in spoken)
    assert len(ends) == 1 and out[-1] is ends[0] and ends[0].error is None
    roles = [item["role"] for item in handler.chat.items()]
    assert roles == ["user", "assistant"]
    assert handler.chat.items()[1]["content"] == ends[0].text


def test_second_turn_sees_history(handler: Any) -> None:
    handler.chat.reset()
    list(handler.process(ask(handler, "My name is Alice.")))
    out = list(handler.process(ask(handler, "Hello again.")))
    assert [i["role"] for i in handler.chat.items()] == ["user", "assistant", "user", "assistant"]
    assert isinstance(out[-1], EndOfResponse)


def test_cancel_stops_generation_between_tokens(handler: Any) -> None:
    handler.chat.reset()
    prompt = "Tell me a long story about a dragon, in many sentences."
    stream = handler.process(ask(handler, prompt))
    after_cancel: list[Any] = []
    for message in stream:
        if isinstance(message, TTSInput) and not after_cancel:
            handler.gate.scope.cancel()  # barge-in right after the first sentence
            after_cancel.append(message)
            continue
        if after_cancel:
            after_cancel.append(message)
    assert after_cancel, "no sentence was produced"
    tail = after_cancel[1:]
    assert len(tail) == 1 and isinstance(tail[0], EndOfResponse) and tail[0].error == "cancelled"
    # generation stopped soon after the cancel instead of running to max_new_tokens
    assert len(tail[0].text.split()) < 120
    assert all(item["role"] != "assistant" for item in handler.chat.items())  # nothing unheard was committed
    workers = [t for t in threading.enumerate() if t.name.endswith(":generate")]
    for worker in workers:
        worker.join(10)
    assert not any(t.is_alive() for t in workers)


def test_mlx_lm_from_the_command_line(tmp_path: Path) -> None:
    require_mlx()
    out = tmp_path / "out.wav"
    flags = ["--llm_backend", "mlx-lm", "--input_text", "Hi!", "--output_audio", str(out)]
    result = run_pipeline(*flags)
    assert result.returncode == 0, result.stderr
    assert "assistant:" in result.stdout
    audio, _ = sf.read(str(out), dtype="float32")
    assert np.sqrt(np.mean(audio**2)) > 0.005


@pytest.fixture(scope="module")
def llama() -> Any:
    handler_cls = get_backend("llm", "llama-cpp").load_handler_class()
    llm = new_stage(handler_cls, config=LlamaCppConfig(max_new_tokens=48), device="cpu")
    llm.setup()
    return llm


def test_llama_cpp_reuses_the_prompt_prefix(llama: Any) -> None:
    """The system prompt is evaluated at start-up and each turn evaluates only what is new."""
    llama.chat.reset()
    list(llama.process(ask(llama, "What is the capital of France?")))
    first = llama.last_prompt
    # the system prompt was prefilled at setup: the first turn evaluates little more than the question
    assert first.reused_tokens > 0.6 * first.prompt_tokens, first
    out = list(llama.process(ask(llama, "And of Italy?")))
    check_prefix_reused(first, llama.last_prompt, out)


def test_llama_cpp_answers_a_simple_question_briefly(llama: Any) -> None:
    llama.chat.reset()
    out = list(llama.process(ask(llama, "What is the capital of France?")))
    assert "paris" in out[-1].text.lower(), out[-1].text
    assert len(out[-1].text.split()) <= 40


def test_llama_cpp_reply_cut_at_max_new_tokens_ends_at_a_whole_sentence(llama: Any) -> None:
    """48 tokens cannot hold the 1.5B's account of the moon: what is spoken, and kept in history,
    ends at the last whole sentence instead of mid-sentence."""
    llama.chat.reset()
    out = list(llama.process(ask(llama, "Tell me everything you know about the moon.")))
    end = out[-1]
    assert isinstance(end, EndOfResponse) and end.error is None
    assert end.usage["output_tokens"] >= 40, end  # it did run to the cap
    spoken = " ".join(m.text for m in out if isinstance(m, TTSInput))
    assert spoken == end.text and end.text.rstrip()[-1] in ".!?", end.text
    assert llama.chat.items()[-1]["content"] == end.text


def test_llama_cpp_evaluates_on_one_thread_whoever_asks(llama: Any) -> None:
    """A reply (read on its provider thread) and a prefill asked for from another thread both
    evaluate on the engine's own thread: a second thread's evaluations ran at half speed."""
    engine = llama.engine
    threads: set[int] = set()
    evaluate = engine.llm.eval

    def recording_eval(tokens: Any) -> None:
        threads.add(threading.get_ident())
        evaluate(tokens)

    engine.llm.eval = recording_eval
    try:
        llama.chat.reset()
        out = list(llama.process(ask(llama, "What is the capital of Italy?")))
        assert "rome" in out[-1].text.lower(), out[-1].text
        other = threading.Thread(target=engine.prefill, args=("Hello there, this is another thread.",))
        other.start()
        other.join()
    finally:
        del engine.llm.eval  # the class's method again
    assert len(threads) == 1 and threading.get_ident() not in threads and other.ident not in threads


def test_llama_cpp_model_file_is_verified(llama: Any) -> None:
    import hashlib

    from handlers.llm.embedded import EMBEDDED_SHA256, embedded_gguf

    digest = hashlib.sha256()
    with open(embedded_gguf(), "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    assert digest.hexdigest() == EMBEDDED_SHA256


def test_llama_cpp_reports_its_wait_for_the_shared_engine(llama: Any) -> None:
    """Another session holding the engine makes this reply wait; the wait is published (EngineWait, ms)."""
    waits: list[EngineWait] = []
    llama.bus.subscribe(lambda event: waits.append(event) if isinstance(event, EngineWait) else None)
    llama.chat.reset()
    list(llama.process(ask(llama, "Hello.")))
    assert len(waits) == 1 and 0 <= waits[0].wait_ms < 1000
    held = threading.Event()

    def hold_engine() -> None:
        with llama.engine.lock:
            held.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold_engine)
    holder.start()
    held.wait(10)
    list(llama.process(ask(llama, "Hello again.")))
    holder.join()
    assert len(waits) == 2 and waits[1].wait_ms >= 400, waits
