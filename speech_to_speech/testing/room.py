"""A room made of a private PulseAudio, for live mode on real sound devices (tests and benchmarks).

:class:`SoundServer` starts PulseAudio (Debian ``pulseaudio``; PortAudio reaches it through ALSA's
pulse plugin, ``libasound2-plugins``, as on a Linux laptop) with three null sinks:

- ``mic``: what is played into it is the default source (its monitor), the "microphone";
- ``speaker``: the default sink, where the program's replies play;
- ``tap``: both of the above, through two loopbacks of equal latency, recorded with ``parecord``,
  so the user's speech and the reply lie on one timeline.

:class:`LiveProgram` runs ``python s2s_pipeline.py`` in live mode against it; :func:`measure` plays a
clip into ``mic`` and reads voice-to-voice off the recording. Used by ``scripts/benchmark_live.py``,
``scripts/benchmark_echo.py``, ``scripts/benchmark_room.py`` and ``tests/test_live_audio.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np
import soundfile as sf

from speech_to_speech.testing import REPO_ROOT as ROOT

MAIN = str(ROOT / "s2s_pipeline.py")
#: the tap's rate, Hz (the pipeline's own input rate)
TAP_RATE = 16_000
#: frames of this many ms are loud or quiet
FRAME_MS = 20
#: a frame is sound when its RMS is above this (the null sinks are digitally silent otherwise)
SOUND_RMS = 1e-3
#: latency of both loopbacks into the tap, ms (equal, so that they cancel out)
LOOPBACK_MS = 30
#: latency of the echo loopback (speaker → microphone), ms
ECHO_MS = 40
#: a new capture stream on this private PulseAudio hears nothing for its first ~1.9 s (beeps
#: played into ``mic`` every 0.5 s from the moment the stream started: the first to arrive came at
#: 1.87 s, through sounddevice and parecord alike), so speech said as the program prints "ready"
#: is lost; it is given this long, s
STREAM_START_S = 3.0


class SoundServerUnavailable(RuntimeError):
    """PulseAudio, its tools or ALSA's pulse plugin are not installed."""


def missing_tools() -> list[str]:
    """What a sound server run needs and this machine lacks (empty when all is there)."""
    missing = [tool for tool in ("pulseaudio", "pactl", "paplay", "parecord") if shutil.which(tool) is None]
    plugins = list(Path("/usr/lib").glob("*/alsa-lib/libasound_module_pcm_pulse.so"))
    if not plugins:
        missing.append("libasound2-plugins (ALSA's pulse plugin)")
    return missing


