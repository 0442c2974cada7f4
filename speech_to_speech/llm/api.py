"""What an LLM backend sees: its settings, the request, and the provider events it yields.

Kept apart from :mod:`speech_to_speech.llm.stage` (the stage that drives backends) so that
the registry and the command line can read the config dataclasses without the stage.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from speech_to_speech.llm.serialize import to_chat_messages


# -- provider events ------------------------------------------------------------------
@dataclass
class TextDelta:
    """A piece of assistant text, always raw: filtering is the base class's job.

    An empty one is a sign of life: the provider streams something that is not text yet (a
    tool call's arguments), so the first-token time-out does not cut it off.
    """

    text: str


@dataclass
class AssistantMessage:
    """The whole assistant text of the response, as the provider reports it (for history)."""

    text: str


@dataclass
class ToolCall:
    """One complete function call; ``call_id`` is unique within the conversation."""

    call_id: str
    name: str
    arguments: str


@dataclass
class Usage:
    """Token counts of one response, and whether it stopped at its token cap.

    ``at_token_limit``: generation stopped at ``max_output_tokens`` (Chat Completions'
    ``finish_reason`` "length", the Responses API's incomplete reason "max_output_tokens",
    llama.cpp's "length"), so the text may end mid-sentence.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    at_token_limit: bool = False


ProviderEvent = TextDelta | AssistantMessage | ToolCall | Usage


def new_call_id() -> str:
    """A fresh function-call id, so outputs pair with calls whatever the model or provider sent."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ProviderTimeout(Exception):
    """The provider did not answer within the request timeout."""


class EmptyRequestError(ValueError):
    """A request with nothing to answer (providers reject it)."""


@dataclass
class LLMRequest:
    """Everything a backend needs for one response.

    Attributes:
        system_prompt: the full system message.
        items: conversation items (see :mod:`speech_to_speech.llm.chat`), oldest first.
        tools: function tools in the flat Responses shape (``{"type": "function", "name", ...}``).
        tool_choice: "auto", "required" or "none".
        wants_audio: whether the reply will be spoken.
        max_output_tokens: cap on generated tokens.
        temperature: 0 = greedy.
    """

    system_prompt: str
    items: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"
    wants_audio: bool = True
    max_output_tokens: int = 96
    temperature: float = 0.0

    def chat_messages(self, images: bool = False) -> list[dict[str, Any]]:
        """The request as OpenAI Chat Completions messages (system first); ``images``: keep image parts
        (else each stands as text; see :func:`~speech_to_speech.llm.serialize.to_chat_messages`)."""
        return to_chat_messages(self.system_prompt, self.items, images=images)


def summary_request(items: list[dict[str, Any]]) -> LLMRequest:
    """A text request that asks the model for a short factual summary of history ``items`` (the
    background compaction of old turns, :class:`~speech_to_speech.llm.chat.Chat`'s compactor)."""
    lines = [
        f"{m['role']}: {m.get('content') or json.dumps(m.get('tool_calls', ''))}" for m in to_chat_messages("", items)
    ]
    return LLMRequest(
        system_prompt="You summarise conversations. Reply with a short factual summary, no preamble.",
        items=[{"type": "message", "role": "user", "content": "Summarise this conversation:\n" + "\n".join(lines)}],
        wants_audio=False,
        max_output_tokens=128,
    )


@dataclass
class LLMConfig:
    """Settings shared by every LLM backend.

    Attributes:
        llm_model: model folder, file or hub id ("" = the backend's embedded default).
        system_prompt: session instructions (the persona); voice rules are added around it.
        max_new_tokens: cap on generated tokens per response.
        temperature: sampling temperature; 0 means greedy decoding.
        history_turns: user turns kept in the conversation history.
        compact_history: summarise old turns in the background instead of dropping them.
        stream_batch_sentences: sentences per TTS batch after the first.
        language: "auto" passes the STT's detected language to the prompt (a rule to reply in it);
            another language than English adds a rule to reply in that one.
        audio_history_turns: user turns whose audio stays in history (older audio becomes text).
        image_history_turns: user turns whose images stay in history (older images become a
            short text placeholder; each image costs the model hundreds of tokens).
        stream_words: send speech to TTS word by word (engines that take streaming text)
            instead of sentence by sentence.
        first_token_timeout_s: the longest wait for the first text or tool call of a response, s,
            including a wait for a shared engine (0 = none); then the user hears
            ``TIMEOUT_APOLOGY`` and the turn ends.
        next_token_timeout_s: once the first token came, the longest wait for each next provider
            event, s (0 = none); then, as above, the apology. A healthy stream sends one every
            10-100 ms; 5 s keeps the silence of a provider that stalls after its first words under
            about 10 s (``scripts/benchmark_reliability.py --phases faults``).
    """

    llm_model: str = ""
    system_prompt: str = ""
    max_new_tokens: int = 96
    temperature: float = 0.0
    history_turns: int = 8
    compact_history: bool = False
    stream_batch_sentences: int = 2
    language: str = "en"
    audio_history_turns: int = 1
    image_history_turns: int = 2
    stream_words: bool = False
    first_token_timeout_s: float = 6.0
    next_token_timeout_s: float = 5.0


@dataclass
class LlamaCppConfig(LLMConfig):
    """Settings of the in-process ``llama-cpp`` backend.

    Attributes:
        llm_threads: threads for generation and prompt processing (0 = every core, at most 4).
        llm_context: context window, tokens (history beyond it is not kept anyway: see history_turns).
    """

    llm_threads: int = 0
    llm_context: int = 4096


@dataclass
class OpenAICompatibleConfig(LLMConfig):
    """Connection settings shared by ``responses-api`` and ``chat-completions``.

    Attributes:
        model_name: the provider's model id.
        responses_api_base_url: endpoint base URL ("" = the official OpenAI API).
        responses_api_api_key: API key ("" = ``$OPENAI_API_KEY``; loopback URLs get "none").
        responses_api_stream: stream the response (False = one blocking request).
        request_timeout_s: the longest a whole response may take, s (also the HTTP client's
            read timeout; no retries); the connect timeout is ``min(10, request_timeout_s)``.
            The first token has its own, shorter limit (``first_token_timeout_s``).
        reasoning_effort: sent as ``reasoning_effort`` to non-OpenAI endpoints when set.
    """

    model_name: str = "gpt-4.1-mini"
    responses_api_base_url: str = ""
    responses_api_api_key: str = ""
    responses_api_stream: bool = True
    request_timeout_s: float = 20.0
    reasoning_effort: str = ""
