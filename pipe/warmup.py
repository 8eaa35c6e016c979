"""`pipe server start` warms its new server up before it returns: a small project of pipe's own,
in a temporary folder, run on the server through the very sessions the project's commands take
next (runtime/spark/connect.py).

A new JVM interprets Spark's and Hudi-writing code paths until its JIT has compiled them, and a
new Python worker imports pipe's task packages: a user's first runs on a fresh server took 4 to 6
times as long as the later ones. The warm-up takes those paths once, on a few rows: a JSON source
read by pipe's files source (its Python tasks), a Hudi table written with a record key,
precombine and partitions (file sizing, the write I/O, the commit), a second round that upserts
into the stored files (the index lookup and merge a user's next runs all do), and a table that
reads the first one's snapshot (`ref()`), with a test. It used to build the example project twice
(its three tables and tests): 5 to 8 minutes on a busy 2-core machine, for no faster runs after."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

ROUNDS = 2  # a first write, then upserts into the stored files

# The project, written into the temporary folder: pipe's own, so that it does not depend on the
# example project (which users edit in their copies, and which grows).
_FILES = {
    "pipe_project.yml": "name: warmup\nlake: lake\ndefault_target: dev\ntargets:\n  dev:\n    spark:\n      master: \"local[*]\"\n",
    "sources/events.yml": (
        "sources:\n  events:\n    kind: files\n    path: data/events\n    format: json\n"
        "    schema: \"event_id BIGINT, account STRING, region STRING, amount DECIMAL(12,2), ts BIGINT, note STRING\"\n"),
    "tables/accounts.yml": (
        "tables:\n  accounts:\n    key: [event_id, account]\n    precombine: ts\n    partition_by: [region]\n"
        "    columns:\n      - name: account\n        tests: [not_null]\n"
        "  totals:\n    key: [region]\n"),
    "tables/accounts.sql": "select event_id, account, region, amount, ts, note from {{ source('events') }}\n",
    "tables/totals.sql": "select region, sum(amount) as amount, count(*) as events from {{ ref('accounts') }} group by region\n",
}


def warm_up(state, conf: Mapping[str, Any] | None) -> float:
    """Runs pipe's warm-up project on the server of `state`; its wall time. Raises RunError when
    a step fails (the server is then no good for pipe's runs either)."""
    from compiler.api import compile_project
    from runtime.errors import RunError
    from runtime.executor import Executor, RunOptions
    from runtime.spark import session

    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="pipe-server-warmup-"))
    try:
        root = folder / "warmup"
        for name, text in _FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
        spark = session.get_spark(remote=state.url, own_server=state, conf=conf)
        for round_ in range(ROUNDS):
            _events(root / "data" / "events", round_)
            plan = compile_project(root, cache_write=False).plan
            result = Executor(plan, root, plan.step_ids, RunOptions(), spark_factory=lambda: spark).run()  # tables and test
            failed = [s for s in result.steps if s.state in ("error", "cancelled")]
            if failed:
                raise RunError(f"warming the new server up failed: {failed[0].id}: {failed[0].message}",
                               "see the server's log; `pipe server stop` ends it, `pipe server start --no-warmup` skips the warm-up")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - started


def _events(folder: Path, round_: int) -> None:
    """A round's input file: 40 events over four regions; a later round updates the first half
    of them and adds as many."""
    folder.mkdir(parents=True, exist_ok=True)
    base = 1_764_000_000_000 + round_ * 60_000
    ids = range(20 * round_, 20 * round_ + 40)
    rows = [{"event_id": i, "account": f"acct-{i % 7:02d}", "region": ("eu", "us", "apac", "latam")[i % 4],
             "amount": f"{i * 3.25 + round_:.2f}", "ts": base + i, "note": "café \"quoted\"" if i % 5 == 0 else None} for i in ids]
    (folder / f"events-{round_:04d}.json").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