class Recording:
    """A ``parecord`` run writing a 16 kHz mono WAV.

    Args:
        path: the WAV file.
        process: the running ``parecord``.
    """

    def __init__(self, path: Path, process: subprocess.Popen[bytes]) -> None:
        self.path = path
        self.process = process

    def seconds(self) -> float:
        """How much is recorded so far, s (the WAV header left out)."""
        return max(0.0, (self.path.stat().st_size - 44) / 2 / TAP_RATE) if self.path.exists() else 0.0

    def samples(self) -> np.ndarray:
        """What is recorded so far: float32 at :data:`TAP_RATE`."""
        data, rate = sf.read(str(self.path), dtype="float32", always_2d=True)
        assert rate == TAP_RATE
        return data.mean(axis=1)

    def stop(self) -> None:
        """Stop recording (the file stays)."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class SoundServer:
    """A private PulseAudio with a virtual microphone, a speaker and a recording of both.

    The default source, ``microphone``, is the ``mic`` sink's monitor remapped as a source of its
    own (a browser lists no monitor of a sink as a microphone). With ``echo_gain`` the speaker is
    also heard by the microphone, as on a laptop with its speakers on: a loopback from the
    speaker's monitor into ``mic``, :data:`ECHO_MS` late, at that volume.

    Args:
        workdir: where the server's socket, runtime files and recordings go.
        echo_gain: the echo's PulseAudio volume (1.0 = 100 %: as loud as what the speaker plays;
            0.7 = 70 %, -9 dB on PulseAudio's cubic scale); None: no echo.

    Raises:
        SoundServerUnavailable: a tool is missing (see :func:`missing_tools`).
        RuntimeError: the server did not come up within 10 s.
    """

    def __init__(self, workdir: Path, echo_gain: float | None = None) -> None:
        missing = missing_tools()
        if missing:
            raise SoundServerUnavailable("missing: " + ", ".join(missing))
        self.workdir = workdir
        runtime = workdir / "pulse-runtime"
        runtime.mkdir(parents=True, exist_ok=True)
        socket = workdir / "pulse-native"
        #: the environment of every client (the program under test, paplay, parecord)
        self.env = {**os.environ, "PULSE_SERVER": f"unix:{socket}", "XDG_RUNTIME_DIR": str(runtime)}
        modules = [
            f"module-native-protocol-unix socket={socket} auth-anonymous=1",
            f"module-null-sink sink_name=speaker rate={TAP_RATE} channels=1",
            f"module-null-sink sink_name=mic rate={TAP_RATE} channels=1",
            f"module-null-sink sink_name=tap rate={TAP_RATE} channels=1",
        ]
        command = ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit"]
        command += [arg for module in modules for arg in ("-L", module)]
        self._log = (workdir / "pulseaudio.log").open("wb")
        self._server = subprocess.Popen(command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        self._recordings: list[Recording] = []
        deadline = time.monotonic() + 10
        while self._pactl("info").returncode != 0:
            if time.monotonic() > deadline or self._server.poll() is not None:
                self.close()
                raise RuntimeError(f"pulseaudio did not start; see {workdir / 'pulseaudio.log'}")
            time.sleep(0.1)
        self._pactl("load-module", "module-remap-source", "master=mic.monitor", "source_name=microphone")
        self._pactl("set-default-sink", "speaker")
        self._pactl("set-default-source", "microphone")
        # after the defaults: PulseAudio 16 moves the loopbacks' streams to a new default source
        for source in ("mic.monitor", "speaker.monitor"):
            self._pactl("load-module", "module-loopback", f"source={source}", "sink=tap", f"latency_msec={LOOPBACK_MS}")
        if echo_gain is not None:
            self._echo(echo_gain)

    def _pactl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["pactl", *args], env=self.env, capture_output=True, timeout=10)

    def reflect(self, delay_ms: int, gain: float) -> None:
        """A reflection of the speaker (a wall): heard by the microphone ``delay_ms`` after the
        direct echo, at volume ``gain``."""
        self._echo(gain, ECHO_MS + delay_ms)

    def _echo(self, gain: float, latency_ms: int = ECHO_MS) -> None:
        """The speaker heard by the microphone: a loopback speaker.monitor → mic at volume ``gain``."""
        loaded = self._pactl(
            "load-module", "module-loopback", "source=speaker.monitor", "sink=mic", f"latency_msec={latency_ms}"
        )
        module = loaded.stdout.decode().strip()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the loopback's stream appears once it runs
            listing = self._pactl("list", "sink-inputs").stdout.decode()
            for block in listing.split("Sink Input #")[1:]:
                if f"Owner Module: {module}\n" in block:
                    self._pactl("set-sink-input-volume", block.split()[0], f"{round(gain * 100)}%")
                    return
            time.sleep(0.1)
        raise RuntimeError("the echo loopback did not start")

    def record(self, path: Path, source: str = "tap.monitor") -> Recording:
        """Start recording ``source`` (default: the tap, microphone and speaker together) to a
        16 kHz mono WAV at ``path``."""
        command = ["parecord", f"--device={source}", f"--rate={TAP_RATE}", "--channels=1", "--file-format=wav"]
        recording = Recording(path, subprocess.Popen([*command, str(path)], env=self.env))
        self._recordings.append(recording)
        return recording

    def say(self, clip: Path) -> None:
        """Play ``clip`` into the virtual microphone; returns once it has played."""
        subprocess.run(["paplay", "--device=mic", str(clip)], env=self.env, check=True, timeout=120)

    def close(self) -> None:
        """Stop the recordings and the server."""
        for recording in self._recordings:
            recording.stop()
        self._server.terminate()
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            self._server.kill()
        self._log.close()


class LiveProgram:
    """``python s2s_pipeline.py`` in live mode (default microphone and speaker), its output read
    line by line on a thread.

    Args:
        env: the environment (the sound server's).
        flags: extra command-line flags.
    """

    def __init__(self, env: dict[str, str], flags: Sequence[str] = ()) -> None:
        self.process = subprocess.Popen(
            [sys.executable, MAIN, *flags],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """Wait until an output line contains ``text``; False on time-out or exit."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.lines)):
                return True
            if self.process.poll() is not None:
                return any(text in line for line in list(self.lines))
            time.sleep(0.05)
        return False

    def wait_listening(self, timeout_s: float) -> bool:
        """Wait until the program is ready and its microphone stream hears (see
        :data:`STREAM_START_S`); False on time-out or exit."""
        if not self.wait_for("ready in", timeout_s):
            return False
        time.sleep(STREAM_START_S)
        return self.process.poll() is None

    def interrupt(self, timeout_s: float = 10.0) -> int:
        """Ctrl-C: send SIGINT and return the exit status (the process is killed after ``timeout_s``)."""
        self.process.send_signal(2)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self._reader.join(5)


def frame_rms(samples: np.ndarray, rate: int) -> np.ndarray:
    """RMS of each whole :data:`FRAME_MS` frame of ``samples`` (mono, at ``rate`` Hz)."""
    frame = rate * FRAME_MS // 1000
    count = len(samples) // frame
    return np.sqrt((samples[: count * frame].astype(np.float64).reshape(count, frame) ** 2).mean(axis=1))


def sound_frames(samples: np.ndarray, rate: int = TAP_RATE, threshold: float = SOUND_RMS) -> np.ndarray:
    """Which :data:`FRAME_MS` frames of ``samples`` hold sound (RMS above ``threshold``)."""
    return frame_rms(samples, rate) > threshold


def trimmed(clip: Path, workdir: Path) -> tuple[Path, float]:
    """The speech of ``clip`` alone (its leading and trailing noise cut: RMS above the peak - 30 dB),
    written to ``workdir``; returns the file and its length, s."""
    samples, rate = sf.read(str(clip), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    frame = rate * FRAME_MS // 1000
    rms = frame_rms(mono, rate)
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-30 / 20))
    speech = mono[loud[0] * frame : (loud[-1] + 1) * frame]
    out = workdir / f"{clip.stem}.speech.wav"
    sf.write(str(out), speech, rate)
    return out, len(speech) / rate


