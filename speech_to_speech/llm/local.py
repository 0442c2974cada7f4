"""The base of in-process LLM backends (llama-cpp, transformers, mlx-lm)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from speech_to_speech.llm.api import LLMRequest, ProviderEvent, TextDelta, ToolCall, Usage, new_call_id
from speech_to_speech.llm.prompts import clean_messages_for_local_model
from speech_to_speech.llm.serialize import plain_chat_messages
from speech_to_speech.llm.stage import BaseLLMHandler
from speech_to_speech.llm.tools.parse import CodeBlockExtractor, extract_calls

logger = logging.getLogger(__name__)


class LocalLLMHandler(BaseLLMHandler):
    """Base of in-process models (transformers, mlx-lm): they only stream text.

    The request is turned into chat messages that plain chat templates accept
    (tool calls written back as ``<code>`` blocks, tool results as user
    messages), cleaned (see :func:`~speech_to_speech.llm.prompts.clean_messages_for_local_model`)
    and passed to :meth:`stream`. Tools are described in the system prompt; the
    model writes ``<code>name(arg="value")</code>`` blocks, which are parsed
    (never evaluated) into :class:`ToolCall` events, while the text around them
    is streamed as usual. A backend that sets ``accepts_images`` gets a user message with an image
    as Chat Completions parts (``{"type": "text"}``, ``{"type": "image_url"}``), others as text.
    """

    native_tools = False

    def stream(
        self, messages: list[dict[str, Any]], should_stop: Callable[[], bool], max_new_tokens: int | None = None
    ) -> Iterator[str]:
        """Yield raw text pieces of the reply to ``messages``; stop once ``should_stop()``."""
        raise NotImplementedError

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        messages = clean_messages_for_local_model(plain_chat_messages(request.chat_messages(self.accepts_images)))
        deltas = self.stream(messages, should_stop, request.max_output_tokens)
        tools = request.tools if request.tool_choice != "none" else []
        reply: list[str] = []
        if not tools:
            for text in deltas:
                reply.append(text)
                yield TextDelta(text)
        else:
            extractor = CodeBlockExtractor(text_mode=not request.wants_audio)
            for text in deltas:
                reply.append(text)
                yield from self._tool_events(extractor.feed(text), tools)
            yield from self._tool_events(extractor.flush(), tools)
        usage = self.count_usage(messages, "".join(reply))
        if usage is not None:
            # these engines report no finish reason: a reply as long as the cap stopped there
            usage.at_token_limit = usage.output_tokens >= request.max_output_tokens
            yield usage

    def count_usage(self, messages: list[dict[str, Any]], reply: str) -> Usage | None:
        """Token counts with the model's tokenizer (``self.tokenizer``), or None if unknown."""
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is None:
            return None
        try:
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
            return Usage(len(ids), len(tokenizer.encode(reply, add_special_tokens=False)) if reply else 0)
        except Exception:  # counting is best effort; never fail a reply over it
            logger.debug("%s: token counting failed", self.name, exc_info=True)
            return None

    @staticmethod
    def _tool_events(parts: list[tuple[str, str]], tools: list[dict[str, Any]]) -> Iterator[ProviderEvent]:
        for kind, value in extract_calls(parts, tools):
            if kind == "text":
                yield TextDelta(value)
            else:
                name, arguments = value
                yield ToolCall(new_call_id(), name, arguments)
