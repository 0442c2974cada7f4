"""Client-side tools in s2s-talk (``--tool-module``) and the example module ``sample_tools``.

(The ``talk``, ``console_out`` and ``sample_tools`` fixtures are in conftest.py.)

The end-to-end tests run s2s-talk's client against a tiny scripted Realtime server (a websockets
server on 127.0.0.1, port 0): it answers the first ``response.create`` with a function call and
the follow-up one with a text reply, and records what the client sent.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from speech_to_speech.client.talk import tools as talk_tools
from tests.helpers import REPO_ROOT

SAMPLE_PATH = REPO_ROOT / "speech_to_speech" / "client" / "talk" / "sample_tools.py"
#: seconds any single end-to-end run may take before the test fails
RUN_TIMEOUT_S = 8.0
CALL_ID = "call_add_1"


def write_module(directory: Path, name: str, source: str) -> Path:
    """Write a tool module file and return its path."""
    path = directory / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    return path


RAISING_MODULE = """
TOOLS = [{"type": "function", "name": "add", "description": "Broken adder.", "parameters": {"type": "object"}}]


async def execute_tool(name, arguments):
    raise RuntimeError("boom in " + name)
"""


# ---------------------------------------------------------------------------------------------
# the scripted server


class FakeRealtimeServer:
    """Scripted Realtime server: response 1 calls ``add``, later responses answer with text.

    Args:
        arguments: the JSON text of the call's arguments.
        status: the ``status`` of the response that holds the call.
    """

    def __init__(self, arguments: str = '{"a": 2, "b": 3}', status: str = "completed") -> None:
        self.arguments = arguments
        self.status = status
        self.received: list[dict[str, Any]] = []
        self.session: dict[str, Any] = {}
        self.responses = 0

    async def handler(self, ws: ServerConnection) -> None:
        """Record client events; answer session.update and each response.create."""
        try:
            async for message in ws:
                event = json.loads(message)
                self.received.append(event)
                kind = event.get("type")
                if kind == "session.update":
                    self.session = event.get("session") or {}
                    await ws.send(json.dumps({"type": "session.updated", "session": self.session}))
                elif kind == "response.create":
                    self.responses += 1
                    if self.responses == 1:
                        await self._call_tool(ws, f"resp_{self.responses}")
                    else:
                        await self._answer(ws, f"resp_{self.responses}")
        except ConnectionClosed:
            pass

    async def _call_tool(self, ws: ServerConnection, response_id: str) -> None:
        item = {
            "id": "item_call",
            "type": "function_call",
            "status": "completed",
            "call_id": CALL_ID,
            "name": "add",
            "arguments": self.arguments,
        }
        base = {"response_id": response_id, "output_index": 0}
        for event in (
            {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}},
            {"type": "response.output_item.added", **base, "item": {**item, "status": "in_progress", "arguments": ""}},
            {
                "type": "response.function_call_arguments.done",
                **base,
                "item_id": item["id"],
                "call_id": CALL_ID,
                "name": "add",
                "arguments": self.arguments,
            },
            {"type": "response.output_item.done", **base, "item": item},
            {"type": "response.done", "response": {"id": response_id, "status": self.status, "output": [item]}},
        ):
            await ws.send(json.dumps(event))

    async def _answer(self, ws: ServerConnection, response_id: str) -> None:
        base = {"response_id": response_id, "item_id": "item_text", "output_index": 0, "content_index": 0}
        for event in (
            {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}},
            {"type": "response.output_text.delta", **base, "delta": "Two plus three is five."},
            {"type": "response.output_text.done", **base, "text": "Two plus three is five."},
            {"type": "response.done", "response": {"id": response_id, "status": "completed", "output": []}},
        ):
            await ws.send(json.dumps(event))

    # -- what the client sent ---------------------------------------------------------------
    def outputs(self) -> list[tuple[int, dict[str, Any]]]:
        """(index, item) of every function_call_output the client created."""
        return [
            (index, event["item"])
            for index, event in enumerate(self.received)
            if event.get("type") == "conversation.item.create" and event["item"].get("type") == "function_call_output"
        ]

    def response_creates(self) -> list[int]:
        """Indices of the client's response.create events."""
        return [index for index, event in enumerate(self.received) if event.get("type") == "response.create"]


