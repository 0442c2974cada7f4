"""Serialising history items for the OpenAI-style APIs and for local chat templates.

* :func:`to_chat_messages`: Chat Completions messages (tool calls grouped per assistant turn);
* :func:`to_responses_input`: Responses API input items;
* :func:`plain_chat_messages`: Chat messages for templates that know only user and assistant
  (tool calls written back as ``<code>`` blocks, results as user messages);
* :func:`template_messages`: Chat messages for a model's own chat template (tool-call arguments
  as objects, as templates render them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from speech_to_speech.llm.items import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, Item
from speech_to_speech.llm.prompts import clean_messages_for_local_model
from speech_to_speech.llm.tools.prompt import CODE_CLOSE, CODE_OPEN


def _part_text(part: dict) -> str:
    if part.get("type") == "input_audio":
        return part.get("transcript") or AUDIO_PLACEHOLDER
    if part.get("type") == "input_image":
        return IMAGE_PLACEHOLDER
    return part.get("text", "")


def _has_image(content: str | list[dict]) -> bool:
    return isinstance(content, list) and any(part.get("type") == "input_image" for part in content)


def _chat_parts(content: list[dict]) -> list[dict]:
    """A message's parts as Chat Completions content parts: ``{"type": "text", "text"}`` and
    ``{"type": "image_url", "image_url": {"url", "detail"}}``, in order."""
    parts = []
    for part in content:
        if part.get("type") == "input_image":
            image = {"url": part["image_url"], "detail": part.get("detail", "auto")}
            parts.append({"type": "image_url", "image_url": image})
        elif text := _part_text(part):
            parts.append({"type": "text", "text": text})
    return parts


def _flatten_content(content: str | list[dict]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(text for text in (_part_text(part) for part in content) if text)


def _answered_items(items: Iterable[Item]) -> list[Item]:
    """``items`` without function calls that have no output and outputs that have no call."""
    items = list(items)
    calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
    outputs = {item["call_id"] for item in items if item.get("type") == "function_call_output"}
    answered = calls & outputs
    return [
        item
        for item in items
        if item.get("type") not in ("function_call", "function_call_output") or item["call_id"] in answered
    ]


def to_chat_messages(
    system_prompt: str, items: list[dict], *, drop_unanswered: bool = True, images: bool = False
) -> list[dict]:
    """Serialise history items as OpenAI Chat Completions messages.

    - The system prompt comes first, if non-empty.
    - A message becomes ``{"role", "content": str}``; parts are joined with newlines, an audio part
      standing as its transcript (or :data:`AUDIO_PLACEHOLDER`), an image part as
      :data:`IMAGE_PLACEHOLDER`; with ``images``, a message with an image keeps its parts instead:
      ``"content": [{"type": "text", "text"}, {"type": "image_url", "image_url": {"url", "detail"}}, ...]``.
    - Function calls become ``{"role": "assistant", "content": None, "tool_calls": [{"id": call_id,
      "type": "function", "function": {"name", "arguments"}}]}``; consecutive calls share one
      assistant message, which is also the directly preceding assistant text message if there is one;
      an assistant text message directly after calls is joined to their message as well.
    - A function call output becomes ``{"role": "tool", "tool_call_id", "content"}``, placed right
      after the assistant message holding its call (the API requires that order).

    Args:
        system_prompt: the system message text ("" for none).
        items: history items, e.g. :meth:`Chat.items`.
        drop_unanswered: leave out calls without an output and outputs without a call (providers reject
            both); if False, they are serialised where they stand.
        images: send image parts (for a model that sees); False stands each one as text.

    Returns:
        New message dicts.
    """
    if drop_unanswered:
        items = _answered_items(items)
    outputs: dict[str, Item] = {}
    for item in items:
        if item.get("type") == "function_call_output":
            outputs.setdefault(item["call_id"], item)
    messages: list[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    emitted_outputs: set[str] = set()
    group: list[str] = []  # call_ids of the open assistant tool_calls message

    def close_group() -> None:
        for call_id in group:
            output = outputs.get(call_id)
            if output is not None and call_id not in emitted_outputs:
                emitted_outputs.add(call_id)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": output["output"]})
        group.clear()

    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and (group or "tool_calls" not in last):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            group.append(item["call_id"])
            continue
        if kind == "message" and item["role"] == "assistant" and group:
            # the text of the reply that made these calls (the LLM stage writes a call when it is
            # made, the reply's text when the reply ends): it joins the calls' assistant message,
            # so their outputs still follow it and the text does not land after the results
            last = messages[-1]
            text = _flatten_content(item["content"])
            last["content"] = f"{last['content']} {text}" if last["content"] else text
            continue
        close_group()
        if kind == "function_call_output":
            if item["call_id"] not in emitted_outputs:
                emitted_outputs.add(item["call_id"])
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "message":
            content = item["content"]
            content = _chat_parts(content) if images and _has_image(content) else _flatten_content(content)
            messages.append({"role": item["role"], "content": content})
    close_group()
    return messages


def to_responses_input(items: list[dict], *, drop_unanswered: bool = True, images: bool = True) -> list[dict]:
    """Serialise history items as OpenAI Responses API ``input`` items.

    - A message becomes ``{"type": "message", "role", "content": [{"type", "text"}, ...]}`` with
      ``output_text`` parts for the assistant and ``input_text`` parts otherwise; an audio part stands
      as its transcript (or :data:`AUDIO_PLACEHOLDER`); an image part is
      ``{"type": "input_image", "image_url", "detail"}`` (with ``images``; else :data:`IMAGE_PLACEHOLDER`).
    - ``{"type": "function_call", "call_id", "name", "arguments"}`` and
      ``{"type": "function_call_output", "call_id", "output"}``; our ``"id"`` is not sent.

    Args:
        items: history items, e.g. :meth:`Chat.items`.
        drop_unanswered: leave out calls without an output and outputs without a call (the API
            rejects both).
        images: send image parts (for a model that sees); False stands each one as text.

    Returns:
        New input item dicts, in history order.
    """
    if drop_unanswered:
        items = _answered_items(items)
    result: list[dict] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            part_type = "output_text" if item["role"] == "assistant" else "input_text"
            content = item["content"]
            parts = [content] if isinstance(content, str) else content
            result.append(
                {
                    "type": "message",
                    "role": item["role"],
                    "content": [
                        {"type": "input_image", "image_url": part["image_url"], "detail": part.get("detail", "auto")}
                        if images and isinstance(part, dict) and part.get("type") == "input_image"
                        else {"type": part_type, "text": part if isinstance(part, str) else _part_text(part)}
                        for part in parts
                    ],
                }
            )
        elif kind == "function_call":
            result.append(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item.get("arguments", "{}"),
                }
            )
        elif kind == "function_call_output":
            result.append({"type": "function_call_output", "call_id": item["call_id"], "output": item["output"]})
    return result


def plain_chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages without tool fields, for chat templates that know only user and assistant."""
    plain = []
    for message in messages:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function", {})
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except json.JSONDecodeError:
                    arguments = {}
                args = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) if isinstance(arguments, dict) else ""
                calls.append(f"{CODE_OPEN}{function.get('name', '')}({args}){CODE_CLOSE}")
            text = ((message.get("content") or "") + " " + " ".join(calls)).strip()
            plain.append({"role": "assistant", "content": text})
        elif message.get("role") == "tool":
            plain.append({"role": "user", "content": f"[tool result] {message.get('content', '')}"})
        else:
            plain.append({"role": message["role"], "content": message.get("content") or ""})
    return plain


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as chat templates expect them: tool-call arguments as objects, not strings."""
    shaped = []
    for message in clean_messages_for_local_model(messages):
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function", {}))
                try:
                    function["arguments"] = json.loads(function.get("arguments") or "{}")
                except (TypeError, json.JSONDecodeError):
                    function["arguments"] = {}
                calls.append({**call, "function": function})
            message = {**message, "tool_calls": calls, "content": message.get("content") or ""}
        elif message.get("content") is None:
            message = {**message, "content": ""}
        shaped.append(message)
    return shaped
