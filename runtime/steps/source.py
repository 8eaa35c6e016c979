"""Source steps, and what a table step asks of its sources: the new input since the table's
checkpoints, and afterwards the settling of what it read (queue messages deleted once the
commit holds them, or put back at once when the step failed)."""

from __future__ import annotations

from typing import Any, Mapping

from compiler.plan import Step
from runtime.spark import api as spark_api
from runtime.sources import Pending, human_bytes
from runtime.sources import files as files_source
from runtime.sources import jdbc as jdbc_source
from runtime.sources import kafka as kafka_source
from runtime.sources import s3_events as s3_events_source
from runtime.sources import s3_incremental as s3_incremental_source
from runtime.sources import table as table_source
from runtime.steps.context import RunContext, StepResult
from runtime.errors import RunError


def run(ctx: RunContext, step: Step, result: StepResult) -> tuple[str, str]:
    """A source step checks that the source can be listed and says how much is there;
    what is new is decided per consuming table, against that table's checkpoint."""
    config = ctx.config(step)
    kind = config["kind"]
    done = "would_run" if ctx.options.dry_run else "success"
    if kind == "files":
        entries = files_source.list_files(config, ctx.root, step.name)
        result.inputs = {"files": len(entries), "bytes": sum(e.size for e in entries)}
        return done, f"{len(entries)} file{'s' if len(entries) != 1 else ''} ({human_bytes(result.inputs['bytes'])}) listed"
    if kind in ("table", "s3_incremental"):
        name = config["table"] if kind == "table" else config["metadata_table"]
        if ctx.built_later(name):
            return "would_run", f"reads table {name} once it is built in this run"
        latest = ctx.open_upstream(name, f"source {step.name}").timeline().latest_completed()
        what = "table" if kind == "table" else "metadata table"
        return done, f"{what} {name} at {latest.time if latest else 'no commit yet'}"
    if kind == "hudi":
        upstream = ctx.open_hudi(str(config["path"]), f"source {step.name}")
        latest = upstream.timeline().latest_completed()
        c = upstream.config
        return done, (f"Hudi table {c.name} (version {c.table_version}, {c.table_type.lower()}) at "
                      f"{latest.time if latest else 'no commit yet'}")
    if kind == "s3_events":
        pending = s3_events_source.pending(step.name, config, dry_run=True)  # asks, receives nothing
        result.inputs = {"messages_waiting": pending.count}
        return done, f"queue: {pending.describe()}"
    if kind == "kafka":
        found = kafka_source.topics(step.name, config)
        partitions = sum(len(p) for p in found.values())
        result.inputs = {"topics": len(found), "partitions": partitions}
        names = ", ".join(sorted(found)[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        text = f"{len(found)} topic{'s' if len(found) != 1 else ''} ({names or 'none yet'}), {partitions} partition{'s' if partitions != 1 else ''}"
        if config.get("fan_out"):  # topics the pattern matches that no captured table reads yet
            captured = {s.config.get("topic") for s in ctx.plan.steps if s.kind == "ingest" and s.name.startswith(step.name + "__")}
            new = sorted(set(found) - captured)
            result.inputs["uncaptured_topics"] = new
            if new:
                text += (f"; {len(new)} topic(s) without a table yet: {', '.join(new[:3])}{' ...' if len(new) > 3 else ''} "
                         f"(`pipe discover {step.name}` writes them down)")
        return done, text
    if kind == "jdbc":  # what is new is asked per consuming table; the URL is shown without its parameters
        return done, f"{config.get('dbtable') or 'a query'} at {jdbc_source.shown_url(str(config['url']))}"
    raise RunError(f"source {step.name}: sources of kind {kind} cannot run in this version of pipe")


def pending_inputs(ctx: RunContext, step: Step, checkpoints: Mapping[str, str], full: bool,
                   sources: dict[str, Pending], sample=None) -> dict[str, str]:
    """Fills `sources` with the new input per source (as it goes, so that the caller can
    let go of received queue messages if a later source fails), and returns the latest
    instant of each upstream table read by ref(). With a time `sample` (runtime/sample.py)
    every source is read from a checkpoint at its cut."""
    refs: dict[str, str] = {}
    everything = full and ctx.options.full_refresh  # all input: --full-refresh ignores per-run limits
    for dep in step.depends_on:
        up = ctx.plan.step(dep)
        if up.kind != "ingest":
            if ctx.built_later(up.name):
                refs[up.name] = "(built earlier in this run)"
                continue
            latest = ctx.open_upstream(up.name, f"table {step.name}").timeline().latest_completed()
            if latest is None:
                raise RunError(f"table {step.name} reads table {up.name}, which has no completed commit yet",
                               f"build it first: `pipe run --select +{up.name}`")
            refs[up.name] = latest.time
            continue
        config = ctx.config(up)
        last = None if full else checkpoints.get(up.name)
        kind = config["kind"]
        upstream = None
        if kind in ("table", "s3_incremental"):
            upstream_name = config["table"] if kind == "table" else config["metadata_table"]
            if ctx.built_later(upstream_name):
                refs[upstream_name] = "(built earlier in this run)"
                continue
            upstream = ctx.open_upstream(upstream_name, f"source {up.name}")
        elif kind == "hudi":
            upstream = ctx.open_hudi(str(config["path"]), f"source {up.name}")
        if sample is not None and sample.since_ms is not None:
            last = sample.checkpoint(up.name, config, upstream)
        if kind == "files":
            if everything:
                config = {**config, "max_files_per_run": None, "max_bytes_per_run": None}
            sources[up.name] = files_source.pending(up.name, config, ctx.root, last)
        elif kind == "table":
            sources[up.name] = table_source.pending(up.name, config, upstream, step.name, last)
        elif kind == "hudi":
            sources[up.name] = table_source.pending(up.name, config, upstream, step.name, last)
        elif kind == "s3_incremental":
            if everything:
                config = {**config, "max_bytes_per_run": None, "read_latest_on_missing_checkpoint": False}
            sources[up.name] = s3_incremental_source.pending(up.name, config, upstream, step.name, last, ctx.s3a)
        elif kind == "s3_events":
            sources[up.name] = s3_events_source.pending(up.name, config, dry_run=ctx.options.dry_run)
        elif kind == "kafka":
            if everything:  # --full-refresh: every message there is, in one run
                config = {**config, "max_records_per_run": None, "starting_offsets": "earliest"}
            sources[up.name] = kafka_source.pending(up.name, config, last)
        elif kind == "jdbc":
            sources[up.name] = jdbc_source.pending(ctx.spark(), up.name, config, last, full)
        elif kind == "given":  # a unit test's rows (runtime/steps/unit.py)
            from runtime.sources import given

            sources[up.name] = given.pending(up.name, config)
        else:
            raise RunError(f"source {up.name} of kind {kind} cannot run in this version of pipe")
    return refs


def deferred_inputs(ctx: RunContext, step: Step) -> dict[str, str]:
    """With --defer: the inputs of `step` (by the name its checkpoint is stored under: the table
    of a ref(), the source of a `table`/`s3_incremental` source) that this run reads from the
    target it defers to, each with the instant it is pinned at."""
    out = {}
    for dep in step.depends_on:
        up = ctx.plan.step(dep)
        table = up.name if up.kind == "write" else up.reads_table
        if table is None:
            continue
        pin = ctx.deferred(table)
        if pin is not None:
            out[up.name] = pin.instant
    return out


def has_work(sources: Mapping[str, Pending], refs: Mapping[str, str], stored: Mapping[str, str],
             fingerprint: str | None, wanted_fingerprint: str) -> bool:
    """A table fed by sources runs when a source has new input; one that only reads other
    tables runs when an upstream has a new commit or the step's definition changed."""
    if sources:
        return any(not p.is_empty for p in sources.values())
    return any(stored.get(n) != t for n, t in refs.items()) or fingerprint != wanted_fingerprint


def settle(ctx: RunContext, step: Step, result: StepResult, sources: Mapping[str, Pending], committed: bool, succeeded: bool) -> None:
    """After the write, committed or not: queue messages the commit holds are deleted (those
    of a failed step go back to the queue at once), objects in undeclared buckets are recorded
    in the source's dead-letter table once the checkpoint moved past them, cached object reads
    are dropped."""
    problems = []
    for name, p in sources.items():
        if isinstance(p, s3_events_source.S3EventsPending):
            def dead_letter(messages, name=name, p=p) -> None:
                _write_dead_letter(ctx, name + s3_events_source.DEAD_LETTER_SUFFIX, ("message_id",), s3_events_source.DEAD_LETTER_DDL,
                                   s3_events_source.dead_letter_rows(name, p.config, messages))
            try:
                p.finish(committed, succeeded, dead_letter=dead_letter)
            except Exception as exc:  # noqa: BLE001 - reported on the step below
                problems.append(f"source {name}: {exc}")
            result.inputs[name] = p.to_dict()
            continue
        if isinstance(p, s3_incremental_source.S3IncrementalPending) and p.foreign_objects and committed:
            try:
                _write_dead_letter(ctx, name + s3_incremental_source.DEAD_LETTER_SUFFIX, s3_incremental_source.DEAD_LETTER_KEY,
                                   s3_incremental_source.DEAD_LETTER_DDL, s3_incremental_source.dead_letter_rows(p, step.name))
                p.dead_lettered = len(p.foreign_objects)
            except Exception as exc:  # noqa: BLE001 - reported on the step below
                problems.append(f"source {name}: the dead-letter table could not be written: {exc}")
            result.inputs[name] = p.to_dict()
        if isinstance(p, kafka_source.KafkaPending) and p.dead_lettered:
            result.inputs[name] = p.to_dict()
        p.release()
    if problems and succeeded:
        raise RunError("; ".join(problems), "the commit is complete; what was not recorded is recorded again by the next run "
                       "(queue messages stay in the queue, undeclared objects are named again)")


def write_dead_letters(ctx: RunContext, step: Step, sources: Mapping[str, Pending]) -> None:
    """Before the table's commit: the bad messages of its Kafka sources (`on_bad_record:
    dead_letter`) go to `<source>_dead_letter`. Written first, so that no commit moves the offsets
    past a message the dead-letter table does not hold; a run that fails after it writes the same
    rows again next time (keyed by consumer, topic, partition and offset)."""
    for name, p in sources.items():
        if isinstance(p, kafka_source.KafkaPending) and p.rejected is not None:
            try:
                _write_dead_letter(ctx, name + kafka_source.DEAD_LETTER_SUFFIX, kafka_source.DEAD_LETTER_KEY, kafka_source.DEAD_LETTER_DDL,
                                   p.rejected.withColumn("consumer", _lit(step.name)))
            except Exception as exc:  # noqa: BLE001 - the step stops: nothing is committed
                raise RunError(f"source {name}: the dead-letter table {name}{kafka_source.DEAD_LETTER_SUFFIX} could not be written "
                               f"({str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__})",
                               "nothing was committed and the checkpoint did not move; the next run tries again") from exc
            p.dead_lettered = p.bad_records


def _lit(value: str):
    from pyspark.sql import functions as F

    return F.lit(value)


def _write_dead_letter(ctx: RunContext, name: str, key: tuple[str, ...], ddl: str, rows) -> None:
    """Upserts `rows` (metadata: a queue message, an object's name; or a DataFrame of bad Kafka
    messages, which stays in Spark) into the pipe table `name`, keyed by `key` and ordered by
    `dead_lettered_at`; the table is made with the first rows."""
    from runtime.table.config import TableConfig
    from runtime.table.table import Table

    spark = ctx.spark()
    session = spark_api.new_session(spark)
    ctx.check_spark_reads(spark, ctx.table_uri(name), name)
    table = Table.create(session, ctx.table_uri(name), TableConfig(name=name, record_key_fields=key, precombine_field="dead_lettered_at"),
                         ctx.storage_options)
    if isinstance(rows, list):
        rows = session.createDataFrame(rows, ddl)
    else:  # the columns in the table's order, typed as it declares
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        rows = rows.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in StructType.fromDDL(ddl).fields])
    table.write(rows, "upsert")


