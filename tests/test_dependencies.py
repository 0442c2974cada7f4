"""Every import is declared in pyproject.toml.

A fresh machine only has what ``pip install -e '.[test]'`` installs, so a module that the code
imports but pyproject.toml does not declare (directly: a dependency of a dependency is not
enough, it can disappear with the next release of that dependency) breaks it, while a machine
with leftovers from earlier work stays green. This walks every module of ``speech_to_speech``,
``handlers``, ``scripts/``, ``tests/`` and ``s2s_pipeline.py`` with ``ast`` (imports at top
level and inside functions, ``importlib.import_module("...")``, ``__import__("...")``,
``pytest.importorskip("...")``) plus the registry's lazy ``handler_path`` strings, maps each
third-party top-level module to its distribution with ``importlib.metadata`` and checks that
the distribution is named in ``[project] dependencies`` or in an optional extra.

A module that is not installed fails too, with one exception: an optional extra need not be
installed, so a module missing from the environment passes when its name, normalised, is a
requirement of an extra and not of the core install (``mlx_lm``: ``mlx-lm`` in ``[mlx]``). Without
the distribution installed there is no metadata to map the module by, so the name is all there is.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import shutil
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from speech_to_speech.pipeline.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
IMPORT_CALLS = {"import_module", "__import__", "importorskip"}  # called with the module name first


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution in a PEP 508 requirement string (``"mlx[cpu]>=0.20; ..."`` → ``mlx``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"cannot read a distribution name from requirement {requirement!r}")
    return normalise(match.group(1))


def declared(pyproject: Path) -> dict[str, list[str]]:
    """Normalised distribution → where pyproject declares it (``"dependencies"``, ``"[extra]"``)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    where: dict[str, list[str]] = {}
    for requirement in project.get("dependencies", []):
        where.setdefault(requirement_name(requirement), []).append("dependencies")
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            where.setdefault(requirement_name(requirement), []).append(f"[{extra}]")
    return where


def extras(pyproject: Path) -> dict[str, set[str]]:
    """Extra → the normalised distributions it lists."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return {
        extra: {requirement_name(r) for r in requirements}
        for extra, requirements in project.get("optional-dependencies", {}).items()
    }


def source_files() -> list[Path]:
    """Every Python file of the packages, the scripts, the tests and the entry point."""
    files = [ROOT / "s2s_pipeline.py"]
    for folder in ("speech_to_speech", "handlers", "scripts", "tests"):
        files.extend(sorted((ROOT / folder).rglob("*.py")))
    return [f for f in files if f.is_file()]


def first_party() -> set[str]:
    """Top-level names that are this repository's own code (scripts import their siblings)."""
    names = {"speech_to_speech", "handlers", "tests", "scripts", "s2s_pipeline"}
    names.update(p.stem for p in (ROOT / "scripts").glob("*.py"))
    names.update(p.parent.name for p in (ROOT / "scripts").glob("*/__init__.py"))
    return names


@dataclass(frozen=True)
class Import:
    """One imported module name and where it is imported."""

    module: str
    path: Path
    line: int

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    @property
    def where(self) -> str:
        try:
            shown = self.path.relative_to(ROOT)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


def imports_in(path: Path) -> Iterator[Import]:
    """Absolute imports anywhere in ``path`` (relative imports are the package's own)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield Import(node.module, path, node.lineno)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            if (
                name in IMPORT_CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and not first.value.startswith(".")
            ):
                yield Import(first.value, path, node.lineno)


def registry_line(handler_path: str) -> int:
    """The line of ``speech_to_speech/pipeline/registry.py`` that spells ``handler_path``."""
    registry = ROOT / "speech_to_speech" / "pipeline" / "registry.py"
    for node in ast.walk(ast.parse(registry.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value == handler_path:
            return node.lineno
    return 0


def registry_imports() -> Iterator[Import]:
    """The module of every registered backend's ``handler_path``, as an import by the registry."""
    registry = ROOT / "speech_to_speech" / "pipeline" / "registry.py"
    for backends in REGISTRY.values():
        for backend in backends.values():
            module = backend.handler_path.partition(":")[0]
            yield Import(module, registry, registry_line(backend.handler_path))


