#!/usr/bin/env python
"""Terminal client for a server that speaks the OpenAI Realtime protocol (GA event names).

Talk to the server live (microphone and speaker), or feed it a file and record its answer::

    # live: microphone in, speaker out (use headphones: there is no echo cancellation)
    python scripts/talk.py --url ws://127.0.0.1:8765/v1/realtime

    # file mode: stream a file at real-time pace, save the reply on the input's timeline
    python scripts/talk.py --input_audio question.wav --output_audio answer.wav

    # text turns (each is sent after the previous response.done)
    python scripts/talk.py --text "Hello!" --text "Tell me a joke." --output_audio jokes.wav

    # client-side tools: the module's TOOLS go in session.update, calls run here
    python scripts/talk.py --text "What is 2 plus 3?" --tool-module scripts/sample_tools.py

Modes:

- **live** (no ``--input_audio`` and no ``--text``): the microphone is captured at 24 kHz mono
  int16 (or at the device's own rate, resampled with soxr) and sent as
  ``input_audio_buffer.append`` in 40 ms blocks; ``response.output_audio.delta`` is played through
  a ``sounddevice`` OutputStream fed from a thread-safe buffer. When the server reports
  ``input_audio_buffer.speech_started`` the client drops all audio still queued for playback
  (barge-in) and sends ``conversation.item.truncate`` with ``audio_end_ms`` = milliseconds of that
  item actually handed to the sound device (minus the device's output latency while it is still
  playing). With ``--no_vad``, press Enter to end each turn (commit + ``response.create``).
  Quit with Ctrl-C.
- **file** (``--input_audio PATH``): any file ``soundfile`` reads, any rate (resampled to 24 kHz),
  is streamed at real-time pace on an absolute schedule (block *i* of 40 ms leaves when it "has
  been recorded", at start + (i + 1) * 40 ms), followed by 1.5 s of silence so the server's VAD
  can endpoint (with ``--no_vad`` the client commits and sends ``response.create`` instead).
- **text** (``--text`` without ``--input_audio``): no microphone; only the text turns are sent.

In file and text mode the assistant's audio goes to ``--output_audio`` (a 24 kHz 16-bit WAV on
the input's timeline: each delta is placed at the time it arrived, relative to the start of the
input, or right after the previous delta, whichever is later; a barge-in cuts it exactly like a
speaker would) or, without it, to the speaker when there is one. The client exits by itself once
the input is over and the last ``response.done`` has arrived, or after ``--idle_timeout_s``
seconds without any server event and no response in flight.

Tools (``--tool-module MODULE``, a dotted module name importable from the current directory or
a path to a ``.py`` file): the module exports ``TOOLS``, a list of flat function tools
(``{"type": "function", "name", "description", "parameters"}``), and
``async def execute_tool(name: str, arguments: dict) -> Any``. ``TOOLS`` is sent in
``session.update`` with ``tool_choice`` "auto". For each ``response.function_call_arguments.done``
the client parses the arguments (bad JSON gives an error output, not a crash), runs
``execute_tool`` (an exception, or a run longer than ``--tool_timeout_s``, gives
``{"error": "..."}``) and sends the result (a string as is, anything else as JSON) as a
``function_call_output`` item. Once the response holding the calls is done and every call of it
has its output, one plain ``response.create`` asks for the spoken follow-up (not when that
response was cancelled or interrupted, or the user has spoken since).

Console: user transcripts (``conversation.item.input_audio_transcription.completed``), the
assistant transcript (streamed from ``response.output_audio_transcript.delta`` or
``response.output_text.delta``), tool calls and their results, ``error`` events (the client
keeps going), and per turn the latency in ms from ``speech_stopped`` (or from the client's own
``response.create``) to the first audio delta. ``--transcript PATH`` writes every received server
event as JSON Lines with a ``t`` field (seconds since connecting) and base64 audio payloads
replaced by their byte counts.

The connection, the event stream, wire audio and paced sending are those of
:mod:`speech_to_speech.client.realtime` (which the server benchmark and the tests use too); the
speaker and the WAV output are built on :mod:`speech_to_speech.speech.audio_io`'s ``OutputBuffer`` and
``Timeline``, as the pipeline's own sinks are.

Exit status: 0 when done (or quit with Ctrl-C in live mode), 1 when the server cannot be reached
or closes the connection early, a file cannot be read or written, or no audio device is usable,
2 on bad flags (including a ``--tool-module`` that cannot be loaded), 130 on Ctrl-C in file or
text mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TextIO

import numpy as np
import soundfile as sf

from speech_to_speech.client.realtime import (
    BLOCK_S,
    BLOCK_SAMPLES,
    WIRE_RATE,
    Blocker,
    ConnectError,
    PacedSender,
    RealtimeClient,
    StreamResampler,
    decode_pcm16,
    load_wire_audio,
    session_update,
    silence,
)
from speech_to_speech.speech.audio_io import AudioDeviceError, OutputBuffer, Timeline, import_sounddevice

#: seconds of silence sent after an input file so that server VAD can endpoint
TRAILING_SILENCE_S = 1.5
#: seconds to wait for session.updated before streaming anyway
SESSION_READY_TIMEOUT_S = 5.0
#: seconds without server events, after the last reply, before file/text mode exits
SETTLE_S = 1.0
#: seconds at most to wait for the speaker to play out what is queued before exiting
DRAIN_TIMEOUT_S = 60.0
#: default seconds a tool may run before its output becomes a timeout error
TOOL_TIMEOUT_S = 10.0
#: follow-up responses in a row that may call tools again before the client stops asking
MAX_TOOL_ROUNDS = 8
#: characters of a tool result shown on the console
TOOL_PRINT_CHARS = 300


class UsageError(Exception):
    """A file given on the command line cannot be read or written (message for the user)."""


class ToolModuleError(Exception):
    """The ``--tool-module`` cannot be imported or does not export valid TOOLS / execute_tool."""


# ---------------------------------------------------------------------------------------------
# audio helpers


def pick_rate(sd: ModuleType, device: int | str | None, kind: str) -> int:
    """WIRE_RATE if the device accepts it as int16 mono, else the device's default rate in Hz."""
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    try:
        check(device=device, channels=1, dtype="int16", samplerate=WIRE_RATE)
        return WIRE_RATE
    except Exception:
        info = sd.query_devices(device, kind)
        return int(info["default_samplerate"])


