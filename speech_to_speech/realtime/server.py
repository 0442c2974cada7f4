"""The realtime server: WebSocket at ``/v1/realtime`` speaking the OpenAI Realtime protocol.

Models load once, at start, and are shared by every session (see
:mod:`speech_to_speech.shared`); each connection gets its own
:class:`~speech_to_speech.realtime.session.RealtimeSession` (pipeline threads,
history, turn state). The asyncio side only parses, validates and writes
frames; all model work runs in the sessions' threads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import signal
import threading
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from speech_to_speech.realtime.protocol import error_event
from speech_to_speech.realtime.session import RealtimeSession, SessionLimits

logger = logging.getLogger(__name__)

PATH = "/v1/realtime"
#: close code for "server full, try again later" (RFC 6455 registry)
CLOSE_TRY_AGAIN_LATER = 1013
#: seconds a stopping server waits for its clients' connections to close before dropping them
SHUTDOWN_GRACE_S = 1.0


class RealtimeServer:
    """Accepts clients, enforces limits, and runs one session per connection.

    Args:
        args: parsed command line (``--host``, ``--port``, ``--max_sessions``,
            ``--api_key``, ``--max_message_kb``, backends and their settings).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sessions: set[RealtimeSession] = set()
        self.limits = SessionLimits()
        self._server: Server | None = None

    def warm_up(self, stop: threading.Event | None = None) -> None:
        """Load every model once (shared later by all sessions), in the calling thread.

        Raises:
            RuntimeError: a stage failed to load, or ``stop`` was set while loading.
        """
        loop = asyncio.new_event_loop()
        try:
            session = RealtimeSession(self.args, loop, lambda event: None, self.limits)
            session.start(stop)
            session.close()
        finally:
            loop.close()

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"the realtime endpoint is {PATH}\n")
        key = self.args.api_key
        if key:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
        return None

    async def handle(self, connection: ServerConnection) -> None:
        """Run one client session until it disconnects."""
        loop = asyncio.get_running_loop()
        if len(self.sessions) >= self.args.max_sessions:
            message = f"the server is full ({self.args.max_sessions} sessions); try again later"
            await connection.send(json.dumps(error_event("max_sessions_reached", message)))
            await connection.close(CLOSE_TRY_AGAIN_LATER, "server full")
            return
        outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        session = RealtimeSession(self.args, loop, outbox.put_nowait, self.limits)
        self.sessions.add(session)
        sender = asyncio.create_task(self._pump(connection, outbox))
        try:
            await loop.run_in_executor(None, session.start)
            async for message in connection:
                session.handle(message)
        except ConnectionClosed:
            pass
        except RuntimeError as exc:  # a stage could not start
            logger.error("session %s failed to start: %s", session.id, exc)
            with contextlib.suppress(ConnectionClosed):
                await connection.send(json.dumps(error_event("server_error", str(exc), kind="server_error")))
        finally:
            self.sessions.discard(session)
            await loop.run_in_executor(None, session.close)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            logger.info("session %s closed", session.id)

    @staticmethod
    async def _pump(connection: ServerConnection, outbox: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            event = await outbox.get()
            try:
                await connection.send(json.dumps(event))
            except ConnectionClosed:
                return

    async def run(self, ready: asyncio.Event | None = None, stop: asyncio.Future[None] | None = None) -> None:
        """Serve until ``stop`` resolves (or SIGINT/SIGTERM when running in the main thread)."""
        loop = asyncio.get_running_loop()
        stop = stop or loop.create_future()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        max_size = self.args.max_message_kb * 1024
        server = await serve(
            self.handle, self.args.host, self.args.port, process_request=self._check_request, max_size=max_size
        )
        self._server = server
        try:
            port = server.sockets[0].getsockname()[1] if server.sockets else self.args.port
            self.port = port
            print(f"realtime server listening on ws://{self.args.host}:{port}{PATH}", flush=True)
            if ready is not None:
                ready.set()
            await stop
        finally:
            await self._shutdown(server)
        logger.info("server stopped")

    @staticmethod
    async def _shutdown(server: Server) -> None:
        """Stop listening, close every connection (1001 going away; 503 to one still in its
        opening handshake) and wait for them at most :data:`SHUTDOWN_GRACE_S` seconds.

        A client that does not answer in time (one that opened a TCP connection and
        never sent its handshake would otherwise hold the server for the 10 s open
        timeout) has its connection handler cancelled.
        """
        server.close()
        try:
            await asyncio.wait_for(asyncio.shield(server.wait_closed()), SHUTDOWN_GRACE_S)
        except asyncio.TimeoutError:
            tasks = [task for task in handler_tasks(server) if not task.done()]
            logger.warning("%d connection(s) still open after %.1f s; dropping them", len(tasks), SHUTDOWN_GRACE_S)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=0.2)


def handler_tasks(server: Server) -> list[asyncio.Task[None]]:
    """The connection handler tasks of ``server`` (``handler_tasks`` in websockets 17, ``handlers`` before)."""
    tasks = getattr(server, "handler_tasks", None)
    if tasks is None:
        tasks = server.handlers.values()  # websockets < 17 (openai-agents pins websockets < 17)
    return list(tasks)


def run_server(args: argparse.Namespace) -> None:
    """Load the models, then serve until SIGINT/SIGTERM (also honoured while loading).

    Raises:
        RuntimeError: a model failed to load, or the process was signalled while loading.
    """
    server = RealtimeServer(args)
    print("loading models ...", flush=True)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.warm_up(stop)
        if stop.is_set():  # signalled after the last model was ready
            raise RuntimeError("stopped while loading models")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _run_until_stopped(server)


def _run_until_stopped(server: RealtimeServer) -> None:
    """Run ``server`` on a new event loop; on the way out, do not wait for executor threads.

    Unlike :func:`asyncio.run`, which joins the default executor's threads, this
    leaves a session still closing in a worker thread (its stages are daemon
    threads, joined for at most 2 s) to the process exit, so a stop stays within
    its time budget.
    """
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(server.run())
    finally:
        try:
            leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in leftovers:
                task.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.wait(leftovers, timeout=0.2))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts the default executor down without waiting
