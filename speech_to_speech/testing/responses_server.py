"""A small scriptable OpenAI Responses API server for tests (stdlib only).

It also answers ``POST /v1/chat/completions`` with the script's reply, its text then its calls
as ``tool_calls`` (one ``chat.completion``, or ``chat.completion.chunk`` SSE events when
streamed), enough to drive the ``chat-completions`` backend.

It serves ``POST /v1/responses`` on loopback, either as one JSON ``Response`` object
(``stream`` false) or as a Server-Sent Events stream in the real Responses format
(``response.created`` … ``response.output_text.delta`` … ``response.completed``), sent
with chunked transfer encoding like a real HTTP/1.1 server.

Each request plays one :class:`Reply` from the script set with
:meth:`ResponsesServer.script`; the last reply is repeated for later requests (the
SDK retries some failures). Every request is recorded (:attr:`ResponsesServer.requests`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Text:
    """An assistant message output item, streamed as the given text deltas."""

    chunks: list[str]

    @property
    def text(self) -> str:
        """The whole text of the message."""
        return "".join(self.chunks)


@dataclass
class Call:
    """A function_call output item; ``call_id`` is the server's own id."""

    name: str
    arguments: str = "{}"
    call_id: str = field(default_factory=lambda: f"call_srv_{uuid.uuid4().hex[:12]}")


@dataclass
class Reply:
    """What the server does for one request.

    Attributes:
        output: output items, in order.
        status: HTTP status; anything but 200 sends a JSON error body instead.
        terminal: the last streamed event: ``response.completed``, ``response.incomplete``
            or ``response.failed`` (also the non-streaming response's status).
        usage: ``(input_tokens, output_tokens)``, or None for no usage.
        delay_s: seconds to wait before answering (or, with ``delay_at``, mid-stream).
        delay_at: None waits before the response headers; an int waits after that many
            streamed events.
        cut_after: close the connection after this many streamed events, without the
            terminal chunk (a truncated body).
        garbage_after: send a data line that is not JSON after this many streamed events.
    """

    output: list[Text | Call] = field(default_factory=list)
    status: int = 200
    terminal: str = "response.completed"
    usage: tuple[int, int] | None = (21, 9)
    delay_s: float = 0.0
    delay_at: int | None = None
    cut_after: int | None = None
    garbage_after: int | None = None


#: a long reply (five sentences): there is time to talk over it
STORY_REPLY = Reply(
    [
        Text(
            [
                "Once upon a time there was a small village by the sea. ",
                "Every morning the fishermen rowed out before the sun came up. ",
                "They sang old songs while they pulled their nets. ",
                "In the evening the whole village gathered by the fire to share the catch. ",
                "The children listened to stories until they fell asleep.",
            ]
        )
    ]
)


@dataclass
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any]


def _usage(reply: Reply) -> dict[str, Any] | None:
    """The Responses ``usage`` object of ``reply``."""
    if reply.usage is None:
        return None
    input_tokens, output_tokens = reply.usage
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _message_item(item_id: str, text: str | None) -> dict[str, Any]:
    """A message output item; ``text`` None means in progress (no content yet)."""
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    status = "in_progress" if text is None else "completed"
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call: Call, done: bool) -> dict[str, Any]:
    """A function_call output item (arguments empty until done)."""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments if done else "",
        "status": "completed" if done else "in_progress",
    }