def parse_device(value: str | None) -> int | str | None:
    """A sounddevice device: an index when the flag is a number, otherwise a name substring."""
    if value is None:
        return None
    return int(value) if value.strip().isdigit() else value


# ---------------------------------------------------------------------------------------------
# audio sinks: where the assistant's audio goes


class AudioSink(Protocol):
    """Receives assistant audio (int16 mono at WIRE_RATE) and knows how much of it was heard."""

    def start(self, t0: float) -> None:
        """Start the timeline at ``t0`` (``time.monotonic()`` seconds)."""

    def push(self, item_id: str, pcm: np.ndarray) -> None:
        """Queue audio of conversation item ``item_id``."""

    def item_done(self, item_id: str) -> None:
        """No more audio will come for ``item_id``."""

    def interrupt(self) -> tuple[str, int] | None:
        """Barge-in: drop all queued audio; return (playing item id, ms of it heard) or None."""

    async def drain(self) -> None:
        """Wait until queued audio has been played out."""

    def close(self) -> None:
        """Stop and release resources (write the file, close the stream)."""


class NullSink:
    """Discards assistant audio (text mode without a speaker or --output_audio)."""

    def start(self, t0: float) -> None:
        """Nothing to start."""

    def push(self, item_id: str, pcm: np.ndarray) -> None:
        """Discard ``pcm``."""

    def item_done(self, item_id: str) -> None:
        """Nothing to flush."""

    def interrupt(self) -> tuple[str, int] | None:
        """Nothing was heard, so nothing to truncate."""
        return None

    async def drain(self) -> None:
        """Nothing queued."""

    def close(self) -> None:
        """Nothing to release."""


