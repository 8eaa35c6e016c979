"""Table services that run between writes, under the writer lock: rollback of failed instants
and cleaning of old file versions. Each leaves its own instant on the timeline, with the Avro
plan and metadata Hudi's Java tools read (hudi-rs ignores these actions)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from runtime.table import avro
from runtime.table.layout import FileSystemView
from runtime.table.timeline import WRITE_ACTIONS
from runtime.table.timeline import (
    CLEAN, COMPLETED, HOODIE, INFLIGHT, REPLACECOMMIT, REQUESTED, ROLLBACK, Instant, Timeline, new_instant_time,
)

KEEP_LATEST_COMMITS, KEEP_LATEST_FILE_VERSIONS = "keep_latest_commits", "keep_latest_file_versions"


def _data_files_by_instant(storage) -> dict[str, list[str]]:
    """Base files of the table by the instant in their name (one listing)."""
    out: dict[str, list[str]] = {}
    for f in storage.list_files(""):
        name = f.path.rsplit("/", 1)[-1]
        if f.path.startswith(HOODIE + "/") or name.startswith(".") or not name.endswith(".parquet"):
            continue
        out.setdefault(name[-len("20240101000000000.parquet"):-len(".parquet")], []).append(f.path)
    return out


def rollback_pending(storage) -> list[str]:
    """Rolls back every requested or inflight write: plan (Avro), delete its data files, complete
    the rollback (Avro metadata), and only then remove the failed instant's own timeline files.
    (Removing those first could make the failed files look committed to a reader.)"""
    timeline = Timeline.load(storage)
    rolled = []
    by_instant = _data_files_by_instant(storage) if timeline.pending() else {}
    for failed in timeline.pending():
        if failed.action in (CLEAN, ROLLBACK):
            _finish_service(storage, failed)
            continue
        started = time.time()
        files = sorted(by_instant.get(failed.time, ()))
        by_partition: dict[str, list[str]] = {}
        for path in files:
            by_partition.setdefault(path.rpartition("/")[0], []).append(path)
        now = Instant(new_instant_time(Timeline.load(storage).last_time()), ROLLBACK, REQUESTED)
        plan = {
            "instantToRollback": {"commitTime": failed.time, "action": failed.action},
            "RollbackRequests": [
                {"partitionPath": p, "fileId": None, "latestBaseInstant": None,
                 "filesToBeDeleted": [storage.full_path(f) for f in fs], "logBlocksToBeDeleted": None}
                for p, fs in sorted(by_partition.items())
            ],
            "version": 1,
        }
        storage.write_atomic(f"{HOODIE}/{now.file_name()}", avro.to_bytes(avro.ROLLBACK_PLAN, plan))
        storage.write_atomic(f"{HOODIE}/{now.with_state(INFLIGHT).file_name()}", b"")
        for path in files:
            storage.delete(path)
        meta = {
            "startRollbackTime": now.time,
            "timeTakenInMillis": int((time.time() - started) * 1000),
            "totalFilesDeleted": len(files),
            "commitsRollback": [failed.time],
            "partitionMetadata": {
                p: {"partitionPath": p, "successDeleteFiles": [storage.full_path(f) for f in fs], "failedDeleteFiles": [],
                    "rollbackLogFiles": None, "logFilesFromFailedCommit": None}
                for p, fs in sorted(by_partition.items())
            },
            "version": 1,
            "instantsRollback": [{"commitTime": failed.time, "action": failed.action}],
        }
        storage.create_exclusive(f"{HOODIE}/{now.with_state(COMPLETED).file_name()}", avro.to_bytes(avro.ROLLBACK_METADATA, meta))
        for state in (INFLIGHT, REQUESTED):
            storage.delete(f"{HOODIE}/{failed.with_state(state).file_name()}")
        rolled.append(failed.time)
    return rolled


def _finish_service(storage, pending: Instant) -> None:
    """A clean or rollback that died half way: its plan is idempotent, so we drop the
    unfinished instant; the next clean plans again."""
    for state in (INFLIGHT, REQUESTED):
        storage.delete(f"{HOODIE}/{pending.with_state(state).file_name()}")


@dataclass(frozen=True)
class CleanResult:
    instant: str | None
    files_deleted: int
    earliest_retained: str | None


def plan_clean(view: FileSystemView, timeline: Timeline, policy: str, retain: int, keep_instants: set[str] = frozenset()) -> tuple[dict[str, list[str]], str | None]:
    """Files no retained instant needs, by partition.

    keep_latest_commits(N): every file version a query as of one of the last N commits could
    read stays: versions written at or after the earliest retained commit, plus, per group, the
    newest version older than it. keep_latest_file_versions(N): the N newest versions per group.
    The latest version of a live group always stays, and so does any version written at an
    instant in `keep_instants` (savepoints, consumers)."""
    commits = [i.time for i in timeline.completed()]
    groups: dict[tuple[str, str], list] = {}
    for bf in view.files:
        groups.setdefault((bf.partition, bf.file_id), []).append(bf)
    earliest = None
    doomed: dict[str, list[str]] = {}
    if policy == KEEP_LATEST_COMMITS:
        if len(commits) <= retain:
            return {}, None
        earliest = commits[-retain]
    for key, versions in groups.items():
        versions.sort(key=lambda b: b.instant, reverse=True)
        replaced_at = view.replaced.get(key)
        if policy == KEEP_LATEST_COMMITS:
            if replaced_at is not None and replaced_at < earliest:
                keep = set()  # replaced before every retained commit: no query needs it
            else:
                older = [b for b in versions if b.instant < earliest]
                keep = {b.name for b in versions if b.instant >= earliest} | ({older[0].name} if older else set())
        else:
            keep = {b.name for b in versions[:retain]}
            if replaced_at is not None:
                keep = set()
        for b in versions:
            if b.name not in keep and b.instant not in keep_instants:
                doomed.setdefault(b.partition, []).append(b.path)
    return {p: sorted(v) for p, v in doomed.items()}, earliest


def clean(storage, policy: str = KEEP_LATEST_COMMITS, retain: int = 10, keep_instants: set[str] = frozenset()) -> CleanResult:
    timeline = Timeline.load(storage)
    view = FileSystemView.load(storage, timeline)
    doomed, earliest = plan_clean(view, timeline, policy, retain, keep_instants)
    if not doomed:
        return CleanResult(None, 0, earliest)
    started = time.time()
    java_policy = policy.upper()
    inst = Instant(new_instant_time(timeline.last_time()), CLEAN, REQUESTED)
    earliest_inst = timeline.find(earliest) if earliest else None
    plan = {
        "earliestInstantToRetain": {"timestamp": earliest_inst.time, "action": earliest_inst.action, "state": "COMPLETED"} if earliest_inst else None,
        "policy": java_policy,
        "filesToBeDeletedPerPartition": None,
        "version": 2,
        "filePathsToBeDeletedPerPartition": {p: [{"filePath": storage.full_path(f), "isBootstrapBaseFile": False} for f in fs] for p, fs in doomed.items()},
        "partitionsToBeDeleted": [],
    }
    plan_bytes = avro.to_bytes(avro.CLEANER_PLAN, plan)
    storage.write_atomic(f"{HOODIE}/{inst.file_name()}", plan_bytes)
    storage.write_atomic(f"{HOODIE}/{inst.with_state(INFLIGHT).file_name()}", plan_bytes)
    deleted = 0
    for fs in doomed.values():
        for f in fs:
            storage.delete(f)
            deleted += 1
    latest = timeline.latest_completed()
    meta = {
        "policy": java_policy,
        "startCleanTime": inst.time,
        "timeTakenInMillis": int((time.time() - started) * 1000),
        "totalFilesDeleted": deleted,
        "earliestCommitToRetain": earliest or "",
        "lastCompletedCommitTimestamp": latest.time if latest else "",
        "partitionMetadata": {
            p: {"partitionPath": p, "policy": java_policy, "deletePathPatterns": [f.rpartition("/")[2] for f in fs],
                "successDeleteFiles": [f.rpartition("/")[2] for f in fs], "failedDeleteFiles": [], "isPartitionDeleted": None}
            for p, fs in doomed.items()
        },
        "version": 2,
        "bootstrapPartitionMetadata": None,
    }
    storage.create_exclusive(f"{HOODIE}/{inst.with_state(COMPLETED).file_name()}", avro.to_bytes(avro.CLEAN_METADATA, meta))
    return CleanResult(inst.time, deleted, earliest)



ARCHIVED = f"{HOODIE}/archived"


def archive(storage, min_instants: int = 20, max_instants: int = 30) -> list[str]:
    """Keeps the active timeline between min and max instants: once it holds more than
    `max_instants`, the oldest completed instants move to .hoodie/archived/ (their files, under
    the same names) until `min_instants` remain. Never past a pending instant, and the latest
    completed write always stays active, and so does a replacecommit until every file of
    the groups it replaced is cleaned: once archived, its partitionToReplaceFileIds is gone
    and those files would count as live again. Data files of archived commits stay readable:
    a reader takes files older than the whole active timeline as committed (HUDI_FORMAT.md 3).

    Java writes archived instants into Avro log files (.commits_.archive.N); pipe keeps the
    instant files themselves, which Java's archived-timeline reader skips and hudi-rs never reads."""
    timeline = Timeline.load(storage)
    instants = timeline.instants
    if len(instants) <= max_instants:
        return []
    latest_write = timeline.latest_completed()
    candidates = []
    live: set[tuple[str, str]] | None = None  # (partition, file id) of every file on storage
    for inst in instants[: len(instants) - min_instants]:
        if not inst.is_completed or (latest_write is not None and inst.time >= latest_write.time):
            break
        if inst.action == REPLACECOMMIT:
            if live is None:
                live = {(bf.partition, bf.file_id) for bf in FileSystemView.load(storage, timeline).files}
            replaced = timeline.read_json(inst).get("partitionToReplaceFileIds") or {}
            if any((p, fid) in live for p, ids in replaced.items() for fid in ids):
                break
        candidates.append(inst)
    if not candidates:
        return []
    # Files older than the first active instant count as committed. Before the boundary moves,
    # delete data files of instants in the range that never completed a write (a rolled-back
    # writer's late task output), so they cannot turn into committed data.
    new_first = instants[len(candidates)].time
    written = {i.time for i in timeline.completed(WRITE_ACTIONS)}
    first = instants[0].time
    for t, paths in _data_files_by_instant(storage).items():
        if t.isdigit() and first <= t < new_first and t not in written:
            for path in paths:
                storage.delete(path)
    moved = []
    for inst in candidates:
        names = [inst.with_state(s).file_name() for s in (REQUESTED, INFLIGHT, COMPLETED)]
        present = [n for n in names if storage.exists(f"{HOODIE}/{n}")]
        for n in present:
            storage.write_atomic(f"{ARCHIVED}/{n}", storage.read_bytes(f"{HOODIE}/{n}"))
        for n in present:  # the completed file goes last: until then the instant stays active
            storage.delete(f"{HOODIE}/{n}")
        moved.append(inst.time)
    return moved


def archived_instants(storage) -> list[Instant]:
    from runtime.table.timeline import parse_instant_file

    found = [parse_instant_file(f.path.rsplit("/", 1)[-1]) for f in storage.list_files(ARCHIVED, recursive=False)]
    return Timeline(storage, [i for i in found if i is not None]).instants
