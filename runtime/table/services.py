"""Table services that run between writes, under the writer lock: rollback of failed instants
and cleaning of old file versions. Each leaves its own instant on the timeline, with the Avro
plan and metadata Hudi's Java tools read (hudi-rs ignores these actions)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from runtime.table import avro
from runtime.table import heartbeat, markers
from runtime.table.errors import TableError
from runtime.table import tombstones
from runtime.table.layout import FileSystemView
from runtime.table.timeline import WRITE_ACTIONS
from runtime.table.timeline import (  # noqa: F401 - archived_instants: used by callers of this module
    ARCHIVED, CLEAN, CLUSTERING, COMMIT, COMPACTION, COMPLETED, HOODIE, INFLIGHT, REPLACECOMMIT, REQUESTED, RESTORE, ROLLBACK, SAVEPOINT,
    Instant, Timeline, archived_instants, archived_write_metadata,
)

KEEP_LATEST_COMMITS, KEEP_LATEST_FILE_VERSIONS = "keep_latest_commits", "keep_latest_file_versions"


# a data file a task was still writing when it died, under its hidden temporary name tagged
# with the writing instant (storage.temp_name): `.pipe_<instant>_<hex>.tmp`; and the names
# pipe used before, which Java took for file groups: `.<base file name>.<hex>.tmp`,
# `.<log file name>.<instant>.<hex>.tmp`
_PARTIAL = re.compile(r"^\.pipe_(\d{14,17})_[0-9a-f]{32}\.tmp$")
_PARTIAL_BASE_BEFORE = re.compile(r"^\..+_(\d{17})\.parquet\.[0-9a-f]+\.tmp$")
_PARTIAL_LOG_BEFORE = re.compile(r"^\.\..+\.log\.\d+_\d+-\d+-\d+\.(\d{17})\.[0-9a-f]+\.tmp$")


def partial_file_instant(name: str) -> str | None:
    """The instant of a partial data file's hidden temporary name, or None."""
    m = _PARTIAL.match(name) or _PARTIAL_BASE_BEFORE.match(name) or _PARTIAL_LOG_BEFORE.match(name)
    return m.group(1) if m else None


def remove_dead_temps(storage, pending: set[str] = frozenset(), untagged_after_ms: int = 60_000) -> list[str]:
    """Deletes the temporary files (storage.temp_name) dead writers left in the table, under
    the writer lock, after failed writes were rolled back: every one tagged with an instant
    that is not in `pending` (a data file of a task that died; no live pipe writer can be
    writing while we hold the lock), and untagged ones (a metadata file being replaced, a lock
    being taken) older than `untagged_after_ms`: a live process holds those for milliseconds."""
    from runtime.storage import TEMP_PREFIX, TEMP_SUFFIX

    now = time.time() * 1000
    gone = []
    for f in storage.list_files(""):
        name = f.path.rsplit("/", 1)[-1]
        if not (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)) and partial_file_instant(name) is None:
            continue
        tag = partial_file_instant(name)
        if tag in pending or (tag is None and now - f.mtime_ms < untagged_after_ms):
            continue
        storage.delete(f.path)
        gone.append(f.path)
    return gone


