"""Write I/O inside Spark executors: each task turns the Arrow batches of its partition into
Parquet base files under their exact Hudi names and yields one stats row per file. Only those
stats rows reach the driver.

Two modes:
- `groups`: incoming rows arrive sorted by their target file id (`_pipe_file_id`); every run
  of one id becomes that file group's new base file. For an existing group the task reads
  the current base file itself and carries its rows over, less those whose keys the
  incoming rows replace or delete (Hudi's merge handle), so stored rows never cross a shuffle.
- `bulk`: rows carry only their partition; the task opens a new file group per partition it
  sees and rolls to another once a file reaches the size limit (bulk_insert, new groups)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from runtime.storage import temp_name
from runtime.table import markers

FILE_ID = "_pipe_file_id"
KIND = "_pipe_kind"  # I insert, U update, D delete
# one row per file written; a group left with no row has path "" (the driver writes it empty)
# `cdc`: the `.cdc` file written beside a rewritten base file of a CDC-enabled table, as
# "<path>\t<size>" ("" for none)
# `min_key`/`max_key`: the new base file's key range as its footer holds it (the driver keeps
# it for range pruning, bloom_index.remember, so it never reads back a footer pipe wrote).
STATS_SCHEMA = ("file_id string, partition_path string, path string, rows long, size long, inserts long, updates long, "
                "deletes long, cdc string, min_key string, max_key string")
_STATS_FIELDS = ("file_id", "partition_path", "path", "rows", "size", "inserts", "updates", "deletes", "cdc", "min_key", "max_key")


@dataclass(frozen=True)
class FileWriteSpec:
    """Everything a task needs, picklable."""

    storage_uri: str
    storage_options: tuple
    instant: str
    data_columns: tuple[str, ...]  # in table order, without meta columns
    mode: str  # groups | bulk
    # groups mode: a stored row whose key comes in again is dropped (the incoming row replaces
    # it, or deletes it); without merge (plain inserts into small files) every stored row stays
    merge: bool = False
    # groups mode: "partition/file id" -> the base file (relative path) of each existing group
    # the write rewrites; its rows are read in the task and carried over
    base_files: dict[str, str] = field(default_factory=dict)
    max_file_size: int = 120 * 1024 * 1024
    compression: str = "snappy"
    # merge-on-read, groups mode: "partition/file id" -> LogTarget of each group whose updates
    # and deletes go to a new log file of its slice instead of a new base file
    log_groups: dict[str, "LogTarget"] = field(default_factory=dict)
    log_schema: str = ""  # the Avro writer schema with the meta columns (log block header)
    ordering_field: str | None = None  # event-time tables: deletes carry its value, typed
    # merge-on-read: how a slice with logs is merged when its group must be rewritten whole
    # (its base file's columns no longer fit the table's); a merge.MergeSpec
    merge_spec: object = None
    # bulk mode: the record key and partition path computed in the task (Derived), when the
    # rows come without them
    derived: "Derived | None" = None
    # merge-on-read, bucket index: a stored group's inserts go to its log file too, as Java's
    # bucket index appends them (a stored bucket takes new keys as updates); otherwise a group taking inserts is
    # rewritten whole
    log_inserts: bool = False
    # a CDC-enabled table (cdc_log.py): its supplemental-logging mode and the CDC records' Avro
    # schema (JSON); a rewritten base file gets a `.cdc` file of the changes to its rows
    cdc_mode: str | None = None
    cdc_schema: str = ""


_LAST_4_DIGIT_DAY = 2932896  # 9999-12-31, in days since 1970-01-01


@dataclass(frozen=True)
class Derived:
    """Meta columns a bulk task computes from the data columns instead of receiving them from
    Spark: every string column that does not cross from the JVM to Python saves a copy per
    row. Only for types whose text pyarrow writes exactly as keygen.value_text does."""

    key_field: str | None = None  # the record key is this integer or string column as text
    partition_fields: tuple[str, ...] | None = None  # None: the partition path comes from Spark
    encoded_fields: frozenset[str] = frozenset()  # partition fields whose values are URL-encoded
    hive_style: bool = True
    key_prefix: str = ""  # `field:` before the key (a FIELD_PREFIXED ComplexKeyGenerator, keygen.py)

    def with_key(self, batch):
        """`batch` with _hoodie_record_key appended, when the task computes it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.key_field is None:
            return batch
        key = pc.cast(batch.column(self.key_field), pa.string())
        key = pc.if_else(pc.equal(key, ""), pa.scalar(None, pa.string()), key)  # no key: refused below, as in keygen.key_expr
        if self.key_prefix:
            key = pc.binary_join_element_wise(self.key_prefix, key, "")
        return pa.RecordBatch.from_arrays([*batch.columns, key], names=[*batch.schema.names, "_hoodie_record_key"])

    def split(self, batch) -> Iterator:
        """(partition path, rows) per partition path in `batch`, when the task computes the
        path: each partition column is dictionary-encoded, the path text is made once per
        distinct value (and combination of values), and the rows are grouped by code."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.partition_fields:
            yield "", batch
            return
        codes, paths = None, []  # per row, a code; per code, its partition path
        for name in self.partition_fields:
            encoded = pc.dictionary_encode(batch.column(name), null_encoding="encode")
            segments = self._path_texts(name, encoded.dictionary)
            indices = encoded.indices.cast(pa.int64())
            if codes is None:
                codes, paths = indices, segments
                continue
            # combinations seen, numbered again: codes stay below the batch's row count
            combined = pc.dictionary_encode(pc.add(pc.multiply(codes, len(segments)), indices))
            paths = [f"{paths[c // len(segments)]}/{segments[c % len(segments)]}" for c in combined.dictionary.to_pylist()]
            codes = combined.indices.cast(pa.int64())
        yield from _grouped(batch, codes, paths)

    def _path_texts(self, name: str, values) -> list[str]:
        """The partition path segment of each of `values` (a column's distinct values) as
        keygen.partition_expr makes it in Spark."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from runtime.table.layout import CONTROL, CONTROL_PATTERN, DEFAULT_PARTITION, ESCAPED

        text = pc.cast(values, pa.string())
        if pa.types.is_date(values.type):  # Spark writes a year past 9999 with a sign: +10000-01-01
            late = pc.greater(values, pa.scalar(_LAST_4_DIGIT_DAY, pa.date32()).cast(values.type))
            text = pc.if_else(late, pc.binary_join_element_wise("+", text, ""), text)
        if name in self.encoded_fields:
            for ch in ESCAPED:  # '%' first, as keygen.url_encode does
                text = pc.replace_substring(text, ch, f"%{ord(ch):02X}")
            if pc.any(pc.match_substring_regex(text, CONTROL_PATTERN)).as_py():
                for ch in CONTROL:
                    text = pc.replace_substring(text, ch, f"%{ord(ch):02X}")
        out = [v if v else DEFAULT_PARTITION for v in text.to_pylist()]
        return [f"{name}={v}" for v in out] if self.hive_style else out


@dataclass(frozen=True)
class LogTarget:
    """Where a merge-on-read group's new log file goes: its slice's base file (to match its
    Arrow schema), the base instant the log is named with, and the log version to write."""

    base_path: str | None
    base_size: int
    base_instant: str
    version: int
    log_paths: tuple[str, ...] = ()  # the slice's log files so far (relative paths)


# Rows of one file are gathered up to this many bytes of Arrow data before they are written
# as one Parquet row group (bounded memory per open file, few row groups per file).
ROW_GROUP_BYTES = 64 * 1024 * 1024
TASK_BUFFER_BYTES = 2 * ROW_GROUP_BYTES
BATCH_BYTES = 8 * 1024 * 1024  # Arrow batches are joined up to this size before they are split


def _token() -> tuple[str, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # driver-side use in tests
        return "0-0-0", 0
    return f"{ctx.partitionId()}-{ctx.stageId()}-{ctx.attemptNumber()}", ctx.partitionId()


class _OpenFile:
    def __init__(self, spec: FileWriteSpec, partition: str, file_id: str, task: _Task):
        from runtime.table.bloom import BloomFilterWriteSupport
        from runtime.table.layout import ensure_partition_metadata

        self.spec = spec
        self.partition = partition
        self.file_id = file_id
        self.name = f"{file_id}_{task.token}_{spec.instant}.parquet"
        self.rel_path = f"{partition}/{self.name}" if partition else self.name
        self.task = task
        self.storage = task.storage
        if partition not in task.known:  # checked once per partition by a task
            ensure_partition_metadata(self.storage, partition, spec.instant)
            task.known.add(partition)
        # Hudi's write marker, before the file (markers.py): Java's rollback finds it by it
        markers.create(self.storage, spec.instant, self.rel_path, markers.CREATE)
        self.final = None
        if hasattr(self.storage, "root"):
            # local: written beside its final place under a hidden name, renamed when complete
            self.final = self.storage.full_path(self.rel_path)
            os.makedirs(os.path.dirname(self.final), exist_ok=True)
            self.local = os.path.join(os.path.dirname(self.final), temp_name(spec.instant))
        else:
            fd, self.local = tempfile.mkstemp(prefix="pipe-", suffix=".parquet")
            os.close(fd)
        self.writer = None
        self.rows = 0
        # Arrow batches are small (spark.sql.execution.arrow.maxRecordsPerBatch); they are
        # gathered into row groups of ROW_GROUP_BYTES, so a file has few, large row groups
        self.pending: list = []
        self.pending_bytes = 0
        self.flushed_arrow_bytes = 0
        # the footer's bloom filter and key range (Java's BLOOM indexes need them)
        self.keys = BloomFilterWriteSupport()

    def write(self, table) -> None:
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        self.rows += table.num_rows
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.local, table.schema, compression=self.spec.compression,
                                           use_dictionary=_dictionary_columns(table.schema.names), store_schema=False)
            # readers see the columns' plain types: constants passed as dictionaries are strings
            self.writer.add_key_value_metadata({"ARROW:schema": _arrow_schema_text(table.schema)})
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.keys.add_keys(table.column("_hoodie_record_key"))
        self.flushed_arrow_bytes += self.pending_bytes
        self.pending, self.pending_bytes = [], 0

    def bytes_so_far(self) -> int:
        """Bytes on disk plus the pending rows, scaled by the compression seen so far."""
        on_disk = os.path.getsize(self.local) if self.writer is not None else 0
        ratio = on_disk / self.flushed_arrow_bytes if self.flushed_arrow_bytes else 1.0
        return on_disk + int(self.pending_bytes * ratio)

    def close(self) -> tuple:
        self._flush()
        self.writer.add_key_value_metadata(self.keys.finalize_metadata())
        self.writer.close()
        if self.keys.min_key is not None:
            self.task.key_ranges[self.rel_path] = (self.keys.min_key, self.keys.max_key)
        size = os.path.getsize(self.local)
        if self.final is not None:  # local: durable before the commit that names it, then renamed
            fd = os.open(self.local, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            from runtime.table.services import fault

            fault("task_before_rename")  # tests: a task dies with its file under the temporary name
            os.replace(self.local, self.final)
        else:
            with open(self.local, "rb") as src:
                self.storage.write_atomic(self.rel_path, src.read())
            os.unlink(self.local)
        return (self.file_id, self.partition, self.rel_path, self.rows, size)

    def discard(self) -> None:
        """A task that fails leaves no hidden file behind (best effort)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - already failing; the original error matters
                pass
        try:
            os.unlink(self.local)
        except OSError:
            pass


# Unique per row: a dictionary never pays off, so those columns skip the attempt.
_NO_DICTIONARY = ("_hoodie_commit_seqno", "_hoodie_record_key")


def _dictionary_columns(names) -> list[str]:
    return [n for n in names if n not in _NO_DICTIONARY]


def _with_meta(batch, open_file, spec: FileWriteSpec, task: _Task, carried: bool = False):
    """Arrow table with the five meta columns first, then the data columns. New rows get this
    instant's commit time and a sequence number; `carried` rows (stored rows kept by a
    rewrite) keep theirs. `open_file` gives the partition and the file name the rows name
    (an _OpenFile, or a _LogRows for log rows, which name the file id only)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    # base files take constant columns as dictionaries; the commit time is one only where
    # every row of the file is new (bulk mode): carried rows bring theirs as plain strings
    constant = _constant if isinstance(open_file, _OpenFile) else _repeated
    if carried:
        commit_times, seqnos = batch.column("_hoodie_commit_time"), batch.column("_hoodie_commit_seqno")
    else:
        first = task.sequence(n)
        numbers = pc.cast(pa.array(np.arange(first, first + n, dtype=np.int64)), pa.string())
        seqnos = pc.binary_join_element_wise(pa.scalar(f"{spec.instant}_{task.task_id}_"), numbers, "")
        commit_times = (constant if spec.mode == "bulk" else _repeated)(spec.instant, n)
    columns = {
        "_hoodie_commit_time": commit_times,
        "_hoodie_commit_seqno": seqnos,
        "_hoodie_record_key": batch.column("_hoodie_record_key"),
        "_hoodie_partition_path": constant(open_file.partition, n),
        "_hoodie_file_name": constant(open_file.name, n),
    }
    for c in spec.data_columns:
        column = batch.column(c)
        if pa.types.is_timestamp(column.type) and column.type.tz not in (None, "UTC"):
            # Spark hands timestamps over in its session time zone; stored as UTC instants,
            # tagged UTC (hudi-rs refuses files that tag them otherwise)
            column = column.cast(pa.timestamp(column.type.unit, "UTC"))
        columns[c] = column
    return pa.table(columns)


def _constant(value: str, n: int):
    """`value` n times, as a dictionary array: no n copies of the text to make, and the
    Parquet writer takes its one-entry dictionary as it is instead of hashing every row."""
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string()))


