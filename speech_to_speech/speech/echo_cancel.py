"""Acoustic echo cancellation and noise suppression of the input, before the VAD and the STT.

With speakers on, the microphone hears the assistant's own voice. The echo gate
(:mod:`speech_to_speech.turns.echo`) can only set aside input that is no louder than that echo,
so a user who talks over the voice must be louder than it. An echo canceller removes the voice
from the input instead, and what is left is the user.

:class:`EchoCanceller` runs WebRTC's audio processing module (AEC3, the canceller of Chrome and
of most WebRTC clients, with its high-pass filter and, optionally, its noise suppression) as the
``livekit`` wheel ships it (``rtc.AudioProcessingModule``, a dependency): a prebuilt wheel
for Linux, macOS and Windows, where ``aec-audio-processing`` and ``speexdsp`` are source
distributions that need a C++ toolchain and their libraries' headers. The far end (what was
played) comes from the :class:`~speech_to_speech.speech.playback.PlaybackReference` that the
speaker (local mode) or a WebRTC call's outgoing track already keeps, with the time each block
went out; the near end is the VAD's input. Both are cut into the module's 10 ms frames at
16 kHz. Before each input block is cleaned, every block played up to the moment that input
arrived is given to the module as the far end, so the far end always leads its echo, and AEC3's
own delay estimator finds how far (the delay given, :data:`DELAY_HINT_MS`, is a starting point).

The cleaned input lags the raw input by one 10 ms frame (:data:`FRAME_S`), the price of
re-framing any block size into 10 ms frames.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import numpy as np

from speech_to_speech.core.audio import RateConverter, float_to_pcm16, pcm16_to_float
from speech_to_speech.speech.playback import PlaybackReference

logger = logging.getLogger(__name__)

#: the audio processing module takes frames of exactly 10 ms (WebRTC's ``AudioProcessing``)
FRAME_S = 0.010
#: the delay hint between a block going out and its echo coming in, ms: a sound card's output and
#: input buffers (PortAudio's default latencies are 20-100 ms each); AEC3 estimates the real one
DELAY_HINT_MS = 60
#: played audio kept for the canceller at most this long, s (an input that stopped coming must not
#: let it grow without end)
RENDER_KEPT_S = 2.0


class EchoCancellerUnavailable(RuntimeError):
    """The ``livekit`` wheel that holds WebRTC's audio processing module is not installed."""


def load_audio_processing(echo_cancellation: bool, noise_suppression: bool) -> Any:
    """A new ``livekit.rtc.AudioProcessingModule`` (high-pass filter on, gain control off).

    Raises:
        EchoCancellerUnavailable: ``livekit`` is not installed (``pip install livekit``).
    """
    try:
        from livekit import rtc
    except ImportError as exc:
        raise EchoCancellerUnavailable(
            f"echo cancelling and noise suppression need the livekit wheel ({exc}); "
            "pip install livekit, or --echo_cancel false --noise_suppression false"
        ) from None
    return rtc.AudioProcessingModule(
        echo_cancellation=echo_cancellation,
        noise_suppression=noise_suppression,
        high_pass_filter=True,
        auto_gain_control=False,
    )


class EchoCanceller:
    """Cleans the input of the assistant's echo (and of stationary noise, when asked).

    :meth:`process` is called from the VAD's thread only; the played audio arrives from the
    speaker's (or the call's) thread through the reference's tap.

    Args:
        reference: the voice as it is played (None: nothing is played that the input hears; only
            noise suppression makes sense then).
        rate: the input's rate, Hz (the VAD's 16 kHz).
        echo_cancellation: run AEC3 (needs ``reference``).
        noise_suppression: run WebRTC's noise suppression.
        delay_ms: see :data:`DELAY_HINT_MS`.

    Raises:
        EchoCancellerUnavailable: see :func:`load_audio_processing`.
    """

    def __init__(
        self,
        reference: PlaybackReference | None,
        rate: int = 16_000,
        echo_cancellation: bool = True,
        noise_suppression: bool = False,
        delay_ms: int = DELAY_HINT_MS,
    ) -> None:
        self.rate = rate
        self.echo_cancellation = echo_cancellation and reference is not None
        self.noise_suppression = noise_suppression
        self.delay_ms = delay_ms
        self._apm = load_audio_processing(self.echo_cancellation, noise_suppression)
        from livekit import rtc  # loaded by load_audio_processing

        self._frame_type = rtc.AudioFrame
        self._frame = round(FRAME_S * rate)
        self._lock = threading.Lock()
        self._played: collections.deque[tuple[float, np.ndarray]] = collections.deque()
        self._played_samples = 0
        self._resampler = RateConverter(rate)
        self._render = np.zeros(0, dtype=np.float32)
        self._capture = np.zeros(0, dtype=np.float32)
        self._out = np.zeros(self._frame, dtype=np.float32)  # one frame of delay: see the module doc
        #: frames given to the module so far: far end (played) and near end (input)
        self.render_frames = 0
        self.capture_frames = 0
        self._reference = reference if self.echo_cancellation else None
        if self._reference is not None:
            self._reference.tap(self._on_played)

    def close(self) -> None:
        """Stop taking the played audio (a canceller replaced by another)."""
        if self._reference is not None:
            self._reference.untap(self._on_played)
            self._reference = None

    def _on_played(self, samples: np.ndarray, sample_rate: int, start: float) -> None:
        """The reference's tap: ``samples`` (float32) went out at ``start`` (monotonic s)."""
        samples = self._resampler.process(samples, sample_rate)
        with self._lock:
            self._played.append((start, np.asarray(samples, dtype=np.float32)))
            self._played_samples += len(samples)
            while self._played_samples > RENDER_KEPT_S * self.rate and len(self._played) > 1:
                self._played_samples -= len(self._played.popleft()[1])

    def process(self, samples: np.ndarray, arrived: float) -> np.ndarray:
        """The input block ``samples`` (float32 in [-1, 1] at :attr:`rate`), cleaned.

        Args:
            samples: the input, any length.
            arrived: when it arrived (monotonic s): the audio played until then is its far end.

        Returns:
            As many float32 samples, one 10 ms frame behind the input.
        """
        frame_of = self._frame_type
        if self.echo_cancellation:
            with self._lock:
                due = []
                while self._played and self._played[0][0] <= arrived:
                    block = self._played.popleft()[1]
                    self._played_samples -= len(block)
                    due.append(block)
            if due:
                self._render = np.concatenate([self._render, *due])
            while len(self._render) >= self._frame:
                frame, self._render = self._render[: self._frame], self._render[self._frame :]
                self._apm.process_reverse_stream(frame_of(float_to_pcm16(frame), self.rate, 1, self._frame))
                self.render_frames += 1
        self._capture = np.concatenate([self._capture, np.asarray(samples, dtype=np.float32)])
        cleaned = []
        while len(self._capture) >= self._frame:
            frame, self._capture = self._capture[: self._frame], self._capture[self._frame :]
            audio = frame_of(float_to_pcm16(frame), self.rate, 1, self._frame)
            if self.echo_cancellation:
                self._apm.set_stream_delay_ms(self.delay_ms)
            self._apm.process_stream(audio)
            cleaned.append(pcm16_to_float(bytes(audio.data)))
            self.capture_frames += 1
        self._out = np.concatenate([self._out, *cleaned])
        out, self._out = self._out[: len(samples)], self._out[len(samples) :]
        return out