def _data_files_by_instant(storage, known_logs: set[str] = frozenset(), appended: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Data files of the table by the instant that wrote them (one listing): base files by the
    instant in their name, log files by the instant in their blocks' headers (their name has
    the slice's base instant; a log with blocks of several instants, or a rollback block, is
    never attributed to one), and the partial files a dead task left under a
    hidden temporary name. Logs in `known_logs` (named by completed commits) are skipped:
    their headers need not be read. `appended`, if given, receives the logs shared by several
    instants (Java appends blocks to a log on file systems that can append), by each instant
    with data or delete blocks in them: those are undone with a rollback command block."""
    from runtime.table.cdc_log import parse_name as cdc_name
    from runtime.table.logfile import COMMAND, INSTANT_TIME, LogFormatError, block_headers, parse_name

    out: dict[str, list[str]] = {}
    for f in storage.list_files(""):
        name = f.path.rsplit("/", 1)[-1]
        if f.path.startswith(HOODIE + "/"):
            continue
        partial = partial_file_instant(name)
        if partial:
            out.setdefault(partial, []).append(f.path)
        elif not name.startswith(".") and name.endswith(".parquet"):
            out.setdefault(name[-len("20240101000000000.parquet"):-len(".parquet")], []).append(f.path)
        elif name.endswith(".cdc") and cdc_name(name) is not None:  # a CDC-enabled table's: named by its instant
            out.setdefault(cdc_name(name)[1], []).append(f.path)
        elif parse_name(name) is not None and f.size > 0 and f.path not in known_logs:
            try:
                headers = block_headers(storage, f.path, f.size)
            except LogFormatError:
                continue  # not ours to judge here; readers report a damaged log
            instants = {h.get(INSTANT_TIME) for _, h in headers}
            if len(instants) == 1 and not any(kind == COMMAND for kind, _ in headers):
                out.setdefault(instants.pop(), []).append(f.path)
            elif appended is not None:
                for t in sorted({h.get(INSTANT_TIME) for kind, h in headers if kind != COMMAND} - {None}):
                    appended.setdefault(t, []).append(f.path)
    return out


def _marked_files(storage, target: str) -> tuple[list[str], list[str]]:
    """What the markers of `target` name (markers.py): files it created or merged, and the log
    files it appended to, as (files to delete, shared logs to undo with a rollback block). A
    log holding nothing but `target`'s blocks is deleted; one that holds older blocks too is
    shared. Files that are gone (a task died before creating them) are left out."""
    from runtime.table.logfile import COMMAND, INSTANT_TIME, LogFormatError, block_headers

    found = markers.read(storage, target)
    if not found:
        return [], []
    sizes: dict[str, int] = {}
    for folder in {m.path.rpartition("/")[0] for m in found}:
        sizes.update({i.path: i.size for i in storage.list_files(folder, recursive=False)})
    delete, shared = [], []
    for m in found:
        if m.path not in sizes:
            continue
        if m.io_type != markers.APPEND and not _is_log(m.path):  # a log's name has no writer: its blocks tell
            delete.append(m.path)
            continue
        try:
            headers = block_headers(storage, m.path, sizes[m.path]) if sizes[m.path] else []
        except LogFormatError:
            headers = [(COMMAND, {})]  # a torn append: keep the file, hide the instant's blocks
        instants = {h.get(INSTANT_TIME) for kind, h in headers if kind != COMMAND}
        if instants <= {target} and not any(kind == COMMAND for kind, _ in headers):
            delete.append(m.path)
        else:
            shared.append(m.path)
    return delete, shared


def _is_log(path: str) -> bool:
    from runtime.table.logfile import parse_name

    return parse_name(path.rpartition("/")[2]) is not None


def _write_rollback_blocks(storage, target: str, rollback_time: str, logs: list[str]) -> dict[str, dict[str, int]]:
    """Undoes `target`'s blocks in shared logs as Java's rollback does in table version 6: one
    rollback command block (its instant: the rollback's; its target: `target`) in a new log
    file of each slice, after every log of it, so no reader applies those blocks, even once
    `target` is older than the active timeline. Returns partition -> {new log path: size}."""
    from runtime.table.logfile import LogFileName, encode_block, parse_name, rollback_block

    slices = sorted({(p.rpartition("/")[0], parse_name(p.rpartition("/")[2]).file_id, parse_name(p.rpartition("/")[2]).base_instant)
                     for p in logs})
    written: dict[str, dict[str, int]] = {}
    data = encode_block(rollback_block(rollback_time, target))
    for partition, fid, base in slices:
        versions = [parse_name(i.path.rpartition("/")[2]) for i in storage.list_files(partition, recursive=False)]
        version = max((n.version for n in versions if n is not None and n.file_id == fid and n.base_instant == base), default=0) + 1
        name = LogFileName(fid, base, version, "0-0-0").name
        path = f"{partition}/{name}" if partition else name
        if not storage.create_exclusive(path, data):
            raise TableError(f"log file {path} appeared while rolling back {target}; run again")
        written.setdefault(partition, {})[storage.full_path(path)] = len(data)
    return written


def _rollback_plan(storage, target: Instant, by_partition: dict[str, list[str]], shared: list[str] = ()) -> dict:
    from runtime.table.logfile import parse_name

    requests = [
        {"partitionPath": p, "fileId": None, "latestBaseInstant": None,
         "filesToBeDeleted": [storage.full_path(f) for f in fs], "logBlocksToBeDeleted": None}
        for p, fs in sorted(by_partition.items())
    ]
    for log in sorted(shared):  # as Java's marker-based plan has them: a rollback block per log
        name = parse_name(log.rpartition("/")[2])
        requests.append({"partitionPath": log.rpartition("/")[0], "fileId": name.file_id, "latestBaseInstant": name.base_instant,
                         "filesToBeDeleted": [], "logBlocksToBeDeleted": {storage.full_path(log): 1}})
    return {
        "instantToRollback": {"commitTime": target.time, "action": target.action},
        "RollbackRequests": requests,
        "version": 1,
    }


def _undo(storage, timeline: Timeline, target: Instant, files: list[str], started: float, rollback_time: str, shared: list[str] = ()) -> dict:
    """Undoes one write instant: unpublishes it if completed (its completed file goes first, so
    readers fall back to the previous state at once), deletes its data files, hides its blocks
    in logs it shares with other instants (`shared`) behind rollback command blocks, and
    returns the HoodieRollbackMetadata. The caller removes the instant's requested/inflight
    files after it has recorded the rollback."""
    from runtime.table import metadata_table

    if target.is_completed:
        if not storage.exists(timeline.path(target, INFLIGHT)):
            storage.write_atomic(timeline.path(target, INFLIGHT), b"")  # stays pending if we die now
        storage.delete(timeline.path(target))
    metadata_table.forget(storage, target.time)  # while it is pending: no reader takes the metadata's for valid
    for path in files:
        storage.delete(path)
    blocks = _write_rollback_blocks(storage, target.time, rollback_time, list(shared)) if shared else {}
    tombstones.delete_files_of(storage, target.time)
    markers.delete_dir(storage, target.time)
    heartbeat.stop(storage, target.time)  # as Java's rollback of failed writes deletes it
    by_partition = _by_partition(files)
    failed_logs = {}
    for log in shared:
        failed_logs.setdefault(log.rpartition("/")[0], {})[storage.full_path(log)] = 1
    return {
        "startRollbackTime": rollback_time,
        "timeTakenInMillis": int((time.time() - started) * 1000),
        "totalFilesDeleted": len(files),
        "commitsRollback": [target.time],
        "partitionMetadata": {
            p: {"partitionPath": p, "successDeleteFiles": [storage.full_path(f) for f in by_partition.get(p, ())], "failedDeleteFiles": [],
                "rollbackLogFiles": blocks.get(p), "logFilesFromFailedCommit": failed_logs.get(p)}
            for p in sorted(set(by_partition) | set(blocks))
        },
        "version": 1,
        "instantsRollback": [{"commitTime": target.time, "action": target.action}],
    }


def _by_partition(files: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in files:
        out.setdefault(path.rpartition("/")[0], []).append(path)
    return out


def _forget(storage, timeline: Timeline, target: Instant) -> None:
    for state in (INFLIGHT, REQUESTED):
        storage.delete(timeline.path(target, state))
    if target.action == COMMIT and target.is_completed:
        # a completed compaction undone: its plan and inflight file go with its commit (a
        # pending compaction's plan is never deleted here: the logs named with it need it)
        for state in (INFLIGHT, REQUESTED):
            storage.delete(timeline.path(Instant(target.time, COMPACTION, state)))


def _undo_files(storage, target: Instant, by_instant: dict[str, list[str]], appended: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """What undoing `target` deletes, and the shared logs it hides blocks of: found by listing
    (by_instant, appended) and by the instant's markers (a Java writer's files)."""
    marked, marked_shared = _marked_files(storage, target.time)
    return sorted(set(by_instant.get(target.time, ())) | set(marked)), sorted(set(appended.get(target.time, ())) | set(marked_shared))


def _rollback(storage, target: Instant, by_instant: dict[str, list[str]], appended: dict[str, list[str]] | None = None) -> str:
    """One rollback instant undoing `target` (pending or completed): plan (Avro), undo,
    completed rollback (Avro metadata), and only then the target's own remaining timeline files
    go. (Removing those first could make the failed files look committed to a reader.)"""
    started = time.time()
    files, shared = _undo_files(storage, target, by_instant, appended or {})
    timeline = Timeline.load(storage)
    now = Instant(timeline.new_instant_time(), ROLLBACK, REQUESTED)
    storage.write_atomic(timeline.path(now), avro.to_bytes(avro.ROLLBACK_PLAN, _rollback_plan(storage, target, _by_partition(files), shared)))
    storage.write_atomic(timeline.path(now, INFLIGHT), b"")
    meta = _undo(storage, timeline, target, files, started, now.time, shared)
    _complete(storage, timeline, now, avro.to_bytes(avro.ROLLBACK_METADATA, meta))
    _forget(storage, timeline, target)
    return now.time


def revert_compaction(storage, instant: str) -> None:
    """A compaction attempt that failed: its files go and it is requested again, its plan kept
    (as Java's rollbackInflightCompaction leaves it), for the next `compact` to execute."""
    files, _ = _undo_files(storage, Instant(instant, COMPACTION, INFLIGHT), _data_files_by_instant(storage), {})
    for path in files:
        storage.delete(path)
    markers.delete_dir(storage, instant)
    storage.delete(Timeline.load(storage).path(Instant(instant, COMPACTION, INFLIGHT)))


def is_clustering(timeline: Timeline, instant: Instant) -> bool:
    """A pending clustering of `timeline`: a `clustering` instant (layout 2), or a replacecommit
    whose requested file holds a HoodieRequestedReplaceMetadata with operationType CLUSTER, not
    an insert_overwrite."""
    if instant.action == CLUSTERING:
        return True
    if instant.action != REPLACECOMMIT:
        return False
    try:
        data = timeline.storage.read_bytes(timeline.path(instant, REQUESTED))
    except FileNotFoundError:
        return False
    if not data:
        return False
    try:
        return (avro.from_bytes(data) or {}).get("operationType") == "CLUSTER"
    except Exception:  # noqa: BLE001 - not an Avro plan: not a clustering
        return False


def failed_writes(storage, timeline: Timeline) -> list[Instant]:
    """The pending instants a writer rolls back before it writes, as Java's failed-writes
    cleaning picks them (BaseHoodieTableServiceClient.getInstantsToRollback): commits,
    deltacommits and replacecommits. Never a compaction (its plan names the logs written
    since: Java executes it later), a clustering, a log compaction or an indexing."""
    return [i for i in timeline.pending() if i.action in WRITE_ACTIONS and not is_clustering(timeline, i)]


def refuse_live_writes(storage, timeline: Timeline | None = None) -> None:
    """Raises TableError, having changed nothing, while a pending write of another writer has a
    fresh heartbeat (heartbeat.py): that writer is running, and pipe must neither roll its
    instant back nor change what it uses (its metadata table, hoodie.properties)."""
    timeline = timeline or Timeline.load(storage)
    failed = failed_writes(storage, timeline)
    live = heartbeat.live_foreign(storage, [i.time for i in failed])
    if live:
        t, age = sorted(live.items())[0]
        inst = next(i for i in failed if i.time == t)
        raise TableError(f"instant {t} ({inst.action}, {inst.state}) of the table at {storage.spec.uri} is being written by another "
                         f"writer: its heartbeat {heartbeat.path(t)} was updated {age / 1000:.0f} s ago; pipe does not roll back a "
                         "live write",
                         f"wait for that writer to finish; if it is dead, its heartbeat expires {heartbeat.EXPIRY_MS // 1000} s "
                         "after its last update and the next run rolls the instant back")


def rollback_pending(storage) -> list[str]:
    """Rolls back every failed write (failed_writes), each with its own rollback instant. An
    unfinished restore is finished first (it knows which instants it was undoing). Refused,
    with nothing changed, while one of them has a fresh heartbeat of another writer
    (heartbeat.py): that writer is running."""
    timeline = Timeline.load(storage)
    restores = [i for i in timeline.pending() if i.action == RESTORE]
    for r in restores:
        _finish_restore(storage, r)
    if restores:
        timeline = Timeline.load(storage)
    failed = failed_writes(storage, timeline)
    refuse_live_writes(storage, timeline)
    for pending in timeline.pending():
        if pending.action in (CLEAN, ROLLBACK, SAVEPOINT):
            _finish_service(timeline, pending)
    rolled = []
    appended: dict[str, list[str]] = {}
    by_instant = _data_files_by_instant(storage, appended=appended) if failed else {}
    for inst in failed:
        _rollback(storage, inst, by_instant, appended)
        rolled.append(inst.time)
    return rolled


def missing_files(storage, timeline: Timeline, as_of: str | None, groups: set[tuple[str, str]] | None = None) -> list[str]:
    """Base files the snapshot as of `as_of` (None: before the first write) reads, by the write
    stats of the archived and active writes, that are no longer on storage (cleaned); of the file
    groups `groups` ((partition, file id) pairs) only, if given. A group last written by an
    archived commit counts too: a keep_latest_file_versions clean may remove its files, and no
    earliest commit to retain then says so."""
    expected: dict[tuple[str, str], str] = {}
    if as_of is not None:
        writes = [(inst, None) for inst in timeline.completed(WRITE_ACTIONS)]
        archived = archived_write_metadata(storage, timeline.layout) if writes else []
        active = {inst.time for inst, _ in writes}
        writes = sorted([(i, m) for i, m in archived if i.time not in active] + writes, key=lambda w: w[0].time)
        for inst, meta in writes:
            if inst.time > as_of:
                break
            meta = meta if meta is not None else timeline.read_json(inst)
            for part, ids in (meta.get("partitionToReplaceFileIds") or {}).items():
                for fid in ids:
                    expected.pop((part, fid), None)
            for part, stats in (meta.get("partitionToWriteStats") or {}).items():
                for st in stats or ():
                    if st.get("path"):
                        expected[(part, st["fileId"])] = st["path"]
    if groups is not None:
        expected = {g: p for g, p in expected.items() if g in groups}
    if not expected:
        return []
    present = {f.path for f in storage.list_files("")}
    return sorted(p for p in expected.values() if p not in present)


def rollback(storage, instant: str) -> str:
    """Rolls back the latest completed write `instant` (Hudi allows no other): its files go, the
    table is as it was before it. Returns the rollback instant's time."""
    rollback_pending(storage)
    timeline = Timeline.load(storage)
    latest = timeline.latest_completed()
    if latest is None:
        raise TableError("the table has no completed write to roll back")
    if latest.time != instant:
        target = timeline.find(instant)
        what = "is not on the active timeline" if target is None else f"is not the latest write ({latest.time} is)"
        raise TableError(f"instant {instant} {what}; only the latest completed write can be rolled back",
                           f"to go back further, restore the table to an instant: `pipe restore TABLE INSTANT`")
    if instant in savepoint_times(timeline):
        raise TableError(f"instant {instant} is savepointed", f"delete the savepoint first: `pipe savepoint TABLE {instant} --delete`")
    writes = timeline.completed()
    previous = writes[-2].time if len(writes) > 1 else None
    gone = missing_files(storage, timeline, previous)
    if gone:
        raise TableError(f"the files of the version before {instant} have been cleaned (e.g. {gone[0]}); rolling back would lose rows",
                           "clean keeps them with `clean: {policy: keep_latest_commits}`; nothing was changed")
    appended: dict[str, list[str]] = {}
    return _rollback(storage, latest, _data_files_by_instant(storage, appended=appended), appended)


# --- savepoints -------------------------------------------------------------------------------

def savepoint_times(timeline: Timeline) -> list[str]:
    return [i.time for i in timeline.completed((SAVEPOINT,))]


def savepointed_files(storage, timeline: Timeline) -> set[str]:
    """Paths (relative to the table) of every base file a savepoint holds."""
    out: set[str] = set()
    for inst in timeline.completed((SAVEPOINT,)):
        meta = avro.from_bytes(storage.read_bytes(timeline.path(inst)))
        for part, pm in (meta.get("partitionMetadata") or {}).items():
            out.update(f"{part}/{name}" if part else name for name in pm.get("savepointDataFile") or ())
    return out


def savepoint(storage, instant: str | None, user: str, comment: str = "") -> str:
    """Savepoints the completed write `instant` (None: the latest): `<instant>.savepoint` lists
    the base files of the table as of it, which cleaning then keeps and archiving does not pass,
    so the table can be restored to it."""
    timeline = Timeline.load(storage)
    writes = timeline.completed()
    if not writes:
        raise TableError("the table has no completed write to savepoint")
    target = writes[-1] if instant is None else next((i for i in writes if i.time == instant), None)
    if target is None:
        raise TableError(f"instant {instant} is not a completed write on the active timeline",
                           "savepoint one of the commits `pipe timeline TABLE` lists")
    if target.time in savepoint_times(timeline):
        raise TableError(f"instant {target.time} is savepointed already")
    gone = missing_files(storage, timeline, target.time)
    if gone:
        raise TableError(f"instant {target.time} cannot be savepointed: files of it have been cleaned (e.g. {gone[0]})",
                           "savepoint a later instant")
    view = FileSystemView.load(storage, timeline)
    by_partition: dict[str, list[str]] = {}
    for sl in view.latest_slices(target.time):
        names = ([sl.base_file.name] if sl.base_file is not None else []) + [lf.name for lf in sl.log_files]
        by_partition.setdefault(sl.partition, []).extend(names)
    meta = {
        "savepointedBy": user,
        "savepointedAt": int(time.time() * 1000),  # millis, as Java's TimelineMetadataUtils.convertSavepointMetadata
        "comments": comment,
        "partitionMetadata": {p: {"partitionPath": p, "savepointDataFile": sorted(fs)} for p, fs in sorted(by_partition.items())},
        "version": 1,
    }
    sp = Instant(target.time, SAVEPOINT, INFLIGHT)
    storage.write_atomic(timeline.path(sp), b"")
    timeline.complete(sp, avro.to_bytes(avro.SAVEPOINT_METADATA, meta))
    return target.time


def delete_savepoint(storage, instant: str) -> None:
    timeline = Timeline.load(storage)
    if instant not in savepoint_times(timeline):
        listed = ", ".join(savepoint_times(timeline)) or "none"
        raise TableError(f"instant {instant} has no savepoint (savepoints: {listed})")
    sp = next(i for i in timeline.completed((SAVEPOINT,)) if i.time == instant)
    storage.delete(timeline.path(sp))
    storage.delete(timeline.path(sp, INFLIGHT))


# --- restore ----------------------------------------------------------------------------------

def restore(storage, instant: str) -> tuple[str, list[str]]:
    """Returns the table to the completed write `instant`: every write after it is undone, newest
    first, under one restore instant whose metadata holds a rollback record per undone instant.
    Refused when a later savepoint exists (delete it first) or when files the table as of
    `instant` reads have been cleaned (savepoints prevent that). Returns (restore instant,
    undone instants)."""
    rollback_pending(storage)
    timeline = Timeline.load(storage)
    writes = timeline.completed()
    target = next((i for i in writes if i.time == instant), None)
    if target is None:
        archived = any(i.time == instant for i in archived_instants(storage, timeline.layout))
        raise TableError(f"instant {instant} is " + ("archived" if archived else "not a completed write of the table"),
                           "restore to a write instant on the active timeline (`pipe timeline TABLE`); savepointed instants are never archived")
    later = [i for i in writes if i.time > instant]
    if not later:
        raise TableError(f"instant {instant} is the latest write already; there is nothing to restore")
    blocking = [t for t in savepoint_times(timeline) if t > instant]
    if blocking:
        raise TableError(f"instant {blocking[0]} after {instant} is savepointed; restoring would undo it",
                           f"delete that savepoint first: `pipe savepoint TABLE {blocking[0]} --delete`")
    gone = missing_files(storage, timeline, instant)
    if gone:
        raise TableError(f"the table as of {instant} can no longer be restored: {len(gone)} of its files have been cleaned (e.g. {gone[0]})",
                           "savepoint an instant (`pipe savepoint TABLE INSTANT`) to keep it restorable; nothing was changed")
    inst = Instant(timeline.new_instant_time(), RESTORE, REQUESTED)
    # as Java's restore plan has them: pending compactions after the instant go too (their
    # plans name logs this restore deletes)
    later = sorted(later + [i for i in timeline.pending() if i.action == COMPACTION and i.time > instant])
    plan = {
        "instantsToRollback": [{"commitTime": i.time, "action": i.action} for i in reversed(later)],
        "version": 2,
        "savepointToRestoreTimestamp": instant if instant in savepoint_times(timeline) else None,
    }
    storage.write_atomic(timeline.path(inst), avro.to_bytes(avro.RESTORE_PLAN, plan))
    storage.write_atomic(timeline.path(inst, INFLIGHT), b"")
    fault("restore_started")
    return inst.time, _finish_restore(storage, inst)


def _finish_restore(storage, inst: Instant) -> list[str]:
    """Undoes, newest first, every instant of the restore plan still on the timeline, then
    completes the restore. Idempotent: a restore that died half way is finished by the next
    writer (rollback_pending)."""
    started = time.time()
    timeline = Timeline.load(storage)
    plan = avro.from_bytes(storage.read_bytes(timeline.path(inst, REQUESTED)))
    present = {(i.time, i.action): i for i in timeline.instants}
    appended: dict[str, list[str]] = {}
    by_instant = _data_files_by_instant(storage, appended=appended)
    undone: dict[str, list] = {}
    infos = []
    for info in plan["instantsToRollback"]:
        target = present.get((info["commitTime"], info["action"]))
        infos.append(info)
        if target is not None:
            files, shared = _undo_files(storage, target, by_instant, appended)
            undone[target.time] = [_undo(storage, timeline, target, files, time.time(), inst.time, shared)]
            _forget(storage, timeline, target)
            fault("restore_undid_one")
        else:
            undone[info["commitTime"]] = []
    meta = {
        "startRestoreTime": inst.time,
        "timeTakenInMillis": int((time.time() - started) * 1000),
        "instantsToRollback": [i["commitTime"] for i in infos],
        "hoodieRestoreMetadata": undone,
        "version": 1,
        "restoreInstantInfo": infos,
        "extraMetadata": None,
    }
    _complete(storage, timeline, inst, avro.to_bytes(avro.RESTORE_METADATA, meta))
    return [i["commitTime"] for i in infos]


def _complete(storage, timeline: Timeline, inst: Instant, data: bytes) -> None:
    """Completes a service's instant that changed the table's files (a clean, a rollback, a
    restore): its metadata table's deltacommit first (metadata_table.before_complete)."""
    from runtime.table import metadata_table

    metadata_table.before_complete(storage, inst.time)
    timeline.complete(inst, data)


# Races for tests: a function called at a fault point, in the process (what another writer
# does between two steps of this one, staged deterministically)
HOOKS: dict = {}


def fault(point: str) -> None:
    """Fault injection for tests: PIPE_FAULT=<point> makes the process exit hard there; a
    function in HOOKS[point] is called there."""
    if os.environ.get("PIPE_FAULT") == point:
        os._exit(77)
    hook = HOOKS.get(point)
    if hook is not None:
        hook()


def _finish_service(timeline: Timeline, pending: Instant) -> None:
    """A clean or rollback that died half way: its plan is idempotent, so we drop the
    unfinished instant; the next clean plans again."""
    for state in (INFLIGHT, REQUESTED):
        timeline.storage.delete(timeline.path(pending, state))


@dataclass(frozen=True)
class CleanResult:
    instant: str | None
    files_deleted: int
    earliest_retained: str | None


def plan_clean(view: FileSystemView, timeline: Timeline, policy: str, retain: int, protected: set[str] = frozenset(),
               retain_from: str | None = None) -> tuple[dict[str, list[str]], str | None]:
    """Files no retained instant needs, by partition, and the earliest retained commit.

    keep_latest_commits(N): every file version a query as of one of the last N commits could
    read stays: versions written at or after the earliest retained commit, plus, per group, the
    newest version older than it. keep_latest_file_versions(N): the N newest versions per group.
    On top of the policy: the latest version of a live group always stays; so does every file
    in `protected` (savepointed files); and with `retain_from` (the oldest checkpoint of an
    incremental consumer) every version a query as of any commit after it reads."""
    commits = [i.time for i in timeline.completed()]
    groups: dict[tuple[str, str], list] = {}
    for bf in view.files:
        groups.setdefault((bf.partition, bf.file_id), []).append(bf)
    earliest = None
    if policy == KEEP_LATEST_COMMITS:
        if len(commits) <= retain:
            return {}, None
        earliest = commits[-retain]
    after = [c for c in commits if retain_from is not None and c > retain_from]
    if after:  # the first commit a consumer has not read: keep what reads as of it need
        earliest = min(earliest, after[0]) if earliest else after[0]
    logs_of: dict[tuple[str, str, str], list[str]] = {}
    for lf in view.logs:  # in timeline layout 2 a log's name has its deltacommit: log_slices says its slice
        logs_of.setdefault((lf.partition, lf.file_id, view.log_slices.get(lf, lf.base_instant)), []).append(lf.path)
    for c in view.cdc:  # a .cdc file goes with the base file its instant wrote beside it
        logs_of.setdefault((c.partition, c.file_id, c.instant), []).append(c.path)
    doomed: dict[str, list[str]] = {}
    for key, versions in groups.items():
        versions.sort(key=lambda b: b.instant, reverse=True)
        replaced_at = view.replaced.get(key)
        keep: set[str] = set()
        if policy == KEEP_LATEST_FILE_VERSIONS and replaced_at is None:
            keep = {b.name for b in versions[:retain]}
        if earliest is not None and not (replaced_at is not None and replaced_at < earliest):
            # (a group replaced before every retained commit is needed by no query)
            older = [b for b in versions if b.instant < earliest]
            keep |= {b.name for b in versions if b.instant >= earliest} | ({older[0].name} if older else set())
        for b in versions:
            if b.name not in keep and b.path not in protected:
                doomed.setdefault(b.partition, []).append(b.path)
                # a merge-on-read slice goes whole: its log files with its base file
                doomed[b.partition] += logs_of.get((b.partition, b.file_id, b.instant), [])
    return {p: sorted(v) for p, v in doomed.items()}, earliest


def clean(storage, policy: str = KEEP_LATEST_COMMITS, retain: int = 10, retain_from: str | None = None) -> CleanResult:
    """Deletes the file versions no retained commit, savepoint or consumer needs (plan_clean),
    as a `clean` instant with Hudi's Avro plan and metadata. Nothing to delete: no instant."""
    timeline = Timeline.load(storage)
    view = FileSystemView.load(storage, timeline)
    doomed, earliest = plan_clean(view, timeline, policy, retain, savepointed_files(storage, timeline), retain_from)
    if not doomed:
        return CleanResult(None, 0, earliest)
    return record_clean(storage, timeline, Instant(timeline.new_instant_time(), CLEAN, REQUESTED), doomed, earliest, policy)


def record_clean(storage, timeline: Timeline, inst: Instant, doomed: dict[str, list[str]], earliest: str | None, policy: str) -> CleanResult:
    """Deletes `doomed` (paths by partition) as the clean instant `inst`: Hudi's Avro plan
    (requested, inflight), the deletes, then the clean metadata completing it."""
    started = time.time()
    java_policy = policy.upper()
    earliest_inst = timeline.find(earliest) if earliest else None
    plan = {
        "earliestInstantToRetain": {"timestamp": earliest_inst.time, "action": earliest_inst.action, "state": "COMPLETED"} if earliest_inst else None,
        "policy": java_policy,
        # version 1 (file names by partition), not 2 (full paths): a Java cleaner that finishes
        # this plan resolves the names against its own base path (CleanPlanV2MigrationHandler),
        # whose scheme (s3a://, s3://, hdfs://, file:) pipe cannot know
        "filesToBeDeletedPerPartition": {p: [f.rpartition("/")[2] for f in fs] for p, fs in doomed.items()},
        "version": 1,
        "filePathsToBeDeletedPerPartition": None,
        "partitionsToBeDeleted": [],
    }
    plan_bytes = avro.to_bytes(avro.CLEANER_PLAN, plan)
    storage.write_atomic(timeline.path(inst), plan_bytes)
    storage.write_atomic(timeline.path(inst, INFLIGHT), plan_bytes)
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
    _complete(storage, timeline, inst, avro.to_bytes(avro.CLEAN_METADATA, meta))
    return CleanResult(inst.time, deleted, earliest)


def archive(storage, min_instants: int = 20, max_instants: int = 30, keep_from: str | None = None) -> list[str]:
    """Keeps the active timeline between min and max instants: once it holds more than
    `max_instants`, the oldest completed instants move to .hoodie/archived/ (their files, under
    the same names) until `min_instants` remain. Never past a pending instant, and the latest
    completed write always stays active, and so does a replacecommit until every file of
    the groups it replaced is cleaned: once archived, its partitionToReplaceFileIds is gone
    and those files would count as live again. Archiving stops at the earliest savepoint (a
    restore needs the instants after it) and at `keep_from`, the oldest checkpoint of an
    incremental consumer (which reads the commits after it from the active timeline). Data files of archived commits stay readable:
    a reader takes files older than the whole active timeline as committed (HUDI_FORMAT.md 3).

    With a metadata table, archiving stops at its latest compaction (as Java's archiver does):
    Java 0.x's readers take the metadata deltacommits of archived data instants for invalid,
    so their deltas must be folded into its base file first.

    Java writes archived instants into Avro log files (.commits_.archive.N); pipe keeps the
    instant files themselves, which Java's archived-timeline reader skips and hudi-rs never reads.
    In timeline layout 2 (table versions 8 and 9) they go into the LSM history, as Java 1.x's
    archiver writes it (_archive_into_history).

    Then the metadata table's own clean and archiving (metadata_table.table_services), as
    Java's metadata writer runs them after each commit."""
    moved = archive_timeline(storage, min_instants, max_instants, keep_from)
    from runtime.table import metadata_table

    metadata_table.table_services(storage, min_instants, max_instants)
    return moved


def archive_timeline(storage, min_instants: int, max_instants: int, keep_from: str | None = None) -> list[str]:
    """The archiving of `archive`, of the table at `storage` alone."""
    timeline = Timeline.load(storage)
    instants = timeline.instants
    if len(instants) <= max_instants:
        return []
    latest_write = timeline.latest_completed()
    from runtime.table import metadata_table

    stops = savepoint_times(timeline) + ([keep_from] if keep_from else []) + metadata_table.archive_stop(storage)
    stop_at = min(stops) if stops else None
    candidates = []
    live: set[tuple[str, str]] | None = None  # (partition, file id) of every file on storage
    for inst in instants[: len(instants) - min_instants]:
        if not inst.is_completed or (latest_write is not None and inst.time >= latest_write.time):
            break
        if stop_at is not None and inst.time >= stop_at:
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
    committed_logs = {st.path for i in timeline.completed(WRITE_ACTIONS) for st in timeline.commit_metadata(i).write_stats if st.is_log}
    for t, paths in _data_files_by_instant(storage, committed_logs).items():
        if t.isdigit() and first <= t < new_first and t not in written:
            for path in paths:
                storage.delete(path)
    if timeline.layout >= 2:
        return _archive_into_history(storage, timeline, candidates)
    moved = []
    for inst in candidates:
        names = [inst.with_state(s).file_name() for s in (REQUESTED, INFLIGHT, COMPLETED)]
        if inst.action == COMMIT:  # a compaction's plan and inflight files go with its commit
            names = [f"{inst.time}.{COMPACTION}.{s}" for s in (REQUESTED, INFLIGHT)] + names
        present = [n for n in names if storage.exists(f"{HOODIE}/{n}")]
        for n in present:
            storage.write_atomic(f"{ARCHIVED}/{n}", storage.read_bytes(f"{HOODIE}/{n}"))
        for n in present:  # the completed file goes last: until then the instant stays active
            storage.delete(f"{HOODIE}/{n}")
        moved.append(inst.time)
    return moved


def _archive_into_history(storage, timeline: Timeline, candidates: list[Instant]) -> list[str]:
    """Timeline layout 2: `candidates` become rows of the LSM history (lsm_timeline.append: the
    completed file's bytes as metadata, and the plan of a clean, a compaction or a
    replacecommit, as Java's MetadataConversionUtils.createLSMTimelineInstant takes them), and
    only then their active files go, pending ones first, the completed file last. Instants a
    crash left both archived and active are not archived twice."""
    from runtime.table import lsm_timeline

    archived = {(i.time, i.action) for i in lsm_timeline.archived_instants(storage)}
    rows = []
    for inst in candidates:
        if (inst.time, inst.action) in archived:
            continue
        plan = None
        if inst.action == CLEAN:
            plan = _read_or_none(storage, timeline.path(inst, REQUESTED))
        elif inst.time in timeline.compactions:
            plan = _read_or_none(storage, timeline.path(Instant(inst.time, COMPACTION, REQUESTED)))
        elif inst.action == REPLACECOMMIT:  # a clustering's plan is its `T.clustering.requested`
            plan = (_read_or_none(storage, timeline.path(inst, INFLIGHT)) or _read_or_none(storage, timeline.path(inst, REQUESTED))
                    or _read_or_none(storage, timeline.path(Instant(inst.time, CLUSTERING, REQUESTED))))
        rows.append({"instantTime": inst.time, "completionTime": inst.completed_at, "action": inst.action,
                     "metadata": storage.read_bytes(timeline.path(inst)), "plan": plan})
    if rows:
        lsm_timeline.append(storage, rows)
        fault("archive_after_history")
    moved = []
    for inst in candidates:
        pending = [timeline.path(inst, s) for s in (REQUESTED, INFLIGHT)]
        if inst.time in timeline.compactions:
            pending += [timeline.path(Instant(inst.time, COMPACTION, s)) for s in (REQUESTED, INFLIGHT)]
        if inst.action == REPLACECOMMIT:
            pending += [timeline.path(Instant(inst.time, CLUSTERING, s)) for s in (REQUESTED, INFLIGHT)]
        for path in pending + [timeline.path(inst)]:
            storage.delete(path)
        moved.append(inst.time)
    return moved


def _read_or_none(storage, path: str) -> bytes | None:
    try:
        return storage.read_bytes(path) or None
    except FileNotFoundError:
        return None
