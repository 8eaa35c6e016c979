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
so a failed, rolled-back or restored write's tombstones never count. Other Hudi readers and
writers ignore `.hoodie/.aux`. Tombstones older than the retention are deleted by the next
write that uses them."""

from __future__ import annotations

import datetime as dt
from typing import Iterator

from runtime.table.layout import InstantValidity
from runtime.table.timeline import HOODIE, Timeline

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
    """The tombstone files that count; files of failed or expired writes are deleted (the
    caller holds the table's lock, so no write in progress owns them)."""
    valid = InstantValidity.of(timeline)
    oldest = _oldest_kept(timeline, days)
    live = []
    for info in storage.list_files(FOLDER):
        name = info.path.rpartition("/")[2]
        if not name.endswith(".parquet"):
            continue
        instant = _instant_of(name)
        if valid(instant) and instant >= oldest:
            live.append(info.path)
        else:
            storage.delete(info.path)
    return sorted(live)


def drop_older_than_tombstones(spark, storage, timeline: Timeline, rows, key: list[str], order: str, days: int):
    """`rows` (prepared: key, partition path, data) without those older than the tombstone
    of their key: the same rule as against a stored row (writer.drop_stale)."""
    from pyspark.sql import functions as F

    paths = live_files(storage, timeline, days)
    if not paths:
        return rows
    stones = spark.read.parquet(*[storage.full_path(p) for p in paths])
    stones = stones.groupBy(*key).agg(F.max(_ORDER).alias(_ORDER))
    order_type = dict(rows.dtypes)[order]
    joined = rows.join(stones, on=key, how="left")
    keep = F.col(_ORDER).isNull() | (F.col(f"`{order}`") >= F.col(_ORDER).cast(order_type))
    return joined.where(keep).drop(_ORDER)


def write(storage, instant: str, rows, key: list[str], order: str, deleted) -> int:
    """Writes the tombstones of this write's deletes (`deleted`: a boolean column of `rows`)
    with the largest ordering value per key; the executors write the files. Returns how many
    keys got one."""
    from pyspark.sql import functions as F

    stones = (rows.where(deleted & F.col(f"`{order}`").isNotNull()).groupBy(*key)
              .agg(F.max(F.col(f"`{order}`")).alias(_ORDER)))
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
