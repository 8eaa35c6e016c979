"""Run a Plan on Spark: order, parallelism, checkpoints, progress and results.

A step starts as soon as every step it depends on in this run has succeeded (so the graph's
generations run in order, and independent steps run at the same time on `threads` threads,
each submitting its own Spark jobs). A failed step skips its downstream steps; the others
carry on, unless `fail_fast`, which cancels what is running and starts nothing new.

The timeline is the only state. A write step reads, for every source it consumes, the
checkpoint stored in its table's latest commit (`pipe.checkpoint.<source>`), reads only what is
newer, and stores the new checkpoints in the commit that writes the data. A table that only
reads other tables (`ref()`) stores the upstream instant it read as its checkpoint, and runs
again only when an upstream has a new commit or its own definition changed. No new input:
no commit.

This module only orders, runs, cancels and reports steps; each kind of step is run by its own
module in runtime/steps/ (RUNNERS), with the run's shared state in a RunContext."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from compiler.errors import PipeError
from compiler.plan import Plan, Step
from runtime.spark import api as spark_api
from runtime.steps import source, sync, test, unit, write
from runtime.steps.context import DONE, FINGERPRINT_KEY, STATES, RunContext, RunOptions, StepResult
from runtime.errors import Cancelled, RunError, is_cancellation, is_user_error
from runtime.steps.errors import describe_error

__all__ = ["Cancelled", "Executor", "FINGERPRINT_KEY", "RUNNERS", "RunError", "RunOptions", "RunResult", "STATES",
           "StepResult", "describe_error", "is_cancellation"]

# each kind of step and the module that runs it: run(ctx, step, result) -> (state, message)
RUNNERS: dict[str, Callable[[RunContext, Step, StepResult], tuple[str, str]]] = {
    "ingest": source.run,
    "write": write.run,
    "test": test.run,
    "unit": unit.run,
}


@dataclass
class RunResult:
    started_at: str
    elapsed_s: float
    steps: list[StepResult]
    interrupted: bool = False
    terminated: bool = False  # the interruption was SIGTERM's (exit 143), not Ctrl-C's (130)

    @property
    def failed(self) -> bool:
        return any(s.state in ("error", "cancelled") for s in self.steps)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.state] = out.get(s.state, 0) + 1
        return out


Listener = Callable[[str, StepResult], None]  # (event: "start" | "end", result)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_WAKE_S = 0.5  # how often the waiting main thread runs Python, and so its signal handlers


def _import_pyspark() -> None:
    """Imports PySpark's SQL package before the steps' threads start. Its modules import each other,
    and two steps importing them at once (one starting Spark Connect, one reading a catalog's types)
    can meet Python's import-deadlock detection, which fails one import and leaves the other a
    half-made package."""
    try:
        import pyspark.sql  # noqa: F401
        import pyspark.sql.functions  # noqa: F401
        import pyspark.sql.pandas.utils  # noqa: F401
    except ImportError:  # the step that needs Spark says so itself
        pass


class Executor:
    def __init__(self, plan: Plan, project_root: Path, selected: Iterable[str], options: RunOptions,
                 spark_factory: Callable[[], Any] | None = None, listener: Listener | None = None,
                 environ: Mapping[str, str] | None = None, defer=None):
        self.ctx = RunContext(plan, project_root, selected, options, spark_factory, environ, defer)
        self.listener = listener or (lambda event, result: None)
        self.gates = test_gates(plan, self.ctx.selected)

    @property
    def selected(self) -> list[str]:
        return self.ctx.selected

    @property
    def lake(self) -> str:
        return self.ctx.lake

    def run(self) -> RunResult:
        started, t0 = _now(), time.perf_counter()
        results = {sid: StepResult(sid, self.ctx.plan.step(sid).kind, self.ctx.plan.step(sid).name) for sid in self.ctx.selected}
        self.ctx.results = results
        in_run = set(self.ctx.selected)
        waiting = list(self.ctx.selected)
        running: dict[cf.Future, str] = {}
        threads = max(1, self.ctx.options.threads)
        interrupted = twice = False
        self._stopped_by = "Ctrl-C"
        if threads > 1 and len(waiting) > 1:
            _import_pyspark()
        pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pipe-step")
        try:
            while waiting or running:
                try:
                    for sid in list(waiting):
                        step = self.ctx.plan.step(sid)
                        deps = [d for d in step.depends_on if d in in_run]
                        gates = self.gates.get(sid, ())
                        states = [results[d].state for d in (*deps, *gates)]
                        if self.ctx.cancel.is_set():
                            waiting.remove(sid)
                            why = f"the run was interrupted ({self._stopped_by})" if interrupted else "the run stopped at the first failure (--fail-fast)"
                            self._finish(results[sid], "skipped", f"not started: {why}")
                        elif any(s in ("error", "skipped", "cancelled") for s in states):
                            waiting.remove(sid)
                            bad = [d for d in deps if results[d].state in ("error", "skipped", "cancelled")]
                            failed = [t for t in gates if results[t].state in ("error", "skipped", "cancelled")]
                            why = (f"upstream {', '.join(bad)} did not succeed" if bad else
                                   f"test {', '.join(results[t].name for t in failed)} of {', '.join(_checked(self.ctx.plan, failed))} "
                                   f"{'failed' if all(results[t].state == 'error' for t in failed) else 'did not pass'}")
                            self._finish(results[sid], "skipped", f"skipped: {why}")
                        elif all(s in DONE for s in states) and len(running) < threads:
                            waiting.remove(sid)
                            results[sid].state = "running"
                            results[sid].started_at = _now()
                            self.listener("start", results[sid])
                            running[pool.submit(self._run_step, step, results[sid])] = sid
                    if not running:
                        continue
                    # with a timeout: a Ctrl-C the kernel hands to another thread (gRPC's, a
                    # heartbeat's) only sets a flag the main thread reads when it runs again; an
                    # endless wait never would (the CI failure of the Ctrl-C test over Connect)
                    done, _ = cf.wait(list(running), timeout=_WAKE_S, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        sid = running.pop(fut)
                        if results[sid].state == "error" and self.ctx.options.fail_fast and not self.ctx.cancel.is_set():
                            self.ctx.cancel.set()
                            self._cancel_running([running[f] for f in running])
                except KeyboardInterrupt as exc:
                    # Ctrl-C (or SIGTERM): cancel the running steps' Spark jobs (their writes roll
                    # back), start nothing new, and report the run; a second one stops at once
                    if interrupted:
                        twice = True
                        raise
                    interrupted = self.ctx.interrupted = True
                    self._stopped_by = getattr(exc, "signal_name", "Ctrl-C")
                    self.ctx.cancel.set()
                    self._cancel_running(list(running.values()))
        except BaseException:
            # a second Ctrl-C stops at once, without waiting for the steps' threads (one may be
            # stuck in a call to Spark that its cancellation never reached); a failure of pipe's
            # own waits for them, so that none writes or prints after the command has ended
            pool.shutdown(wait=not twice, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        sync.close_catalog(self.ctx)
        return RunResult(started, time.perf_counter() - t0, [results[s] for s in self.ctx.selected], interrupted,
                         interrupted and self._stopped_by == "SIGTERM")

    def _cancel_running(self, step_ids: list[str]) -> None:
        """Cancels the Spark jobs of the running steps, and keeps cancelling the jobs they
        start until they end (a step between two jobs would otherwise start the next one)."""
        spark = self.ctx.spark_started
        if spark is None or not step_ids:
            return

        def keep_cancelling() -> None:
            while any(self.ctx.results[s].state == "running" for s in step_ids if s in self.ctx.results):
                for sid in step_ids:
                    try:
                        spark_api.cancel(spark, sid)
                    except Exception:  # noqa: BLE001 - best effort; the step fails and rolls back
                        pass
                time.sleep(0.5)

        threading.Thread(target=keep_cancelling, daemon=True, name="pipe-cancel").start()

    def _finish(self, result: StepResult, state: str, message: str | None = None, hint: str | None = None) -> None:
        result.state = state
        result.message = message
        result.hint = hint
        self.listener("end", result)

    def _run_step(self, step: Step, result: StepResult) -> None:
        t0 = time.perf_counter()
        try:
            try:
                state, message = RUNNERS[step.kind](self.ctx, step, result)
            finally:
                if self.ctx.spark_started is not None:
                    spark_api.end_step(self.ctx.spark_started, step.id)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported on its step
            result.elapsed_s = round(time.perf_counter() - t0, 3)
            cancelled = is_cancellation(exc) or (self.ctx.cancel.is_set() and not isinstance(exc, PipeError)
                                                 and not spark_api.server_lost(exc))
            if cancelled:
                # Ctrl-C or --fail-fast cancelled its Spark jobs (or someone did in the Spark UI):
                # the write rolled back, so this is a cancellation, not an error of the step
                message, hint = self._cancelled_message(step), None
            else:
                message, hint = describe_error(exc, step)
            # (a Python model's failure is the user's, but its traceback is what they debug with)
            if not cancelled and (getattr(exc, "show_cause", False) or not isinstance(exc, PipeError) and not is_user_error(exc)):
                result.traceback = traceback.format_exc()
            self._finish(result, "cancelled" if cancelled else "error", message, hint)
            return
        # outside the try: once a step has committed, nothing after it turns it into an error
        result.elapsed_s = round(time.perf_counter() - t0, 3)
        self._finish(result, state, message, result.hint)

    def _cancelled_message(self, step: Step) -> str:
        if self.ctx.interrupted:
            why = f"the run was interrupted ({getattr(self, '_stopped_by', 'Ctrl-C')})"
        elif self.ctx.cancel.is_set():
            why = "the run stopped at the first failure (--fail-fast)"
        else:
            why = "its Spark job was cancelled (from the Spark UI or by the cluster)"
        return f"cancelled: {why}; {step.name if step.kind == 'write' else step.id} wrote nothing, and the next run reads its input again"


def test_gates(plan: Plan, selected: list[str]) -> dict[str, tuple[str, ...]]:
    """In a run of tables and their tests (`pipe build`): step id -> the tests it waits for.
    A table or source's tests gate the steps that read it, so an error-severity failure stops
    its downstream steps; a tests/*.sql file gates the readers of everything it reads, except
    steps it reads itself (which it runs after)."""
    in_run = set(selected)
    gates: dict[str, set[str]] = {}
    for u in plan.steps:  # a unit test gates the table it tests: a failing one stops its write
        if u.kind == "unit" and u.id in in_run and f"table.{u.config['model']}" in in_run:
            gates.setdefault(f"table.{u.config['model']}", set()).add(u.id)
    tests = [s for s in plan.steps if s.kind == "test" and s.id in in_run]
    if not tests or len(tests) == len(in_run):
        return {sid: tuple(sorted(g)) for sid, g in gates.items()}
    readers: dict[str, list[str]] = {}
    for s in plan.steps:
        if s.id in in_run and s.kind != "test":
            for d in s.depends_on:
                readers.setdefault(d, []).append(s.id)
    ancestors = _ancestors(plan)
    for t in tests:
        for model in test.checked(t):
            for reader in readers.get(model, ()):
                if reader not in ancestors[t.id]:
                    gates.setdefault(reader, set()).add(t.id)
    return {sid: tuple(sorted(g)) for sid, g in gates.items()}


def _ancestors(plan: Plan) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in plan.steps:  # in topological order
        out[s.id] = set(s.depends_on).union(*(out[d] for d in s.depends_on)) if s.depends_on else set()
    return out


def _checked(plan: Plan, tests: list[str]) -> list[str]:
    """The names of the tables and sources the `tests` check."""
    return sorted({sid.split(".", 1)[1] for t in tests
                   for sid in (test.checked(plan.step(t)) if plan.step(t).kind == "test" else [f"table.{plan.step(t).config['model']}"])})
