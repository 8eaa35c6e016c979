"""Test steps: a data test's SQL (compiler/data_tests.py), whose rows are its failures, run on
Spark against the current data of the tables and sources it reads. Only the number of failing
rows and a few sample rows reach the driver.

What a test reads (docs/testing.md, "What each test checks"):
- `pipe test`: every table at its latest commit, every source whole.
- `pipe build`, after a table's incremental write in the same run: the row tests (`not_null`,
  `accepted_values`, `expression`, `relationships`) check only the rows that write added or
  changed, a relationship against the whole parent; `unique` checks the whole table, or holds by
  construction on an upsert table whose record key it names; tests in tests/*.sql read whole
  tables. A full refresh, a first build or a table with no new input is checked whole.

A test's settings (docs/testing.md): `limit` keeps at most that many failing rows; `fail_calc`
is the aggregate over them that warn_if/error_if compare (default count(*)); `store_failures`
replaces table `<test>__failures` with them on every run, empty when there are none, so its rows
are always those of the test's latest run. The failing rows stay in Spark throughout."""

from __future__ import annotations


from compiler.data_tests import DEFAULT_FAIL_CALC, FAILURES_SUFFIX, threshold_holds
from compiler.plan import Step
from runtime.spark import api as spark_api
from runtime.sources import SourceError
from runtime.sources import files as files_source
from runtime.steps.context import RunContext, StepResult
from runtime.errors import RunError, is_user_error, sample, spark_message
from runtime.steps.views import names_used, view_filters

SAMPLE_ROWS = 5
ROW_TESTS = ("not_null", "accepted_values", "expression", "relationships")


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    config = step.config
    if ctx.options.dry_run:
        return "would_run", f"would check {_subject(step)}"
    held = _by_construction(ctx, step)
    if held:
        result.failures, result.samples = 0, []
        return "success", held
    memory = ctx.test_memory()
    if ctx.options.reuse_tests:
        instants = _latest_instants(ctx, step)
        if instants is not None and memory.passed_at(step, instants):
            result.failures, result.samples = 0, []
            at = ", ".join(f"{name} at {t}" for name, t in sorted(instants.items()))
            return "success", f"passed at {at} (reused: no commit since it was checked, and the test is the same)"
    spark = ctx.spark()
    session = spark_api.step_session(spark, step.id, f"pipe {step.id}")
    read: list = []  # source reads, released once the test is over
    where = step.sql_file or f"{step.file}:{step.line}"
    checked_at: dict[str, str] = {}  # table -> the instant the test read it at
    since: dict[str, str] = {}  # table -> the instant before the rows it read, when it read only new rows
    try:
        named = names_used([step.sql])  # a merge-on-read table's view keeps only the columns the test names
        # and a table's only the partitions the test's conditions can meet
        filters = view_filters([step.sql], [d.split(".", 1)[1] for d in step.depends_on if d.startswith("table.")])
        scope = _register_views(ctx, session, step, read, checked_at, since, named, filters)
        try:
            failing = session.sql(step.sql)
        except Exception:  # noqa: BLE001 - perhaps a column the pruned views lack: again on the full views
            if named is None:
                raise
            scope = _register_views(ctx, session, step, read, checked_at, since, None, filters)
            failing = session.sql(step.sql)
        if config.get("limit"):
            failing = failing.limit(config["limit"])
        if config.get("store_failures"):  # counted, sampled and stored: computed once
            failing = spark_api.local_checkpoint(failing, eager=False)
        count, failures = _measure(failing, config.get("fail_calc", DEFAULT_FAIL_CALC), step)
        rows = failing.limit(SAMPLE_ROWS).collect() if count else []
        if config.get("store_failures"):
            result.failures_table = _store_failures(ctx, session, step, failing)
    except (RunError, SourceError):
        memory.remember(step, None)
        raise
    except Exception as exc:  # noqa: BLE001 - an analysis or runtime error of the test's SQL
        memory.remember(step, None)
        if ctx.cancel.is_set() or not is_user_error(exc):
            raise
        raise RunError(f"{where}: test {step.name} cannot run: {spark_message(exc)}",
                       "check the test's columns and SQL (the SQL it runs is in target/plan.json)") from exc
    finally:
        for pending in read:
            pending.release()
    result.failures = failures
    result.samples = [sample(r.asDict(recursive=True)) for r in rows]
    rule = _rule(count, failures, config)
    stored = f"; failing rows in table {result.failures_table}" if result.failures_table and count else ""
    if count:
        memory.remember(step, None)  # never reused as passed
    if failures and config["severity"] == "error" and threshold_holds(config["error_if"], failures):
        return "error", f"{rule} ({scope}){_error_rule(config)}{stored}"
    if failures and threshold_holds(config["warn_if"], failures):
        return "warn", f"{rule} ({scope}){_warn_rule(config)}{stored}"
    note = f"; {rule} within the thresholds" if count else ""
    if not count:
        _remember_pass(memory, step, checked_at, since)
    return "success", f"passed ({scope}){note}{stored}"


