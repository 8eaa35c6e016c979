"""Write I/O inside Spark executors: each task turns the Arrow batches of its partition into
Parquet base files under their exact Hudi names and yields one stats row per file. Only those
stats rows reach the driver.

Two modes:
- `groups`: rows arrive sorted by the target file id (`_pipe_file_id`); every run of one id
  becomes that file group's new base file (updates and inserts into existing groups).
- `bulk`: rows carry only their partition; the task opens a new file group per partition it
  sees and rolls to another once a file reaches the size limit (bulk_insert, new groups)."""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Iterator

FILE_ID = "_pipe_file_id"
SOURCE = "_pipe_src"  # 1: an incoming row (gets this instant's commit time), 0: a stored row
KIND = "_pipe_kind"  # I insert, U update, D delete, O a stored row carried over
STATS_SCHEMA = "file_id string, partition_path string, path string, rows long, size long"


@dataclass(frozen=True)
class FileWriteSpec:
    """Everything a task needs, picklable."""

    storage_uri: str
    storage_options: tuple
    instant: str
    data_columns: tuple[str, ...]  # in table order, without meta columns
    mode: str  # groups | bulk
    # groups mode: rows come sorted by (file id, key, source desc); keep the first row of each
    # key (the incoming one when there is one), then drop deletes
    merge: bool = False
    max_file_size: int = 120 * 1024 * 1024
    compression: str = "snappy"


def _token() -> tuple[str, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # driver-side use in tests
        return "0-0-0", 0
    return f"{ctx.partitionId()}-{ctx.stageId()}-{ctx.attemptNumber()}", ctx.partitionId()


class _OpenFile:
    def __init__(self, spec: FileWriteSpec, partition: str, file_id: str, token: str):
        import pyarrow.parquet as pq  # noqa: F401 - imported here, in the executor

        self.spec = spec
        self.partition = partition
        self.file_id = file_id
        self.name = f"{file_id}_{token}_{spec.instant}.parquet"
        self.rel_path = f"{partition}/{self.name}" if partition else self.name
        fd, self.local = tempfile.mkstemp(prefix="pipe-", suffix=".parquet")
        os.close(fd)
        self.writer = None
        self.rows = 0

    def write(self, table) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            self.writer = pq.ParquetWriter(self.local, table.schema, compression=self.spec.compression)
        self.writer.write_table(table)
        self.rows += table.num_rows

    def bytes_so_far(self) -> int:
        return os.path.getsize(self.local)

    def close(self) -> tuple:
        from runtime.storage import StorageSpec, open_storage

        self.writer.close()
        size = os.path.getsize(self.local)
        storage = open_storage(StorageSpec(self.spec.storage_uri, self.spec.storage_options))
        if hasattr(storage, "root"):  # local: move into place (same name once, complete)
            final = storage.full_path(self.rel_path)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            tmp = os.path.join(os.path.dirname(final), f".{self.name}.{uuid.uuid4().hex}.tmp")
            with open(self.local, "rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())  # durable before the commit that names it
            os.replace(tmp, final)
        else:
            with open(self.local, "rb") as src:
                storage.write_atomic(self.rel_path, src.read())
        os.unlink(self.local)
        return (self.file_id, self.partition, self.rel_path, self.rows, size)


def _with_meta(batch, open_file: _OpenFile, spec: FileWriteSpec, task_id: int, counter: list[int]):
    """Arrow table with the five meta columns first, then the data columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    names = batch.schema.names
    if SOURCE in names:
        incoming = pc.equal(batch.column(SOURCE), 1)
    else:
        incoming = pa.repeat(pa.scalar(True), n)
    numbers = pc.cast(pa.array(range(counter[0], counter[0] + n), pa.int64()), pa.string())
    seqnos = pc.binary_join_element_wise(pa.scalar(f"{spec.instant}_{task_id}_"), numbers, "")
    counter[0] += n
    commit_time = pa.repeat(pa.scalar(spec.instant), n)
    old_time = batch.column("_hoodie_commit_time") if "_hoodie_commit_time" in names else pa.nulls(n, pa.string())
    old_seq = batch.column("_hoodie_commit_seqno") if "_hoodie_commit_seqno" in names else pa.nulls(n, pa.string())
    columns = {
        "_hoodie_commit_time": pc.if_else(incoming, commit_time, old_time),
        "_hoodie_commit_seqno": pc.if_else(incoming, seqnos, old_seq),
        "_hoodie_record_key": batch.column("_hoodie_record_key"),
        "_hoodie_partition_path": pa.repeat(pa.scalar(open_file.partition), n),
        "_hoodie_file_name": pa.repeat(pa.scalar(open_file.name), n),
    }
    for c in spec.data_columns:
        columns[c] = batch.column(c)
    return pa.table(columns)


def write_task(spec: FileWriteSpec, batches: Iterator) -> Iterator:
    """The function given to mapInArrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    token, task_id = _token()
    counter = [0]
    last: tuple = (None, None)  # (file id, key) of the previous row, across batches
    stats = []
    open_files: dict[str, _OpenFile] = {}

    def emit(rows):
        return pa.RecordBatch.from_pylist(
            [dict(zip(("file_id", "partition_path", "path", "rows", "size"), r)) for r in rows],
            schema=pa.schema([("file_id", pa.string()), ("partition_path", pa.string()), ("path", pa.string()), ("rows", pa.int64()), ("size", pa.int64())]),
        )

    for batch in batches:
        if batch.num_rows == 0:
            continue
        if spec.mode == "groups":
            ids = batch.column(FILE_ID)
            parts = batch.column("_hoodie_partition_path")
            n = batch.num_rows
            # boundaries where the (sorted) file id changes
            changes = [0, n]
            if n > 1:
                moved = pc.indices_nonzero(pc.not_equal(ids.slice(1), ids.slice(0, n - 1))).to_pylist()
                changes = [0] + [i + 1 for i in moved] + [n]
            for a, b in zip(changes, changes[1:]):
                if a == b:
                    continue
                fid = ids[a].as_py()
                piece = batch.slice(a, b - a)
                if spec.merge:
                    keys = piece.column("_hoodie_record_key")
                    before = pa.concat_arrays([pa.array([last[1] if last[0] == fid else None], pa.string()), keys.slice(0, len(keys) - 1)])
                    last = (fid, keys[len(keys) - 1].as_py())
                    piece = piece.filter(pc.fill_null(pc.not_equal(keys, before), True))
                    piece = piece.filter(pc.not_equal(piece.column(KIND), "D"))
                current = open_files.get(fid)
                if current is None:
                    for other in list(open_files.values()):  # sorted input: the previous group is done
                        stats.append(other.close())
                    open_files.clear()
                    if piece.num_rows == 0:
                        continue  # nothing left of this group (all deleted): the driver handles it
                    current = open_files[fid] = _OpenFile(spec, parts[a].as_py(), fid, token)
                if piece.num_rows:
                    current.write(_with_meta(piece, current, spec, task_id, counter))
        else:  # bulk: a file group per partition path, rolled over by size
            parts = batch.column("_hoodie_partition_path")
            for value in pc.unique(parts).to_pylist():
                piece = batch.filter(pc.equal(parts, value))
                current = open_files.get(value)
                if current is None:
                    current = open_files[value] = _OpenFile(spec, value, f"{uuid.uuid4()}-0", token)
                current.write(_with_meta(piece, current, spec, task_id, counter))
                if current.bytes_so_far() >= spec.max_file_size:
                    stats.append(current.close())
                    del open_files[value]
    for current in open_files.values():
        stats.append(current.close())
    if stats:
        yield emit(stats)
