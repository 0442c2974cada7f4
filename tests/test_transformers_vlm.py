"""The ``transformers-vlm`` backend on a tiny, randomly initialised Idefics3 (SmolVLM's architecture)
that the test builds from a config, with a word-level tokenizer and the Idefics3 processor, all
offline, saved to a folder and loaded by the backend through ``AutoProcessor`` and
``AutoModelForImageTextToText`` as a real model would be. Its replies are noise; what is checked is
that the real loading and generation code runs, and that images reach the model's inputs."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from handlers.llm.transformers_vlm import TransformersVLMHandler, processor_messages
from speech_to_speech.core.messages import EndOfResponse, Transcript
from speech_to_speech.llm.api import LLMConfig
from speech_to_speech.pipeline.registry import get_backend
from speech_to_speech.realtime.conversation import to_history
from tests.helpers import new_stage

#: SmolVLM's chat template, shortened (its messages' contents are lists of text and image parts)
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
#: image tokens per image tile: (32 px / 8 px patches)^2 / scale factor 2^2
IMAGE_SEQ_LEN = 4


def build_tiny_vlm(folder: Path) -> None:
    """Save a tiny random Idefics3 model and its processor (tokenizer, image processor, template) to ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    special = ["<unk>", "<pad>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"]
    special += ["<global-img>", *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
    words = ["User", "Assistant", "System", ":", "Hi", "what", "is", "this", "?", *"abcdefghijklmnopqrstuvwxyz"]
    vocab = {token: index for index, token in enumerate(special + words)}
    engine = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    engine.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=engine,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
    )
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(images, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    text = {"model_type": "llama", "vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64}
    text |= {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}
    text |= {"pad_token_id": vocab["<pad>"], "eos_token_id": vocab["<end_of_utterance>"]}
    config = Idefics3Config(
        vision_config={**vision, "image_size": 32, "patch_size": 8},
        text_config=text,
        scale_factor=2,
        image_token_id=vocab["<image>"],
        pad_token_id=vocab["<pad>"],
    )
    torch.manual_seed(0)
    Idefics3ForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)


def png_url(size: tuple[int, int] = (40, 30)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 20, 20)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TransformersVLMHandler:
    folder = tmp_path_factory.mktemp("tiny-vlm")
    build_tiny_vlm(folder)
    config = LLMConfig(llm_model=str(folder), max_new_tokens=4)
    handler = new_stage(TransformersVLMHandler, config=config, name="llm:vlm", device="cpu")
    handler.setup()  # loads through AutoProcessor / AutoModelForImageTextToText and generates 2 tokens
    return handler


def test_the_backend_is_registered_and_sees() -> None:
    backend = get_backend("llm", "transformers-vlm")
    assert backend.load_handler_class() is TransformersVLMHandler
    assert TransformersVLMHandler.accepts_images


def test_processor_messages_put_images_in_order() -> None:
    first, second = png_url((10, 10)), png_url((20, 10))
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": first, "detail": "auto"}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": second, "detail": "low"}},
            ],
        },
    ]
    shaped, images = processor_messages(messages)
    assert shaped == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]},
    ]
    assert [image.size for image in images] == [(10, 10), (20, 10)]


def test_an_image_reaches_the_model_inputs(vlm: TransformersVLMHandler) -> None:
    inputs: dict[str, Any] = vlm.prepare(
        [{"role": "user", "content": [{"type": "text", "text": "what is this ?"}, image_part(png_url())]}]
    )
    assert inputs["pixel_values"].dtype == vlm.model.dtype
    assert inputs["pixel_values"].shape[-2:] == (32, 32)  # tiles of the vision encoder's size
    image_token = vlm.processor.tokenizer.convert_tokens_to_ids("<image>")
    tiles = inputs["pixel_values"].shape[1]
    assert int((inputs["input_ids"] == image_token).sum()) == tiles * IMAGE_SEQ_LEN
    text_only = vlm.prepare([{"role": "user", "content": "Hi"}])
    assert "pixel_values" not in text_only


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def test_a_turn_with_an_image_is_answered(vlm: TransformersVLMHandler) -> None:
    item = {
        "id": "img",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "what is this ?"}, {"type": "input_image", "image_url": png_url()}],
    }
    vlm.chat.add_item(to_history(item))
    seen: list[Any] = []
    original = vlm.prepare
    vlm.prepare = lambda messages: seen.append(messages) or original(messages)  # type: ignore[method-assign]
    try:
        out = list(vlm.process(Transcript(vlm.gate.new_turn_stamp(), "Hi", wants_audio=False)))
    finally:
        del vlm.prepare
    (end,) = [m for m in out if isinstance(m, EndOfResponse)]
    assert end.error is None
    users = [m for m in seen[0] if m["role"] == "user"]
    assert users[0]["content"][1]["type"] == "image_url"  # the image reached the backend as a part
    assert any(m["role"] == "assistant" for m in vlm.chat.items())
