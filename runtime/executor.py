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
no commit."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import os
import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from compiler.errors import PipeError
from compiler.plan import Plan, Step
from compiler.render import resolve_env_placeholders
from runtime import s3
from runtime.sources import Pending, SourceError
from runtime.sources import files as files_source
from runtime.sources import s3_events as s3_events_source
from runtime.sources import s3_incremental as s3_incremental_source
from runtime.sources import table as table_source
from runtime.task_errors import PIPE_ERRORS, worker_error
from runtime.table.timeline import CHECKPOINT_PREFIX

FINGERPRINT_KEY = "pipe.step.fingerprint"
STATES = ("pending", "running", "success", "no_input", "would_run", "error", "skipped", "cancelled")


class RunError(PipeError):
    """A step that cannot go ahead; `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class Cancelled(RunError):
    """The run was interrupted or stopped at a failure (--fail-fast) before this step wrote."""


@dataclass
class StepResult:
    id: str
    kind: str
    name: str
    state: str = "pending"
    rows_read: int | None = None
    rows_written: int | None = None
    inserts: int | None = None
    updates: int | None = None
    deletes: int | None = None
    instant: str | None = None
    action: str | None = None
    operation: str | None = None
    started_at: str | None = None
    elapsed_s: float | None = None
    message: str | None = None
    hint: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("traceback")
        return d


@dataclass
class RunOptions:
    full_refresh: bool = False
    threads: int = 4
    fail_fast: bool = False
    dry_run: bool = False


@dataclass
class RunResult:
    started_at: str
    elapsed_s: float
    steps: list[StepResult]
    interrupted: bool = False

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


class Executor:
    def __init__(self, plan: Plan, project_root: Path, selected: Iterable[str], options: RunOptions,
                 spark_factory: Callable[[], Any] | None = None, listener: Listener | None = None,
                 environ: Mapping[str, str] | None = None):
        self.plan = plan
        self.root = Path(project_root)
        self.selected = [s for s in plan.step_ids if s in set(selected)]
        self.options = options
        self._spark_factory = spark_factory
        self._spark = None
        self._spark_error: BaseException | None = None
        self._spark_lock = threading.Lock()
        self.listener = listener or (lambda event, result: None)
        self.environ = dict(os.environ if environ is None else environ)
        self.lake = self._lake_uri()
        self.s3a = self._s3a_settings()
        # how pipe's own code (driver and tasks) reaches the lake: the target's fs.s3a settings
        self.storage_options = s3.client_options(self.s3a, s3.bucket_of(self.lake)) if s3.is_s3(self.lake) else ()
        self._cancel = threading.Event()
        self._interrupted = False  # Ctrl-C (the run's cancel event is also set by --fail-fast)
        self._results: dict[str, StepResult] = {}

    # --- where things are ------------------------------------------------------------------

    def _resolved(self, value: str, needed_by: str) -> str:
        """`value` with its environment placeholders filled in; a missing variable is a RunError
        saying what needs it (`needed_by`: "the lake of target dev needs it")."""
        try:
            return resolve_env_placeholders(value, self.environ)
        except KeyError as exc:
            raise RunError(f"environment variable {exc.args[0]} is not set; {needed_by}",
                           f"export {exc.args[0]}=... before `pipe run`") from exc

    def _lake_uri(self) -> str:
        lake = self._resolved(self.plan.target.lake, f"the lake of target {self.plan.target.name} needs it")
        return self._project_uri(lake).rstrip("/")

    def _s3a_settings(self) -> dict[str, str]:
        """The target's `spark.hadoop.fs.s3a.*` settings, placeholders filled in (runtime/s3.py)."""
        needed_by = f"the Spark settings of target {self.plan.target.name} need it"
        return s3.s3a_settings({k: self._resolved(str(v), needed_by)
                                for k, v in self.plan.target.spark_conf.items() if k.startswith(s3.PREFIX)})

    def _project_uri(self, path: str) -> str:
        """A URI or absolute path as written; a relative path from the project folder."""
        if path.startswith(("s3://", "s3a://", "file://")) or os.path.isabs(path):
            return path
        return str((self.root / path).resolve())

    def _check_reachable(self) -> None:
        """Before Spark starts on a cluster: the executors can reach the lake and the input
        folders (runtime/cluster.py)."""
        from runtime import cluster
        from runtime.sources.files import base_and_pattern

        try:
            master = resolve_env_placeholders(self.plan.target.spark_master, self.environ)
        except KeyError:
            return  # the Spark start reports the missing variable
        folders = []
        lake = cluster.local_folder(self.lake)
        if lake is not None:
            folders.append((f"the lake of target {self.plan.target.name}", lake))
        for step in self.plan.steps:
            if step.kind == "ingest" and step.config.get("kind") == "files" and step.id in self.selected:
                path = str(step.config.get("path", ""))
                if cluster.local_folder(path) is not None:
                    folders.append((f"source {step.name}'s folder", base_and_pattern(path, self.root)[0]))
        try:
            cluster.check_reachable(master, tuple(self.plan.target.shared_paths), self.root, folders)
        except cluster.UnreachablePathError as exc:
            raise RunError(str(exc), exc.hint) from exc

    def table_uri(self, name: str) -> str:
        return f"{self.lake}/{name}"

    def table_exists(self, name: str) -> bool:
        from runtime.table.table import Table

        return Table.exists(self.table_uri(name), self.storage_options)

    def open_table(self, name: str, spark=None):
        """The lake's table `name` (as stored; it must exist)."""
        from runtime.table.table import Table

        return Table.open(spark, self.table_uri(name), self.storage_options)

    def _check_spark_reads(self, spark, uri: str, table: str) -> None:
        """Before anything of `table` is written: Spark reads its data files, so on S3 it needs
        an S3 file system (runtime/s3.py)."""
        try:
            s3.check_spark(spark, uri, f"the lake of table {table}")
        except s3.SparkCannotReadS3 as exc:
            raise RunError(f"table {table}: {exc}; nothing was written", exc.hint) from exc

    def spark(self):
        """The run's SparkSession, started by the first step that needs it. A start that
        failed is not tried again by every other step: they all report that failure."""
        with self._spark_lock:
            if self._spark_error is not None:
                raise self._spark_error
            if self._spark is None:
                if self._spark_factory is None:
                    raise RunError("no Spark session available")
                try:
                    self._check_reachable()
                    self._spark = self._spark_factory()
                except BaseException as exc:
                    self._spark_error = exc
                    raise
            return self._spark

    # --- running ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        started, t0 = _now(), time.perf_counter()
        results = {sid: StepResult(sid, self.plan.step(sid).kind, self.plan.step(sid).name) for sid in self.selected}
        self._results = results
        in_run = set(self.selected)
        waiting = list(self.selected)
        running: dict[cf.Future, str] = {}
        threads = max(1, self.options.threads)
        interrupted = False
        with cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pipe-step") as pool:
            while waiting or running:
                try:
                    for sid in list(waiting):
                        step = self.plan.step(sid)
                        deps = [d for d in step.depends_on if d in in_run]
                        states = [results[d].state for d in deps]
                        if self._cancel.is_set():
                            waiting.remove(sid)
                            why = "the run was interrupted" if interrupted else "the run stopped at the first failure (--fail-fast)"
                            self._finish(results[sid], "skipped", f"not started: {why}")
                        elif any(s in ("error", "skipped", "cancelled") for s in states):
                            waiting.remove(sid)
                            bad = [d for d in deps if results[d].state in ("error", "skipped", "cancelled")]
                            self._finish(results[sid], "skipped", f"skipped: upstream {', '.join(bad)} did not succeed")
                        elif all(s in ("success", "no_input", "would_run") for s in states) and len(running) < threads:
                            waiting.remove(sid)
                            results[sid].state = "running"
                            results[sid].started_at = _now()
                            self.listener("start", results[sid])
                            running[pool.submit(self._run_step, step, results[sid])] = sid
                    if not running:
                        continue
                    done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        sid = running.pop(fut)
                        if results[sid].state == "error" and self.options.fail_fast and not self._cancel.is_set():
                            self._cancel.set()
                            self._cancel_running([running[f] for f in running])
                except KeyboardInterrupt:
                    # Ctrl-C: cancel the running steps' Spark jobs (their writes roll back), start
                    # nothing new, and report the run; a second Ctrl-C stops at once
                    if interrupted:
                        raise
                    interrupted = self._interrupted = True
                    self._cancel.set()
                    self._cancel_running(list(running.values()))
        return RunResult(started, time.perf_counter() - t0, [results[s] for s in self.selected], interrupted)

    def _cancel_running(self, step_ids: list[str]) -> None:
        """Cancels the Spark jobs of the running steps, and keeps cancelling the jobs they
        start until they end (a step between two jobs would otherwise start the next one)."""
        if self._spark is None or not step_ids:
            return
        spark = self._spark

        def keep_cancelling() -> None:
            while any(self._results[s].state == "running" for s in step_ids if s in self._results):
                for sid in step_ids:
                    try:
                        spark.sparkContext.cancelJobGroup(sid)
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
            if step.kind == "ingest":
                state, message = self._run_source(step, result)
            else:
                state, message = self._run_write(step, result)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported on its step
            result.elapsed_s = round(time.perf_counter() - t0, 3)
            cancelled = is_cancellation(exc) or (self._cancel.is_set() and not isinstance(exc, PipeError))
            if cancelled:
                # Ctrl-C or --fail-fast cancelled its Spark jobs (or someone did in the Spark UI):
                # the write rolled back, so this is a cancellation, not an error of the step
                message, hint = self._cancelled_message(step), None
            else:
                message, hint = describe_error(exc, step)
            if not cancelled and not isinstance(exc, (PipeError,)) and not _is_user_error(exc):
                result.traceback = traceback.format_exc()
            self._finish(result, "cancelled" if cancelled else "error", message, hint)
            return
        # outside the try: once a step has committed, nothing after it turns it into an error
        result.elapsed_s = round(time.perf_counter() - t0, 3)
        self._finish(result, state, message)

    def _cancelled_message(self, step: Step) -> str:
        if self._interrupted:
            why = "the run was interrupted (Ctrl-C)"
        elif self._cancel.is_set():
            why = "the run stopped at the first failure (--fail-fast)"
        else:
            why = "its Spark job was cancelled (from the Spark UI or by the cluster)"
        return f"cancelled: {why}; {step.name if step.kind == 'write' else step.id} wrote nothing, and the next run reads its input again"

    # --- sources -----------------------------------------------------------------------------

    def _run_source(self, step: Step, result: StepResult) -> tuple[str, str]:
        """A source step checks that the source can be listed and says how much is there;
        what is new is decided per consuming table, against that table's checkpoint."""
        config = self._config(step)
        kind = config["kind"]
        if kind == "files":
            entries = files_source.list_files(config, self.root, step.name)
            from runtime.sources import human_bytes

            result.inputs = {"files": len(entries), "bytes": sum(e.size for e in entries)}
            return ("would_run" if self.options.dry_run else "success"), f"{len(entries)} file{'s' if len(entries) != 1 else ''} ({human_bytes(result.inputs['bytes'])}) listed"
        done = "would_run" if self.options.dry_run else "success"
        if kind in ("table", "s3_incremental"):
            name = config["table"] if kind == "table" else config["metadata_table"]
            if self._built_later(name):
                return "would_run", f"reads table {name} once it is built in this run"
            latest = self._open_table(name, f"source {step.name}").timeline().latest_completed()
            what = "table" if kind == "table" else "metadata table"
            return done, f"{what} {name} at {latest.time if latest else 'no commit yet'}"
        if kind == "s3_events":
            pending = s3_events_source.pending(step.name, config, dry_run=True)  # asks, receives nothing
            result.inputs = {"messages_waiting": pending.count}
            return done, f"queue: {pending.describe()}"
        raise RunError(f"source {step.name}: sources of kind {kind} cannot run in this version of pipe")

    def _config(self, step: Step) -> dict[str, Any]:
        """The step's config with ${env:...} placeholders filled in from the environment."""
        if not step.env_vars:
            return dict(step.config)
        import json

        try:
            return json.loads(resolve_env_placeholders(json.dumps(step.config), {k: json.dumps(v)[1:-1] for k, v in self.environ.items()}))
        except KeyError as exc:
            raise RunError(f"{step.id}: environment variable {exc.args[0]} is not set ({step.file}:{step.line} uses it)",
                           f"export {exc.args[0]}=... before `pipe run`") from exc

    # --- tables ------------------------------------------------------------------------------

    def _open_table(self, name: str, needed_by: str):
        if not self.table_exists(name):
            raise RunError(f"{needed_by} reads table {name}, which has not been built yet (no table at {self.table_uri(name)})",
                           f"build it first: `pipe run --select +{name}`")
        return self.open_table(name, self._spark)

    def consumer_checkpoints(self, table: str) -> dict[str, str]:
        """The instant each incremental consumer of `table` (a table reading it through a `table`
        or `s3_incremental` source) has read up to, by "consumer (source)". Cleaning keeps what
        the reads after the oldest of them need, and archiving does not pass it. A consumer
        that has not run yet reads the whole table, so it holds nothing back."""
        return {f"{reader.name} ({src.name})": cp for src, reader, cp in self._incremental_consumers(table)}

    def _incremental_consumers(self, table: str) -> list[tuple[Step, Step, str]]:
        """(source step, consuming write step, instant read up to) of every built consumer of
        `table` that has read it incrementally."""
        out = []
        for src in self.plan.steps:
            if src.kind != "ingest" or src.config.get("kind") not in ("table", "s3_incremental"):
                continue
            if (src.config.get("table") or src.config.get("metadata_table")) != table:
                continue
            for reader in self.plan.steps:
                if reader.kind != "write" or src.id not in reader.depends_on or not self.table_exists(reader.name):
                    continue
                stored, _, _ = _stored_state(self.open_table(reader.name))
                checkpoint = stored.get(src.name)
                if checkpoint:  # s3_incremental: "instant#bucket/key" within an instant
                    out.append((src, reader, checkpoint.split("#", 1)[0]))
        return out

    def rebuild_warnings(self) -> list[str]:
        """With --full-refresh: a selected table whose key, partitioning, type or precombine
        field changed is created anew, and its instants start over. Every incremental consumer
        that has read it loses its checkpoint: one message per consumer, saying what its next
        run will do. A consumer rebuilt in the same run reads the new table whole: no loss."""
        if not self.options.full_refresh:
            return []
        out = []
        for sid in self.selected:
            step = self.plan.step(sid)
            if step.kind != "write" or not self.table_exists(step.name) or self._reads_queue(step):
                continue
            try:
                changed = self.open_table(step.name).definition_changes(table_config(step, self._config(step)))
            except RunError:
                continue  # an environment variable is missing: the step itself will say so
            if not changed:
                continue
            for src, reader, cp in self._incremental_consumers(step.name):
                if f"table.{reader.name}" in self.selected:
                    continue
                if src.config.get("on_checkpoint_lost") == "full_read":
                    then = f"then reads all of {step.name} again (its source sets on_checkpoint_lost: full_read)"
                else:
                    then = (f"then stops with a lost checkpoint until it is rebuilt too (`pipe run --select {reader.name} --full-refresh`, "
                            f"or add it to this run: `--select {step.name}+`), or its source sets `on_checkpoint_lost: full_read`")
                out.append(f"--full-refresh creates table {step.name} anew ({changed}): {reader.name} has read it up to {cp} "
                           f"through source {src.name}, a checkpoint the new table will not have; its next run {then}")
        return out

    def _built_later(self, table: str) -> bool:
        """In a dry run, a selected upstream table that does not exist yet would be built first."""
        return self.options.dry_run and f"table.{table}" in self.selected and not self.table_exists(table)

    def _pending_inputs(self, step: Step, checkpoints: Mapping[str, str], full: bool,
                        sources: dict[str, Pending]) -> dict[str, str]:
        """Fills `sources` with the new input per source (as it goes, so that the caller can
        let go of received queue messages if a later source fails), and returns the latest
        instant of each upstream table read by ref()."""
        refs: dict[str, str] = {}
        for dep in step.depends_on:
            up = self.plan.step(dep)
            if up.kind == "ingest":
                config = self._config(up)
                last = None if full else checkpoints.get(up.name)
                if config["kind"] == "files":
                    if full and self.options.full_refresh:  # all input: --full-refresh ignores per-run limits
                        config = {**config, "max_files_per_run": None, "max_bytes_per_run": None}
                    sources[up.name] = files_source.pending(up.name, config, self.root, last)
                elif config["kind"] == "table":
                    if self._built_later(config["table"]):
                        refs[config["table"]] = "(built earlier in this run)"
                        continue
                    upstream = self._open_table(config["table"], f"source {up.name}")
                    sources[up.name] = table_source.pending(up.name, config, upstream, step.name, last)
                elif config["kind"] == "s3_incremental":
                    if self._built_later(config["metadata_table"]):
                        refs[config["metadata_table"]] = "(built earlier in this run)"
                        continue
                    if full and self.options.full_refresh:
                        config = {**config, "max_bytes_per_run": None, "read_latest_on_missing_checkpoint": False}
                    upstream = self._open_table(config["metadata_table"], f"source {up.name}")
                    sources[up.name] = s3_incremental_source.pending(up.name, config, upstream, step.name, last, self.s3a)
                elif config["kind"] == "s3_events":
                    sources[up.name] = s3_events_source.pending(up.name, config, dry_run=self.options.dry_run)
                else:
                    raise RunError(f"source {up.name} of kind {config['kind']} cannot run in this version of pipe")
            else:
                if self._built_later(up.name):
                    refs[up.name] = "(built earlier in this run)"
                    continue
                table = self._open_table(up.name, f"table {step.name}")
                latest = table.timeline().latest_completed()
                if latest is None:
                    raise RunError(f"table {step.name} reads table {up.name}, which has no completed commit yet",
                                   f"build it first: `pipe run --select +{up.name}`")
                refs[up.name] = latest.time
        return refs

    def _run_write(self, step: Step, result: StepResult) -> tuple[str, str]:
        sources: dict[str, Pending] = {}
        outcome = {"committed": False, "succeeded": False}
        try:
            state, message = self._write_step(step, result, sources, outcome)
            outcome["succeeded"] = True
        finally:
            self._settle_sources(step, result, sources, outcome["committed"], outcome["succeeded"])
        return state, message + _source_notes(sources)

    def _settle_sources(self, step: Step, result: StepResult, sources: Mapping[str, Pending], committed: bool, succeeded: bool) -> None:
        """After the write, committed or not: queue messages the commit holds are deleted (those
        of a failed step go back to the queue at once), cached object reads are dropped."""
        problems = []
        for name, p in sources.items():
            if isinstance(p, s3_events_source.S3EventsPending):
                try:
                    p.finish(committed, succeeded, dead_letter=self._dead_letter_writer(step, name, p.config))
                except Exception as exc:  # noqa: BLE001 - reported on the step below
                    problems.append(f"source {name}: {exc}")
                result.inputs[name] = p.to_dict()
            else:
                p.release()
        if problems and succeeded:
            raise RunError("; ".join(problems), "the commit is complete; the messages concerned stay in the queue and are retried next run")

    def _dead_letter_writer(self, step: Step, source: str, config: Mapping[str, Any]):
        def write(messages) -> None:
            from runtime.table.config import TableConfig
            from runtime.table.table import Table

            spark = self.spark()
            session = spark.newSession()
            name = source + s3_events_source.DEAD_LETTER_SUFFIX
            self._check_spark_reads(spark, self.table_uri(name), name)
            table = Table.create(session, self.table_uri(name),
                                 TableConfig(name=name, record_key_fields=("message_id",), precombine_field="dead_lettered_at"),
                                 self.storage_options)
            rows = s3_events_source.dead_letter_rows(source, config, messages)
            table.write(session.createDataFrame(rows, s3_events_source.DEAD_LETTER_DDL), "upsert")

        return write

    def _write_step(self, step: Step, result: StepResult, sources: dict[str, Pending], outcome: dict[str, bool]) -> tuple[str, str]:
        config = self._config(step)
        result.operation = config["operation"]
        uri = self.table_uri(step.name)
        exists = self.table_exists(step.name)
        table = self.open_table(step.name) if exists else None
        kept = ""
        if exists and self.options.full_refresh and self._reads_queue(step):
            kept = "--full-refresh does not apply (it reads a queue, whose messages are gone once consumed); "
        full = (self.options.full_refresh and not kept) or not exists
        stored, fingerprint, based_on = ({}, None, None)
        if table is not None:
            stored, fingerprint, based_on = _stored_state(table)
        dataset = None
        if config["operation"] == "bootstrap":
            if based_on is not None and not self.options.full_refresh:
                changed = "; its definition changed since" if fingerprint != step.fingerprint else ""
                return "no_input", (f"bootstrapped already (commit {based_on}){changed}; "
                                    f"`pipe run --select {step.name} --full-refresh` bootstraps it again from {config['bootstrap']['path']}")
            dataset = self._bootstrap_dataset(step, config)
            full = True
        refs = self._pending_inputs(step, stored, full, sources)
        result.inputs = {name: p.to_dict() for name, p in sources.items()}
        result.inputs.update({name: {"instant": t, "checkpoint": t} for name, t in refs.items()})
        if self.options.dry_run and not full:
            # an upstream table that would write in this run gives this one new input too
            writers = sorted({t for d in step.depends_on for t in self._would_write(d)})
            if writers and not any(not p.is_empty for p in sources.values()):
                return "would_run", kept + f"after {', '.join(writers)} (which would write first)"
        if not full and not _has_work(sources, refs, stored, fingerprint, step.fingerprint):
            if fingerprint is not None and fingerprint != step.fingerprint and not kept:
                return "no_input", ("no new input; the table's definition changed since its last commit and applies to new input "
                                    "only: `--full-refresh` rebuilds it from all input")
            return "no_input", kept + "no new input"
        if self.options.dry_run and dataset is not None:
            return "would_run", f"bootstrap of {dataset.describe()}"
        if self.options.dry_run:
            detail = "; ".join(f"{n}: {p.describe()}" for n, p in sources.items()) or "reads " + ", ".join(refs)
            return "would_run", kept + ("first build: " if not exists else "full refresh: " if full else "") + detail

        spark = self.spark()
        self._check_spark_reads(spark, uri, step.name)
        spark.sparkContext.setJobGroup(step.id, f"pipe {step.id}", interruptOnCancel=True)
        session = spark.newSession()
        rows_read = 0
        for name, p in sources.items():
            try:
                df = p.dataframe(session)
            except s3_incremental_source.NothingToRead as exc:
                if all(q.is_empty for n, q in sources.items() if n != name) and not refs:
                    return "no_input", f"no new input ({exc})"
                raise
            df.createOrReplaceTempView(name)
            rows_read += p.rows or 0
        for name, instant in refs.items():
            self.open_table(name, session).read(as_of=instant, meta=False).createOrReplaceTempView(name)
        if exists and not full:  # {{ this }}: the table's current snapshot
            self.open_table(step.name, session).read(meta=False).createOrReplaceTempView(step.name)
        result.rows_read = rows_read if any(p.rows is not None for p in sources.values()) else None
        result.inputs = {name: p.to_dict() for name, p in sources.items()}
        result.inputs.update({name: {"instant": t, "checkpoint": t} for name, t in refs.items()})
        sql = step.sql_full_refresh if (full and step.sql_full_refresh) else step.sql
        if dataset is not None:
            df = self._bootstrap_frame(session, step, config, dataset)
        elif sql is None:  # delete_partition with partitions_to_delete only
            df = None
        else:
            try:
                df = session.sql(sql)
            except Exception as exc:  # noqa: BLE001 - an analysis error is a mistake in the SQL
                raise RunError(f"{step.sql_file or step.file}: Spark cannot run the SQL of table {step.name}: {_spark_message(exc)}",
                               "fix the SQL (see the rendered query with `pipe compile` in target/plan.json)") from exc

        table, recreated = self._create_table(session, step, config, uri, rebuild=full and exists)
        extra = {f"{CHECKPOINT_PREFIX}{n}": p.checkpoint for n, p in sources.items() if p.checkpoint is not None}
        for n, p in sources.items():  # a source with nothing new keeps its checkpoint
            if p.checkpoint is None and n in stored and not full:
                extra[f"{CHECKPOINT_PREFIX}{n}"] = stored[n]
        extra.update({f"{CHECKPOINT_PREFIX}{n}": t for n, t in refs.items()})
        extra[FINGERPRINT_KEY] = step.fingerprint
        if dataset is not None:
            extra.update({"pipe.bootstrap.path": dataset.uri, "pipe.bootstrap.files": str(dataset.files),
                          "pipe.bootstrap.partitions": str(len(dataset.partitions)) if dataset.partitions != [""] else "0"})
        operation, options = _write_options(config, full and exists and (dataset is None or based_on is not None))
        if operation == "delete_partition" and df is not None:
            options["partitions_to_delete"] = sorted(set(options["partitions_to_delete"]) | self._named_partitions(step, config, df, table))
            if not options["partitions_to_delete"]:
                return "no_input", "no partition to delete (the SQL returned no rows)"
        if self._cancel.is_set():
            raise Cancelled(f"{step.id}: cancelled before its write started")
        # refused if another run committed to this table since its checkpoints were read
        try:
            consumers = self.consumer_checkpoints(step.name)
            w = table.write(df, operation=operation, extra_metadata=extra, expect_latest=None if recreated else based_on,
                            retain_from=min(consumers.values()) if consumers else None, **options)
        except BaseException:
            if recreated and _is_local(uri):
                _delete_table(_staging_uri(uri), self.storage_options)  # the old table was never touched
            raise
        if recreated and _is_local(uri):
            _swap_in(_staging_uri(uri), uri)
        outcome["committed"] = True
        result.instant, result.action = w.instant, w.action
        result.inserts, result.updates, result.deletes = w.inserts, w.updates, w.deletes
        result.rows_written = w.inserts + w.updates
        note = f"; the commit stands, but compacting, cleaning or archiving after it failed ({w.service_error})" if w.service_error else ""
        if w.compaction:
            note = f", compacted (commit {w.compaction})" + note
        if w.retired:
            note += f"; first {w.retired}"
        return "success", kept + ("full refresh, " if full and exists else "") + f"{w.action} {w.instant}" + note

    def _named_partitions(self, step: Step, config: Mapping[str, Any], df, table) -> set[str]:
        """delete_partition with SQL: each row names a partition by its partition_by columns,
        whose text is the table's (timestamps, decimals: keygen.py). Only the distinct partition
        paths reach the driver."""
        fields = list(config["partition_by"])
        missing = [c for c in fields if c not in df.columns]
        if missing:
            raise RunError(f"{step.sql_file}: the rows of table {step.name} name the partitions to delete, but its SELECT has no column(s) "
                           f"{', '.join(missing)}", f"select the partition_by column(s) {', '.join(fields)} of the partitions to delete")
        return table.partition_paths(df.select(*fields))

    def _bootstrap_dataset(self, step: Step, config: Mapping[str, Any]):
        from runtime.table import bootstrap

        boot = config["bootstrap"]
        try:
            uri = self._project_uri(boot["path"])
            options = s3.client_options(self.s3a, s3.bucket_of(uri)) if s3.is_s3(uri) else ()
            return bootstrap.scan(uri, boot.get("partition_regex"), options)
        except bootstrap.BootstrapError as exc:
            raise RunError(f"{step.file}:{step.line}: table {step.name}: {exc}", exc.hint) from exc

    def _bootstrap_frame(self, session, step: Step, config: Mapping[str, Any], dataset):
        from runtime.table import bootstrap

        try:
            df = bootstrap.read(session, dataset)
        except Exception as exc:  # noqa: BLE001 - files Spark cannot read as Parquet
            raise RunError(f"{step.file}:{step.line}: table {step.name}: Spark cannot read the dataset at {dataset.uri}: {_spark_message(exc)}",
                           "bootstrap.path must hold Parquet files with one schema") from exc
        needed = [*config["key"], *config["partition_by"], *([config["precombine"]] if config.get("precombine") else [])]
        missing = [c for c in needed if c not in df.columns]
        if missing:
            raise RunError(f"{step.file}:{step.line}: table {step.name} names column(s) {', '.join(missing)} (key, partition_by or precombine) "
                           f"that the dataset at {dataset.uri} does not have; its columns: {', '.join(df.columns)}",
                           "name columns of the dataset (partition folders named column=value count as columns)")
        return df

    def _would_write(self, step_id: str) -> list[str]:
        """In a dry run: the tables in this run that would write and feed `step_id` (itself, or
        through a `table`/`s3_incremental` source)."""
        r = self._results.get(step_id)
        if r is None:
            return []
        if r.kind == "write":
            return [r.name] if r.state == "would_run" else []
        if self.plan.step(step_id).config.get("kind") in ("table", "s3_incremental"):
            return [t for d in self.plan.step(step_id).depends_on for t in self._would_write(d)]
        return []

    def _reads_queue(self, step: Step) -> bool:
        return any(self.plan.step(d).kind == "ingest" and self.plan.step(d).config.get("kind") == "s3_events" for d in step.depends_on)

    def _create_table(self, spark, step: Step, config: Mapping[str, Any], uri: str, rebuild: bool):
        from runtime.table.table import Table, TableError

        wanted = table_config(step, config)
        try:
            return Table.create(spark, uri, wanted, self.storage_options), False
        except TableError as exc:
            if not rebuild or "was created differently" not in str(exc):
                raise
        # --full-refresh of a table whose key, partitioning or type changed: start it anew. On a
        # local lake the new table is built beside the old one and swapped in once committed, so
        # a failed rebuild leaves the old table as it was.
        if _is_local(uri):
            staging = _staging_uri(uri)
            _delete_table(staging, self.storage_options)
            return Table.create(spark, staging, wanted, self.storage_options), True
        _delete_table(uri, self.storage_options)
        return Table.create(spark, uri, wanted, self.storage_options), True