async def converse_with(talk: ModuleType, fake: FakeRealtimeServer, tmp_path: Path, *flags: str) -> int:
    """Run s2s-talk's client (in process) against ``fake``; return its exit status."""
    async with serve(fake.handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        args = talk.parse_args(
            [
                "--url",
                f"ws://127.0.0.1:{port}/v1/realtime",
                "--text",
                "what is 2 plus 3",
                "--output_audio",
                str(tmp_path / "reply.wav"),
                "--idle_timeout_s",
                "3",
                *flags,
            ]
        )
        return await asyncio.wait_for(talk.run(args), RUN_TIMEOUT_S)


def assert_output_then_follow_up(fake: FakeRealtimeServer) -> dict[str, Any]:
    """One output for the call, then exactly one follow-up response.create; return the output item."""
    outputs = fake.outputs()
    creates = fake.response_creates()
    assert len(outputs) == 1, fake.received
    assert len(creates) == 2, fake.received  # the user's turn, then the follow-up
    index, item = outputs[0]
    assert creates[0] < index < creates[1], fake.received
    assert item["call_id"] == CALL_ID
    assert isinstance(item["output"], str)
    assert fake.received[creates[1]] == {"type": "response.create"}  # plain
    return item


# ---------------------------------------------------------------------------------------------
# end to end


def test_tool_call_output_then_follow_up(
    talk: ModuleType, console_out: io.StringIO, tmp_path: Path, sample_tools: ModuleType
) -> None:
    fake = FakeRealtimeServer()
    status = asyncio.run(converse_with(talk, fake, tmp_path, "--tool-module", str(SAMPLE_PATH)))
    assert status == 0, console_out.getvalue()

    assert fake.session["tools"] == sample_tools.TOOLS
    assert fake.session["tool_choice"] == "auto"
    item = assert_output_then_follow_up(fake)
    assert json.loads(item["output"]) == {"sum": 5}
    printed = console_out.getvalue()
    assert "[tool] add(" in printed and '{"sum": 5}' in printed
    assert "Two plus three is five." in printed


def test_raising_tool_gives_error_output(talk: ModuleType, console_out: io.StringIO, tmp_path: Path) -> None:
    module = write_module(tmp_path, "raising_tools", RAISING_MODULE)
    fake = FakeRealtimeServer()
    status = asyncio.run(converse_with(talk, fake, tmp_path, "--tool-module", str(module)))
    assert status == 0, console_out.getvalue()
    item = assert_output_then_follow_up(fake)
    assert "boom in add" in json.loads(item["output"])["error"]
    assert "Two plus three is five." in console_out.getvalue()


def test_bad_json_arguments_give_error_output(talk: ModuleType, console_out: io.StringIO, tmp_path: Path) -> None:
    fake = FakeRealtimeServer(arguments='{"a": 2, "b": ')
    status = asyncio.run(converse_with(talk, fake, tmp_path, "--tool-module", str(SAMPLE_PATH)))
    assert status == 0, console_out.getvalue()
    item = assert_output_then_follow_up(fake)
    assert "invalid JSON" in json.loads(item["output"])["error"]


def test_cancelled_response_gets_output_but_no_follow_up(
    talk: ModuleType, console_out: io.StringIO, tmp_path: Path
) -> None:
    fake = FakeRealtimeServer(status="cancelled")
    status = asyncio.run(converse_with(talk, fake, tmp_path, "--tool-module", str(SAMPLE_PATH)))
    assert status == 0, console_out.getvalue()
    assert len(fake.outputs()) == 1
    assert len(fake.response_creates()) == 1  # only the user's turn


def test_without_tool_module_calls_are_only_printed(talk: ModuleType, console_out: io.StringIO, tmp_path: Path) -> None:
    fake = FakeRealtimeServer()
    status = asyncio.run(converse_with(talk, fake, tmp_path))
    assert status == 0, console_out.getvalue()
    assert "tools" not in fake.session
    assert fake.outputs() == []
    assert len(fake.response_creates()) == 1
    assert "[tool] add(" in console_out.getvalue()


def test_command_line_subprocess(tmp_path: Path) -> None:
    """The documented command, run as a subprocess from the repository root."""

    async def scenario() -> tuple[int, str, FakeRealtimeServer]:
        fake = FakeRealtimeServer()
        async with serve(fake.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "speech_to_speech.client.talk",
                "--url",
                f"ws://127.0.0.1:{port}/v1/realtime",
                "--text",
                "what is 2 plus 3",
                "--tool-module",
                "speech_to_speech.client.talk.sample_tools",
                "--output_audio",
                str(tmp_path / "reply.wav"),
                "--idle_timeout_s",
                "3",
                cwd=REPO_ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                stdout, _ = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
                raise
            return process.returncode or 0, stdout.decode(errors="replace"), fake

    returncode, printed, fake = asyncio.run(scenario())
    assert returncode == 0, printed
    item = assert_output_then_follow_up(fake)
    assert json.loads(item["output"]) == {"sum": 5}
    assert '[tool] add → {"sum": 5}' in printed


# ---------------------------------------------------------------------------------------------
# s2s-talk pieces


def test_session_update_carries_tools(talk: ModuleType, sample_tools: ModuleType) -> None:
    args = talk.parse_args(["--text", "hi"])
    assert "tools" not in talk.build_session_update(args)["session"]
    session = talk.build_session_update(args, sample_tools.TOOLS)["session"]
    assert session["tools"] == sample_tools.TOOLS and session["tool_choice"] == "auto"


def test_tool_flags(talk: ModuleType) -> None:
    args = talk.parse_args(["--tool-module", "pkg.tools"])
    assert args.tool_module == "pkg.tools" and args.tool_timeout_s == talk.TOOL_TIMEOUT_S
    assert talk.parse_args(["--tool_module", "x", "--tool_timeout_s", "2.5"]).tool_timeout_s == 2.5
    with pytest.raises(SystemExit) as exc:
        talk.parse_args(["--tool_timeout_s", "0"])
    assert exc.value.code == 2


def test_load_tool_module_by_path_and_dotted_name(
    talk: ModuleType, sample_tools: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = talk.load_tool_module(str(SAMPLE_PATH))
    assert loaded.tools == sample_tools.TOOLS
    assert [tool["name"] for tool in loaded.tools] == ["get_time", "add"]

    package = tmp_path / "talk_tools_pkg_for_test"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    write_module(package, "mytools", RAISING_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    for name in ("talk_tools_pkg_for_test", "talk_tools_pkg_for_test.mytools"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    dotted = talk.load_tool_module("talk_tools_pkg_for_test.mytools")
    assert [tool["name"] for tool in dotted.tools] == ["add"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("async def execute_tool(name, arguments):\n    return 1\n", "does not export TOOLS"),
        ("TOOLS = []\n", "execute_tool"),
        ("TOOLS = {}\nasync def execute_tool(n, a):\n    return 1\n", "must be a list"),
        (
            "TOOLS = [{'type': 'function', 'function': {'name': 'f'}}]\nasync def execute_tool(n, a):\n    return 1\n",
            "nested Chat Completions form",
        ),
        ("TOOLS = [{'type': 'function'}]\nasync def execute_tool(n, a):\n    return 1\n", "non-empty string"),
        (
            "T = {'type': 'function', 'name': 'f'}\nTOOLS = [T, T]\nasync def execute_tool(n, a):\n    return 1\n",
            "two tools named",
        ),
        ("TOOLS = [\n", "cannot import"),
        ("raise RuntimeError('import-time failure')\n", "import-time failure"),
    ],
)
def test_load_tool_module_errors(talk: ModuleType, tmp_path: Path, source: str, message: str) -> None:
    path = write_module(tmp_path, "bad_tools", source)
    with pytest.raises(talk.ToolModuleError, match=message):
        talk.load_tool_module(str(path))


def test_missing_tool_module_exits_2(talk: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.py"
    assert talk.main(["--text", "hi", "--tool-module", str(missing), "--url", "ws://127.0.0.1:9/x"]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(talk.ToolModuleError, match="cannot import"):
        talk.load_tool_module("talk_no_such_module_for_test")


def test_call_tool_outputs(talk: ModuleType, sample_tools: ModuleType) -> None:
    tools = talk.ToolModule("sample", sample_tools.TOOLS, sample_tools.execute_tool)

    def call(name: str, arguments: str, timeout_s: float = 2.0, module: Any = tools) -> Any:
        return json.loads(asyncio.run(talk_tools.call_tool(module, name, arguments, timeout_s)))

    assert call("add", '{"a": 2, "b": 3}') == {"sum": 5}
    assert call("add", '{"a": 1.5, "b": -0.5}') == {"sum": 1.0}
    assert "invalid JSON" in call("add", "{oops")["error"]
    assert "JSON object" in call("add", "[1, 2]")["error"]
    assert "bad arguments" in call("add", "")["error"]  # empty arguments mean {}
    assert "unknown tool" in call("nope", "{}")["error"]

    async def slow(name: str, arguments: dict[str, Any]) -> str:
        await asyncio.sleep(5)
        return "late"

    assert "timed out" in call("slow", "{}", 0.05, talk.ToolModule("slow", [], slow))["error"]

    def sync_tool(name: str, arguments: dict[str, Any]) -> str:
        return f"plain text for {name}"

    plain = asyncio.run(talk_tools.call_tool(talk.ToolModule("sync", [], sync_tool), "t", "{}", 2.0))
    assert plain == "plain text for t"  # strings go out as they are

    def failing(name: str, arguments: dict[str, Any]) -> None:
        raise ValueError("bad value")

    assert call("f", "{}", module=talk.ToolModule("f", [], failing)) == {"error": "ValueError: bad value"}


def test_stuck_sync_tool_times_out_without_blocking_exit(talk: ModuleType) -> None:
    release = threading.Event()

    def stuck(name: str, arguments: dict[str, Any]) -> str:
        release.wait(30)
        return "too late"

    started = time.monotonic()
    try:
        output = asyncio.run(talk_tools.call_tool(talk.ToolModule("stuck", [], stuck), "stuck", "{}", 0.05))
    finally:
        release.set()
    assert "timed out" in json.loads(output)["error"]
    assert time.monotonic() - started < 5  # asyncio.run did not wait for the stuck thread


# ---------------------------------------------------------------------------------------------
# sample_tools.py


def test_sample_tools_schema(talk: ModuleType, sample_tools: ModuleType) -> None:
    assert talk_tools.validate_tools(sample_tools.TOOLS) == sample_tools.TOOLS
    for tool in sample_tools.TOOLS:
        assert tool["description"] and tool["parameters"]["type"] == "object"


def test_sample_add(sample_tools: ModuleType) -> None:
    assert sample_tools.add(2, 3) == {"sum": 5}
    assert sample_tools.add(0.25, 0.5) == {"sum": 0.75}
    assert "error" in sample_tools.add("2", 3)
    assert "error" in sample_tools.add(True, 3)
    assert "error" in sample_tools.add(float("nan"), 3)


def test_sample_get_time(sample_tools: ModuleType) -> None:
    utc = sample_tools.get_time()
    assert utc["timezone"] == "UTC" and utc["utc_offset"] == "+0000"
    assert {"iso", "time", "date"} <= utc.keys()
    assert "error" in sample_tools.get_time("Mars/Olympus_Mons")
    assert "error" in sample_tools.get_time("")
    assert "error" in sample_tools.get_time("../etc/passwd")


def test_sample_get_time_named_zone(sample_tools: ModuleType) -> None:
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo("Asia/Tokyo")
    except Exception:  # no tz database on this machine
        pytest.skip("no IANA timezone database")
    tokyo = sample_tools.get_time("Asia/Tokyo")
    assert tokyo["timezone"] == "Asia/Tokyo" and tokyo["utc_offset"] == "+0900"


def test_sample_execute_tool(sample_tools: ModuleType) -> None:
    assert asyncio.run(sample_tools.execute_tool("add", {"a": 2, "b": 3})) == {"sum": 5}
    assert asyncio.run(sample_tools.execute_tool("get_time", {}))["timezone"] == "UTC"
    assert "bad arguments" in asyncio.run(sample_tools.execute_tool("add", {"a": 1}))["error"]
    assert "unknown tool" in asyncio.run(sample_tools.execute_tool("nope", {}))["error"]


def test_s2s_talk_console_script_runs_the_client() -> None:
    """pyproject's ``s2s-talk`` names an importable entry point, and the command answers --help."""
    import importlib
    import subprocess
    import tomllib

    target = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["s2s-talk"]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    shown = subprocess.run(
        [sys.executable, "-m", "speech_to_speech.client.talk", "--help"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and shown.stdout.startswith("usage: s2s-talk")
