"""`pipe server start` warms its new server up before it returns: the example project, in a
temporary folder, built on the server with its tests, through the very sessions the project's
commands take next (runtime/connect.py).

A new JVM interprets Spark's and Hudi-writing code paths until its JIT has compiled them, and a
new Python worker imports pipe's task packages: a user's first runs on a fresh server took 4 to 6
times as long as the later ones. Run here, at start, those first runs cost the user nothing in
the edit-run loop. One build: a second round (upserts into the tables) took as long again for
little more."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping


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
        result = Executor(plan, root, plan.step_ids, RunOptions(), spark_factory=lambda: spark).run()  # tables and tests
        failed = [s for s in result.steps if s.state in ("error", "cancelled")]
        if failed:
            raise RunError(f"warming the new server up failed: {failed[0].id}: {failed[0].message}",
                           "see the server's log; `pipe server stop` ends it")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - started
