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
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from speech_to_speech.core.shared import freeze_loaded, limit_malloc_arenas, release_memory, wait_for_threads
from speech_to_speech.realtime.http import CALLS_PATH, CallRefused, HTTPConnection, HTTPRoutes
from speech_to_speech.realtime.protocol import error_event
from speech_to_speech.realtime.service import OriginPolicy, ServiceRoutes
from speech_to_speech.realtime.session import RealtimeSession, SessionLimits
from speech_to_speech.realtime.telemetry import ServerMetrics
from speech_to_speech.realtime.tracing import tracing_from_args
from speech_to_speech.realtime.transport import Transport, WebSocketTransport

logger = logging.getLogger(__name__)

PATH = "/v1/realtime"
#: close code for "server full, try again later" (RFC 6455 registry)
CLOSE_TRY_AGAIN_LATER = 1013
#: close code for "the server is going away" (RFC 6455), after a drain
CLOSE_GOING_AWAY = 1001
#: the ``error`` code a session gets before a draining server closes it
SHUTTING_DOWN = "server_shutting_down"
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
        #: each running session's transport (a drain closes them)
        self.transports: dict[RealtimeSession, Transport] = {}
        self._closers: dict[RealtimeSession, list[Callable[[], None]]] = {}
        try:
            self.origins = OriginPolicy(
                getattr(args, "allowed_origins", ""), tls=bool(getattr(args, "ssl_certfile", ""))
            )
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        self.http = HTTPRoutes(args.api_key, self.create_call, self.hangup, self.origins)
        self.metrics = ServerMetrics(lambda: len(self.calls))
        self.tracing = tracing_from_args(args)  # None unless asked for (then opentelemetry is imported)
        self.service = ServiceRoutes(self.metrics, self.not_ready, serve_metrics=not getattr(args, "metrics_port", 0))
        #: the models are loaded (warm_up ran, or the first session loaded them)
        self.loaded = False
        #: SIGTERM arrived: no new sessions; the active responses finish, then every session is closed
        self.draining = False
        self._drain_requested = False

    def not_ready(self) -> str:
        """Why ``/readyz`` says 503 ("" when ready: models loaded, not draining, below ``--max_sessions``)."""
        if self.draining or self._drain_requested:
            return "draining"
        if not self.loaded:
            return "models not loaded"
        if self._full():
            return f"full ({self.args.max_sessions} sessions)"
        return ""

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
        self.loaded = True

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        response = self.service(getattr(connection, "http_method", "GET"), path)  # health, readiness, metrics
        if response is None:
            response = await self.http(connection, request)  # the page and the calls endpoint
        return response if response is not None else self._check_request(connection, request)

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"the realtime endpoint is {PATH}\n")
        if not self.origins.allows(request):
            self.metrics.refuse("origin")
            return self.origins.refusal(request)
        if self.draining:
            self.metrics.refuse("draining")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down\n")
        key = self.args.api_key
        if key:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
        return None

    def _full(self) -> bool:
        return len(self.sessions) >= self.args.max_sessions

    def _open_session(self, transport: Transport) -> RealtimeSession:
        """A new session for ``transport``, counted at once against ``--max_sessions``, with its
        metrics (and spans, when tracing is on) fed from its events."""
        loop = asyncio.get_running_loop()
        observers: list[Callable[[dict[str, Any]], None]] = []

        def send(event: dict[str, Any]) -> None:
            for observe in observers:
                observe(event)
            transport.send(event)

        session = RealtimeSession(self.args, loop, send, self.limits, media=transport.media)
        metrics = self.metrics.session(transport.kind, session.bus, collect_turns=False)  # the session has one
        observers.append(metrics.on_server_event)
        closers: list[Callable[[], None]] = [metrics.close]
        if self.tracing is not None:
            closers.append(self.tracing.session(session.id, transport.kind, session.bus).close)
        self._closers[session] = closers
        self.sessions.add(session)
        self.transports[session] = transport
        return session

    async def _run_session(
        self, session: RealtimeSession, transport: Transport, first: list[str] | None = None
    ) -> None:
        """Start ``session``, apply the client's messages (``first`` ones first) until the transport ends,
        then close both. The session does not know which transport it has."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, session.start)
            self.loaded = True
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
            self.transports.pop(session, None)
            await loop.run_in_executor(None, session.close)
            await transport.close()
            for close in self._closers.pop(session, []):
                close()
            logger.info("session %s (%s) closed", session.id, transport.kind)
            # the session's objects are reference cycles: free them (and their native memory) once its
            # threads (stages and their helpers, named after it) have ended: one still in a model
            # call may outlive close()'s join
            threads = session_threads(session.id)
            del session
            await loop.run_in_executor(None, wait_for_threads, threads)
            # what those threads handed to this loop last (an event, a response's release) holds
            # the session until it has run, as the executor's finished work item does until its
            # worker drops it: a short pause lets both go before the collection
            await asyncio.sleep(0.05)
            await loop.run_in_executor(None, release_memory)

    async def handle(self, connection: ServerConnection) -> None:
        """Run one WebSocket client's session until it disconnects."""
        transport = WebSocketTransport(connection)
        if self.draining:  # began while this client's handshake was under way
            self.metrics.refuse("draining")
            self.metrics.error(SHUTTING_DOWN)
            transport.send(error_event(SHUTTING_DOWN, "the server is shutting down", kind="server_error"))
            await transport.close(CLOSE_GOING_AWAY, "server shutting down")
            return
        if self._full():
            message = f"the server is full ({self.args.max_sessions} sessions); try again later"
            self.metrics.refuse("max_sessions")
            self.metrics.error("max_sessions_reached")
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
        if self.draining:
            self.metrics.refuse("draining")
            raise CallRefused(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN, "the server is shutting down")
        if self._full():
            self.metrics.refuse("max_sessions")
            raise CallRefused(HTTPStatus.SERVICE_UNAVAILABLE, "max_sessions_reached", full)
        from speech_to_speech.realtime.webrtc import OfferError, WebRTCCall  # aiortc loads with the first call

        try:
            call = await WebRTCCall.answer(offer_sdp)
        except OfferError as exc:
            raise CallRefused(HTTPStatus.BAD_REQUEST, "invalid_offer", str(exc)) from None
        if self._full() or self.draining:  # filled (or draining) while the offer was being answered
            await call.close()
            if self.draining:
                self.metrics.refuse("draining")
                raise CallRefused(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN, "the server is shutting down")
            self.metrics.refuse("max_sessions")
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

    def request_drain(self, stop: asyncio.Future[None]) -> None:
        """SIGTERM: stop taking sessions now (``/readyz`` says 503), then resolve ``stop``; on the
        way out :meth:`drain` lets the active responses finish."""
        self._drain_requested = True
        self.draining = True
        if not stop.done():
            stop.set_result(None)

    async def drain(self, timeout_s: float) -> None:
        """Let every active response finish (at most ``timeout_s``), then send each session an
        ``error`` (:data:`SHUTTING_DOWN`) and close it with 1001 (going away)."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        def busy() -> int:
            return sum(1 for session in list(self.sessions) if session.output.active is not None)

        if busy():
            logger.info("draining: waiting up to %.1f s for %d active response(s)", timeout_s, busy())
        while loop.time() < deadline and busy():
            await asyncio.sleep(0.05)
        if busy():
            logger.warning("draining: %d response(s) still active after %.1f s; closing anyway", busy(), timeout_s)
        await asyncio.sleep(0.2)  # the last response.done events, handed over by the sinks' threads, go out first
        message = "the server is shutting down; reconnect (to another replica)"
        transports = list(self.transports.values())
        for transport in transports:
            self.metrics.error(SHUTTING_DOWN)
            transport.send(error_event(SHUTTING_DOWN, message, kind="server_error"))
        # the error must leave before the connection closes (a WebSocket's close flushes; a data channel may not)
        await asyncio.gather(*(t.flush() for t in transports if hasattr(t, "flush")), return_exceptions=True)
        await asyncio.gather(
            *(transport.close(CLOSE_GOING_AWAY, "server shutting down") for transport in transports),
            return_exceptions=True,
        )
        if self._call_tasks:  # the calls' sessions end once their transports have
            await asyncio.wait(list(self._call_tasks), timeout=SHUTDOWN_GRACE_S)

    async def run(self, ready: asyncio.Event | None = None, stop: asyncio.Future[None] | None = None) -> None:
        """Serve until ``stop`` resolves (or SIGINT/SIGTERM when running in the main thread).

        SIGTERM drains first (:meth:`drain`, up to ``--drain_timeout_s``); SIGINT and ``stop``
        close the sessions at once.
        """
        loop = asyncio.get_running_loop()
        stop = stop or loop.create_future()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, lambda: stop.done() or stop.set_result(None))
            loop.add_signal_handler(signal.SIGTERM, lambda: self.request_drain(stop))
        metrics_server = None
        metrics_port = getattr(self.args, "metrics_port", 0)
        if metrics_port:
            from prometheus_client import start_http_server

            try:
                metrics_server = start_http_server(metrics_port, self.args.host, registry=self.metrics.registry)
            except OSError as exc:
                raise RuntimeError(f"--metrics_port {metrics_port}: {exc}") from None
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
            if self._drain_requested:
                await self.drain(getattr(self.args, "drain_timeout_s", 0.0))
        finally:
            await self._close_calls()
            await self._shutdown(server)
            if metrics_server is not None:
                metrics_server[0].shutdown()
            if self.tracing is not None:
                self.tracing.shutdown()
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
