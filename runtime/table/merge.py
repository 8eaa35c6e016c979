"""Merging one merge-on-read file slice, inside a Spark task, with pyarrow: the base file's rows,
then the log blocks that count, in log order, folded per record key (HUDI_FORMAT 6.4, 6.5).

    read log blocks -> drop rollback blocks, their targets and invalid instants
        -> stream base rows no log block touches -> fold each touched key -> the winners

Only the keys the log blocks name are held in memory; the base file is streamed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from runtime.table import logfile as L
from runtime.table.config import APPEND_ONLY, EVENT_TIME
from runtime.table.errors import TableError
from runtime.table.layout import InstantValidity

KEY = "_hoodie_record_key"
COMMIT_TIME = "_hoodie_commit_time"


class SliceDescriptor(NamedTuple):
    """One file slice as a task reads it (reader.slice_descriptors): paths relative to the table."""

    partition: str
    file_id: str
    base_path: str | None
    log_paths: tuple[str, ...]


def slices_in(descriptors: tuple[tuple[SliceDescriptor, ...], ...], batches: Iterator) -> Iterator[SliceDescriptor]:
    """The slices of the tasks a task's batches of task numbers (Spark's `range`, column `id`)
    name (reader.slice_descriptors)."""
    for batch in batches:
        for number in batch.column(0).to_pylist():
            yield from descriptors[number]


@dataclass(frozen=True)
class MergeSpec:
    """Everything a task needs to merge slices, picklable."""

    storage_uri: str
    storage_options: tuple
    schema: Any  # the output Arrow schema: meta columns, then data columns
    mode: str  # TableConfig.read_merge_mode()
    ordering_field: str | None
    valid: InstantValidity  # which instants count at all
    since: str | None = None  # incremental: base rows and blocks in (since, until]
    until: str | None = None  # the latest instant read (snapshot: None, time travel: as_of)
    # an incremental read of timeline layout 2: the instants whose completion time is in its
    # range, in place of (since, until] (a commit that started earlier may complete later)
    instants: frozenset[str] | None = None

    def counts(self, instant: str) -> bool:
        """A block (or base row) written at `instant` is part of the read."""
        if self.instants is not None:
            return instant in self.instants and self.valid(instant)
        if self.until is not None and instant > self.until:
            return False
        if self.since is not None and instant <= self.since:
            return False
        return self.valid(instant)


def merge_task(spec: MergeSpec, descriptors: tuple[tuple[SliceDescriptor, ...], ...], batches: Iterator,
               output: tuple[str, ...] | None = None) -> Iterator:
    """The function given to mapInArrow: task numbers in (reader.slice_descriptors), the merged
    rows of their slices out, with only the `output` columns if given."""
    from runtime.storage import StorageSpec, open_storage

    storage = open_storage(StorageSpec(spec.storage_uri, spec.storage_options))
    columns = list(output) if output is not None else None
    for piece in slices_in(descriptors, batches):
        for batch in merge_slice(spec, storage, piece.base_path, list(piece.log_paths)):
            yield batch if columns is None else batch.select(columns)


def merge_slice(spec: MergeSpec, storage, base_path: str | None, log_paths: list[str]) -> Iterator:
    """The merged rows of one slice, as Arrow record batches with `spec.schema`."""
    blocks = visible_blocks(read_log_blocks(storage, log_paths), spec)
    if spec.mode == APPEND_ONLY:  # no record keys: every row stays
        if base_path:
            yield from base_batches(storage, base_path, spec)
        for block in blocks:
            if block.type != L.DELETE:
                yield from block_rows(block, spec.schema).to_batches()
        return
    steps = log_steps(blocks, spec.schema)
    touched = _touched_keys(steps)
    stored = []
    if base_path:
        for batch in base_batches(storage, base_path, spec):
            untouched, kept = _split_touched(batch, touched)
            if untouched.num_rows:
                yield untouched
            if kept.num_rows:
                stored.append(kept)
    yield from _winners(spec, stored, steps)


# --- log blocks ---------------------------------------------------------------------------------


def read_log_blocks(storage, paths: list[str]) -> list[L.Block]:
    """Every block of the slice's log files, in file order."""
    blocks = []
    for path in paths:
        try:
            data = storage.read_bytes(path)
        except FileNotFoundError as exc:
            raise TableError(f"table at {storage.spec.uri}: log file {path} is gone (cleaned while it was read?); "
                             "read the table again", "read the table again") from exc
        try:
            blocks.extend(L.read_blocks(data, path))
        except L.LogFormatError as exc:
            # raised in a Spark task, where the hint does not travel: the message says what to do
            raise TableError(f"table at {storage.spec.uri}: damaged log file {exc}; restore the file from a backup, "
                             "or roll back the instant that wrote it", "restore the file, or roll back the instant that wrote it") from exc
    return blocks