def module_file(module: str) -> Path | None:
    """The repository file of a first-party module, if there is one."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def installed_requirers() -> dict[str, set[str]]:
    """Normalised distribution → the installed distributions that require it (outside their extras)."""
    requirers: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions():
        for requirement in dist.requires or []:
            needed = requirement_name(requirement)
            if re.search(r"\bextra\s*==", requirement) or needed == normalise(dist.metadata["Name"]):
                continue
            requirers.setdefault(needed, set()).add(dist.metadata["Name"])
    return requirers


def find_undeclared(pyproject: Path = PYPROJECT, files: Iterable[Path] | None = None) -> list[str]:
    """One line per import whose distribution ``pyproject`` does not declare, or that is missing."""
    declared_in = declared(pyproject)
    this_project = normalise(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"])
    optional_only = {name for name, where in declared_in.items() if "dependencies" not in where}
    distributions = importlib.metadata.packages_distributions()
    own = first_party()

    found = [imp for path in (source_files() if files is None else files) for imp in imports_in(path)]
    if files is None:
        found.extend(registry_imports())

    problems = []
    for imp in found:
        if imp.top in sys.stdlib_module_names:
            continue
        if imp.top in own:
            # "from pkg.module import name" names a module or a name in it: one of the two exists
            if (
                imp.top in ("speech_to_speech", "handlers")
                and module_file(imp.module) is None
                and module_file(imp.module.rpartition(".")[0]) is None
            ):
                problems.append(f"{imp.where}: imports '{imp.module}', which is not a module of this repository")
            continue
        dists = sorted(set(distributions.get(imp.top, [])))
        if not dists:
            if normalise(imp.top) in optional_only and importlib.util.find_spec(imp.top) is None:
                continue  # an extra that is not installed here
            if importlib.util.find_spec(imp.top) is None:
                problems.append(
                    f"{imp.where}: imports '{imp.module}', which is not installed (no distribution provides "
                    f"'{imp.top}'); declare the distribution that provides it in pyproject.toml and install it"
                )
            else:
                problems.append(
                    f"{imp.where}: imports '{imp.module}', which no installed distribution provides "
                    f"(found outside any package metadata); declare and install the distribution that provides it"
                )
            continue
        if any(normalise(d) in declared_in for d in dists):
            continue
        names = ", ".join(dists)
        via = sorted(
            name
            for name in set().union(*(installed_requirers().get(normalise(d), set()) for d in dists))
            if normalise(name) != this_project  # its installed metadata may predate the edit
        )
        why = f" (installed only as a dependency of {', '.join(via)})" if via else ""
        problems.append(
            f"{imp.where}: imports '{imp.module}' from distribution '{names}'{why}, which {pyproject.name} "
            f"does not declare in its dependencies or any extra"
        )
    return sorted(set(problems))


def test_every_import_is_declared() -> None:
    problems = find_undeclared()
    assert not problems, "undeclared imports:\n" + "\n".join(problems)


def test_registered_backends_exist_and_name_real_extras() -> None:
    known_extras = set(extras(PYPROJECT))
    problems = []
    for stage, backends in REGISTRY.items():
        for name, backend in backends.items():
            module, _, class_name = backend.handler_path.partition(":")
            where = f"speech_to_speech/pipeline/registry.py:{registry_line(backend.handler_path)}"
            if backend.extra and backend.extra not in known_extras:
                problems.append(f"{where}: {stage} backend '{name}' names extra '{backend.extra}', not in pyproject")
            path = module_file(module)
            if path is None or not class_name:
                problems.append(f"{where}: {stage} backend '{name}': no module file for '{backend.handler_path}'")
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
            if class_name not in classes:
                problems.append(f"{where}: {stage} backend '{name}': {path.relative_to(ROOT)} defines no {class_name}")
    assert not problems, "\n".join(problems)


def without(pyproject: Path, distribution: str, target: Path) -> Path:
    """A copy of ``pyproject`` at ``target`` with every requirement on ``distribution`` removed."""
    data = pyproject.read_text(encoding="utf-8")
    kept = [
        line
        for line in data.splitlines(keepends=True)
        if not re.match(r'\s*"([^"]+)",?\s*(#.*)?$', line) or requirement_name(line.strip().strip('",')) != distribution
    ]
    target.write_text("".join(kept), encoding="utf-8")
    return target


def test_checker_reports_a_removed_dependency(tmp_path: Path) -> None:
    modified = without(PYPROJECT, "openai", tmp_path / "pyproject.toml")
    assert "openai" not in declared(modified) and "openai" in declared(PYPROJECT)
    problems = find_undeclared(modified)
    assert any(
        p.startswith("handlers/llm/openai_compatible.py:") and "'openai'" in p and "distribution 'openai'" in p
        for p in problems
    ), problems


def test_checker_reports_transitive_and_missing_modules(tmp_path: Path) -> None:
    if not importlib.metadata.packages_distributions().get("httpx2"):
        pytest.skip("httpx2 (a dependency of openai) is not installed")
    module = tmp_path / "leftover.py"
    module.write_text(
        "import json\n\n\ndef f():\n    import httpx2\n    import importlib\n"
        "    return importlib.import_module('surely_not_installed_anywhere')\n",
        encoding="utf-8",
    )
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    problems = find_undeclared(tmp_path / "pyproject.toml", [module])
    assert len(problems) == 2, problems
    transitive, missing = sorted(problems)
    assert ":5: imports 'httpx2' from distribution 'httpx2' (installed only as a dependency of " in transitive
    assert "openai" in transitive
    assert ":7: imports 'surely_not_installed_anywhere', which is not installed" in missing
