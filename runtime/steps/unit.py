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
the driver."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

from compiler.plan import Plan, Step, TargetSpec
from runtime.sources import given as given_source
from runtime.steps.context import FINGERPRINT_KEY, RunContext, RunOptions, StepResult
from runtime.steps.errors import RunError, sample, spark_message

FOLDER = "target/unit"
SHOWN = 10  # differing rows shown, each way


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    spec = step.config
    model = ctx.plan.step(f"table.{spec['model']}")
    if ctx.options.dry_run:
        return "would_run", f"would run {model.name} on the given rows and compare"
    spark = ctx.spark()
    with _throwaway_lake(ctx, step.name) as lake:
        inner, session, table = _write_given(ctx, step, result, model, spark, lake)
        return _compare(ctx, step, result, inner, session, table)


@contextlib.contextmanager
def _throwaway_lake(ctx: RunContext, name: str):
    """A fresh folder under target/unit/ for one unit test's table, removed afterwards."""
    base = ctx.root / FOLDER
    base.mkdir(parents=True, exist_ok=True)
    lake = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    try:
        yield lake
    finally:
        shutil.rmtree(lake, ignore_errors=True)


def _write_given(ctx: RunContext, step: Step, result: StepResult, model: Step, spark, lake: Path):
    """Runs the table's step on the given rows in a plan of its own whose lake is `lake`:
    (its RunContext, a session, the table's step in it)."""
    from runtime.steps import write

    spec = step.config
    inputs = [g for g in spec["given"] if g["input"] != "this"] + _seeds_not_given(ctx, model, spec["given"])
    this = next((g for g in spec["given"] if g["input"] == "this"), None)
    sources = [Step(id=f"source.{g['name']}", kind="ingest", name=g["name"], depends_on=(),
                    config={"kind": "given", "columns": g["columns"], "rows": g["rows"]}, file=step.file, line=step.line)
               for g in inputs]
    table = dataclasses.replace(model, depends_on=tuple(sorted(s.id for s in sources)), env_vars=model.env_vars)
    t = ctx.plan.target
    target = TargetSpec(name=f"{t.name} (unit test {step.name})", lake=str(lake), spark_master=t.spark_master,
                        spark_conf=t.spark_conf, env_vars=t.env_vars, shared_paths=t.shared_paths)
    plan = Plan(project=ctx.plan.project, target=target, vars=ctx.plan.vars, steps=(*sources, table))
    inner = RunContext(plan, ctx.root, [table.id], RunOptions(threads=1), lambda: spark, ctx.environ)
    inner.cancel = ctx.cancel
    session = _session(spark, step)
    if this is not None:
        _write_this(inner, session, table, this, inputs)
    written = StepResult(table.id, "write", table.name)
    try:
        state, message = write.run(inner, table, written)
    except RunError as exc:
        raise RunError(f"{step.file}:{step.line}: unit test {step.name}: {model.id} failed on the given rows: {exc}",
                       getattr(exc, "hint", None)) from exc
    result.rows_read, result.inserts, result.updates, result.deletes = written.rows_read, written.inserts, written.updates, written.deletes
    if state not in ("success", "no_input"):
        raise RunError(f"{step.file}:{step.line}: unit test {step.name}: {model.id} ended {state}: {message}")
    return inner, session, table


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
    from runtime import spark_api

    return spark_api.step_session(spark, step.id, f"pipe {step.id}")


def _write_this(ctx: RunContext, session, table: Step, this: dict, inputs: list[dict]) -> None:
    """The table before the run: the rows given for `this`, as its one commit, each column of
    the type the table's query gives it (what production's table holds)."""
    from runtime.steps import write

    config = ctx.config(table)
    typed = _query_types(session, table, inputs)
    columns = [{**c, "type": typed.get(c["name"].lower(), c["type"])} for c in this["columns"]]
    df = given_source.frame(session, columns, this["rows"], f"the rows given for this ({table.name})")
    created, _ = write._create_table(ctx, session, table, config, ctx.table_uri(table.name), rebuild=False)
    created.write(df, operation="bulk_insert" if config.get("key") else "insert", extra_metadata={FINGERPRINT_KEY: table.fingerprint},
                  expect_latest=None)


