"""Commands on one table of the lake: show, timeline, and its services (clean, compact, savepoint,
restore, rollback, migrate, sync)."""

from __future__ import annotations

import contextlib
import json

import click

from compiler.errors import PipeError, ProjectError
from pipe import output
from pipe.commands.common import (
    EXIT_FAILED, cli_problem, common_options, compile_plan, Context, instant_arg, print_traceback,
    target_option, vars_option,
)
from pipe.commands.sessions import spark_factory, spark_for, table_for


@click.command(name="show")
@click.argument("table_name", metavar="TABLE")
@click.option("--limit", "-n", type=click.IntRange(0), default=20, show_default=True, help="Rows to print.")
@click.option("--as-of", default=None, help="Time travel: the table as of this instant.")
@click.option("--since", default=None, help="Incremental: rows written by commits after this instant.")
@click.option("--meta", is_flag=True, help="Include Hudi's _hoodie_* meta columns.")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="A table, or one JSON object per row.")
@target_option
@common_options
@click.pass_obj
def show_cmd(ctx: Context, table_name, limit, as_of, since, meta, fmt, target) -> None:
    """Print rows of a table.

    A table on a local disk is read in this process (pyarrow), without starting Spark; a
    table on S3 is read with Spark."""
    from rich.table import Table as RichTable

    instant_arg(as_of, "--as-of")
    instant_arg(since, "--since")
    table, plan = table_for(ctx, table_name, target)
    until = as_of if since else None
    keys = list(table.config.record_key_fields) if not since else []  # an incremental read keeps commit order
    if table.storage.spec.is_s3:
        table.spark = spark_for(table, plan, ctx.root(), ctx.debug)
        columns, rows = rows_with_spark(table.read(as_of=as_of, since=since, until=until, meta=meta), keys, limit + 1)
    else:
        schema, batches = table.read_batches(as_of=as_of, since=since, until=until, meta=meta)
        columns, rows = _first_rows(schema, batches, [k for k in keys if k in schema.names], limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    if fmt == "json":
        for r in rows:
            output.plain(json.dumps(dict(zip(columns, r)), sort_keys=True, default=str))
        return
    t = RichTable(show_edge=False, box=None, header_style="bold", pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    output.table(t)
    what = f"as of {as_of}" if as_of and not since else (f"since {since}" if since else "latest")
    how = "; read with Spark, as the table is on S3" if table.storage.spec.is_s3 else ""
    output.line(f"[dim]{len(rows)} row{'s' if len(rows) != 1 else ''} of {table_name} ({what}){', more not shown (--limit)' if more else ''}{how}[/]")


def rows_with_spark(df, keys: list[str], n: int) -> tuple[list[str], list[tuple]]:
    """The first `n` rows of a DataFrame by `keys`: the sort and the limit run in Spark."""
    if keys:
        df = df.orderBy(*[f"`{c}`" for c in keys])
    return df.columns, [tuple(r) for r in df.limit(n).collect()]


def _first_rows(schema, batches, keys: list[str], n: int) -> tuple[list[str], list[tuple]]:
    """The first `n` rows by `keys` (ascending, as Spark's orderBy), or the first
    `n` read when there are no keys; only `n` rows are held besides the batch being read.
    Values are the Python values Spark's collect() gives (pipe.output.spark_value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    best = pa.Table.from_batches([], schema)  # (schema.empty_table() would import pandas)
    for batch in batches:
        best = pa.concat_tables([best, pa.Table.from_batches([batch], schema)])
        if keys:
            order = pc.sort_indices(best, sort_keys=[(k, "ascending") for k in keys])  # record keys are never null
            best = best.take(order.slice(0, n))
        elif best.num_rows >= n:
            break
    best = best.slice(0, n)
    types = [f.type for f in schema]
    # timestamps as microseconds since the epoch (as Spark hands them to Python): pyarrow's own
    # conversion to datetime imports pandas, which costs a third of a second
    best = pa.Table.from_arrays([c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in best.columns], names=best.column_names)
    return schema.names, [tuple(output.spark_value(v, t) for v, t in zip(row.values(), types)) for row in best.to_pylist()]


@click.command(name="timeline")
@click.argument("table_name", metavar="TABLE")
@click.option("--all", "show_all", is_flag=True, help="Include archived instants.")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="A table, or one JSON object per instant.")
@target_option
@common_options
@click.pass_obj
def timeline_cmd(ctx: Context, table_name, show_all, fmt, target) -> None:
    """Print the instants of a table: time, action, state, operation, counts, checkpoints."""
    from rich.table import Table as RichTable

    from runtime.table.history import instant_rows, short_checkpoint

    table, _ = table_for(ctx, table_name, target)
    rows = instant_rows(table, archived=show_all)
    if fmt == "json":
        for row in rows:
            output.plain(json.dumps(row, sort_keys=True))
        return
    t = RichTable(show_edge=False, box=None, header_style="bold", pad_edge=False)
    checks = any("expectations" in row for row in rows)
    completed = any("completed" in row for row in rows)  # Hudi 1.x: incremental reads go by completion time
    for col in (("instant", "action", "state") + (("completed",) if completed else ()) + ("operation", "ins/upd/del", "files", "checkpoints")
                + (("expectations",) if checks else ())):
        t.add_column(col, overflow="fold", no_wrap=col not in ("checkpoints", "expectations"))
    for row in rows:
        cps = row.get("checkpoints") or {}
        cp_text = ", ".join(f"{k}={short_checkpoint(v)}" for k, v in sorted(cps.items()))
        iud = f"{row['inserts']}/{row['updates']}/{row['deletes']}" if "inserts" in row else ""
        state = row["state"] + (" (archived)" if row["timeline"] == "archived" else "")
        cells = ([row["instant"], row["action"], state] + ([row.get("completed", "")] if completed else [])
                 + [row.get("detail") or row.get("operation", ""), iud, str(row.get("files", "")), cp_text])
        if checks:
            e = row.get("expectations") or {}
            cells.append(", ".join(f"{n}: {v['failed']} {v['action']}" for n, v in sorted(e.items()) if n != "rows"))
        t.add_row(*cells)
    output.table(t)  # never crop instants


def _service_context(ctx: Context, table_name: str, target: str | None):
    """The table, its settings from the project, and the incremental consumers holding it back."""
    from runtime.steps.context import RunContext

    table, plan = table_for(ctx, table_name, target)
    step = next((s for s in plan.steps if s.kind == "write" and s.name == table_name), None)
    config = dict(step.config) if step is not None else {"clean": {}, "archive": {}}
    consumers = RunContext(plan, ctx.root()).consumer_checkpoints(table_name)
    return table, config, consumers


@contextlib.contextmanager
def _naming(table_name: str):
    """Hints of the table engine say `pipe ... TABLE ...`; the user typed the table's name."""
    from runtime.table.errors import TableError

    try:
        yield
    except TableError as exc:
        if exc.hint:
            exc.hint = exc.hint.replace(" TABLE ", f" {table_name} ")
        raise


def _report_retired(table) -> None:
    """A change that retired a Java writer's metadata table says so (Table.retire_metadata_table)."""
    if table.retired:
        output.line(f"[yellow]![/] {table.retired}")


def _downstream_warning(table_name: str, consumers: dict[str, str], instant: str) -> None:
    """Consumers that have read past the instant the table now ends at fail on their next run."""
    past = {who: cp for who, cp in consumers.items() if cp > instant}
    for who, cp in sorted(past.items()):
        reader = who.split(" ", 1)[0]
        output.line(f"[yellow]![/] {who} has read {table_name} up to {cp}, which is gone: its next run stops until it is rebuilt "
                    f"(`pipe run --select {reader} --full-refresh`), or its source sets `on_checkpoint_lost: full_read`")


@click.command(name="clean")
@click.argument("table_name", metavar="TABLE")
@click.option("--policy", type=click.Choice(["keep_latest_commits", "keep_latest_file_versions"]), default=None,
              help="Override the table's clean.policy for this run.")
@click.option("--retain", type=click.IntRange(1), default=None, help="Override the table's clean.retain for this run.")
@target_option
@common_options
@click.pass_obj
def clean_cmd(ctx: Context, table_name, policy, retain, target) -> None:
    """Delete old file versions of a table, then archive its timeline.

    Keeps what the retained commits, savepoints and incremental consumers still need."""
    table, config, consumers = _service_context(ctx, table_name, target)
    clean_cfg, archive_cfg = config.get("clean") or {}, config.get("archive") or {}
    policy = policy or clean_cfg.get("policy", "keep_latest_commits")
    retain = retain or clean_cfg.get("retain", 10)
    oldest = min(consumers.values()) if consumers else None
    with _naming(table_name):
        result = table.clean(policy, retain, retain_from=oldest)
        archived = table.archive(archive_cfg.get("min_instants", 20), archive_cfg.get("max_instants", 30), keep_from=oldest)
    _report_retired(table)
    what = f"{policy}, retain {retain}"
    if result.instant:
        output.line(f"[green]✓[/] cleaned {table_name}: deleted {result.files_deleted} file(s) no retained commit needs "
                    f"({what}; clean instant {result.instant})")
    else:
        output.line(f"[green]✓[/] nothing to clean in {table_name} ({what})")
    if result.earliest_retained:
        output.line(f"  earliest retained commit: {result.earliest_retained}")
    for sp in table.savepoints():
        output.line(f"  kept: the files of savepoint {sp}")
    for who, cp in sorted(consumers.items(), key=lambda kv: kv[1]):
        output.line(f"  kept: what {who} has read up to {cp} needs")
    if archived:
        output.line(f"  archived {len(archived)} instant(s), {archived[0]} to {archived[-1]} (`pipe timeline {table_name} --all` lists them)")


@click.command(name="sync")
@click.argument("table_names", nargs=-1, metavar="[TABLE]...")
@click.option("--full", is_flag=True, help="Compare every partition of the table with the catalog's, not only those written since the last sync.")
@target_option
@vars_option
@common_options
@click.pass_obj
def sync_cmd(ctx: Context, table_names, full, target, vars_text) -> None:
    """Register tables in the target's catalog and bring them up to date (every table, or the
    TABLEs named).

    `pipe run` does this after every commit; `pipe sync` catches up after a sync that failed,
    and registers the tables of a catalog newly set on the target (docs/catalog.md)."""
    from compiler.errors import did_you_mean
    from runtime.steps.context import RunContext
    from runtime.steps.sync import close_catalog

    result = compile_plan(ctx, target, vars_text)
    plan = result.plan
    if not plan.target.catalog:
        raise ProjectError([cli_problem(f"target {plan.target.name} has no catalog to sync to",
                                 "set `catalog: {kind: spark}` or `catalog: {kind: glue}` on the target in pipe_project.yml (docs/catalog.md)")])
    writes = {s.name: s for s in plan.steps if s.kind == "write"}
    for name in table_names:
        if name not in writes:
            raise ProjectError([cli_problem(f"no table named '{name}' in project {plan.project}", did_you_mean(name, writes) or f"tables: {', '.join(writes)}")])
    lake = RunContext(plan, result.project.root, spark_factory=spark_factory(plan, result.project.root, ctx.debug, announce=False))
    try:
        _sync_tables(ctx, lake, [writes[n] for n in table_names or writes], full)
    finally:
        close_catalog(lake)


def _sync_tables(ctx: Context, lake, steps_, full: bool) -> None:
    """`pipe sync`: each table synced in turn; one's failure does not stop the others."""
    from rich.markup import escape

    from runtime.steps.sync import sync_step

    failed = 0
    for step in steps_:
        name = step.name
        if not lake.table_exists(name):
            output.line(f"[dim]-[/] {name}: not built yet (nothing at {escape(lake.table_uri(name))}); its first run registers it")
            continue
        try:
            outcome = sync_step(lake, step, full=full)
        except Exception as exc:  # noqa: BLE001 - one table's failure does not stop the others
            if ctx.debug:
                print_traceback()
            failed += 1
            output.fail(f"{name}: catalog sync failed: {exc}", getattr(exc, "hint", None)
                        or (None if isinstance(exc, PipeError) else "run again with --debug for the traceback"))
            if getattr(exc, "unreachable", False):  # the others would wait for it again
                break
            continue
        if outcome is None:
            output.line(f"[dim]-[/] {name}: no commit has written its columns yet; nothing to register")
        elif outcome.up_to_date:
            output.line(f"[green]✓[/] {name}: {', '.join(outcome.names)} up to date (instant {outcome.instant})")
        else:
            output.line(f"[green]✓[/] {name}{escape(outcome.summary()).replace('; ', ': ', 1)} (instant {outcome.instant}"
                        f"{', every partition compared' if outcome.full else ''})")
    if failed:
        raise click.exceptions.Exit(EXIT_FAILED)


@click.command(name="compact")
@click.argument("table_name", metavar="TABLE")
@target_option
@common_options
@click.pass_obj
def compact_cmd(ctx: Context, table_name, target) -> None:
    """Compact a merge-on-read table: fold the log files of every file group into a new base
    file (one commit), so that reads no longer merge them."""
    from runtime.table.config import MERGE_ON_READ
    from runtime.table.errors import TableError

    table, plan = table_for(ctx, table_name, target)
    if table.config.table_type != MERGE_ON_READ:
        raise TableError(f"table {table_name} is copy-on-write: its writes leave no log files to compact",
                         "only tables with `type: merge_on_read` are compacted")
    with _naming(table_name):
        before = [s for s in table.view().latest_slices() if s.has_logs]
        pending = table.timeline().pending_compactions()  # a Java writer's plan is executed too
        if before or pending:
            table.spark = spark_for(table, plan, ctx.root(), ctx.debug)
        done = table.compact() if before or pending else None
    _report_retired(table)
    if done is None:
        output.line(f"[green]✓[/] nothing to compact in {table_name}: no file group has log files")
        return
    logs = sum(len(s.log_files) for s in before)
    output.line(f"[green]✓[/] compacted {table_name}: {len(before)} file group(s), {logs} log file(s) folded into new base files "
                f"(commit {done}); `pipe clean {table_name}` deletes the old versions once no retained commit needs them")


@click.command(name="savepoint")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant", required=False)
@click.option("--delete", "delete", is_flag=True, help="Delete the savepoint of INSTANT instead.")
@click.option("--comment", default="", help="Stored with the savepoint.")
@target_option
@common_options
@click.pass_obj
def savepoint_cmd(ctx: Context, table_name, instant, delete, comment, target) -> None:
    """Savepoint a commit (default: the latest), so that cleaning keeps its files and the
    table can be restored to it; or delete a savepoint (--delete)."""
    instant_arg(instant, "INSTANT")
    table, _, _ = _service_context(ctx, table_name, target)
    if delete:
        if instant is None:
            raise ProjectError([cli_problem("--delete needs the INSTANT of the savepoint", f"savepoints of {table_name}: {', '.join(table.savepoints()) or 'none'}")])
        with _naming(table_name):
            table.delete_savepoint(instant)
        _report_retired(table)
        output.line(f"[green]✓[/] deleted the savepoint of {table_name} at {instant}; cleaning may now remove its files")
        return
    with _naming(table_name):
        done = table.savepoint(instant, comment=comment)
    _report_retired(table)
    output.line(f"[green]✓[/] savepointed {table_name} at {done}: cleaning keeps its files, and `pipe restore {table_name} {done}` returns the table to it")


@click.command(name="restore")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant")
@target_option
@common_options
@click.pass_obj
def restore_cmd(ctx: Context, table_name, instant, target) -> None:
    """Return a table to a completed commit: every later write is undone under one restore
    instant. Source checkpoints go back with the data, so the next run reads that input again."""
    instant_arg(instant, "INSTANT")
    table, _, consumers = _service_context(ctx, table_name, target)
    with _naming(table_name):
        restored, undone = table.restore(instant)
    _report_retired(table)
    output.line(f"[green]✓[/] restored {table_name} to {instant}: undid {len(undone)} write(s) ({', '.join(undone)}); restore instant {restored}")
    _downstream_warning(table_name, consumers, instant)


@click.command(name="rollback")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant")
@target_option
@common_options
@click.pass_obj
def rollback_cmd(ctx: Context, table_name, instant, target) -> None:
    """Undo the latest completed write of a table (INSTANT names it, as a check). Its source
    checkpoints go with it, so the next run reads that input again."""
    instant_arg(instant, "INSTANT")
    table, _, consumers = _service_context(ctx, table_name, target)
    with _naming(table_name):
        rolled = table.rollback(instant)
    _report_retired(table)
    latest = table.timeline().latest_completed()
    now = f"the table is as of {latest.time}" if latest else "the table has no commit now"
    output.line(f"[green]✓[/] rolled back {table_name} {instant} (rollback instant {rolled}); {now}")
    _downstream_warning(table_name, consumers, latest.time if latest else "")


@click.command(name="migrate")
@click.argument("table_name", metavar="TABLE")
@click.option("--to", "to_version", type=click.Choice(["6", "8", "9"]), required=True,
              help="The Hudi table version: 6 (Hudi 0.14/0.15), 8 (Hudi 1.0) or 9 (Hudi 1.1).")
@click.option("--dry-run", is_flag=True, help="Say what would change, and change nothing.")
@target_option
@common_options
@click.pass_obj
def migrate_cmd(ctx: Context, table_name, to_version, dry_run, target) -> None:
    """Upgrade or downgrade a table's Hudi version in place, as Hudi's own writer does: failed
    writes rolled back, a merge-on-read table compacted, the timeline rewritten in the new
    version's layout, hoodie.properties changed in one crash-safe step, an empty commit on the
    timeline. Running it again finishes an interrupted migration."""
    from runtime.table.config import MERGE_ON_READ

    to = int(to_version)
    table, plan = table_for(ctx, table_name, target)
    with _naming(table_name):
        if dry_run:
            m = table.migrate(to, dry_run=True)
        else:
            if table.config.table_type == MERGE_ON_READ and table.config.table_version != to:
                table.spark = spark_for(table, plan, ctx.root(), ctx.debug)  # the compaction before it
            m = table.migrate(to)
    _report_retired(table)
    if m.from_version == to:
        if m.finished:
            verb = "would delete" if dry_run else "deleted"
            output.line(f"[green]✓[/] {table_name} is at version {to}; {verb} {len(m.finished)} file(s) an interrupted migration left "
                        f"of the old layout (e.g. {m.finished[0]})")
        else:
            output.line(f"[green]✓[/] {table_name} is at version {to} already: nothing to do")
        return
    if dry_run:
        output.line(f"{table_name}: version {m.from_version} -> {to} would")
        for line in m.lines():
            output.line(f"  {line}")
        output.line("  write an empty commit recording the migration (nothing was changed: --dry-run)")
        return
    output.line(f"[green]✓[/] migrated {table_name} from version {m.from_version} to {to} (commit {m.instant})")
    for line in m.lines():
        output.line(f"  {line}")
