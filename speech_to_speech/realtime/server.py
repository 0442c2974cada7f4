"""The realtime server: the OpenAI Realtime protocol over WebSocket (``/v1/realtime``) and WebRTC.

Models load once, at start, and are shared by every session (see
:mod:`speech_to_speech.core.shared`); each client gets its own
:class:`~speech_to_speech.realtime.session.RealtimeSession` (pipeline threads,
history, turn state), whatever its transport (:mod:`~speech_to_speech.realtime.transport`):
a WebSocket, or a WebRTC call placed by ``POST /v1/realtime/calls``
(:mod:`~speech_to_speech.realtime.webrtc`). The same port serves the browser page at ``/``
(:mod:`~speech_to_speech.realtime.http`). The asyncio side only parses, validates and writes
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
import ssl
import threading
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from speech_to_speech.core.shared import freeze_loaded, limit_malloc_arenas, release_memory
from speech_to_speech.realtime.http import CALLS_PATH, CallRefused, HTTPConnection, HTTPRoutes
from speech_to_speech.realtime.protocol import error_event
from speech_to_speech.realtime.session import RealtimeSession, SessionLimits
from speech_to_speech.realtime.transport import Transport, WebSocketTransport

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
        #: WebRTC calls by id (while their session runs), and the tasks that run them
        self.calls: dict[str, Any] = {}
        self._call_tasks: set[asyncio.Task[None]] = set()
        self.http = HTTPRoutes(args.api_key, self.create_call, self.hangup)

    def warm_up(self, stop: threading.Event | None = None) -> None:
        """Load every model once (shared later by all sessions), in the calling thread.

        Raises:
            RuntimeError: a stage failed to load, or ``stop`` was set while loading.
        """
        limit_malloc_arenas()  # before the stage threads allocate (see shared.py)
        loop = asyncio.new_event_loop()
        try:
            session = RealtimeSession(self.args, loop, lambda event: None, self.limits)
            session.start(stop)
            session.close()
            threads = session_threads(session.id)
            del session
        finally:
            loop.close()
        release_memory(threads)  # the warm-up session must be gone before the freeze
        freeze_loaded()  # later collections scan only what sessions create (see shared.py)

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        response = await self.http(connection, request)  # the page and the calls endpoint
        return response if response is not None else self._check_request(connection, request)

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

    def _full(self) -> bool:
        return len(self.sessions) >= self.args.max_sessions

    def _open_session(self, transport: Transport) -> RealtimeSession:
        """A new session for ``transport``, counted at once against ``--max_sessions``."""
        loop = asyncio.get_running_loop()
        session = RealtimeSession(self.args, loop, transport.send, self.limits, media=transport.media)
        self.sessions.add(session)
        return session

    async def _run_session(
        self, session: RealtimeSession, transport: Transport, first: list[str] | None = None
    ) -> None:
        """Start ``session``, apply the client's messages (``first`` ones first) until the transport ends,
        then close both. The session does not know which transport it has."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, session.start)
            transport.attach(session.feed_audio)
            for message in first or []:
                session.handle(message)
            async for message in transport.messages():
                if isinstance(message, str) and '"input_image"' in message:
                    # decoding an image takes up to a few hundred ms: not on the loop other sessions share
                    await loop.run_in_executor(None, session.images.check_ahead, message)
                session.handle(message)
        except RuntimeError as exc:  # a stage could not start
            logger.error("session %s failed to start: %s", session.id, exc)
            transport.send(error_event("server_error", str(exc), kind="server_error"))
        finally:
            self.sessions.discard(session)
            await loop.run_in_executor(None, session.close)
            await transport.close()
            logger.info("session %s (%s) closed", session.id, transport.kind)
            # the session's objects are reference cycles: free them (and their native memory) once its
            # threads (stages and their helpers, named after it) have ended: one still in a model
            # call may outlive close()'s join
            threads = session_threads(session.id)
            del session
            await loop.run_in_executor(None, release_memory, threads)

    async def handle(self, connection: ServerConnection) -> None:
        """Run one WebSocket client's session until it disconnects."""
        transport = WebSocketTransport(connection)
        if self._full():
            message = f"the server is full ({self.args.max_sessions} sessions); try again later"
            transport.send(error_event("max_sessions_reached", message))
            await transport.close(CLOSE_TRY_AGAIN_LATER, "server full")
            return
        await self._run_session(self._open_session(transport), transport)

    async def create_call(self, offer_sdp: str, session_config: dict[str, Any] | None) -> tuple[str, str]:
        """``POST /v1/realtime/calls``: answer a WebRTC offer and start the call's session.

        ``session_config`` (the ``session`` part of a multipart offer, as the ``openai`` SDK sends
        it) is applied as a ``session.update`` once the session has started.

        Returns:
            the call id and the answer SDP.

        Raises:
            CallRefused: the server is full (503) or the offer cannot be answered (400).
        """
        full = f"the server is full ({self.args.max_sessions} sessions); try again later"
        if self._full():
            raise CallRefused(HTTPStatus.SERVICE_UNAVAILABLE, "max_sessions_reached", full)
        from speech_to_speech.realtime.webrtc import OfferError, WebRTCCall  # aiortc loads with the first call

        try:
            call = await WebRTCCall.answer(offer_sdp)
        except OfferError as exc:
            raise CallRefused(HTTPStatus.BAD_REQUEST, "invalid_offer", str(exc)) from None
        if self._full():  # filled while the offer was being answered
            await call.close()
            raise CallRefused(HTTPStatus.SERVICE_UNAVAILABLE, "max_sessions_reached", full)
        session = self._open_session(call)
        first = [json.dumps({"type": "session.update", "session": session_config})] if session_config else []
        self.calls[call.id] = call
        task = asyncio.create_task(self._run_session(session, call, first))
        self._call_tasks.add(task)

        def ended(_: asyncio.Task[None]) -> None:
            self._call_tasks.discard(task)
            self.calls.pop(call.id, None)

        task.add_done_callback(ended)
        logger.info("call %s: session %s", call.id, session.id)
        return call.id, call.answer_sdp

    async def hangup(self, call_id: str) -> bool:
        """``POST /v1/realtime/calls/{id}/hangup``: end that call; False if there is none."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        await call.close(reason="hung up")
        return True

    async def run(self, ready: asyncio.Event | None = None, stop: asyncio.Future[None] | None = None) -> None:
        """Serve until ``stop`` resolves (or SIGINT/SIGTERM when running in the main thread)."""
        loop = asyncio.get_running_loop()
        stop = stop or loop.create_future()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        max_size = self.args.max_message_kb * 1024
        context = ssl_context(self.args)
        server = await serve(
            self.handle,
            self.args.host,
            self.args.port,
            process_request=self._process_request,
            max_size=max_size,
            create_connection=HTTPConnection,  # also reads POST requests (the WebRTC calls)
            ssl=context,
        )
        self._server = server
        try:
            port = server.sockets[0].getsockname()[1] if server.sockets else self.args.port
            self.port = port
            ws, web = ("wss", "https") if context is not None else ("ws", "http")
            print(f"realtime server listening on {ws}://{self.args.host}:{port}{PATH}", flush=True)
            print(f"browser page: {web}://{self.args.host}:{port}/ (WebRTC calls: POST {CALLS_PATH})", flush=True)
            if ready is not None:
                ready.set()
            await stop
        finally:
            await self._close_calls()
            await self._shutdown(server)
        logger.info("server stopped")

    async def _close_calls(self) -> None:
        """End every WebRTC call and wait (at most :data:`SHUTDOWN_GRACE_S`) for its session to close."""
        for call in list(self.calls.values()):
            with contextlib.suppress(Exception):
                await call.close(reason="server stopping")
        if self._call_tasks:
            await asyncio.wait(list(self._call_tasks), timeout=SHUTDOWN_GRACE_S)

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
        except TimeoutError:
            tasks = [task for task in handler_tasks(server) if not task.done()]
            logger.warning("%d connection(s) still open after %.1f s; dropping them", len(tasks), SHUTDOWN_GRACE_S)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=0.2)


def ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context of ``--ssl_certfile``/``--ssl_keyfile`` (None without a certificate).

    Raises:
        RuntimeError: a key without a certificate, or files that cannot be loaded.
    """
    certfile, keyfile = getattr(args, "ssl_certfile", ""), getattr(args, "ssl_keyfile", "")
    if not certfile:
        if keyfile:
            raise RuntimeError("--ssl_keyfile needs --ssl_certfile")
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile or None)
    except (OSError, ssl.SSLError) as exc:
        raise RuntimeError(f"cannot load the TLS certificate {certfile} (key: {keyfile or 'in it'}): {exc}") from None
    return context


def session_threads(session_id: str) -> set[int]:
    """Idents of the alive threads of a session (its stages and their helpers are named after it)."""
    prefix = f"{session_id}:"
    return {t.ident for t in threading.enumerate() if t.name.startswith(prefix) and t.ident is not None}


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
    ssl_context(args)  # a bad certificate fails before the models load
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