def _query_types(session, table: Step, inputs: list[dict]) -> dict[str, str]:
    """Column (lower case) -> Spark type of what the table's query returns on the given inputs
    (Spark's analysis only: no job runs); empty when it cannot tell (a query that reads the
    table itself, say): the types inferred from the rows are used then."""
    from runtime import spark_api
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


def _compare(ctx: RunContext, step: Step, result: StepResult, inner: RunContext, session, table: Step) -> tuple[str, str]:
    from pyspark.sql import functions as F

    expect = step.config["expected"]
    if not inner.table_exists(table.name):  # the write wrote nothing (no input, an empty delete...)
        actual = None
        have: dict[str, str] = {}
    else:
        actual = inner.open_table(table.name, session).read(meta=False)
        have = {f.name.lower(): f.dataType.simpleString() for f in actual.schema.fields}
    names = expect["columns"]
    missing_cols = [c for c in names if c.lower() not in have]
    if actual is not None and missing_cols:
        return "error", (f"{table.name} has no column {', '.join(missing_cols)} after the write "
                         f"(it has {', '.join(f.name for f in actual.schema.fields)})")
    columns = [{"name": c, "type": have.get(c.lower(), "string")} for c in names]
    wanted = given_source.frame(session, columns, expect["rows"], f"the expected rows of {step.name}")
    got = actual.select(*[F.col(f"`{c}`") for c in names]) if actual is not None else wanted.limit(0)
    try:
        absent = wanted.exceptAll(got)
        unexpected = got.exceptAll(wanted)
        n_absent, n_unexpected = absent.count(), unexpected.count()
        rows = got.count()
        shown = ([{"": "-", **sample(r.asDict())} for r in absent.limit(SHOWN).collect()]
                 + [{"": "+", **sample(r.asDict())} for r in unexpected.limit(SHOWN).collect()])
    except Exception as exc:  # noqa: BLE001 - a comparison Spark refuses (a map column, say)
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
    return [f"{row[''] } {json.dumps({k: v for k, v in row.items() if k != ''}, ensure_ascii=False, default=str)}" for row in samples]


# --- recording a unit test from real tables (`pipe test --record TABLE`) -----------------------


