"""Try the newest releases of the packages pinned exactly, before moving a pin: one measured step.

What pip builds from source on the user's machine (``llama-cpp-python``) is pinned to one release
in ``pyproject.toml`` (``==``), and everything else is fixed by ``requirements.lock``. This script
takes ``llama-cpp-python`` (or the exactly pinned packages named with ``--package``), finds its newest
release on the index (or takes ``--version``), and for each candidate:

1. makes a scratch virtual environment and installs the project's core dependencies and the
   ``smart-turn`` extra there, constrained by ``requirements.lock`` except for the candidate, which
   is installed at the candidate release (pip builds it from source; its wheel is cached);
2. runs the engine check (:mod:`handlers.llm.engine_check`: the first multi-token evaluation, in a
   child process, so a native crash is a result, not the end of the script);
3. runs the README's demo (the bundled spoken question → ``out.wav``) and reads the reply and its
   voice-to-voice latency from the console.

Then it prints one row per candidate: the pinned and tried releases, how long the install took,
the engine check and the demo. Nothing in the working tree changes; to move a pin, edit
``pyproject.toml`` and regenerate the lock (``uv pip compile pyproject.toml -o requirements.lock``).

Usage::

    python scripts/check_latest.py                                # newest llama-cpp-python
    python scripts/check_latest.py --version 0.3.20 --version 0.3.36
    python scripts/check_latest.py --keep                         # keep the scratch venvs

Exit status: 0 when every candidate passed both checks, 1 when one failed, 2 on bad flags.
Needs the package index (PyPI) and, for a source build, a C/C++ compiler; each candidate takes
about 3-6 min on 2 cores, most of it the engine's build.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from handlers.llm.engine_check import ENGINE, check_engine
from speech_to_speech.testing.bench import REPO_ROOT, print_table

PROG = "check_latest.py"
LOCK = REPO_ROOT / "requirements.lock"
PYPROJECT = REPO_ROOT / "pyproject.toml"
#: the extras the README's demo needs besides the core (the end-of-turn model)
DEMO_EXTRAS = ("smart-turn",)
DEMO_AUDIO = REPO_ROOT / "tests" / "data" / "question-capital.wav"
#: seconds for one install (a source build of the engine included) and for the demo
INSTALL_TIMEOUT_S = 1800.0
DEMO_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    """One candidate's results (``None``: that step did not run)."""

    package: str
    pinned: str
    version: str
    install_s: float | None = None
    install_error: str = ""
    engine: str = "-"
    demo: str = "-"

    @property
    def passed(self) -> bool:
        return not self.install_error and self.engine == "ok" and self.demo.startswith("ok")