def visible_blocks(blocks: list[L.Block], spec: MergeSpec) -> list[L.Block]:
    """The data and delete blocks the read sees, in log order: rollback blocks (applied up to
    the read's instant) hide the blocks of the instants they target; blocks of instants that
    never completed, or outside the read's range, do not count."""
    rolled_back = {b.header.get(L.TARGET_INSTANT_TIME) for b in blocks
                   if b.is_rollback and (spec.until is None or b.instant <= spec.until)}
    out = []
    for b in blocks:
        if b.type in (L.COMMAND, L.CORRUPT):
            continue  # a rollback (applied above), or a block Hudi marked as corrupt
        if b.type not in (L.AVRO_DATA, L.PARQUET_DATA, L.DELETE):
            raise TableError(f"log block of type {b.type} (instant {b.instant}) is not supported by pipe's reader",
                             "compact the table with Hudi first")
        if (spec.since is not None or spec.instants is not None) and L.COMPACTED_BLOCK_TIMES in b.header:
            continue  # an incremental read takes the rewritten blocks' own instants, not the log compaction's copy
        if b.instant not in rolled_back and spec.counts(b.instant):
            if b.header.get(L.IS_PARTIAL, "").lower() == "true":
                # raised in a Spark task, where the hint does not travel: the message says what to do
                raise TableError(f"table at {spec.storage_uri}: a log block of instant {b.instant} holds partial updates "
                                 "(Hudi 1.x's hoodie.write.partial.update.mode), which pipe's reader does not merge; "
                                 "compact the table with Hudi, then read it with pipe", "compact the table with Hudi first")
            out.append(b)
    return out


def block_rows(block: L.Block, schema):
    """A data block's rows as an Arrow table with `schema`."""
    import pyarrow as pa

    rows = L.data_rows(block)
    if isinstance(rows, list):  # Avro: dicts of Python values
        return conform(pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema), schema)
    return conform(rows, schema)


def log_steps(blocks: list[L.Block], schema) -> list:
    """What each block does, in log order: a data block's rows (an Arrow table with `schema`),
    or a delete block's records (a list of logfile.DeleteRecord)."""
    return [L.delete_records(b) if b.type == L.DELETE else block_rows(b, schema) for b in blocks]