def table_config(step: Step, config: Mapping[str, Any]):
    """The Hudi table definition (hoodie.properties) of a write step."""
    from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ, TableConfig

    return TableConfig(
        name=step.name,
        table_type=MERGE_ON_READ if config["type"] == "merge_on_read" else COPY_ON_WRITE,
        record_key_fields=tuple(config["key"]),
        partition_fields=tuple(config["partition_by"]),
        precombine_field=config.get("precombine"),
        hive_style=config["hive_style_partitioning"],
    )


def _stored_state(table) -> tuple[dict[str, str], str | None, str | None]:
    """The checkpoints and step fingerprint of the table's latest commit written by pipe, and
    the latest completed write instant they were read at."""
    from runtime.table.timeline import WRITE_ACTIONS

    timeline = table.timeline()
    writes = timeline.completed(WRITE_ACTIONS)
    latest = writes[-1].time if writes else None
    for inst in reversed(timeline.completed()):
        extra = timeline.commit_metadata(inst).extra
        if FINGERPRINT_KEY in extra or any(k.startswith(CHECKPOINT_PREFIX) for k in extra):
            cps = {k[len(CHECKPOINT_PREFIX):]: v for k, v in extra.items() if k.startswith(CHECKPOINT_PREFIX)}
            return cps, extra.get(FINGERPRINT_KEY), latest
    return {}, None, latest


