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

**It stands aside until it hears an echo.** Where the microphone does not hear the speaker
(headphones), AEC3 still holds the user back while the voice plays (a LibriVox reader talking over
the voice, with none of it in the microphone, kept 26-73 % of their chunks as speech, 98 % raw).
So the canceller starts out passing the raw input through (AEC3 adapts all the same), and an
:class:`EchoPathDetector` looks for the played voice in the raw input; from the first echo it finds,
the input is the cleaned one. That is what lets it be on by default in local mode.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import numpy as np

from speech_to_speech.core.audio import RateConverter, float_to_pcm16, pcm16_to_float, rms
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


#: the detector's window of input, s, and the longest delay between playing a block and hearing it
#: (a sound card's output and input buffers plus the room: 50-250 ms on laptops), s
DETECT_WINDOW_S, DETECT_MAX_LAG_S = 1.0, 0.5
#: how often the detector looks, s of input
DETECT_EVERY_S = 0.25
#: the normalised cross-correlation of (pre-emphasised) input and voice that counts as an echo.
#: Measured on 16 kHz speech (``tests/test_echo_cancel.py``'s room: 60 ms late, a 150 ms
#: reverberant tail): the Piper voice's echo 0.59 (0.55 at -20 dB); five LibriVox readers talking
#: over the voice with no echo path at most 0.13
ECHO_CORRELATION = 0.25
#: windows in a row above :data:`ECHO_CORRELATION` before the canceller engages
DETECT_NEEDED = 2
#: blocks that start within this of the previous one's end continue it, samples (30 ms at 16 kHz)
CONTIGUOUS_SAMPLES = 480
#: voice quieter than this (-50 dBFS, as the echo gate's) in the window: nothing to look for
DETECT_SILENT_RMS = 10 ** (-50 / 20)