def notes(sources: Mapping[str, Pending]) -> str:
    """What a user should hear about even when the step succeeds: malformed messages, objects
    gone from the bucket."""
    out = []
    for name, p in sources.items():
        if isinstance(p, s3_events_source.S3EventsPending) and p.malformed:
            left = [m for m in p.malformed if m not in p.dead_lettered]
            if left:
                out.append(f"{name}: {len(left)} malformed message(s) left in the queue, e.g. {left[0].id}: {left[0].error}")
            if p.delete_failures:
                out.append(f"{name}: {p.delete_failures} message(s) could not be deleted from the queue after the commit "
                           "(they come back and upsert the same keys)")
            if p.dead_lettered:
                out.append(f"{name}: {len(p.dead_lettered)} malformed message(s) moved to table {name}{s3_events_source.DEAD_LETTER_SUFFIX} "
                           f"after {p.dead_lettered[0].receive_count} receives, e.g. {p.dead_lettered[0].id}: {p.dead_lettered[0].error}")
        if p.bad_records and getattr(p, "dead_lettered", 0):
            out.append(f"{name}: {p.bad_records} bad record(s) moved to table {name}{kafka_source.DEAD_LETTER_SUFFIX}, e.g. {p.bad_samples[0]}")
        elif p.bad_records:
            out.append(f"{name}: {p.bad_records} bad record(s) dropped (on_bad_record: drop), e.g. {p.bad_samples[0]}")
        if isinstance(p, s3_incremental_source.S3IncrementalPending) and p.missing:
            out.append(f"{name}: {len(p.missing)} object(s) gone from the bucket were skipped, e.g. s3://{p.missing[0]}")
    return "".join(f"; {n}" for n in out)
