"""Catalog sync of table steps (runtime/sync/): after a table step commits, and after one that
found no new input (the catalog may be behind after a sync that failed), the table is brought
up to date in the target's catalog. A failed sync never undoes the commit: the step ends in
`warn` with the catalog's error and a hint; the next run, or `pipe sync`, catches up."""

from __future__ import annotations

import traceback
from pathlib import Path

from compiler.plan import Step
from runtime.steps.context import RunContext, StepResult
from runtime.sync import SyncError, SyncOutcome, definitions, sync_table


def open_catalog(ctx: RunContext):
    """The target's catalog, opened once per run (a Hive metastore needs the run's Spark, or
    over Spark Connect a JVM of pipe's own: runtime/sync/hive.py)."""
    with ctx.catalog_lock:
        if ctx.catalog_error is not None:  # one unreachable catalog is waited for once per run
            raise ctx.catalog_error
        if ctx.catalog is None:
            try:
                ctx.catalog = _open(ctx)
            except SyncError as exc:
                ctx.catalog_error = exc
                raise
        return ctx.catalog


def _open(ctx: RunContext):
    spec = ctx.plan.target.catalog or {}
    if spec.get("kind") == "glue":
        from runtime.sync.glue import GlueCatalog

        return GlueCatalog(_resolved(ctx, spec.get("region")), _resolved(ctx, spec.get("endpoint_url")))
    from runtime.spark import api as spark_api, cluster, connect
    from runtime.sync.hive import HiveMetastore

    needed_by = f"the Spark settings of target {ctx.plan.target.name} need it"
    settings = {k: ctx.resolved(str(v), needed_by) for k, v in ctx.plan.target.spark_conf.items() if k.startswith("spark.hadoop.")}
    spark = ctx.spark()
    local = cluster.is_local(ctx.resolved(ctx.plan.target.spark_master, needed_by))
    if spark_api.is_connect(spark) and not connect.is_own_server():
        local = False  # a remote server's catalog is shared: an embedded one would be pipe's alone
    return HiveMetastore(spark, ctx.root, settings, local=local)


def close_catalog(ctx: RunContext) -> None:
    """Ends the run's conversation with its catalog (a thrift connection, an embedded Derby)."""
    with ctx.catalog_lock:
        if ctx.catalog is not None:
            ctx.catalog.close()
            ctx.catalog = None


def _resolved(ctx: RunContext, value: str | None) -> str | None:
    return None if value is None else ctx.resolved(value, f"the catalog of target {ctx.plan.target.name} needs it")


def sync_step(ctx: RunContext, step: Step, full: bool = False) -> SyncOutcome | None:
    """Syncs the table of write step `step`; None when the target has no catalog or the
    table has not been built. Raises SyncError."""
    names = ctx.plan.target.catalog_names(step)
    if not names or not ctx.table_exists(step.name):
        return None
    table = ctx.open_table(step.name)
    timeline = table.timeline()
    struct = table.writer_schema(timeline)
    if struct is None:
        return None  # no commit has written a schema yet: nothing a catalog could describe
    uri = ctx.table_uri(step.name)
    location = uri if "://" in uri else Path(uri).as_uri()
    specs = definitions(ctx.plan.target.catalog, names, table, struct, location)
    return sync_table(open_catalog(ctx), specs, table, timeline, force_full=full)


def after_write(ctx: RunContext, step: Step, result: StepResult, state: str, message: str) -> tuple[str, str]:
    """The table step's state and message once its table is synced: a failed sync turns
    `success` into `warn`, with the error and a hint."""
    if not ctx.plan.target.catalog or ctx.options.dry_run or state not in ("success", "no_input"):
        return state, message
    try:
        outcome = sync_step(ctx, step)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the commit stands
        if getattr(exc, "unreachable", False):
            with ctx.catalog_lock:  # the run's other tables say so at once rather than wait for it again
                ctx.catalog_error = ctx.catalog_error or exc
        if not isinstance(exc, SyncError):
            result.traceback = traceback.format_exc()  # not the user's mistake: --debug shows where
        result.catalog = {"names": ctx.plan.target.catalog_names(step), "error": str(exc)}
        hint = getattr(exc, "hint", None)
        result.hint = (f"the commit stands; the next run syncs the table again, or `pipe sync {step.name}` now"
                       + (f" ({hint})" if hint else ""))
        return "warn", f"{message}; catalog sync failed: {exc}"
    if outcome is None:
        return state, message
    result.catalog = outcome.to_dict()
    return state, message + outcome.summary()
