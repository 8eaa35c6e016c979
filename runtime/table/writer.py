"""The write path of a copy-on-write table, one function per step (DESIGN.md):

    prepare -> dedupe -> tag_locations -> assign_file_groups -> write_file_groups -> commit

`write()` reads top to bottom in that order. Data stays in Spark: the driver only sees counts
per partition, the ids of the file groups touched, and one stats row per file written.

The replacing operations (insert_overwrite, insert_overwrite_table, delete_partition) skip
the index lookup: they write new file groups only and name the groups they replace, which the
table completes as a replacecommit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from runtime.spark import api as spark_api
from runtime.table import bloom_index as _bloom_index
from runtime.table import bucket_index as _bucket_index
from runtime.table import keygen as _keygen
from runtime.table import partition_upsert as _partition_upsert
from runtime.table import record_index as _record_index
from runtime.table import reader as _reader
from runtime.table import markers
from runtime.table import metadata_table as _metadata_table
from runtime.table import tombstones as _tombstones
from runtime.table.config import EVENT_TIME, MERGE_ON_READ
from runtime.table.errors import WriteError
from runtime.table.files import FILE_ID, KIND, STATS_SCHEMA, Derived, FileWriteSpec, LogTarget, write_task
from runtime.table.layout import FileSlice, new_file_id
from runtime.table.schema import IS_DELETED, META_COLUMNS, SchemaChangeError, arrow_schema, avro_schema_json

KEY, PART = "_hoodie_record_key", "_hoodie_partition_path"
_DELETE = "_pipe_delete"  # the row deletes its key
_BUCKET = "_pipe_bucket"  # bucket index: an insert's bucket
_SEQ = "_pipe_seq"  # arrival order: the tie-breaker among equal precombine values
_OLD_PART, _OLD_FILE, _OLD_ORDER = "_pipe_old_partition", "_pipe_old_file", "_pipe_old_order"
_GONE = "_pipe_gone"  # merge-on-read: the stored key was deleted by its slice's logs (tag_locations)
_KIND = KIND
# up to this many known file groups (or partitions) get a task each in turn; beyond, Spark's hash spreads them
_SPREAD_GROUPS = 512

OPERATION_TYPES = {
    "upsert": "UPSERT", "insert": "INSERT", "bulk_insert": "BULK_INSERT", "delete": "DELETE",
    "insert_overwrite": "INSERT_OVERWRITE", "insert_overwrite_table": "INSERT_OVERWRITE_TABLE", "delete_partition": "DELETE_PARTITION",
}
# Operations completed as a replacecommit (partitionToReplaceFileIds) instead of a commit.
REPLACE_OPERATIONS = ("insert_overwrite", "insert_overwrite_table", "delete_partition")


@dataclass(frozen=True)
class WriteOptions:
    operation: str = "upsert"
    index: str = "global"  # global | partition
    delete_when: str | None = None
    insert_duplicates: str = "none"  # none | drop | fail
    combine_before_insert: bool = False
    precombine_nulls: str = "lowest"  # lowest (a null orders below every value, as in Hudi) | fail (pipe tables default)
    bulk_insert_sort_mode: str = "NONE"
    max_file_size: int = 120 * 1024 * 1024
    small_file_limit: int = 100 * 1024 * 1024
    record_size_estimate: int = 1024
    extra_metadata: dict[str, str] = field(default_factory=dict)
    partitions_to_delete: tuple[str, ...] = ()  # delete_partition: partition paths, fnmatch patterns
    tombstone_days: int | None = None  # deleted keys keep their precombine value this long (tombstones.py)
    buckets: int | None = None  # Hudi's simple bucket index: buckets per partition (bucket_index.py)


@dataclass
class WriteCounts:
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    files: int = 0
    bytes: int = 0


# --- 0. prepare: key, partition path and delete flag on every row ----------------------------


def prepare(df, config, opts: WriteOptions):
    """Adds _hoodie_record_key, _hoodie_partition_path, the delete flag and the arrival order.
    Raises WriteError for input that does not fit the table."""
    from pyspark.sql import functions as F

    columns = df.columns
    for c in columns:
        if c.startswith("_hoodie_") and c != IS_DELETED:
            raise WriteError(f"the input has a column '{c}'; names starting with _hoodie_ are Hudi's meta columns")
    needed = list(config.record_key_fields) + list(config.partition_fields) + ([config.precombine_field] if config.precombine_field else [])
    if opts.operation == "delete":
        needed = list(config.record_key_fields) + (list(config.partition_fields) if opts.index == "partition" else [])
    missing = [c for c in needed if c not in columns]
    if missing:
        raise WriteError(f"the input lacks column(s) {', '.join(missing)} that the table needs (key, partition or precombine)")
    if opts.operation in ("upsert", "delete") and not config.record_key_fields:
        raise WriteError(f"operation {opts.operation} needs a record key")
    flag = _delete_flag(F, columns, opts)
    types = dict(df.dtypes)
    key = _keygen.key_expr(F, config, types) if config.record_key_fields else F.expr("uuid()")
    partition = _keygen.partition_expr(F, config, types) if opts.operation != "delete" or opts.index == "partition" or all(c in columns for c in config.partition_fields) else F.lit(None).cast("string")
    data_cols = [c for c in columns if c != IS_DELETED]
    return df.select(*[F.col(f"`{c}`") for c in data_cols], key.alias(KEY), partition.alias(PART), flag.alias(_DELETE), F.monotonically_increasing_id().alias(_SEQ))


def _delete_flag(F, columns, opts: WriteOptions):
    """True for a row that deletes its key: every row of a `delete`, rows marked
    _hoodie_is_deleted, rows matching `delete_when`."""
    flag = F.lit(opts.operation == "delete")
    if IS_DELETED in columns:
        flag = flag | F.coalesce(F.col(IS_DELETED).cast("boolean"), F.lit(False))
    if opts.delete_when:
        flag = flag | F.coalesce(F.expr(opts.delete_when), F.lit(False))
    return flag


# --- 1. dedupe ------------------------------------------------------------------------------------


def _null_ordering(config, opts: WriteOptions, present) -> str | None:
    """The precombine column whose nulls a write refuses, if any: a null would lose to every
    version, even an older stored one (`precombine_nulls: fail`, the default). `present`: the
    input's data columns."""
    orders = (opts.operation == "upsert" or opts.combine_before_insert) and opts.precombine_nulls == "fail"
    return config.precombine_field if orders and config.precombine_field in present else None


def _refuse_nulls(config, rows, ordering: str | None, null_keys: int, null_orders: int) -> None:
    """Stops the write on rows without a key, or with a null precombine value (`ordering`)."""
    from pyspark.sql import functions as F

    if null_keys:
        raise WriteError(no_key_message(config, null_keys, rows.where(F.col(KEY).isNull())))
    if null_orders:
        keys = [r[0] for r in rows.where(F.col(f"`{ordering}`").isNull()).select(KEY).limit(3).collect()]
        raise WriteError(f"table {config.name}: {null_orders} row(s) have a null precombine value (column {ordering}), e.g. key "
                         f"{', '.join(keys)}; a null orders below every value, so such a row would be dropped as older than a stored version. "
                         f"Give every row a value (e.g. coalesce({ordering}, ...) in the table's SQL), filter those rows out, "
                         f"or set `precombine_nulls: lowest` on the table to accept that")


def _key_range(lo, hi) -> tuple[bytes, bytes] | None:
    return None if lo is None else (bytes(lo), bytes(hi))