def _measure(failing, fail_calc: str, step: Step) -> tuple[int, int | float]:
    """(failing rows, the value warn_if and error_if compare): their count, or `fail_calc`
    computed over them in the same job. Only these two numbers reach the driver."""
    if fail_calc == DEFAULT_FAIL_CALC:
        n = failing.count()
        return n, n
    from pyspark.sql import functions as F

    try:
        row = failing.agg(F.count(F.lit(1)).alias("rows"), F.expr(fail_calc).alias("value")).collect()[0]
    except Exception as exc:  # noqa: BLE001 - an aggregate Spark cannot compute over these rows
        if not is_user_error(exc):
            raise
        raise RunError(f"{step.file}:{step.line}: test {step.name}: fail_calc {fail_calc} cannot be computed over its failing rows: {spark_message(exc)}",
                       "fail_calc is an aggregate over the columns the test's SQL returns, e.g. sum(n_records)") from exc
    return int(row["rows"]), _number(row["value"], fail_calc, step)


def _number(value, fail_calc: str, step: Step) -> int | float:
    """fail_calc's value as a number; null (a sum over no rows) is 0."""
    from decimal import Decimal

    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise RunError(f"{step.file}:{step.line}: test {step.name}: fail_calc {fail_calc} gave {value!r}, not a number",
                       "fail_calc is a numeric aggregate over the failing rows, e.g. count(*) or sum(n_records)")
    return int(value) if value == int(value) else float(value)


def _rule(count: int, failures: int | float, config) -> str:
    """`7 failing rows`, with the limit that cut them short and fail_calc's value when set."""
    text = f"{count:,} failing row{'s' if count != 1 else ''}"
    if config.get("limit") and count >= config["limit"]:
        text += f" (limit {config['limit']:,})"
    if config.get("fail_calc", DEFAULT_FAIL_CALC) != DEFAULT_FAIL_CALC:
        text += f", fail_calc {config['fail_calc']} = {failures:,}"
    return text


def _store_failures(ctx: RunContext, session, step: Step, failing) -> str:
    """Replaces table `<test>__failures` with the failing rows, in one insert_overwrite_table
    of pipe's table engine (a replacecommit; the rows' schema becomes the table's). When there
    are none it is replaced with no rows: a reader never takes an earlier run's failures for
    this one's. The rows go from Spark to the table's files, never through the driver."""
    from runtime.table.config import TableConfig
    from runtime.table.table import Table, TableError

    name = step.name + FAILURES_SUFFIX
    try:
        table = Table.create(session, ctx.table_uri(name), TableConfig(name=name), ctx.storage_options)
        table.write(failing, operation="insert_overwrite_table", extra_metadata={"pipe.test": step.name})
    except TableError as exc:
        raise RunError(f"test {step.name}: its failing rows cannot be stored in table {name}: {exc}",
                       exc.hint or f"store_failures writes the rows the test's SQL returns to {name}") from exc
    return name


def _latest_instants(ctx: RunContext, step: Step) -> dict[str, str] | None:
    """The latest completed commit of each table `step` reads; None when it reads a source
    (whose files change without a commit) or a table that has none."""
    out = {}
    for dep in step.depends_on:
        kind, name = dep.split(".", 1)
        if kind != "table" or ctx.deferred(name) is not None or not ctx.table_exists(name):
            return None  # a deferred table is another lake's: what dev's memory holds is not of it
        latest = ctx.open_table(name).timeline().latest_completed()
        if latest is None:
            return None
        out[name] = latest.time
    return out


def _remember_pass(memory, step: Step, checked_at: dict[str, str], since: dict[str, str]) -> None:
    """A test that read whole tables passed at their instants. One that read only the rows a
    write added holds for the whole table when it had passed at the instant before that write."""
    if len(checked_at) != len(step.depends_on):
        memory.remember(step, None)  # it read a source
        return
    if since and not memory.passed_at(step, {**checked_at, **since}):
        memory.remember(step, None)
        return
    memory.remember(step, checked_at)


