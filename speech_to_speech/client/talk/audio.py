"""Where the terminal client's audio comes from and goes: the microphone or a file paced in real
time (int16 mono at the wire rate, 24 kHz, in 40 ms blocks), and the speaker, a WAV file on the
input's timeline, or nowhere. The speaker and the WAV file are built on
:mod:`speech_to_speech.speech.audio_io`'s ``OutputBuffer`` and ``Timeline``, as the pipeline's own
sinks are; sending is :mod:`speech_to_speech.client.realtime`'s ``PacedSender``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import soundfile as sf

from speech_to_speech.client.realtime import (
    BLOCK_S,
    BLOCK_SAMPLES,
    WIRE_RATE,
    Blocker,
    PacedSender,
    silence,
)
from speech_to_speech.client.talk.console import Console
from speech_to_speech.core.audio import StreamResampler
from speech_to_speech.speech.audio_io import AudioDeviceError, OutputBuffer, Timeline, import_sounddevice

if TYPE_CHECKING:
    from speech_to_speech.client.talk.conversation import Conversation

#: seconds at most to wait for the speaker to play out what is queued before exiting
DRAIN_TIMEOUT_S = 60.0


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
        self._resampler = StreamResampler(WIRE_RATE, self.rate, dtype="int16")
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
        resampler = StreamResampler(self.rate, WIRE_RATE, dtype="int16")
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
