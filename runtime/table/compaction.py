"""Compaction of a merge-on-read table: every file slice with log files is merged (base rows and
log blocks, as the snapshot reader merges them) into a new base file of its file group
(HUDI_FORMAT.md 6.6):

    T.compaction.requested (Avro HoodieCompactionPlan) -> T.compaction.inflight (empty)
        -> executors write <fileId>_<token>_T.parquet -> T.commit (compacted: true, COMPACT)

The records keep their meta columns (commit time, sequence number); only `_hoodie_file_name`
names the new file. A compaction left pending (a Java writer scheduled it, or a compactor died)
is executed as its plan says: the plan's base file and log files of each group, merged into
`<fileId>_<token>_T.parquet`. Logs written into those groups after the plan are named with T
(readers merge them into the slice before T meanwhile, layout.py) and form the new slice with
the compaction's base file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from runtime.storage import path_problem
from runtime.table import bloom_index
from runtime.table.errors import TableError
from runtime.table.files import STATS_SCHEMA, FileWriteSpec, _OpenFile, _Task, stats_batch
from runtime.table.layout import BaseFile, FileSlice, LogFile, parse_base_file, parse_log_file
from runtime.table.merge import MergeSpec, SliceDescriptor, merge_slice, slices_in
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
        "extraMetadata": {SCHEDULED_BY: "pipe"},
        "version": 2,
    }


# marks a plan pipe scheduled: pipe finishes it after its next write (nobody else will), and
# leaves a plan another scheduler made to that scheduler's compactor
SCHEDULED_BY = "pipe.scheduledBy"


def scheduled_by_pipe(plan: dict) -> bool:
    return (plan.get("extraMetadata") or {}).get(SCHEDULED_BY) == "pipe"


def planned_slices(storage, table_name: str, instant: str, plan: dict) -> list[FileSlice]:
    """The file slices a pending compaction plan (pipe's or Java's, version 1 with full paths or
    2 with names) folds: each operation's base file and log files, as found on storage.
    Refuses what pipe cannot execute, naming the compaction, with nothing changed."""
    def refuse(what: str, crafted: bool = False) -> TableError:
        return TableError(f"table {table_name} has a pending compaction {instant} that pipe cannot execute: {what}",
                          f"no Hudi writer writes such a plan: inspect .hoodie/{instant}.compaction.requested (nothing was changed)" if crafted else
                          "execute it with Hudi (e.g. HoodieCompactor, or a Spark writer with hoodie.compact.inline=true); "
                          "pipe never rolls back a pending compaction")

    listed: dict[str, dict[str, int]] = {}
    out = []
    for op in plan.get("operations") or ():
        part = op.get("partitionPath") or ""
        problem = path_problem(part) if part else None
        if problem:
            raise refuse(f"its plan .hoodie/{instant}.compaction.requested names partition path {part!r} (file group {op.get('fileId')}): {problem}", crafted=True)
        if op.get("bootstrapFilePath"):
            raise refuse(f"file group {op.get('fileId')} has a bootstrap base file")
        if part not in listed:
            listed[part] = {i.path.rpartition("/")[2]: i.size for i in storage.list_files(part, recursive=False)}
        sizes = listed[part]
        name = (op.get("dataFilePath") or "").rpartition("/")[2]
        base: BaseFile | None = None
        if name:
            base = parse_base_file(part, name, sizes.get(name, -1))
            if base is None:
                raise refuse(f"its base file {name} is not a Parquet base file")
            if name not in sizes:
                raise refuse(f"its base file {part}/{name} is missing")
        logs: list[LogFile] = []
        for path in op.get("deltaFilePaths") or ():
            log_name = path.rpartition("/")[2]
            log = parse_log_file(part, log_name, sizes.get(log_name, -1))
            if log is None or log_name not in sizes:
                raise refuse(f"its log file {part}/{log_name} is missing")
            logs.append(log)
        logs.sort(key=lambda lf: (lf.version, lf.token))
        ids = {base.file_id} if base else set()
        ids |= {lf.file_id for lf in logs}
        file_id = op.get("fileId") or (base.file_id if base else logs[0].file_id if logs else "")
        if ids != {file_id}:
            raise refuse(f"its plan .hoodie/{instant}.compaction.requested has an operation for file group {file_id!r} whose files "
                         f"belong to {', '.join(sorted(ids)) or 'no file group'}", crafted=True)
        out.append(FileSlice(part, file_id, base, tuple(logs)))
    return out


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
    numbers, descriptors = slice_descriptors(spark, slices, per_core=4)

    def task(batches):
        return compact_task(spec, descriptors, batches)

    written = numbers.mapInArrow(task, STATS_SCHEMA).collect()
    bloom_index.remember(storage, written)
    return written


def compact_task(spec: CompactSpec, descriptors: tuple[tuple[SliceDescriptor, ...], ...], batches: Iterator) -> Iterator:
    """The function given to mapInArrow: task numbers in (reader.slice_descriptors), one stats row per slice out."""
    import pyarrow as pa

    task = _Task(spec.files)
    stats = []
    for partition, file_id, base_path, log_paths in slices_in(descriptors, batches):
        out = _OpenFile(spec.files, partition, file_id, task)
        try:
            for merged in merge_slice(spec.merge, task.storage, base_path, list(log_paths)):
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
        yield stats_batch(stats, task.key_ranges)


def _named(table, file_name: str):
    """Merged rows keep their meta columns but name the file they now live in."""
    import pyarrow as pa

    i = table.schema.get_field_index("_hoodie_file_name")
    return table.set_column(i, "_hoodie_file_name", pa.repeat(pa.scalar(file_name, pa.string()), table.num_rows))
