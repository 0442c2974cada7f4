"""Running the server as a service: origin checks, health and readiness, the metrics endpoint.

- **Origins.** A browser says which page a request comes from (``Origin``). The WebSocket
  handshake and the WebRTC calls routes accept a browser request only from the server's own
  origin (the scheme and the ``Host`` the request was sent to: the page the server serves itself)
  and from ``--allowed_origins`` (comma-separated, e.g. ``https://app.example.com``; ``*`` allows
  any). A request without ``Origin`` (an SDK, a script, ``curl``) is not a browser's and is not
  checked: the API key is what guards those. Refused: HTTP 403.
- **Health.** ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 when the models
  are loaded, the server is not draining and it is below ``--max_sessions``; 503 otherwise (a load
  balancer sends new sessions elsewhere).
- **Metrics.** ``GET /metrics``: Prometheus's text format (:mod:`.telemetry`), on the server's port
  unless ``--metrics_port`` gives it a port of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from websockets.http11 import Request, Response

from speech_to_speech.realtime.http import error_response, response
from speech_to_speech.realtime.telemetry import CONTENT_TYPE, ServerMetrics

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"


def parse_origins(text: str) -> frozenset[str]:
    """``--allowed_origins``: comma-separated origins (``scheme://host[:port]``, or ``*``), normalised.

    Raises:
        ValueError: an entry that is not an origin (one line naming it).
    """
    origins = set()
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        if entry == "*":
            origins.add(entry)
            continue
        parts = urlsplit(entry)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ValueError(f"--allowed_origins: {entry!r} is not an origin like https://app.example.com")
        origins.add(_normal(entry))
    return frozenset(origins)


def _normal(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, the default port left out."""
    parts = urlsplit(origin.strip().lower())
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


class OriginPolicy:
    """Which browser origins may open sessions.

    Args:
        allowed: ``--allowed_origins`` (see :func:`parse_origins`).
        tls: the server serves HTTPS/WSS (its own origin is ``https://``).
    """

    def __init__(self, allowed: str = "", tls: bool = False) -> None:
        self.allowed = parse_origins(allowed)
        self.scheme = "https" if tls else "http"

    def own_origin(self, request: Request) -> str | None:
        """The origin the request was addressed to (scheme and ``Host``), or None without a Host."""
        host = request.headers.get("Host")
        return _normal(f"{self.scheme}://{host}") if host else None

    def allows(self, request: Request) -> bool:
        """No ``Origin`` header, the server's own origin, or one of ``--allowed_origins``."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        if "*" in self.allowed:
            return True
        normal = _normal(origin) if origin.strip().lower() != "null" else "null"
        return normal in self.allowed or normal == self.own_origin(request)

    def cors(self, request: Request) -> dict[str, str]:
        """CORS headers for a calls-route response: the request's origin echoed when it is allowed."""
        headers = {"Access-Control-Expose-Headers": "Location", "Vary": "Origin"}
        origin = request.headers.get("Origin")
        if origin is not None and self.allows(request):
            headers["Access-Control-Allow-Origin"] = origin
        return headers

    def refusal(self, request: Request) -> Response:
        """The 403 for a request from a foreign origin."""
        origin = request.headers.get("Origin", "")
        message = f"origin {origin!r} is not allowed (the server's own origin and --allowed_origins are)"
        return error_response(HTTPStatus.FORBIDDEN, "origin_not_allowed", message, {"Vary": "Origin"})


class ServiceRoutes:
    """``/healthz``, ``/readyz`` and (without ``--metrics_port``) ``/metrics``.

    Args:
        metrics: the server's metrics.
        ready: why the server is not ready ("" when it is: models loaded, not draining, not full).
        serve_metrics: answer ``/metrics`` here (False when it has a port of its own).
    """

    def __init__(self, metrics: ServerMetrics, ready: Callable[[], str], serve_metrics: bool = True) -> None:
        self.metrics = metrics
        self.ready = ready
        self.serve_metrics = serve_metrics

    def __call__(self, method: str, path: str) -> Response | None:
        """The response to ``method path``, or None when it is not one of these routes."""
        if method != "GET":
            return None
        if path == HEALTH_PATH:
            return response(HTTPStatus.OK, "ok\n", headers={"Cache-Control": "no-store"})
        if path == READY_PATH:
            why = self.ready()
            if why:
                return response(
                    HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {why}\n", headers={"Cache-Control": "no-store"}
                )
            return response(HTTPStatus.OK, "ready\n", headers={"Cache-Control": "no-store"})
        if path == METRICS_PATH and self.serve_metrics:
            return response(HTTPStatus.OK, self.metrics.exposition(), CONTENT_TYPE)
        return None
