"""The program: parse config → build the pipeline → run → report.

Exit status: 0 when the run ended normally (also when an input file held no
speech), 1 for a runtime failure (unreadable file, missing device, a backend
that cannot load), 2 for bad flags or a bad preset (from :mod:`speech_to_speech.pipeline.cli`),
130 for Ctrl-C outside the pipeline's own handling. A failure is one
``error:`` line on stderr; tracebacks only appear with ``--log_level debug``.

The command (``s2s_pipeline.py``, the ``s2s-pipeline`` script) is :func:`entry`: :func:`main`, then
the process ends without the interpreter's teardown (see :func:`entry`).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from types import FrameType

from speech_to_speech.core.events import Event, EventBus, SpeechStarted
from speech_to_speech.pipeline.builder import Pipeline, PipelineError, backend_names, build_pipeline, local_ends
from speech_to_speech.pipeline.cli import parse_args
from speech_to_speech.pipeline.console import (
    ConsoleReporter,
    LoadProgress,
    MetricsCollector,
    RunSummary,
    TranscriptWriter,
)
from speech_to_speech.pipeline.registry import BackendUnavailableError, UnknownBackendError

logger = logging.getLogger("speech_to_speech")

PROG = "s2s_pipeline.py"
#: seconds every thread gets to stop after SIGINT/SIGTERM or the end of input
STOP_TIMEOUT_S = 2.0
#: exit status of a runtime failure
EXIT_FAILURE = 1

#: failures the expected way a run goes wrong raises; anything else is reported as unexpected
RUNTIME_ERRORS = (PipelineError, UnknownBackendError, BackendUnavailableError, OSError, ValueError)


def run(
    args: argparse.Namespace,
    bus: EventBus | None = None,
    install_signals: bool = True,
    progress: LoadProgress | None = None,
) -> RunSummary:
    """Run one conversation as ``args`` describe and return its metrics.

    Args:
        args: the parsed command line.
        bus: where events are published (a new one if None).
        install_signals: stop on SIGINT/SIGTERM (main thread only).
        progress: told what loads and when each stage is ready (None: silent).

    Raises:
        PipelineError, UnknownBackendError, BackendUnavailableError,
        OSError, ValueError: bad input; nothing was left running.
    """
    bus = bus or EventBus()
    metrics = MetricsCollector(bus)
    speech = threading.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, SpeechStarted):
            speech.set()

    bus.subscribe(on_event)
    writer = TranscriptWriter(bus, args.transcript) if args.transcript else None
    load_seconds: dict[str, float] = {}
    finished = False
    try:
        if progress is not None:
            progress.loading(_stage_descriptions(args))
        pipeline = build_pipeline(args, bus)
        previous = _install_signal_handlers(pipeline) if install_signals else {}
        try:
            load_seconds = pipeline.start(
                on_ready=progress.stage_ready if progress is not None else None,
                on_loaded=progress.ready if progress is not None else None,
            )
            pipeline.wait()
            finished = not pipeline.stop_event.is_set()
        finally:
            stuck = pipeline.stop(STOP_TIMEOUT_S)
            if stuck:
                logger.warning("threads still running after %.0f s: %s", STOP_TIMEOUT_S, ", ".join(stuck))
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if writer is not None:
            writer.close()
    heard = speech.is_set() if args.input_audio and not args.input_text and finished else None
    return RunSummary(turns=metrics.turns, load_seconds=load_seconds, speech_detected=heard)


def _stage_descriptions(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(stage, backend, what it loads) for each stage the run uses, for the start-up lines."""
    from speech_to_speech.pipeline.registry import REGISTRY

    model_flags = {"stt": "stt_model", "llm": "llm_model", "tts": "tts_voice"}
    described = []
    for stage, name in backend_names(args, local_ends(args).speech_input).items():
        backend = REGISTRY[stage].get(name)
        model = getattr(args, model_flags[stage], "") if stage in model_flags else ""
        what = f"model {model}" if model else (backend.summary if backend is not None else "")
        described.append((stage, name, what))
    return described


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


class ConsoleLogFilter(logging.Filter):
    """Keeps tracebacks off the console below debug level.

    A failure inside a turn is shown once by the console, from its event
    (:class:`~speech_to_speech.core.events.StageError`, or the reply's error); its log
    record, marked with :data:`~speech_to_speech.core.handler.SHOWN_AS_EVENT`, is
    dropped. Any other record with an exception keeps its message, with the
    exception's type and text appended instead of the traceback. With
    ``--log_level debug`` this filter is not installed and every traceback is logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop or shorten ``record``; True when it should still be printed."""
        if getattr(record, "shown_as_event", False):
            return False
        if not record.exc_info:
            return True
        exc = record.exc_info[1]
        if exc is not None:
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}".replace("%", "%%")
            record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


