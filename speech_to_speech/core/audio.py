"""Audio format conventions and the one float ↔ pcm16 codec.

Inside the pipeline audio is mono float32 in [-1, 1]; int16 PCM exists only at the edges (WAV
files, the Realtime protocol's ``audio/pcm``, WebRTC frames). Every conversion between the two goes
through this module, so every edge rounds and scales the same way.
"""

from __future__ import annotations

import numpy as np

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
