"""Audio format conventions and the one float ↔ pcm16 codec.

Inside the pipeline audio is mono float32 in [-1, 1]; int16 PCM exists only at the edges (WAV
files, the Realtime protocol's ``audio/pcm``, WebRTC frames). Every conversion between the two goes
through this module, so every edge rounds and scales the same way; so does every change of rate of
a stream (:class:`StreamResampler`, :class:`RateConverter`, on soxr).
"""

from __future__ import annotations

import numpy as np
import soxr

#: the pipeline's input rate, Hz (what Silero VAD and Whisper take)
SAMPLE_RATE = 16_000
#: samples per VAD chunk: 32 ms at 16 kHz, the frame size Silero VAD v5 expects
CHUNK_SAMPLES = 512
#: the Realtime protocol's ``audio/pcm`` rate, Hz (16-bit little-endian mono)
WIRE_RATE = 24_000
#: float → int16 multiplies by 32767 (so +1.0 maps to the largest int16 and -1.0 to its negation);
#: int16 → float divides by 32768 (so every int16 lands in [-1, 1))
_TO_INT16 = 32767.0
_TO_FLOAT = 32768.0


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples (any shape) in [-1, 1] → int16, clipped and rounded to the nearest step."""
    return np.round(np.clip(samples, -1.0, 1.0) * _TO_INT16).astype(np.int16)


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    """int16 samples (any shape) → float32 in [-1, 1)."""
    return (np.asarray(samples, dtype=np.float32) / _TO_FLOAT).astype(np.float32)


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] → little-endian 16-bit PCM bytes (2 bytes per sample)."""
    return float_to_int16(samples).astype("<i2").tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Little-endian 16-bit PCM bytes → float32 samples in [-1, 1).

    Raises:
        ValueError: for an odd number of bytes.
    """
    if len(data) % 2:
        raise ValueError("pcm16 audio must have an even number of bytes")
    return int16_to_float(np.frombuffer(data, dtype="<i2"))


def rms(samples: np.ndarray) -> float:
    """Root mean square of float samples in [-1, 1] (0.0 for an empty array)."""
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float32)))) if len(samples) else 0.0


#: the level above which a reply sample is its first sound: |x| > 0.001 (-60 dBFS)
FIRST_SOUND = 1e-3
#: frames of :func:`speech_end_index`, ms; speech is a frame louder than the peak frame less this
#: many dB and than :data:`SPEECH_FLOOR_FACTOR` x the noise floor (the 10th percentile of frame RMS)
SPEECH_FRAME_MS = 20
SPEECH_BELOW_PEAK_DB = 30.0
SPEECH_FLOOR_FACTOR = 2.5
#: frames quieter than this (-90 dBFS) are digital silence, not a noise floor: a file's padding, a
#: sound server with nothing playing. Around a recording they made the floor 0, so a LibriVox
#: clip's own background (-43 to -48 dBFS, within 30 dB of its peak) after the last word counted as
#: speech: padded with zeros, the five clips' speech ended 20-380 ms later than in the clips alone,
#: and voice-to-voice and the end-of-turn delay read that much short in a quiet room (not under a
#: fan, whose level is the floor). So the floor is taken between the leading and trailing digital
#: silence; where every frame there is within 30 dB of the peak (speech with no background, a
#: synthetic signal) it stays 0. Files that start with speech or their own background end where they
#: did (the LibriVox clips); of the benchmark's Piper turns (0.3 s of zeros first) 5 of 10 end one
#: 20 ms frame earlier, of 12 espeak-ng sentences (zeros in their pauses) 2 end 40-80 ms earlier
DIGITAL_SILENCE_RMS = 10 ** (-90 / 20)


def speech_end_index(samples: np.ndarray, rate: int, frame_ms: int = SPEECH_FRAME_MS) -> int | None:
    """Where the speech in ``samples`` ends: the end of the last ``frame_ms`` frame whose RMS is above
    ``max(peak frame - 30 dB, 2.5 x noise floor)``, the floor being the 10th percentile of the frames
    between any leading and trailing digital silence (:data:`DIGITAL_SILENCE_RMS`); None when there
    are no whole frames.

    The one definition of the end of the user's speech: the pipeline's voice-to-voice starts there
    (the VAD applies it to each utterance it endpoints) and so does every benchmark's, read from
    the input audio. Args: float samples in [-1, 1], shape ``(n,)``, at ``rate`` Hz. Returns a
    sample index in ``0..n``.
    """
    frame = rate * frame_ms // 1000
    count = len(samples) // frame if frame else 0
    if count == 0:
        return None
    frames = np.asarray(samples[: count * frame], dtype=np.float64).reshape(count, frame)
    levels = np.sqrt((frames**2).mean(axis=1))
    below_peak = levels.max() * 10 ** (-SPEECH_BELOW_PEAK_DB / 20)
    heard = np.flatnonzero(levels > DIGITAL_SILENCE_RMS)
    inner = levels[heard[0] : heard[-1] + 1] if len(heard) else levels
    # digital silence around speech with no background of its own: no floor
    no_background = len(inner) < count and not (inner <= below_peak).any()
    floor = 0.0 if no_background else float(np.percentile(inner, 10))
    threshold = max(below_peak, SPEECH_FLOOR_FACTOR * floor)
    loud = np.flatnonzero(levels > threshold)
    return int(loud[-1] + 1) * frame if len(loud) else None


def first_sound_index(samples: np.ndarray, threshold: float = FIRST_SOUND) -> int | None:
    """Index of the first sample with ``|x| > threshold`` (:data:`FIRST_SOUND`, -60 dBFS), None if
    all is silence: where a reply's first audio is, in the sink and in every benchmark."""
    loud = np.flatnonzero(np.abs(samples) > threshold)
    return int(loud[0]) if len(loud) else None


class StreamResampler:
    """One mono stream resampled chunk by chunk (soxr's streaming resampler, its default quality).

    Identity when both rates are equal. Args: ``in_rate`` and ``out_rate`` in Hz; ``dtype``
    ``"float32"`` (the pipeline's samples) or ``"int16"`` (a client's wire audio); chunks of any
    length, 1-D, of that dtype.
    """

    def __init__(self, in_rate: int, out_rate: int, dtype: str = "float32") -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.dtype = np.dtype(dtype)
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype=dtype)

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample one chunk; ``last=True`` also flushes the tail and readies it for a new stream."""
        if self._stream is None:
            return np.asarray(samples, dtype=self.dtype)
        out = self._stream.resample_chunk(np.ascontiguousarray(samples, dtype=self.dtype), last=last)
        if last:
            self._stream.clear()
        return out

    def flush(self) -> np.ndarray:
        """The tail still held for the end of the stream (empty for the identity)."""
        return self.process(np.zeros(0, dtype=self.dtype), last=True)

    def reset(self) -> None:
        """Forget buffered input (after a barge-in)."""
        if self._stream is not None:
            self._stream.clear()


class RateConverter:
    """Streams that arrive at any rate, each resampled to ``out_rate`` Hz by a
    :class:`StreamResampler` of its own input rate (a client that changes rate mid-session, a
    WebRTC track at 48 kHz beside 24 kHz appends). float32 in, float32 out."""

    def __init__(self, out_rate: int) -> None:
        self.out_rate = out_rate
        self._streams: dict[int, StreamResampler] = {}

    def process(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """``samples`` (float32 mono at ``rate`` Hz) at :attr:`out_rate`."""
        stream = self._streams.get(rate)
        if stream is None:
            stream = self._streams[rate] = StreamResampler(rate, self.out_rate)
        return stream.process(samples)