def _source_notes(sources: Mapping[str, Pending]) -> str:
    """What a user should hear about even when the step succeeds: malformed messages, objects
    gone from the bucket."""
    notes = []
    for name, p in sources.items():
        if isinstance(p, s3_events_source.S3EventsPending) and p.malformed:
            left = [m for m in p.malformed if m not in p.dead_lettered]
            if left:
                notes.append(f"{name}: {len(left)} malformed message(s) left in the queue, e.g. {left[0].id}: {left[0].error}")
            if p.delete_failures:
                notes.append(f"{name}: {p.delete_failures} message(s) could not be deleted from the queue after the commit "
                             "(they come back and upsert the same keys)")
            if p.dead_lettered:
                notes.append(f"{name}: {len(p.dead_lettered)} malformed message(s) moved to table {name}{s3_events_source.DEAD_LETTER_SUFFIX} "
                             f"after {p.dead_lettered[0].receive_count} receives, e.g. {p.dead_lettered[0].id}: {p.dead_lettered[0].error}")
        if p.bad_records:
            notes.append(f"{name}: {p.bad_records} bad record(s) dropped (on_bad_record: drop), e.g. {p.bad_samples[0]}")
        if isinstance(p, s3_incremental_source.S3IncrementalPending) and p.missing:
            notes.append(f"{name}: {len(p.missing)} object(s) gone from the bucket were skipped, e.g. s3://{p.missing[0]}")
    return "".join(f"; {n}" for n in notes)


