"""The program: parse config → build the pipeline → run → report."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from speech_to_speech.cli import parse_args
from speech_to_speech.console import ConsoleReporter, MetricsCollector, RunSummary, TranscriptWriter
from speech_to_speech.events import EventBus
from speech_to_speech.pipeline import Pipeline, PipelineError, build_pipeline
from speech_to_speech.registry import BackendUnavailableError, UnknownBackendError

logger = logging.getLogger("speech_to_speech")

#: seconds every thread gets to stop after SIGINT/SIGTERM or the end of input
STOP_TIMEOUT_S = 2.0


def run(args: argparse.Namespace, bus: EventBus | None = None, install_signals: bool = True) -> RunSummary:
    """Run one conversation as ``args`` describe and return its metrics.

    Raises:
        PipelineError, UnknownBackendError, BackendUnavailableError,
        FileNotFoundError, ValueError: bad input; nothing was left running.
    """
    bus = bus or EventBus()
    metrics = MetricsCollector(bus)
    writer = TranscriptWriter(bus, args.transcript) if args.transcript else None
    try:
        pipeline = build_pipeline(args, bus)
        previous = _install_signal_handlers(pipeline) if install_signals else {}
        try:
            load_seconds = pipeline.start()
            pipeline.wait()
        finally:
            stuck = pipeline.stop(STOP_TIMEOUT_S)
            if stuck:
                logger.warning("threads still running after %.0f s: %s", STOP_TIMEOUT_S, ", ".join(stuck))
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if writer is not None:
            writer.close()
    return RunSummary(turns=metrics.turns, load_seconds=load_seconds)


def _install_signal_handlers(pipeline: Pipeline) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.warning("received %s, stopping", signal.Signals(signum).name)
        pipeline.stop_event.set()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, on_signal)
    return previous


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    _quiet_libraries()
    bus = EventBus()
    ConsoleReporter(bus)
    try:
        if args.mode == "server":
            return serve(args)
        run(args, bus)
    except (PipelineError, UnknownBackendError, BackendUnavailableError, FileNotFoundError, ValueError) as exc:
        print(f"s2s_pipeline.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the realtime server until SIGINT/SIGTERM; returns the exit status."""
    from speech_to_speech.pipeline import resolve_device
    from speech_to_speech.realtime.server import run_server
    from speech_to_speech.registry import get_backend

    for stage, name in (("vad", args.vad), ("stt", args.stt), ("llm", args.llm_backend), ("tts", args.tts)):
        get_backend(stage, name).load_handler_class()
    args.resolved_device = resolve_device(args.device)
    try:
        run_server(args)
    except OSError as exc:
        raise PipelineError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except RuntimeError as exc:
        # model-loading threads cannot be interrupted; leave without running native
        # destructors under them (they abort or report leaks at interpreter exit)
        print(f"s2s_pipeline.py: error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    return 0


def _quiet_libraries() -> None:
    for name in ("httpx", "urllib3", "faster_whisper", "transformers", "piper", "websockets"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
