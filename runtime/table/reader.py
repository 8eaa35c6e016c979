"""Readers returning Spark DataFrames: snapshot, time travel (as of an instant) and incremental
(the rows written by commits in (since, until]), with or without the meta columns.

Base files of slices without log files are read by Spark's Parquet reader. The slices of a
merge-on-read table that have log files are merged in Spark tasks (merge.py), which start from
Spark's range over task numbers, the paths of each task's slices travelling with the task's function
(slice_descriptors). A read-optimized read takes base files only.

`read_batches` reads the same rows without Spark, in this process, with pyarrow: the same
slices (slices_to_read), the same merging of log files (merge.merge_slice) and the same
range filter (merge.base_batches). It is for small reads on a local disk (`pipe show`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from runtime.spark import api as spark_api
from runtime.table.config import EVENT_TIME, MERGE_ON_READ, TableConfig
from runtime.table.errors import TableError
from runtime.table.layout import FileSlice, FileSystemView, InstantValidity, completed_write_instants, writes_archived_after
from runtime.table.schema import META_COLUMNS, arrow_schema
from runtime.table.timeline import WRITE_ACTIONS, Timeline


@dataclass(frozen=True)
class ReadPlan:
    """What a read takes: base files read as they are, slices whose log files are merged, and
    the range (since, until] of an incremental read (None, None for a snapshot)."""

    plain: list[FileSlice]
    merged: list[FileSlice]
    since: str | None
    until: str | None
    incremental: bool
    merge_until: str | None  # the latest instant whose log blocks count
    instants: frozenset[str] | None = None  # timeline layout 2: the instants of the incremental read
    # partition pruning: (partitions read, partitions the read had before pruning)
    pruned: tuple[int, int] | None = None


def completion_window(storage, timeline: Timeline, since: str | None, until: str | None) -> tuple[Timeline, frozenset[str] | None]:
    """An incremental read of timeline layout 2 (Hudi 1.x), whose `since` and `until` are
    completion times, as Java's incremental queries take them: the timeline as it was when
    `until` completed (completed_by) and the data writes that completed in (since, until],
    archived ones included (the LSM history has their completion times: Java archives by
    instant time, so a long commit may be archived while a later one is still active). A
    commit that started before `since` but completed after it is in the range: a checkpoint
    at a completion time never skips it. No `since`: None, a snapshot of that timeline."""
    seen = timeline.completed_by(until)
    if since is None:
        return seen, None
    from runtime.table.lsm_timeline import archived_instants

    instants = {i.time for i in seen.completed_after(since) if i.time not in seen.compactions}
    instants |= {i.time for i in archived_instants(storage) if i.action in WRITE_ACTIONS and i.completion
                 and i.completion > since and (until is None or i.completion <= until)}
    return seen, frozenset(instants)


def plan_read(storage, timeline: Timeline, as_of: str | None, since: str | None, until: str | None,
              config: TableConfig | None, read_optimized: bool, file_groups: set[tuple[str, str]] | None = None,
              instants: frozenset[str] | None = None, partitions: Callable[[str], bool] | None = None) -> ReadPlan:
    """`file_groups`, (partition, file id) pairs: only the slices of those groups. `instants`
    (timeline layout 2, completion_window): an incremental read of the rows those instants
    wrote, from `timeline` as completion_window gives it. `partitions`: only the slices of the
    partitions it keeps (partition_pruning.partition_filter)."""
    view = FileSystemView.load(storage, timeline)
    if instants is not None:
        incremental, since, until, merge_until = True, None, None, None
        slices = view.latest_slices()
        active = [i for i in timeline.completed() if i.time in instants]
        if len(active) == len(instants):  # else some were archived with their write stats: scan all
            groups = _groups_written(timeline, active)
            slices = [s for s in slices if (s.partition, s.file_id) in groups]
    else:
        incremental = since is not None or until is not None
        if incremental:
            until = until or as_of
        slices = slices_to_read(view, timeline, as_of, since, until, incremental)
        merge_until = until if incremental else as_of
    if file_groups is not None:
        slices = [s for s in slices if (s.partition, s.file_id) in file_groups]
    pruned = None
    if partitions is not None:
        seen = {s.partition for s in slices}
        kept = {p for p in seen if partitions(p)}
        slices = [s for s in slices if s.partition in kept]
        pruned = (len(kept), len(seen))
    merging = config is not None and config.table_type == MERGE_ON_READ and not read_optimized
    merged = [s for s in slices if s.has_logs] if merging else []
    plain = [s for s in slices if s.base_file is not None and not (merging and s.has_logs)]
    return ReadPlan(plain, merged, since if incremental else None, until if incremental else None, incremental, merge_until,
                    instants, pruned)


def read(spark, storage, struct, timeline: Timeline, as_of: str | None = None, since: str | None = None,
         until: str | None = None, meta: bool = True, config: TableConfig | None = None, read_optimized: bool = False,
         file_groups: set[tuple[str, str]] | None = None, instants: frozenset[str] | None = None,
         columns: list[str] | None = None, partitions: Callable[[str], bool] | None = None, plan: list | None = None):
    """Rows of the table (see Table.read), of the groups in `file_groups` only if given;
    `instants`, `partitions`: see plan_read. `columns`: only these data columns (after the meta
    columns if `meta`); the merge of slices with log files then reads and merges only them and
    the columns it merges by (the record key, the ordering field). `plan`: a list the ReadPlan
    is appended to, for a caller that reports what was read."""
    from pyspark.sql import types as T

    data = list(struct.fields) if struct else []
    full = T.StructType([T.StructField(c, T.StringType(), True) for c in META_COLUMNS] + data)
    p = plan_read(storage, timeline, as_of, since, until, config, read_optimized, file_groups, instants, partitions)
    if plan is not None:
        plan.append(p)
    # the columns returned; a merge reads them and what it merges by (without the meta columns
    # a reader does not want: five strings a row)
    wanted = (list(META_COLUMNS) if meta else []) + (list(columns) if columns is not None else [f.name for f in data])
    parts = []  # a part without files is left out: Spark would still start its tasks
    if p.plain or not p.merged:
        df = read_base_files(spark, storage, full, p.plain)
        if p.incremental:
            df = _written_in(df, p.since, p.until, p.instants)
        parts.append(df.select(*[f"`{c}`" for c in wanted]))
    if p.merged:
        merging = _merge_struct(full, wanted, config, p.incremental)
        parts.append(read_merged_slices(spark, storage, merging, timeline, config, p.merged, p.since, p.merge_until, p.instants,
                                        output=wanted))
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def _merge_struct(full, wanted: list[str], config: TableConfig, incremental: bool):
    """The columns a merge of slices reads for a read of `wanted`: those, the record key, the
    ordering field (event-time merging), and the commit time (an incremental read), in the
    table's order."""
    from pyspark.sql import types as T

    needed = set(wanted) | {"_hoodie_record_key"}
    if config.precombine_field:
        needed.add(config.precombine_field)
    if incremental:
        needed.add("_hoodie_commit_time")
    return T.StructType([f for f in full.fields if f.name in needed])


