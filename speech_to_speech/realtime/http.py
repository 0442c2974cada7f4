"""Plain HTTP on the realtime server's port: the browser page and the WebRTC calls endpoint.

The server is a ``websockets`` server. Its ``process_request`` hook can answer any GET with a plain
HTTP response, which serves the page (``GET /``, ``/app.js``, ``/style.css``; the files ship in
``speech_to_speech/realtime/static/``). But ``websockets`` parses only GET requests without a body,
and the WebRTC flow needs ``POST /v1/realtime/calls`` with the SDP offer as its body. So the
server's connections are :class:`HTTPConnection` objects (``websockets``' documented
``create_connection`` hook): a connection whose first request is a POST (or an OPTIONS preflight)
has its head and body read here, then goes through the same ``process_request`` path as a GET, and
its response is written and the connection closed by ``websockets`` as for any rejected handshake.
Every other connection is ``websockets``' own from the first byte. No second web framework.

Routes (:class:`HTTPRoutes`):

- ``GET /`` (and its assets, the files of ``static/``: ES modules, style sheet, icon): the page;
  no API key needed (the page asks for it).
- ``POST /v1/realtime/calls``: body = SDP offer (``Content-Type: application/sdp``, or the
  ``multipart/form-data`` with ``sdp`` and an optional ``session`` part that the ``openai`` SDK's
  ``realtime.calls.create`` sends); ``Authorization: Bearer KEY`` when the server has ``--api_key``.
  201 with the answer SDP (``application/sdp``) and ``Location: /v1/realtime/calls/{call_id}``.
  Errors are JSON ``{"error": {"type", "code", "message"}}``: 400 bad offer, 401 key, 413 too
  large, 415 content type, 503 server full (``--max_sessions``).
- ``POST /v1/realtime/calls/{call_id}/hangup``: ends the call (204; 404 if unknown).
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from importlib import resources
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

if TYPE_CHECKING:
    from speech_to_speech.realtime.service import OriginPolicy

logger = logging.getLogger(__name__)

#: the WebRTC endpoint: POST an SDP offer here
CALLS_PATH = "/v1/realtime/calls"
#: the page's files by URL path: ``/`` and every file of ``static/`` at ``/NAME`` whose suffix is here
PAGE_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: largest request head read here, bytes
MAX_HEAD_BYTES = 16 * 1024
#: largest request body (an SDP offer is a few KiB), bytes
MAX_BODY_BYTES = 256 * 1024
#: methods read here (every other request goes to websockets as it is)
OWN_METHODS = (b"POST", b"OPTIONS")


class HTTPConnection(ServerConnection):
    """A ``websockets`` server connection that also reads HTTP requests with a body (POST, OPTIONS).

    For such a request, :attr:`http_method`, :attr:`request` (path and headers) and
    :attr:`http_body` are set once it is complete, and ``process_request`` answers it.
    :attr:`http_error` is set instead when it cannot be read (too large, no length).
    """

    http_method = "GET"
    http_body = b""
    http_error: tuple[HTTPStatus, str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._own: bool | None = None  # None: undecided; True: read here; False: websockets'
        self._data = bytearray()
        self._body_size = 0

    def data_received(self, data: bytes) -> None:
        if self._own is False:
            super().data_received(data)
            return
        if self._own and self.request is not None:
            return  # after a complete request: ignored (one request per connection)
        self._data += data
        if self._own is None:
            method, space, _ = bytes(self._data[:16]).partition(b" ")
            if not space and len(self._data) < 16:
                return  # not enough to decide
            if method not in OWN_METHODS:
                self._own = False
                buffered, self._data = bytes(self._data), bytearray()
                super().data_received(buffered)
                return
            self._own = True
            self.http_method = method.decode()
        self._read_request()

    def _read_request(self) -> None:
        end = self._data.find(b"\r\n\r\n")
        if end < 0:
            if len(self._data) > MAX_HEAD_BYTES:
                self._complete("/", Headers(), HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
            return
        head = bytes(self._data[:end]).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        parts = request_line.split(" ")
        path = parts[1] if len(parts) == 3 else "/"
        headers = Headers()
        for line in header_lines:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip()] = value.strip()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._complete(path, headers, HTTPStatus.BAD_REQUEST, "malformed request line")
            return
        if "Transfer-Encoding" in headers:
            self._complete(path, headers, HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not chunks")
            return
        try:
            length = int(headers.get("Content-Length", "0"))
        except ValueError:
            self._complete(path, headers, HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
            return
        if length > MAX_BODY_BYTES or length < 0:
            too_large = f"the body is over {MAX_BODY_BYTES} bytes"
            self._complete(path, headers, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large)
            return
        body = self._data[end + 4 :]
        if len(body) >= length:
            self.http_body = bytes(body[:length])
            self._complete(path, headers)

    def _complete(self, path: str, headers: Headers, status: HTTPStatus | None = None, why: str = "") -> None:
        """The request is read (or cannot be): hand it to the handshake as websockets would."""
        if status is not None:
            self.http_error = (status, why)
        self._data = bytearray()
        self.request = Request(path, headers)
        if not self.request_rcvd.done():
            self.request_rcvd.set_result(None)


def response(
    status: HTTPStatus,
    body: bytes | str = b"",
    content_type: str = "text/plain; charset=utf-8",
    headers: dict[str, str] | None = None,
) -> Response:
    """A complete HTTP response (the connection closes after it)."""
    data = body.encode() if isinstance(body, str) else body
    fields = Headers(
        [("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close"), ("Content-Length", str(len(data)))]
    )
    if data or status != HTTPStatus.NO_CONTENT:
        fields["Content-Type"] = content_type
    for name, value in (headers or {}).items():
        fields[name] = value
    return Response(status.value, status.phrase, fields, data)


def error_response(status: HTTPStatus, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """An OpenAI-style JSON error: ``{"error": {"type", "code", "message"}}``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps({"error": {"type": kind, "code": code, "message": message}})
    return response(status, body, "application/json", {**CORS, **(headers or {})})