def _repeated(value: str, n: int):
    import pyarrow as pa

    return pa.repeat(pa.scalar(value, pa.string()), n)


def _arrow_schema_text(schema) -> str:
    """The ARROW:schema footer entry pyarrow writes for `schema` with every dictionary column
    given as its value type, so readers see the file exactly as if plain arrays were written."""
    import base64

    import pyarrow as pa

    plain = pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema], metadata=schema.metadata)
    return base64.b64encode(plain.serialize().to_pybytes()).decode("ascii")


def write_task(spec: FileWriteSpec, batches: Iterator) -> Iterator:
    """The function given to mapInArrow: in groups mode the rows come sorted by file id."""
    if spec.mode == "groups":
        groups = ((rows.column("_hoodie_partition_path")[0].as_py(), file_id, rows)
                  for file_id, rows in runs(_coalesced(batches, BATCH_BYTES), FILE_ID))
        yield from write_groups_task(spec, groups)
        return
    task = _Task(spec)
    with task.files_discarded_on_failure():
        _write_bulk(spec, batches, task)
    if task.stats:
        yield stats_batch(task.stats, task.key_ranges)


def write_groups_task(spec: FileWriteSpec, groups: Iterator, threads: int = 1) -> Iterator:
    """Writes each of `groups` (partition, file id, its rows as an Arrow table with the kind
    column) as its file group's new base file, or new log file, and yields the stats rows.
    With `threads` > 1 up to that many groups are written at once: pyarrow's reading, merging
    and encoding run outside the GIL, so the cores the task's executor has spare do the work
    (partition_upsert: a batch of fewer partitions than cores)."""
    task = _Task(spec)
    with task.files_discarded_on_failure():
        if threads <= 1:
            for partition, file_id, rows in groups:
                task.stats.append(_write_group(spec, partition, file_id, rows, task))
        else:
            _write_groups_at_once(spec, groups, task, threads)
    if task.stats:
        yield stats_batch(task.stats, task.key_ranges)