def _keys_stay_put(storage, slices: list[FileSlice], ranges: dict[str, tuple[bytes, bytes] | None], probe=None, timeline=None,
                   one_task: bool = False) -> tuple[bool, set[tuple[str, str]] | None]:
    """Whether a global-index upsert or delete may be decided partition by partition, as with
    `index: partition` (partition_upsert.py): no key of the batch can be stored in another
    partition than the one it comes in, nor come in two. `ranges`: the batch's least and
    greatest key per partition (Java's order).

    By the key ranges alone: the batch's ranges are disjoint, and every stored base file's key
    range (from its footer, bloom_index.key_ranges) meets only the range of its own
    partition's batch, if any. This is the daily upsert of a table partitioned by time whose
    keys grow: its keys are found with no join, in one stage. Else, with `probe` (the batch's
    keys `_k` and partitions `_p`), the base files' bloom filters are asked whether they may
    hold a key going to another partition, and when the batch's ranges meet, its keys are
    shuffled by key to see whether one comes in two partitions (bloom_index.crossing_candidates:
    one Spark job, two with the shuffle): the upsert of one partition's keys, or several, when
    keys are numbered across partitions; a `probe` of `one_task`, one Spark partition, as a
    small batch's is (bloom_index.ONE_TASK_KEYS), is not shuffled). A slice without a base
    file or a footer without a range says no; so does a slice with log files, unless
    `timeline` shows that none of them took new keys (Timeline.log_inserts: then every key of the slice is in its base file's
    footer, as with pipe's and Java's bloom and simple indexes, which update logs only).

    Also returns, when the bloom filters were asked, the files they say may hold a key of the
    batch (for the global lookup when the answer is no), else None."""
    from bisect import bisect_right

    if None in ranges:  # deletes that name no partition (prepare): their keys may be anywhere
        return False, None
    spans = sorted((r[0], r[1], p) for p, r in ranges.items() if r is not None)
    meet = any(b[0] <= a[1] for a, b in zip(spans, spans[1:]))  # (a key may come in two partitions)
    if not spans or (meet and (probe is None or not slices)) or any(s.base_file is None for s in slices):
        return False, None  # (an empty table's lookup costs nothing: no job to ask whether a key comes twice)
    logged = [s for s in slices if s.has_logs]
    if logged:
        since = min(min(s.base_instant, *(lf.base_instant for lf in s.log_files)) for s in logged)
        inserted = timeline.log_inserts(since) if timeline is not None else None
        if inserted is None or any((s.partition, s.file_id) in inserted for s in logged):
            return False, None
    stored = _bloom_index.key_ranges(storage, slices)
    if any(stored.get((s.partition, s.file_id)) is None for s in slices):
        return False, None
    lows = [lo for lo, _, _ in spans]
    doubtful = set()  # files whose key range meets the range of another partition's batch
    for s in slices:
        found = stored[(s.partition, s.file_id)]
        i = bisect_right(lows, found[1]) - 1  # the last batch range starting at or below the file's greatest key
        while i >= 0 and (meet or spans[i][1] >= found[0]):  # ranges that meet the file's, the later ones first
            if spans[i][2] != s.partition and spans[i][1] >= found[0]:
                doubtful.add((s.partition, s.file_id))
                break
            i -= 1
    if not doubtful and not meet:
        return True, None
    if probe is None:
        return False, None
    asked = _bloom_index.prune(storage, slices, {None: (spans[0][0], max(hi for _, hi, _ in spans))})  # the global lookup's files
    maybe, crossing, twice = _bloom_index.crossing_candidates(probe, storage, asked, by_key=meet, one_task=one_task)
    return not twice and not (crossing & doubtful), maybe


def no_key_message(config, count: int, keyless) -> str:
    """The refusal of `count` rows without a record key (`keyless`, a DataFrame of them): the
    table, its key fields, up to three of the rows and, when Spark still knows it, the file
    each came from."""
    from pyspark.sql import functions as F

    fields = config.record_key_fields
    data = [c for c in keyless.columns if not c.startswith("_hoodie_") and not c.startswith("_pipe_")]
    samples = keyless.select(F.to_json(F.struct(*[F.col(f"`{c}`") for c in data]), {"ignoreNullFields": "false"}), F.input_file_name()).limit(3).collect()
    shown = "; ".join(f"{row}" + (f" (in {path})" if path else "") for row, path in samples)
    if len(fields) == 1:
        what = f"its key column {fields[0]} is null or empty"
    else:
        what = f"every one of its key columns {', '.join(fields)} is null or empty"
    return (f"table {config.name}: {count} row(s) have no record key: {what}, and Hudi refuses such a key "
            f"(HoodieKeyException); e.g. {shown}. Every row needs a key: filter those rows out or give them a value "
            f"(e.g. coalesce(...) in the table's SQL); nothing was written")


