"""Client-side tools of the terminal client (``--tool-module``): loading and checking a module's
``TOOLS`` and ``execute_tool``, and running one call into a ``function_call_output`` string."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

#: default seconds a tool may run before its output becomes a timeout error
TOOL_TIMEOUT_S = 10.0


class ToolModuleError(Exception):
    """The ``--tool-module`` cannot be imported or does not export valid TOOLS / execute_tool."""


@dataclass
class ToolModule:
    """A loaded ``--tool-module``: the tools announced to the server and the function running them."""

    name: str
    tools: list[dict[str, Any]]
    execute: Callable[[str, dict[str, Any]], Any]


def _import_tool_module(spec: str) -> ModuleType:
    """Import ``spec``: a ``.py`` file path, or a dotted module name importable from the current directory."""
    path = Path(spec)
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        if not path.is_file():
            raise ToolModuleError(f"no such file: {spec}")
        name = f"_talk_tools_{abs(hash(str(path.resolve())))}_{path.stem}"
        file_spec = importlib.util.spec_from_file_location(name, path)
        if file_spec is None or file_spec.loader is None:
            raise ToolModuleError(f"cannot import {spec}")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module  # dataclasses, pickling and friends look the module up by name
        try:
            file_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(spec)


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check that ``tools`` is a list of flat function tools with unique names; return a copy.

    Raises:
        ToolModuleError: with what is wrong (the nested Chat Completions form gets a hint).
    """
    if not isinstance(tools, (list, tuple)):
        raise ToolModuleError(f"TOOLS must be a list of function tools, not {type(tools).__name__}")
    seen: set[str] = set()
    checked: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ToolModuleError(f"TOOLS[{index}] must be a dict, not {type(tool).__name__}")
        if "function" in tool and "name" not in tool:
            raise ToolModuleError(
                f"TOOLS[{index}] uses the nested Chat Completions form; the Realtime form is flat: "
                '{"type": "function", "name": ..., "description": ..., "parameters": {...}}'
            )
        name = tool.get("name")
        if tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise ToolModuleError(f'TOOLS[{index}] must have "type": "function" and a non-empty string "name"')
        if "parameters" in tool and not isinstance(tool["parameters"], dict):
            raise ToolModuleError(f"TOOLS[{index}] ({name}): 'parameters' must be a JSON Schema object")
        if name in seen:
            raise ToolModuleError(f"TOOLS has two tools named {name!r}")
        seen.add(name)
        checked.append(dict(tool))
    return checked


def load_tool_module(spec: str) -> ToolModule:
    """Load a ``--tool-module`` (dotted name or ``.py`` path) and check its ``TOOLS`` and ``execute_tool``.

    Raises:
        ToolModuleError: the module cannot be imported (any error while importing it) or its
            exports are missing or malformed.
    """
    try:
        module = _import_tool_module(spec)
    except ToolModuleError:
        raise
    except Exception as exc:  # ImportError, SyntaxError, or whatever the module raises at import
        raise ToolModuleError(f"cannot import {spec}: {exc!r}") from exc
    if not hasattr(module, "TOOLS"):
        raise ToolModuleError(f"{spec} does not export TOOLS")
    execute = getattr(module, "execute_tool", None)
    if not callable(execute):
        raise ToolModuleError(f"{spec} does not export a callable execute_tool(name, arguments)")
    return ToolModule(name=spec, tools=validate_tools(module.TOOLS), execute=execute)


def _error_output(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def format_tool_result(result: Any) -> str:
    """The ``function_call_output`` string for a tool result: a string as is, anything else as JSON."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:  # e.g. circular references
        return _error_output(f"tool result is not JSON-serializable: {exc}")


def run_in_daemon_thread(func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run ``func(*args)`` in a new daemon thread; its result or exception resolves the returned future.

    Unlike ``asyncio.to_thread`` (the loop's default executor, which ``asyncio.run`` waits for on
    exit), a call that never returns cannot keep the client from exiting after a timeout.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled (timed out) meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = func(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="talk-tool", daemon=True).start()
    return future


async def call_tool(tools: ToolModule, name: str, arguments: str, timeout_s: float) -> str:
    """Run one call and return its output string; never raises (errors become ``{"error": ...}``).

    ``arguments`` is the JSON text from the server (empty means ``{}``); it must decode to an
    object. A synchronous ``execute_tool`` runs in a daemon thread.
    """
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        return _error_output(f"invalid JSON arguments for {name}: {exc}")
    if not isinstance(parsed, dict):
        return _error_output(f"arguments for {name} must be a JSON object, not {type(parsed).__name__}")
    try:
        if inspect.iscoroutinefunction(tools.execute):
            pending: Awaitable[Any] = tools.execute(name, parsed)
        else:
            pending = run_in_daemon_thread(tools.execute, name, parsed)
        result = await asyncio.wait_for(pending, timeout_s)
        if inspect.isawaitable(result):  # a sync function returning an awaitable
            result = await asyncio.wait_for(result, timeout_s)
    except TimeoutError:
        return _error_output(f"tool {name} timed out after {timeout_s:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return _error_output(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return format_tool_result(result)