def _has_work(sources: Mapping[str, Pending], refs: Mapping[str, str], stored: Mapping[str, str],
              fingerprint: str | None, wanted_fingerprint: str) -> bool:
    """A table fed by sources runs when a source has new input; one that only reads other
    tables runs when an upstream has a new commit or the step's definition changed."""
    if sources:
        return any(not p.is_empty for p in sources.values())
    return any(stored.get(n) != t for n, t in refs.items()) or fingerprint != wanted_fingerprint


def _write_options(config: Mapping[str, Any], full_refresh: bool) -> tuple[str, dict[str, Any]]:
    operation = config["operation"]
    options: dict[str, Any] = {
        "index": config["index"],
        "delete_when": config.get("delete_when"),
        "tombstone_days": config.get("tombstone_days"),
        "insert_duplicates": config["insert_duplicates"],
        "combine_before_insert": config["combine_before_insert"],
        "precombine_nulls": config.get("precombine_nulls", "fail"),
        "bulk_insert_sort_mode": config["bulk_insert_sort_mode"].upper(),
        "max_file_size": config["max_file_size"],
        "small_file_limit": config["small_file_limit"],
        "clean_policy": config["clean"]["policy"],
        "clean_retain": config["clean"]["retain"],
        "clean_inline": config["clean"]["inline"],
        "archive_min": config["archive"]["min_instants"],
        "archive_max": config["archive"]["max_instants"],
    }
    compaction = config.get("compaction") or {}
    if config["type"] == "merge_on_read" and compaction.get("inline", True):
        options["compact_after"] = compaction.get("max_delta_commits", 5)
    if operation == "delete_partition":
        options["partitions_to_delete"] = list(config.get("partitions_to_delete") or [])
    if full_refresh and operation not in ("delete", "delete_partition"):
        # rebuild: every row of the input replaces the table in one replacecommit
        operation = "insert_overwrite_table"
        options["combine_before_insert"] = bool(config["key"]) and config["operation"] == "upsert" or config["combine_before_insert"]
    return operation, options


