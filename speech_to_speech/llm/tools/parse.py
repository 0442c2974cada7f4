"""Finding and parsing the ``<code>name(arg='value')</code>`` tool calls of a local model.

Three layers, each usable alone:

* :class:`CodeBlockExtractor` splits a streamed reply into ordered ``("text", s)``
  and ``("code", source)`` parts, releasing text as early as it safely can;
* :func:`parse_call` / :func:`parse_calls` turn a block's source into
  ``(name, arguments)`` with Python's :mod:`ast`: only a plain function name
  called with literal keyword arguments is accepted. Nothing is ever evaluated
  or executed (values go through :func:`ast.literal_eval` on the parsed node);
* :func:`extract_calls` checks each call against the session's tools and turns
  it into ``("call", (name, arguments_json))``, logging and skipping what does
  not fit instead of failing the response.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Literal, Union, get_args, get_origin

from speech_to_speech.llm.tools.json_calls import parse_json_calls
from speech_to_speech.llm.tools.prompt import CODE_CLOSE, CODE_OPEN, function_tool_spec
from speech_to_speech.llm.tools.schema import object_properties, schema_to_annotation

__all__ = [
    "CodeBlockExtractor",
    "Part",
    "ToolCallParseError",
    "extract_calls",
    "parse_call",
    "parse_calls",
]

logger = logging.getLogger(__name__)

#: One piece of a model's reply: ``("text", text)`` or ``("code", block_source)``.
Part = tuple[str, str]


class ToolCallParseError(ValueError):
    """A ``<code>`` block is not a tool call this module accepts (see :func:`parse_call`)."""


# -- parsing ---------------------------------------------------------------------------------
def _call_from_node(node: ast.expr, source: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one call expression node; raises :class:`ToolCallParseError`."""
    if not isinstance(node, ast.Call):
        raise ToolCallParseError(f"not a function call: {source!r}")
    if not isinstance(node.func, ast.Name):
        raise ToolCallParseError(f"the called object must be a plain name: {source!r}")
    if node.args:
        raise ToolCallParseError(f"positional arguments are not allowed, use name=value: {source!r}")
    arguments: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallParseError(f"**keyword unpacking is not allowed: {source!r}")
        try:
            arguments[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise ToolCallParseError(f"argument {kw.arg!r} is not a literal value: {source!r}") from exc
    return node.func.id, arguments


def _parse(source: str, mode: str) -> ast.AST:
    """``ast.parse`` with every failure turned into :class:`ToolCallParseError`."""
    if not isinstance(source, str):
        raise ToolCallParseError(f"expected a string, got {type(source).__name__}")
    try:
        return ast.parse(source.strip(), mode=mode)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ToolCallParseError(f"not valid Python call syntax: {source!r} ({exc})") from exc


def parse_call(source: str) -> tuple[str, dict[str, Any]]:
    """Parse one tool call written as a Python call expression.

    ``get_weather(city="Paris", days=[1, 2], opts={"k": None})`` gives
    ``("get_weather", {"city": "Paris", "days": [1, 2], "opts": {"k": None}})``.

    Accepted: a single call of a plain name (surrounding whitespace ignored) with
    keyword arguments only, each value a Python literal: strings (escapes
    included), bytes, numbers (negative too), ``True``/``False``/``None``, and
    lists, tuples, sets and dicts of those, nested. The values are read with
    :func:`ast.literal_eval` on the parsed node; nothing is evaluated or executed.

    Args:
        source: the inside of a ``<code>`` block.

    Returns:
        ``(name, arguments)``; ``arguments`` maps argument names to Python values.

    Raises:
        ToolCallParseError: a syntax error, anything but a single call, a call of
            anything but a plain name (``os.system(...)``, ``f()(...)``),
            positional or ``*``/``**`` arguments, or a value that is not a literal
            (names, calls, lambdas, f-strings, operators, comprehensions).
    """
    tree = _parse(source, "eval")
    assert isinstance(tree, ast.Expression)
    return _call_from_node(tree.body, source)


def parse_calls(source: str) -> list[tuple[str, dict[str, Any]]]:
    """Parse a block that may hold several calls, one per line or separated by ``;``.

    The prompt asks for one call per block, but models sometimes write more; each
    statement must be a call accepted by :func:`parse_call`.

    Args:
        source: the inside of a ``<code>`` block.

    Returns:
        The ``(name, arguments)`` pairs in order (empty for a blank block).

    Raises:
        ToolCallParseError: a statement is not an accepted call (the whole block
            is rejected, so that no call runs from a half-understood block).
    """
    tree = _parse(source, "exec")
    assert isinstance(tree, ast.Module)
    calls = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            raise ToolCallParseError(f"only function calls are allowed: {source!r}")
        calls.append(_call_from_node(statement.value, source))
    return calls


# -- streaming extraction ------------------------------------------------------------------------
def _tag_prefix_length(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class CodeBlockExtractor:
    """Splits a streamed model reply into text parts and ``<code>`` block parts.

    Feed it the deltas in order, then call :meth:`flush` once at the end of the
    stream. Each call returns the parts it could settle, in stream order:

    * ``("text", s)``: reply text outside any block. Text is released as soon as
      it is known not to belong to a tag: only a suffix that could be the start
      of ``<code>`` (``"<"``, ``"<c"``, … ``"<code"``) is held back, and released
      as text once the next delta shows it is not a tag. So text before a block
      goes out before the block is complete. How text is divided into parts
      depends on the deltas; joined together, the text parts are the same for any
      split of the stream.
    * ``("code", source)``: the exact text between ``<code>`` and ``</code>``,
      emitted once the block closes (an open block waits for more deltas). A block
      ends at the first ``</code>``, even one inside a string argument.

    At :meth:`flush`, a held tag prefix is released as text, and a block that
    never closed is returned as a ``("code", source)`` part with a logged
    warning: the end of the stream counts as its close. Its source is never
    spoken, which matters when ``</code>`` is a stop sequence (the provider
    strips it) or when the reply was cut off by the token limit; a cut-off call is
    not valid Python and is rejected downstream by :func:`parse_call`.

    Text mode (``text_mode=True``, replies that are read, not spoken): the same
    behaviour, stated for that use: every character is forwarded at once except a
    possible ``<code>`` prefix, so a client sees the reply verbatim, token by
    token, without ever seeing half of a tag. The flag does not change the
    splitting (both modes release text as early as possible); it is kept on the
    instance as :attr:`text_mode` for callers that format text differently.

    Not thread-safe; one instance per response.
    """

    def __init__(self, *, text_mode: bool = False) -> None:
        self.text_mode = text_mode
        self._buffer = ""
        self._in_block = False

    @property
    def in_block(self) -> bool:
        """Whether a ``<code>`` block has opened and not closed yet."""
        return self._in_block

    def feed(self, delta: str) -> list[Part]:
        """Add the next piece of the stream; return the parts it settles (possibly none)."""
        self._buffer += delta
        parts: list[Part] = []
        while True:
            if self._in_block:
                end = self._buffer.find(CODE_CLOSE)
                if end < 0:
                    break
                parts.append(("code", self._buffer[:end]))
                self._buffer = self._buffer[end + len(CODE_CLOSE) :]
                self._in_block = False
                continue
            start = self._buffer.find(CODE_OPEN)
            if start >= 0:
                if start:
                    parts.append(("text", self._buffer[:start]))
                self._buffer = self._buffer[start + len(CODE_OPEN) :]
                self._in_block = True
                continue
            hold = _tag_prefix_length(self._buffer, CODE_OPEN)
            released = self._buffer[: len(self._buffer) - hold]
            if released:
                parts.append(("text", released))
            self._buffer = self._buffer[len(self._buffer) - hold :]
            break
        return parts

    def flush(self) -> list[Part]:
        """End of stream: release what is left (see the class docstring) and reset."""
        rest, in_block = self._buffer, self._in_block
        self._buffer, self._in_block = "", False
        if in_block:
            logger.warning("unclosed %s block at the end of the reply; treating the end as its close", CODE_OPEN)
            return [("code", rest)]
        return [("text", rest)] if rest else []


# -- validation against the tools ------------------------------------------------------------------
def _allows_null(spec: Any) -> bool:
    """Whether a property schema accepts ``None`` (or does not say what it accepts)."""
    annotation = schema_to_annotation(spec)
    if annotation is Any or annotation is None:
        return True
    return get_origin(annotation) in (Union, Literal) and any(
        arg is None or arg is type(None) for arg in get_args(annotation)
    )


def _jsonable(value: Any) -> Any:
    """``value`` with tuples and sets turned into lists (JSON has neither)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def _check_call(name: str, arguments: dict[str, Any], tools: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """``(name, arguments_json)`` if the call fits a tool, else ``None`` (after a warning)."""
    if name not in tools:
        logger.warning("model called unknown tool %r; skipped", name)
        return None
    parameters = tools[name]
    properties, required = object_properties(parameters)
    open_schema = parameters.get("additionalProperties") not in (None, False) if parameters else False
    unknown = [arg for arg in arguments if arg not in properties]
    if unknown and not open_schema:
        logger.warning("tool %r called with unknown argument(s) %s; skipped", name, unknown)
        return None
    # None for an optional argument means "not given" (the stub shows ``= None``), unless null is a valid value.
    arguments = {
        arg: value
        for arg, value in arguments.items()
        if value is not None or arg in required or _allows_null(properties.get(arg))
    }
    missing = [arg for arg in required if arg not in arguments]
    if missing:
        logger.warning("tool %r called without required argument(s) %s; skipped", name, missing)
        return None
    try:
        arguments_json = json.dumps(_jsonable(arguments), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        logger.warning("tool %r called with arguments that are not JSON (%s); skipped", name, exc)
        return None
    return name, arguments_json


def extract_calls(parts: Iterable[Part], tools: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Turn ``("code", source)`` parts into validated tool calls; pass text through.

    Each block is parsed with :func:`parse_calls` (normally one call), and each
    call is checked against ``tools``: the name must be one of the function
    tools, every argument name must exist in its schema (unless the schema sets
    ``additionalProperties``), and every required argument must be present.
    ``None`` given for an optional argument whose schema does not accept null is
    dropped, as if omitted. Problems (a block that does not parse, an unknown
    tool or argument, a missing required argument, values that are not JSON such
    as complex numbers or infinities) are logged and the call is skipped; they
    never raise.

    Args:
        parts: ``("text", s)`` / ``("code", source)`` parts, e.g. from
            :class:`CodeBlockExtractor`, or ``("json", payload)`` parts from
            :class:`~speech_to_speech.llm.tools.json_calls.JsonCallExtractor` (a payload
            that is not a tool call is passed on as text).
        tools: function tools, ``{"type": "function", "name", "description", "parameters"}``.

    Yields:
        ``("text", s)`` unchanged, and ``("call", (name, arguments_json))`` where
        ``arguments_json`` is a JSON object string (tuples and sets become lists),
        in stream order.
    """
    by_name: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        spec = function_tool_spec(tool)
        if spec is not None:
            by_name[spec[0]] = spec[2]
    for kind, payload in parts:
        if kind == "json":  # from JsonCallExtractor: a candidate that is not a call is plain text
            json_calls = parse_json_calls(payload)
            if json_calls is None:
                yield "text", payload
                continue
            for name, arguments in json_calls:
                checked = _check_call(name, arguments, by_name)
                if checked is not None:
                    yield "call", checked
            continue
        if kind != "code":
            yield kind, payload
            continue
        try:
            calls = parse_calls(payload)
        except ToolCallParseError as exc:
            logger.warning("tool call block skipped: %s", exc)
            continue
        if not calls:
            logger.warning("empty %s block skipped", CODE_OPEN)
        for name, arguments in calls:
            checked = _check_call(name, arguments, by_name)
            if checked is not None:
                yield "call", checked
