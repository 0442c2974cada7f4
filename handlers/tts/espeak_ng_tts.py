"""espeak-ng: a formant voice for about a hundred languages, the fallback of every other voice.

espeak-ng is the Debian/Ubuntu package ``espeak-ng`` (macOS: ``brew install espeak-ng``); it is
run as a command (``espeak-ng -v fr --stdout``, the text on stdin), one process per sentence
batch: its own voices write 22,050 Hz 16-bit WAV. It sounds robotic but speaks any language it
has a voice for in ~20-60 ms per sentence, so the Piper backend hands it every text in a
language it has no Piper voice for (:class:`EspeakNG` is shared by both backends), rather than
reading French with an English voice or saying nothing.

Voices: ``--tts_voice fr=fr-be,de=de`` picks espeak-ng voices by language; a language without one
uses the espeak-ng voice of that language code when espeak-ng has one, else English.
"""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
from collections.abc import Iterator

import numpy as np
import soundfile as sf

from speech_to_speech.speech.tts import BaseTTSHandler, base_language, parse_voices

logger = logging.getLogger(__name__)

#: the voice for text whose language espeak-ng has no voice for (or that is unknown)
DEFAULT_VOICE = "en"
#: longest wait for one synthesis, s (a sentence batch takes well under a second)
TIMEOUT_S = 30.0


class EspeakNGError(RuntimeError):
    """espeak-ng is missing or failed."""


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Float32 mono samples in [-1, 1] and their rate (Hz) of the WAV espeak-ng wrote to a pipe.

    espeak-ng cannot seek back on stdout, so its ``data`` chunk declares a size of about 2 GiB;
    libsndfile (through ``soundfile``) reads what is there.

    Raises:
        EspeakNGError: not a WAV soundfile reads, or not mono.
    """
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, TypeError, ValueError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise EspeakNGError(f"espeak-ng wrote no readable WAV ({len(data)} bytes): {exc}") from None
    if samples.shape[1] != 1:
        raise EspeakNGError(f"espeak-ng wrote {samples.shape[1]} channels, not 1")
    return samples[:, 0], int(rate)


class EspeakNG:
    """The espeak-ng command: one voice per language, text in, float32 audio out.

    Args:
        voices: espeak-ng voice names by language code (``{"fr": "fr-be"}``; key ``""``: the voice
            for a language with no entry and no espeak-ng voice of its own).
        executable: the command (found on ``PATH`` when a bare name).

    Raises:
        EspeakNGError: the command is not installed.
    """

    def __init__(self, voices: dict[str, str] | None = None, executable: str = "espeak-ng") -> None:
        path = shutil.which(executable)
        if path is None:
            raise EspeakNGError(f"{executable} is not installed (Debian/Ubuntu: apt install espeak-ng)")
        self.executable = path
        self.voices = dict(voices or {})
        listing = subprocess.run([path, "--voices"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        listed = {line.split()[1].lower() for line in listing.stdout.splitlines()[1:] if len(line.split()) > 1}
        #: the language codes espeak-ng has a voice for, lower case, with and without a region
        #: (``"fr-fr"`` is listed; ``"fr"`` selects it too)
        self.languages = listed | {code.split("-")[0] for code in listed}

    def voice_for(self, language: str | None) -> str:
        """The espeak-ng voice for ``language`` (ISO 639-1, None: unknown)."""
        code = base_language(language)
        if code is not None and code in self.voices:
            return self.voices[code]
        if code is not None and code in self.languages:
            return code
        return self.voices.get("", DEFAULT_VOICE)

    def synthesize(self, text: str, language: str | None) -> tuple[np.ndarray, int]:
        """Float32 mono audio of ``text`` spoken in ``language``, and its rate in Hz.

        Raises:
            EspeakNGError: espeak-ng failed or wrote no audio.
        """
        voice = self.voice_for(language)
        done = subprocess.run(
            [self.executable, "-v", voice, "--stdout"],
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not done.stdout:
            error = done.stderr.decode("utf-8", "replace").strip() or f"exit status {done.returncode}"
            raise EspeakNGError(f"espeak-ng -v {voice} failed: {error}")
        return decode_wav(done.stdout)


class EspeakNGTTSHandler(BaseTTSHandler):
    """Speaks every language with espeak-ng (22,050 Hz); ``tts_voice`` maps languages to
    espeak-ng voices (``fr=fr-be``), a bare name is the voice for the rest."""

    engine = "espeak-ng"

    def load(self) -> None:
        self.espeak = EspeakNG(parse_voices(self.config.tts_voice))
        self.sample_rate = self.espeak.synthesize("Ready.", None)[1]

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        yield self.espeak.synthesize(text, None)[0]

    def speak(self, text: str, language: str | None) -> tuple[Iterator[np.ndarray], int, str]:
        audio, rate = self.espeak.synthesize(text, language)
        return iter((audio,)), rate, self.engine
