"""What data tests remember between commands (target/test_results.json): each test that passed,
with the instant of every table it checked (each table's latest completed commit then) and the
test's fingerprint from the plan. In `pipe build`, a test whose tables have had no commit since
and whose definition is the same passed then and passes now: it is reported as passed at that
instant without a Spark job (docs/testing.md, "A build with nothing new").

Only passes are kept (no failing row at all): a test that failed, warned or errored is
forgotten, so it is never reused as passed. Tests that read a source other than through a table
are never kept: files can change without a commit to say so.

target/ is part of the project, and a pull request can commit a crafted file: the record is
signed with this user's key (compiler/cache_key.py), and a record the key does not vouch for,
a damaged one or one of another format is ignored (every test runs). Written atomically (a
temporary file renamed over it); a record that cannot be written only costs the next build its
time."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Mapping

from compiler import cache_key
from compiler.plan import Step

FILE = "test_results.json"
FORMAT = 1


class TestMemory:
    def __init__(self, target_dir: Path, lake: str):
        self.path = Path(target_dir) / FILE
        self.lake = lake
        self._lock = threading.Lock()
        self._tests = self._load()

    def _load(self) -> dict[str, dict]:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
            tests = record["tests"]
            signature = bytes.fromhex(record["signature"])
            if record.get("format") != FORMAT or not isinstance(tests, dict):
                return {}
            if not cache_key.verified(signature, _canonical(tests)):
                return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return {}  # none yet, or damaged: every test runs
        return {k: v for k, v in tests.items() if isinstance(v, dict)}

    def passed_at(self, step: Step, instants: Mapping[str, str]) -> bool:
        """Whether `step` passed, as defined now, when its tables were at `instants`."""
        with self._lock:
            kept = self._tests.get(step.id)
        return (kept is not None and kept.get("lake") == self.lake and kept.get("fingerprint") == step.fingerprint
                and kept.get("instants") == dict(instants))

    def remember(self, step: Step, instants: Mapping[str, str] | None) -> None:
        """Records that `step` passed at `instants`; with None, forgets it (it failed, warned,
        errored, or checked something that has no instant)."""
        with self._lock:
            if instants is None:
                if self._tests.pop(step.id, None) is None:
                    return
            else:
                self._tests[step.id] = {"lake": self.lake, "fingerprint": step.fingerprint, "instants": dict(instants)}
            self._save()

    def _save(self) -> None:
        signature = cache_key.sign(_canonical(self._tests))
        if signature is None:
            return  # no key: nothing kept would be trusted
        record = {"format": FORMAT, "signature": signature.hex(), "tests": self._tests}
        tmp = self.path.with_name(f".{FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


def _canonical(tests: Mapping[str, dict]) -> bytes:
    return json.dumps(tests, sort_keys=True, separators=(",", ":")).encode("utf-8")