def checked(step: Step) -> list[str]:
    """The ids of the steps a test checks: the table or source it is declared on, or for a
    tests/*.sql file everything it reads."""
    c = step.config
    if c.get("model"):
        return [("table." if c["model_kind"] == "table" else "source.") + c["model"]]
    return list(step.depends_on)


def _subject(step: Step) -> str:
    return ", ".join(sid.replace(".", " ", 1) for sid in checked(step))


def _error_rule(config) -> str:
    return f"; error_if {config['error_if']}" if config["error_if"].replace(" ", "") != "!=0" else ""


def _warn_rule(config) -> str:
    rule = f"; warn_if {config['warn_if']}" if config["warn_if"].replace(" ", "") != "!=0" else ""
    return rule + ("; severity warn" if config["severity"] == "warn" else "")


def _written_incrementally(ctx: RunContext, table: str):
    """(instant before, instant written) when this run wrote `table` incrementally."""
    w = ctx.written.get(table)
    return w if w is not None and w[0] is not None else None


def _by_construction(ctx: RunContext, step: Step) -> str | None:
    """In a build, `unique` on the record key of an upsert table with a global index holds by
    construction once pipe has written it: no job runs. `pipe test` always checks."""
    c = step.config
    if c["test"] != "unique" or c.get("model_kind") != "table" or c.get("where") or c.get("store_failures") or c["model"] not in ctx.written:
        return None
    table = ctx.plan.step(f"table.{c['model']}").config
    key = [k.lower() for k in table.get("key") or []]
    if table.get("operation") == "upsert" and table.get("index") == "global" and sorted(key) == sorted(x.lower() for x in c["columns"]):
        return f"passed: {', '.join(c['columns'])} is the record key of upsert table {c['model']} (global index), unique by construction"
    return None


def _register_views(ctx: RunContext, session, step: Step, read: list, checked_at: dict[str, str], since: dict[str, str],
                    named: frozenset[str] | None = None, filters: dict[str, tuple] | None = None) -> str:
    """Registers a view per table and source the test reads; returns what it checked. Fills
    `checked_at` with each table's instant read, and `since` with the instant before the rows
    read of a table read only in part. `named`: the names the test's SQL uses (a table's view
    keeps only those columns when merging logs; views.py); `filters`: the conditions of each
    table's rows it uses, by lower-case name (views.view_filters: a view reads only the
    partitions that can meet them)."""
    c = step.config
    model = c.get("model")
    scope = {"table": "whole table", "source": "all of the source"}.get(c.get("model_kind"), "whole tables")
    for dep in step.depends_on:
        kind, name = dep.split(".", 1)
        if kind == "table":
            table = ctx.open_upstream(name, f"test {step.name}", session)
            latest = table.timeline().latest_completed()
            if latest is None:
                raise RunError(f"test {step.name} reads table {name}, which has no completed commit yet",
                               f"build it first: `pipe build --select +{name}`")
            written = _written_incrementally(ctx, name) if name == model and c["test"] in ROW_TESTS else None
            where = (filters or {}).get(name.lower(), ())
            if written is not None:
                df = table.read(since=written[0], until=written[1], meta=False, named=named, where=where)
                scope = f"the rows written by {written[1]}"
                checked_at[name], since[name] = written[1], written[0]
            else:
                df = table.read(meta=False, named=named, where=where)
                checked_at[name] = latest.time
            spark_api.temp_view(df, name)
        else:
            spark_api.temp_view(_source_view(ctx, session, step, name, read), name)
    return scope


def _source_view(ctx: RunContext, session, step: Step, name: str, read: list):
    source = ctx.plan.step(f"source.{name}")
    config = ctx.config(source)
    if config["kind"] == "table":
        upstream = ctx.open_upstream(config["table"], f"test {step.name} (through source {name})", session)
        return upstream.read(meta=False)
    if config["kind"] == "files":
        everything = {**config, "max_files_per_run": None, "max_bytes_per_run": None}
        pending = files_source.pending(name, everything, ctx.root, None)
        read.append(pending)
        return pending.dataframe(session)
    raise RunError(f"test {step.name}: a source of kind {config['kind']} cannot be read by a test", "test the table it feeds")