def _write_groups_at_once(spec: FileWriteSpec, groups: Iterator, task: _Task, threads: int) -> None:
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(threads, thread_name_prefix="pipe-group") as pool:
        pending: set = set()
        try:
            for partition, file_id, rows in groups:
                if len(pending) >= threads:  # at most `threads` groups written at once
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    task.stats.extend(f.result() for f in done)
                pending.add(pool.submit(_write_group, spec, partition, file_id, rows, task))
        finally:
            done, pending = wait(pending)  # every thread has stopped before a failure discards files
        task.stats.extend(f.result() for f in done)


class _Task:
    """What one write task shares across the files it writes: its write token, its storage
    client, its commit sequence numbers, its open files (discarded if it fails) and its stats
    rows. Made on the task's own thread: the storage client is built there once (boto3 builds
    clients unsafely from several threads; a client is safe to share)."""

    def __init__(self, spec: FileWriteSpec):
        import threading

        from runtime.storage import StorageSpec, open_storage

        self.storage = open_storage(StorageSpec(spec.storage_uri, spec.storage_options))
        self.token, self.task_id = _token()
        self.open_files: dict[str, _OpenFile] = {}
        self.stats: list[tuple] = []
        self.key_ranges: dict[str, tuple[str, str]] = {}  # base file path -> its footer's key range
        self.known: set[str] = set()  # partitions whose metadata file this task has made sure of
        self._next = 0
        self._lock = threading.Lock()

    def sequence(self, n: int) -> int:
        """The first of n sequence numbers for new rows (_hoodie_commit_seqno), unique in the task."""
        with self._lock:
            start, self._next = self._next, self._next + n
        return start

    @contextlib.contextmanager
    def files_discarded_on_failure(self):
        try:
            yield
        except BaseException:
            for f in list(self.open_files.values()):
                f.discard()
            raise


