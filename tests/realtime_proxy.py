"""A WebSocket proxy between a realtime client and the server that checks every server event.

Clients that are not ours (the Agents SDK, Pipecat, LiveKit) parse server events their own
way, often leniently. The proxy forwards every frame unchanged, both ways, and parses each
server event with the openai SDK's server-event union (``RealtimeServerEvent``): an event
that does not validate, or whose type the SDK does not know, is recorded in
:attr:`ValidatingProxy.nonconforming`. Both directions are logged (:attr:`client_events`,
:attr:`server_events`), so a test can assert what a client sent and what it was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pydantic
from openai.types.realtime import RealtimeServerEvent
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

#: the SDK's union of server events, as a validator
SERVER_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RealtimeServerEvent)


def nonconforming_reason(data: dict[str, Any]) -> str | None:
    """Why the server event ``data`` does not validate against the SDK's union (None: it does)."""
    try:
        SERVER_EVENTS.validate_python(data)
    except pydantic.ValidationError as exc:
        return f"{data.get('type')!r}: {exc.errors()[0]}"
    return None


class ValidatingProxy:
    """Serves on 127.0.0.1 (a free port) and relays each connection to ``upstream`` (same path and query).

    Use as ``async with ValidatingProxy("ws://127.0.0.1:PORT") as proxy:``; clients connect to
    :attr:`url` (``ws://127.0.0.1:PROXY_PORT``) or :attr:`http_url`.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.client_events: list[dict[str, Any]] = []
        self.server_events: list[dict[str, Any]] = []
        self.nonconforming: list[str] = []
        self._server: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sent(self, kind: str) -> list[dict[str, Any]]:
        """The client events of type ``kind`` relayed so far."""
        return [e for e in self.client_events if e.get("type") == kind]

    def received(self, kind: str) -> list[dict[str, Any]]:
        """The server events of type ``kind`` relayed so far."""
        return [e for e in self.server_events if e.get("type") == kind]

    async def __aenter__(self) -> ValidatingProxy:
        self._server = await serve(self._relay, "127.0.0.1", 0, max_size=None)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _relay(self, downstream: ServerConnection) -> None:
        path = downstream.request.path if downstream.request is not None else "/"
        headers = {}
        if downstream.request is not None and "Authorization" in downstream.request.headers:
            headers["Authorization"] = downstream.request.headers["Authorization"]
        async with connect(self.upstream + path, additional_headers=headers, max_size=None) as up:

            async def client_to_server() -> None:
                async for frame in downstream:
                    with contextlib.suppress(ValueError):
                        self.client_events.append(json.loads(frame))
                    await up.send(frame)

            async def server_to_client() -> None:
                async for frame in up:
                    data = json.loads(frame)
                    self.server_events.append(data)
                    reason = nonconforming_reason(data)
                    if reason is not None:
                        self.nonconforming.append(reason)
                    await downstream.send(frame)

            tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await asyncio.gather(*tasks)
