"""A tiny OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` bodies decoded with ``opentelemetry-proto``."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OTLPReceiver(ThreadingHTTPServer):
    """Accepts OTLP/HTTP protobuf exports on 127.0.0.1 (a free port), in a daemon thread.

    Use as a context manager. :attr:`requests` holds each decoded export, :attr:`paths` the paths posted to.
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """The value for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def spans(self) -> list[tuple[str, dict[str, Any], set[str]]]:
        """Every span received: (name, attributes, the resource's service names)."""
        out = []
        for request in list(self.requests):
            for resource_spans in request.resource_spans:
                services = {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                        out.append((span.name, attributes, services))
        return out

    def wait_for(self, name: str, timeout_s: float = 30.0) -> list[tuple[str, dict[str, Any], set[str]]]:
        """Wait until a span called ``name`` arrived; every span received then."""
        deadline = time.monotonic() + timeout_s
        while not any(span[0] == name for span in self.spans()):
            assert time.monotonic() < deadline, f"no {name!r} span arrived: {self.spans()}"
            time.sleep(0.05)
        return self.spans()


class _Handler(BaseHTTPRequestHandler):
    server: OTLPReceiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.paths.append(self.path)
        self.server.requests.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
