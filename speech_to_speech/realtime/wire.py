"""The wire codec: audio as the Realtime protocol carries it (base64 pcm16, mono, 24 kHz)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from speech_to_speech.core import audio
from speech_to_speech.core.audio import WIRE_RATE
from speech_to_speech.realtime.protocol import ProtocolError

__all__ = ["WIRE_RATE", "decode_audio", "encode_audio", "float_to_pcm16", "pcm16_to_float"]


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Little-endian int16 PCM bytes → float32 in [-1, 1].

    Raises:
        ProtocolError: for an odd number of bytes.
    """
    try:
        return audio.pcm16_to_float(data)
    except ValueError as exc:
        raise ProtocolError("invalid_audio", str(exc)) from None


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] → little-endian int16 PCM bytes (clipped, rounded: :mod:`core.audio`)."""
    return audio.float_to_pcm16(samples)


def decode_audio(audio_b64: Any) -> np.ndarray:
    """The ``audio`` of an ``input_audio_buffer.append``: base64 pcm16 → float32 samples.

    Raises:
        ProtocolError: not a string, not base64, or an odd number of bytes.
    """
    if not isinstance(audio_b64, str):
        raise ProtocolError("invalid_value", "'audio' must be a base64 string", param="audio")
    try:
        data = base64.b64decode(audio_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio", "'audio' is not valid base64", param="audio") from None
    return pcm16_to_float(data)


def encode_audio(samples: np.ndarray) -> str:
    """float32 samples → the base64 pcm16 ``delta`` of a ``response.output_audio.delta``."""
    return base64.b64encode(float_to_pcm16(samples)).decode("ascii")