def stats_batch(stats: list[tuple], key_ranges: dict[str, tuple[str, str]] | None = None):
    """The stats rows of a task (STATS_SCHEMA) as one Arrow batch; `key_ranges` (the task's,
    by path) fill each base file's min_key and max_key."""
    import pyarrow as pa

    ranges = key_ranges or {}
    width = len(_STATS_FIELDS) - 2  # the stats tuples' fields; the key range comes from `key_ranges`
    rows = []
    for r in stats:
        row = dict(zip(_STATS_FIELDS, (*r, *("",) * (width - len(r)))))
        row["min_key"], row["max_key"] = ranges.get(row["path"], (None, None))
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=stats_arrow_schema())


def stats_arrow_schema():
    """STATS_SCHEMA as an Arrow schema."""
    import pyarrow as pa

    return pa.schema(list(zip(_STATS_FIELDS, [pa.string()] * 3 + [pa.int64()] * 5 + [pa.string()] * 3)))


def _write_bulk(spec: FileWriteSpec, batches: Iterator, task: _Task) -> None:
    """Bulk mode: a file group per partition path the task sees, rolled over by size; appends
    a stats row per file closed."""
    open_files = task.open_files
    derived = spec.derived
    for batch in _coalesced(batches, BATCH_BYTES):
        if derived is not None:
            batch = derived.with_key(batch)
        _refuse_keyless(batch)
        pieces = derived.split(batch) if derived is not None and derived.partition_fields is not None else _split_by_partition(batch)
        for value, piece in pieces:
            current = open_files.get(value)
            if current is None:
                _refuse_unsafe_partition(spec, value, piece)
                current = open_files[value] = _OpenFile(spec, value, f"{uuid.uuid4()}-0", task)
            current.write(_with_meta(piece, current, spec, task))
            if current.bytes_so_far() >= spec.max_file_size:
                task.stats.append(_all_inserts(current.close()))
                del open_files[value]
        _keep_within_budget(open_files)
    for key in list(open_files):
        task.stats.append(_all_inserts(open_files.pop(key).close()))


