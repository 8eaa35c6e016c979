"""Table steps: read each source's new input since the table's checkpoints, run the table's
SQL on it, and write the result as one Hudi commit that stores the new checkpoints (or, with
--full-refresh, rebuild the table from all input)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

from compiler.plan import Step
from runtime import s3
from runtime.spark import api as spark_api
from runtime.sources import NothingToRead, Pending
from runtime.steps import expect, python_model, source, sync
from runtime.steps.context import FINGERPRINT_KEY, RunContext, StepResult, Stored, stored
from runtime.errors import Cancelled, RunError, spark_message
from runtime.sample import EMPTY, SAMPLE_KEY
from runtime.steps.views import expression_names, names_used, view_filters
from runtime.table.timeline import CHECKPOINT_PREFIX, DEFERRED_PREFIX


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    if step.config.get("seed"):  # a CSV of seeds/: runtime/steps/seed.py
        from runtime.steps import seed

        return seed.run(ctx, step, result)
    sources: dict[str, Pending] = {}
    outcome = {"committed": False, "succeeded": False}
    try:
        state, message = _write_step(ctx, step, result, sources, outcome)
        outcome["succeeded"] = True
    finally:
        source.settle(ctx, step, result, sources, outcome["committed"], outcome["succeeded"])
    return sync.after_write(ctx, step, result, state, message + source.notes(sources))


# What cannot name a table in Spark SQL: comments and string literals.
_NOT_NAMES = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"", re.DOTALL)


def reads_itself(texts: list[str], name: str) -> bool:
    """Whether the SQL of table `name` (its query, its expectations and `delete_when`) may read
    the table itself (`{{ this }}`, which renders as its name, or the name written out): the
    name as a word outside comments and string literals. A false yes only costs the view of the
    table's snapshot, as before; otherwise reading the snapshot's metadata (the timeline, its
    files, its schema in Spark) is skipped."""
    word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", re.IGNORECASE)
    return any(word.search(_NOT_NAMES.sub(" ", text)) for text in texts)


def _names_said(sql: str, expressions: list) -> frozenset[str] | None:
    """The names the table's SQL and its expressions (delete_when, expectations, which may
    read a view in a subquery) use; None if any may read columns it does not name."""
    query, more = names_used([sql]), expression_names([e for e in expressions if e])
    return None if query is None or more is None else query | more


def _table_views(ctx: RunContext, session, step: Step, views: dict[str, dict], named: frozenset[str] | None,
                 filters: Mapping[str, tuple] | None = None) -> dict[str, str]:
    """Registers a view of each table of `views` (name -> read options; the step's own table,
    or one it reads, deferred or not), a merge-on-read table's with only the data columns among
    `named` (None: every column), and only the partitions that can hold rows meeting its
    `filters` (views.view_filters, by lower-case name); returns what each view so pruned kept,
    as the step line says it."""
    from runtime.table.config import MERGE_ON_READ

    pruned = {}
    sample = ctx.options.sample
    for name, read in views.items():
        table = ctx.open_table(name, session) if name == step.name else ctx.open_upstream(name, f"table {step.name}", session)
        if sample is not None:  # part of each table (docs/dev-loop.md)
            whole = table.read(meta=True, **read)
            spark_api.temp_view(sample.table_rows(table, whole, [c for c in whole.columns if not c.startswith("_hoodie_")]), name)
            continue
        plan: list = []
        df = table.read(meta=False, named=named, where=(filters or {}).get(name.lower(), ()), plan=plan, **read)
        said = []
        if named is not None and table.config.table_type == MERGE_ON_READ:
            said.append(_columns_said(df.columns))
        if plan and plan[0].pruned is not None and plan[0].pruned[0] < plan[0].pruned[1]:
            said.append(f"{plan[0].pruned[0]:,} of {plan[0].pruned[1]:,} partitions")
        if said:
            pruned[name] = ", ".join(said)
        spark_api.temp_view(df, name)
    return pruned


def _write_step(ctx: RunContext, step: Step, result: StepResult, sources: dict[str, Pending], outcome: dict[str, bool]) -> tuple[str, str]:
    config = ctx.config(step)
    result.operation = config["operation"]
    uri = ctx.table_uri(step.name)
    exists = ctx.table_exists(step.name)
    table = ctx.open_table(step.name) if exists else None
    kept = ""
    queue = ctx.reads_queue(step)
    if exists and ctx.options.full_refresh and queue:
        kept = ("--full-refresh does not apply (it reads a queue, whose messages are gone once consumed); " if queue == "s3_events"
                else "--full-refresh does not apply (it reads a Kafka topic, whose old messages retention may have removed: a rebuild would lose their rows); ")
    state = stored(table) if table is not None else Stored({}, None, None, {})
    stored_cps, fingerprint, based_on = state.checkpoints, state.fingerprint, state.based_on
    deferred = source.deferred_inputs(ctx, step)
    origin = {n: ctx.defer.target for n in deferred}  # input -> the target it is read from
    moved = _moved_inputs(ctx, step, state, deferred) if exists else ""
    if moved and queue:
        raise RunError(f"table {step.name}: {moved}, and a table that reads a {queue.replace('_', ' ')} "
                       "source cannot be rebuilt from other input (its old messages are gone)",
                       "build its upstream tables in this target too (select them), or run it without --defer")
    sample = ctx.options.sample
    if sample is not None and queue == "s3_events":
        raise RunError(f"table {step.name} reads an SQS queue: {'--empty' if sample.empty else '--sample'} cannot read part of it "
                       "(its messages are received when read)", "leave this table out of a sampled run (--exclude)")
    if sample is not None and not sample.empty and exists and queue:
        raise RunError(f"table {step.name} reads a Kafka topic: --sample would rebuild it from part of the topic, and the next run "
                       "could not rebuild it whole (retention may have removed old messages)",
                       "leave this table out of a sampled run (--exclude), or sample a copy of it in another target")
    checking = sample is not None and sample.empty and exists  # --empty on a built table: checked, never written
    resampled = "" if sample is not None or not state.sample else f"its last build was {_sample_said(state.sample)}"
    moved = "; ".join(w for w in (moved, resampled) if w)
    full = (ctx.options.full_refresh and not kept) or not exists or bool(moved) or (sample is not None and not checking)
    dataset = None
    if config["operation"] == "bootstrap":
        if based_on is not None and not ctx.options.full_refresh:
            changed = "; its definition changed since" if fingerprint != step.fingerprint else ""
            return "no_input", (f"bootstrapped already (commit {based_on}){changed}; "
                                f"`pipe run --select {step.name} --full-refresh` bootstraps it again from {config['bootstrap']['path']}")
        dataset = _bootstrap_dataset(ctx, step, config)
        full = True
    refs = source.pending_inputs(ctx, step, stored_cps, full, sources, sample)
    _note_inputs(result, sources, refs, origin)
    if ctx.options.dry_run and not full:
        # an upstream table that would write in this run gives this one new input too
        writers = sorted({t for d in step.depends_on for t in ctx.would_write(d)})
        if writers and not any(not p.is_empty for p in sources.values()):
            return "would_run", kept + f"after {', '.join(writers)} (which would write first)"
    if not full and not source.has_work(sources, refs, stored_cps, fingerprint, step.fingerprint):
        if table is not None and not ctx.options.dry_run:
            table.tidy()  # what a dead run left: a stale lock, failed writes, a compaction pipe scheduled, temp files
        if fingerprint is not None and fingerprint != step.fingerprint and not kept:
            return "no_input", ("no new input; the table's definition changed since its last commit and applies to new input "
                                "only: `--full-refresh` rebuilds it from all input")
        return "no_input", kept + "no new input"
    if ctx.options.dry_run and dataset is not None:
        return "would_run", f"bootstrap of {dataset.describe()}"
    if ctx.options.dry_run:
        detail = "; ".join(f"{n}: {p.describe()}" for n, p in sources.items()) or "reads " + ", ".join(refs)
        how = "first build: " if not exists else f"rebuild ({moved}): " if moved else "full refresh: " if full else ""
        return "would_run", kept + how + detail

    spark = ctx.spark()
    ctx.check_spark_reads(spark, uri, step.name)
    if deferred:  # Spark reads the other target's files too
        ctx.check_spark_reads(spark, ctx.defer.lake, f"the lake of target {ctx.defer.target} (--defer)")
    session = spark_api.step_session(spark, step.id, f"pipe {step.id}")
    rows_read = 0
    for name, p in sources.items():
        try:
            df = p.dataframe(session)
        except NothingToRead as exc:
            if all(q.is_empty for n, q in sources.items() if n != name) and not refs:
                return "no_input", f"no new input ({exc})"
            raise
        spark_api.temp_view(sample.rows_of(df) if sample is not None else df, name)
        rows_read += p.rows or 0
    sql = step.sql_full_refresh if (full and step.sql_full_refresh) else step.sql
    said = [sql, config.get("delete_when"), *(e.get("expression") for e in config.get("expect") or [])]
    # the tables' views: a merge-on-read table's only with the columns the SQL names (views.py)
    views = {name: {"as_of": instant} for name, instant in refs.items()}
    if exists and not full and ((step.python is not None and "this" in step.python["extras"])  # model(this=...)
                                or reads_itself([t for t in said if t], step.name)):  # {{ this }}: the table's current snapshot
        views[step.name] = {}
    named = _names_said(sql, said[1:]) if sql is not None and views else None
    filters = view_filters([sql, *(f"SELECT {t}" for t in said[1:] if t)], list(views)) if sql is not None and views else None
    pruned = _table_views(ctx, session, step, views, named, filters)
    result.rows_read = rows_read if any(p.rows is not None for p in sources.values()) else None
    result.read = _what_was_read(sources, refs, pruned, origin)
    if sample is not None:  # what the inputs hold, of which the views keep no rows, or a sample
        result.read = ("no rows" if sample.empty else f"a sample ({sample.text})") + " of " + (result.read or f"{rows_read:,} rows")
        result.rows_read = None
    _note_inputs(result, sources, refs, origin)
    if dataset is not None:
        df = _bootstrap_frame(session, step, config, dataset)
    elif step.python is not None:
        df = python_model.frame(session, step, this_available=step.name in views)
    elif sql is None:  # delete_partition with partitions_to_delete only
        df = None
    else:
        try:
            try:
                df = session.sql(sql)
            except Exception:  # noqa: BLE001 - perhaps a column the pruned views lack: again on the full views
                if named is None:
                    raise
                _table_views(ctx, session, step, views, None, filters)
                result.read = _what_was_read(sources, refs, None, origin)
                df = session.sql(sql)
        except Exception as exc:  # noqa: BLE001 - an analysis error is a mistake in the SQL
            raise RunError(f"{step.sql_file or step.file}: Spark cannot run the SQL of table {step.name}: {spark_message(exc)}",
                           "fix the SQL (see the rendered query with `pipe compile` in target/plan.json)") from exc

    if checking:
        return "success", _checked_without_rows(step, config, table, df)
    checked = expect.check(step, df, config["expect"], config.get("delete_when")) if config.get("expect") and df is not None else None
    if checked is not None:
        df = checked.kept
        result.expectations = checked.to_dict()
    table, recreated = create_table(ctx, session, step, config, uri, rebuild=full and exists)
    extra = {f"{CHECKPOINT_PREFIX}{n}": p.checkpoint for n, p in sources.items() if p.checkpoint is not None}
    for n, p in sources.items():  # a source with nothing new keeps its checkpoint
        if p.checkpoint is None and n in stored_cps and not full:
            extra[f"{CHECKPOINT_PREFIX}{n}"] = stored_cps[n]
    extra.update({f"{CHECKPOINT_PREFIX}{n}": t for n, t in refs.items()})
    if sample is not None:  # part of the input: nothing is consumed, and the next real run rebuilds
        extra = {SAMPLE_KEY: sample.text}
    extra.update({f"{DEFERRED_PREFIX}{n}": t for n, t in origin.items()})
    extra[FINGERPRINT_KEY] = step.fingerprint
    if dataset is not None:
        extra.update({"pipe.bootstrap.path": dataset.uri, "pipe.bootstrap.files": str(dataset.files),
                      "pipe.bootstrap.partitions": str(len(dataset.partitions)) if dataset.partitions != [""] else "0"})
    operation, options = _write_options(config, full and exists and (dataset is None or based_on is not None))
    if operation == "delete_partition" and df is not None:
        options["partitions_to_delete"] = sorted(set(options["partitions_to_delete"]) | _named_partitions(step, config, df, table))
        if not options["partitions_to_delete"]:
            return "no_input", "no partition to delete (the SQL returned no rows)"
    if ctx.cancel.is_set():
        raise Cancelled(f"{step.id}: cancelled before its write started")
    quarantined = ""
    if checked is not None:
        if checked.quarantine is not None:
            instant = expect.write_quarantine(ctx, session, step, checked, extra, based_on or "first")
            quarantined = f"; quarantine commit {instant}"
        extra[expect.EXTRA_KEY] = json.dumps(checked.to_dict(), sort_keys=True)
    source.write_dead_letters(ctx, step, sources)
    # refused if another run committed to this table since its checkpoints were read
    w = write_staged(ctx, uri, recreated, lambda: table.write(df, operation=operation, extra_metadata=extra,
                                                               expect_latest=None if recreated else based_on,
                                                               retain_from=oldest_consumer(ctx, step.name), **options))
    outcome["committed"] = True
    ctx.written[step.name] = (None if full or recreated else based_on, w.instant)
    result.instant, result.action = w.instant, w.action
    result.inserts, result.updates, result.deletes = w.inserts, w.updates, w.deletes
    result.rows_written = w.inserts + w.updates
    note = f"; the commit stands, but compacting, cleaning or archiving after it failed ({w.service_error})" if w.service_error else ""
    if w.compaction:
        note = f", compacted (commit {w.compaction})" + note
    if w.retired:
        note += f"; first {w.retired}"
    if checked is not None:
        note += f"; {checked.summary()}{quarantined}"
    how = f"rebuilt ({moved}), " if moved else "full refresh, " if full and exists and sample is None else ""
    if sample is not None:
        how += "created with no rows (--empty), " if sample.empty else f"built from a sample ({sample.text}), "
    return "success", kept + how + f"{w.action} {w.instant}" + note


def _note_inputs(result: StepResult, sources: Mapping[str, Pending], refs: Mapping[str, str], origin: Mapping[str, str]) -> None:
    """What the step reads, for run_results.json: each source's pending input, each table's
    instant, and for a deferred input the target it comes from (`origin`)."""
    result.inputs = {name: p.to_dict() for name, p in sources.items()}
    result.inputs.update({name: {"instant": t, "checkpoint": t} for name, t in refs.items()})
    for name, target in origin.items():
        result.inputs.setdefault(name, {})["deferred"] = target


def _sample_said(spec: str) -> str:
    return "an --empty build" if spec == EMPTY else f"a --sample '{spec}' build"


def _checked_without_rows(step: Step, config: Mapping[str, Any], table, df) -> str:
    """--empty on a table that exists: its SQL ran on inputs with no rows; the columns it gives
    must fit the stored ones, as its next write needs. Nothing is written."""
    from runtime.table.schema import SchemaChangeError, merge_schemas

    if df is None:
        return "checked with no rows (nothing to check: it only deletes partitions); nothing written"
    c = table.config
    protected = tuple(c.record_key_fields) + tuple(c.partition_fields) + ((c.precombine_field,) if c.precombine_field else ())
    try:
        if config["operation"] != "insert_overwrite_table":
            merge_schemas(table.schema(), df.schema, protected)
    except SchemaChangeError as exc:
        raise RunError(f"table {step.name}: {exc}", "fix the SQL, or rebuild the table with --full-refresh") from exc
    return f"checked with no rows: its SQL runs and its {len(df.columns)} columns fit the stored table; nothing written"


def refs_of(step: Step, ctx: RunContext) -> set[str]:
    """The tables `step` reads by ref() (their snapshot: no incremental checkpoint)."""
    return {ctx.plan.step(d).name for d in step.depends_on if ctx.plan.step(d).kind == "write"}


def _moved_inputs(ctx: RunContext, step: Step, state: Stored, deferred: Mapping[str, str]) -> str:
    """Which inputs of the built table come from another lake than its latest commit's did (with
    --defer and before without it, or the other way round), or that are pinned earlier than what
    an incremental input read last, said for the user; "" when none. Its rows then come from other
    data, and its checkpoints name instants of another timeline: the table is rebuilt from the
    inputs as they are now."""
    here = f"target {ctx.plan.target.name}'s lake"
    now = {n: ctx.defer.target for n in deferred}
    changed = sorted(n for n in set(now) | set(state.deferred) if now.get(n) != state.deferred.get(n))
    if not state.checkpoints and state.fingerprint is None:
        return ""
    said = [f"{n} from {now[n] + ' at ' + deferred[n] if n in now else here}, before from "
            f"{state.deferred[n] if n in state.deferred else here}" for n in changed]
    # an incremental input read from the same target up to a later commit than its pin now:
    # the rows after the pin are in the table already
    back = sorted(n for n in now if n not in changed and n not in refs_of(step, ctx)
                  and state.checkpoints.get(n, "").split("_", 1)[0] > deferred[n])
    said += [f"{n} from {now[n]} at {deferred[n]}, earlier than the {state.checkpoints[n].split('_', 1)[0]} it read last" for n in back]
    if not said:
        return ""
    return "its input " + "; ".join(said) if len(said) == 1 else "its inputs " + "; ".join(said)


def _what_was_read(sources: Mapping[str, Pending], refs: Mapping[str, str], pruned: Mapping[str, str] | None = None,
                   origin: Mapping[str, str] | None = None) -> str | None:
    """What the step line says was read when not every input counted its rows (a Parquet
    source's files, a table read by ref() at its instant, with the columns its view kept when
    the SQL names only some of a merge-on-read table's, and the target it was deferred to);
    None when rows_read says it all."""
    read = [p for p in sources.values() if not p.is_empty]
    pruned = pruned or {}
    if not refs and not pruned and all(p.rows is not None for p in read):
        return None
    parts = [f"{p.rows:,} row{'s' if p.rows != 1 else ''}" if p.rows is not None else p.describe() for p in read]
    origin = origin or {}
    parts += [name + (f" of {origin[name]}" if name in origin else "") + f" at {instant}" + (f" ({pruned[name]})" if name in pruned else "")
              for name, instant in refs.items()]
    return " + ".join(parts) or None


def _columns_said(columns: list[str]) -> str:
    return f"columns {', '.join(columns)}" if 0 < len(columns) <= 6 else f"{len(columns)} columns"


def _named_partitions(step: Step, config: Mapping[str, Any], df, table) -> set[str]:
    """delete_partition with SQL: each row names a partition by its partition_by columns,
    whose text is the table's (timestamps, decimals: keygen.py). Only the distinct partition
    paths reach the driver."""
    fields = list(config["partition_by"])
    missing = [c for c in fields if c not in df.columns]
    if missing:
        raise RunError(f"{step.sql_file}: the rows of table {step.name} name the partitions to delete, but its SELECT has no column(s) "
                       f"{', '.join(missing)}", f"select the partition_by column(s) {', '.join(fields)} of the partitions to delete")
    return table.partition_paths(df.select(*fields))

def _bootstrap_dataset(ctx: RunContext, step: Step, config: Mapping[str, Any]):
    from runtime.table import bootstrap

    boot = config["bootstrap"]
    try:
        uri = ctx.project_uri(boot["path"])
        options = s3.client_options(ctx.s3a, s3.bucket_of(uri)) if s3.is_s3(uri) else ()
        return bootstrap.scan(uri, boot.get("partition_regex"), options)
    except bootstrap.BootstrapError as exc:
        raise RunError(f"{step.file}:{step.line}: table {step.name}: {exc}", exc.hint) from exc

def _bootstrap_frame(session, step: Step, config: Mapping[str, Any], dataset):
    from runtime.table import bootstrap

    try:
        df = bootstrap.read(session, dataset)
    except Exception as exc:  # noqa: BLE001 - files Spark cannot read as Parquet
        raise RunError(f"{step.file}:{step.line}: table {step.name}: Spark cannot read the dataset at {dataset.uri}: {spark_message(exc)}",
                       "bootstrap.path must hold Parquet files with one schema") from exc
    needed = [*config["key"], *config["partition_by"], *([config["precombine"]] if config.get("precombine") else [])]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise RunError(f"{step.file}:{step.line}: table {step.name} names column(s) {', '.join(missing)} (key, partition_by or precombine) "
                       f"that the dataset at {dataset.uri} does not have; its columns: {', '.join(df.columns)}",
                       "name columns of the dataset (partition folders named column=value count as columns)")
    return df


def create_table(ctx: RunContext, spark, step: Step, config: Mapping[str, Any], uri: str, rebuild: bool):
    from runtime.table.table import Table, TableError

    wanted = table_config(step, config)
    try:
        return Table.create(spark, uri, wanted, ctx.storage_options), False
    except TableError as exc:
        if not rebuild or "was created differently" not in str(exc):
            raise
    # --full-refresh of a table whose key, partitioning or type changed: start it anew. On a
    # local lake the new table is built beside the old one and swapped in once committed, so
    # a failed rebuild leaves the old table as it was. An undeclared CDC log is kept as it was.
    if wanted.cdc_mode is None:
        from dataclasses import replace

        from runtime.table import cdc_log

        try:
            kept = cdc_log.mode_of(Table.open(spark, uri, ctx.storage_options).config.properties or {})
        except (TableError, ValueError):
            kept = None
        wanted = replace(wanted, cdc_mode=kept)
    if _is_local(uri):
        staging = _staging_uri(uri)
        _delete_table(staging, ctx.storage_options)
        return Table.create(spark, staging, wanted, ctx.storage_options), True
    _delete_table(uri, ctx.storage_options)
    return Table.create(spark, uri, wanted, ctx.storage_options), True



def rebuild_warnings(ctx: RunContext) -> list[str]:
    """With --full-refresh: a selected table whose key, partitioning, type or precombine
    field changed is created anew, and its instants start over. Every incremental consumer
    that has read it loses its checkpoint: one message per consumer, saying what its next
    run will do. A consumer rebuilt in the same run reads the new table whole: no loss."""
    if not ctx.options.full_refresh:
        return []
    out = []
    for sid in ctx.selected:
        step = ctx.plan.step(sid)
        if step.kind != "write" or not ctx.table_exists(step.name) or ctx.reads_queue(step):
            continue
        try:
            changed = ctx.open_table(step.name).definition_changes(table_config(step, ctx.config(step)))
        except RunError:
            continue  # an environment variable is missing: the step itself will say so
        if not changed:
            continue
        for src, reader, cp in ctx.incremental_consumers(step.name):
            if f"table.{reader.name}" in ctx.selected:
                continue
            if src.config.get("on_checkpoint_lost") == "full_read":
                then = f"then reads all of {step.name} again (its source sets on_checkpoint_lost: full_read)"
            else:
                then = (f"then stops with a lost checkpoint until it is rebuilt too (`pipe run --select {reader.name} --full-refresh`, "
                        f"or add it to this run: `--select {step.name}+`), or its source sets `on_checkpoint_lost: full_read`")
            out.append(f"--full-refresh creates table {step.name} anew ({changed}): {reader.name} has read it up to {cp} "
                       f"through source {src.name}, a checkpoint the new table will not have; its next run {then}")
    return out



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
        create_version=config.get("table_version", 6),
        metadata_table=bool(config.get("metadata_table", False)) or config["index"] == "record",
        record_index=config["index"] == "record",
        buckets=config.get("buckets"),  # set only with index: bucket (compiler/validate.py)
        cdc_mode=(config.get("cdc_logging") or "").upper() or None,
    )


def _write_options(config: Mapping[str, Any], full_refresh: bool) -> tuple[str, dict[str, Any]]:
    operation = config["operation"]
    options: dict[str, Any] = {
        "index": {"bucket": "partition", "record": "global"}.get(config["index"], config["index"]),
        "buckets": config.get("buckets"),
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
    if config["index"] == "record" and operation == "insert":
        options["combine_before_insert"] = True  # the record index names one place per key: a batch's copies are combined
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


def oldest_consumer(ctx: RunContext, name: str) -> str | None:
    """The oldest instant a table that reads `name` incrementally still needs (its cleaning keeps it)."""
    consumers = ctx.consumer_checkpoints(name)
    return min(consumers.values()) if consumers else None


def write_staged(ctx: RunContext, uri: str, recreated: bool, write):
    """`write()`, the table's commit. A table `create_table` made anew beside the old one (its
    staging folder) is swapped in once the commit stands, and removed if it failed: the old
    table was never touched."""
    try:
        w = write()
    except BaseException:
        if recreated and _is_local(uri):
            _delete_table(_staging_uri(uri), ctx.storage_options)
        raise
    if recreated and _is_local(uri):
        _swap_in(_staging_uri(uri), uri)
    return w


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
