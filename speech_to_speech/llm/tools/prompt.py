"""The tools block of a local model's system prompt.

Local models without native function calling are shown each tool as a Python
function stub (see :func:`~speech_to_speech.llm.tools.schema.render_signature`) and
asked to call it by writing one Python call inside a ``<code>…</code>`` block::

    <code>get_weather(city='Paris')</code>

The rules in the prompt target the mistakes small models actually make: several
calls crammed into one block, positional arguments, unquoted strings, and
optional arguments filled with placeholders such as ``'random'`` or ``None``.

There are two variants, rendered from Jinja2 templates (autoescape off) that
share one base:

* voice (:func:`build_tool_prompt` with ``voice=True``): everything outside the
  blocks is spoken, so it may say one short sentence before a call if it needs
  to, and must never claim to have a result before it arrives;
* text: the same rules without the spoken-style ones; it calls directly, with
  no lead-in sentence.

The result is meant for the ``tools_block`` argument of
:func:`~speech_to_speech.llm.prompts.build_voice_system_prompt` (or the text one).
"""

from __future__ import annotations

import logging
from typing import Any

import jinja2

from speech_to_speech.llm.tools.schema import render_signature

__all__ = ["CODE_CLOSE", "CODE_OPEN", "build_tool_prompt", "function_tool_spec"]

logger = logging.getLogger(__name__)

#: Opens a tool-call block in a local model's output.
CODE_OPEN = "<code>"
#: Closes a tool-call block.
CODE_CLOSE = "</code>"

_BASE_TEMPLATE = """\
TOOLS
You can use the tools below. Each one is shown as a Python function signature; its docstring says what it does.

{% for signature in signatures %}
{{ signature }}

{% endfor %}
To use a tool, write a call to it inside a {{ open }}{{ close }} block, for example:
{{ open }}function_name(argument='value'){{ close }}

Tool call rules:
- Write exactly one call per {{ open }} block. To make several calls, write several blocks.
- Use keyword arguments only (name=value), never positional arguments.
- Write values as Python literals: always put string values in quotes, and write numbers, True, False, None, \
lists and dicts as in Python.
- Omit an optional argument rather than filling it with a placeholder such as 'random', 'none', '' or None.
- Only call the tools listed above, with the arguments they define.
- The blocks are hidden from the user: never mention tools, functions, code or tags, and never read out \
arguments or raw results.
- After your tool calls, stop: the results come back in a later message, and you answer from them then.
{% block mode_rules %}{% endblock %}
"""

_VOICE_TEMPLATE = """\
{% extends "base" %}
{% block mode_rules %}
- Everything outside the blocks is spoken aloud. If you need to say something before a tool call, keep it to \
one short sentence.
- Never claim to have a result, or guess it, before it arrives.
{% endblock %}
"""

_TEXT_TEMPLATE = """\
{% extends "base" %}
{% block mode_rules %}
- Call a tool directly, without a lead-in sentence.
{% endblock %}
"""

_ENV = jinja2.Environment(
    loader=jinja2.DictLoader({"base": _BASE_TEMPLATE, "voice": _VOICE_TEMPLATE, "text": _TEXT_TEMPLATE}),
    autoescape=False,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=False,
    undefined=jinja2.StrictUndefined,
)


def function_tool_spec(tool: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """``(name, description, parameters)`` of a function tool, or ``None`` if it is not one.

    Accepts the flat Responses shape ``{"type": "function", "name", "description",
    "parameters"}`` and, for convenience, the nested Chat Completions shape
    ``{"type": "function", "function": {...}}``. Missing description/parameters
    read as ``""`` / ``{}``.
    """
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        return None
    description = spec.get("description") or ""
    parameters = spec.get("parameters") or {}
    return name, str(description), parameters if isinstance(parameters, dict) else {}


def build_tool_prompt(tools: list[dict[str, Any]], voice: bool = True) -> str:
    """The tools block for a local model's system prompt.

    Renders every function tool as its Python signature, then how to call a tool
    (``<code>name(arg='value')</code>``) and the rules: one call per block,
    keyword arguments only, string values quoted, optional arguments omitted
    rather than filled with placeholders, never mention tools, code or tags. The
    voice variant adds the spoken-style rules (at most one short sentence before
    a call; never claim a result before it arrives); the text variant instead
    asks for direct calls without a lead-in.

    Tools that are not function tools are skipped, and so (with a warning) are
    tools whose name or parameter names cannot be written in a Python call.

    Args:
        tools: function tools, ``{"type": "function", "name", "description", "parameters"}``.
        voice: render the voice variant (``False``: the text variant).

    Returns:
        The block (no trailing newline), or ``""`` when there is no usable tool.
    """
    signatures = []
    for tool in tools or []:
        spec = function_tool_spec(tool)
        if spec is None:
            logger.debug("skipping a tool that is not a function tool: %r", tool)
            continue
        name, description, parameters = spec
        try:
            signatures.append(render_signature(name, description, parameters))
        except ValueError as exc:
            logger.warning("tool %r left out of the prompt: %s", name, exc)
    if not signatures:
        return ""
    template = _ENV.get_template("voice" if voice else "text")
    return template.render(signatures=signatures, open=CODE_OPEN, close=CODE_CLOSE).strip()
