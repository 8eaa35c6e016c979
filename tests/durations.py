"""The order in which pytest's workers take the test files: longest first.

pytest-xdist (`--dist loadfile`) hands whole files to its workers in the order they were
collected; by default it reorders them by their number of tests, which sends the files made of
a few long tests (a cluster, a Connect server, Java Hudi) last, where one of them runs alone
while the other workers wait. tests/conftest.py sorts the files by the seconds recorded here
(longest first: the classic longest-processing-time rule) and pyproject.toml turns xdist's own
reordering off. A file not listed counts 3 s per test.

Refresh the figures from a run with every duration printed:

    PYTEST_ADDOPTS=--durations=0 pytest > /tmp/tests.log; python -m tests.durations /tmp/tests.log
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
_LINE = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:]+\.py)::")


def per_file(log: str) -> dict[str, float]:
    """Seconds per test file from pytest's `--durations=0` lines."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(1))
    return out


def load() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def main(argv: list[str]) -> int:
    found = per_file(Path(argv[1]).read_text(errors="replace"))
    if not found:
        print(f"no `--durations=0` lines in {argv[1]}", file=sys.stderr)
        return 2
    FILE.write_text(json.dumps({k: round(v) for k, v in sorted(found.items(), key=lambda kv: -kv[1])}, indent=1) + "\n")
    print(f"{len(found)} files, {sum(found.values()) / 60:.1f} test-minutes -> {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
