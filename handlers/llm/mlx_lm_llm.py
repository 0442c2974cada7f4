"""mlx-lm: Apple Silicon (Metal), and Linux CPU through ``mlx[cpu]``.

The default model is the embedded SmolLM2-135M-Instruct, converted once into a
safetensors folder (see :mod:`handlers.llm.embedded`); ``--llm_model`` also
takes an MLX model folder or a hub id such as
``mlx-community/Qwen2.5-1.5B-Instruct-4bit``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from handlers.llm.embedded import resolve_model
from speech_to_speech.local_llm import LocalLLMHandler
from speech_to_speech.shared import shared_model


class MLXLMHandler(LocalLLMHandler):
    """Streams replies with ``mlx_lm.stream_generate``; stops between tokens when cancelled."""

    # MLX streams belong to the thread that made them: generate on the stage's own thread
    # (so no first-token time-out for this backend)
    events_in_helper_thread = False

    def load(self) -> None:
        from mlx_lm import load

        source = resolve_model(self.config.llm_model)
        self.model, self.tokenizer = shared_model(("mlx-lm", source), lambda: load(source))
        # one generation at a time per process: MLX streams are not shared across threads
        self._generate_lock = shared_model(("mlx-lm-lock",), threading.Lock)
        for _ in self.stream([{"role": "user", "content": "Hi"}], lambda: False, max_new_tokens=2):
            pass

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_repetition_penalty, make_sampler

        prompt: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        with self._generate_lock:
            for response in stream_generate(
                self.model,
                self.tokenizer,
                prompt,
                max_tokens=max_new_tokens or self.config.max_new_tokens,
                sampler=make_sampler(temp=self.config.temperature),
                logits_processors=[make_repetition_penalty(1.1)],
            ):
                if should_stop():
                    return
                if response.text:
                    yield response.text
