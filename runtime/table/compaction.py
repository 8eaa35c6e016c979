"""Compaction of a merge-on-read table: every file slice with log files is merged (base rows and
log blocks, as the snapshot reader merges them) into a new base file of its file group
(HUDI_FORMAT.md 6.6):

    T.compaction.requested (Avro HoodieCompactionPlan) -> T.compaction.inflight (empty)
        -> executors write <fileId>_<token>_T.parquet -> T.commit (compacted: true, COMPACT)

The records keep their meta columns (commit time, sequence number); only `_hoodie_file_name`
names the new file. pipe compacts under the table's lock, with no write in between (inline
after a deltacommit, or `pipe compact`), so a pending compaction never hides later logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from runtime.table.files import STATS_SCHEMA, FileWriteSpec, _OpenFile, _Task, stats_batch
from runtime.table.layout import FileSlice
from runtime.table.merge import MergeSpec, merge_slice
from runtime.table.reader import slice_descriptors


def plan(slices: list[FileSlice]) -> dict:
    """The HoodieCompactionPlan (version 2: file names relative to the partition)."""
    return {
        "operations": [
            {
                "baseInstantTime": s.base_instant,
                "deltaFilePaths": [lf.name for lf in s.log_files],
                "dataFilePath": s.base_file.name if s.base_file else None,
                "fileId": s.file_id,
                "partitionPath": s.partition,
                "metrics": {
                    "TOTAL_LOG_FILES": float(len(s.log_files)),
                    "TOTAL_LOG_FILES_SIZE": float(sum(lf.size for lf in s.log_files)),
                    "TOTAL_IO_READ_MB": float((s.base_file.size if s.base_file else 0) + sum(lf.size for lf in s.log_files)) / (1 << 20),
                },
                "bootstrapFilePath": None,
            }
            for s in slices
        ],
        "extraMetadata": None,
        "version": 2,
    }


@dataclass(frozen=True)
class CompactSpec:
    files: FileWriteSpec  # where and under which instant the new base files go
    merge: MergeSpec  # how the slices are merged (the snapshot as of the latest write)


def run(spark, storage, instant: str, slices: list[FileSlice], merge_spec: MergeSpec) -> list:
    """Executors merge each slice and write its new base file; returns the stats rows (path ""
    for a slice whose every row was deleted)."""
    files = FileWriteSpec(storage_uri=storage.spec.uri, storage_options=storage.spec.options, instant=instant,
                          data_columns=(), mode="compact")
    spec = CompactSpec(files, merge_spec)
    descriptors = slice_descriptors(spark, slices, per_core=4)

    def task(batches):
        return compact_task(spec, batches)

    return descriptors.mapInArrow(task, STATS_SCHEMA).collect()


def compact_task(spec: CompactSpec, batches: Iterator) -> Iterator:
    """The function given to mapInArrow: slice descriptors in, one stats row per slice out."""
    import pyarrow as pa

    task = _Task(spec.files)
    stats = []
    for batch in batches:
        for partition, file_id, base_path, log_paths in zip(*(batch.column(c).to_pylist() for c in ("partition", "file_id", "base_path", "log_paths"))):
            out = _OpenFile(spec.files, partition, file_id, task)
            try:
                for merged in merge_slice(spec.merge, task.storage, base_path, log_paths or []):
                    if merged.num_rows:
                        out.write(_named(pa.Table.from_batches([merged]), out.name))
            except BaseException:
                out.discard()
                raise
            if out.rows:
                stats.append((*out.close(), 0, out.rows, 0))
            else:
                out.discard()
                stats.append((file_id, partition, "", 0, 0, 0, 0, 0))
    if stats:
        yield stats_batch(stats)


def _named(table, file_name: str):
    """Merged rows keep their meta columns but name the file they now live in."""
    import pyarrow as pa

    i = table.schema.get_field_index("_hoodie_file_name")
    return table.set_column(i, "_hoodie_file_name", pa.repeat(pa.scalar(file_name, pa.string()), table.num_rows))