def slices_to_read(view: FileSystemView, timeline: Timeline, as_of: str | None, since: str | None, until: str | None,
                   incremental: bool) -> list[FileSlice]:
    """Snapshot and time travel: the latest slice of every group as of the instant. Incremental:
    the latest slices (as of `until`) of the groups the write stats of commits in the range name
    (a merge-on-read log stat names its group too)."""
    if not incremental:
        return view.latest_slices(as_of)
    if writes_archived_after(timeline, since):
        # commits after `since` were archived: their write stats are gone, so every live
        # slice is scanned; rows keep the commit time that last wrote them
        return view.latest_slices(until)
    groups = _groups_written(timeline, completed_write_instants(timeline, since, until))
    return [s for s in view.latest_slices(until) if (s.partition, s.file_id) in groups]


def _groups_written(timeline: Timeline, instants) -> set[tuple[str, str]]:
    """(partition, file id) of every group the write stats of `instants` name."""
    groups = set()
    for inst in instants:
        for stat in timeline.commit_metadata(inst).write_stats:
            groups.add((stat.partition_path, stat.file_id))
    return groups


def read_base_files(spark, storage, full, slices: list[FileSlice]):
    paths = [storage.full_path(s.base_file.path) for s in slices]
    if not paths:
        return spark_api.empty_frame(spark, full)
    return spark.read.schema(full).parquet(*paths)


