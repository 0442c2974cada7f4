"""Audio and text sources and sinks: files, microphone, speaker.

Sources are stages with no input queue; sinks are stages with no output
queue. Resampling uses soxr (a real, stateful resampler) and happens once:
at the source for input (to 16 kHz) and at the sink for output.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from speech_to_speech.core.audio import CHUNK_SAMPLES, SAMPLE_RATE
from speech_to_speech.core.events import Event, ResponseDone
from speech_to_speech.core.handler import BaseHandler
from speech_to_speech.core.messages import END_OF_STREAM, AudioChunk, AudioOutput, Transcript
from speech_to_speech.speech.playback import PacedAudioSink, PlaybackReference

logger = logging.getLogger(__name__)


class AudioDeviceError(RuntimeError):
    """No usable audio device (or no PortAudio library) for live input or output."""


class StreamClock:
    """The shared timeline of a run: seconds since the input stream started."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def restart(self) -> None:
        """Set time zero to now (called by the source when it starts feeding)."""
        self.start = time.monotonic()

    def now(self) -> float:
        """Seconds since time zero."""
        return time.monotonic() - self.start


def load_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Read any file libsndfile can decode as mono float32 at ``sample_rate`` Hz.

    Multi-channel audio is averaged to mono; other rates are resampled with soxr.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        IsADirectoryError: if ``path`` is a directory.
        ValueError: if the file cannot be decoded as audio.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"input audio is a directory, not a file: {path}")
    if not path.is_file():
        raise FileNotFoundError(f"input audio not found: {path}")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise ValueError(f"cannot read audio file {path}: {exc}") from exc
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate)
    return np.ascontiguousarray(mono, dtype=np.float32)


class FileSource(BaseHandler):
    """Feeds an audio file into the pipeline in 512-sample chunks at real-time pace.

    The file is read and resampled in the constructor, so a bad file fails
    before any model loads.

    Args:
        path: the audio file (see :func:`load_audio`).
        clock: the run's timeline; restarted when feeding begins.
        speed: pace multiplier (1.0 = real time; larger is faster).
        tail_silence_s: silence appended after the file, as a microphone would hear.

    Raises:
        FileNotFoundError, IsADirectoryError, ValueError: see :func:`load_audio`.
    """

    def __init__(
        self,
        *args: Any,
        path: str | Path,
        clock: StreamClock,
        speed: float = 1.0,
        tail_silence_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, input_queue=None, **kwargs)
        self.path = Path(path)
        self.clock = clock
        self.speed = speed
        tail = np.zeros(int(tail_silence_s * SAMPLE_RATE), dtype=np.float32)
        self.samples = np.concatenate([load_audio(self.path), tail])

    @property
    def duration_s(self) -> float:
        """Length of the fed audio, seconds."""
        return len(self.samples) / SAMPLE_RATE

    def _loop(self) -> None:
        self.clock.restart()
        for offset in range(0, len(self.samples), CHUNK_SAMPLES):
            chunk = self.samples[offset : offset + CHUNK_SAMPLES]
            due = self.clock.start + (offset + len(chunk)) / SAMPLE_RATE / self.speed
            delay = due - time.monotonic()
            if delay > 0 and self.stop_event.wait(delay):
                return
            if not self.emit(AudioChunk(chunk, SAMPLE_RATE, time.monotonic(), offset)):
                return
        assert self.output_queue is not None
        self.output_queue.put_unless_stopped(END_OF_STREAM, self.stop_event)


class TextSource(BaseHandler):
    """Sends typed user turns, one at a time, each after the previous reply ended.

    Args:
        texts: the user turns, in order.
        clock: the run's timeline.
        turn_timeout_s: the longest wait for one reply before moving on.
    """

    def __init__(
        self, *args: Any, texts: list[str], clock: StreamClock, turn_timeout_s: float = 300.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, input_queue=None, **kwargs)
        self.texts = texts
        self.clock = clock
        self.turn_timeout_s = turn_timeout_s
        self._done: queue.Queue[int] = queue.Queue()
        self.bus.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, ResponseDone):
            self._done.put(event.turn_id)

    def _loop(self) -> None:
        self.clock.restart()
        for text in self.texts:
            stamp = self.gate.new_turn_stamp()
            if not self.emit(Transcript(stamp, text, speech_end_time=time.monotonic())):
                return
            deadline = time.monotonic() + self.turn_timeout_s
            while not self.stop_event.is_set():
                try:
                    if self._done.get(timeout=max(0.0, min(self.poll_s, deadline - time.monotonic()))) >= stamp.turn_id:
                        break
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        logger.warning("turn %d: no reply after %.0f s, moving on", stamp.turn_id, self.turn_timeout_s)
                        break
        assert self.output_queue is not None
        self.output_queue.put_unless_stopped(END_OF_STREAM, self.stop_event)


