"""What every step of a run shares: the plan, the project folder, the run's options and
environment, the lake and how to reach it, the SparkSession (started by the first step that
needs it), the cancel signal, and the state each table's timeline keeps for its step."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from compiler.plan import Plan, Step
from compiler.render import resolve_env_placeholders
from runtime import s3
from runtime.errors import RunError
from runtime.table.timeline import CHECKPOINT_PREFIX, DEFERRED_PREFIX, SAMPLE_KEY

FINGERPRINT_KEY = "pipe.step.fingerprint"
STATES = ("pending", "running", "success", "warn", "no_input", "would_run", "error", "skipped", "cancelled")
# states after which the steps that depend on a step may start (`warn`: a test that warned)
DONE = ("success", "warn", "no_input", "would_run")


@dataclass
class RunOptions:
    full_refresh: bool = False
    threads: int = 4
    fail_fast: bool = False
    dry_run: bool = False
    reuse_tests: bool = False  # pipe build: a test of tables unchanged since it passed is not run again (steps/test_memory.py)
    sample: Any = None  # --empty / --sample: runtime/sample.Sample (part of each input; nothing consumed)


@dataclass
class StepResult:
    id: str
    kind: str
    name: str
    state: str = "pending"
    rows_read: int | None = None
    read: str | None = None  # what a table's step read when rows_read does not say it all: files of a source, a table's instant
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
    failures: int | None = None  # a test: its failing rows
    samples: list[dict[str, Any]] | None = None  # a test: a few of them
    failures_table: str | None = None  # a test with store_failures: the table its failing rows were written to
    expectations: dict[str, Any] | None = None  # a table with `expect:`: the rows checked, failures per expectation
    catalog: dict[str, Any] | None = None  # a table in a target with a catalog: what its sync did, or its error
    traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("traceback")
        if self.catalog is None:
            d.pop("catalog")
        if self.kind not in ("test", "unit"):
            d.pop("failures"), d.pop("samples")
        if self.failures_table is None:
            d.pop("failures_table")
        if self.expectations is None:
            d.pop("expectations")
        if self.read is None:
            d.pop("read")
        return d


class RunContext:
    """One run's (or one command's) view of the project and its lake. Commands that only read
    tables (`pipe show`, services) make one with no selection and no Spark factory."""

    def __init__(self, plan: Plan, project_root: Path, selected: Iterable[str] = (), options: RunOptions | None = None,
                 spark_factory: Callable[[], Any] | None = None, environ: Mapping[str, str] | None = None, defer=None):
        self.plan = plan
        self.root = Path(project_root)
        chosen = set(selected)
        self.selected = [s for s in plan.step_ids if s in chosen]
        self.options = options or RunOptions()
        self.environ = dict(os.environ if environ is None else environ)
        self.lake = self._lake_uri()
        self.s3a = self._s3a_settings()
        # how pipe's own code (driver and tasks) reaches the lake: the target's fs.s3a settings
        self.storage_options = s3.client_options(self.s3a, s3.bucket_of(self.lake)) if s3.is_s3(self.lake) else ()
        # --defer: the tables read and not built in this run come from another target's lake, pinned (runtime/defer.py)
        self.defer = defer
        self.cancel = threading.Event()  # set by Ctrl-C and by --fail-fast
        self.interrupted = False  # Ctrl-C
        self.results: dict[str, StepResult] = {}
        # tables written in this run: name -> (latest write before, or None when rebuilt; the new instant)
        self.written: dict[str, tuple[str | None, str]] = {}
        self._spark_factory = spark_factory
        self._spark = None
        self._spark_error: BaseException | None = None
        self._spark_lock = threading.Lock()
        self._test_memory = None
        self._test_memory_lock = threading.Lock()
        self.catalog = None  # the target's catalog, opened by the first sync (runtime/steps/sync.py)
        self.catalog_error = None  # the catalog could not be opened: every table of the run says why
        self.catalog_lock = threading.Lock()

    # --- where things are ------------------------------------------------------------------

    def resolved(self, value: str, needed_by: str) -> str:
        """`value` with its environment placeholders filled in; a missing variable is a RunError
        saying what needs it (`needed_by`: "the lake of target dev needs it")."""
        try:
            return resolve_env_placeholders(value, self.environ)
        except KeyError as exc:
            raise RunError(f"environment variable {exc.args[0]} is not set; {needed_by}",
                           f"export {exc.args[0]}=... before `pipe run`") from exc

    def _lake_uri(self) -> str:
        lake = self.resolved(self.plan.target.lake, f"the lake of target {self.plan.target.name} needs it")
        return self.project_uri(lake).rstrip("/")

    def _s3a_settings(self) -> dict[str, str]:
        """The target's `spark.hadoop.fs.s3a.*` settings, placeholders filled in (runtime/s3.py)."""
        needed_by = f"the Spark settings of target {self.plan.target.name} need it"
        return s3.s3a_settings({k: self.resolved(str(v), needed_by)
                                for k, v in self.plan.target.spark_conf.items() if k.startswith(s3.PREFIX)})

    def project_uri(self, path: str) -> str:
        """A URI or absolute path as written; a relative path from the project folder."""
        if path.startswith(("s3://", "s3a://", "file://")) or os.path.isabs(path):
            return path
        return str((self.root / path).resolve())

    def config(self, step: Step) -> dict[str, Any]:
        """The step's config with ${env:...} placeholders filled in from the environment."""
        if not step.env_vars:
            return dict(step.config)
        try:
            return json.loads(resolve_env_placeholders(json.dumps(step.config), {k: json.dumps(v)[1:-1] for k, v in self.environ.items()}))
        except KeyError as exc:
            raise RunError(f"{step.id}: environment variable {exc.args[0]} is not set ({step.file}:{step.line} uses it)",
                           f"export {exc.args[0]}=... before `pipe run`") from exc

    def table_uri(self, name: str) -> str:
        return f"{self.lake}/{name}"

    def test_memory(self):
        """What tests remember of earlier commands (target/test_results.json), read once per run."""
        from runtime.steps.test_memory import TestMemory

        with self._test_memory_lock:
            if self._test_memory is None:
                self._test_memory = TestMemory(self.root / "target", self.lake)
            return self._test_memory

    def table_exists(self, name: str) -> bool:
        from runtime.table.table import Table

        return Table.exists(self.table_uri(name), self.storage_options)

    def open_table(self, name: str, spark=None):
        """The lake's table `name` (as stored; it must exist)."""
        from runtime.table.table import Table

        return Table.open(spark, self.table_uri(name), self.storage_options)

    def open_hudi(self, path: str, needed_by: str, spark=None):
        """The Hudi table at `path` (a `kind: hudi` source's: relative to the project, absolute or
        s3://), reached with the target's fs.s3a settings; a RunError if there is none."""
        from runtime.table.table import Table

        uri = self.project_uri(path).rstrip("/")
        options = s3.client_options(self.s3a, s3.bucket_of(uri)) if s3.is_s3(uri) else ()
        if not Table.exists(uri, options):
            raise RunError(f"{needed_by} reads the Hudi table at {uri}, and there is none (no .hoodie/hoodie.properties)",
                           "check the source's `path`: it names a Hudi table's base path, the folder that holds .hoodie/")
        return Table.open(spark or self._spark, uri, options)

    def deferred(self, name: str):
        """The pin of table `name` when this run reads it from the target it defers to, else None."""
        return self.defer.pins.get(name) if self.defer is not None else None

    def open_upstream(self, name: str, needed_by: str, spark=None):
        """Table `name`, read by `needed_by` ("source orders_raw") through `spark` (default: the
        run's session): with --defer, a table the run does not build is the deferred target's,
        cut at its pin; a RunError if it was never built."""
        if self.deferred(name) is not None:
            return self.defer.open(name, spark or self._spark)
        if not self.table_exists(name):
            raise RunError(f"{needed_by} reads table {name}, which has not been built yet (no table at {self.table_uri(name)})",
                           f"build it first: `pipe run --select +{name}`")
        return self.open_table(name, spark or self._spark)

    # --- Spark -----------------------------------------------------------------------------

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

    @property
    def spark_started(self):
        """The session if a step has started it, else None (nothing to cancel)."""
        return self._spark

    def _check_reachable(self) -> None:
        """Before Spark starts on a cluster: the executors can reach the lake and the input
        folders (runtime/spark/cluster.py)."""
        from runtime.spark import cluster
        from runtime.sources.files import base_and_pattern

        try:
            master = resolve_env_placeholders(self.plan.target.spark_master, self.environ)
        except KeyError:
            return  # the Spark start reports the missing variable
        folders = []
        lake = cluster.local_folder(self.lake)
        if lake is not None:
            folders.append((f"the lake of target {self.plan.target.name}", lake))
        deferred = cluster.local_folder(self.defer.lake) if self.defer is not None and self.defer.pins else None
        if deferred is not None:  # --defer: the tasks read the other target's tables too
            folders.append((f"the lake of target {self.defer.target} (--defer)", deferred))
        for step in self.plan.steps:
            if step.kind == "ingest" and step.config.get("kind") == "files" and step.id in self.selected:
                path = str(step.config.get("path", ""))
                if cluster.local_folder(path) is not None:
                    folders.append((f"source {step.name}'s folder", base_and_pattern(path, self.root)[0]))
        try:
            cluster.check_reachable(master, tuple(self.plan.target.shared_paths), self.root, folders)
        except cluster.UnreachablePathError as exc:
            raise RunError(str(exc), exc.hint) from exc

    def check_spark_reads(self, spark, uri: str, table: str) -> None:
        """Before anything of `table` is written: Spark reads its data files, so on S3 it needs
        an S3 file system (runtime/s3.py)."""
        try:
            s3.check_spark(spark, uri, f"the lake of table {table}")
        except s3.SparkCannotReadS3 as exc:
            raise RunError(f"table {table}: {exc}; nothing was written", exc.hint) from exc

    # --- the plan in this run --------------------------------------------------------------

    def built_later(self, table: str) -> bool:
        """In a dry run, a selected upstream table that does not exist yet would be built first."""
        return self.options.dry_run and f"table.{table}" in self.selected and not self.table_exists(table)

    def would_write(self, step_id: str) -> list[str]:
        """In a dry run: the tables in this run that would write and feed `step_id` (itself, or
        through a `table`/`s3_incremental` source)."""
        r = self.results.get(step_id)
        if r is None:
            return []
        if r.kind == "write":
            return [r.name] if r.state == "would_run" else []
        if self.plan.step(step_id).config.get("kind") in ("table", "s3_incremental"):
            return [t for d in self.plan.step(step_id).depends_on for t in self.would_write(d)]
        return []

    def reads_queue(self, step: Step) -> str | None:
        """The kind of a source of the step whose messages may be gone once read (`s3_events`: an SQS
        queue; `kafka`: a topic under retention), or None: a full refresh would rebuild the table
        from what is left."""
        kinds = {self.plan.step(d).config.get("kind") for d in step.depends_on if self.plan.step(d).kind == "ingest"}
        return next((k for k in ("s3_events", "kafka") if k in kinds), None)

    def consumer_checkpoints(self, table: str) -> dict[str, str]:
        """The instant each incremental consumer of `table` (a table reading it through a `table`
        or `s3_incremental` source) has read up to, by "consumer (source)". Cleaning keeps what
        the reads after the oldest of them need, and archiving does not pass it. A consumer
        that has not run yet reads the whole table, so it holds nothing back."""
        return {f"{reader.name} ({src.name})": cp for src, reader, cp in self.incremental_consumers(table)}

    def incremental_consumers(self, table: str) -> list[tuple[Step, Step, str]]:
        """(source step, consuming write step, instant read up to) of every built consumer of
        `table` that has read it incrementally."""
        out = []
        for src in self.plan.steps:
            if src.reads_table is None or src.reads_table != table:
                continue
            for reader in self.plan.steps:
                if reader.kind != "write" or src.id not in reader.depends_on or not self.table_exists(reader.name):
                    continue
                kept = stored(self.open_table(reader.name))
                if src.name in kept.deferred:  # read from another target's lake (--defer): holds nothing back here
                    continue
                checkpoint = kept.checkpoints.get(src.name)
                if checkpoint:  # s3_incremental: "instant#bucket/key" within an instant; a 1.x upstream's: "instant_completion"
                    out.append((src, reader, checkpoint.split("#", 1)[0].split("_", 1)[0]))
        return out


@dataclass(frozen=True)
class Stored:
    """What the table's latest commit written by pipe says of its step: the checkpoint of each
    input, the step's fingerprint, the target each deferred input was read from (--defer), and
    the latest completed write instant they were read at (a compaction is none: it may complete
    before this run writes without a conflict)."""
    checkpoints: dict[str, str]
    fingerprint: str | None
    based_on: str | None
    deferred: dict[str, str]
    sample: str | None = None  # the --sample spec ("empty": --empty) the commit was built with


def stored(table) -> Stored:
    timeline = table.timeline()
    last = timeline.latest_data_write()
    latest = last.time if last else None
    for inst in reversed(timeline.completed()):
        extra = timeline.commit_metadata(inst).extra
        if FINGERPRINT_KEY in extra or SAMPLE_KEY in extra or any(k.startswith(CHECKPOINT_PREFIX) for k in extra):
            def under(prefix: str) -> dict[str, str]:
                return {k[len(prefix):]: v for k, v in extra.items() if k.startswith(prefix)}
            return Stored(under(CHECKPOINT_PREFIX), extra.get(FINGERPRINT_KEY), latest, under(DEFERRED_PREFIX), extra.get(SAMPLE_KEY))
    return Stored({}, None, latest, {})