def _is_local(uri: str) -> bool:
    return not uri.startswith(("s3://", "s3a://"))


def _staging_uri(uri: str) -> str:
    parent, _, name = uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.rebuild"


def _swap_in(staging: str, uri: str) -> None:
    """Replaces the table at `uri` with the one built at `staging` (two renames; the old
    table is deleted only once the new one is in place)."""
    import shutil

    path = uri[len("file://"):] if uri.startswith("file://") else uri
    new = staging[len("file://"):] if staging.startswith("file://") else staging
    old = new[: -len(".rebuild")] + ".old"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(path, old)
    os.rename(new, path)
    shutil.rmtree(old, ignore_errors=True)


def _delete_table(uri: str, storage_options: tuple = ()) -> None:
    from runtime.storage import StorageSpec, open_storage

    storage = open_storage(StorageSpec(uri, storage_options))
    for f in storage.list_files("", recursive=True):
        storage.delete(f.path)
    if not storage.spec.is_s3:
        import shutil

        shutil.rmtree(storage.full_path(""), ignore_errors=True)


_TASK_ERROR = re.compile(r"^(?:[\w.]+\.)?(?:TableError|WriteError|SourceError): (.+)$", re.M)


def _spark_message(exc: BaseException) -> str:
    text = str(getattr(exc, "getMessage", lambda: None)() or exc).strip()
    raised = _TASK_ERROR.findall(text) if "Traceback (most recent call last)" in text else []
    if raised:  # pipe's own error raised in a Spark task (e.g. a damaged log file): its message, not the traceback
        return raised[-1][:600]
    failure = worker_error(text)
    if failure is not None:  # another failure inside a task: what was raised, not the worker's traceback
        return failure.line()[:600]
    lines = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith(("at ", "JVM stacktrace"))]
    message = " ".join(lines[:3])[:600] if lines else type(exc).__name__
    # getMessage() leaves out where in the query Spark stopped; str(exc) has it
    where = _SPARK_POSITION.search(str(exc))
    if where and where.group(0) not in message:
        message += f" (Spark's position: {where.group(1)}, {where.group(2)})"
    return message