class EchoPathDetector:
    """Does the input hear what was played? The peak normalised cross-correlation, over delays of
    0 to :data:`DETECT_MAX_LAG_S`, of the last :data:`DETECT_WINDOW_S` of input and the voice played
    before it, both pre-emphasised (first difference: speech's low end correlates with anything).

    :meth:`played` may be called from any thread (the canceller calls it under its lock);
    :meth:`heard` from one thread (the VAD's). :attr:`found` turns True after
    :data:`DETECT_NEEDED` windows in a row correlate by :data:`ECHO_CORRELATION` or more, and
    stays True.

    Args:
        rate: the rate of both signals, Hz.
    """

    def __init__(self, rate: int = 16_000) -> None:
        self.rate = rate
        self.found = False
        #: the last window's peak correlation and its delay, ms (None: no voice in the window)
        self.correlation: float | None = None
        self.delay_ms: float | None = None
        #: the highest correlation of any window with the voice in it (None: none looked at yet)
        self.highest: float | None = None
        self._window = round(DETECT_WINDOW_S * rate)
        self._lag = round(DETECT_MAX_LAG_S * rate)
        self._every = round(DETECT_EVERY_S * rate)
        self._played: collections.deque[tuple[float, np.ndarray]] = collections.deque()
        self._played_lock = threading.Lock()
        self._input = np.zeros(0, dtype=np.float32)
        self._since_check = 0
        self._in_a_row = 0

    def played(self, samples: np.ndarray, start: float) -> None:
        """The voice ``samples`` (float32 at :attr:`rate`) went out at ``start`` (monotonic s)."""
        with self._played_lock:
            self._played.append((start, samples))
            horizon = start - 2 * (DETECT_WINDOW_S + DETECT_MAX_LAG_S)
            while self._played and self._played[0][0] < horizon:
                self._played.popleft()

    def heard(self, samples: np.ndarray, arrived: float) -> bool:
        """The raw input block ``samples`` (float32 at :attr:`rate`) arrived at ``arrived``
        (monotonic s, the time of its last sample). Returns :attr:`found`."""
        if self.found:
            return True
        self._input = np.concatenate([self._input, samples])[-self._window :]
        self._since_check += len(samples)
        if self._since_check < self._every or len(self._input) < self._window:
            return False
        self._since_check = 0
        self.correlation, self.delay_ms = self._peak(arrived)
        if self.correlation is None:
            return False  # no voice: neither for nor against
        self.highest = max(self.highest or 0.0, self.correlation)
        self._in_a_row = self._in_a_row + 1 if self.correlation >= ECHO_CORRELATION else 0
        if self._in_a_row >= DETECT_NEEDED:
            self.found = True
            logger.info(
                "echo canceller: the input hears the voice (correlation %.2f, %.0f ms late); cancelling",
                self.correlation,
                self.delay_ms,
            )
        return self.found

    def _voice_before(self, arrived: float) -> np.ndarray:
        """The voice played in the :attr:`_window` + :attr:`_lag` samples up to ``arrived``."""
        voice = np.zeros(self._window + self._lag, dtype=np.float32)
        begin = arrived - len(voice) / self.rate
        with self._played_lock:
            blocks = list(self._played)
        end: int | None = None
        for start, block in blocks:
            at = round((start - begin) * self.rate)
            if end is not None and abs(at - end) <= CONTIGUOUS_SAMPLES:
                at = end  # the next block of the same stream (a resampler's blocks vary in length)
            end = at + len(block)
            lo, hi = max(at, 0), min(at + len(block), len(voice))
            if lo < hi:
                voice[lo:hi] = block[lo - at : hi - at]
        return voice

    def _peak(self, arrived: float) -> tuple[float | None, float | None]:
        voice = self._voice_before(arrived)
        if rms(voice[self._lag :]) < DETECT_SILENT_RMS:
            return None, None
        near, far = np.diff(self._input.astype(np.float64)), np.diff(voice.astype(np.float64))
        n = len(near)
        size = 1 << (n + len(far) - 1).bit_length()
        # products[k] = sum_i near[i] * far[i + k]: near's sample i heard far's sample i + k, which
        # was played (lag - k) samples earlier
        products = np.fft.irfft(np.fft.rfft(far, size) * np.conj(np.fft.rfft(near, size)), size)[: self._lag + 1]
        energy = np.concatenate([[0.0], np.cumsum(far * far)])
        far_energy = energy[n : n + self._lag + 1] - energy[: self._lag + 1]
        denominator = np.sqrt(np.maximum(far_energy, 1e-12) * max(float(np.dot(near, near)), 1e-12))
        scores = np.abs(products) / denominator
        best = int(np.argmax(scores))
        return float(scores[best]), (self._lag - best) * 1000 / self.rate


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
        wait_for_echo: pass the raw input through until an :class:`EchoPathDetector` hears the
            voice in it (see the module doc); False: cancel from the start.

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
        wait_for_echo: bool = True,
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
        #: finds the echo before the cleaned input is used (None: cleaned from the start)
        self.detector = EchoPathDetector(rate) if self.echo_cancellation and wait_for_echo else None
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
        samples = np.asarray(samples, dtype=np.float32)
        if self.detector is not None and not self.detector.found:
            self.detector.played(samples, start)
        with self._lock:
            self._played.append((start, samples))
            self._played_samples += len(samples)
            while self._played_samples > RENDER_KEPT_S * self.rate and len(self._played) > 1:
                self._played_samples -= len(self._played.popleft()[1])

    def process(self, samples: np.ndarray, arrived: float) -> np.ndarray:
        """The input block ``samples`` (float32 in [-1, 1] at :attr:`rate`), cleaned.

        Args:
            samples: the input, any length.
            arrived: when it arrived (monotonic s): the audio played until then is its far end.

        Returns:
            As many float32 samples, one 10 ms frame behind the input: the raw ones while
            :attr:`detector` has not heard an echo (AEC3 adapts all the same).
        """
        samples = np.asarray(samples, dtype=np.float32)
        cancelling = self.detector is None or self.detector.heard(samples, arrived)
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
        self._capture = np.concatenate([self._capture, samples])
        cleaned = []
        while len(self._capture) >= self._frame:
            frame, self._capture = self._capture[: self._frame], self._capture[self._frame :]
            audio = frame_of(float_to_pcm16(frame), self.rate, 1, self._frame)
            if self.echo_cancellation:
                self._apm.set_stream_delay_ms(self.delay_ms)
            self._apm.process_stream(audio)
            cleaned.append(pcm16_to_float(bytes(audio.data)) if cancelling or self.noise_suppression else frame)
            self.capture_frames += 1
        self._out = np.concatenate([self._out, *cleaned])
        out, self._out = self._out[: len(samples)], self._out[len(samples) :]
        return out