class MicrophoneSource(BaseHandler):
    """Captures the default microphone with sounddevice at 16 kHz, 512-sample blocks.

    Raises (from :meth:`setup`):
        AudioDeviceError: if PortAudio or an input device is missing.
    """

    def __init__(self, *args: Any, clock: StreamClock, **kwargs: Any) -> None:
        super().__init__(*args, input_queue=None, **kwargs)
        self.clock = clock
        self._stream: Any = None
        self._offset = 0

    def setup(self) -> None:
        sd = check_input_device()
        try:
            self._stream = sd.InputStream(
                samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=CHUNK_SAMPLES, callback=self._callback
            )
        except Exception as exc:
            raise AudioDeviceError(f"no usable microphone ({exc})") from exc

    def _callback(self, indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        if status:
            logger.debug("input status: %s", status)
        chunk = AudioChunk(indata[:, 0].copy(), SAMPLE_RATE, time.monotonic(), self._offset)
        self._offset += frames
        assert self.output_queue is not None
        try:
            self.output_queue.put_nowait(chunk)
        except queue.Full:
            logger.warning("VAD is behind: dropped %d input samples", frames)

    def _loop(self) -> None:
        self.clock.restart()
        self._stream.start()
        self.stop_event.wait()

    def cleanup(self) -> None:
        if self._stream is not None:
            self._stream.stop()
            self._stream.close()


def import_sounddevice() -> Any:
    """Import ``sounddevice`` (lazily: its import fails when the PortAudio library is missing).

    Raises:
        AudioDeviceError: PortAudio (or sounddevice itself) is not available.
    """
    try:
        import sounddevice as sd
    except (ImportError, OSError) as exc:  # OSError: PortAudio library not found
        raise AudioDeviceError(f"PortAudio is not available ({exc})") from exc
    return sd


def _check_device(kind: str, sample_rate: int) -> Any:
    sd = import_sounddevice()
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    try:
        check(samplerate=sample_rate, channels=1, dtype="float32")
    except Exception as exc:
        raise AudioDeviceError(f"no usable {'microphone' if kind == 'input' else 'speaker'} ({exc})") from None
    return sd


def check_input_device(sample_rate: int = SAMPLE_RATE) -> Any:
    """Return the sounddevice module if a default microphone takes mono float32 at ``sample_rate``.

    Raises:
        AudioDeviceError: no PortAudio, no input device, or unsupported settings.
    """
    return _check_device("input", sample_rate)


def check_output_device(sample_rate: int) -> Any:
    """Return the sounddevice module if a default speaker plays mono float32 at ``sample_rate``.

    Raises:
        AudioDeviceError: no PortAudio, no output device, or unsupported settings.
    """
    return _check_device("output", sample_rate)


class OutputBuffer:
    """Audio waiting for a sound device's output callback: tagged chunks, played in order.

    Thread-safe: the stage (or client) appends, PortAudio's thread calls :meth:`fill`.
    """

    def __init__(self) -> None:
        self._chunks: collections.deque[tuple[np.ndarray, Any]] = collections.deque()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._chunks)

    def append(self, samples: np.ndarray, tag: Any) -> None:
        """Queue ``samples`` (at the device's rate and dtype) with ``tag`` (a stamp, an item id)."""
        if len(samples):
            with self._lock:
                self._chunks.append((samples, tag))

    def fill(
        self,
        out: np.ndarray,
        skip: Callable[[Any], bool] | None = None,
        played: Callable[[Any, int], None] | None = None,
    ) -> None:
        """Fill the 1-D ``out`` from the queue, silence after it runs dry (an underrun).

        Chunks whose tag ``skip`` refuses are dropped unplayed; ``played(tag, n)`` is told
        of every ``n`` samples of a chunk handed to the device.
        """
        filled = 0
        frames = len(out)
        with self._lock:
            while filled < frames and self._chunks:
                samples, tag = self._chunks[0]
                if skip is not None and skip(tag):  # cancelled: never play another sample of it
                    self._chunks.popleft()
                    continue
                take = min(frames - filled, len(samples))
                out[filled : filled + take] = samples[:take]
                filled += take
                if played is not None:
                    played(tag, take)
                if take == len(samples):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = (samples[take:], tag)
        out[filled:] = 0

    def keep(self, predicate: Callable[[Any], bool]) -> None:
        """Drop the queued chunks whose tag ``predicate`` refuses."""
        with self._lock:
            self._chunks = collections.deque(c for c in self._chunks if predicate(c[1]))

    def clear(self) -> Any:
        """Drop everything queued; return the tag of the chunk that was playing (the head), or None."""
        with self._lock:
            head = self._chunks[0][1] if self._chunks else None
            self._chunks.clear()
        return head