def exact_pins(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Distribution → release of every ``==`` requirement in ``[project] dependencies``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    pins = {}
    for requirement in project["dependencies"]:
        match = re.match(r"\s*([A-Za-z0-9._-]+)(?:\[[^\]]*\])?\s*==\s*([^;\s]+)", requirement)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def core_requirements(pyproject: Path = PYPROJECT, extras: tuple[str, ...] = DEMO_EXTRAS) -> list[str]:
    """The core dependencies and those of ``extras``, as written in ``pyproject.toml``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return requirements


def newest_release(package: str) -> str:
    """The newest release of ``package`` on the index, as ``pip index versions`` reports it.

    Raises:
        RuntimeError: pip found none (unknown package, no index).
    """
    result = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package], capture_output=True, text=True, timeout=120
    )
    match = re.search(rf"^{re.escape(package)} \(([^)]+)\)", result.stdout, re.MULTILINE | re.IGNORECASE)
    if not match:
        raise RuntimeError(f"no release of {package} found: {result.stderr.strip()[-300:]}")
    return match.group(1)


def without(lock: Path, package: str, target: Path) -> Path:
    """A copy of the lock with ``package``'s pin left out (the candidate replaces it)."""
    name = re.compile(rf"^{re.escape(package)}\s*==", re.IGNORECASE)
    lines = [line for line in lock.read_text().splitlines() if not name.match(line.replace("_", "-"))]
    target.write_text("\n".join(lines) + "\n")
    return target


def run(command: list[str], timeout_s: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **kwargs)  # type: ignore[call-overload]


def install(venv: Path, package: str, version: str) -> tuple[float, str]:
    """Install the project into a new ``venv`` with ``package`` at ``version``; (seconds, error or "")."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    constraints = without(LOCK, package, venv / "constraints.txt")
    name = re.compile(rf"^{re.escape(package)}\b", re.IGNORECASE)
    requirements = [r for r in core_requirements() if not name.match(r)] + [f"{package}=={version}"]
    steps = [
        [python, "-m", "pip", "install", "-q", "-c", str(constraints), *requirements],
        [python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO_ROOT)],
    ]
    for step in steps:
        try:
            result = run(step, INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return time.monotonic() - started, f"install timed out after {INSTALL_TIMEOUT_S:.0f} s"
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["failed"]
            return time.monotonic() - started, tail[0]
    return time.monotonic() - started, ""


def demo(venv: Path) -> str:
    """The README's demo in ``venv``: ``"ok: <reply> (<voice-to-voice>)"`` or how it failed."""
    out = venv / "out.wav"
    command = [str(venv / "bin" / "python"), "s2s_pipeline.py", "--input_audio", str(DEMO_AUDIO)]
    try:
        result = run([*command, "--output_audio", str(out)], DEMO_TIMEOUT_S, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return f"timed out after {DEMO_TIMEOUT_S:.0f} s"
    if result.returncode != 0:
        lines = (result.stderr + result.stdout).strip().splitlines()
        return f"exit {result.returncode}: {lines[-1] if lines else ''}"
    reply = re.search(r"\] assistant: (.*)", result.stdout)
    latency = re.search(r"voice-to-voice (\d+ ms)", result.stdout)
    if not reply or not out.is_file():
        return "no reply"
    return f"ok: {reply.group(1)[:40]!r} ({latency.group(1) if latency else '?'})"


def check(package: str, pinned: str, version: str, keep: bool) -> Outcome:
    outcome = Outcome(package, pinned, version)
    venv = Path(tempfile.mkdtemp(prefix=f"check-{package}-{version}-"))
    print(f"{package} {version}: installing into {venv} ...", flush=True)
    try:
        outcome.install_s, outcome.install_error = install(venv / "venv", package, version)
        if outcome.install_error:
            return outcome
        result = check_engine(python=str(venv / "venv" / "bin" / "python"))
        outcome.engine = result.how
        print(f"  {result.summary()}", flush=True)
        if result.ok:
            outcome.demo = demo(venv / "venv")
            print(f"  demo: {outcome.demo}", flush=True)
        return outcome
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--package", action="append", help=f"a package pinned with == in pyproject.toml (default: {ENGINE})"
    )
    parser.add_argument("--version", action="append", help="a release to try (default: the newest); repeatable")
    parser.add_argument("--keep", action="store_true", help="keep the scratch virtual environments")
    args = parser.parse_args(argv)
    pins = exact_pins()
    packages = [p.lower() for p in args.package] if args.package else [ENGINE]
    unknown = [p for p in packages if p not in pins]
    if unknown:
        parser.error(f"not pinned with == in pyproject.toml: {', '.join(unknown)} (pinned: {', '.join(pins)})")
    outcomes = []
    for package in packages:
        versions = args.version or [newest_release(package)]
        outcomes += [check(package, pins[package], version, args.keep) for version in versions]
    print()
    headers = ["package", "pinned", "tried", "install s", "engine check", "demo"]
    rows = [
        [o.package, o.pinned, o.version, f"{o.install_s:.0f}" if o.install_s else "-", o.engine, o.demo]
        if not o.install_error
        else [o.package, o.pinned, o.version, f"{o.install_s or 0:.0f}", "install failed", o.install_error[:60]]
        for o in outcomes
    ]
    print_table(headers, rows)
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