class SpeakerSink:
    """Plays assistant audio through a ``sounddevice`` OutputStream fed from an :class:`OutputBuffer`."""

    def __init__(self, device: int | str | None = None) -> None:
        sd = import_sounddevice()
        try:
            self.rate = pick_rate(sd, device, "output")
            self._stream = sd.OutputStream(
                samplerate=self.rate, channels=1, dtype="int16", device=device, latency="low", callback=self._callback
            )
        except Exception as exc:  # PortAudioError, ValueError (no default device), ...
            raise AudioDeviceError(f"no output device: {exc}") from exc
        self._resampler = StreamResampler(WIRE_RATE, self.rate)
        self._buffer = OutputBuffer()  # device-rate chunks tagged with their item id
        self._played: dict[str, int] = {}  # device-rate samples handed to the device, per item
        self._done: set[str] = set()
        self._last_item: str | None = None

    def _count_played(self, item_id: str, samples: int) -> None:
        self._played[item_id] = self._played.get(item_id, 0) + samples

    def _callback(self, outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio thread: fill ``outdata`` from the queue, silence on underrun."""
        self._buffer.fill(outdata[:, 0], played=self._count_played)

    def start(self, t0: float) -> None:
        """Start the output stream."""
        self._stream.start()

    def push(self, item_id: str, pcm: np.ndarray) -> None:
        """Resample to the device rate if needed and queue."""
        self._last_item = item_id
        self._buffer.append(self._resampler.process(pcm), item_id)

    def item_done(self, item_id: str) -> None:
        """Flush the resampler's tail for ``item_id``."""
        if item_id in self._done:
            return
        self._done.add(item_id)
        if item_id == self._last_item:
            self._buffer.append(self._resampler.process(np.zeros(0, dtype=np.int16), last=True), item_id)

    def interrupt(self) -> tuple[str, int] | None:
        """Drop everything queued; the playing item is the queue's head, else the last pushed item."""
        playing = self._buffer.clear()
        pending = playing is not None
        item_id = playing if pending else self._last_item
        self._resampler.reset()
        if item_id is None or (not pending and item_id in self._done):
            return None  # nothing playing: the last item was heard in full
        played_ms = self._played.get(item_id, 0) * 1000.0 / self.rate
        if pending:  # what was handed to the device but is still in its buffer was not heard yet
            played_ms -= float(self._stream.latency) * 1000.0
        self._done.add(item_id)
        return item_id, max(0, int(played_ms))

    async def drain(self) -> None:
        """Wait (at most DRAIN_TIMEOUT_S) until the queue is empty plus the device latency."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self._buffer and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(float(self._stream.latency))

    def close(self) -> None:
        """Stop and close the output stream."""
        with contextlib.suppress(Exception):
            self._stream.stop()
        with contextlib.suppress(Exception):
            self._stream.close()


class WavSink:
    """Records assistant audio on the input's timeline and writes it as a 24 kHz 16-bit WAV.

    Each delta is placed at its arrival time (relative to ``t0``) or right after the previous
    delta, whichever is later, i.e. where a speaker started at ``t0`` would have played it. A
    barge-in cuts the timeline at the current time, as a speaker would.
    """

    def __init__(self, path: str, console: Console, min_samples: int = 0) -> None:
        self._path = path
        self._console = console
        self._min_samples = min_samples
        self._t0 = time.monotonic()
        self._timeline = Timeline()  # pieces tagged with their item id
        self._cursor = 0  # first free sample after the last delta
        self._done: set[str] = set()
        self._last_item: str | None = None
        self._started = False

    def start(self, t0: float) -> None:
        """Anchor sample 0 of the output at ``t0`` (monotonic seconds)."""
        self._t0 = t0
        self._started = True

    def _now(self) -> int:
        return round((time.monotonic() - self._t0) * WIRE_RATE)

    def push(self, item_id: str, pcm: np.ndarray) -> None:
        """Place ``pcm`` at max(now, end of previous delta)."""
        start = max(self._now(), self._cursor)
        self._timeline.place(start, pcm, item_id)
        self._cursor = start + len(pcm)
        self._last_item = item_id

    def item_done(self, item_id: str) -> None:
        """Remember that ``item_id`` is complete."""
        self._done.add(item_id)

    def interrupt(self) -> tuple[str, int] | None:
        """Cut everything not yet "played" at the current time; report the playing item."""
        now = self._now()
        playing = [item for start, samples, item in self._timeline.pieces if start + len(samples) > now]
        if playing:
            item_id = playing[0]
        elif self._last_item is not None and self._last_item not in self._done:
            item_id = self._last_item  # response still streaming, everything so far was heard
        else:
            return None
        self._timeline.cut(now)
        self._cursor = min(self._cursor, now)
        self._done.add(item_id)
        heard = sum(len(samples) for _, samples, item in self._timeline.pieces if item == item_id)
        return item_id, heard * 1000 // WIRE_RATE

    async def drain(self) -> None:
        """Nothing to play out."""

    def close(self) -> None:
        """Write the WAV (at least ``min_samples`` long, so that it lines up with the input); not if never started."""
        if not self._started:
            return
        self._started = False
        audio = self._timeline.render(max(self._cursor, self._min_samples), np.int16)
        try:
            sf.write(self._path, audio, WIRE_RATE, subtype="PCM_16")
        except Exception as exc:
            self._console.line(f"[error] cannot write {self._path}: {exc}")
            return
        voiced = sum(len(samples) for _, samples, _ in self._timeline.pieces) / WIRE_RATE
        self._console.line(f"[saved] {self._path}: {len(audio) / WIRE_RATE:.2f} s, {voiced:.2f} s of assistant audio")


# ---------------------------------------------------------------------------------------------
# console and transcript


class Console:
    """Prints conversation lines; assistant text is streamed on one line per (item, part)."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self._out: TextIO | None = out
        self._open: object | None = None  # key of the line being streamed
        self._streamed: set[object] = set()

    def _write(self, text: str) -> None:
        if self._out is None:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except (BrokenPipeError, ValueError):  # stdout closed (e.g. piped into head): stay quiet
            self._out = None

    def _close_open(self) -> None:
        if self._open is not None:
            self._write("\n")
            self._open = None

    def line(self, text: str) -> None:
        """Print a whole line (ending any streamed line first)."""
        self._close_open()
        self._write(text + "\n")

    def stream(self, key: object, label: str, text: str) -> None:
        """Append streamed ``text`` to the line of ``key`` (reopened with ``label …`` if broken)."""
        if self._open != key:
            self._close_open()
            self._write(f"{label}: " if key not in self._streamed else f"{label} …: ")
            self._open = key
            self._streamed.add(key)
        self._write(text)

    def finish(self, key: object, label: str, full_text: str | None) -> None:
        """End the streamed line of ``key``; print ``full_text`` if nothing was streamed."""
        if key in self._streamed:
            if self._open == key:
                self._close_open()
        elif full_text:
            self.line(f"{label}: {full_text}")
            self._streamed.add(key)


def strip_audio(value: Any, audio_delta: bool = False) -> Any:
    """Copy of an event with base64 audio replaced by ``"<N bytes>"`` (keys ``audio`` / audio ``delta``)."""
    if isinstance(value, dict):
        out = {}
        for key, sub in value.items():
            if isinstance(sub, str) and (key == "audio" or (audio_delta and key == "delta")):
                out[key] = f"<{len(sub) * 3 // 4 - sub.count('=')} bytes>"
            else:
                out[key] = strip_audio(sub)
        return out
    if isinstance(value, list):
        return [strip_audio(sub) for sub in value]
    return value


class TranscriptLog:
    """JSON Lines of received server events (``t`` = seconds since connecting), audio stripped."""

    def __init__(self, path: str | None, t0: float) -> None:
        self._file = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115
        self._t0 = t0

    def write(self, event: dict[str, Any]) -> None:
        """Append one event."""
        if self._file is None:
            return
        record = {"t": round(time.monotonic() - self._t0, 3)}
        record.update(strip_audio(event, audio_delta=event.get("type") == "response.output_audio.delta"))
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()


# ---------------------------------------------------------------------------------------------
# client-side tools (--tool-module)


@dataclass
class ToolModule:
    """A loaded ``--tool-module``: the tools announced to the server and the function running them."""

    name: str
    tools: list[dict[str, Any]]
    execute: Callable[[str, dict[str, Any]], Any]


def _import_tool_module(spec: str) -> ModuleType:
    """Import ``spec``: a ``.py`` file path, or a dotted module name importable from the current directory."""
    path = Path(spec)
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        if not path.is_file():
            raise ToolModuleError(f"no such file: {spec}")
        name = f"_talk_tools_{abs(hash(str(path.resolve())))}_{path.stem}"
        file_spec = importlib.util.spec_from_file_location(name, path)
        if file_spec is None or file_spec.loader is None:
            raise ToolModuleError(f"cannot import {spec}")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module  # dataclasses, pickling and friends look the module up by name
        try:
            file_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(spec)


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check that ``tools`` is a list of flat function tools with unique names; return a copy.

    Raises:
        ToolModuleError: with what is wrong (the nested Chat Completions form gets a hint).
    """
    if not isinstance(tools, (list, tuple)):
        raise ToolModuleError(f"TOOLS must be a list of function tools, not {type(tools).__name__}")
    seen: set[str] = set()
    checked: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ToolModuleError(f"TOOLS[{index}] must be a dict, not {type(tool).__name__}")
        if "function" in tool and "name" not in tool:
            raise ToolModuleError(
                f"TOOLS[{index}] uses the nested Chat Completions form; the Realtime form is flat: "
                '{"type": "function", "name": ..., "description": ..., "parameters": {...}}'
            )
        name = tool.get("name")
        if tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise ToolModuleError(f'TOOLS[{index}] must have "type": "function" and a non-empty string "name"')
        if "parameters" in tool and not isinstance(tool["parameters"], dict):
            raise ToolModuleError(f"TOOLS[{index}] ({name}): 'parameters' must be a JSON Schema object")
        if name in seen:
            raise ToolModuleError(f"TOOLS has two tools named {name!r}")
        seen.add(name)
        checked.append(dict(tool))
    return checked


def load_tool_module(spec: str) -> ToolModule:
    """Load a ``--tool-module`` (dotted name or ``.py`` path) and check its ``TOOLS`` and ``execute_tool``.

    Raises:
        ToolModuleError: the module cannot be imported (any error while importing it) or its
            exports are missing or malformed.
    """
    try:
        module = _import_tool_module(spec)
    except ToolModuleError:
        raise
    except Exception as exc:  # ImportError, SyntaxError, or whatever the module raises at import
        raise ToolModuleError(f"cannot import {spec}: {exc!r}") from exc
    if not hasattr(module, "TOOLS"):
        raise ToolModuleError(f"{spec} does not export TOOLS")
    execute = getattr(module, "execute_tool", None)
    if not callable(execute):
        raise ToolModuleError(f"{spec} does not export a callable execute_tool(name, arguments)")
    return ToolModule(name=spec, tools=validate_tools(module.TOOLS), execute=execute)


def _error_output(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def format_tool_result(result: Any) -> str:
    """The ``function_call_output`` string for a tool result: a string as is, anything else as JSON."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:  # e.g. circular references
        return _error_output(f"tool result is not JSON-serializable: {exc}")


def run_in_daemon_thread(func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run ``func(*args)`` in a new daemon thread; its result or exception resolves the returned future.

    Unlike ``asyncio.to_thread`` (the loop's default executor, which ``asyncio.run`` waits for on
    exit), a call that never returns cannot keep the client from exiting after a timeout.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled (timed out) meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = func(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="talk-tool", daemon=True).start()
    return future


async def call_tool(tools: ToolModule, name: str, arguments: str, timeout_s: float) -> str:
    """Run one call and return its output string; never raises (errors become ``{"error": ...}``).

    ``arguments`` is the JSON text from the server (empty means ``{}``); it must decode to an
    object. A synchronous ``execute_tool`` runs in a daemon thread.
    """
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        return _error_output(f"invalid JSON arguments for {name}: {exc}")
    if not isinstance(parsed, dict):
        return _error_output(f"arguments for {name} must be a JSON object, not {type(parsed).__name__}")
    try:
        if inspect.iscoroutinefunction(tools.execute):
            pending: Awaitable[Any] = tools.execute(name, parsed)
        else:
            pending = run_in_daemon_thread(tools.execute, name, parsed)
        result = await asyncio.wait_for(pending, timeout_s)
        if inspect.isawaitable(result):  # a sync function returning an awaitable
            result = await asyncio.wait_for(result, timeout_s)
    except TimeoutError:
        return _error_output(f"tool {name} timed out after {timeout_s:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return _error_output(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return format_tool_result(result)


@dataclass
class _ToolRound:
    """The tool calls of one response: outputs still being computed, and whether a follow-up is due."""

    pending: set[str]
    done: bool = False  # response.done arrived
    follow_up: bool = False  # the response completed for the current turn: ask for the follow-up


# ---------------------------------------------------------------------------------------------
# protocol client


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


# ---------------------------------------------------------------------------------------------
# input sources


class FileSource:
    """An audio file streamed at real-time pace on an absolute schedule."""

    def __init__(self, samples: np.ndarray, trailing_silence_s: float) -> None:
        """``samples``: int16 mono at WIRE_RATE; ``trailing_silence_s``: silence appended, in s."""
        audio = np.concatenate([samples, silence(trailing_silence_s)])
        pad = (-len(audio)) % BLOCK_SAMPLES
        self.samples = np.concatenate([audio, np.zeros(pad, dtype=np.int16)])

    @property
    def duration_samples(self) -> int:
        """Length of what is streamed, in samples at WIRE_RATE."""
        return len(self.samples)

    async def stream(self, client: Conversation) -> None:
        """Send block i (40 ms) at ``client.stream_t0 + (i + 1) * BLOCK_S``, when it "was recorded"."""
        sender = PacedSender(client.connection)
        sender.say(self.samples, start=client.stream_t0)
        try:
            await sender.drained()
        finally:
            await sender.stop()

    def close(self) -> None:
        """Nothing to release."""


class MicSource:
    """Microphone capture through a ``sounddevice`` InputStream, sent in 40 ms blocks."""

    def __init__(self, device: int | str | None = None) -> None:
        sd = import_sounddevice()
        try:
            self.rate = pick_rate(sd, device, "input")
            self._stream = sd.InputStream(
                samplerate=self.rate,
                channels=1,
                dtype="int16",
                device=device,
                blocksize=round(self.rate * BLOCK_S),
                callback=self._callback,
            )
        except Exception as exc:  # PortAudioError, ValueError (no default device), ...
            raise AudioDeviceError(f"no input device: {exc}") from exc
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[np.ndarray] | None = None

    def _callback(self, indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio thread: hand a copy of the block to the event loop."""
        if self._loop is not None and self._queue is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._queue.put_nowait, indata[:, 0].copy())

    async def stream(self, client: Conversation) -> None:
        """Capture until cancelled; resample to WIRE_RATE and send BLOCK_SAMPLES blocks."""
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        resampler = StreamResampler(self.rate, WIRE_RATE)
        blocker = Blocker(BLOCK_SAMPLES)
        self._stream.start()
        try:
            while True:
                captured = await self._queue.get()
                for block in blocker.feed(resampler.process(captured)):
                    await client.connection.append_audio(block)
        finally:
            self.close()

    def close(self) -> None:
        """Stop and close the input stream."""
        self._loop = None
        with contextlib.suppress(Exception):
            self._stream.stop()
        with contextlib.suppress(Exception):
            self._stream.close()


def start_stdin_reader(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str]:
    """Lines typed on stdin, read by a daemon thread (so it never blocks shutdown)."""
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lines.put_nowait, line)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return lines


async def push_to_talk(client: Conversation) -> None:
    """``--no_vad`` live mode: every Enter ends the user's turn (interrupting any reply)."""
    client.console.line("[push-to-talk] speak, then press Enter to get a reply")
    lines = start_stdin_reader(asyncio.get_running_loop())
    while True:
        await lines.get()
        await client.cancel_responses()
        await client.barge_in()
        await client.commit_and_respond()


async def wait_for_reply(client: Conversation, idle_timeout_s: float, settle_s: float = 0.0) -> bool:
    """Wait until no reply is awaited, nothing is busy and the server was quiet ``settle_s`` s.

    Busy: a response in flight or a tool running. Returns False instead when, while not busy,
    nothing came from the server for ``idle_timeout_s`` seconds (counted from the call at the
    earliest).
    """
    since = time.monotonic()
    while True:
        if not client.busy:
            quiet_s = time.monotonic() - max(client.last_event_t, since)
            if not client.awaiting_reply and quiet_s >= settle_s:
                return True
            if quiet_s >= idle_timeout_s:
                return False
        await asyncio.sleep(0.05)


async def send_text_turns(client: Conversation, texts: Sequence[str], idle_timeout_s: float) -> None:
    """Send each text turn once the previous reply is complete (or the server went idle)."""
    for text in texts:
        if not await wait_for_reply(client, idle_timeout_s):
            client.console.line(f"[idle] no reply for {idle_timeout_s:g} s; sending the next turn")
            client.awaiting_reply = False
        await client.send_text_turn(text)


async def drive_input(
    client: Conversation,
    source: FileSource | MicSource | None,
    texts: Sequence[str],
    no_vad: bool,
    idle_timeout_s: float,
) -> None:
    """Send all input: the file (then commit without VAD) or the microphone, then the text turns.

    Returns when the input is over; with a microphone it runs until cancelled.
    """
    background: list[asyncio.Task[None]] = []
    if isinstance(source, MicSource):
        background.append(asyncio.create_task(source.stream(client)))
        if no_vad:
            background.append(asyncio.create_task(push_to_talk(client)))
    elif isinstance(source, FileSource):
        await source.stream(client)
        if no_vad:
            await client.commit_and_respond()
    try:
        await send_text_turns(client, texts, idle_timeout_s)
        if background:
            await asyncio.gather(*background)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)


async def wait_finished(client: Conversation, input_task: asyncio.Task[None], idle_timeout_s: float) -> bool:
    """Once the input is over, wait for the last reply. True when done, False on idle timeout."""
    await asyncio.shield(input_task)
    return await wait_for_reply(client, idle_timeout_s, settle_s=SETTLE_S)


# ---------------------------------------------------------------------------------------------
# main


@dataclass
class Session:
    """What a run needs besides the connection."""

    source: FileSource | MicSource | None
    sink: AudioSink
    live: bool
    tools: ToolModule | None = None


def prepare(args: argparse.Namespace, console: Console) -> Session:
    """Open the input and output (before connecting). Raises AudioDeviceError or UsageError."""
    live = args.input_audio is None and not args.text
    source: FileSource | MicSource | None = None
    if args.output_audio is not None and not Path(args.output_audio).resolve().parent.is_dir():
        raise UsageError(f"cannot write --output_audio {args.output_audio}: no such directory")
    if args.input_audio is not None:
        try:
            file_rate = sf.info(args.input_audio).samplerate
            samples = load_wire_audio(args.input_audio)
        except (OSError, RuntimeError, ValueError) as exc:  # soundfile raises LibsndfileError (a RuntimeError)
            raise UsageError(f"cannot read --input_audio {args.input_audio}: {exc}") from exc
        source = FileSource(samples, 0.0 if args.no_vad else TRAILING_SILENCE_S)
        resampled = f", sent resampled to {WIRE_RATE} Hz" if file_rate != WIRE_RATE else ""
        console.line(f"[input] {args.input_audio}: {len(samples) / WIRE_RATE:.2f} s at {file_rate} Hz{resampled}")
    elif live:
        source = MicSource(parse_device(args.input_device))
    sink: AudioSink
    if args.output_audio is not None:
        min_samples = source.duration_samples if isinstance(source, FileSource) else 0
        sink = WavSink(args.output_audio, console, min_samples=min_samples)
    elif live:
        try:
            sink = SpeakerSink(parse_device(args.output_device))
        except AudioDeviceError:
            if source is not None:
                source.close()
            raise
    else:
        try:
            sink = SpeakerSink(parse_device(args.output_device))
        except AudioDeviceError:
            console.line("[note] no audio output device: assistant audio is not played (save it with --output_audio)")
            sink = NullSink()
    return Session(source=source, sink=sink, live=live)


def install_stop_handler(stop: asyncio.Event) -> Callable[[], None]:
    """Ctrl-C sets ``stop`` (a second Ctrl-C raises KeyboardInterrupt); returns an uninstaller."""
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError):  # Windows: KeyboardInterrupt does the job
        return lambda: None
    return lambda: loop.remove_signal_handler(signal.SIGINT)


async def run(args: argparse.Namespace) -> int:
    """Open input, output and transcript, connect, converse, clean up; return the exit status."""
    console = Console()
    tools: ToolModule | None = None
    if args.tool_module:
        try:
            tools = load_tool_module(args.tool_module)
        except ToolModuleError as exc:
            print(f"talk.py: --tool-module {args.tool_module}: {exc}", file=sys.stderr)
            return 2
        console.line(f"[tools] {args.tool_module}: {', '.join(tool['name'] for tool in tools.tools) or '(none)'}")
    try:
        log = TranscriptLog(args.transcript, time.monotonic())
    except OSError as exc:
        print(f"talk.py: cannot write --transcript {args.transcript}: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            session = prepare(args, console)
        except AudioDeviceError as exc:
            print(
                f"talk.py: no usable audio device ({exc}); use --input_audio PATH and --output_audio PATH instead",
                file=sys.stderr,
            )
            return 1
        except UsageError as exc:
            print(f"talk.py: {exc}", file=sys.stderr)
            return 1
        session.tools = tools
        try:
            return await connect_and_converse(args, session, console, log)
        finally:
            if session.source is not None:
                session.source.close()
            session.sink.close()
    finally:
        log.close()


async def connect_and_converse(args: argparse.Namespace, session: Session, console: Console, log: TranscriptLog) -> int:
    """Open the websocket (with the API key header) and run the conversation on it."""
    try:
        connection = await RealtimeClient.connect(args.url, api_key=args.api_key)
    except ConnectError as exc:
        print(f"talk.py: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    uninstall = install_stop_handler(stop)
    try:
        return await converse(args, connection, session, console, log, stop)
    finally:
        await connection.close()
        uninstall()


async def converse(
    args: argparse.Namespace,
    connection: RealtimeClient,
    session: Session,
    console: Console,
    log: TranscriptLog,
    stop: asyncio.Event,
) -> int:
    """Run one conversation on an open connection; return the exit status."""
    client = Conversation(
        connection,
        session.sink,
        console,
        log,
        exact_timeline=isinstance(session.source, FileSource),
        verbose=args.verbose,
        tools=session.tools,
        tool_timeout_s=args.tool_timeout_s,
    )
    console.line(f"[connected] {args.url}" + (" (Ctrl-C to quit)" if session.live else ""))
    receiver = asyncio.create_task(client.receive_loop())
    await client.send(build_session_update(args, session.tools.tools if session.tools is not None else None))
    ready = asyncio.create_task(client.session_ready.wait())
    await asyncio.wait({ready, receiver}, timeout=SESSION_READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        if not receiver.done():
            console.line("[warning] no session.updated yet; streaming anyway")

    client.stream_t0 = time.monotonic()
    session.sink.start(client.stream_t0)
    texts = args.text or []
    input_task = asyncio.create_task(drive_input(client, session.source, texts, args.no_vad, args.idle_timeout_s))
    stopper = asyncio.create_task(stop.wait())
    waiters: set[asyncio.Task[Any]] = {receiver, stopper}
    finisher: asyncio.Task[bool] | None = None
    if session.live:
        waiters.add(input_task)  # runs until cancelled; finishing means the microphone failed
    else:
        finisher = asyncio.create_task(wait_finished(client, input_task, args.idle_timeout_s))
        waiters.add(finisher)
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)

    status = 0
    if stopper.done():
        console.line("[stopped]")
        status = 0 if session.live else 130
        await client.cancel_responses()
    elif finisher is not None and finisher.done() and finisher.exception() is None:
        if not finisher.result():
            console.line(f"[idle] nothing from the server for {args.idle_timeout_s:g} s; exiting")
        await session.sink.drain()
    elif receiver.done():
        reason = repr(receiver.exception()) if receiver.exception() is not None else receiver.result()
        console.line(f"[closed] server closed the connection{' (' + reason + ')' if reason else ''}")
        status = 1

    pending = [task for task in (input_task, stopper, finisher) if task is not None]
    for task in pending:
        task.cancel()
    results = await asyncio.gather(*pending, return_exceptions=True)
    if isinstance(results[0], Exception):  # the input task failed (file send, microphone)
        console.line(f"[error] input failed: {results[0]!r}")
        status = 1
    await client.close_tools()
    await connection.close()
    await asyncio.gather(receiver, return_exceptions=True)
    if client.latencies_ms:
        lat = np.asarray(client.latencies_ms)
        console.line(
            f"[summary] responses: {client.responses_done}; first-audio latency over {len(lat)} turn(s): "
            f"median {np.median(lat):.0f} ms, max {lat.max():.0f} ms"
        )
    return status


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(
        description="Talk to an OpenAI-Realtime-compatible server from the terminal (microphone or files).",
        epilog="Live mode (microphone + speaker) unless --input_audio or --text is given.",
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/realtime", help="server websocket URL")
    parser.add_argument("--input_audio", metavar="PATH", help="stream this audio file (any rate) at real-time pace")
    parser.add_argument("--output_audio", metavar="PATH", help="write the assistant audio as a 24 kHz WAV")
    parser.add_argument(
        "--text", action="append", metavar="TEXT", help="user text turn (repeatable; each after the previous reply)"
    )
    parser.add_argument("--instructions", help="session instructions (system prompt)")
    parser.add_argument("--voice", help="assistant voice")
    parser.add_argument(
        "--no_vad",
        action="store_true",
        help="turn_detection null: the client commits and sends response.create (after the file; on Enter when live)",
    )
    parser.add_argument("--api_key", help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--transcript", metavar="PATH", help="write received server events as JSON Lines (no audio)")
    parser.add_argument(
        "--idle_timeout_s",
        type=float,
        default=30.0,
        help="file/text mode: exit after this many seconds without events and no response in flight (default 30)",
    )
    parser.add_argument("--transcription_model", help="request input transcription with this model (e.g. whisper-1)")
    parser.add_argument("--input_device", help="microphone: sounddevice index or name substring")
    parser.add_argument("--output_device", help="speaker: sounddevice index or name substring")
    parser.add_argument(
        "--tool-module",
        "--tool_module",
        dest="tool_module",
        metavar="MODULE",
        help="client-side tools: a dotted module name (importable from the current directory) or a .py path "
        "exporting TOOLS and async execute_tool(name, arguments)",
    )
    parser.add_argument(
        "--tool_timeout_s",
        type=float,
        default=TOOL_TIMEOUT_S,
        help=f"seconds a tool call may run before its output is a timeout error (default {TOOL_TIMEOUT_S:g})",
    )
    parser.add_argument("--verbose", action="store_true", help="print the type of every server event")
    args = parser.parse_args(argv)
    if args.idle_timeout_s <= 0:
        parser.error("--idle_timeout_s must be positive")
    if args.tool_timeout_s <= 0:
        parser.error("--tool_timeout_s must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
