"""Room noise for tests and benchmarks: a fan, music, other people talking, at a chosen level.

Used by ``scripts/benchmark_room.py`` (played into the PulseAudio room) and
``tests/test_background_gate.py`` (mixed offline).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from speech_to_speech.testing.room import TAP_RATE, frame_rms
from speech_to_speech.testing.speech_data import librivox_clips

#: the kinds :func:`make_noise` makes
NOISES = ("pink", "music", "babble")
#: how many readers babble mixes
BABBLE_VOICES = 4


def make_noise(
    kind: str, seconds: float, rate: int = TAP_RATE, seed: int = 7, voices: Sequence[Path] | None = None
) -> np.ndarray:
    """``seconds`` of ``kind`` noise at ``rate`` Hz, float32 with an RMS of 1 (scaled by the caller).

    ``pink``: a fan (1/f power); ``music``: a chord per second with a melody note each half
    second; ``babble``: :data:`BABBLE_VOICES` LibriVox readers at once, each looped at the same
    RMS (``voices``, 16 kHz files; default: the first of :func:`librivox_clips`).

    Raises:
        ValueError: an unknown kind; babble at a rate other than the clips' 16 kHz.
    """
    rng = np.random.default_rng(seed)
    count = int(seconds * rate)
    if kind == "pink":  # 1/f power: white noise shaped in the frequency domain
        spectrum = np.fft.rfft(rng.standard_normal(count))
        frequencies = np.fft.rfftfreq(count, 1 / rate)
        spectrum[1:] /= np.sqrt(frequencies[1:])
        spectrum[0] = 0
        noise = np.fft.irfft(spectrum, count)
    elif kind == "music":  # a chord per second (root, third, fifth) with a melody note on each half second
        t = np.arange(count) / rate
        roots = 220 * 2 ** (np.array([0, 5, 7, 3]) / 12)
        noise = np.zeros(count)
        for second in range(int(np.ceil(seconds))):
            part = slice(second * rate, min(count, (second + 1) * rate))
            root = roots[second % len(roots)]
            for ratio in (1, 1.26, 1.5):
                noise[part] += np.sin(2 * np.pi * root * ratio * t[part])
            for half in range(2):
                note = slice(part.start + half * rate // 2, min(part.stop, part.start + (half + 1) * rate // 2))
                pitch = root * 2 ** (rng.integers(0, 12) / 12) * 2
                envelope = np.exp(-np.arange(note.stop - note.start) / (0.15 * rate))
                noise[note] += 1.5 * np.sin(2 * np.pi * pitch * t[note]) * envelope
    elif kind == "babble":  # several LibriVox readers at once, each looped
        mixed = []
        for path in list(voices if voices is not None else librivox_clips())[:BABBLE_VOICES]:
            samples, clip_rate = sf.read(str(path), dtype="float32", always_2d=True)
            if clip_rate != rate:
                raise ValueError(f"babble is made at the clips' rate, {clip_rate} Hz, not {rate} Hz")
            voice = samples.mean(axis=1)
            mixed.append(np.resize(voice / (np.sqrt(np.mean(voice**2)) + 1e-9), count))
        noise = np.sum(mixed, axis=0)
    else:
        raise ValueError(f"unknown noise {kind!r}; one of {', '.join(NOISES)}")
    return (noise / (np.sqrt(np.mean(noise**2)) + 1e-12)).astype(np.float32)


def speech_rms(clip: Path) -> float:
    """RMS of the loud 20 ms frames of ``clip`` (within 30 dB of its loudest: its speech, not its pauses)."""
    samples, _ = sf.read(str(clip), dtype="float32", always_2d=True)
    rms = frame_rms(samples.mean(axis=1), TAP_RATE)
    loud = rms[rms > rms.max() * 10 ** (-30 / 20)]
    return float(np.sqrt(np.mean(loud**2)))