def record(ctx: RunContext, table_name: str, at: str | None, rows: int, name: str, with_this: bool) -> dict:
    """A unit test of `table_name` whose given rows are the first `rows` rows of each input as
    of `at` (an instant time; None: the latest commit) and whose expect is what the table's step
    makes of them now (a snapshot of today's behaviour, to be read and trimmed by its author).
    Inputs are read from pinned instants of the lake's tables, or whole from a `files` source;
    a queue, a topic or a database is refused (its rows may not be readable again)."""
    model = ctx.plan.step(f"table.{table_name}")
    spark = ctx.spark()
    session = _session(spark, model)
    given: list[dict] = []
    for dep in model.depends_on:
        up = ctx.plan.step(dep)
        if up.kind == "write":
            df, _ = _pinned(ctx, up.name, at, f"table {table_name}", session)
            given.append(_given("table", up.name, df, rows, declared=bool(up.config.get("schema"))))
            continue
        config = ctx.config(up)
        kind = config["kind"]
        if kind in ("table", "s3_incremental"):
            upstream = config["table"] if kind == "table" else config["metadata_table"]
            df, _ = _pinned(ctx, upstream, at, f"source {up.name}", session)
        elif kind == "files":
            from runtime.sources import files as files_source

            pending = files_source.pending(up.name, {**config, "max_files_per_run": None, "max_bytes_per_run": None}, ctx.root, None)
            df = pending.dataframe(session)  # every file, as a test of the source reads it
        else:
            raise RunError(f"cannot record the rows of source {up.name} (kind {kind}) for a unit test of {table_name}: "
                           "they may not be readable again", f"record it from a table that lands the source, or write its rows by hand in {FOLDER_UNIT}")
        given.append(_given("source", up.name, df, rows, declared=bool(config.get("schema"))))
    if with_this:
        if not ctx.table_exists(table_name):
            raise RunError(f"--this: table {table_name} has no commit yet", "build it first, or record without --this")
        df, _ = _pinned(ctx, table_name, at, f"table {table_name}", session)
        given.append(_given("this", "this", df, rows, declared=False))
    fake = Step(id=f"unit.{name}", kind="unit", name=name, depends_on=(), file=f"{FOLDER_UNIT}/{name}.yml", line=1,
                config={"model": table_name, "given": [{**g, "column_types": None} for g in given], "expected": {"columns": [], "rows": []}})
    result = StepResult(fake.id, "unit", name)
    with _throwaway_lake(ctx, name) as lake:
        inner, session, table = _write_given(ctx, fake, result, model, spark, lake)
        written = inner.open_table(table.name, session).read(meta=False) if inner.table_exists(table.name) else None
        expect = _as_yaml_rows(written.collect()) if written is not None else []
    return {"name": name, "model": table_name, "description": f"recorded from the lake of target {ctx.plan.target.name}"
            + (f" as of {at}" if at else "") + "; the rows expected are what the table's step made of the given rows then",
            "given": [_yaml_given(g) for g in given], "expect": {"rows": expect}}


FOLDER_UNIT = "tests/unit"


def _pinned(ctx: RunContext, name: str, at: str | None, needed_by: str, session):
    """The table `name` as of its latest commit completed by `at` (or its latest)."""
    from runtime.defer import _pin

    table = ctx.open_upstream(name, needed_by, session)
    timeline = table.timeline()
    pin = _pin(name, timeline, at, None)
    if pin is None:
        raise RunError(f"table {name} has no commit{' by ' + at if at else ''} to record from", "build it first, or choose a later --as-of")
    return table.read(as_of=pin.instant, meta=False), pin.instant


def _given(kind: str, name: str, df, rows: int, declared: bool) -> dict:
    """A given input: the first `rows` rows of `df` (sorted, so a second recording gives the
    same rows), its columns and types (written as column_types unless the project declares them)."""
    columns = [{"name": f.name, "type": f.dataType.simpleString()} for f in df.schema.fields]
    first = df.orderBy(*[f"`{c['name']}`" for c in columns if _sortable(c["type"])]).limit(rows).collect()
    texts = [[_text(v) for v in r] for r in first]
    return {"input": kind, "name": name, "columns": columns, "rows": texts, "declared": declared, "records": first}


def _sortable(typ: str) -> bool:
    return not typ.startswith(("map<", "array<", "struct<", "binary"))


def _text(value) -> str | None:
    import datetime as dt
    import decimal

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, decimal.Decimal, int, float)):
        return str(value)
    return str(value)


def _yaml_value(value):
    """A value as the YAML a person reads: numbers and booleans as they are, decimals and times
    as text (exact; the test casts them to the column's type)."""
    import datetime as dt
    import decimal

    if isinstance(value, (decimal.Decimal, dt.date, dt.datetime)):
        return _text(value)
    if isinstance(value, float) and value != value:  # NaN
        return "NaN"
    return value


def _as_yaml_rows(records) -> list[dict]:
    return [{k: _yaml_value(v) for k, v in r.asDict().items()} for r in records]


def _yaml_given(g: dict) -> dict:
    said = "this" if g["input"] == "this" else f"{'ref' if g['input'] == 'table' else 'source'}('{g['name']}')"
    out = {"input": said}
    if not g["declared"]:
        out["column_types"] = {c["name"]: c["type"] for c in g["columns"]}
    out["rows"] = _as_yaml_rows(g["records"])
    return out
