"""The Spark a command runs on: an embedded session, pipe's own Spark Connect server for the
project, or the target's remote; and the tables a command names."""

from __future__ import annotations

import os
from pathlib import Path

from compiler.errors import PipeError, ProjectError
from pipe import output
from pipe.commands.common import cli_problem, compile_plan, Context


def spark_factory(plan, root: Path, debug: bool = False, announce: bool = True):
    """Starts (once, when a step first needs it) the run's Spark: a Spark Connect session when the
    target or SPARK_REMOTE names a server, or when this project's own `pipe server` runs for this
    target with its settings; embedded Spark otherwise."""
    from compiler.render import resolve_env_placeholders
    from runtime.errors import RunError

    def start():
        from runtime.spark import connect, session

        try:
            conf = {k: resolve_env_placeholders(str(v), os.environ) for k, v in plan.target.spark_conf.items()}
            master = resolve_env_placeholders(plan.target.spark_master, os.environ)
        except KeyError as exc:
            raise RunError(f"environment variable {exc.args[0]} is not set; the Spark settings of target {plan.target.name} need it",
                           f"export {exc.args[0]}=... before `pipe run`") from exc
        try:
            remote = connect.remote_of(conf, os.environ)
            own = None if remote else own_server(plan, root, master, conf)
            if not debug:
                quiet_query_loggers()
            if own is not None:
                from runtime.spark import server

                server.lease(own)
                spark = session.get_spark(master, conf, reads_s3=reads_s3(plan), reads_kafka=reads_kafka(plan), remote=own.url,
                                          own_server=own)
            else:
                spark = session.get_spark(master, conf, app_name=f"pipe {plan.project}", reads_s3=reads_s3(plan),
                                          reads_kafka=reads_kafka(plan), packages=packages_for(plan))
            if announce:
                from rich.markup import escape

                from runtime.spark import cluster

                if own is not None:
                    output.err.print(f"[dim]Spark: the pipe server of target {plan.target.name} at {own.url} "
                                     f"({own.master}; `pipe server stop` ends it)[/]")
                elif remote.startswith("sc://"):
                    output.err.print(f"[dim]Spark: Spark Connect server {escape(remote.split('/;')[0])}[/]")
                if cluster.shipment is not None:  # a cluster: say which Python runs the tasks
                    output.err.print(f"[dim]{escape(cluster.shipment.describe())}[/]")
            return spark
        except Exception as exc:  # noqa: BLE001 - Spark could not start: say why, once
            from runtime.spark.cluster import ExecutorPythonError

            if isinstance(exc, PipeError):
                raise
            if isinstance(exc, ExecutorPythonError):
                raise RunError(str(exc), exc.hint) from exc
            raise RunError(f"Spark did not start: {exc}", getattr(exc, "hint", None)) from exc

    return start


def own_server(plan, root: Path, master: str, conf: dict):
    """The running `pipe server` of this project and target, if it has the target's settings."""
    from runtime.spark import server

    state = server.read_state(root, plan.target.name)
    if state is None:
        return None
    if not server.started_with(state, master, conf, plan.project):
        output.err.print(f"[yellow]warning[/]: the pipe server of target {plan.target.name} ({state.url}) was started with other "
                         "Spark settings or another version of pipe's code; this command starts its own Spark (`pipe server stop` and `pipe server start` renew it)")
        return None
    server.touch(state)
    return state


def packages_for(plan) -> tuple[str, ...]:
    """The jars the plan's sources need on Spark's classpath (the JDBC driver of each `jdbc` source)."""
    from runtime.sources.jdbc import package_for

    return tuple(sorted({p for s in plan.steps if s.kind == "ingest" and s.config.get("kind") == "jdbc"
                         for p in [package_for(s.config)] if p}))


def reads_kafka(plan) -> bool:
    """Whether Spark's tasks read Kafka (a `kind: kafka` source, with confluent-kafka)."""
    return any(s.kind == "ingest" and s.config.get("kind") == "kafka" for s in plan.steps)


def reads_s3(plan) -> bool:
    """Whether Spark's tasks read or write S3 themselves (with boto3): a lake or a source on S3."""
    from compiler.render import resolve_env_placeholders

    try:
        lake = resolve_env_placeholders(plan.target.lake, os.environ)
    except KeyError:
        lake = plan.target.lake
    return lake.startswith(("s3://", "s3a://")) or any(
        s.kind == "ingest" and s.config.get("kind") in ("s3_events", "s3_incremental") for s in plan.steps)


def quiet_query_loggers() -> None:
    """PySpark logs every failed query with its whole Java stack trace on stderr; pipe reports
    the error itself (with the file), so those loggers stay quiet unless --debug."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def table_for(ctx: Context, name: str, target: str | None):
    """The project table NAME as stored in the target's lake (opened without Spark)."""
    from compiler.api import has_dead_letter_table
    from compiler.errors import did_you_mean
    from runtime.steps.context import RunContext

    result = compile_plan(ctx, target, None)
    plan = result.plan
    tables = [s.name for s in plan.steps if s.kind == "write"]
    # the dead-letter table of each s3_events and s3_incremental source (and kafka source with on_bad_record: dead_letter) is a table too
    tables += [s.name + "_dead_letter" for s in plan.steps if s.kind == "ingest" and has_dead_letter_table(s.config)]
    # and so is the quarantine table of each table with a `quarantine` expectation
    tables += [s.name + "__quarantine" for s in plan.steps
               if s.kind == "write" and any(e["action"] == "quarantine" for e in s.config.get("expect") or ())]
    # and the failures table of each test with store_failures
    tables += [s.name + "__failures" for s in plan.steps if s.kind == "test" and s.config.get("store_failures")]
    if name not in tables:
        raise ProjectError([cli_problem(f"no table named '{name}' in project {plan.project}", did_you_mean(name, tables) or f"tables: {', '.join(tables)}")])
    lake = RunContext(plan, result.project.root)
    uri = lake.table_uri(name)
    if not lake.table_exists(name):
        hint = f"run `pipe run --select +{name}`"
        if name.endswith("_dead_letter") and name not in [s.name for s in plan.steps]:
            hint = "nothing has been dead-lettered yet (the table appears with the first message or object)"
        elif name.endswith("__quarantine") and name not in [s.name for s in plan.steps]:
            hint = "no row has been quarantined yet (the table appears with the first one)"
        elif name.endswith("__failures") and name not in [s.name for s in plan.steps]:
            hint = f"the test has not run yet: `pipe test --select test:{name[:-len('__failures')]}`"
        raise ProjectError([cli_problem(f"table {name} has not been built yet (nothing at {uri})", hint)])
    return lake.open_table(name), plan


def spark_for(table, plan, root: Path, debug: bool):
    """The Spark session that reads (or compacts) `table`; on S3 it must have an S3 file system."""
    from runtime import s3
    from runtime.table.errors import TableError

    spark = spark_factory(plan, root, debug)()
    try:
        s3.check_spark(spark, table.storage.spec.uri, f"table {table.config.name}")
    except s3.SparkCannotReadS3 as exc:
        raise TableError(str(exc), exc.hint) from exc
    return spark
