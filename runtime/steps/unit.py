"""Unit test steps: a table's SQL or Python model run on rows a test gives, through pipe's real
write path, into a throwaway table, which must then hold the rows the test expects
(compiler/unit_tests.py).

The test runs the table's own step (the same SQL, settings and fingerprint as in the plan) in a
plan of its own whose lake is a fresh folder under target/unit/: each given input becomes a
source of kind `given` under the input's name (so `{{ ref('customers') }}` and
`{{ source('raw_orders') }}` read the rows given), and `this`, when given, is written first as the
table's previous commit, so the run is incremental as it would be in production. Then the table
is read back and compared with `expect` on the columns `expect` names, each value cast to the
table's type for that column. Only the test's own rows (a fixture) and the differing rows reach
the driver. The inner write runs under the unit step's id, so Ctrl-C and --fail-fast cancel its
Spark jobs as any step's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from compiler.plan import Plan, Step, TargetSpec
from runtime.sources import given as given_source
from runtime.steps.context import FINGERPRINT_KEY, RunContext, RunOptions, StepResult
from runtime.errors import RunError, is_cancellation, sample, spark_message
from runtime.steps.errors import describe_error

FOLDER = "target/unit"
SHOWN = 10  # differing rows shown, each way
_STALE_S = 6 * 3600  # a throwaway folder this old was left by a killed command


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    spec = step.config
    model = ctx.plan.step(f"table.{spec['model']}")
    if ctx.options.dry_run:
        return "would_run", f"would run {model.name} on the given rows and compare"
    spark = ctx.spark()
    with throwaway_lake(ctx, step.name) as lake:
        inner, session, table = write_given(ctx, step, result, model, spark, lake)
        return _compare(step, result, inner, session, table)


@contextlib.contextmanager
def throwaway_lake(ctx: RunContext, name: str):
    """A fresh folder under target/unit/ for one unit test's table, removed afterwards (and
    folders a killed command left there hours ago)."""
    base = ctx.root / FOLDER
    base.mkdir(parents=True, exist_ok=True)
    for old in base.iterdir():
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink() and time.time() - old.stat().st_mtime > _STALE_S:
                shutil.rmtree(old, ignore_errors=True)
    lake = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    try:
        yield lake
    finally:
        shutil.rmtree(lake, ignore_errors=True)


def write_given(ctx: RunContext, step: Step, result: StepResult, model: Step, spark, lake: Path):
    """Runs the table's step on the given rows in a plan of its own whose lake is `lake`:
    (its RunContext, a session, the table's step in it)."""
    from runtime.steps import write

    spec = step.config
    inputs = [g for g in spec["given"] if g["input"] != "this"] + _seeds_not_given(ctx, model, spec["given"])
    this = next((g for g in spec["given"] if g["input"] == "this"), None)
    sources = [Step(id=f"source.{g['name']}", kind="ingest", name=g["name"], depends_on=(),
                    config={"kind": "given", "columns": g["columns"], "rows": g["rows"]}, file=step.file, line=step.line)
               for g in inputs]
    # the table's own step, under the unit step's id: its Spark jobs are the unit step's
    table = dataclasses.replace(model, id=step.id, depends_on=tuple(sorted(s.id for s in sources)))
    t = ctx.plan.target
    target = TargetSpec(name=f"{t.name} (unit test {step.name})", lake=str(lake), spark_master=t.spark_master,
                        spark_conf=t.spark_conf, env_vars=t.env_vars, shared_paths=t.shared_paths)
    plan = Plan(project=ctx.plan.project, target=target, vars=ctx.plan.vars, steps=(*sources, table))
    inner = RunContext(plan, ctx.root, [table.id], RunOptions(threads=1), lambda: spark, ctx.environ)
    inner.cancel = ctx.cancel
    session = _session(spark, step)
    written = StepResult(table.id, "write", table.name)
    with _said_as(step, model):
        if this is not None:
            _write_this(inner, session, table, this, inputs)
        state, message = write.run(inner, table, written)
    result.rows_read, result.inserts, result.updates, result.deletes = written.rows_read, written.inserts, written.updates, written.deletes
    result.rows_written = written.rows_written
    if state not in ("success", "no_input"):
        raise RunError(f"{step.file}:{step.line}: unit test {step.name}: {model.name} ended {state}: {message}")
    return inner, session, table


@contextlib.contextmanager
def _said_as(step: Step, table: Step):  # `table`: the table's step as the plan has it (its own id)
    """A failure of the table's step on the given rows, said as the unit test's (its file and
    line first), as the table's step would say it; --debug still shows a model's traceback."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every failure is the test's
        if is_cancellation(exc):
            raise
        message, hint = describe_error(exc, table)
        error = RunError(f"{step.file}:{step.line}: unit test {step.name}: {table.name} failed on the given rows: {message}", hint)
        error.show_cause = getattr(exc, "show_cause", False) or hint is not None and "bug in pipe" in hint
        raise error from exc


def _seeds_not_given(ctx: RunContext, model: Step, given: list[dict]) -> list[dict]:
    """The seeds the table reads that the test gives no rows for: their rows, from seeds/ (the
    file the plan was compiled from), as dbt reads a seed not given."""
    from runtime.steps import seed as seed_step

    named = {g["name"] for g in given if g["input"] == "table"}
    out = []
    for dep in model.depends_on:
        up = ctx.plan.step(dep)
        if up.kind == "write" and up.config.get("seed") and up.name not in named:
            spec = up.config["seed"]
            out.append({"input": "table", "name": up.name, "columns": spec["columns"], "rows": [list(r) for r in seed_step.read_rows(ctx, up, spec)]})
    return out


def _session(spark, step: Step):
    from runtime.spark import api as spark_api

    return spark_api.step_session(spark, step.id, f"pipe {step.id}")


def _write_this(ctx: RunContext, session, table: Step, this: dict, inputs: list[dict]) -> None:
    """The table before the run: the rows given for `this`, as its one commit, each column of
    the type the table's query gives it (what production's table holds)."""
    from runtime.steps import write

    config = ctx.config(table)
    typed = _query_types(session, table, inputs)
    columns = [{**c, "type": typed.get(c["name"].lower(), c["type"])} for c in this["columns"]]
    df = given_source.frame(session, columns, this["rows"], f"the rows given for this ({table.name})")
    created, _ = write.create_table(ctx, session, table, config, ctx.table_uri(table.name), rebuild=False)
    created.write(df, operation="bulk_insert" if config.get("key") else "insert", extra_metadata={FINGERPRINT_KEY: table.fingerprint},
                  expect_latest=None)


def _query_types(session, table: Step, inputs: list[dict]) -> dict[str, str]:
    """Column (lower case) -> Spark type of what the table's query returns on the given inputs
    (Spark's analysis only: no job runs); empty when it cannot tell (a query that reads the
    table itself, say): the types inferred from the rows are used then."""
    from runtime.spark import api as spark_api
    from runtime.steps import python_model

    for g in inputs:
        spark_api.temp_view(given_source.frame(session, g["columns"], [], g["name"]), g["name"])
    try:
        if table.python is not None:
            df = python_model.frame(session, table, this_available=False)
        else:
            df = session.sql(table.sql_full_refresh or table.sql)
        return {f.name.lower(): f.dataType.simpleString() for f in df.schema.fields}
    except Exception:  # noqa: BLE001 - the write itself reports what is wrong with the query
        return {}


def _compare(step: Step, result: StepResult, inner: RunContext, session, table: Step) -> tuple[str, str]:
    from pyspark.sql import functions as F

    expect = step.config["expected"]
    actual = inner.open_table(table.name, session).read(meta=False) if inner.table_exists(table.name) else None
    have = {f.name.lower(): f.dataType.simpleString() for f in actual.schema.fields} if actual is not None else {}
    names = expect["columns"]
    if not names:  # `rows: []`: the table holds no row
        rows = actual.count() if actual is not None else 0
        result.failures = rows
        result.samples = [{"": "+", **sample(r.asDict())} for r in actual.limit(SHOWN).collect()] if rows else []
        return ("success", f"{table.name} after the write holds no row, as expected") if not rows else \
            ("error", f"{table.name} after the write holds {rows:,} row{'s' if rows != 1 else ''}; none was expected")
    missing_cols = [c for c in names if c.lower() not in have]
    if actual is not None and missing_cols:
        return "error", (f"{table.name} has no column {', '.join(missing_cols)} after the write "
                         f"(it has {', '.join(f.name for f in actual.schema.fields)})")
    columns = [{"name": c, "type": have.get(c.lower(), "string")} for c in names]
    wanted = given_source.frame(session, columns, expect["rows"], f"the expected rows of {step.name}")
    got = actual.select(*[F.col(f"`{c}`") for c in names]) if actual is not None else wanted.limit(0)
    try:
        # one job counts both ways (a row as often as it differs); the rows shown only on a failure
        side = "__pipe_side"
        differ = (wanted.exceptAll(got).withColumn(side, F.lit("-"))
                  .unionByName(got.exceptAll(wanted).withColumn(side, F.lit("+"))))
        counts = {r[0]: r[1] for r in differ.groupBy(side).count().collect()}
        n_absent, n_unexpected = counts.get("-", 0), counts.get("+", 0)
        rows = len(expect["rows"]) - n_absent + n_unexpected
        shown = []
        for mark, n in (("-", n_absent), ("+", n_unexpected)):
            if n:
                shown += [{"": mark, **sample(r.asDict())} for r in differ.where(F.col(side) == mark).drop(side).limit(SHOWN).collect()]
    except Exception as exc:  # noqa: BLE001 - a comparison Spark refuses (a map column, say)
        if is_cancellation(exc):
            raise
        raise RunError(f"{step.file}:{step.line}: unit test {step.name}: cannot compare {table.name} with expect: {spark_message(exc)}",
                       "expect only columns of simple types") from exc
    result.failures = n_absent + n_unexpected
    result.samples = shown
    if not result.failures:
        return "success", f"{table.name} after the write holds the {rows:,} expected row{'s' if rows != 1 else ''}"
    said = []
    if n_absent:
        said.append(f"{n_absent:,} expected row{'s' if n_absent != 1 else ''} missing (-)")
    if n_unexpected:
        said.append(f"{n_unexpected:,} row{'s' if n_unexpected != 1 else ''} not expected (+)")
    return "error", f"{table.name} after the write differs from expect: {', '.join(said)}"


def diff_lines(samples: list[dict]) -> list[str]:
    """The differing rows as a user reads them: `- {...}` expected and missing, `+ {...}` there
    and not expected."""
    return [f"{row['']} {json.dumps({k: v for k, v in row.items() if k != ''}, ensure_ascii=False, default=str)}" for row in samples]


# --- recording a unit test from real tables (`pipe test --record TABLE`) -----------------------

_NOT_TEXT = ("map<", "array<", "struct<", "binary")


def record(ctx: RunContext, table_name: str, at: str | None, rows: int, name: str, with_this: bool) -> tuple[list[dict], dict]:
    """The given inputs and the expected rows of a unit test of `table_name`: the first `rows`
    rows of each input as of `at` (an instant time; None: the latest commit), and what the
    table's step makes of them now. Inputs are read from pinned instants of the lake's tables,
    or whole from a `files` source; a queue, a topic, a database or the objects of an
    s3_incremental source are refused (their rows may not be readable again). Values are turned
    into text by Spark, in the session's time zone, as the unit test reads them back."""
    from runtime.spark import api as spark_api

    model = ctx.plan.step(f"table.{table_name}")
    spark = ctx.spark()
    fake_id = f"unit.{name}"
    session = _session(spark, Step(id=fake_id, kind="unit", name=name, depends_on=(), config={}, file="", line=None))
    try:
        given: list[dict] = []
        for dep in model.depends_on:
            up = ctx.plan.step(dep)
            if up.kind == "write":
                given.append(_given("table", up.name, _pinned(ctx, up.name, at, f"table {table_name}", session), rows,
                                    bool(up.config.get("schema"))))
                continue
            config = ctx.config(up)
            kind = config["kind"]
            if kind == "table":
                df = _pinned(ctx, config["table"], at, f"source {up.name}", session)
            elif kind == "files":
                from runtime.sources import files as files_source

                pending = files_source.pending(up.name, {**config, "max_files_per_run": None, "max_bytes_per_run": None}, ctx.root, None)
                df = pending.dataframe(session)  # every file, as a test of the source reads it
            else:
                raise RunError(f"cannot record the rows of source {up.name} (kind {kind}) for a unit test of {table_name}: "
                               "they may not be readable again", "write its rows by hand in the test, or record a table that reads it")
            given.append(_given("source", up.name, df, rows, bool(config.get("schema"))))
        if with_this:
            if not ctx.table_exists(table_name):
                raise RunError(f"--this: table {table_name} has no commit yet", "build it first, or record without --this")
            given.append(_given("this", "this", _pinned(ctx, table_name, at, f"table {table_name}", session), rows,
                                bool(model.config.get("schema"))))
        fake = Step(id=fake_id, kind="unit", name=name, depends_on=(), file=f"tests/unit/{name}.yml", line=1,
                    config={"model": table_name, "given": given, "expected": {"columns": [], "rows": []}})
        with throwaway_lake(ctx, name) as lake:
            inner, inner_session, table = write_given(ctx, fake, StepResult(fake.id, "unit", name), model, spark, lake)
            columns, texts = _as_text(inner.open_table(table.name, inner_session).read(meta=False), None) if inner.table_exists(table.name) else ([], [])
        return given, {"columns": columns, "rows": texts}
    finally:
        spark_api.end_step(spark, fake_id)


