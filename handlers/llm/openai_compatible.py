"""OpenAI-compatible providers: ``responses-api`` (/v1/responses) and ``chat-completions``
(/v1/chat/completions), through the official ``openai`` SDK.

Both share one set of connection flags (:class:`~speech_to_speech.llm.stage.OpenAICompatibleConfig`)
and only translate their wire format into the four provider events; sentence
batching, cancellation, history and errors live in
:class:`~speech_to_speech.llm.stage.BaseLLMHandler`.

Time-outs: the stage reads :meth:`OpenAICompatibleHandler.events` in a helper thread and gives up
after ``--first_token_timeout_s`` without a first token (streaming; a blocking request has only
the total) or ``--request_timeout_s`` for the whole response; the user hears a short apology and
the session goes on. A read still blocked in the HTTP client then is unblocked by shutting this
handler's connections down (:meth:`OpenAICompatibleHandler.abort_request`), so no thread lingers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

from speech_to_speech.llm.api import (
    AssistantMessage,
    LLMRequest,
    OpenAICompatibleConfig,
    ProviderEvent,
    ProviderTimeout,
    TextDelta,
    ToolCall,
    Usage,
    new_call_id,
)
from speech_to_speech.llm.serialize import to_responses_input
from speech_to_speech.llm.stage import BaseLLMHandler

logger = logging.getLogger(__name__)

OFFICIAL_OPENAI_HOST = "api.openai.com"


def is_loopback_url(base_url: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (any port or path)."""
    host = urlparse(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_official_openai(base_url: str) -> bool:
    """True when ``base_url`` is empty (the SDK default) or points at OpenAI's own API."""
    return not base_url or (urlparse(base_url.rstrip("/")).hostname or "") == OFFICIAL_OPENAI_HOST


def build_extra_body(base_url: str, reasoning_effort: str = "") -> dict[str, Any] | None:
    """Provider-specific fields that turn thinking off, for low latency.

    The official OpenAI endpoint rejects unknown fields, so it gets none.
    Elsewhere ``reasoning_effort`` is used when given (some routers only honour
    that), else ``chat_template_kwargs.enable_thinking = false`` (vLLM, SGLang,
    llama.cpp chat templates of thinking models).
    """
    if is_official_openai(base_url):
        return None
    if reasoning_effort:
        return {"reasoning_effort": reasoning_effort}
    return {"chat_template_kwargs": {"enable_thinking": False}}


def to_chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat Responses function tools → the nested Chat Completions shape."""
    converted = []
    for tool in tools:
        if tool.get("type") != "function":
            continue
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        converted.append({"type": "function", "function": function})
    return converted


class OpenAICompatibleHandler(BaseLLMHandler):
    """Common client set-up and error translation for OpenAI-compatible endpoints."""

    config: OpenAICompatibleConfig
    accepts_images = True  # vision models take images; a provider's model that does not says so in its error

    def load(self) -> None:
        import openai

        cfg = self.config
        api_key = cfg.responses_api_api_key or os.environ.get("OPENAI_API_KEY", "")
        if not api_key and cfg.responses_api_base_url and is_loopback_url(cfg.responses_api_base_url):
            api_key = "none"  # local servers usually want no key, the SDK insists on one
        if not api_key:
            raise ValueError("no API key: pass --responses_api_api_key or set OPENAI_API_KEY")
        total = cfg.request_timeout_s
        self.client = openai.OpenAI(
            api_key=api_key,
            base_url=cfg.responses_api_base_url or None,
            timeout=openai.Timeout(total, connect=min(10.0, total)),
            max_retries=0,  # a retry would double the wait; the user is listening
        )
        self.extra_body = build_extra_body(cfg.responses_api_base_url, cfg.reasoning_effort)
        self.official = is_official_openai(cfg.responses_api_base_url)
        self._openai = openai

    def cleanup(self) -> None:
        super().cleanup()
        client = getattr(self, "client", None)
        if client is not None:  # the session's HTTP connections and TLS context, now
            with contextlib.suppress(Exception):
                client.close()

    def response_timeout_s(self) -> float | None:
        return self.config.request_timeout_s

    def first_token_deadline_s(self, request: LLMRequest) -> float | None:
        # a blocking request brings its first token with its last one: only the total applies
        return super().first_token_deadline_s(request) if self.config.responses_api_stream else None

    def abort_request(self) -> None:
        """Shut down the sockets of this handler's HTTP connections (the SDK's httpx pool), which
        ends a read blocked on them at once; the next request opens a new connection.

        Reaches into httpx and httpcore internals, so it is best effort: without them the read
        ends at the HTTP client's own read timeout (``request_timeout_s``).
        """
        try:
            pool = self.client._client._transport._pool
            connections = list(pool.connections)
        except AttributeError:
            logger.debug("%s: cannot reach the HTTP connections to abort them", self.name)
            return
        for connection in connections:
            stream = getattr(getattr(connection, "_connection", None), "_network_stream", None)
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def events(self, request: LLMRequest, should_stop: Callable[[], bool]) -> Iterator[ProviderEvent]:
        try:
            if self.config.responses_api_stream:
                stream = self._request(request, stream=True)
                try:
                    for event in self._iter_stream_events(stream):
                        yield event
                        if should_stop():
                            return
                finally:
                    stream.close()
            else:
                yield from self._iter_response_events(self._request(request, stream=False))
        except self._openai.APITimeoutError as exc:
            raise ProviderTimeout(f"no answer within {self.config.request_timeout_s:g} s") from exc

    def _sampling(self, request: LLMRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if not self.official or request.temperature > 0:
            kwargs["temperature"] = request.temperature
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    # backend hooks
    def _request(self, request: LLMRequest, stream: bool) -> Any:
        raise NotImplementedError

    def _iter_stream_events(self, stream: Any) -> Iterator[ProviderEvent]:
        raise NotImplementedError

    def _iter_response_events(self, response: Any) -> Iterator[ProviderEvent]:
        raise NotImplementedError


class ResponsesAPIHandler(OpenAICompatibleHandler):
    """``/v1/responses``: the system prompt goes in ``instructions``, history in ``input``."""

    def _request(self, request: LLMRequest, stream: bool) -> Any:
        kwargs = self._sampling(request)
        if request.tools and request.tool_choice != "none":
            kwargs["tools"] = request.tools
            kwargs["tool_choice"] = request.tool_choice
        return self.client.responses.create(
            model=self.config.model_name,
            instructions=request.system_prompt or None,
            input=to_responses_input(request.items),
            max_output_tokens=request.max_output_tokens,
            stream=stream,
            store=False,
            **kwargs,
        )

    def _iter_stream_events(self, stream: Any) -> Iterator[ProviderEvent]:
        for event in stream:
            kind = getattr(event, "type", "")
            if kind in ("response.output_text.delta", "response.refusal.delta"):
                yield TextDelta(event.delta)
            elif kind == "response.function_call_arguments.delta":
                yield TextDelta("")  # a sign of life: the call comes whole, at output_item.done
            elif kind == "response.output_item.done" and getattr(event.item, "type", "") == "function_call":
                yield ToolCall(new_call_id(), event.item.name, event.item.arguments or "{}")
            elif kind in ("response.completed", "response.incomplete"):
                if kind == "response.incomplete":  # e.g. max_output_tokens: keep the text, and the billing
                    logger.warning("response incomplete: %s", getattr(event.response, "incomplete_details", ""))
                usage = getattr(event.response, "usage", None)
                if usage is not None:
                    yield Usage(usage.input_tokens or 0, usage.output_tokens or 0, _hit_max_output(event.response))
            elif kind in ("response.failed", "error"):
                detail = getattr(getattr(event, "response", None), "error", None) or getattr(event, "message", "")
                raise RuntimeError(f"provider reported {kind}: {detail}")

    def _iter_response_events(self, response: Any) -> Iterator[ProviderEvent]:
        texts: list[str] = []
        for item in response.output or []:
            if item.type == "message":
                for part in item.content or []:
                    text = getattr(part, "text", None) or getattr(part, "refusal", None)
                    if text:
                        texts.append(text)
                        yield TextDelta(text)
            elif item.type == "function_call":
                yield ToolCall(new_call_id(), item.name, item.arguments or "{}")
        yield AssistantMessage("".join(texts))
        if response.usage is not None:
            usage = response.usage
            yield Usage(usage.input_tokens or 0, usage.output_tokens or 0, _hit_max_output(response))


def _hit_max_output(response: Any) -> bool:
    """Whether a Responses API response stopped at ``max_output_tokens`` (status "incomplete")."""
    details = getattr(response, "incomplete_details", None)
    return getattr(details, "reason", None) == "max_output_tokens"


class ChatCompletionsHandler(OpenAICompatibleHandler):
    """``/v1/chat/completions``: streamed tool-call deltas are accumulated by index and
    the complete calls are emitted when the stream ends."""

    def _request(self, request: LLMRequest, stream: bool) -> Any:
        kwargs = self._sampling(request)
        if request.tools and request.tool_choice != "none":
            kwargs["tools"] = to_chat_tools(request.tools)
            kwargs["tool_choice"] = request.tool_choice
        if stream:
            kwargs["stream_options"] = {"include_usage": True}
        limit = "max_completion_tokens" if self.official else "max_tokens"
        kwargs[limit] = request.max_output_tokens
        return self.client.chat.completions.create(
            model=self.config.model_name, messages=request.chat_messages(images=True), stream=stream, **kwargs
        )

    def _iter_stream_events(self, stream: Any) -> Iterator[ProviderEvent]:
        calls: dict[int, dict[str, str]] = {}
        usage = None
        finish_reason = None
        for chunk in stream:
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                finish_reason = getattr(choice, "finish_reason", None) or finish_reason
                delta = choice.delta
                if delta is None:
                    continue
                text = (delta.content or "") + (getattr(delta, "refusal", None) or "")
                if text:
                    yield TextDelta(text)
                if delta.tool_calls:
                    yield TextDelta("")  # a sign of life: calls are emitted whole, at the end
                for call in delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                    if call.function is not None:
                        entry["name"] += call.function.name or ""
                        entry["arguments"] += call.function.arguments or ""
        for index in sorted(calls):
            if calls[index]["name"]:
                yield ToolCall(new_call_id(), calls[index]["name"], calls[index]["arguments"] or "{}")
        if usage is not None:
            yield Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0, finish_reason == "length")

    def _iter_response_events(self, response: Any) -> Iterator[ProviderEvent]:
        if not response.choices:
            raise RuntimeError("provider returned no choices")
        message = response.choices[0].message
        text = (message.content or "") + (getattr(message, "refusal", None) or "")
        if text:
            yield TextDelta(text)
        for call in message.tool_calls or []:
            yield ToolCall(new_call_id(), call.function.name, call.function.arguments or "{}")
        yield AssistantMessage(text)
        if response.usage is not None:
            cut = response.choices[0].finish_reason == "length"
            yield Usage(response.usage.prompt_tokens or 0, response.usage.completion_tokens or 0, cut)
