"""Hugging Face transformers; the default model is the embedded Qwen2.5-Coder-0.5B-Instruct (converted once)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

# transformers is imported when this module is (the pipeline is built on one thread), not in load():
# two stage threads importing it at once (this one and the VAD's Smart Turn) leave one of them with
# a half-initialised module ("cannot import name 'WhisperFeatureExtractor' from 'transformers'")
import transformers  # noqa: F401

from handlers.llm.embedded import resolve_model, wants_compact_prompt
from speech_to_speech.core.shared import shared_model
from speech_to_speech.llm.local import LocalLLMHandler

logger = logging.getLogger(__name__)


class _StopWhen:
    """A transformers StoppingCriteria that asks a callback between tokens."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
        return self.should_stop()


class TransformersLLMHandler(LocalLLMHandler):
    """Streams replies from a causal LM with ``model.generate`` in a worker thread.

    Generation stops between tokens once the turn is cancelled or the pipeline stops.
    """

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # progress goes through our logging, not tqdm bars
        self._torch = torch
        self.compact_voice_prompt = wants_compact_prompt(self.config.llm_model or "")
        source = resolve_model(self.config.llm_model)
        dtype = torch.float16 if self.device == "cuda" else torch.float32

        def load() -> tuple[Any, Any]:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(self.device)
            model.eval()
            return tokenizer, model

        self.tokenizer, self.model = shared_model(("transformers", source, self.device, str(dtype)), load)
        for _ in self.stream([{"role": "user", "content": "Hi"}], lambda: False, max_new_tokens=2):
            pass

    def prepare(self, messages: list[dict[str, Any]]) -> Any:
        """The model's inputs for ``messages`` (the chat template applied), on the device."""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(self.device)

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        from transformers import StoppingCriteriaList, TextIteratorStreamer

        inputs = self.prepare(messages)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=120.0)
        sampling = self.config.temperature > 0
        abandoned = threading.Event()  # the consumer stopped reading
        kwargs: dict[str, Any] = {
            **inputs,
            "streamer": streamer,
            "max_new_tokens": max_new_tokens or self.config.max_new_tokens,
            "do_sample": sampling,
            "stopping_criteria": StoppingCriteriaList([_StopWhen(lambda: abandoned.is_set() or should_stop())]),
            "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            "repetition_penalty": 1.1,
        }
        if sampling:
            kwargs["temperature"] = self.config.temperature
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        failure: list[BaseException] = []

        def generate() -> None:
            try:
                with self._torch.inference_mode():
                    self.model.generate(**kwargs)
            except BaseException as exc:  # surfaced in the consuming thread
                failure.append(exc)
                streamer.end()

        worker = threading.Thread(target=generate, name=f"{self.name}:generate", daemon=True)
        worker.start()
        try:
            for text in streamer:
                if text:
                    yield text
        finally:
            abandoned.set()
            worker.join()
        if failure:
            raise failure[0]