def _written_in(df, since: str | None, until: str | None, instants: frozenset[str] | None = None):
    from pyspark.sql import functions as F

    if instants is not None:
        return df.where(F.col("_hoodie_commit_time").isin(sorted(instants)))
    if since is not None:
        df = df.where(F.col("_hoodie_commit_time") > F.lit(since))
    if until is not None:
        df = df.where(F.col("_hoodie_commit_time") <= F.lit(until))
    return df


def read_merged_slices(spark, storage, full, timeline: Timeline, config: TableConfig, slices: list[FileSlice],
                       since: str | None, until: str | None, instants: frozenset[str] | None = None,
                       output: list[str] | None = None):
    """The merged rows of slices with log files: tasks over the slices' numbers
    (slice_descriptors), each merging its slices (merge.merge_task). `output`: the columns of
    `full` the tasks hand to Spark, in that order (all if None). Spark cannot prune a Python
    task's output, so a read names them: the columns a merge only merges by (the record key,
    the ordering field) then never cross from the Python workers to the JVM, which costs more
    than the merge itself (a million string keys)."""
    from pyspark.sql import types as T

    from runtime.table.merge import merge_task

    spec = merge_spec(storage, full, timeline, config, since, until, instants)
    numbers, descriptors = slice_descriptors(spark, slices)
    names = tuple(output) if output is not None else None
    out = full if names is None else T.StructType([full[c] for c in names])
    return numbers.mapInArrow(lambda batches: merge_task(spec, descriptors, batches, names), out)


def slice_descriptors(spark, slices: list[FileSlice], per_core: int = 1):
    """What tasks that merge slices start from: a DataFrame of task numbers (Spark's `range`, one
    number a task, up to `per_core` tasks per core; made by the executors, so no row goes through
    the driver and no shuffle spreads them), and by task number the descriptors (merge.
    SliceDescriptor) of the slices that task merges, which travel with the task's function.

    Slices go to tasks by their bytes (base file and log files), the largest first to the task
    with the fewest, so the tasks end together. A read takes one task per core: a Python task
    costs 50 to 100 ms to start and hand back here, more than balancing by bytes leaves to gain."""
    import heapq

    from runtime.table.merge import SliceDescriptor

    tasks = max(1, min(len(slices), spark_api.default_parallelism(spark) * per_core))
    loads = [(0, n) for n in range(tasks)]
    groups: list[list[SliceDescriptor]] = [[] for _ in range(tasks)]
    sized = sorted((((s.base_file.size if s.base_file else 0) + sum(lf.size for lf in s.log_files), i) for i, s in enumerate(slices)),
                   reverse=True)
    for size, i in sized:
        s = slices[i]
        load, n = heapq.heappop(loads)
        groups[n].append(SliceDescriptor(s.partition, s.file_id, s.base_file.path if s.base_file else None,
                                         tuple(lf.path for lf in s.log_files)))
        heapq.heappush(loads, (load + size, n))
    return spark.range(0, tasks, 1, tasks), tuple(tuple(g) for g in groups)


