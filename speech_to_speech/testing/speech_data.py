"""Helpers for tests on real speech: word error rate and the LibriVox test clips."""

from __future__ import annotations

import re
from pathlib import Path

from speech_to_speech.testing import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data"
LIBRIVOX_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")  # Debian: pocketsphinx-testdata


def normalize(text: str) -> list[str]:
    """Lower-case words without punctuation; hyphens split words ("ill-disposed" → "ill disposed")."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by Levenshtein alignment over words."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / len(ref)


def librivox_clips() -> dict[Path, str]:
    """LibriVox clips with reference transcripts: the Debian package's, else the bundled one."""
    clips: dict[Path, str] = {}
    transcription = LIBRIVOX_DIR / "transcription"
    if transcription.is_file():
        for line in transcription.read_text().splitlines():
            match = re.match(r"<s>(.*)</s>\s*\((.+)\)", line.strip())
            if match and (LIBRIVOX_DIR / f"{match.group(2)}.wav").is_file():
                clips[LIBRIVOX_DIR / f"{match.group(2)}.wav"] = match.group(1).strip()
    if not clips:
        clips[DATA / "librivox-0880.wav"] = (DATA / "librivox-0880.txt").read_text().strip()
    return clips