class Timeline:
    """Audio pieces placed at sample positions on one timeline, cut at a barge-in, rendered at the end.

    ``pieces`` holds ``(position, samples, tag)`` in the order they were placed.
    """

    def __init__(self) -> None:
        self.pieces: list[tuple[int, np.ndarray, Any]] = []

    def __len__(self) -> int:
        return len(self.pieces)

    def place(self, position: int, samples: np.ndarray, tag: Any = None) -> None:
        """Put ``samples`` at sample ``position``."""
        self.pieces.append((position, samples, tag))

    def cut(self, at: int, where: Callable[[Any], bool] | None = None) -> None:
        """Silence everything from sample ``at`` on (only in pieces whose tag ``where`` accepts)."""
        kept = []
        for position, samples, tag in self.pieces:
            if (where is None or where(tag)) and position + len(samples) > at:
                samples = samples[: max(0, at - position)]
            if len(samples):
                kept.append((position, samples, tag))
        self.pieces = kept

    @property
    def end(self) -> int:
        """The sample after the last piece (0 when empty)."""
        return max((p + len(s) for p, s, _ in self.pieces), default=0)

    def render(self, length: int, dtype: Any) -> np.ndarray:
        """The timeline as one array of at least ``length`` samples; gaps are silence."""
        audio = np.zeros(max(length, self.end), dtype=dtype)
        for position, samples, _ in self.pieces:
            audio[position : position + len(samples)] = samples
        return audio


class FileSink(PacedAudioSink):
    """Writes the assistant's audio to a WAV file on the input's timeline.

    Each chunk is placed at its play time (seconds since the input started,
    see :class:`StreamClock`); gaps are silence. A barge-in cuts the reply at
    the interruption, as a speaker would. The file is written on shutdown and
    is at least as long as the input.

    Args:
        path: output WAV path.
        clock: the run's timeline.
        sample_rate: Hz of the file (default 16 kHz, the input's rate, so both mix).

    Raises:
        FileNotFoundError: if the output folder does not exist.
    """

    def __init__(
        self, *args: Any, path: str | Path, clock: StreamClock, sample_rate: int = SAMPLE_RATE, **kwargs: Any
    ) -> None:
        super().__init__(*args, sample_rate=sample_rate, **kwargs)
        self.path = Path(path)
        self.clock = clock
        self._pieces = Timeline()  # (play position, samples, stamp) of every chunk written
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"output folder does not exist: {self.path.parent}")

    def _position(self, when: float) -> int:
        return max(0, int((when - self.clock.start) * self.sample_rate))

    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        self._pieces.place(self._position(start), samples.copy(), item.stamp)

    def on_interrupt(self, at: float) -> None:
        self._pieces.cut(self._position(at), where=lambda stamp: not self.gate.admits(stamp))

    def on_pause(self, at: float) -> float:
        self._pieces.cut(self._position(at))
        return at

    def cleanup(self) -> None:
        audio = self._pieces.render(self._position(time.monotonic()), np.float32)
        sf.write(str(self.path), np.clip(audio, -1.0, 1.0), self.sample_rate, subtype="PCM_16")
        logger.info("wrote %.1f s of audio to %s", len(audio) / self.sample_rate, self.path)


class SpeakerSink(PacedAudioSink):
    """Plays the assistant's audio on the default output device.

    A sounddevice callback pulls from a small buffer that the sink fills
    ``lead_s`` ahead of play time; on barge-in the buffer is emptied, so the
    speaker goes quiet within one device block.

    Args:
        sample_rate: the device's rate, Hz.
        reference: where each block is recorded as it goes to the device (the VAD's echo gate
            compares the microphone with it); None: nowhere.

    Raises (from :meth:`setup`):
        AudioDeviceError: if PortAudio or an output device is missing.
    """

    lead_s = 0.08

    def __init__(
        self, *args: Any, sample_rate: int = 24_000, reference: PlaybackReference | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, sample_rate=sample_rate, **kwargs)
        self._stream: Any = None
        self._buffer = OutputBuffer()
        self.reference = reference

    def setup(self) -> None:
        sd = check_output_device(self.sample_rate)
        try:
            self._stream = sd.OutputStream(
                samplerate=self.sample_rate, channels=1, dtype="float32", blocksize=480, callback=self._callback
            )
            self._stream.start()
        except Exception as exc:
            raise AudioDeviceError(f"no usable speaker ({exc})") from exc

    def _callback(self, outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        self._buffer.fill(outdata[:, 0], skip=lambda stamp: not self.gate.admits(stamp))
        if self.reference is not None:
            self.reference.add(outdata[:, 0], self.sample_rate, time.monotonic())

    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        self._buffer.append(samples, item.stamp)

    def on_interrupt(self, at: float) -> None:
        self._buffer.keep(self.gate.admits)

    def on_pause(self, at: float) -> float:
        self._buffer.clear()
        return at

    def cleanup(self) -> None:
        if self._stream is not None:
            self._stream.stop()
            self._stream.close()


class NullSink(PacedAudioSink):
    """Discards audio (paced like a speaker) but still reports timing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, sample_rate=SAMPLE_RATE, **kwargs)

    def write(self, samples: np.ndarray, item: AudioOutput, start: float) -> None:
        pass
