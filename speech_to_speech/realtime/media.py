"""Assistant audio on a media transport (WebRTC): a buffer that the transport's sender drains in real time.

Over WebSocket the assistant's audio leaves as ``response.output_audio.delta`` events. Over
WebRTC it leaves on an audio track, which asks for one frame (20 ms) at a time, on the clock.
:class:`OutputAudioBuffer` sits between the two: the session's sink pushes audio (already at the
transport's rate) as it becomes due; the track takes frames. Each chunk carries a validity
check (the session asks its gate whether the chunk's stamp is still current), asked again for
every frame, so nothing of a cancelled reply is sent after the cancel. Callbacks run when their
audio *leaves* the server:

- ``on_start`` of a chunk, when its first sample is sent (the session sends the words spoken in
  it then, so a client can show them as they are heard, not ahead of the audio);
- a :meth:`OutputAudioBuffer.mark`, once everything pushed before it was sent or dropped (the
  end of a response: ``response.done`` follows its last audio).

Callbacks run on the thread that takes frames (the transport's event loop). This module does not
import aiortc.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from speech_to_speech.speech.playback import PlaybackReference

#: WebRTC audio (Opus) runs at 48 kHz
MEDIA_RATE = 48_000
#: one frame of the outbound track: 20 ms
FRAME_S = 0.020


@dataclass
class _Chunk:
    samples: np.ndarray
    valid: Callable[[], bool] | None
    on_start: Callable[[], None] | None
    on_recall: Callable[[int, bool], None] | None = None
    offset: int = 0


@dataclass
class _Mark:
    callback: Callable[[], None]


class OutputAudioBuffer:
    """Assistant audio waiting to leave on a media track, frame by frame. Thread-safe.

    Args:
        rate: sample rate of the pushed audio and of the frames, Hz.
        frame_samples: samples per frame (default 20 ms at ``rate``).
        reference: where each frame with assistant audio is recorded as it leaves (the echo
            gate's reference); None: nowhere.
    """

    def __init__(
        self, rate: int = MEDIA_RATE, frame_samples: int = 0, reference: PlaybackReference | None = None
    ) -> None:
        self.rate = rate
        self.reference = reference
        self.frame_samples = frame_samples or round(rate * FRAME_S)
        self._entries: collections.deque[_Chunk | _Mark] = collections.deque()
        self._lock = threading.Lock()
        #: samples sent since the buffer was created (silence included)
        self.sent_samples = 0

    def push(
        self,
        samples: np.ndarray,
        valid: Callable[[], bool] | None = None,
        on_start: Callable[[], None] | None = None,
        on_recall: Callable[[int, bool], None] | None = None,
    ) -> None:
        """Queue float32 mono ``samples`` (at :attr:`rate`) after what is queued.

        Args:
            valid: asked before each frame that would send some of them; once it returns False
                the rest of the chunk is dropped unsent.
            on_start: run when the chunk's first sample is sent.
            on_recall: run by :meth:`recall` if it takes the chunk back, with the number of its
                samples not sent and whether its first one was.
        """
        if len(samples):
            with self._lock:
                chunk = _Chunk(np.asarray(samples, dtype=np.float32), valid, on_start, on_recall)
                self._entries.append(chunk)

    def recall(self) -> int:
        """Take back what was pushed after the last mark and not sent yet (the assistant pauses).

        Audio before a mark stays: a mark ends a response whose sender no longer holds its
        audio, so that audio plays out. Each chunk taken back (the unsent rest of the one being
        sent included) has its ``on_recall`` run, on this thread, after the lock is released.

        Returns:
            the number of samples taken back.
        """
        recalled: list[tuple[_Chunk, int]] = []
        with self._lock:
            while self._entries and isinstance(self._entries[-1], _Chunk):
                chunk = self._entries.pop()
                assert isinstance(chunk, _Chunk)
                recalled.append((chunk, len(chunk.samples) - chunk.offset))
        for chunk, unsent in reversed(recalled):
            if chunk.on_recall is not None:
                chunk.on_recall(unsent, chunk.offset > 0)
        return sum(unsent for _, unsent in recalled)

    def mark(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything pushed before now has been sent or dropped."""
        with self._lock:
            if self._entries:
                self._entries.append(_Mark(callback))
                return
        callback()

    @property
    def pending(self) -> bool:
        """Whether anything (audio or a mark) waits to be taken by :meth:`next_frame`."""
        return bool(self._entries)

    @property
    def queued_s(self) -> float:
        """Seconds of audio waiting (stale audio included until a frame drops it)."""
        with self._lock:
            return sum(len(e.samples) - e.offset for e in self._entries if isinstance(e, _Chunk)) / self.rate

    def clear(self) -> bool:
        """Drop every queued chunk now (marks still run, on the next frame); True if audio was dropped."""
        with self._lock:
            dropped = any(isinstance(e, _Chunk) for e in self._entries)
            self._entries = collections.deque(e for e in self._entries if isinstance(e, _Mark))
        return dropped

    def next_frame(self) -> tuple[np.ndarray, bool]:
        """The next frame (float32, :attr:`frame_samples` long, silence where nothing is queued).

        Returns:
            the frame and whether any of it is assistant audio. The callbacks that became due
            (chunk starts, marks) run before this returns, in queue order.
        """
        frame = np.zeros(self.frame_samples, dtype=np.float32)
        filled = 0
        due: list[Callable[[], None]] = []
        with self._lock:
            entries = self._entries
            while entries:
                entry = entries[0]
                if isinstance(entry, _Mark):
                    entries.popleft()
                    due.append(entry.callback)
                    continue
                if filled == len(frame):
                    break
                if entry.valid is not None and not entry.valid():  # cancelled: never send another sample of it
                    entries.popleft()
                    continue
                if entry.offset == 0 and entry.on_start is not None:
                    due.append(entry.on_start)
                take = min(len(frame) - filled, len(entry.samples) - entry.offset)
                frame[filled : filled + take] = entry.samples[entry.offset : entry.offset + take]
                filled += take
                entry.offset += take
                if entry.offset == len(entry.samples):
                    entries.popleft()
            self.sent_samples += len(frame)
        if filled and self.reference is not None:
            self.reference.add(frame, self.rate, time.monotonic())
        for callback in due:
            callback()
        return frame, filled > 0