def _response(
    body: dict[str, Any], reply: Reply, response_id: str, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """A Responses API ``Response`` object."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": body.get("model", ""),
        "instructions": body.get("instructions"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools", []),
        "temperature": body.get("temperature"),
        "top_p": 1.0,
        "max_output_tokens": body.get("max_output_tokens"),
        "error": {"code": "server_error", "message": "scripted failure"} if status == "failed" else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "metadata": {},
        "usage": _usage(reply) if status != "in_progress" else None,
    }


def build_output(reply: Reply) -> list[dict[str, Any]]:
    """The completed output items of ``reply`` (ids are fresh)."""
    items: list[dict[str, Any]] = []
    for part in reply.output:
        if isinstance(part, Text):
            items.append(_message_item(f"msg_{uuid.uuid4().hex[:16]}", part.text))
        else:
            items.append(_call_item(f"fc_{uuid.uuid4().hex[:16]}", part, done=True))
    return items


def build_events(body: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
    """The streamed events of ``reply``, in the shapes of ``openai.types.responses``."""
    response_id = f"resp_{uuid.uuid4().hex[:16]}"
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    emit("response.created", response=_response(body, reply, response_id, "in_progress", []))
    emit("response.in_progress", response=_response(body, reply, response_id, "in_progress", []))
    done: list[dict[str, Any]] = []
    for index, part in enumerate(reply.output):
        if isinstance(part, Text):
            item_id = f"msg_{uuid.uuid4().hex[:16]}"
            empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            full_part = {"type": "output_text", "text": part.text, "annotations": [], "logprobs": []}
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            emit("response.output_item.added", output_index=index, item=_message_item(item_id, None))
            emit("response.content_part.added", part=empty_part, **where)
            for chunk in part.chunks:
                emit("response.output_text.delta", delta=chunk, logprobs=[], **where)
            emit("response.output_text.done", text=part.text, logprobs=[], **where)
            emit("response.content_part.done", part=full_part, **where)
            item = _message_item(item_id, part.text)
        else:
            item_id = f"fc_{uuid.uuid4().hex[:16]}"
            emit("response.output_item.added", output_index=index, item=_call_item(item_id, part, done=False))
            emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=part.arguments)
            emit(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=part.name,
                arguments=part.arguments,
            )
            item = _call_item(item_id, part, done=True)
        emit("response.output_item.done", output_index=index, item=item)
        done.append(item)
    status = reply.terminal.removeprefix("response.")
    emit(reply.terminal, response=_response(body, reply, response_id, status, done))
    return events


class _Handler(BaseHTTPRequestHandler):
    """Plays the server's script for each POST /v1/responses."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw or b"{}")
        owner = self.server.owner
        owner.requests.append(RecordedRequest("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if self.path.rstrip("/").endswith("/chat/completions"):
            self._chat_completion(body, owner.next_reply())
            return
        if not self.path.rstrip("/").endswith("/responses"):
            self._send_json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        reply = owner.next_reply()
        try:
            if reply.delay_at is None and reply.delay_s:
                owner.released.wait(reply.delay_s)
            if reply.status != 200:
                error = {"error": {"message": "scripted server error", "type": "server_error", "code": None}}
                self._send_json(reply.status, error, {"retry-after-ms": "10"})
            elif body.get("stream"):
                self._stream(body, reply)
            else:
                status = reply.terminal.removeprefix("response.")
                response = _response(body, reply, f"resp_{uuid.uuid4().hex[:16]}", status, build_output(reply))
                self._send_json(200, response)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (e.g. its timeout)

    def _chat_completion(self, body: dict[str, Any], reply: Reply) -> None:
        """The reply as a Chat Completions answer: its text, then its calls as ``tool_calls`` (one
        ``chat.completion``, or ``chat.completion.chunk`` SSE events when streamed: the text deltas,
        then each call's name and its arguments, then the finish reason and, when asked, the usage)."""
        texts = [chunk for item in reply.output if isinstance(item, Text) for chunk in item.chunks]
        calls = [item for item in reply.output if isinstance(item, Call)]
        finish = "tool_calls" if calls else "length" if reply.terminal == "response.incomplete" else "stop"
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": body.get("model")}
        prompt, completion = reply.usage or (0, 0)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                message["tool_calls"] = [
                    {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            choice = {"index": 0, "message": message, "finish_reason": finish}
            self._send_json(200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}, *({"content": t} for t in texts)]
        for index, call in enumerate(calls):
            named = {"index": index, "id": call.call_id, "type": "function"}
            deltas.append({"tool_calls": [{**named, "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
        chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage") and reply.usage is not None:
            chunks.append({"choices": [], "usage": usage})
        for chunk in chunks:
            data = json.dumps({**base, "object": "chat.completion.chunk", **chunk})
            self._chunk(f"data: {data}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for count, event in enumerate(build_events(body, reply)):
            if count == reply.delay_at and reply.delay_s:
                self.server.owner.released.wait(reply.delay_s)
            if count == reply.garbage_after:
                self._chunk(b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", "del\n\n')
            if count == reply.cut_after:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        self._chunk(b"")  # the terminal chunk


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ResponsesServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up is not a test failure


class ResponsesServer:
    """A scriptable /v1/responses server on 127.0.0.1 (a free port), in a thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Attributes:
        requests: every request received, in order.
        released: set by :meth:`stop` to end any scripted delay at once.
    """

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.released = threading.Event()
        self._replies: list[Reply] = [Reply([Text(["Hello."])])]
        self._served = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="responses-server", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this server (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, *replies: Reply) -> None:
        """Play ``replies`` for the next requests (the last one repeats); forget old requests."""
        with self._lock:
            self._replies = list(replies)
            self._served = 0
            self.requests.clear()

    def next_reply(self) -> Reply:
        """The reply for the request being served."""
        with self._lock:
            reply = self._replies[min(self._served, len(self._replies) - 1)]
            self._served += 1
            return reply

    def start(self) -> ResponsesServer:
        """Start serving in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release any delayed request."""
        self.released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ResponsesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
