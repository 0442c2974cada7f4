"""``s2s-talk``: the terminal client for a server that speaks the OpenAI Realtime protocol (GA event names).

Talk to the server live (microphone and speaker), or feed it a file and record its answer::

    # live: microphone in, speaker out (use headphones: there is no echo cancellation)
    s2s-talk --url ws://127.0.0.1:8765/v1/realtime

    # file mode: stream a file at real-time pace, save the reply on the input's timeline
    s2s-talk --input_audio question.wav --output_audio answer.wav

    # text turns (each is sent after the previous response.done)
    s2s-talk --text "Hello!" --text "Tell me a joke." --output_audio jokes.wav

    # client-side tools: the module's TOOLS go in session.update, calls run here
    s2s-talk --text "What is 2 plus 3?" --tool-module speech_to_speech.client.talk.sample_tools

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
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from speech_to_speech.client.realtime import WIRE_RATE, ConnectError, RealtimeClient, load_wire_audio
from speech_to_speech.client.talk.audio import (
    AudioSink,
    FileSource,
    MicSource,
    NullSink,
    SpeakerSink,
    WavSink,
    parse_device,
)
from speech_to_speech.client.talk.console import Console, TranscriptLog
from speech_to_speech.client.talk.conversation import Conversation, build_session_update
from speech_to_speech.client.talk.tools import TOOL_TIMEOUT_S, ToolModule, ToolModuleError, load_tool_module
from speech_to_speech.speech.audio_io import AudioDeviceError

#: seconds of silence sent after an input file so that server VAD can endpoint
TRAILING_SILENCE_S = 1.5
#: seconds to wait for session.updated before streaming anyway
SESSION_READY_TIMEOUT_S = 5.0
#: seconds without server events, after the last reply, before file/text mode exits
SETTLE_S = 1.0
#: the program's name in its error lines
PROG = "s2s-talk"


class UsageError(Exception):
    """A file given on the command line cannot be read or written (message for the user)."""


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
            print(f"{PROG}: --tool-module {args.tool_module}: {exc}", file=sys.stderr)
            return 2
        console.line(f"[tools] {args.tool_module}: {', '.join(tool['name'] for tool in tools.tools) or '(none)'}")
    try:
        log = TranscriptLog(args.transcript, time.monotonic())
    except OSError as exc:
        print(f"{PROG}: cannot write --transcript {args.transcript}: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            session = prepare(args, console)
        except AudioDeviceError as exc:
            print(
                f"{PROG}: no usable audio device ({exc}); use --input_audio PATH and --output_audio PATH instead",
                file=sys.stderr,
            )
            return 1
        except UsageError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
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
        print(f"{PROG}: {exc}", file=sys.stderr)
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
        prog=PROG,
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
    """Run the client with ``argv`` (default: the command line); returns the exit status."""
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The ``s2s-talk`` console script."""
    sys.exit(main())