def _refuse_keyless(batch) -> None:
    """A bulk insert's rows without a record key (null: keygen.key_expr) stop the task, naming
    one of them; the write is then rolled back."""
    import json

    import pyarrow.compute as pc

    if "_hoodie_record_key" not in batch.schema.names:
        return
    keys = batch.column("_hoodie_record_key")
    keyless = pc.fill_null(pc.equal(keys, ""), True)
    missing = pc.sum(keyless).as_py() if len(keys) else 0
    if not missing:
        return
    from runtime.table.errors import WriteError

    row = batch.filter(keyless).slice(0, 1).to_pylist()[0]
    shown = json.dumps({k: v for k, v in row.items() if not k.startswith(("_hoodie_", "_pipe_"))}, default=str, ensure_ascii=False)
    raise WriteError(f"{missing} row(s) have no record key: the key columns are null or empty, and Hudi refuses such a key "
                     f"(HoodieKeyException); e.g. {shown}. Every row needs a key: filter those rows out or give them a value "
                     f"(e.g. coalesce(...) in the table's SQL); the write is rolled back")


def _refuse_unsafe_partition(spec: FileWriteSpec, partition: str, rows) -> None:
    """Stops the task before a file is written in a partition whose path a row's values made
    unfit for a folder of the table (layout.unsafe_partition: '..', '.hoodie', ...), naming the
    path and one of its rows; the write is then rolled back."""
    import json

    from runtime.table.layout import unsafe_partition

    reason = unsafe_partition(partition)
    if reason is None:
        return
    from runtime.table.errors import WriteError

    row = rows.slice(0, 1).to_pylist()[0] if rows.num_rows else {}
    shown = json.dumps({k: v for k, v in row.items() if k not in (FILE_ID, KIND) and not k.startswith(("_hoodie_", "_pipe_"))},
                       default=str, ensure_ascii=False)
    raise WriteError(f"table {spec.storage_uri.rstrip('/').rsplit('/', 1)[-1]}: the partition path {partition!r} made from a row's "
                     f"partition values cannot be a folder of the table: {reason}; e.g. row {shown}. Partition values become folder "
                     f"names (without hive_style_partitioning, the bare value; a '/' nests folders, as in Hudi): clean or filter "
                     f"such values in the table's SQL; the write is rolled back")


def _all_inserts(stat: tuple) -> tuple:
    return (*stat, stat[3], 0, 0)


def runs(batches: Iterator, column: str) -> Iterator:
    """(value, rows as one Arrow table) per run of equal `column` values, from batches sorted
    by that column; a run may span batches."""
    import pyarrow as pa
    import pyarrow.compute as pc

    current, pieces = None, []
    for batch in batches:
        values = batch.column(column)
        n = batch.num_rows
        bounds = [0] + [i + 1 for i in pc.indices_nonzero(pc.not_equal(values.slice(1), values.slice(0, n - 1))).to_pylist()] + [n] if n > 1 else [0, n]
        for a, b in zip(bounds, bounds[1:]):
            value = values[a].as_py()
            if value != current and pieces:
                yield current, pa.Table.from_batches(pieces)
                pieces = []
            current = value
            pieces.append(batch.slice(a, b - a))
    if pieces:
        yield current, pa.Table.from_batches(pieces)


