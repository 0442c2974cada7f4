#!/usr/bin/env python
"""Render the figure tables of README.md and docs/benchmarks.md from docs/results.json.

    python scripts/render_results.py           # rewrite the tables between the markers
    python scripts/render_results.py --check   # exit 1 if a file is not as rendered

Each benchmark run with ``--record`` appends its figures to ``docs/results.json``
(:mod:`speech_to_speech.testing.results`); the tables show the newest record of each key with its
date, machine and load average.
"""

from __future__ import annotations

import argparse
import sys

from speech_to_speech.testing import REPO_ROOT
from speech_to_speech.testing.results import read, render, rendered

#: the files that hold a results block
TARGETS = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "benchmarks.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the files are as rendered")
    args = parser.parse_args(argv)
    table = render(read())
    stale = []
    for path in TARGETS:
        text = path.read_text(encoding="utf-8")
        new = rendered(text, table)
        if new != text:
            stale.append(path.relative_to(REPO_ROOT))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"not rendered from docs/results.json: {', '.join(map(str, stale))}; run {sys.argv[0]}", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'rendered'}: {', '.join(str(p.relative_to(REPO_ROOT)) for p in TARGETS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
