"""Upserts and deletes with `index: partition`, decided and written partition by partition
inside tasks.

With the partition index a key is unique within its partition only, so everything about a
partition's incoming rows can be settled by one task that sees all of them:

    incoming rows --shuffle by partition path--> tag_and_write_task: deduplicate (the
    largest precombine value wins, then the later row), look the keys up among the keys of
    the partition's latest file slices, drop rows older than the stored ones, route inserts
    to small files and new file groups; then write every file group touched
    (files.write_groups_task), several at once when the executor has cores to spare

That is one Spark stage after the shuffle, with no join and no summary job: the general path
(writer.write) deduplicates and joins in Spark, then counts inserts per partition on the
driver before it can plan file groups, and shuffles the rows again by file group. The rows
to write never leave the task that decided them. (On a cluster, a batch of fewer partitions
than cores has tag_task hand its rows to write tasks after a shuffle by file id instead, so
the groups of one partition are written by many executors.) writer.write takes this path
when every partition of the batch fits a task: at most PARTITION_TASK_ROWS incoming rows and
PARTITION_TASK_BYTES of stored files.

The decisions are the general path's, row for row: the same winner within the batch, the same
stale rule (a null precombine value loses to a stored one), the same file sizing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Iterator

from runtime.table.files import KIND, runs
from runtime.table.layout import FileSlice

KEY, PART = "_hoodie_record_key", "_hoodie_partition_path"
DELETE, SEQ = "_pipe_delete", "_pipe_seq"  # writer.prepare's delete flag and arrival order
GONE = "_pipe_gone"  # a stored key its slice's logs deleted (merge-on-read)

# A partition larger than this (incoming rows, or stored bytes) goes the general way: one task
# would hold too many rows, or read too many stored keys alone.
PARTITION_TASK_ROWS = 1_000_000
PARTITION_TASK_BYTES = 1 << 30


@dataclass(frozen=True)
class TagSpec:
    """What tag_and_write_task needs to settle a partition's rows, picklable."""

    instant: str
    slices: dict[str, tuple[FileSlice, ...]]  # partition path -> its latest file slices
    stored: object  # merge.MergeSpec over the meta columns and the precombine field
    ordering_field: str | None  # the precombine field, when the incoming rows have it
    max_file_size: int
    small_file_limit: int
    record_size: int
    # with a record index (the global index): the (partition, file id) of the groups it holds
    # the batch's keys in, the only ones whose keys are read (None: every slice's), and the
    # write's changes to the index come out too (INDEX_COLUMNS)
    lookup: frozenset | None = None
    index_changes: bool = False


# The index changes tag_and_write_task adds to its stats rows with TagSpec.index_changes: a
# key inserted (with its partition and file id) or deleted (both null); a stats row has no key.
INDEX_COLUMNS = ("_k", "_pipe_part", "_pipe_file")


def fits(rows_per_partition: dict[str, int], slices: list[FileSlice]) -> bool:
    """Every partition of the batch is small enough for one task."""
    if not rows_per_partition or max(rows_per_partition.values()) > PARTITION_TASK_ROWS:
        return False
    stored: dict[str, int] = {}
    for s in slices:
        if s.partition in rows_per_partition:
            stored[s.partition] = stored.get(s.partition, 0) + slice_bytes(s)
    return max(stored.values(), default=0) <= PARTITION_TASK_BYTES


def slice_bytes(s: FileSlice) -> int:
    return (s.base_file.size if s.base_file is not None else 0) + sum(lf.size or 0 for lf in s.log_files)


def new_file_id(instant: str, partition: str, n: int) -> str:
    """A new file group's id, the same on a retried task: (instant, partition, n) decide it."""
    return f"{uuid.uuid5(uuid.NAMESPACE_URL, f'pipe:{instant}/{partition}/{n}')}-0"