def _write_group(spec: FileWriteSpec, partition: str, file_id: str, rows, task: _Task) -> tuple:
    """A file group's new base file: its stored rows in their order, each one the incoming rows
    replace (when merging) in its place and each one they delete left out, then the other
    incoming rows (the inserts), as Hudi's merge handle writes them. Returns the stats row,
    with counts of inserts, updates and deletes; its path is "" when no row is left (the
    driver writes the empty base file)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    base = spec.base_files.get(f"{partition}/{file_id}")
    if KIND in rows.column_names:
        kinds = rows.column(KIND)
        counts = tuple(pc.sum(pc.equal(kinds, k)).as_py() or 0 for k in ("I", "U", "D"))
    else:
        counts = (rows.num_rows, 0, 0)
    # merge-on-read: a group taking inserts (a small file) is rewritten whole, as Hudi does;
    # otherwise its updates and deletes go to a new log file
    log = spec.log_groups.get(f"{partition}/{file_id}") if not counts[0] or spec.log_inserts else None
    if log is not None:
        try:
            return _write_log(spec, partition, file_id, rows, log, task)
        except LogSchemaMismatch:
            pass  # the base file's columns no longer fit the table's: the group is rewritten whole below
    if spec.merge:
        replaced = pc.unique(rows.column("_hoodie_record_key"))
    changes = rows if spec.cdc_mode and base is not None else None  # an existing base file rewritten: its .cdc
    before: list = []
    if KIND in rows.column_names:
        rows = rows.filter(pc.not_equal(rows.column(KIND), "D"))
    _refuse_unsafe_partition(spec, partition, rows)
    out = task.open_files[f"{partition}/{file_id}"] = _OpenFile(spec, partition, file_id, task)
    # the record key and the table's columns, without the write's working columns (_pipe_*): a
    # data column may start with _pipe_ too (a quarantine table's)
    data = set(spec.data_columns)
    schema = pa.schema([f for f in rows.schema if f.name in data or not f.name.startswith("_pipe_")])
    if log is not None and log.log_paths:  # merge-on-read: the slice as readers see it, base and logs merged
        stored_rows = _merged_batches(out.storage, spec.merge_spec, base, log.log_paths, schema)
    elif base is not None:
        stored = _open_stored(out.storage, base)
        stored_rows = _stored_batches(stored, schema)
        # every stored key stays (updated or carried): the stored filter goes on, with the inserts' keys
        if spec.merge and not counts[2] and out.keys.continue_from(stored.metadata.metadata, stored.metadata.num_rows):
            out.keys.add_new_keys(rows.column("_hoodie_record_key") if KIND not in rows.column_names
                                  else rows.filter(pc.not_equal(rows.column(KIND), "U")).column("_hoodie_record_key"))
    else:
        stored_rows = ()
    placed = np.zeros(rows.num_rows, dtype=bool)  # incoming rows written in their stored row's place
    for stored in stored_rows:
        updates = None
        if spec.merge:
            hit = pc.is_in(stored.column("_hoodie_record_key"), value_set=replaced)
            if changes is not None:
                before.append(stored.filter(hit))
            if pc.any(hit).as_py():
                updates = _updates_in_place(stored.column("_hoodie_record_key"), hit, rows, placed)
                stored = stored.filter(pc.invert(hit))
        if updates is not None and len(updates[0]):
            out.write(_interleaved(_with_meta(stored, out, spec, task, carried=True),
                                   _with_meta(rows.take(updates[0]), out, spec, task), updates[1]))
        elif stored.num_rows:
            out.write(_with_meta(stored, out, spec, task, carried=True))
    # then the rows no stored row had the key of (inserts), in their order
    for batch in (rows.filter(pa.array(~placed)) if placed.any() else rows).to_batches(max_chunksize=1 << 16):
        if batch.num_rows:
            out.write(_with_meta(batch, out, spec, task))
    del task.open_files[f"{partition}/{file_id}"]
    cdc = _write_cdc(spec, partition, file_id, changes, before, task) if changes is not None else ""
    if not out.rows:
        out.discard()
        return (file_id, partition, "", 0, 0, *counts, cdc)
    return (*out.close(), *counts, cdc)


def _updates_in_place(keys, hit, rows, placed):
    """For a stored batch's keys, of which `hit` (a boolean array) are among the incoming keys:
    the incoming `rows` (those written: deletes are out) replacing stored rows, and where each
    goes among the stored rows kept (how many kept rows come before it), in stored order, as
    Java's merge handle writes them: every stored row in its place, updated or not, then the
    inserts. A key the stored rows hold twice is written once, where it first was. `placed`
    (one flag per incoming row) notes the rows taken."""
    import numpy as np
    import pyarrow.compute as pc

    at = pc.index_in(keys, value_set=rows.column("_hoodie_record_key"))
    where = np.flatnonzero(pc.is_valid(at).to_numpy(zero_copy_only=False))
    taken = pc.drop_null(at).to_numpy().astype(np.int64)
    _, first = np.unique(taken, return_index=True)
    first.sort()
    first = first[~placed[taken[first]]]
    where, taken = where[first], taken[first]
    placed[taken] = True
    kept = ~hit.to_numpy(zero_copy_only=False)
    kept_before = np.cumsum(kept)[where] - kept[where]
    return taken, kept_before


def _interleaved(kept, updates, kept_before):
    """The kept stored rows with each of `updates` put after kept_before[i] of them: slices (no
    row copied) for a few runs of updates, one take for many."""
    import numpy as np
    import pyarrow as pa

    # a run of updates between the same two kept rows is one slice
    starts = np.flatnonzero(np.diff(kept_before, prepend=-1)).tolist() + [len(kept_before)]
    if len(starts) > 64:  # many updates among kept rows: one take puts each in its place
        order = np.argsort(np.concatenate([2 * np.arange(kept.num_rows) + 1, 2 * kept_before]), kind="stable")
        return pa.concat_tables([kept, updates]).take(pa.array(order))
    pieces, at = [], 0
    for first, end in zip(starts, starts[1:]):
        k = int(kept_before[first])
        if k > at:
            pieces.append(kept.slice(at, k - at))
            at = k
        pieces.append(updates.slice(first, end - first))
    if at < kept.num_rows:
        pieces.append(kept.slice(at))
    return pa.concat_tables(pieces)


def _write_cdc(spec: FileWriteSpec, partition: str, file_id: str, changes, before: list, task: _Task) -> str:
    """The `.cdc` file of a rewritten base file (cdc_log.py), as Hudi's merge handle with change
    log writes it: one record per key the write inserted (`i`), updated (`u`) or deleted (`d`),
    with the images the table's mode keeps (rows without the meta fields); a stale update was
    dropped before, so it changes nothing. Written even when nothing changed (an empty block,
    as Hudi 1.1 does): Java's CDC reader fails on a rewritten base file without one. Returns
    the stats row's `cdc` value."""
    import json

    from runtime.table import cdc_log

    data = list(spec.data_columns)
    stored: dict[str, dict] = {}
    for t in before:
        for r in t.select([c for c in data if c in t.column_names] + ["_hoodie_record_key"]).to_pylist():
            key = r.pop("_hoodie_record_key")
            stored[key] = {c: r.get(c) for c in data}
    kinds = changes.column(KIND).to_pylist() if KIND in changes.column_names else ["I"] * changes.num_rows
    keys = changes.column("_hoodie_record_key").to_pylist()
    present = [c for c in data if c in changes.column_names]
    after_rows = changes.select(present).to_pylist() if present else [{}] * changes.num_rows
    records = []
    for kind, key, after in zip(kinds, keys, after_rows):
        old = stored.get(key)
        if kind == "D":
            if old is None:
                continue  # nothing stored here under that key: no change
            op, image_before, image_after = cdc_log.DELETE, old, None
        else:
            op = cdc_log.UPDATE if old is not None else cdc_log.INSERT
            image_before, image_after = old, {c: after.get(c) for c in data}
        if spec.cdc_mode == cdc_log.OP_KEY_ONLY:
            records.append({"op": op, "record_key": key})
        elif spec.cdc_mode == cdc_log.DATA_BEFORE:
            records.append({"op": op, "record_key": key, "before": image_before})
        else:
            records.append({"op": op, "ts_ms": spec.instant, "before": image_before, "after": image_after})
    body = cdc_log.encode(spec.instant, json.loads(spec.cdc_schema), records)
    name = cdc_log.file_name(file_id, spec.instant, task.token)
    rel = f"{partition}/{name}" if partition else name
    markers.create(task.storage, spec.instant, rel, markers.CREATE)  # a rollback deletes it
    _put_once(task.storage, rel, body, spec.instant)
    return f"{rel}\t{len(body)}"


