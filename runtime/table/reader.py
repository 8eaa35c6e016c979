"""Readers returning Spark DataFrames: snapshot, time travel (as of an instant) and incremental
(the rows written by commits in (since, until]), with or without the meta columns."""

from __future__ import annotations

from runtime.table.layout import FileSystemView, completed_write_instants
from runtime.table.schema import META_COLUMNS
from runtime.table.timeline import Timeline


def read(spark, storage, struct, timeline: Timeline, as_of: str | None = None, since: str | None = None,
         until: str | None = None, meta: bool = True):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    full = T.StructType([T.StructField(c, T.StringType(), True) for c in META_COLUMNS] + (list(struct.fields) if struct else []))
    view = FileSystemView.load(storage, timeline)
    if since is None and until is None:
        slices = view.latest_slices(as_of)
        wanted = None
    else:
        until = until or as_of
        first_active = timeline.completed()[0].time if timeline.completed() else None
        if since is not None and first_active is not None and since < first_active and timeline.instants[0].time > since:
            # commits after `since` were archived: their write stats are gone, so every live
            # slice is scanned; copy-on-write rows keep the commit time that last wrote them
            slices = view.latest_slices(until)
        else:
            groups = set()
            for inst in completed_write_instants(timeline, since, until):
                for stat in timeline.commit_metadata(inst).write_stats:
                    groups.add((stat.partition_path, stat.file_id))
            slices = [s for s in view.latest_slices(until) if (s.partition, s.file_id) in groups]
        wanted = (since, until)
    paths = [storage.full_path(s.base_file.path) for s in slices]
    if not paths:
        df = spark.createDataFrame([], full)
    else:
        df = spark.read.schema(full).parquet(*paths)
    if wanted is not None:
        since_, until_ = wanted
        if since_ is not None:
            df = df.where(F.col("_hoodie_commit_time") > F.lit(since_))
        if until_ is not None:
            df = df.where(F.col("_hoodie_commit_time") <= F.lit(until_))
    if not meta:
        df = df.drop(*META_COLUMNS)
    return df