def tag_and_write_task(spec: TagSpec, write_spec, threads: int, batches: Iterator) -> Iterator:
    """The function given to mapInArrow: incoming rows sorted by partition path in; out, the
    stats rows of the files written (files.STATS_SCHEMA). `write_spec`: a files.FileWriteSpec
    in groups mode naming the base files of the batch's partitions; `threads`: how many
    groups the task may write at once."""
    from runtime.table.files import write_groups_task

    if not spec.index_changes:
        yield from write_groups_task(write_spec, _groups(spec, batches), threads)
        return
    import pyarrow as pa

    from runtime.table.files import stats_arrow_schema

    noted: list = []
    stats_schema = stats_arrow_schema()
    schema = pa.schema(list(stats_schema) + [pa.field(c, pa.string()) for c in INDEX_COLUMNS])
    for stats in write_groups_task(write_spec, _noting(_groups(spec, batches), noted), threads):
        yield pa.RecordBatch.from_arrays(stats.columns + [pa.nulls(stats.num_rows, pa.string())] * len(INDEX_COLUMNS), schema=schema)
    for changes in noted:
        columns = [pa.nulls(changes.num_rows, f.type) for f in stats_schema] + [changes.column(c).combine_chunks() for c in INDEX_COLUMNS]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _noting(groups: Iterator, noted: list) -> Iterator:
    """`groups` passed on, each group's inserts (key, partition, file id) and deletes (key)
    noted as index changes, as Arrow tables of INDEX_COLUMNS."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime.table.files import KIND

    for partition, file_id, rows in groups:
        kinds = rows.column(KIND)
        changed = rows.filter(pc.not_equal(kinds, "U"))
        if changed.num_rows:
            inserted = pc.equal(changed.column(KIND), "I")
            noted.append(pa.table({INDEX_COLUMNS[0]: changed.column(KEY),
                                   INDEX_COLUMNS[1]: pc.if_else(inserted, pa.scalar(partition, pa.string()), pa.scalar(None, pa.string())),
                                   INDEX_COLUMNS[2]: pc.if_else(inserted, pa.scalar(file_id, pa.string()), pa.scalar(None, pa.string()))}))
        yield partition, file_id, rows


def tag_task(spec: TagSpec, batches: Iterator) -> Iterator:
    """The function given to mapInArrow when the writing is left to write tasks after a
    shuffle by file id (writer._upsert_by_partition says when): the rows to write, each with
    its file id and kind."""
    import pyarrow as pa

    from runtime.table.files import FILE_ID

    for partition, file_id, rows in _groups(spec, batches):
        yield from rows.append_column(FILE_ID, pa.repeat(pa.scalar(file_id), rows.num_rows)).to_batches()


def _groups(spec: TagSpec, batches: Iterator) -> Iterator:
    """(partition, file id, rows to write) per file group touched, partition by partition."""
    import pyarrow as pa

    from runtime.storage import StorageSpec, open_storage

    storage = open_storage(StorageSpec(spec.stored.storage_uri, spec.stored.storage_options))
    for partition, rows in runs(batches, PART):
        pieces: dict[str, list] = {}
        for file_id, table in tag_partition(spec, storage, partition, rows):
            pieces.setdefault(file_id, []).append(table)
        for file_id, tables in pieces.items():  # a small file may take updates and inserts: in key order
            yield partition, file_id, pa.concat_tables(tables).sort_by(KEY) if len(tables) > 1 else tables[0]


def tag_partition(spec: TagSpec, storage, partition: str, rows) -> Iterator:
    """One partition's incoming rows (an Arrow table) settled: (file id, rows to write with
    their kind, I, U or D) per file group, updates first, then inserts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime.table.merge import last_per_key

    order = [spec.ordering_field] if spec.ordering_field else []
    rows = last_per_key(rows.combine_chunks(), KEY, order + [SEQ])  # one row per key, in key order
    keys = rows.column(KEY)
    found = np.zeros(rows.num_rows, dtype=bool)
    slices = spec.slices.get(partition, ())
    hits = []
    for s in slices:
        if spec.lookup is not None and (partition, s.file_id) not in spec.lookup:
            continue  # the record index holds none of the batch's keys there
        stored = _stored_keys(spec, storage, s)
        if spec.lookup is not None:  # a key the slice's logs deleted is not in the record index: it is new
            stored = stored.filter(pc.invert(stored.column(GONE)))
        hit = stored.filter(pc.fill_null(pc.is_in(stored.column(KEY), value_set=keys), False))
        if hit.num_rows:
            hits.append((s, hit))
    # keys live in a slice first; a key its logs deleted goes back to that slice only when it
    # is live in none (_stored_keys)
    hits = [(s, h.filter(pc.invert(h.column(GONE)))) for s, h in hits] + [(s, h.filter(h.column(GONE))) for s, h in hits]
    written: dict[str, list] = {}
    for s, hit in hits:
        if hit.num_rows and found.any():
            hit = hit.filter(pc.invert(pc.is_in(hit.column(KEY), value_set=keys.filter(pa.array(found)))))
        if not hit.num_rows:
            continue
        where = pc.index_in(keys, value_set=hit.column(KEY))  # each incoming key's stored row, or null
        mine = pc.is_valid(where)
        found |= mine.to_numpy(zero_copy_only=False)
        updates = rows.filter(mine)
        was_gone = hit.column(GONE).take(pc.drop_null(where))
        if spec.ordering_field:  # an incoming row older than the stored one is ignored
            new = updates.column(spec.ordering_field)
            old = hit.column(spec.ordering_field).take(pc.drop_null(where)).cast(new.type)
            keep = pc.fill_null(pc.or_kleene(pc.is_null(old), newer_or_equal(new, old)), False)
            updates, was_gone = updates.filter(keep), was_gone.filter(keep)
        if pc.any(was_gone).as_py():  # a delete of a key deleted already changes nothing
            updates = updates.filter(pc.invert(pc.and_(updates.column(DELETE), was_gone)))
        if updates.num_rows:
            kinds = pc.if_else(updates.column(DELETE), pa.scalar("D"), pa.scalar("U"))
            written.setdefault(s.file_id, []).append(_to_write(updates, kinds))
    for file_id, parts in written.items():  # one write per group (its live keys' rows and its deleted keys')
        yield file_id, pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    inserts = rows.filter(pa.array(~found))
    inserts = inserts.filter(pc.invert(inserts.column(DELETE)))  # a delete of an unknown key does nothing
    if inserts.num_rows:  # a small file the updates rewrite anyway takes them first, as on the general path
        yield from _route_inserts(spec, partition, slices, inserts, rewritten={(partition, file_id) for file_id in written})