@dataclass(frozen=True)
class _LogRows:
    partition: str
    name: str  # log rows carry the file id as _hoodie_file_name (HUDI_FORMAT 4.1)


def _write_log(spec: FileWriteSpec, partition: str, file_id: str, rows, log: LogTarget, task: _Task) -> tuple:
    """A merge-on-read group's updates and deletes as one new log file of its slice: a
    Parquet data block in the base file's exact Arrow schema, then a delete block. The file
    is written once, complete, and never appended to. Returns its stats row."""
    import pyarrow.compute as pc

    from runtime.table import logfile

    storage = task.storage
    kinds = rows.column(KIND)
    deletes = rows.filter(pc.equal(kinds, "D"))
    updates = rows.filter(pc.not_equal(kinds, "D"))
    blocks = []
    if log.base_path is None:  # a log-only slice (Java makes them): its logs get a base file
        raise LogSchemaMismatch(f"file group {file_id} has no base file")
    if updates.num_rows:
        table = _with_meta(updates, _LogRows(partition, file_id), spec, task)
        table = _conform(table, parquet_schema(storage, log.base_path, log.base_size), log.base_path)
        blocks.append(logfile.parquet_block(spec.instant, spec.log_schema, table))
    if deletes.num_rows:
        blocks.extend(logfile.delete_blocks(spec.instant, _delete_records(deletes, partition, spec.ordering_field), spec.log_schema))
    name = logfile.LogFileName(file_id, log.base_instant, log.version, task.token).name
    rel = f"{partition}/{name}" if partition else name
    data = b"".join(logfile.encode_block(b) for b in blocks)
    markers.create(storage, spec.instant, rel, markers.APPEND)  # Java's log writers mark APPEND
    _put_once(storage, rel, data, spec.instant)
    inserts = pc.sum(pc.equal(updates.column(KIND), "I")).as_py() or 0 if updates.num_rows else 0
    return (file_id, partition, rel, updates.num_rows, len(data), inserts, updates.num_rows - inserts, deletes.num_rows)


def _delete_records(deletes, partition: str, ordering_field: str | None) -> list[tuple]:
    """(key, partition, ordering value) of each delete, as Java writes them. Under event time a
    delete row's precombine value goes with it, wrapped as Java wraps the column's values (a
    reader applies it only over older versions, as the writer does with stored rows); a delete
    by key, or on a commit-time table, carries Java's default IntWrapper(0): it deletes
    whatever came before."""
    from runtime.table import logfile

    keys = deletes.column("_hoodie_record_key").to_pylist()
    if not ordering_field or ordering_field not in deletes.column_names:
        return [(k, partition, logfile.NATURAL_ORDER) for k in keys]
    values = logfile.ordering_values(deletes.column(ordering_field).combine_chunks())
    return list(zip(keys, [partition] * len(keys), values))


class LogSchemaMismatch(RuntimeError):
    """Rows whose columns differ from the base file they would be merged with."""


def _conform(table, schema, where: str):
    """`table` in the base file's Arrow schema: readers concatenate base and log batches."""
    import pyarrow as pa

    schema = schema.remove_metadata()
    if table.schema.names != schema.names:
        raise LogSchemaMismatch(f"the columns of base file {where} ({', '.join(schema.names)}) differ from the table's "
                                f"({', '.join(table.schema.names)})")
    if table.schema.equals(schema):
        return table
    for ours, theirs in zip(table.schema, schema):
        if ours.type != theirs.type and not _wider_int(theirs.type, ours.type):
            raise LogSchemaMismatch(f"column {ours.name} is {theirs.type} in base file {where} but {ours.type} in the table")
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise LogSchemaMismatch(f"the rows do not fit the types of base file {where}: {exc}") from exc


