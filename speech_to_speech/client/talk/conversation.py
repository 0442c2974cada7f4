"""One Realtime conversation as the terminal client holds it: the session.update it sends, and
the handling of every server event it acts on (transcripts, audio, barge-in, tool calls and their
follow-up ``response.create``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from speech_to_speech.client.realtime import RealtimeClient, decode_pcm16, session_update
from speech_to_speech.client.talk.audio import AudioSink
from speech_to_speech.client.talk.console import Console, TranscriptLog
from speech_to_speech.client.talk.tools import TOOL_TIMEOUT_S, ToolModule, call_tool

#: follow-up responses in a row that may call tools again before the client stops asking
MAX_TOOL_ROUNDS = 8
#: characters of a tool result shown on the console
TOOL_PRINT_CHARS = 300


@dataclass
class _ToolRound:
    """The tool calls of one response: outputs still being computed, and whether a follow-up is due."""

    pending: set[str]
    done: bool = False  # response.done arrived
    follow_up: bool = False  # the response completed for the current turn: ask for the follow-up


def build_session_update(args: argparse.Namespace, tools: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``session.update`` event for the command-line options (with ``tools``, tool_choice "auto")."""
    return session_update(
        None if args.no_vad else {"type": "server_vad", "interrupt_response": True},
        instructions=args.instructions,
        voice=args.voice,
        transcription_model=args.transcription_model,
        tools=tools,
    )


