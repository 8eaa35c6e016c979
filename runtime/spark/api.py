"""The few things pipe asks of Spark beyond DataFrames and SQL, for a classic session (Spark's
JVM in pipe's process, reached through py4j) and a Spark Connect one (a thin client of a server
elsewhere) alike.

A classic session has a SparkContext: job groups that Ctrl-C cancels, `newSession` for a step's
own temporary views, `defaultParallelism`. A Connect session has none of these; it has sessions
cloned on the server (each with its own temporary views, and the settings and shipped code of
the session it was cloned from), operation tags that `interruptTag` cancels, and settings read
on the server. Everything else in pipe talks DataFrames and SQL, which both kinds share."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from typing import Any

from runtime.spark.info import conf_value, default_parallelism, is_connect, master, setting

# what the rest of pipe asks of a session: this module's own, and the session facts of info.py
__all__ = ["cancel", "default_parallelism", "empty_frame", "end_step", "is_connect", "local_checkpoint", "master", "new_session",
           "parquet_schema", "server_lost", "setting", "step_session", "temp_view"]

# The step sessions of Connect sessions, by tag: what a cancellation interrupts.
_tagged: dict[str, object] = {}
_tagged_lock = threading.Lock()
# Spark's version, by session (asked once).
_versions: dict[Any, str] = {}
# Spark's settings that change the schema it reads from a Parquet file.
_PARQUET_SCHEMA_SETTINGS = ("spark.sql.parquet.binaryAsString", "spark.sql.parquet.int96AsTimestamp",
                            "spark.sql.parquet.inferTimestampNTZ.enabled", "spark.sql.legacy.parquet.nanosAsLong")




def new_session(spark):
    """A session of its own (its temporary views are its own) with the settings of `spark` and,
    over Connect, the code shipped to it."""
    if not is_connect(spark):
        return spark.newSession()
    from runtime.spark import connect

    return connect.clone(spark)


def step_session(spark, tag: str, description: str):
    """A session of its own for one step, whose Spark jobs `cancel(spark, tag)` cancels; the
    executor calls `end_step(spark, tag)` when the step is over. Call it in the thread that runs
    the step: classic job groups and Connect tags both belong to the calling thread."""
    if not is_connect(spark):
        spark.sparkContext.setJobGroup(tag, description, interruptOnCancel=True)
        return spark.newSession()
    from runtime.spark import connect

    with _tagged_lock:
        taken = _tagged.get(tag)
    if taken is not None:  # the step asks again (a unit test runs its table's step under its own tag): one session per step
        return taken
    session = connect.step_session(spark, tag)
    with _tagged_lock:
        _tagged[tag] = session
    return session


def temp_view(df, name: str) -> None:
    """`df.createOrReplaceTempView(name)` in the session of `df`. Over Connect, the name is kept
    with the session: a fixed session of pipe's own server outlives the step, and its views are
    dropped when the step gives it back (runtime/spark/connect.py), not left to shadow a table of the
    same name in the next step that takes it."""
    df.createOrReplaceTempView(name)
    if is_connect(df.sparkSession):
        from runtime.spark import connect

        connect.remember_view(df.sparkSession, name)


def end_step(spark, tag: str) -> None:
    """A step is over: over Connect, its session is given back (runtime/spark/connect.py)."""
    with _tagged_lock:
        session = _tagged.pop(tag, None)
    if session is not None:
        from runtime.spark import connect

        connect.end_step_session(session)


def cancel(spark, tag: str) -> None:
    """Cancels the running Spark jobs of the step tagged `tag` (best effort: the step then fails
    and its write rolls back)."""
    if not is_connect(spark):
        spark.sparkContext.cancelJobGroup(tag)
        return
    with _tagged_lock:
        session = _tagged.get(tag)
    if session is not None:
        session.interruptTag(tag)


def server_lost(exc: BaseException) -> bool:
    """Whether `exc` is the loss of this process's Spark Connect server (runtime/spark/connect.py)."""
    connect = sys.modules.get("runtime.spark.connect")  # imported by a run over Spark Connect only
    return connect is not None and connect.lost_server(exc) is not None


def empty_frame(spark, schema):
    """A DataFrame of no rows with `schema` (a StructType, or a DDL string such as "a string, b
    int"), made in the JVM: one empty range task. `spark.createDataFrame([], schema)` makes a
    Python RDD instead, and a query over it starts a Python worker per core for no row (on this
    machine 100 ms or more a query). The columns are nullable."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    struct = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    return spark.range(0, 0, 1, 1).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in struct.fields])


def local_checkpoint(df, eager: bool = True):
    """`df.localCheckpoint(eager)`, in the session of `df` on Connect too. PySpark's Connect
    client binds the checkpointed DataFrame to the calling thread's active session (else the
    process's first), not to the session of `df` that holds the checkpoint on the server; a step's
    own session is neither, and its checkpoint would then be looked for in the wrong session. So
    the session of `df` is the thread's active one for the call (PySpark keeps no public way)."""
    if not is_connect(df.sparkSession):
        return df.localCheckpoint(eager=eager)
    from pyspark.sql.connect.session import SparkSession

    holder = SparkSession._active_session
    before = getattr(holder, "session", None)
    holder.session = df.sparkSession
    try:
        return df.localCheckpoint(eager=eager)
    finally:
        holder.session = before


def checkpoint_partitions(df) -> int | None:
    """How many partitions the local checkpoint `df` (local_checkpoint's, planned when it was
    made) holds: read off its RDD on the driver, no job (about a millisecond). None over Spark
    Connect, or when the plan is not a checkpoint's."""
    if is_connect(df.sparkSession):
        return None
    try:
        plan = df._jdf.queryExecution().analyzed()
        if not plan.getClass().getName().endswith(".LogicalRDD"):
            return None
        return int(plan.rdd().getNumPartitions())
    except Exception:  # (another Spark's internals: the caller plans for several partitions)
        return None


def parquet_schema(spark, path: str, key: str):
    """Spark's schema of the Parquet file `path`, whose footer `key` names what the schema
    depends on in the file (its Parquet schema, the Spark schema a writer stored beside it).
    Spark's answer is kept on disk (pipe's cache folder, `spark-schemas/`) under the key, Spark's
    version and its settings for reading Parquet: asked of Spark, it is an analysis of a read of
    the file (0.05 to 0.1 s on a warm server, each run of each table), read back, a millisecond."""
    from pyspark.sql import types as T

    from runtime.host import cache_dir

    version = _versions.get(_session_key(spark))
    if version is None:
        version = _versions[_session_key(spark)] = spark.version
    settings = json.dumps([version, *[conf_value(spark, k) for k in _PARQUET_SCHEMA_SETTINGS]])
    try:  # a cache folder pipe may not use (runtime/host.py) only costs the analysis
        file = cache_dir() / "spark-schemas" / (hashlib.sha256(f"{settings}\0{key}".encode()).hexdigest()[:32] + ".json")
    except OSError:
        return spark.read.parquet(path).schema
    try:
        return T.StructType.fromJson(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    struct = spark.read.parquet(path).schema
    try:  # best effort: an unwritable cache folder costs the analysis next time
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(f".{file.name}.{os.getpid()}.{threading.get_ident()}")  # steps run in threads
        partial.write_text(struct.json(), encoding="utf-8")
        os.replace(partial, file)
    except OSError:
        pass
    return struct


def _session_key(spark):
    return spark.client._session_id if is_connect(spark) else id(spark.sparkContext)





