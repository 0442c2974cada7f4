"""Headless Chromium driven over the Chrome DevTools protocol, with nothing but ``websockets``.

The browser test needs only a few commands (open a page, run JavaScript, take a screenshot), so it
speaks the DevTools protocol directly: no Playwright or Selenium, no browser download. The browser
is Debian's ``chromium`` (``/usr/bin/chromium``, installed by ``.ci/run``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

#: flags for a quiet, reproducible headless browser (see ``Chromium``)
BASE_FLAGS = (
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--autoplay-policy=no-user-gesture-required",
    "--window-size=900,1100",
    "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary (``$CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH)."""
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


class CDPError(RuntimeError):
    """The browser answered a command with an error, or JavaScript threw."""


class Chromium:
    """A headless Chromium process and a DevTools connection to its first page.

    Args:
        binary: the browser executable.
        user_data_dir: a fresh profile folder.
        flags: extra command-line flags (a fake microphone, for instance).
        mute_audio: the page's audio is not played (``--mute-audio``); False: it plays on the
            default output (a sound server's, where ``PULSE_SERVER`` names one).
        env: the browser's environment (default: this process's).
    """

    def __init__(
        self,
        binary: str,
        user_data_dir: Path,
        flags: list[str] | None = None,
        mute_audio: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = env
        self.binary = binary
        self.user_data_dir = user_data_dir
        self.flags = list(flags or [])
        if mute_audio:
            self.flags.append("--mute-audio")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self.flags.append("--no-sandbox")  # the sandbox refuses to run as root
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: ClientConnection | None = None
        self.console: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._log = user_data_dir / "chromium.log"

    async def start(self, timeout_s: float = 60.0) -> Chromium:
        """Start the browser and connect to its page."""
        self.user_data_dir.mkdir(parents=True, exist_ok=True)
        command = [self.binary, *BASE_FLAGS, f"--user-data-dir={self.user_data_dir}", *self.flags, "about:blank"]
        with self._log.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
            )
        port_file = self.user_data_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise CDPError(f"chromium did not open its DevTools port in {timeout_s:g} s: {self.log_tail()}")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = await asyncio.to_thread(self._targets, port)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=timeout_s)
        self._reader = asyncio.create_task(self._read())
        await self.call("Runtime.enable")
        await self.call("Page.enable")
        return self

    @staticmethod
    def _targets(port: int) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            return list(json.load(reply))

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the browser printed."""
        with contextlib.suppress(OSError):
            return " | ".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def _read(self) -> None:
        assert self.ws is not None
        async for raw in self.ws:
            message = json.loads(raw)
            if "id" in message and message["id"] in self._pending:
                future = self._pending.pop(message["id"])
                if not future.done():
                    future.set_result(message)
            elif message.get("method") == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.console.append(f"exception: {details.get('exception', {}).get('description', details)}")

    async def call(self, method: str, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        """Send one DevTools command; its ``result``.

        Raises:
            CDPError: the browser answered with an error.
        """
        assert self.ws is not None
        command_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        await self.ws.send(json.dumps({"id": command_id, "method": method, "params": params}))
        message = await asyncio.wait_for(future, timeout_s)
        if "error" in message:
            raise CDPError(f"{method}: {message['error']}")
        return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited).

        Raises:
            CDPError: the expression threw.
        """
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def open(self, url: str, timeout_s: float = 30.0) -> None:
        """Navigate to ``url`` and wait until the document is loaded."""
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while await self.evaluate("document.readyState + ' ' + location.href") != f"complete {url}":
            if time.monotonic() > deadline:
                raise CDPError(f"{url} did not load in {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def wait_for(self, expression: str, timeout_s: float, what: str = "") -> Any:
        """Poll a JavaScript expression every 50 ms until it is truthy; its value.

        Raises:
            TimeoutError: it stayed falsy for ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never {what or expression} within {timeout_s:g} s")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG of the whole page (``full_page``) or of what the viewport shows at ``path``."""
        result = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))
        return path

    async def close(self) -> None:
        """Close the connection and end the browser (killed after 5 s)."""
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait, 5)