class Conversation:
    """One Realtime conversation over an open connection: sends input, handles server events.

    Turn bookkeeping: ``awaiting_reply`` is set when the user starts speaking (server VAD) or the
    client sends ``response.create``, and cleared by the ``response.done`` of a response created
    after the latest ``speech_started``, once the user has stopped speaking (unless that response
    called tools of ``tools``: then the follow-up ``response.create`` keeps it set).

    With ``tools``, each function call runs in its own task (at most ``tool_timeout_s`` seconds)
    and its output is sent as soon as it is ready; the follow-up ``response.create`` goes out
    once the calling response is done and all of its calls have their outputs.
    """

    def __init__(
        self,
        connection: RealtimeClient,
        sink: AudioSink,
        console: Console,
        log: TranscriptLog,
        *,
        exact_timeline: bool = False,
        verbose: bool = False,
        tools: ToolModule | None = None,
        tool_timeout_s: float = TOOL_TIMEOUT_S,
    ) -> None:
        self.connection = connection
        self.sink = sink
        self.console = console
        self.log = log
        self.exact_timeline = exact_timeline  # input is a file: audio_end_ms maps onto wall time
        self.verbose = verbose
        self.session_ready = asyncio.Event()
        self.stream_t0 = time.monotonic()  # monotonic seconds of input sample 0
        self.last_event_t = time.monotonic()
        self.in_flight: set[str] = set()
        self.awaiting_reply = False
        self.user_speaking = False
        self.speech_generation = 0  # incremented on every speech_started
        self.response_generation: dict[str, int] = {}
        self.response_items: dict[str, set[str]] = {}
        self.interrupted_responses: set[str] = set()
        self.interrupted_items: set[str] = set()
        self.tool_names: dict[str, str] = {}
        self.tools = tools
        self.tool_timeout_s = tool_timeout_s
        self._tool_rounds: dict[str, _ToolRound] = {}  # response id -> its calls
        self._tool_tasks: set[asyncio.Task[None]] = set()
        self._seen_calls: set[str] = set()
        self.follow_ups = 0  # follow-up responses asked for since the user's last turn
        self.last_response_id = ""
        self.turn_end: tuple[float, str, float | None] | None = None  # (monotonic s, label, audio_end_ms)
        self.latencies_ms: list[float] = []
        self.responses_done = 0
        connection.on_invalid = lambda text: self.console.line(f"[warning] non-JSON message ignored: {text[:80]!r}")
        self._handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "session.created": self._on_session,
            "session.updated": self._on_session,
            "error": self._on_error,
            "input_audio_buffer.speech_started": self._on_speech_started,
            "input_audio_buffer.speech_stopped": self._on_speech_stopped,
            "conversation.item.input_audio_transcription.completed": self._on_user_transcript,
            "conversation.item.input_audio_transcription.failed": self._on_user_transcript_failed,
            "response.created": self._on_response_created,
            "response.output_item.added": self._on_output_item,
            "response.output_audio.delta": self._on_audio_delta,
            "response.output_audio.done": self._on_audio_done,
            "response.output_audio_transcript.delta": self._on_text_delta,
            "response.output_text.delta": self._on_text_delta,
            "response.output_audio_transcript.done": self._on_text_done,
            "response.output_text.done": self._on_text_done,
            "response.function_call_arguments.done": self._on_function_call,
            "response.done": self._on_response_done,
        }

    @property
    def busy(self) -> bool:
        """A response is in flight or a tool is still running."""
        return bool(self.in_flight or self._tool_tasks)

    # -- sending -------------------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        """Send one client event (silently dropped once the connection is closed)."""
        await self.connection.send(event)

    def _expect_reply(self, label: str) -> None:
        self.awaiting_reply = True
        self.follow_ups = 0
        self.turn_end = (time.monotonic(), label, None)

    async def commit_and_respond(self) -> None:
        """Without server VAD: commit the input buffer and ask for a response."""
        await self.send({"type": "input_audio_buffer.commit"})
        self._expect_reply("response.create")
        await self.send({"type": "response.create"})

    async def send_text_turn(self, text: str) -> None:
        """A user text message followed by ``response.create``."""
        self.console.line(f"you (text): {text}")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await self.send({"type": "conversation.item.create", "item": item})
        self._expect_reply("response.create")
        await self.send({"type": "response.create"})

    async def cancel_responses(self) -> None:
        """``response.cancel`` if a response is in flight (Ctrl-C, push-to-talk barge-in)."""
        if self.in_flight:
            self.interrupted_responses |= self.in_flight
            await self.send({"type": "response.cancel"})

    async def barge_in(self) -> None:
        """Stop local playback and tell the server how much of the playing item was heard."""
        self.interrupted_responses |= self.in_flight
        stopped = self.sink.interrupt()
        if stopped is None:
            return
        item_id, played_ms = stopped
        self.interrupted_items.add(item_id)
        await self.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": played_ms}
        )
        self.console.line(f"[barge-in] playback stopped; truncated {item_id} at {played_ms} ms")

    # -- receiving -----------------------------------------------------------------------------

    async def receive_loop(self) -> str | None:
        """Handle server events until the connection closes; return why it closed (None if cleanly)."""
        async for event in self.connection:
            await self.handle(event)
        return self.connection.close_reason

    async def handle(self, event: dict[str, Any]) -> None:
        """Log ``event`` and dispatch it to its handler."""
        self.last_event_t = time.monotonic()
        self.log.write(event)
        kind = str(event.get("type", ""))
        if self.verbose and not kind.endswith(".delta"):
            self.console.line(f"  · {kind}")
        handler = self._handlers.get(kind)
        if handler is None:
            return
        try:
            result = handler(event)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:  # a malformed event must not end the conversation
            self.console.line(f"[warning] could not handle {kind}: {exc!r}")

    def _on_session(self, event: dict[str, Any]) -> None:
        if event.get("type") == "session.updated":
            self.session_ready.set()

    def _on_error(self, event: dict[str, Any]) -> None:
        error = event.get("error") or {}
        code = error.get("code") or error.get("type") or "error"
        self.console.line(f"[error] {code}: {error.get('message', event)}")

    async def _on_speech_started(self, event: dict[str, Any]) -> None:
        self.user_speaking = True
        self.speech_generation += 1
        self.follow_ups = 0
        self.awaiting_reply = True
        self.turn_end = None
        await self.barge_in()

    def _on_speech_stopped(self, event: dict[str, Any]) -> None:
        self.user_speaking = False
        audio_end_ms = event.get("audio_end_ms")
        self.turn_end = (time.monotonic(), "speech_stopped", audio_end_ms if isinstance(audio_end_ms, int) else None)

    def _on_user_transcript(self, event: dict[str, Any]) -> None:
        self.console.line(f"you: {event.get('transcript', '')}")

    def _on_user_transcript_failed(self, event: dict[str, Any]) -> None:
        error = event.get("error") or {}
        self.console.line(f"[error] transcription failed: {error.get('message', event)}")

    def _on_response_created(self, event: dict[str, Any]) -> None:
        response_id = str((event.get("response") or {}).get("id", ""))
        self.in_flight.add(response_id)
        self.last_response_id = response_id
        self.response_generation[response_id] = self.speech_generation

    def _on_output_item(self, event: dict[str, Any]) -> None:
        item = event.get("item") or {}
        if item.get("type") == "function_call":
            self.tool_names[str(item.get("id"))] = str(item.get("name", "?"))

    def _on_audio_delta(self, event: dict[str, Any]) -> None:
        response_id = str(event.get("response_id", ""))
        item_id = str(event.get("item_id", ""))
        if response_id in self.interrupted_responses or item_id in self.interrupted_items:
            return  # late audio of an interrupted reply: never play it
        pcm = decode_pcm16(str(event.get("delta", "")))
        self.response_items.setdefault(response_id, set()).add(item_id)
        now = time.monotonic()
        generation = self.response_generation.get(response_id, self.speech_generation)
        if self.turn_end is not None and generation == self.speech_generation:
            self._report_latency(now)
        self.sink.push(item_id, pcm)

    def _report_latency(self, now: float) -> None:
        assert self.turn_end is not None
        t_end, label, audio_end_ms = self.turn_end
        self.turn_end = None
        latency_ms = (now - t_end) * 1000.0
        self.latencies_ms.append(latency_ms)
        text = f"[latency] {label} → first audio: {latency_ms:.0f} ms"
        if self.exact_timeline and audio_end_ms is not None:
            v2v_ms = (now - self.stream_t0) * 1000.0 - audio_end_ms
            text += f" (end of speech → first audio: {v2v_ms:.0f} ms)"
        self.console.line(text)

    def _on_audio_done(self, event: dict[str, Any]) -> None:
        self.sink.item_done(str(event.get("item_id", "")))

    def _on_text_delta(self, event: dict[str, Any]) -> None:
        key = (event.get("item_id"), event.get("content_index", 0))
        self.console.stream(key, "assistant", str(event.get("delta", "")))

    def _on_text_done(self, event: dict[str, Any]) -> None:
        key = (event.get("item_id"), event.get("content_index", 0))
        self.console.finish(key, "assistant", event.get("transcript") or event.get("text"))

    def _on_function_call(self, event: dict[str, Any]) -> None:
        name = str(event.get("name") or self.tool_names.get(str(event.get("item_id")), "?"))
        arguments = event.get("arguments", "")
        call_id = event.get("call_id")
        self.console.line(f"[tool] {name}({arguments}) call_id={call_id}")
        if self.tools is None:
            return
        if not isinstance(call_id, str) or not call_id:
            self.console.line(f"[warning] tool call {name} has no call_id: not run")
            return
        if call_id in self._seen_calls:
            return  # the same call announced twice
        self._seen_calls.add(call_id)
        response_id = str(event.get("response_id") or self.last_response_id)
        self._tool_rounds.setdefault(response_id, _ToolRound(pending=set())).pending.add(call_id)
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        task = asyncio.create_task(self._run_tool_call(response_id, call_id, name, arguments))
        self._tool_tasks.add(task)
        task.add_done_callback(self._tool_tasks.discard)

    async def _run_tool_call(self, response_id: str, call_id: str, name: str, arguments: str) -> None:
        """Run one call, print and send its output, then ask for the follow-up if it is due."""
        assert self.tools is not None
        output = await call_tool(self.tools, name, arguments, self.tool_timeout_s)
        shown = output if len(output) <= TOOL_PRINT_CHARS else output[:TOOL_PRINT_CHARS] + "…"
        self.console.line(f"[tool] {name} → {shown}")
        item = {"type": "function_call_output", "call_id": call_id, "output": output}
        await self.send({"type": "conversation.item.create", "item": item})
        tool_round = self._tool_rounds.get(response_id)
        if tool_round is not None:
            tool_round.pending.discard(call_id)
        await self._maybe_follow_up(response_id)

    async def _maybe_follow_up(self, response_id: str) -> None:
        """Send ``response.create`` once ``response_id`` is done and all its calls have outputs."""
        tool_round = self._tool_rounds.get(response_id)
        if tool_round is None or not tool_round.done or tool_round.pending:
            return
        del self._tool_rounds[response_id]
        if not tool_round.follow_up:
            return
        current = self.response_generation.get(response_id, self.speech_generation) == self.speech_generation
        if not current or self.user_speaking or self.in_flight:
            self.console.line("[tool] no follow-up: the conversation has moved on")
            return
        if self.follow_ups >= MAX_TOOL_ROUNDS:
            self.console.line(f"[tool] no follow-up: {MAX_TOOL_ROUNDS} tool rounds in a row")
            self.awaiting_reply = False
            return
        self.follow_ups += 1
        self.awaiting_reply = True
        await self.send({"type": "response.create"})

    async def close_tools(self) -> None:
        """Cancel tool calls still running (the conversation is over)."""
        tasks = list(self._tool_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_response_done(self, event: dict[str, Any]) -> None:
        response = event.get("response") or {}
        response_id = str(response.get("id", ""))
        self.in_flight.discard(response_id)
        self.responses_done += 1
        for item_id in self.response_items.pop(response_id, set()):
            self.sink.item_done(item_id)
        status = response.get("status", "completed")
        if status != "completed":
            details = response.get("status_details") or {}
            reason = details.get("reason") or (details.get("error") or {}).get("message") or ""
            self.console.line(f"[response {status}{': ' + reason if reason else ''}]")
        current = self.response_generation.get(response_id, self.speech_generation) == self.speech_generation
        tool_round = self._tool_rounds.get(response_id)
        if tool_round is not None:
            tool_round.done = True
            tool_round.follow_up = status == "completed" and current and response_id not in self.interrupted_responses
        if current and not self.user_speaking and not (tool_round is not None and tool_round.follow_up):
            self.awaiting_reply = False
        await self._maybe_follow_up(response_id)
