"""Does the installed llama.cpp engine run here? One multi-token evaluation, in a child process.

``llama-cpp-python`` is compiled on the user's machine, and some releases crash natively on some
CPUs: 0.3.36 built with ``-march=native`` segfaults in ``Llama.eval`` for any prompt of two or
more tokens on a Xeon with AVX-512 and AMX, while 0.3.16 runs (see the comment at the pin in
``pyproject.toml``). A native crash cannot be caught in Python, so the check runs the engine's
first multi-token evaluation in a **child process** and reports how it ended: the test suite
fails one named test with the signal and the installed version instead of dying, and
``scripts/check_latest.py`` uses it to try newer releases.

Run it directly::

    python -m handlers.llm.engine_check            # the embedded GGUF
    python -m handlers.llm.engine_check model.gguf

Exit status: 0 when the engine evaluated the prompt and generated tokens; otherwise the child's
status (``-11``/139 for SIGSEGV).
"""

from __future__ import annotations

import importlib.metadata
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: the child's prompt: a chat turn long enough to take the multi-token (batched) evaluation path
PROMPT = "<|im_start|>user\nName one planet of the solar system.<|im_end|>\n<|im_start|>assistant\n"
#: tokens generated after the evaluation (exercises single-token decoding too)
GENERATED_TOKENS = 4
#: seconds the child may take (loading the 0.5B model and evaluating ~20 tokens takes ~2 s on 2 cores)
TIMEOUT_S = 180.0
#: the distribution of the engine
ENGINE = "llama-cpp-python"
#: a frame of ``faulthandler``'s dump: ``File "path", line N in function`` (innermost first)
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


@dataclass(frozen=True)
class EngineCheck:
    """How the child process ended.

    Attributes:
        returncode: the child's exit status (negative: killed by that signal).
        version: the installed ``llama-cpp-python`` release ("not installed" if none).
        output: what the child printed (stdout and stderr together).
    """

    returncode: int
    version: str
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def how(self) -> str:
        """The ending in words: ``"ok"``, ``"crashed with SIGSEGV"``, ``"exited with status 1"``."""
        if self.returncode == 0:
            return "ok"
        if self.returncode < 0:
            try:
                return f"crashed with {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"crashed with signal {-self.returncode}"
        return f"exited with status {self.returncode}"

    def summary(self) -> str:
        """One line for people: the version, how it ended and, on failure, the last line printed."""
        line = f"{ENGINE} {self.version}: the first multi-token evaluation {self.how}"
        if not self.ok:
            line += f" ({self.where()})" if self.where() else ""
        return line

    def where(self) -> str:
        """Where the child failed, from its output: the innermost Python frame of a native crash
        (``faulthandler``'s dump), else the last line it printed."""
        lines = [text.strip() for text in self.output.splitlines() if text.strip()]
        fatal = next((text for text in lines if text.startswith("Fatal Python error")), None)
        if fatal is not None:
            frame = next((m for text in lines if (m := _FRAME.match(text))), None)
            return f"{fatal}, in {frame.group(3)} at {frame.group(1)}:{frame.group(2)}" if frame else fatal
        return lines[-1] if lines else ""


def pinned_version() -> str | None:
    """The ``llama-cpp-python`` release this project pins (``==``), from its installed metadata."""
    try:
        requirements = importlib.metadata.requires("speech-to-speech") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        match = re.match(rf"{ENGINE}(\[[^\]]*\])?\s*==\s*([^;\s]+)", requirement)
        if match:
            return match.group(2)
    return None


def reinstall_command() -> str:
    """The command that rebuilds the pinned engine from source, for messages."""
    return f"pip install --force-reinstall --no-cache-dir --no-deps {ENGINE}=={pinned_version() or 'VERSION'}"


def installed_version(python: str | None = None) -> str:
    """The ``llama-cpp-python`` release installed for ``python`` (default: this interpreter)."""
    # not resolved: a venv's python is a symlink to the base interpreter, with its own packages
    if python is None or Path(python).absolute() == Path(sys.executable).absolute():
        try:
            return importlib.metadata.version(ENGINE)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    code = "import importlib.metadata as m; print(m.version('llama-cpp-python'))"
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return result.stdout.strip() if result.returncode == 0 else "not installed"


def check_engine(model: str | None = None, python: str | None = None, timeout_s: float = TIMEOUT_S) -> EngineCheck:
    """Run :func:`evaluate` in a child process and report how it ended (never raises for a crash).

    Args:
        model: GGUF path (None: the embedded model, assembled on first use).
        python: the interpreter to run the child with (default: this one), e.g. a scratch venv's.
        timeout_s: the child's time limit, s; past it the check reports status 124.

    Returns:
        The child's exit status, the installed version and its output.
    """
    python = python or sys.executable
    command = [python, "-X", "faulthandler", "-m", "handlers.llm.engine_check", *([model] if model else [])]
    root = Path(__file__).resolve().parents[2]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=root)
        returncode, output = child.returncode, child.stdout + child.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = 124
        output = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout_s:.0f} s"
    return EngineCheck(returncode, installed_version(python), output)


def evaluate(model: str | None = None) -> str:
    """Load ``model`` with llama.cpp, evaluate :data:`PROMPT` in one batch and generate a few tokens.

    This is what the LLM stage does at start-up (the system prompt's prefill), and what crashes
    on an engine that cannot run on this CPU. Run it in a child process (:func:`check_engine`).

    Returns:
        The generated text.

    Raises:
        FileNotFoundError: the embedded model's packages are missing.
    """
    from llama_cpp import Llama

    from handlers.llm.embedded import resolve_gguf

    path = resolve_gguf(model or "")
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, n_batch=512, verbose=False)
    try:
        tokens = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
        llm.eval(tokens)  # the multi-token evaluation
        generated = []
        for _ in range(GENERATED_TOKENS):
            token = llm.sample(temp=0.0)
            generated.append(token)
            llm.eval([token])
        return llm.detokenize(generated).decode("utf-8", errors="replace")
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> int:
    """Evaluate in this process (the child's side) and print the version and the generated text."""
    args = sys.argv[1:] if argv is None else argv
    text = evaluate(args[0] if args else None)
    print(f"llama-cpp-python {installed_version()}: evaluated and generated {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