#: CORS headers of every calls-route response; ``Access-Control-Allow-Origin`` is added for an
#: allowed origin only (:meth:`~speech_to_speech.realtime.service.OriginPolicy.cors`)
CORS = {"Access-Control-Expose-Headers": "Location", "Vary": "Origin"}


def page_file(name: str) -> bytes:
    """The bytes of one of the page's files (``static/NAME`` in this package)."""
    return resources.files("speech_to_speech.realtime").joinpath("static", name).read_bytes()


def page_route(path: str) -> tuple[str, str] | None:
    """The file of ``static/`` (and its content type) served at URL ``path``, or None.

    ``/`` is ``index.html``; ``/NAME`` is ``static/NAME`` when NAME is a plain file name (no folder)
    with a suffix of :data:`PAGE_TYPES`.
    """
    name = "index.html" if path == "/" else path[1:]
    suffix = "." + name.rpartition(".")[2]
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in PAGE_TYPES:
        return None
    if not resources.files("speech_to_speech.realtime").joinpath("static", name).is_file():
        return None
    return name, PAGE_TYPES[suffix]


def is_websocket(request: Request) -> bool:
    """The request asks for a WebSocket upgrade."""
    return "websocket" in request.headers.get("Upgrade", "").lower()


class CallRefused(Exception):
    """A call that cannot be placed now: HTTP ``status`` with ``code`` and ``message``."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


#: ``create_call(offer_sdp, session) -> (call_id, answer_sdp)``; raises CallRefused
CreateCall = Callable[[str, "dict[str, Any] | None"], Awaitable[tuple[str, str]]]
#: ``hangup(call_id) -> whether the call existed``
Hangup = Callable[[str], Awaitable[bool]]


def parse_offer(content_type: str, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer (and the optional ``session`` config of a multipart body) of a calls POST.

    Raises:
        CallRefused: 415 for another content type, 400 for a body without an offer.
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/sdp":
        return body.decode("utf-8", "replace"), None
    if kind == "multipart/form-data":
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        parts = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        if "sdp" not in parts:
            raise CallRefused(HTTPStatus.BAD_REQUEST, "invalid_offer", "the form has no 'sdp' part")
        sdp = parts["sdp"].get_payload(decode=True).decode("utf-8", "replace")
        session = None
        if "session" in parts:
            try:
                session = json.loads(parts["session"].get_payload(decode=True))
            except ValueError:
                raise CallRefused(HTTPStatus.BAD_REQUEST, "invalid_session", "'session' is not JSON") from None
            if not isinstance(session, dict):
                raise CallRefused(HTTPStatus.BAD_REQUEST, "invalid_session", "'session' must be an object")
        return sdp, session
    raise CallRefused(
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_content_type", "send the SDP offer as application/sdp"
    )


class HTTPRoutes:
    """Answers the plain HTTP requests of the server (the page, the calls endpoint).

    Args:
        api_key: the server's ``--api_key`` ("" for none).
        create_call: places a call (see :data:`CreateCall`).
        hangup: ends one (see :data:`Hangup`).
        origins: which browser origins may use the calls routes (None: any).
    """

    def __init__(
        self, api_key: str, create_call: CreateCall, hangup: Hangup, origins: OriginPolicy | None = None
    ) -> None:
        self.api_key = api_key
        self.create_call = create_call
        self.hangup = hangup
        self.origins = origins

    def authorized(self, request: Request) -> bool:
        """The request carries ``Authorization: Bearer KEY`` (compared in constant time), or no key is set."""
        if not self.api_key:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode())

    async def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        """The response to a plain HTTP request, or None for a request that is websockets' (an upgrade)."""
        method = getattr(connection, "http_method", "GET")
        path = request.path.split("?", 1)[0]
        error = getattr(connection, "http_error", None)
        if error is not None:
            status, why = error
            return error_response(status, "invalid_request", why)
        if method == "GET":
            route = None if is_websocket(request) else page_route(path)
            if route is not None:
                name, content_type = route
                return response(HTTPStatus.OK, page_file(name), content_type, {"Cache-Control": "no-cache"})
            return None
        cors = self.origins.cors(request) if self.origins is not None else {**CORS, "Access-Control-Allow-Origin": "*"}
        if self.origins is not None and not self.origins.allows(request):
            return self.origins.refusal(request)  # a page of a foreign origin: 403, preflight included
        if method == "OPTIONS":  # CORS preflight of a page served from an allowed origin
            return response(
                HTTPStatus.NO_CONTENT,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "POST, OPTIONS",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type",
                    "Access-Control-Max-Age": "600",
                },
            )
        if not path.startswith(CALLS_PATH):
            return error_response(HTTPStatus.NOT_FOUND, "not_found", f"POST an SDP offer to {CALLS_PATH}", cors)
        if not self.authorized(request):
            return error_response(HTTPStatus.UNAUTHORIZED, "invalid_api_key", "missing or wrong API key", cors)
        body = getattr(connection, "http_body", b"")
        try:
            if path == CALLS_PATH:
                offer, session = parse_offer(request.headers.get("Content-Type", ""), body)
                call_id, answer = await self.create_call(offer, session)
                headers = {**cors, "Location": f"{CALLS_PATH}/{call_id}"}
                return response(HTTPStatus.CREATED, answer, "application/sdp", headers)
            call_id, _, action = path[len(CALLS_PATH) + 1 :].partition("/")
            if action == "hangup" and call_id:
                if await self.hangup(call_id):
                    return response(HTTPStatus.NO_CONTENT, headers=cors)
                return error_response(HTTPStatus.NOT_FOUND, "call_not_found", f"no call {call_id!r}", cors)
            return error_response(HTTPStatus.NOT_FOUND, "not_found", f"POST an SDP offer to {CALLS_PATH}", cors)
        except CallRefused as exc:
            return error_response(exc.status, exc.code, exc.message, cors)