def newer_or_equal(new, old):
    """`new >= old` as Spark compares (writer.drop_stale): NaN is equal to NaN and above
    every other value, where Arrow's comparison of a NaN is false; null where either is null."""
    import pyarrow.compute as pc
    import pyarrow.types as t

    ge = pc.greater_equal(new, old)
    if t.is_floating(new.type):
        ge = pc.or_kleene(ge, pc.is_nan(new))
    return ge


def _stored_keys(spec: TagSpec, storage, s: FileSlice):
    """The keys of a slice as readers see them (merge-on-read logs applied), with the
    precombine value of each: an Arrow table."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime.table.merge import base_batches, merge_slice

    columns = [KEY] + ([spec.ordering_field] if spec.ordering_field else [])
    schema = pa.schema([spec.stored.schema.field(c) for c in columns])
    narrow = dataclasses.replace(spec.stored, schema=schema)
    gone = None
    if s.log_files:
        batches = merge_slice(spec.stored, storage, s.base_file.path if s.base_file else None, [lf.path for lf in s.log_files])
        if s.base_file is not None:
            gone = pa.Table.from_batches([b.select([KEY]) for b in base_batches(storage, s.base_file.path, narrow)],
                                         schema=pa.schema([schema.field(KEY)]))
    elif s.base_file is not None:  # only the key and precombine columns are read
        batches = base_batches(storage, s.base_file.path, narrow)
    else:
        batches = ()
    live = pa.Table.from_batches([b.select(columns) for b in batches], schema=schema).combine_chunks()
    live = live.append_column(GONE, pa.array([False] * live.num_rows))
    if gone is None or not gone.num_rows:
        return live
    # keys of the base file its logs deleted stay in this group, as Java's index finds them there
    # (it reads base files' keys): a key written again goes back to it, never to a second group
    gone = gone.filter(pc.invert(pc.is_in(gone.column(KEY), value_set=live.column(KEY))))
    extra = {KEY: gone.column(KEY)}
    if spec.ordering_field:
        extra[spec.ordering_field] = pa.nulls(gone.num_rows, schema.field(spec.ordering_field).type)
    extra[GONE] = pa.array([True] * gone.num_rows)
    return pa.concat_tables([live, pa.table(extra, schema=live.schema)]).combine_chunks()


def _to_write(rows, kinds):
    return rows.drop_columns([DELETE, SEQ]).append_column(KIND, kinds)


def _route_inserts(spec: TagSpec, partition: str, slices, inserts, rewritten: set[tuple[str, str]]) -> Iterator:
    """(file id, rows) per group taking inserts: they fill the partition's small files (first
    those among `rewritten`, the groups the partition's updates and deletes touch), then new file
    groups (writer.plan_buckets), in key order, so the same rows go to the same groups if the
    task runs again."""
    import pyarrow as pa

    from runtime.table.writer import plan_buckets

    n = inserts.num_rows
    ids = iter(range(1 << 30))
    buckets = plan_buckets({partition: n}, list(slices), spec, spec.record_size, new_id=lambda: new_file_id(spec.instant, partition, next(ids)),
                           rewritten=rewritten)
    for b in buckets:
        start, end = round(b.lo * n), round(b.hi * n)
        if end > start:
            yield b.file_id, _to_write(inserts.slice(start, end - start), pa.repeat(pa.scalar("I"), end - start))