_SPARK_POSITION = re.compile(r"(line \d+),? (pos(?:ition)? \d+)")


def _is_user_error(exc: BaseException) -> bool:
    """Errors that come from the project or its data, not from a bug in pipe."""
    from runtime.table.table import TableError
    from runtime.table.writer import WriteError

    if isinstance(exc, (TableError, WriteError)):
        return True
    try:  # Spark's own errors with an error condition: a query that fails on the data or the SQL
        from pyspark.errors.exceptions.captured import CapturedException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, CapturedException) and bool(exc.getCondition())


_CANCELLED = ("SPARK_JOB_CANCELLED", "cancelled part of cancelled job group", "cancelled because SparkContext was shut down",
              "SPARK_JOB_GROUP_CANCELLED", "JOB_CANCELLED")


def is_cancellation(exc: BaseException) -> bool:
    """A step ended by a cancellation (pipe's own, or of its Spark jobs), not by an error."""
    if isinstance(exc, (Cancelled, KeyboardInterrupt)):
        return True
    if isinstance(exc, PipeError):
        return False
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a Java exception whose message cannot be fetched any more
        return False
    return any(marker in text for marker in _CANCELLED)


def describe_error(exc: BaseException, step: Step) -> tuple[str, str | None]:
    if isinstance(exc, (RunError, SourceError)):
        return str(exc), getattr(exc, "hint", None)
    failure = worker_error(exc) if not isinstance(exc, PipeError) else None
    if failure is not None and failure.kind not in PIPE_ERRORS and failure.hint() is not None:
        # not the SQL's fault nor the data's: the executors' Python, memory, a lost executor
        return f"{step.id}: a Spark task failed: {failure.line()}", failure.hint()
    if _is_user_error(exc):
        where = f"{step.sql_file}: " if step.kind == "write" and step.sql_file else ""
        if step.kind == "write" and "lacks column(s)" in str(exc):
            # key / partition_by / precombine name a column the SELECT does not have: the name in
            # the YAML is the likelier typo (the writer's WriteError says "the input lacks column(s)")
            return (f"{step.file}:{step.line}: {step.id}: {_spark_message(exc)}",
                    f"check key, partition_by and precombine in {step.file} against the columns {step.sql_file or 'the SQL'} selects")
        return f"{where}{step.id}: {_spark_message(exc)}", None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", None
    return f"{step.id}: internal error: {type(exc).__name__}: {_spark_message(exc)}", "this may be a bug in pipe; run with --debug for the traceback"
