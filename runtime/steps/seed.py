"""Seed steps: a table step whose rows are a CSV file of the project (compiler/seeds.py).

A seed is written only when its content (or its settings) changed since the table's latest
commit: the step's fingerprint holds the file's sha256, and the commit stores the fingerprint.
A changed seed replaces the whole table in one replacecommit (insert_overwrite_table), so a row
removed from the file is gone from the table. The rows reach Spark from the driver
(`createDataFrame`): a seed is small and lives with the project, on the driver, which is the one
exception to "only metadata reaches the driver". Nothing is read from a path by executors, so a
seed loads the same on local Spark, a cluster and Spark Connect."""

from __future__ import annotations

from compiler import seeds
from compiler.plan import Step
from runtime.spark import api as spark_api
from runtime.steps import sync
from runtime.steps.context import FINGERPRINT_KEY, RunContext, StepResult, Stored, stored
from runtime.errors import Cancelled, RunError


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    state, message = _load(ctx, step, result)
    return sync.after_write(ctx, step, result, state, message)


def _load(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    from runtime.steps import write

    config = ctx.config(step)
    seed = config["seed"]
    result.operation = config["operation"]
    uri = ctx.table_uri(step.name)
    exists = ctx.table_exists(step.name)
    table = ctx.open_table(step.name) if exists else None
    state = stored(table) if table is not None else Stored({}, None, None, {})
    if exists and state.fingerprint == step.fingerprint and not state.sample and not ctx.options.full_refresh:
        _check_unchanged_since_compile(ctx, step, seed)
        if not ctx.options.dry_run:
            table.tidy()  # what a dead run left
        return "no_input", f"{seed['file']} unchanged since commit {state.based_on}"
    how = ("first load" if not exists else "full refresh" if state.fingerprint == step.fingerprint
           else f"{seed['file']} changed since commit {state.based_on}" if state.fingerprint else "rewrite")
    if ctx.options.dry_run:
        return "would_run", f"{how}: {seed['rows']:,} rows from {seed['file']}"

    rows = read_rows(ctx, step, seed)
    spark = ctx.spark()
    ctx.check_spark_reads(spark, uri, step.name)
    session = spark_api.step_session(spark, step.id, f"pipe {step.id}")
    df = frame(session, step, seed, rows)
    result.rows_read = len(rows)
    table, recreated = write.create_table(ctx, session, step, config, uri, rebuild=exists)
    _, options = write._write_options(config, False)
    options["combine_before_insert"] = False  # keys are unique: the compiler checked the file
    if ctx.cancel.is_set():
        raise Cancelled(f"{step.id}: cancelled before its write started")
    extra = {FINGERPRINT_KEY: step.fingerprint, "pipe.seed.file": seed["file"], "pipe.seed.sha256": seed["sha256"]}
    w = write.write_staged(ctx, uri, recreated, lambda: table.write(df, operation="insert_overwrite_table", extra_metadata=extra,
                                                                     expect_latest=None if recreated else state.based_on,
                                                                     retain_from=write.oldest_consumer(ctx, step.name), **options))
    ctx.written[step.name] = (None if recreated or not exists else state.based_on, w.instant)
    result.instant, result.action = w.instant, w.action
    result.inserts, result.updates, result.deletes = w.inserts, w.updates, w.deletes
    result.rows_written = w.inserts + w.updates
    note = f"; the commit stands, but cleaning or archiving after it failed ({w.service_error})" if w.service_error else ""
    return "success", f"{how}: {len(rows):,} rows, {w.action} {w.instant}{note}"


def _check_unchanged_since_compile(ctx: RunContext, step: Step, seed) -> None:
    """A seed whose table is as the plan wants it is still the file the plan was compiled from
    (a plan run with --plan after the CSV was edited would otherwise say "unchanged")."""
    read_rows(ctx, step, seed, parse=False)


def read_rows(ctx: RunContext, step: Step, seed, parse: bool = True) -> list[tuple]:
    """The seed's rows (strings, None for null), read from the project folder as the compile
    read it; refused when the file is no longer the one the plan was compiled from."""
    rel = seed["file"]
    data = seeds.read_file(ctx.root, rel)
    if isinstance(data, OSError):
        raise RunError(f"{rel}: cannot read seed {step.name}: {getattr(data, 'message', None) or data.strerror or data}",
                       "run `pipe compile` again in the project folder the plan was compiled in")
    if seeds.file_hash(data) != seed["sha256"]:
        raise RunError(f"{rel} changed after the plan was compiled (seed {step.name}): the plan holds the sha256 of another version",
                       "compile again (`pipe compile`, or `pipe run` without --plan), then run")
    if not parse:
        return []
    parsed = seeds.parse(seeds.decode(data), seed["delimiter"])
    return [tuple(fields) for _, fields in parsed.rows]


def frame(session, step: Step, seed, rows: list[tuple]):
    """The rows as a DataFrame of the seed's columns and types (runtime/sources/given.py)."""
    from runtime.sources.given import frame as typed_frame

    return typed_frame(session, seed["columns"], rows, f"seed {step.name}'s columns ({step.file}:{step.line})",
                       "declare the column STRING in column_types and convert it in SQL")