def sound_after(recording: np.ndarray, after_s: float) -> float | None:
    """Time of the first sound in ``recording`` (at :data:`TAP_RATE`) at or after ``after_s``, s."""
    first = int(np.ceil(after_s * 1000 / FRAME_MS))
    loud = np.flatnonzero(sound_frames(recording)[first:])
    return (first + loud[0]) * FRAME_MS / 1000 if len(loud) else None


def wait_for_quiet(tap: Recording, quiet_s: float = 1.5, timeout_s: float = 120.0) -> bool:
    """Wait until the last ``quiet_s`` of ``tap`` hold no sound (the previous reply has ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        recorded = tap.samples()
        frames = sound_frames(recorded)
        tail = round(quiet_s * 1000 / FRAME_MS)
        if len(frames) >= tail and not frames[-tail:].any():
            return True
        time.sleep(0.2)
    return False


def measure(server: SoundServer, tap: Recording, clip: Path, gap_s: float) -> float | None:
    """Play the speech of ``clip``, wait ``gap_s``; voice-to-voice of its reply on ``tap``, ms
    (None: no reply heard).

    On the tap the speech starts at its first sound after what was recorded before it was played,
    and ends its own length later; the reply is the first sound after that.
    """
    speech, length_s = trimmed(clip, server.workdir)
    wait_for_quiet(tap)  # a reply still playing would be heard as this one's
    before_s = tap.seconds()
    server.say(speech)
    time.sleep(gap_s)
    recorded = tap.samples()
    onset = sound_after(recorded, max(0.0, before_s - 0.5))
    if onset is None:
        return None
    reply = sound_after(recorded, onset + length_s + FRAME_MS / 1000)
    return None if reply is None else (reply - onset - length_s) * 1000