def _touched_keys(steps: list):
    """The record keys the log blocks name, as an Arrow array (for pyarrow.compute.is_in)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = [pa.array([d.record_key for d in step], pa.string()) if isinstance(step, list) else step.column(KEY).combine_chunks().cast(pa.string())
              for step in steps]
    if not arrays:
        return pa.array([], pa.string())
    return pc.unique(pc.drop_null(pa.concat_arrays(arrays)))


# --- base rows --------------------------------------------------------------------------------


def base_batches(storage, rel_path: str, spec: MergeSpec) -> Iterator:
    """The base file's rows with `spec.schema`, in batches; for an incremental read only the
    rows written in its range. (A slice read as of an instant holds no later row.)"""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = storage.full_path(rel_path) if hasattr(storage, "root") else pa.BufferReader(storage.read_bytes(rel_path))
    stored = pq.ParquetFile(source)
    columns = [f.name for f in spec.schema if f.name in stored.schema_arrow.names]
    for batch in stored.iter_batches(batch_size=1 << 16, columns=columns):
        table = conform(pa.Table.from_batches([batch]), spec.schema)
        if spec.instants is not None:
            table = table.filter(pc.fill_null(pc.is_in(table.column(COMMIT_TIME), pa.array(sorted(spec.instants), pa.string())), False))
        elif spec.since is not None:
            times = table.column(COMMIT_TIME)
            keep = pc.greater(times, spec.since)
            if spec.until is not None:
                keep = pc.and_(keep, pc.less_equal(times, spec.until))
            table = table.filter(pc.fill_null(keep, False))
        yield from table.to_batches()


def conform(table, schema):
    """`table` with exactly `schema`'s columns, in order and of its types; a column the table
    lacks is null."""
    import pyarrow as pa

    arrays = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _split_touched(batch, touched):
    """(rows whose key no log block names, rows whose key one does)."""
    import pyarrow.compute as pc

    if not len(touched):
        return batch, batch.slice(0, 0)
    hit = pc.fill_null(pc.is_in(batch.column(KEY), value_set=touched), False)
    return batch.filter(pc.invert(hit)), batch.filter(hit)


# --- folding versions of a key ------------------------------------------------------------------


def _winners(spec: MergeSpec, stored: list, steps: list) -> Iterator:
    """The final version of every key the log blocks touch: the stored rows of those keys
    first, then each block in log order, folded with pyarrow (no per-row Python).

    Every row and delete becomes an event with its position in that order. Commit time: a
    key's last event wins. Event time: a delete by commit time (Java's default IntWrapper(0),
    or a value of another class than the field's, see _delete_kind) wipes what came before
    it, so only a key's events after its last such delete count; of those, the largest ordering value wins (null below every
    value) and a tie goes to the later event. A winning delete leaves no row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    event_time = spec.mode == EVENT_TIME
    order_type = spec.schema.field(spec.ordering_field).type if event_time else pa.null()
    field_kind = L.ordering_kind(order_type) if event_time else None
    sources = [pa.Table.from_batches(stored, schema=spec.schema)] + [s for s in steps if not isinstance(s, list)]
    events, seq, n_source = [], 0, 0
    for step in [sources[0]] + steps:
        if isinstance(step, list):  # a delete block
            kept = [(d, _delete_kind(d.ordering, field_kind) if event_time else "by_commit_time") for d in step]
            events.append(pa.table({
                "key": pa.array([d.record_key for d, _ in kept], pa.string()),
                "ord": _ordering_array([d.ordering.value if kind == "ordered" else None for d, kind in kept], order_type),
                "seq": pa.array(np.arange(seq, seq + len(kept), dtype=np.int64)),
                "src": pa.array([-1] * len(kept), pa.int32()),
                "row": pa.array([-1] * len(kept), pa.int64()),
                "wipes": pa.array([kind == "by_commit_time" for _, kind in kept], pa.bool_()),
            }))
            seq += len(kept)
            continue
        n = step.num_rows
        events.append(pa.table({
            "key": step.column(KEY).cast(pa.string()),
            "ord": step.column(spec.ordering_field) if event_time else pa.nulls(n, order_type),
            "seq": pa.array(np.arange(seq, seq + n, dtype=np.int64)),
            "src": pa.repeat(pa.scalar(n_source, pa.int32()), n),
            "row": pa.array(np.arange(n, dtype=np.int64)),
            "wipes": pa.repeat(pa.scalar(False), n),
        }))
        seq += n
        n_source += 1
    table = pa.concat_tables(events).filter(pc.field("key").is_valid())
    if event_time:
        # only what follows a key's last wiping delete counts
        wiped = table.filter(pc.field("wipes")).group_by("key").aggregate([("seq", "max")]).rename_columns(["key", "wiped_at"])
        table = table.join(wiped, "key", join_type="left outer")
        table = table.filter(pc.is_null(pc.field("wiped_at")) | (pc.field("seq") >= pc.field("wiped_at")))
        order = ["ord", "seq"]
    else:
        order = ["seq"]
    winners = last_per_key(table, "key", order)  # the last event of every key
    if not winners.num_rows:
        return
    winners = winners.filter(pc.field("src") >= 0)  # a winning delete leaves no row
    for source in sorted(set(winners.column("src").to_pylist())):
        rows = winners.filter(pc.field("src") == source).column("row")
        yield from sources[source].take(rows.take(pc.sort_indices(rows))).to_batches()


def last_per_key(table, key: str, order: list[str]):
    """The last row of each `key` value, `table` sorted by key and then by the `order`
    columns ascending (a null sorts below every value, NaN above): one row per key, in key
    order. Vectorised: one sort, one comparison of neighbouring keys."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sort_keys = [(key, "ascending")]
    for i, name in enumerate(order):
        column = table.column(name)
        if column.null_count:  # nulls first: sorted by "has a value", then by the value
            table = table.append_column(f"_pipe_has_{i}", pc.is_valid(column))
            sort_keys.append((f"_pipe_has_{i}", "ascending"))
        sort_keys.append((name, "ascending"))
    table = table.take(pc.sort_indices(table, sort_keys=sort_keys))
    keys = table.column(key)
    if len(keys) > 1:  # a row is its key's last when the next row's key differs
        last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).combine_chunks()
        table = table.filter(pa.concat_arrays([last, pa.array([True])]))
    return table.select([c for c in table.column_names if not c.startswith("_pipe_has_")])


def _delete_kind(ordering: L.OrderingValue | None, field_kind: str | None) -> str:
    """Under event time, Java's rule for a delete that follows a version of its key
    (HoodieMergedLogRecordScanner.processNextDeletedRecord, 0.14 to 1.x): an ordering value
    equal to Integer 0 (Java's default, Spark SQL DELETE's IntWrapper(0)) or of another class
    than the stored value's deletes whatever came before; one of the same class is compared
    with it (the stored version stays only if greater). A null (never written by Java) counts
    as the default."""
    if ordering is None or ordering.value is None or ordering == L.NATURAL_ORDER:
        return "by_commit_time"
    return "ordered" if ordering.type == field_kind else "by_commit_time"


def _ordering_array(values: list, arrow_type):
    """Delete ordering values as an array of the ordering column's type (a LongWrapper of a
    timestamp column holds its epoch micros); a value that does not fit is null."""
    import pyarrow as pa

    try:
        return pa.array(values).cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        out = []
        for v in values:
            try:
                out.append(pa.array([v]).cast(arrow_type)[0].as_py())
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                out.append(None)
        return pa.array(out, arrow_type)