def merge_spec(storage, full, timeline: Timeline, config: TableConfig, since: str | None = None, until: str | None = None,
               instants: frozenset[str] | None = None):
    """How tasks merge slices into rows of `full` (meta and data columns, a Spark StructType):
    the table's merge mode and the instants whose blocks count."""
    return arrow_merge_spec(storage, arrow_schema(full), timeline, config, since, until, instants)


def arrow_merge_spec(storage, schema, timeline: Timeline, config: TableConfig, since: str | None = None, until: str | None = None,
                     instants: frozenset[str] | None = None):
    """merge_spec for an Arrow schema of meta and data columns (no Spark needed)."""
    from runtime.table.merge import MergeSpec

    mode = config.read_merge_mode()
    if mode == EVENT_TIME and config.precombine_field not in schema.names:
        raise TableError(f"table {config.name} orders records by {config.precombine_field}, which its schema lacks",
                         "check hoodie.table.precombine.field in .hoodie/hoodie.properties")
    return MergeSpec(
        storage_uri=storage.spec.uri, storage_options=tuple(storage.spec.options), schema=schema,
        mode=mode, ordering_field=config.precombine_field, valid=InstantValidity.of(timeline), since=since, until=until,
        instants=instants,
    )


# --- reading without Spark ----------------------------------------------------------------------


def arrow_data_schema(file_schema):
    """The data columns of a base file's Arrow schema as Spark reads them (meta columns
    dropped; dictionary-encoded columns as their values; timestamps in microseconds, as
    Spark's TimestampType and TimestampNTZType)."""
    import pyarrow as pa

    fields = []
    for f in file_schema:
        if f.name in META_COLUMNS:
            continue
        if pa.types.is_dictionary(f.type):
            f = f.with_type(f.type.value_type)
        if pa.types.is_timestamp(f.type) and f.type.unit != "us":
            f = f.with_type(pa.timestamp("us", f.type.tz))
        fields.append(f)
    return pa.schema(fields)


def read_batches(storage, data_schema, timeline: Timeline, as_of: str | None = None, since: str | None = None,
                 until: str | None = None, meta: bool = True, config: TableConfig | None = None, read_optimized: bool = False,
                 instants: frozenset[str] | None = None):
    """The rows `read` returns, without Spark: (Arrow schema, iterator of record batches),
    read lazily slice by slice. `data_schema` is the table's data columns as an Arrow schema
    (Table.arrow_schema)."""
    import pyarrow as pa

    from runtime.table.merge import base_batches, merge_slice

    full = pa.schema([pa.field(c, pa.string()) for c in META_COLUMNS] + (list(data_schema) if data_schema is not None else []))
    p = plan_read(storage, timeline, as_of, since, until, config, read_optimized, instants=instants)
    out = full if meta else pa.schema([f for f in full if f.name not in META_COLUMNS])

    def batches():
        # base files of a slice as of `until` hold no later row: only `since` filters them
        plain_spec = _range_spec(storage, full, p.since, p.until, p.instants)
        for s in p.plain:
            for batch in base_batches(storage, s.base_file.path, plain_spec):
                yield batch if meta else batch.select(out.names)
        if p.merged:
            spec = arrow_merge_spec(storage, full, timeline, config, p.since, p.merge_until, p.instants)
            for s in p.merged:
                for batch in merge_slice(spec, storage, s.base_file.path if s.base_file else None, [lf.path for lf in s.log_files]):
                    yield batch if meta else batch.select(out.names)

    return out, batches()


def _range_spec(storage, schema, since: str | None, until: str | None, instants: frozenset[str] | None = None):
    """A MergeSpec for base files alone: their columns and the range of an incremental read."""
    from runtime.table.merge import MergeSpec

    return MergeSpec(storage_uri=storage.spec.uri, storage_options=tuple(storage.spec.options), schema=schema, mode="",
                     ordering_field=None, valid=lambda instant: True, since=since, until=until, instants=instants)
