"""Helpers shared by the benchmark scripts: clips, child processes, CPU and memory, tables.

- :func:`find_clips` / :func:`read_transcripts`: the LibriVox clips of the Debian package
  ``pocketsphinx-testdata`` (located with ``dpkg -L``) and their reference transcripts
  (word error rate: :func:`speech_to_speech.testing.speech_data.word_error_rate`, the tests' own).
- :class:`Child`: a subprocess whose stdout is watched line by line, whose CPU use can be
  sampled (psutil, else ``/proc``) and whose peak RSS is read when it is reaped
  (``os.wait4``: the child's own ``ru_maxrss``, not the maximum over every child).
- :class:`ProcessProbe` / :class:`ResourceSampler`: CPU seconds and RSS of any process by pid,
  sampled in a thread and tagged with the benchmark's current phase; :func:`free_port`.
- :func:`build_handler`: a stage handler built from the registry exactly as the pipeline
  builds it from the CLI's flags, for measuring one stage without a pipeline.
- :func:`percentile`, :func:`cell`, :func:`print_table`: reporting; :func:`split_extra`: the
  command line split at ``--`` (the benchmark's flags, the benchmarked program's).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from speech_to_speech.core.audio import FIRST_SOUND, first_sound_index, speech_end_index
from speech_to_speech.testing import REPO_ROOT

#: the Debian package that ships the LibriVox clips
CLIPS_PACKAGE = "pocketsphinx-testdata"
#: where that package installs them on Debian and Ubuntu
DEFAULT_CLIPS_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")
#: the clip bundled with the tests, used when the package is not installed
BUNDLED_CLIP = REPO_ROOT / "tests" / "data" / "librivox-0880.wav"


def find_clips(clips_dir: str | None = None) -> list[Path]:
    """The ``*.wav`` clips of ``clips_dir``, else those of pocketsphinx-testdata, else the bundled one."""
    if clips_dir is not None:
        return sorted(Path(clips_dir).glob("*.wav"))
    try:
        listing = subprocess.run(
            ["dpkg", "-L", CLIPS_PACKAGE], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    clips = [Path(line) for line in listing.splitlines() if "/librivox/" in line and line.endswith(".wav")]
    clips = sorted(clip for clip in clips if clip.is_file()) or sorted(DEFAULT_CLIPS_DIR.glob("*.wav"))
    return clips or ([BUNDLED_CLIP] if BUNDLED_CLIP.is_file() else [])


def read_transcripts(clips: list[Path]) -> dict[str, str]:
    """Reference transcripts by clip stem: from a Sphinx ``transcription`` file beside the clips
    (lines like ``<s> he was not an ill disposed young man </s> (file-stem)``), else ``STEM.txt``."""
    out: dict[str, str] = {}
    for folder in {clip.parent for clip in clips}:
        path = folder / "transcription"
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if match := re.match(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\(([^)]+)\)\s*$", line):
                    out[match.group(2)] = match.group(1).strip()
    for clip in clips:
        if clip.stem not in out and clip.with_suffix(".txt").is_file():
            out[clip.stem] = clip.with_suffix(".txt").read_text(encoding="utf-8").strip()
    return out


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` at the first ``--`` into (own flags, flags for the benchmarked program)."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def one_line(exc: BaseException, limit: int = 160) -> str:
    """``Type: message`` of ``exc`` on one line, shortened to ``limit`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- child processes ------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (a server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _proc_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process from ``/proc/PID/stat`` (utime + stime; Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    """Resident memory of a process from ``/proc/PID/status`` (VmRSS), MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    try:
        import psutil
    except ImportError:
        return _proc_cpu_seconds(pid)
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class ProbeUnavailable(RuntimeError):
    """Neither psutil nor ``/proc`` can read the process (message for the user)."""


class ProcessProbe:
    """Cumulative CPU seconds and current RSS of one process: psutil if installed, else ``/proc``.

    Raises:
        ProbeUnavailable: from the constructor when neither is available.
        psutil.Error: from the constructor when psutil finds no such process.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            import psutil
        except ImportError:
            self._process: Any = None
            if not Path(f"/proc/{pid}/stat").is_file():
                raise ProbeUnavailable("cannot sample the server: install psutil (or run on Linux)") from None
            self.method = "/proc"
        else:
            self._process = psutil.Process(pid)
            self.method = "psutil"

    def read(self) -> tuple[float, float]:
        """(CPU seconds used so far, user + system; RSS in MiB).

        Raises:
            OSError (or psutil.Error): the process is gone.
        """
        if self._process is not None:
            times = self._process.cpu_times()
            return times.user + times.system, self._process.memory_info().rss / 2**20
        return _proc_cpu_seconds(self.pid), _proc_rss_mb(self.pid)


class ResourceSampler:
    """Samples a process's CPU % and RSS in a thread, tagging each sample with the current phase.

    Set :attr:`phase` as the benchmark moves on; the first phase is "startup".

    Args:
        probe: reads the process.
        interval_s: seconds between samples.
    """

    def __init__(self, probe: ProcessProbe, interval_s: float) -> None:
        self.probe = probe
        self.interval_s = interval_s
        self.phase = "startup"
        self.samples: list[tuple[str, float, float]] = []  # (phase, CPU % of one core, RSS MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            last_cpu, _ = self.probe.read()
        except Exception:
            return
        last_t = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                cpu_s, rss_mb = self.probe.read()
            except Exception:  # the process ended
                return
            now = time.monotonic()
            percent = 100.0 * (cpu_s - last_cpu) / max(now - last_t, 1e-6)
            self.samples.append((self.phase, percent, rss_mb))
            last_cpu, last_t = cpu_s, now

    def summary(self, phase: str) -> tuple[float | None, float | None, float | None]:
        """(CPU mean %, CPU peak %, RSS peak MiB) of the samples taken during ``phase``."""
        rows = [(cpu, rss) for name, cpu, rss in self.samples if name == phase]
        if not rows:
            return None, None, None
        cpu = [c for c, _ in rows]
        return sum(cpu) / len(cpu), max(cpu), max(r for _, r in rows)


class Child:
    """A subprocess with its stdout and stderr collected line by line as they come.

    Args:
        command: the argv.
        ready: a regex; :attr:`ready` is set when a stdout line matches it.
    """

    def __init__(self, command: list[str], ready: str | None = None) -> None:
        self.command = command
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.ready = threading.Event()
        self.ready_at: float | None = None
        self.timed_out = False
        self._pattern = re.compile(ready) if ready else None
        self.proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self._readers = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout, True), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _drain(self, stream: Any, lines: list[str], watch: bool) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if watch and self._pattern is not None and not self.ready.is_set() and self._pattern.search(line):
                self.ready_at = time.monotonic()
                self.ready.set()
        stream.close()

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def cpu_percent(self, seconds: float) -> float | None:
        """Mean CPU use over the next ``seconds``, % of one core (None if the process ended)."""
        try:
            cpu0, wall0 = cpu_seconds(self.proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu1, wall1 = cpu_seconds(self.proc.pid), time.monotonic()
        except Exception:  # gone (psutil.NoSuchProcess, FileNotFoundError)
            return None
        return 100.0 * (cpu1 - cpu0) / (wall1 - wall0)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` if the process still runs."""
        if self.running():
            self.proc.send_signal(signum)

    def finish(self, timeout_s: float) -> tuple[int, float]:
        """Wait for the exit (killing the process after ``timeout_s``); return (exit status, peak RSS MiB)."""

        def kill() -> None:
            self.timed_out = True
            self.proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
        finally:
            timer.cancel()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        for reader in self._readers:
            reader.join(5)
        # ru_maxrss is in KiB on Linux and in bytes on macOS
        rss = usage.ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else usage.ru_maxrss / 1024
        return self.proc.returncode, rss

    def failure(self) -> str:
        """Why the run failed, in one line (the last stderr line)."""
        if self.timed_out:
            return "timed out"
        last = [line for line in self.stderr if line.strip()]
        return f"exit {self.proc.returncode}: {last[-1] if last else 'no output'}"


# -- the end of the user's speech and the first reply audio, read from audio files ------------
#: voice-to-voice is the end of speech in the input to the first sound of the reply in the output


def speech_end_s(samples: Any, rate: int, frame_ms: int = 20) -> float | None:
    """End of the last frame of speech, s (:func:`speech_to_speech.core.audio.speech_end_index`)."""
    import numpy as np

    index = speech_end_index(np.asarray(samples), rate, frame_ms)
    return None if index is None else index / rate


def first_sound_s(samples: Any, rate: int, threshold: float = FIRST_SOUND) -> float | None:
    """Time of the first sample with ``|x| > threshold``, s, None if all is silence."""
    import numpy as np

    index = first_sound_index(np.asarray(samples), threshold)
    return None if index is None else index / rate


def read_mono(path: Path) -> tuple[Any, int]:
    """The audio file at ``path`` as float32 mono (channels averaged) and its rate in Hz."""
    import soundfile as sf

    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return data.mean(axis=1), rate


# -- stages without a pipeline ----------------------------------------------------------------


def build_handler(stage: str, args: Any) -> Any:
    """The ``stage`` handler the pipeline would build from the parsed CLI ``args``, not yet set up.

    It has a fresh ``Gate`` (see its ``gate`` attribute) and ``EventBus`` and no queues;
    call ``setup()``, then use the backend's methods (``transcribe``, ``process``, ``synthesize``).
    """
    from speech_to_speech.core.cancel import Gate
    from speech_to_speech.core.events import EventBus
    from speech_to_speech.pipeline.builder import resolve_device
    from speech_to_speech.pipeline.cli import config_from_args
    from speech_to_speech.pipeline.registry import get_backend

    name = {"vad": args.vad, "stt": args.stt, "llm": args.llm_backend, "tts": args.tts}[stage]
    backend = get_backend(stage, name)
    return backend.load_handler_class()(
        stop_event=threading.Event(),
        input_queue=None,
        output_queue=None,
        gate=Gate(),
        bus=EventBus(),
        config=config_from_args(backend.config_cls, args),
        device=resolve_device(args.device),
        name=f"{stage}:{name}",
    )


# -- reporting --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, linear interpolation; None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def cell(value: float | None, digits: int = 0) -> str:
    """``value`` with ``digits`` decimals, or ``-``."""
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Print aligned columns (first left-aligned, others right-aligned); ``[]`` is a blank line."""
    filled = [headers, *(row for row in rows if row)]
    widths = [max(len(row[i]) for row in filled) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row) if row else "")
