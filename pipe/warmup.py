"""`pipe server start` warms its new server up before it returns: the example project, in a
temporary folder, built on the server with its tests, through the very sessions the project's
commands take next (runtime/connect.py).

A new JVM interprets Spark's and Hudi-writing code paths until its JIT has compiled them, and a
new Python worker imports pipe's task packages: a user's first runs on a fresh server took 4 to 6
times as long as the later ones. Run here, at start, those first runs cost the user nothing in
the edit-run loop. Two rounds: the build, then one new input file, whose upserts take the paths
a first build never does (finding the stored keys, merging into the stored files) and a user's
next runs all do."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping


# The build, then one new file. Measured with the fork server on 2 cores: four rounds (20 s more)
# left the next runs no faster (4.0 to 5.0 s, against 3.7 to 4.8 s after two).
ROUNDS = 2


def warm_up(state, conf: Mapping[str, Any] | None) -> float:
    """Builds the example project on the server of `state`; its wall time. Raises RunError when
    the build fails (the server is then no good for pipe's runs either)."""
    from compiler.api import compile_project
    from pipe.template import template_dir
    from runtime import session
    from runtime.executor import Executor, RunError, RunOptions

    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="pipe-server-warmup-"))
    try:
        root = folder / "shop"
        shutil.copytree(template_dir(), root, ignore=shutil.ignore_patterns("__pycache__", "lake", "target"))
        spark = session.get_spark(remote=state.url, own_server=state, conf=conf)
        plan = compile_project(root, cache_write=False).plan
        for round_ in range(ROUNDS):
            if round_:
                _new_orders(root / "data" / "orders", round_)
            result = Executor(plan, root, plan.step_ids, RunOptions(), spark_factory=lambda: spark).run()  # tables and tests
            failed = [s for s in result.steps if s.state in ("error", "cancelled")]
            if failed:
                raise RunError(f"warming the new server up failed: {failed[0].id}: {failed[0].message}",
                               "see the server's log; `pipe server stop` ends it")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - started


def _new_orders(folder: Path, round_: int) -> None:
    """A later version of each order of the example's first file, and one new order: the one
    new file of a round after the first."""
    first = sorted(folder.glob("*.json"))[0]
    orders = [json.loads(line) for line in first.read_text().splitlines() if line.strip()]
    later = [{**o, "amount": o["amount"] + round_, "updated_at": f"2099-01-{round_:02d}T00:00:00Z"} for o in orders]
    later.append({**orders[0], "order_id": max(o["order_id"] for o in orders) + 1000 * round_, "updated_at": f"2099-01-{round_:02d}T00:00:00Z"})
    (folder / f"orders-warmup-{round_}.json").write_text("".join(json.dumps(o) + "\n" for o in later))
