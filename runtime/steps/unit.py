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
    base = ctx.root / FOLDER
    base.mkdir(parents=True, exist_ok=True)
    lake = Path(tempfile.mkdtemp(prefix=f"{step.name}-", dir=base))
    try:
        return _run(ctx, step, result, model, spark, lake)
    finally:
        shutil.rmtree(lake, ignore_errors=True)


def _run(ctx: RunContext, step: Step, result: StepResult, model: Step, spark, lake: Path) -> tuple[str, str]:
    from runtime.steps import write

    spec = step.config
    inputs = [g for g in spec["given"] if g["input"] != "this"]
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
    return _compare(ctx, step, result, inner, session, table)


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

    expect = step.config["expect"]
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