def _pinned(ctx: RunContext, name: str, at: str | None, needed_by: str, session):
    """The table `name` as of its latest commit completed by `at` (or its latest)."""
    from runtime.defer import pin_at

    table = ctx.open_upstream(name, needed_by, session)
    pin = pin_at(name, table.timeline(), at, None)
    if pin is None:
        raise RunError(f"table {name} has no commit{' by ' + at if at else ''} to record from", "build it first, or choose a later --as-of")
    return table.read(as_of=pin.instant, meta=False)


def _given(kind: str, name: str, df, rows: int, declared: bool) -> dict:
    """A given input: the first `rows` rows of `df` (sorted, so a second recording gives the
    same rows) as text, its columns and types, and whether the project declares them."""
    columns, texts = _as_text(df, rows)
    return {"input": kind, "name": name, "columns": columns, "rows": texts, "declared": declared}


def _as_text(df, limit: int | None) -> tuple[list[dict], list[list]]:
    """The columns of `df` and its rows (sorted by every column, at most `limit`) with each value
    as Spark writes it as text: exact decimals, times in the session's zone."""
    from pyspark.sql import functions as F

    columns = [{"name": f.name, "type": f.dataType.simpleString()} for f in df.schema.fields]
    nested = [c["name"] for c in columns if c["type"].startswith(_NOT_TEXT)]
    if nested:
        raise RunError(f"cannot record column{'s' if len(nested) > 1 else ''} {', '.join(nested)}: a unit test gives values written as text "
                       "(scalars)", "record a table whose columns are scalars, or write the test by hand")
    ordered = df.orderBy(*[F.col(f"`{c['name']}`").asc_nulls_first() for c in columns])
    if limit is not None:
        ordered = ordered.limit(limit)
    rows = ordered.select(*[F.col(f"`{c['name']}`").cast("string").alias(c["name"]) for c in columns]).collect()
    return columns, [list(r) for r in rows]
