"""A vision-language model with Hugging Face transformers: replies to text and images (``transformers-vlm``).

The model is loaded with ``AutoModelForImageTextToText`` and ``AutoProcessor`` from a folder or a
hub id (``--llm_model``; default :data:`DEFAULT_VLM`, downloaded once by transformers, so the
first start needs a network). Generation, streaming and stopping are those of
:class:`~handlers.llm.transformers_llm.TransformersLLMHandler`; only the inputs differ: the chat's
``image_url`` parts become the processor's ``{"type": "image"}`` placeholders, and their images are
decoded (:func:`~speech_to_speech.llm.images.open_image`) and passed to the processor in order.
"""

from __future__ import annotations

import logging
from typing import Any

from handlers.llm.transformers_llm import TransformersLLMHandler
from speech_to_speech.core.shared import shared_model
from speech_to_speech.llm.images import open_image

logger = logging.getLogger(__name__)

DEFAULT_VLM = "HuggingFaceTB/SmolVLM-256M-Instruct"
"""The default model: SmolVLM 256M Instruct (Idefics3 architecture, about 0.5 GB in float16), small
enough for a CPU; its hub id, so transformers downloads it on first use."""


def processor_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Chat messages (text, or Chat Completions parts with ``image_url``) in the processor's form.

    Returns:
        The messages, every content a list of ``{"type": "text", "text"}`` and ``{"type": "image"}``
        parts (the chat templates of vision models expect lists), and the images as RGB
        ``PIL.Image``s in the order of their placeholders.
    """
    shaped, images = [], []
    for message in messages:
        content = message.get("content") or ""
        parts: list[dict[str, Any]] = []
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if part.get("type") == "image_url":
                images.append(open_image(part["image_url"]["url"]))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": part.get("text", "")})
        shaped.append({"role": message["role"], "content": parts})
    return shaped, images


class TransformersVLMHandler(TransformersLLMHandler):
    """Streams replies from a vision-language model; a user message's images go to the model.

    The ``detail`` of an image is not used: the model's processor sizes every image its own way.
    """

    accepts_images = True

    def load(self) -> None:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self._torch = torch
        source = self.config.llm_model or DEFAULT_VLM
        dtype = torch.float16 if self.device == "cuda" else torch.float32

        def load() -> tuple[Any, Any]:
            processor = AutoProcessor.from_pretrained(source)
            model = AutoModelForImageTextToText.from_pretrained(source, dtype=dtype).to(self.device)
            model.eval()
            return processor, model

        self.processor, self.model = shared_model(("transformers-vlm", source, self.device, str(dtype)), load)
        self.tokenizer = self.processor.tokenizer
        for _ in self.stream([{"role": "user", "content": "Hi"}], lambda: False, max_new_tokens=2):
            pass

    def prepare(self, messages: list[dict[str, Any]]) -> Any:
        shaped, images = processor_messages(messages)
        prompt = self.processor.apply_chat_template(shaped, add_generation_prompt=True)
        inputs = self.processor(text=prompt, images=[images] if images else None, return_tensors="pt")
        floating = {"pixel_values"}  # the image tensors follow the model's dtype
        return {
            key: value.to(self.device, dtype=self.model.dtype) if key in floating else value.to(self.device)
            for key, value in inputs.items()
        }

    def count_usage(self, messages: list[dict[str, Any]], reply: str) -> None:
        return None  # the prompt's length depends on the images; not worth processing them twice