def setup_logging(level_name: str) -> None:
    """Log to stderr at ``level_name``; below debug, without tracebacks (see :class:`ConsoleLogFilter`)."""
    level = getattr(logging, str(level_name).upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    if level > logging.DEBUG:
        for handler in logging.getLogger().handlers:
            handler.addFilter(ConsoleLogFilter())
    _quiet_libraries()


def fail(message: str) -> int:
    """Print ``message`` as the one ``error:`` line and return the runtime-failure status (1)."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_FAILURE


def _report_native_crashes() -> None:
    """On a native crash (an engine built for another CPU, say), print every thread's Python stack
    (which stage, which call) instead of a bare "Segmentation fault" (README "Troubleshooting").
    Written to the process's real stderr, whatever ``sys.stderr`` was replaced with."""
    stream = sys.__stderr__
    if stream is not None and not faulthandler.is_enabled():
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no file descriptor to write to
            faulthandler.enable(file=stream, all_threads=True)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status (0, 1 or 2, see the module doc)."""
    _report_native_crashes()
    args = parse_args(argv)
    if args.print_system_prompt:
        from handlers.llm.embedded import wants_compact_prompt
        from speech_to_speech.llm.prompts import build_voice_system_prompt

        local = args.llm_backend in ("llama-cpp", "transformers", "mlx-lm")  # they run the embedded models
        compact = local and wants_compact_prompt(args.llm_model or "")
        print(build_voice_system_prompt(args.system_prompt, compact=compact))
        return 0
    setup_logging(args.log_level)
    bus = EventBus()
    console = ConsoleReporter(bus)
    try:
        if args.mode == "server":
            return serve(args)
        summary = run(args, bus, progress=LoadProgress(console.stream))
    except RUNTIME_ERRORS as exc:
        logger.debug("run failed", exc_info=True)
        return fail(str(exc) or type(exc).__name__)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, the traceback with --log_level debug
        logger.debug("unexpected failure", exc_info=True)
        return fail(f"unexpected {type(exc).__name__}: {exc} (--log_level debug shows the traceback)")
    if summary.speech_detected is False:
        console.no_speech(args.input_audio)
    return 0


def entry() -> None:
    """The command: run :func:`main`, then end the process with its status at once.

    Every file the run writes is closed by then (the transcript by :func:`run`, the output audio
    by its sink). What is skipped is the interpreter's teardown of the native model libraries:
    besides taking 0.5-3 s, it frees llama.cpp's context under a decode that a Ctrl-C left
    running in a provider reader thread (a prompt evaluation cannot be interrupted), which ended
    the process with a segmentation fault (``tests/test_live_audio.py`` found it: Ctrl-C while a
    reply was being generated, 2 runs in 4).
    """
    _exit_now(main())


def serve(args: argparse.Namespace) -> int:
    """Run the realtime server until SIGINT/SIGTERM, then leave the process at once.

    After a clean stop (every session closed) the process exits with
    ``os._exit`` once stdout, stderr and the log are flushed: the interpreter's
    own teardown of the native model libraries (torch, CTranslate2, ONNX
    Runtime) would otherwise take 0.5-3 s, beyond the 2 s that a stop is
    allowed. The server writes no files, so nothing is lost.

    Raises:
        PipelineError: the address cannot be served.
        UnknownBackendError, BackendUnavailableError: a backend cannot be imported (found by the
            builder when the warm-up session is built, before any model loads).
    """
    from speech_to_speech.realtime.server import run_server

    try:
        run_server(args)
    except OSError as exc:
        raise PipelineError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except BackendUnavailableError:
        raise  # found by the builder before any model loaded: reported as in local mode
    except RuntimeError as exc:
        # model-loading threads cannot be interrupted; leave without running native
        # destructors under them (they abort or report leaks at interpreter exit)
        _exit_now(fail(str(exc)))
    _exit_now(0)
    return 0  # not reached


def _exit_now(status: int) -> None:
    """Flush stdio and the log, then end the process without the interpreter's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def _quiet_libraries() -> None:
    for name in ("httpx", "urllib3", "faster_whisper", "transformers", "piper", "websockets"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
