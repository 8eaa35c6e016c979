"""The order in which pytest's workers take the test files: longest first.

pytest-xdist (`--dist loadfile`) hands whole files to its workers in the order they were
collected; by default it reorders them by their number of tests, which sends the files made of
a few long tests (a cluster, a Connect server, Java Hudi) last, where one of them runs alone
while the other workers wait. tests/conftest.py sorts the files by the seconds recorded here
(longest first: the classic longest-processing-time rule) and pyproject.toml turns xdist's own
reordering off. A file not listed counts 3 s per test.

Every run of the whole suite (or a part of it) keeps its seconds per file in
tests/.durations-last.json and per test in tests/.durations-tests-last.json (git ignores
both); refresh the committed figures from the first with

    python -m tests.durations

or from the log of a run with every duration printed (a CI log):

    PYTEST_ADDOPTS=--durations=0 pytest > /tmp/tests.log; python -m tests.durations /tmp/tests.log
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
LAST = Path(__file__).with_name(".durations-last.json")
LAST_TESTS = Path(__file__).with_name(".durations-tests-last.json")
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


def _dump(seconds: dict[str, float], digits: int | None = None) -> str:
    return json.dumps({k: round(v, digits) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}, indent=1) + "\n"


def save_last(seconds: dict[str, float], tests: dict[str, float] | None = None) -> None:
    """Keeps a run's seconds per file in LAST, and per test in LAST_TESTS (to see what to make
    cheaper; called by tests/conftest.py at the session's end)."""
    LAST.write_text(_dump(seconds))
    if tests:
        LAST_TESTS.write_text(_dump(tests, 1))


def main(argv: list[str]) -> int:
    """Refreshes FILE: the files a run measured take its figures, the others keep theirs."""
    if len(argv) > 1:
        found = per_file(Path(argv[1]).read_text(errors="replace"))
        if not found:
            print(f"no `--durations=0` lines in {argv[1]}", file=sys.stderr)
            return 2
    else:
        try:
            found = {str(k): float(v) for k, v in json.loads(LAST.read_text()).items()}
        except (OSError, ValueError):
            print(f"no run recorded in {LAST}: run pytest first", file=sys.stderr)
            return 2
    merged = {**load(), **found}
    FILE.write_text(_dump(merged))
    print(f"{len(found)} files measured, {len(merged)} listed, {sum(merged.values()) / 60:.1f} test-minutes -> {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
