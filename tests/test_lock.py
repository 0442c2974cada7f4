"""The environment is the one that was tested: ``requirements.lock`` matches pyproject and the venv.

The README's install and CI install with ``-c requirements.lock``, so every machine gets the same
releases. These tests catch the two ways that can drift: a dependency changed in
``pyproject.toml`` without regenerating the lock (``uv pip compile pyproject.toml -o
requirements.lock``), and an environment that was not installed from the lock (a package at
another release than the locked one, as when pip reused whatever a cache or an earlier install
held).
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
REGENERATE = "uv pip compile pyproject.toml -o requirements.lock"


def locked() -> dict[str, Version]:
    """Distribution → locked release, for the pins whose markers hold on this machine."""
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"requirements.lock: {line!r} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def project_requirements() -> list[Requirement]:
    """Every requirement of pyproject's core and extras that applies on this machine."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra, items in project["optional-dependencies"].items():
        environment = {**default_environment(), "extra": extra}
        requirements += [r for r in map(Requirement, items) if r.marker is None or r.marker.evaluate(environment)]
    return requirements


def test_the_lock_pins_every_dependency_within_its_range() -> None:
    pins = locked()
    problems = []
    for requirement in project_requirements():
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement} does not admit the locked {pins[name]}")
    assert not problems, f"requirements.lock is stale, regenerate it ({REGENERATE}): " + "; ".join(problems)


def test_the_engine_is_locked_at_its_exact_pin() -> None:
    pins = locked()
    exact = [r for r in project_requirements() if canonicalize_name(r.name) == "llama-cpp-python"]
    assert exact, "pyproject.toml does not require llama-cpp-python"
    for requirement in exact:
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{requirement}: a package built from source is pinned exactly"
        assert pins["llama-cpp-python"] == Version(spec.version)


def test_the_installed_packages_are_the_locked_releases() -> None:
    pins = locked()
    drift = []
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and Version(dist.version).public != pins[name].public:  # 2.13.0+cpu is 2.13.0
            drift.append(f"{name} {dist.version} (locked {pins[name]})")
    assert not drift, (
        "installed releases differ from requirements.lock: " + ", ".join(sorted(drift)) + "; reinstall with "
        "pip install -c requirements.lock torch==2.13.0 -e '.[smart-turn,test]'"
    )