def _wider_int(stored, ours) -> bool:
    """A base file's integer column at least as wide as the table's (Hudi stores byte and
    short as int): log rows take the base file's type without loss."""
    import pyarrow.types as t

    return t.is_integer(stored) and t.is_integer(ours) and stored.bit_width >= ours.bit_width


def _put_once(storage, rel_path: str, data: bytes, instant: str) -> None:
    """Writes a complete file under its final name in one step: locally a synced hidden file
    named with the instant (so rollback finds it if the task dies), renamed into place; on
    object stores a single PUT."""
    storage.write_atomic(rel_path, data, temp_tag=instant)


def parquet_schema(storage, rel_path: str, size: int):
    """The Arrow schema of a stored Parquet file, read from its footer alone."""
    return parquet_footer(storage, rel_path, size).schema.to_arrow_schema()


def parquet_footer(storage, rel_path: str, size: int):
    """The footer (pyarrow FileMetaData) of a stored Parquet file: locally the file's tail, on
    object stores two ranged reads."""
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq

    if hasattr(storage, "root"):
        return pq.read_metadata(storage.full_path(rel_path))
    tail = storage.read_range(rel_path, size - 8, size)
    (footer_length,) = struct.unpack("<i", tail[:4])
    footer = storage.read_range(rel_path, size - 8 - footer_length, size)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))


def _merged_batches(storage, merge_spec, base: str | None, log_paths, schema) -> Iterator:
    """The rows of a merge-on-read slice (base file and logs merged, as readers see them) in
    batches, shaped like _stored_batches."""
    from runtime.table.merge import merge_slice

    for batch in merge_slice(merge_spec, storage, base, list(log_paths)):
        if batch.num_rows:
            yield _carried(batch, set(batch.schema.names), schema)


def _open_stored(storage, rel_path: str):
    """A stored base file, opened (its footer read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if hasattr(storage, "root"):
        return pq.ParquetFile(storage.full_path(rel_path))
    return pq.ParquetFile(pa.BufferReader(storage.read_bytes(rel_path)))


def _stored_batches(stored, schema) -> Iterator:
    """The rows of a stored base file (_open_stored) in batches, with the data columns of
    `schema` (the table's, as the incoming rows have them): a column the file lacks is null,
    a widened column is cast."""
    present = set(stored.schema_arrow.names)
    wanted = [f for f in schema if f.name != "_hoodie_partition_path"]
    meta = [c for c in ("_hoodie_commit_time", "_hoodie_commit_seqno") if c in present]
    columns = meta + [f.name for f in wanted if f.name in present]
    for batch in stored.iter_batches(batch_size=1 << 16, columns=columns):
        yield _carried(batch, present, schema)


def _carried(batch, present: set, schema):
    """A stored batch with the commit time and sequence number it had, then the data columns
    of `schema` (a column the batch lacks is null, a widened one is cast)."""
    import pyarrow as pa

    wanted = [f for f in schema if f.name != "_hoodie_partition_path"]
    arrays, names = [], []
    for c in ("_hoodie_commit_time", "_hoodie_commit_seqno"):
        if c in present:
            arrays.append(batch.column(c))
            names.append(c)
    for f in wanted:
        if f.name in present:
            col = batch.column(f.name)
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, f.type))
        names.append(f.name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _coalesced(batches: Iterator, target: int) -> Iterator:
    """Spark's Arrow batches joined into batches of at most about `target` bytes: fewer,
    larger steps for the Arrow kernels when Spark sends small batches
    (spark.sql.execution.arrow.maxRecordsPerBatch). A batch that would take the joined size
    past `target` starts the next one, so batches already near `target` pass through uncopied."""
    held: list = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if held and size + batch.nbytes > target:
            yield _one_batch(held)
            held, size = [], 0
        held.append(batch)
        size += batch.nbytes
    if held:
        yield _one_batch(held)


def _one_batch(batches: list):
    import pyarrow as pa

    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _split_by_partition(batch):
    """(partition path, rows) for each partition path in the batch, in one pass."""
    import pyarrow.compute as pc

    codes = pc.dictionary_encode(batch.column("_hoodie_partition_path"))
    yield from _grouped(batch, codes.indices, codes.dictionary.to_pylist())


def _grouped(batch, codes, names: list) -> Iterator:
    """(names[code], rows) for each code in `codes` (one per row of `batch`), in code order."""
    import pyarrow.compute as pc

    present = pc.value_counts(codes)
    counts = sorted(zip(present.field("values").to_pylist(), present.field("counts").to_pylist()))
    grouped = batch if len(counts) == 1 else batch.take(pc.sort_indices(codes))
    start = 0
    for code, count in counts:
        yield names[code], grouped.slice(start, count)
        start += count


def _keep_within_budget(open_files: dict) -> None:
    """A bulk task may hold a file per partition open: their pending rows together stay
    under TASK_BUFFER_BYTES (the fullest is written out first)."""
    while sum(f.pending_bytes for f in open_files.values()) > TASK_BUFFER_BYTES:
        max(open_files.values(), key=lambda f: f.pending_bytes)._flush()
