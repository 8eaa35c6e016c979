"""Tombstones: a deleted key keeps its ordering (precombine) value for a while, so that an
older event for it, arriving in a later batch, cannot bring it back.

Without them the outcome of out-of-order deletes depends on batch boundaries: a delete
(ts 10) and a late update (ts 5) in one batch leave the key deleted (the larger ordering
value wins), but in two batches the update finds no stored row and inserts the key again.
Hudi keeps a delete's ordering value only in merge-on-read delete blocks, until compaction.

The tombstones of a write are Parquet files under `.hoodie/.aux/pipe_tombstones/`, named
`<instant>_<write token>.parquet`, with the record key (and the partition path, for tables
whose keys are unique per partition) and the largest ordering value a delete of the batch
carried. They count when their instant does (layout.InstantValidity: completed, or archived),
so a failed, rolled-back or restored write's tombstones never count (rollback and restore
delete them). A full replacement of the table starts them afresh. Other Hudi readers and
writers ignore `.hoodie/.aux`. Tombstones older than the retention are deleted by the next
write that uses them."""

from __future__ import annotations

import datetime as dt
from typing import Iterator

from runtime.table.layout import InstantValidity
from runtime.table.timeline import HOODIE, REPLACECOMMIT, Timeline, archived_instants

FOLDER = f"{HOODIE}/.aux/pipe_tombstones"
_ORDER = "_pipe_tombstone_order"


def _instant_of(name: str) -> str:
    return name.split("_", 1)[0]


def _oldest_kept(timeline: Timeline, days: int) -> str:
    """The instant time `days` before the latest instant: tombstones older than it expire."""
    last = timeline.last_time() or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d%H%M%S%f")[:17]
    latest = dt.datetime.strptime(last[:14], "%Y%m%d%H%M%S")
    return (latest - dt.timedelta(days=days)).strftime("%Y%m%d%H%M%S") + "000"


def live_files(storage, timeline: Timeline, days: int) -> list[str]:
    """The tombstone files that count: written by a completed write (on the active timeline,
    or archived as completed), within the retention, and not older than the latest full
    replacement of the table (`insert_overwrite_table`, as `--full-refresh` writes it: the
    input was read again whole, and its own deletes left new tombstones). Other files are
    deleted (the caller holds the table's lock, so no write in progress owns them)."""
    valid = InstantValidity.of(timeline)
    oldest = max(_oldest_kept(timeline, days), _latest_full_replace(timeline))
    archived: set[str] | None = None
    live = []
    for info in storage.list_files(FOLDER):
        name = info.path.rpartition("/")[2]
        if not name.endswith(".parquet"):
            continue
        instant = _instant_of(name)
        counts = instant in valid.committed
        if not counts and valid(instant):  # older than the active timeline: only if archived as completed
            if archived is None:
                archived = {i.time for i in archived_instants(storage, timeline.layout) if i.is_completed}
            counts = instant in archived
        if counts and instant >= oldest:
            live.append(info.path)
        else:
            storage.delete(info.path)
    return sorted(live)


def _latest_full_replace(timeline: Timeline) -> str:
    for inst in reversed(timeline.completed((REPLACECOMMIT,))):
        if timeline.commit_metadata(inst).operation_type == "INSERT_OVERWRITE_TABLE":
            return inst.time
    return ""


def delete_files_of(storage, instant: str) -> None:
    """Removes the tombstones a write left (its rollback or restore undoes them)."""
    for info in storage.list_files(FOLDER):
        if _instant_of(info.path.rpartition("/")[2]) == instant:
            storage.delete(info.path)


def drop_older_than_tombstones(spark, storage, timeline: Timeline, rows, key: list[str], order: str, days: int):
    """`rows` (prepared: key, partition path, data) without those older than the tombstone
    of their key: the same rule as against a stored row (writer.drop_stale). Files are read
    with the key columns and ordering type of this write: a partition path missing from older
    files (written before `index: partition`) reads as null and matches nothing."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    paths = live_files(storage, timeline, days)
    if not paths:
        return rows
    order_type = rows.schema[order].dataType
    schema = T.StructType([T.StructField(k, T.StringType(), True) for k in key] + [T.StructField(_ORDER, order_type, True)])
    stones = spark.read.schema(schema).parquet(*[storage.full_path(p) for p in paths])
    stones = stones.groupBy(*key).agg(F.max(_ORDER).alias(_ORDER))
    joined = rows.join(stones, on=key, how="left")
    keep = F.col(_ORDER).isNull() | (F.col(f"`{order}`") >= F.col(_ORDER))
    return joined.where(keep).drop(_ORDER)


def write(storage, instant: str, rows, key: list[str], order: str, deleted) -> int:
    """Writes the tombstones of this write's deletes (`deleted`: a boolean column of `rows`)
    with the largest ordering value per key; the executors write the files. Returns how many
    keys got one."""
    from pyspark.sql import functions as F

    # per key, the largest ordering value of its deletes, where a delete won the batch (no
    # row of the batch orders after it: writer.dedupe's rule)
    value = F.col(f"`{order}`")
    stones = (rows.groupBy(*key).agg(F.max(F.when(deleted, value)).alias(_ORDER), F.max(value).alias("_pipe_top"))
              .where(F.col(_ORDER).isNotNull() & (F.col(_ORDER) >= F.col("_pipe_top"))).drop("_pipe_top"))
    spec = (storage.spec.uri, tuple(storage.spec.options), instant)
    return stones.mapInArrow(lambda batches: _write_task(spec, batches), "n long").agg(F.sum("n")).first()[0] or 0


def _write_task(spec, batches: Iterator) -> Iterator:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from runtime.storage import StorageSpec, open_storage
    from runtime.table.files import _token

    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    uri, options, instant = spec
    table = pa.concat_tables(tables)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    token, _ = _token()
    open_storage(StorageSpec(uri, options)).write_atomic(f"{FOLDER}/{instant}_{token}.parquet", buf.getvalue())
    yield pa.RecordBatch.from_pydict({"n": [table.num_rows]})