def dedupe(df, config, opts: WriteOptions, present):
    """One row per key in the batch: the largest precombine value wins, then the later row.
    `present`: the input's data columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    keys = [KEY] + ([PART] if opts.index == "partition" else [])
    ordered = config.precombine_field and config.precombine_field in present  # deletes by key have none
    order = ([F.col(f"`{config.precombine_field}`").desc_nulls_last()] if ordered else []) + [F.col(_SEQ).desc()]
    w = Window.partitionBy(*keys).orderBy(*order)
    return df.withColumn("_pipe_rank", F.row_number().over(w)).where("_pipe_rank = 1").drop("_pipe_rank")


# --- 2. tag_locations: the index lookup -----------------------------------------------------


# Batches up to this many keys are broadcast to the tasks scanning the stored keys, so the
# (large) index is filtered where it is read instead of shuffled.
BROADCAST_KEYS = 200_000
# A batch of up to this many rows goes through the write's steps in one task (writer._write):
# the shuffles a larger batch spreads its work with cost more than they spread
ONE_TASK_ROWS = 20_000


def tag_locations(spark, df, config, opts: WriteOptions, slices: list[FileSlice], storage, batch_rows: int | None = None,
                  partitions: set[str] | None = None, merged=None, stored_struct=None, probe=None,
                  key_range: dict[str | None, tuple[bytes, bytes] | None] | None = None, located=None,
                  bloom_known: set[tuple[str, str]] | None = None):
    """Joins incoming keys to the keys stored in the latest file slices; adds the stored
    partition, file id and precombine value (null for new keys). With `index: partition`,
    only the slices of `partitions` (the batch's, found when not given) are read.
    `merged` (merge-on-read): slices -> their merged rows; a slice with log files is indexed
    as readers see it (a key its logs deleted is gone, an update's precombine value counts).
    `stored_struct` (the table's data columns), when known, saves Spark reading a footer for
    the base files' schema: only the columns of the index are read. `probe`: rows with the
    same keys as `df` that are cheaper to compute (the batch before its deduplication), whose
    keys filter the stored ones. `key_range`: the batch's key range (bloom_index.prune), by
    partition or {None: range}: base files outside it are not read, nor (a batch of up to
    BROADCAST_KEYS keys, files large enough) those whose bloom filters hold none of its keys.
    `located` (a table with a record index, global index): keys (`_k`) -> the set of (partition,
    file id) holding any of them (record_index.lookup); only those slices are read.
    `bloom_known`: the base files whose bloom filters may hold a key of the batch, when they
    were asked already (_keys_stay_put): no other base-only slice is read."""
    from pyspark.sql import functions as F

    if not slices:
        return df.select("*", F.lit(None).cast("string").alias(_OLD_PART), F.lit(None).cast("string").alias(_OLD_FILE), F.lit(None).alias(_OLD_ORDER),
                         F.lit(False).alias(_GONE))
    if opts.index == "partition":
        wanted = partitions if partitions is not None else {r[0] for r in df.select(PART).distinct().collect()}  # metadata
        slices = [s for s in slices if s.partition in wanted]
        if not slices:
            return tag_locations(spark, df, config, opts, [], storage)
    small = batch_rows is not None and batch_rows <= BROADCAST_KEYS
    if small:  # the batch's keys, which filter the stored ones
        probe = (df if probe is None else probe).select(F.col(KEY).alias("_k"), *([F.col(PART).alias("_p")] if opts.index == "partition" else []))
    if located is not None:  # the record index names the groups the batch's keys are in
        held = located((df if probe is None else probe).select(F.col(KEY).alias("_k")) if not small else probe.select("_k"))
        slices = [s for s in slices if (s.partition, s.file_id) in held]
        if not slices:
            return tag_locations(spark, df, config, opts, [], storage)
    elif key_range is not None:
        slices = _bloom_index.prune(storage, slices, key_range)
        if bloom_known is not None:
            slices = [s for s in slices if s.base_file is None or s.has_logs or (s.partition, s.file_id) in bloom_known]
        elif small and slices:
            slices = _bloom_index.bloom_candidates(probe, storage, slices, opts.index == "partition")
        if not slices:
            return tag_locations(spark, df, config, opts, [], storage)
    with_logs = [s for s in slices if s.has_logs] if merged is not None else []
    plain = [s for s in slices if not s.has_logs] if merged is not None else slices
    reader = spark.read
    if stored_struct is not None:
        from pyspark.sql import types as T

        ordering = [f for f in stored_struct.fields if f.name == config.precombine_field]
        reader = reader.schema(T.StructType([T.StructField(c, T.StringType()) for c in (KEY, PART, "_hoodie_file_name")] + ordering))
    parts = ([reader.parquet(*[storage.full_path(s.base_file.path) for s in plain])] if plain else []) + ([merged(with_logs)] if with_logs else [])
    index = None
    for stored in parts:
        # a base row names its file, a log row its file id: the file id is the name's first part
        cols = [F.col(KEY).alias("_k"), F.col(PART).alias(_OLD_PART), F.substring_index(F.col("_hoodie_file_name"), "_", 1).alias(_OLD_FILE)]
        cols.append(F.col(f"`{config.precombine_field}`").alias(_OLD_ORDER) if config.precombine_field and config.precombine_field in stored.columns else F.lit(None).alias(_OLD_ORDER))
        cols.append(F.lit(False).alias(_GONE))
        index = stored.select(*cols) if index is None else index.unionByName(stored.select(*cols))
    # (not with a record index: a key it does not hold is new, as Java's RECORD_INDEX has it)
    based = [s for s in with_logs if s.base_file is not None] if located is None else []
    if based:
        # keys of base files their logs deleted stay in their group, as Java's index finds them
        # there (it reads base files' keys): a key written again goes back to it (its log), never
        # to a second group of the partition
        keys = spark.read.schema("_hoodie_record_key string, _hoodie_partition_path string, _hoodie_file_name string").parquet(
            *[storage.full_path(s.base_file.path) for s in based])
        gone = keys.select(F.col(KEY).alias("_k"), F.col(PART).alias(_OLD_PART),
                           F.substring_index(F.col("_hoodie_file_name"), "_", 1).alias(_OLD_FILE), F.lit(None).alias(_OLD_ORDER),
                           F.lit(True).alias(_GONE))
        index = index.unionByName(gone, allowMissingColumns=True)
    if small:
        # keep only the stored keys the batch has: a broadcast semi-join at the scan
        on = [index["_k"] == probe["_k"]] + ([index[_OLD_PART] == probe["_p"]] if opts.index == "partition" else [])
        index = index.join(F.broadcast(probe), on=on, how="left_semi")
    if based:  # a key live anywhere (its slice's merged rows included) is not tagged to where it was deleted too
        from pyspark.sql import Window

        live = Window.partitionBy("_k", _OLD_PART) if opts.index == "partition" else Window.partitionBy("_k")
        index = index.withColumn("_live", F.max((~F.col(_GONE)).cast("int")).over(live))
        index = index.where(~F.col(_GONE) | (F.col("_live") == 0)).drop("_live")
    cond = [df[KEY] == index["_k"]]
    if opts.index == "partition":
        cond.append(df[PART] == index[_OLD_PART])
    # a small batch's stored keys (about as many as the batch's) are broadcast to the batch's
    # tasks too: the join waits for no shuffle of theirs, and the batch keeps its partitioning
    return df.join(F.broadcast(index) if small else index, on=cond, how="left").drop("_k")


def _record_index_spec(table, timeline, opts: WriteOptions):
    """The record index (metadata_table.py keeps it in step) a global-index write asks which
    file groups hold a batch's keys (record_index.IndexSpec); None without one."""
    from runtime.table import metadata_table

    if opts.index != "global" or opts.buckets is not None or not metadata_table.keeps_record_index(table.config.properties or {}):
        return None
    return metadata_table.MetadataTable(table.storage, table.config.table_version).record_index_spec(timeline)


def _record_index_located(spark, spec, known: set[tuple[str, str]] | None, batch_rows: int | None):
    """How the global lookup asks the record index `spec` which file groups hold the batch's
    keys (tag_locations' `located`): the answer `_record_index_stays` got already, when it
    asked; None without a record index. A small batch's keys are looked up in one task."""
    if known is not None:
        return lambda keys: known
    if spec is None:
        return None
    one_task = batch_rows is not None and batch_rows <= _bloom_index.ONE_TASK_KEYS
    return lambda keys: _record_index.lookup(spark, spec, keys, one_task)


def _record_index_stays(spark, spec, rows, counts: dict[str, int], slices: list[FileSlice]) -> tuple[set[tuple[str, str]], bool]:
    """Asks the record index where the batch's keys are (one Spark job; a small batch's in one
    task, bloom_index.ONE_TASK_KEYS): the (partition, file id) of the groups holding any of
    them, and whether partition tasks may decide the write: no key is stored in another
    partition than the one it comes in, none comes in two, every group named is in the
    table's view, and each partition's groups found fit a task. The tasks then read the keys
    of those groups only (the record index names a key's group; a key it does not hold is
    new, as Java's RECORD_INDEX has it)."""
    from pyspark.sql import functions as F

    places, moves = _record_index.placed(spark, spec, rows.select(F.col(KEY).alias("_k"), F.col(PART).alias("_p")),
                                         sum(counts.values()) <= _bloom_index.ONE_TASK_KEYS)
    held = [s for s in slices if (s.partition, s.file_id) in places]
    stays = not moves and None not in counts and len(held) == len(places) and _partition_upsert.fits(counts, held)
    return places, stays


def drop_stale(df, config, present):
    """An incoming row older than the stored one is ignored (event-time ordering). `present`:
    the input's data columns."""
    from pyspark.sql import functions as F

    if not config.precombine_field or config.precombine_field not in present:
        return df  # deletes by key apply whatever the stored ordering value
    # a null ordering value loses, as it does within a batch
    newer_or_equal = F.col(_OLD_ORDER).isNull() | (F.col(f"`{config.precombine_field}`") >= F.col(_OLD_ORDER))
    return df.where(newer_or_equal)


_MOVE_IN = "_pipe_move_in"


def one_insert_per_key(df):
    """The global index's rule for a key stored in several partitions (which a partition-scoped
    writer leaves, e.g. Java's default SIMPLE index when a key's partition value changes), as
    Hudi's GLOBAL_SIMPLE index with hoodie.simple.index.update.partition.path=true: the key is
    updated where it is stored in its incoming partition, every other stored copy is deleted,
    and if none is in the incoming partition the key is inserted there once. Adds _MOVE_IN:
    true on the one row per key (of those tagged with a stored location) that inserts it."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    key = Window.partitionBy(KEY)
    stays = F.max(F.coalesce(F.col(_OLD_PART) == F.col(PART), F.lit(False))).over(key)
    first = F.col(_OLD_PART).eqNullSafe(F.min(F.col(_OLD_PART)).over(key))
    return df.withColumn(_MOVE_IN, ~stays & first)


# --- 3. assign_file_groups: file sizing for inserts -----------------------------------------


@dataclass(frozen=True)
class Bucket:
    partition: str
    file_id: str
    lo: float
    hi: float
    existing: FileSlice | None


def plan_buckets(insert_counts: dict[str, int], slices: list[FileSlice], opts: WriteOptions, record_size: int, new_id=new_file_id,
                 rewritten: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset()) -> list[Bucket]:
    """Inserts of each partition fill its small files (under small_file_limit) up to
    max_file_size first, then go to new file groups of max_file_size each (ids from
    `new_id`). `opts`: anything with max_file_size and small_file_limit. Small files among
    `rewritten` (partition, file id: the groups the batch's updates and deletes touch anyway)
    take inserts before the others, smallest first within each kind, so a batch of updates and
    inserts rewrites one group where Hudi's sizing (smallest first) would rewrite two."""
    record_size = max(1, record_size)
    per_file = max(1, opts.max_file_size // record_size)
    buckets: list[Bucket] = []
    for partition, count in sorted(insert_counts.items()):
        shares: list[tuple[str, int, FileSlice | None]] = []
        left = count
        # a merge-on-read slice with log files is not a small file: its base alone is stale
        # nor is a group under a pending compaction (a new base version would race its plan)
        small = sorted((s for s in slices if s.partition == partition and s.base_file is not None and not s.log_files
                        and s.pending_compaction is None and s.base_file.size < opts.small_file_limit),
                       key=lambda s: ((s.partition, s.file_id) not in rewritten, s.base_file.size))
        for s in small:
            if left <= 0:
                break
            room = max(0, (opts.max_file_size - s.base_file.size) // record_size)
            take = min(room, left)
            if take > 0:
                shares.append((s.file_id, take, s))
                left -= take
        while left > 0:
            take = min(per_file, left)
            shares.append((new_id(), take, None))
            left -= take
        lo = 0.0
        for i, (fid, take, existing) in enumerate(shares):
            hi = 1.0 if i == len(shares) - 1 else lo + take / count
            buckets.append(Bucket(partition, fid, lo, hi, existing))
            lo = hi
    return buckets


# assign_file_groups: up to this many buckets in a partition are chosen by a CASE
_ROUTE_BRANCHES = 32


def _map_literal(F, value: dict, ddl: str):
    """`value` as one literal of the query, of Spark type `ddl` (a map): folded once by the
    optimizer and referenced by the generated code, so a new value each write compiles nothing
    new; two py4j calls, however many entries."""
    import json

    return F.from_json(F.lit(json.dumps(value)), ddl)


def assign_file_groups(inserts, buckets: list[Bucket]):
    """Routes each insert to a bucket by a hash of its key (stable, and spread by weight). The
    buckets are a literal of the query (partition -> its buckets' upper bounds and file ids, in
    order), not a table joined in: a broadcast join would cost a Spark job of its own."""
    from pyspark.sql import functions as F

    by_partition: dict[str, list[dict]] = {}
    for b in buckets:  # a partition's buckets cover [0, 1) in order: the first whose hi exceeds h takes the row
        by_partition.setdefault(b.partition, []).append({"hi": b.hi, "f": b.file_id})
    routes = F.try_element_at(_map_literal(F, by_partition, "map<string,array<struct<hi:double,f:string>>>"), F.col(PART))
    h = F.pmod(F.xxhash64(F.col(KEY), F.col(_SEQ)), F.lit(1 << 30)) / float(1 << 30)
    most = max(len(v) for v in by_partition.values())
    if most > _ROUTE_BRANCHES:
        chosen = F.element_at(F.filter(routes, lambda b: h < b["hi"]), 1)["f"]
    else:
        # a CASE of `most` branches: the bounds stay in the literal, so the generated code is
        # the same for every write with as many buckets per partition and Spark compiles it once
        # (a lambda, or bounds written into the query, would be compiled anew each write)
        chosen = None
        for i in range(1, most + 1):
            bucket = F.try_element_at(routes, F.lit(i))
            chosen = (F if chosen is None else chosen).when(h < bucket["hi"], bucket["f"])
    return inserts.withColumn(FILE_ID, chosen).where(F.col(FILE_ID).isNotNull())


# --- 4. write_file_groups ----------------------------------------------------------------------


def route_to_buckets(inserts, to_buckets: dict[tuple[str, int], str]):
    """Routes each insert to the file group of its bucket (`to_buckets`: (partition, bucket)
    -> file id, a stored group's or a new one's), a literal of the query as in
    assign_file_groups."""
    from pyspark.sql import functions as F

    by_partition: dict[str, dict[str, str]] = {}
    for (p, b), fid in to_buckets.items():
        by_partition.setdefault(p, {})[str(b)] = fid
    routes = _map_literal(F, by_partition, "map<string,map<string,string>>")
    chosen = F.try_element_at(F.try_element_at(routes, F.col(PART)), F.col(_BUCKET).cast("string"))
    return inserts.withColumn(FILE_ID, chosen).where(F.col(FILE_ID).isNotNull()).drop(_BUCKET)


def write_file_groups(storage, rows, spec: FileWriteSpec):
    """Executors write every file group's new base file (or, for the spec's `log_groups`, a new
    log file of its slice) on `storage`, the table's; returns the stats rows."""

    def run(batches):
        return write_task(spec, batches)

    written = rows.mapInArrow(run, STATS_SCHEMA).collect()
    _bloom_index.remember(storage, written)
    return written


def file_write_spec(storage, instant: str, data_columns: list[str], opts: WriteOptions, mode: str, merge: bool = False,
                    base_files: dict[str, str] | None = None, log_groups: dict[str, LogTarget] | None = None, log_schema: str = "",
                    ordering_field: str | None = None, merge_spec=None, derived: Derived | None = None,
                    cdc: tuple[str | None, str] = (None, "")) -> FileWriteSpec:
    """What the write tasks need (files.FileWriteSpec) for a write of `opts` to `storage`."""
    return FileWriteSpec(
        storage_uri=storage.spec.uri,
        storage_options=storage.spec.options,
        instant=instant,
        data_columns=tuple(data_columns),
        mode=mode,
        merge=merge,
        base_files=dict(base_files or {}),
        max_file_size=opts.max_file_size,
        log_groups=dict(log_groups or {}),
        log_schema=log_schema,
        ordering_field=ordering_field,
        merge_spec=merge_spec,
        derived=derived,
        log_inserts=opts.buckets is not None,
        cdc_mode=cdc[0],
        cdc_schema=cdc[1],
    )


# --- the write path, top to bottom -----------------------------------------------------------


@dataclass
class StagedWrite:
    """What a write produced before its commit: files and counts, for commit()."""

    stats: list[Any]  # WriteStat
    counts: WriteCounts
    schema_json: str
    struct: Any  # the table's Spark schema after this write (data columns only)
    replaced: dict[str, list[str]] | None = None  # replacecommits: partition -> replaced file ids
    # merge-on-read: (partition, log file name prefix up to the version) of every log file
    # this write adds; another file with that prefix is a retried task's leftover
    log_prefixes: set[tuple[str, str]] = field(default_factory=set)
    # upserts, inserts and deletes: the keys whose location this write changes, for a record
    # index (record_index.write_delta): `_k`, `_pipe_part`, `_pipe_file` (null: the key left
    # the table). A lazy DataFrame, computed only for a table that keeps one
    index_changes: Any = None


def write(spark, table, df, opts: WriteOptions, instant: str, timeline, slices: list[FileSlice], stored_struct) -> StagedWrite:
    """Runs steps 0-5 for `instant` (already requested and inflight) and returns what to commit."""
    config = table.config
    if not (opts.tombstone_days and config.precombine_field and config.record_key_fields and df is not None
            and config.precombine_field in df.columns and opts.operation in ("upsert", "delete", "insert_overwrite_table")):
        return _write(spark, table, df, opts, instant, timeline, slices, stored_struct)
    # deletes that stay deleted: incoming rows older than their key's tombstone are dropped,
    # and this batch's deletes leave tombstones, written with the instant's files. A full
    # replacement reads the whole input again: it starts the tombstones afresh.
    from pyspark.sql import functions as F

    prepare(df, config, opts)  # the input's columns are checked before they are used here
    columns = {_TOMB_KEY: _keygen.key_expr(F, config, dict(df.dtypes))}
    if opts.index == "partition":
        columns[_TOMB_PART] = _keygen.partition_expr(F, config, dict(df.dtypes))
    keyed = df.withColumns(columns).withColumn(_TOMB_DELETE, _delete_flag(F, df.columns, opts))
    keyed = spark_api.local_checkpoint(keyed, eager=False)  # the input is read once: filtered, written, its deletes kept
    if opts.operation != "insert_overwrite_table":
        keyed = _tombstones.drop_older_than_tombstones(spark, table.storage, timeline, keyed, list(columns), config.precombine_field,
                                                       opts.tombstone_days)
    staged = _write(spark, table, keyed.drop(*columns, _TOMB_DELETE), opts, instant, timeline, slices, stored_struct)
    _tombstones.write(table.storage, instant, keyed, list(columns), config.precombine_field, F.col(_TOMB_DELETE))
    return staged


_TOMB_KEY, _TOMB_PART, _TOMB_DELETE = "_pipe_tomb_key", "_pipe_tomb_part", "_pipe_tomb_delete"


def _write(spark, table, df, opts: WriteOptions, instant: str, timeline, slices: list[FileSlice], stored_struct) -> StagedWrite:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from runtime.table.schema import merge_schemas

    config, storage = table.config, table.storage
    if opts.operation == "delete_partition":
        return _delete_partitions(table, opts, slices, stored_struct)
    protected = tuple(config.record_key_fields) + tuple(config.partition_fields) + ((config.precombine_field,) if config.precombine_field else ())
    incoming_struct = T.StructType([f for f in df.schema.fields if f.name != IS_DELETED])
    if opts.operation == "delete":
        struct = stored_struct or incoming_struct
    elif opts.operation == "insert_overwrite_table":
        struct = incoming_struct  # no stored row stays visible: the input's schema becomes the table's
    else:
        try:
            struct = merge_schemas(stored_struct, incoming_struct, protected) if stored_struct is not None else incoming_struct
        except SchemaChangeError as exc:
            raise WriteError(str(exc)) from exc
    data_columns = [f.name for f in struct.fields]
    # the input's data columns: known here, so that no later DataFrame's columns are asked of
    # the server (a round trip, and an analysis of its whole plan, each time)
    present = frozenset(f.name for f in incoming_struct.fields)

    bucketed = opts.buckets is not None
    if bucketed:
        refused = _bucket_index.bucket_reason(config) or (
            f"{opts.operation} writes new file groups of its own" if opts.operation in REPLACE_OPERATIONS and opts.operation != "delete_partition" else None)
        if refused:
            raise WriteError(f"table {config.name} has Hudi's bucket index, and pipe does not write into it this way: {refused}")
        opts = replace(opts, index="partition")  # a key is unique within its partition, where its bucket is
    rows = prepare(df, config, opts)
    if opts.operation == "bulk_insert":
        return _bulk_insert(spark, table, rows, opts, instant, struct, data_columns, present)
    if opts.operation in REPLACE_OPERATIONS:  # its rows are materialised first, then checked and counted at once
        return _overwrite(spark, table, rows, opts, instant, timeline, slices, struct, data_columns, present)
    batch_rows, partitions, key_range = None, None, None
    by_partition = None  # rows per partition, when partition tasks may decide the write (each small enough for one: partition_upsert.fits)
    ri_spec, located_groups = None, None  # a record index, and the groups it holds the batch's keys in (when asked)
    bloom_known = None  # the files whose bloom filters may hold a key of the batch, when _keys_stay_put asked them
    if config.record_key_fields:
        # the batch is computed once, by the first job that reads it (the summary below): the
        # lookup and the write read it again (its `_pipe_seq` numbers stay the same too)
        prepared, rows = rows, spark_api.local_checkpoint(rows, eager=False)
        # a batch of one partition (a small one, often) is summed up with no shuffle, a Spark
        # job fewer (only there: a window or a join over it still spreads over the cores)
        summed = rows.coalesce(1) if spark_api.checkpoint_partitions(rows) == 1 else rows
        # metadata: the batch's size, its null keys and, for a partition-scoped lookup, its rows per partition
        ordering = _null_ordering(config, opts, present)
        null_order = F.count_if(F.col(f"`{ordering}`").isNull()) if ordering else F.lit(0)
        # and the batch's key range (per partition for a partition-scoped lookup), which
        # prunes the stored files the lookup reads (bloom_index)
        low, high = _bloom_index.batch_range_columns(F, F.col(KEY))
        # a global upsert counts per partition too: its partitions' key ranges may show that no
        # key can be anywhere else (_keys_stay_put)
        # (with a record index, the index says where each key is: _record_index_stays)
        ri_spec = _record_index_spec(table, timeline, opts)  # (read once: the lookup below asks it too)
        may_stay_put = opts.index == "global" and opts.operation in ("upsert", "delete") and not bucketed and \
            (ri_spec is not None or not _metadata_table.keeps_record_index(config.properties or {}))
        if opts.index == "partition" or may_stay_put:
            per_partition = {p: (n, nulls, no, lo, hi)
                             for p, n, nulls, no, lo, hi in summed.groupBy(PART).agg(F.count(F.lit(1)), F.count_if(F.col(KEY).isNull()), null_order, low, high).collect()}
            counts = {p: n for p, (n, *_) in per_partition.items()}
            batch_rows, null_keys = sum(counts.values()), sum(v[1] for v in per_partition.values())
            null_orders = sum(v[2] for v in per_partition.values())
            key_range = {p: _key_range(lo, hi) for p, (_, _, _, lo, hi) in per_partition.items()}
            if opts.index == "partition":
                partitions = counts
                by_partition = counts if _partition_upsert.fits(counts, slices) else None
        else:
            batch_rows, null_keys, null_orders, lo, hi = summed.select(F.count(F.lit(1)), F.count_if(F.col(KEY).isNull()), null_order, low, high).first()
            key_range = {None: _key_range(lo, hi)}
        _refuse_nulls(config, prepared, ordering, null_keys, null_orders)  # (which still knows the rows' files)
        if may_stay_put and ri_spec is not None:
            located_groups, ri_stays = _record_index_stays(spark, ri_spec, rows, counts, slices)
            if ri_stays:
                by_partition = counts
        elif may_stay_put and opts.index != "partition":
            probe = rows.select(F.col(KEY).alias("_k"), F.col(PART).alias("_p")) if batch_rows <= BROADCAST_KEYS else None
            one_task = probe is not None and batch_rows <= _bloom_index.ONE_TASK_KEYS
            if one_task:
                probe = probe.coalesce(1)  # (one task sees every key: no shuffle by key)
            stays, bloom_known = _keys_stay_put(storage, slices, key_range, probe, timeline, one_task) \
                if _partition_upsert.fits(counts, slices) else (False, None)
            if stays:
                by_partition = counts
            else:  # the general path's global lookup: one range
                known = [r for r in key_range.values() if r is not None]
                key_range = {None: (min(r[0] for r in known), max(r[1] for r in known)) if known else None}

    keyed = bool(config.record_key_fields)
    if not bucketed and opts.operation in ("upsert", "delete") and by_partition is not None:
        return _upsert_by_partition(spark, table, rows, opts, instant, timeline, slices, struct, stored_struct, data_columns, by_partition,
                                    present, located_groups)
    one_task = batch_rows is not None and batch_rows <= ONE_TASK_ROWS
    if one_task:
        # a small batch (computed, in parallel, by the summary above) read as one partition:
        # the windows below (deduplication, a key's one insert) and the summary of what it
        # changes need no shuffle, each a Spark job, of their own
        rows = rows.coalesce(1)
    batch = rows  # the batch's keys, before the window that deduplicates them
    if keyed and (opts.operation in ("upsert", "delete") or opts.combine_before_insert):
        rows = dedupe(rows, config, opts, present)
    lookup = keyed and (opts.operation in ("upsert", "delete") or opts.insert_duplicates != "none")
    if lookup:
        merged = None
        if config.table_type == MERGE_ON_READ and stored_struct is not None:
            # only the meta columns and the precombine field are read and merged
            narrow = with_meta_struct(T.StructType([f for f in stored_struct.fields if f.name == config.precombine_field]))

            def merged(with_logs):  # what tag_locations indexes by: key, partition, file name, ordering value
                return _reader.read_merged_slices(spark, storage, narrow, timeline, config, with_logs, None, None,
                                                  output=[f.name for f in narrow.fields if f.name in (KEY, PART, "_hoodie_file_name")
                                                          or f.name == config.precombine_field])
        rows = tag_locations(spark, rows, config, opts, slices, storage, batch_rows, set(partitions) if partitions is not None else None, merged,
                             stored_struct, probe=batch, key_range=key_range, located=_record_index_located(spark, ri_spec, located_groups, batch_rows),
                             bloom_known=bloom_known)
        rows = rows.where(~(F.col(_DELETE) & F.coalesce(F.col(_GONE), F.lit(False)))).drop(_GONE)  # deleting a deleted key changes nothing
    else:
        rows = rows.select("*", F.lit(None).cast("string").alias(_OLD_PART), F.lit(None).cast("string").alias(_OLD_FILE), F.lit(None).alias(_OLD_ORDER))
    if opts.operation == "insert" and opts.insert_duplicates == "fail":
        clash = rows.where(F.col(_OLD_FILE).isNotNull()).select(KEY).limit(5).collect()
        if clash:
            raise WriteError(f"insert_duplicates: fail, and these keys are already in the table: {', '.join(r[0] for r in clash)}")
    if opts.operation == "insert" and opts.insert_duplicates == "drop":
        rows = rows.where(F.col(_OLD_FILE).isNull())
    if opts.operation in ("upsert", "delete"):
        rows = drop_stale(rows, config, present)
    scattered = lookup and opts.index != "partition"  # a key may be stored in several partitions
    if scattered:
        rows = one_insert_per_key(rows)
    if bucketed:  # an insert goes to its bucket's file group (Java's BucketIdentifier)
        rows = rows.withColumn(_BUCKET, _bucket_index.bucket_expr(F, config, opts.buckets, F.col(KEY)))
    # one materialised batch, computed by the summary below: later steps must see the same rows
    rows = spark_api.local_checkpoint(rows, eager=False)
    if one_task:  # (Spark does not know the checkpoint is one partition: the summary would shuffle)
        rows = rows.coalesce(1)

    same_place = F.col(_OLD_FILE).isNotNull() & ((F.col(_OLD_PART) == F.col(PART)) | F.col(PART).isNull())
    moved = F.col(_OLD_FILE).isNotNull() & F.col(PART).isNotNull() & (F.col(_OLD_PART) != F.col(PART))
    is_insert = (F.col(_OLD_FILE).isNull() | (moved & (F.col(_MOVE_IN) if scattered else F.lit(True)))) & ~F.col(_DELETE)
    # metadata only: inserts per partition, and the stored file groups the batch touches
    insert_counts: dict[str, int] = {}
    touched: set[tuple[str, str]] = set()
    to_buckets: dict[tuple[str, int], str] = {}  # bucket index: (partition, bucket) -> file id of the inserts
    bucket = F.when(is_insert, F.col(_BUCKET)) if bucketed else F.lit(None).cast("int")
    unsure = F.count_if(is_insert & _bucket_index.value_reason_expr(F, config, F.col(KEY))) if bucketed else F.lit(0)
    summary = rows.groupBy(F.when(is_insert, F.col(PART)).alias("ip"), bucket.alias("ib"), F.col(_OLD_PART), F.col(_OLD_FILE)).agg(
        F.count_if(is_insert), unsure).collect()
    stored_buckets = {(s.partition, _bucket_index.bucket_of(s.file_id)): s.file_id for s in slices} if bucketed else {}
    bad = sum(row[5] for row in summary)
    if bad:
        example = rows.where(is_insert & _bucket_index.value_reason_expr(F, config, F.col(KEY))).select(KEY).first()[0]
        sign = "':'" if len(config.record_key_fields) == 1 else "','"
        raise WriteError(f"table {config.name} has Hudi's bucket index, and {bad} new key(s) hold a {sign} in a key value "
                         f"(e.g. {example!r}), which Hudi 0.15 and 1.1 take apart differently, so their bucket is not certain: "
                         f"leave {sign} out of key values in the table's SQL (e.g. replace(...))")
    for ip, ib, op, of, i, _ in summary:
        if ip is not None:
            insert_counts[ip] = insert_counts.get(ip, 0) + i
            if bucketed:
                to_buckets[(ip, ib)] = stored_buckets.get((ip, ib)) or to_buckets.get((ip, ib)) or _bucket_index.new_file_id(ib)
        if of is not None:
            touched.add((op, of))

    in_place = rows.where(same_place).select(
        *[F.col(f"`{c}`") for c in data_columns if c in present], KEY,
        F.col(_OLD_PART).alias(PART), F.col(_OLD_FILE).alias(FILE_ID),
        F.when(F.col(_DELETE), "D").otherwise("U").alias(_KIND))
    # a key whose partition changed leaves its old file group and is inserted in the new one
    moved_out = rows.where(moved).select(KEY, F.col(_OLD_PART).alias(PART), F.col(_OLD_FILE).alias(FILE_ID), F.lit("D").alias(_KIND))
    changes = in_place.unionByName(moved_out, allowMissingColumns=True)
    if bucketed:
        receiving = {(p, fid) for (p, _), fid in to_buckets.items()}
        routed = route_to_buckets(rows.where(is_insert), to_buckets)
    else:
        buckets = plan_buckets(insert_counts, slices, opts, table.record_size_estimate(opts.record_size_estimate, timeline), rewritten=touched)
        receiving = {(b.partition, b.file_id) for b in buckets}
        routed = assign_file_groups(rows.where(is_insert), buckets) if buckets else None
    if routed is not None:
        changes = changes.unionByName(routed.select(*[F.col(f"`{c}`") for c in data_columns if c in present], KEY, PART, FILE_ID, F.lit("I").alias(_KIND)),
                                      allowMissingColumns=True)

    # file groups to rewrite: those with updates or deletes, and small files (or buckets) taking inserts
    groups = touched | receiving
    if not groups:
        return StagedWrite([], WriteCounts(), avro_schema_json(struct, config.name), struct)
    existing = {(s.partition, s.file_id): s for s in slices}
    merge = keyed and opts.operation != "insert"
    # merge-on-read: updates and deletes of a group go to a new log file of its slice, except
    # in small files taking inserts, which are rewritten like copy-on-write (as Hudi does)
    # (a bucket's stored group takes its inserts in the log too, as Java's bucket index does)
    logged = groups if bucketed else touched - receiving
    log_groups = (_log_targets(logged, existing, _log_named_by(timeline, instant))
                  if config.table_type == MERGE_ON_READ and (merge or bucketed) else {})
    n = max(1, min(len(groups), spark_api.default_parallelism(spark) * 4))
    staged = _write_changes(spark, table, timeline, changes, instant, struct, data_columns, opts, existing, groups, log_groups, merge, n, present)
    # inserts (moves in) name the key's new place, deletes (moves out) its leaving; an update
    # stays where the index has it (with a record index the lookup tags no key to a group whose
    # log deleted it, tag_locations), except the copy that stays when other copies of its key
    # leave (a key stored in several partitions): it names the key's place. Upserts win.
    leaving = changes.where(F.col(_KIND) == "D").select(KEY)
    stays = changes.where(F.col(_KIND) == "U").join(leaving, KEY, "left_semi")
    moved = changes.where(F.col(_KIND) != "U").unionByName(stays)
    staged.index_changes = moved.select(
        F.col(KEY).alias("_k"), F.when(F.col(_KIND) != "D", F.col(PART)).alias("_pipe_part"),
        F.when(F.col(_KIND) != "D", F.col(FILE_ID)).alias("_pipe_file"))
    return staged


def _write_changes(spark, table, timeline, changes, instant: str, struct, data_columns: list[str], opts: WriteOptions,
                   existing: dict[tuple[str, str], FileSlice], groups, log_groups: dict[str, LogTarget], merge: bool, tasks: int,
                   present) -> StagedWrite:
    """Step 4 of an upsert, insert or delete: `changes` (rows with their file id and kind) are
    shuffled, every file group to one task, and written; `groups` are the stored groups
    (partition, file id) the tasks may rewrite, `log_groups` the merge-on-read groups whose
    updates and deletes go to a log file instead; `present`: the data columns `changes` has.
    Returns what to commit."""
    from pyspark.sql import functions as F

    changes = changes.select(*_data_select(F, present, struct, data_columns), KEY, PART, FILE_ID, _KIND)
    changes = _in_turns(F, changes, FILE_ID, sorted({fid for _, fid in groups}), tasks).sortWithinPartitions(FILE_ID, KEY)
    written = write_file_groups(table.storage, changes, _groups_spec(table, timeline, instant, struct, data_columns, opts, existing, groups, log_groups, merge))
    return _staged(table, written, instant, struct, existing, log_groups)


def _groups_spec(table, timeline, instant: str, struct, data_columns: list[str], opts: WriteOptions, existing: dict[tuple[str, str], FileSlice],
                 groups, log_groups: dict[str, LogTarget], merge: bool) -> FileWriteSpec:
    """What the tasks rewriting `groups` need. Each task reads the base files of the groups it
    rewrites itself (Hudi's merge handle): only the incoming rows are shuffled."""
    config, storage = table.config, table.storage
    base_files = {f"{p}/{fid}": existing[(p, fid)].base_file.path for (p, fid) in groups
                  if (p, fid) in existing and existing[(p, fid)].base_file is not None}
    return file_write_spec(storage, instant, data_columns, opts, "groups", merge=merge, base_files=base_files,
                           log_groups=log_groups, log_schema=avro_schema_json(struct, config.name, meta=True),
                           ordering_field=config.precombine_field if log_groups and config.read_merge_mode() == EVENT_TIME else None,
                           merge_spec=_reader.merge_spec(storage, with_meta_struct(struct), timeline, config) if log_groups else None,
                           cdc=cdc_spec(config, struct))


def cdc_spec(config, struct) -> tuple[str | None, str]:
    """A CDC-enabled table's supplemental-logging mode and its CDC records' schema (cdc_log.py),
    or (None, "")."""
    import json

    from runtime.table import cdc_log

    mode = cdc_log.mode_of(config.properties or {})
    if mode is None:
        return None, ""
    return mode, json.dumps(cdc_log.schema(mode, json.loads(avro_schema_json(struct, config.name))), separators=(",", ":"))


def _staged(table, written, instant: str, struct, existing: dict[tuple[str, str], FileSlice], log_groups: dict[str, LogTarget]) -> StagedWrite:
    """The write stats and counts of the files groups-mode tasks wrote (their stats rows)."""
    from runtime.table import cdc_log
    from runtime.table.timeline import WriteStat

    config, storage = table.config, table.storage
    stats, counts = [], WriteCounts()
    cdc_on = cdc_log.mode_of(config.properties or {}) is not None
    for fid, part, path, nrows, size, i, u, d, *rest in written:
        if not path:  # every row of the group was deleted: an empty base file hides its old rows
            path, size = write_empty_base_file(storage, part, fid, instant, struct)
        prev = existing[(part, fid)].base_instant if (part, fid) in existing else "null"
        target = log_groups.get(f"{part}/{fid}")
        if target is not None and not path.endswith(".parquet"):
            stats.append(_log_stat(existing[(part, fid)], target, path, i, u, d, size, cdc=cdc_on))
        else:
            cdc_path, _, cdc_size = (rest[0] if rest else "").partition("\t")  # "<path>\t<size>" of its .cdc file
            cdc_stats = {cdc_path: int(cdc_size)} if cdc_path else None
            stats.append(WriteStat(fid, path, part, prev, nrows, i, u, d, size, cdc_stats=cdc_stats))
        counts.inserts += i
        counts.updates += u
        counts.deletes += d
        counts.files += 1
        counts.bytes += size
    # a retried task's leftover logs: only in the groups this write wrote a log for
    written_groups = {f"{s.partition_path}/{s.file_id}" for s in stats}
    prefixes = {(key.rsplit("/", 1)[0], _log_prefix(key.rsplit("/", 1)[1], t)) for key, t in log_groups.items() if key in written_groups}
    return StagedWrite(stats, counts, avro_schema_json(struct, config.name), struct, log_prefixes=prefixes)


def _in_turns(F, df, column: str, values: list[str], tasks: int):
    """`df` shuffled into `tasks` partitions, all rows of a `column` value in one. Hashing the
    value alone can put two of a few file groups (or table partitions) in one task, which then
    works through them one after the other while a core idles; so each of `values` (those
    known on the driver) gets a number that Spark's hash partitioning sends to the next task
    in turn (`spread_values`). Beyond _SPREAD_GROUPS values, and for a value not among them,
    Spark's hash decides."""
    if not values or len(values) > _SPREAD_GROUPS:
        return df.repartition(tasks, column)
    numbers = spread_values(tasks)
    # one literal instead of two py4j calls per value
    turns = _map_literal(F, {v: numbers[i % tasks] for i, v in enumerate(values)}, "map<string,int>")
    return df.repartition(tasks, F.coalesce(F.try_element_at(turns, F.col(column)), F.hash(F.col(column))))


def spread_values(tasks: int) -> list[int]:
    """For each task number t, the least int whose Spark hash partition among `tasks` is t:
    HashPartitioning takes pmod(Murmur3 hash of the value with seed 42, tasks)."""
    found: dict[int, int] = {}
    v = 0
    while len(found) < tasks:
        found.setdefault(_murmur3_int(v) % tasks, v)
        v += 1
    return [found[t] for t in range(tasks)]


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's Murmur3_x86_32.hashInt(value, seed), as a signed 32-bit int."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k = (value & mask) * 0xCC9E2D51 & mask
    k = rotl(k, 15) * 0x1B873593 & mask
    h = rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & mask
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & mask
    h ^= h >> 13
    h = h * 0xC2B2AE35 & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def _upsert_by_partition(spark, table, rows, opts: WriteOptions, instant: str, timeline, slices: list[FileSlice], struct, stored_struct,
                         data_columns: list[str], partitions: dict[str, int], present, located: set[tuple[str, str]] | None = None) -> StagedWrite:
    """An upsert or delete with `index: partition`, or with the global index when its keys stay
    put (_keys_stay_put, or _record_index_stays: `located`, the groups the table's record index
    holds the batch's keys in), whose partitions each fit a task (partition_upsert.py):
    deduplication, lookup, stale rows and insert routing happen in one task per partition,
    which then writes the file groups it touched. With a record index the tasks read only the
    `located` groups' keys, and the keys they insert and delete are the index's changes."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    config = table.config
    mine = [s for s in slices if s.partition in partitions]
    ordering = config.precombine_field if config.precombine_field and config.precombine_field in present else None
    # stored keys are read with the meta columns and the precombine field only
    narrow = with_meta_struct(T.StructType([f for f in (stored_struct or struct).fields if f.name == config.precombine_field]))
    tag_spec = _partition_upsert.TagSpec(
        instant=instant,
        slices={p: tuple(s for s in mine if s.partition == p) for p in partitions},
        stored=_reader.merge_spec(table.storage, narrow, timeline, config),
        ordering_field=ordering,
        max_file_size=opts.max_file_size,
        small_file_limit=opts.small_file_limit,
        record_size=table.record_size_estimate(opts.record_size_estimate, timeline),
        lookup=frozenset(located) if located is not None else None,
        index_changes=located is not None,
    )
    existing = {(s.partition, s.file_id): s for s in mine}
    log_groups = _log_targets(set(existing), existing, _log_named_by(timeline, instant)) if config.table_type == MERGE_ON_READ else {}
    tasks, threads = _partition_tasks(spark, len(partitions))
    incoming = rows.select(*_data_select(F, present, struct, data_columns), KEY, PART, _DELETE, _SEQ)
    # (`rows` is materialised, by the summary that counted its partitions: one task reads it
    # with no shuffle, a Spark job fewer)
    incoming = (incoming.coalesce(1) if tasks == 1 else _in_turns(F, incoming, PART, sorted(partitions), tasks)).sortWithinPartitions(PART)
    if threads is None:  # the groups of a partition are written by write tasks all over the cluster
        out = T.StructType(list(struct.fields) + [T.StructField(c, T.StringType(), True) for c in (KEY, PART, _KIND, FILE_ID)])
        changes = incoming.mapInArrow(lambda batches: _partition_upsert.tag_task(tag_spec, batches), out)
        if located is not None:  # the index's changes are read from the rows the write read
            changes = spark_api.local_checkpoint(changes, eager=False)
        staged = _write_changes(spark, table, timeline, changes, instant, struct, data_columns, opts, existing, set(existing), log_groups, True,
                                max(1, min(len(mine) + len(partitions), spark_api.default_parallelism(spark) * 4)), set(data_columns))
        index_changes = None
        if located is not None:
            inserted = F.col(_KIND) == "I"
            index_changes = changes.where(F.col(_KIND) != "U").select(
                F.col(KEY).alias("_k"), F.when(inserted, F.col(PART)).alias("_pipe_part"), F.when(inserted, F.col(FILE_ID)).alias("_pipe_file"))
    else:
        write_spec = _groups_spec(table, timeline, instant, struct, data_columns, opts, existing, set(existing), log_groups, True)
        if located is None:
            written = incoming.mapInArrow(lambda batches: _partition_upsert.tag_and_write_task(tag_spec, write_spec, threads, batches),
                                          STATS_SCHEMA).collect()
            index_changes = None
        else:  # the tasks' output, stats rows and the index's changes, kept: the first job writes, the next read it
            index = ", ".join(f"{c} string" for c in _partition_upsert.INDEX_COLUMNS)
            out = spark_api.local_checkpoint(incoming.mapInArrow(
                lambda batches: _partition_upsert.tag_and_write_task(tag_spec, write_spec, threads, batches), f"{STATS_SCHEMA}, {index}"), eager=False)
            written = out.where(F.col("_k").isNull()).drop(*_partition_upsert.INDEX_COLUMNS).collect()
            index_changes = out.where(F.col("_k").isNotNull()).select(*_partition_upsert.INDEX_COLUMNS)
        _bloom_index.remember(table.storage, written)
        staged = _staged(table, written, instant, struct, existing, log_groups)
    # (an index change is a key inserted or deleted: the stats count them)
    staged.index_changes = index_changes if index_changes is None or staged.counts.inserts or staged.counts.deletes else _record_index.NO_CHANGES
    return staged


# A partition task writes at most this many file groups at once: several steps of a run may
# upsert at the same time, each with its own tasks, and each group holds a row group in memory.
MAX_GROUP_THREADS = 4


def _partition_tasks(spark, partitions: int) -> tuple[int, int | None]:
    return partition_tasks(spark_api.master(spark), spark_api.default_parallelism(spark),
                           spark_api.setting(spark, "spark.executor.pyspark.memory"), partitions)


def partition_tasks(master: str, parallelism: int, python_memory: str | None, partitions: int) -> tuple[int, int | None]:
    """How many partition tasks take a batch of `partitions` table partitions (one per
    partition, up to 4 per core), and how many file groups each writes at once: None when
    they should leave the writing to write tasks after a shuffle by file id.

    A local master's one executor has all its cores. Tasks fewer than cores write groups on
    threads, up to MAX_GROUP_THREADS (one when spark.executor.pyspark.memory caps each Python
    worker). Partitions more than cores, but fewer than twice as many, go to one task per
    core, each writing its partitions' groups on two threads: 3 partitions on 2 cores are then
    written at once, the cores shared, instead of two and then the third while a core idles
    (pyarrow's reading, merging and encoding run outside the GIL); at most twice as many
    groups as cores are held at once. On a cluster, as many tasks as cores write their groups
    themselves; fewer would leave executors idle while one of them rewrites a partition's
    groups one after the other."""
    from runtime.spark.settings import local_cores

    tasks = max(1, min(partitions, parallelism * 4))
    if not master.startswith("local"):
        return tasks, (1 if tasks >= parallelism else None)
    cores = local_cores(master)
    if python_memory:
        return tasks, 1
    if tasks <= cores:
        return tasks, max(1, min(MAX_GROUP_THREADS, cores // tasks))
    if partitions < 2 * cores:
        return cores, 2
    return tasks, 1


def _log_named_by(timeline, instant: str) -> str | None:
    """The instant a new log file is named with in timeline layout 2 (table versions 8 and 9):
    the deltacommit writing it, as Hudi 1.x names logs; None in layout 1 (the slice's)."""
    return instant if timeline.layout >= 2 else None


def _log_targets(groups, existing: dict[tuple[str, str], FileSlice], named_by: str | None = None) -> dict[str, LogTarget]:
    """The next log file of each group's latest slice (versions continue the slice's logs).
    A group under a pending compaction gets a log named with the compaction's instant, as
    Java's writers name it (HoodieAppendHandle, table version 6): when that compaction
    completes, its new base file and these logs make the group's latest slice. In table
    versions 8 and 9 every log is named with the deltacommit writing it (`named_by`), version
    1: readers put it in the slice by that deltacommit's completion time (layout.py)."""
    out = {}
    for p, fid in groups:
        s = existing.get((p, fid))
        if s is None:
            continue
        named = named_by or _log_base_instant(s)
        version = max((lf.version for lf in s.log_files if lf.base_instant == named), default=0) + 1
        base = s.base_file
        out[f"{p}/{fid}"] = LogTarget(base.path if base else None, base.size if base else 0, named, version,
                                      tuple(lf.path for lf in s.log_files))
    return out


def _log_base_instant(s: FileSlice) -> str:
    return s.pending_compaction or s.base_instant


def _log_prefix(file_id: str, target: LogTarget) -> str:
    return f".{file_id}_{target.base_instant}.log.{target.version}_"


def _log_stat(slice_: FileSlice, target: LogTarget, path: str, inserts: int, updates: int, deletes: int, size: int, cdc: bool = False):
    """The write stat of a new log file (Hudi's delta write stat: base file and every log file
    of the slice, this one last). On a CDC-enabled table of version 8 or 9 too, as Java 1.1
    writes it there: its CDC reader rebuilds the slice before the commit from that list."""
    from runtime.table.timeline import WriteStat

    name = path.rsplit("/", 1)[-1]
    named = _log_base_instant(slice_)
    if target.base_instant != named and cdc:
        base = slice_.base_file.name if slice_.base_file and slice_.pending_compaction is None else ""
        return WriteStat(slice_.file_id, path, slice_.partition, slice_.base_instant, updates, inserts, updates, deletes, size,
                         base_file=base, log_files=tuple(lf.name for lf in slice_.log_files) + (name,), log_version=target.version)
    if target.base_instant != named:  # table versions 8 and 9: as Hudi 1.x's append handle has it
        return WriteStat(slice_.file_id, path, slice_.partition, target.base_instant, updates, inserts, updates, deletes, size,
                         base_file="", log_files=(name,), log_version=target.version)
    logs = tuple(lf.name for lf in slice_.log_files if lf.base_instant == named) + (name,)
    base = slice_.base_file.name if slice_.base_file and slice_.pending_compaction is None else ""  # the compaction's base is not written yet
    return WriteStat(slice_.file_id, path, slice_.partition, named, updates, inserts, updates, deletes, size,
                     base_file=base, log_files=logs, log_version=target.version)


def write_empty_base_file(storage, partition: str, file_id: str, instant: str, struct) -> tuple[str, int]:
    """A base file with the table's columns and no rows: the new version of a file group whose
    every row this write deleted or moved away (Hudi's merge handle writes the same)."""
    import io

    import pyarrow.parquet as pq

    from runtime.table.bloom import BloomFilterWriteSupport

    schema = arrow_schema(with_meta_struct(struct))
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema) as out:
        out.write_table(schema.empty_table())
        out.add_key_value_metadata(BloomFilterWriteSupport().finalize_metadata())  # an empty filter, no key range
    name = f"{file_id}_0-0-0_{instant}.parquet"
    path = f"{partition}/{name}" if partition else name
    markers.create(storage, instant, path, markers.CREATE)
    storage.write_atomic(path, buf.getvalue())
    return path, len(buf.getvalue())


def with_meta_struct(struct):
    from pyspark.sql import types as T

    return T.StructType([T.StructField(c, T.StringType(), True) for c in META_COLUMNS] + list(struct.fields))


def _bulk_insert(spark, table, rows, opts: WriteOptions, instant: str, struct, data_columns: list[str], present) -> StagedWrite:
    from pyspark.sql import functions as F

    config = table.config
    rows = rows.where(~F.col(_DELETE))  # a delete has nothing to insert
    if opts.combine_before_insert and config.record_key_fields:
        rows = dedupe(rows, config, opts, present)
    mode = opts.bulk_insert_sort_mode
    if mode == "GLOBAL_SORT":
        rows = rows.orderBy(PART, KEY)
    elif mode == "PARTITION_SORT":
        rows = rows.sortWithinPartitions(PART, KEY)
    derived = _derived(config, struct) if mode == "NONE" else None
    shipped = [c for c, computed in ((KEY, derived and derived.key_field), (PART, derived and derived.partition_fields is not None)) if not computed]
    out = rows.select(*_data_select(F, present, struct, data_columns), *shipped)
    stats, counts = _new_file_stats(write_file_groups(table.storage, out, file_write_spec(table.storage, instant, data_columns, opts, "bulk", derived=derived)))
    return StagedWrite(stats, counts, avro_schema_json(struct, config.name), struct)


def _derived(config, struct) -> Derived | None:
    """Which of the record key and the partition path bulk tasks can compute themselves
    (files.Derived): a single key column of an integer or string type; partition columns of
    integer, string, date or boolean types (pyarrow's text of those is Spark's)."""
    from pyspark.sql import types as T

    def typed(name, *types):
        return name in struct.fieldNames() and isinstance(struct[name].dataType, types)

    integer_or_string = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.StringType)
    keys = config.record_key_fields
    key_field = keys[0] if len(keys) == 1 and typed(keys[0], *integer_or_string) else None
    partitions = tuple(config.partition_fields) if all(typed(f, *integer_or_string, T.DateType, T.BooleanType) for f in config.partition_fields) else None
    if key_field is None and partitions is None:
        return None
    encoded = frozenset(f for f in config.partition_fields if config.url_encode and isinstance(struct[f].dataType, T.StringType)) if partitions is not None else frozenset()
    prefix = f"{key_field}:" if key_field is not None and _keygen.single_key_prefixed(config) else ""
    return Derived(key_field, partitions, encoded, config.hive_style, prefix)


def _data_select(F, present, struct, data_columns: list[str]) -> list:
    """The table's data columns in order, as the table types them; a column the input lacks
    (not in `present`) is null. (A delete's key column may come typed otherwise; stored rows are
    read to match.) A column of a plain type is one SQL expression: two py4j calls, where a
    Column cast to a DataType costs about eight."""
    out = []
    for c in data_columns:
        sql = _plain_type_sql(struct[c].dataType)
        if sql is None:
            out.append((F.col(f"`{c}`") if c in present else F.lit(None)).cast(struct[c].dataType).alias(c))
        else:
            name = "`" + c.replace("`", "``") + "`"
            out.append(F.expr(f"CAST({name if c in present else 'NULL'} AS {sql}) AS {name}"))
    return out


def _plain_type_sql(data_type) -> str | None:
    """The SQL name of a non-nested type whose name Spark's parser reads back as the same type
    (bigint, decimal(12,2), timestamp, ...); None for others (nested, collated, char)."""
    from pyspark.sql import types as T

    plain = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType, T.BinaryType,
             T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)
    if type(data_type) in plain or data_type == T.StringType():
        return data_type.simpleString()
    return None


def _new_file_stats(written) -> tuple[list, WriteCounts]:
    """Write stats and counts of files that start new file groups (every row an insert)."""
    from runtime.table.timeline import WriteStat

    stats, counts = [], WriteCounts()
    for fid, part, path, nrows, size, *_ in written:
        stats.append(WriteStat(fid, path, part, "null", nrows, nrows, 0, 0, size))
        counts.inserts += nrows
        counts.files += 1
        counts.bytes += size
    return stats, counts


# --- the replacing operations -------------------------------------------------------------------


def _replaced_ids(slices) -> dict[str, list[str]]:
    """partitionToReplaceFileIds of a replacecommit: partition -> file ids, sorted."""
    out: dict[str, list[str]] = {}
    for s in slices:
        out.setdefault(s.partition, []).append(s.file_id)
    return {p: sorted(ids) for p, ids in sorted(out.items())}


def _overwrite(spark, table, rows, opts: WriteOptions, instant: str, timeline, slices: list[FileSlice], struct, data_columns: list[str],
               present) -> StagedWrite:
    """insert_overwrite replaces every live file group of the partitions the input has rows
    for; insert_overwrite_table replaces every live file group of the table. The input goes
    to new file groups sized like inserts (no small file takes rows: its group is replaced),
    with no index lookup and no comparison with stored precombine values. With
    combine_before_insert the batch is first deduplicated by key (the precombine field
    decides), and only then are rows flagged as deletes dropped: a key whose winning row is
    a delete is absent, exactly as an upsert of the batch into an empty table would leave it."""
    from pyspark.sql import functions as F

    config = table.config
    keyed = bool(config.record_key_fields)
    ordering = _null_ordering(config, opts, present) if keyed else None
    # one materialised batch, checked, counted and routed: the same rows. Rows flagged as deletes
    # are kept in it until a key's winner is known (combine_before_insert), then dropped.
    rows = spark_api.local_checkpoint(rows)
    checks = [F.count_if(F.col(KEY).isNull()), F.count_if(F.col(f"`{ordering}`").isNull()) if ordering else F.lit(0)] if keyed else [F.lit(0), F.lit(0)]
    per_partition = rows.groupBy(PART).agg(F.count_if(~F.col(_DELETE)), *checks).collect()  # one row per partition
    _refuse_nulls(config, rows, ordering, sum(r[2] for r in per_partition), sum(r[3] for r in per_partition))
    if opts.combine_before_insert and keyed:
        rows = spark_api.local_checkpoint(dedupe(rows, config, opts, present).where(~F.col(_DELETE)))
        counts = {r[0]: r[1] for r in rows.groupBy(PART).count().collect()}
    else:
        rows = rows.where(~F.col(_DELETE))
        counts = {r[0]: r[1] for r in per_partition if r[1]}
    whole_table = opts.operation == "insert_overwrite_table"
    replaced = _replaced_ids(s for s in slices if whole_table or s.partition in counts)
    stats, totals = [], WriteCounts()
    if counts:
        buckets = plan_buckets(counts, [], opts, table.record_size_estimate(opts.record_size_estimate, timeline))
        routed = assign_file_groups(rows, buckets)
        out = routed.select(*_data_select(F, present, struct, data_columns), KEY, PART, FILE_ID)
        n = max(1, min(len(buckets), spark_api.default_parallelism(spark) * 4))
        out = out.repartition(n, FILE_ID).sortWithinPartitions(FILE_ID, KEY)  # a group's rows in one run
        stats, totals = _new_file_stats(write_file_groups(table.storage, out, file_write_spec(table.storage, instant, data_columns, opts, "groups")))
    return StagedWrite(stats, totals, avro_schema_json(struct, config.name), struct, replaced)


def match_partitions(patterns, partitions) -> tuple[set[str], list[str]]:
    """delete_partition: the partitions matching any of `patterns` (fnmatch, case-sensitive;
    `*` also spans `/`, so `dt=2024-*` takes every partition below those dates), and the
    patterns that match none."""
    partitions = set(partitions)
    matched = {p for p in partitions if any(fnmatchcase(p, pat) for pat in patterns)}
    unmatched = [pat for pat in patterns if not any(fnmatchcase(p, pat) for p in partitions)]
    return matched, unmatched


def _delete_partitions(table, opts: WriteOptions, slices: list[FileSlice], stored_struct) -> StagedWrite:
    """delete_partition writes no file: its replacecommit hides every live file group of the
    matching partitions (Table.write has checked that each pattern matches). The commit still
    carries the table's schema: hudi-rs takes it from the latest commit."""
    matched, _ = match_partitions(opts.partitions_to_delete, {s.partition for s in slices})
    replaced = _replaced_ids(s for s in slices if s.partition in matched)
    return StagedWrite([], WriteCounts(), avro_schema_json(stored_struct, table.config.name), stored_struct, replaced)
