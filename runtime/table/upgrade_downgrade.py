"""A table's Hudi version changed in place, as Java's UpgradeDowngrade does it one version at a
time (docs/hudi-1x-format.md, 7), for the versions pipe writes: 6 (Hudi 0.14/0.15) and 8, 9
(Hudi 1.0/1.1). `pipe migrate TABLE --to 6|8|9` (Table.migrate) runs it under the writer lock.

What changes between the versions:
- 6 <-> 8: the timeline. Version 6 keeps its instants in `.hoodie/` (layout 1, commit metadata
  as JSON, archived instants in `.hoodie/archived/`), 8 and 9 in `.hoodie/timeline/` (layout 2:
  a completed instant is `T_C.action` with its completion time C, commit metadata in Avro,
  archived instants in the LSM history). Going up, C is the completed file's modification
  time, as Java's SevenToEightUpgradeHandler takes it; going down, the completed file's
  modification time is set to C, as EightToSevenDowngradeHandler does, where storage allows
  (a local disk; an object store keeps its own).
- 8 <-> 9: hoodie.properties only (the merge mode's keys: payload class, strategy, ordering
  fields).

Before it, as Java does: failed writes are rolled back and a merge-on-read table is compacted
in full, so no log file of the old version's format is in a latest file slice. A metadata table
is retired first and built again at the new version (its files partition) after the change.

Crash safety (kill -9 anywhere leaves the old or the new version): the new version's timeline
is written where the old version's readers do not look (`.hoodie/timeline/` for a version 6
table, `.hoodie/` for a version 8 one); hoodie.properties then changes in one crash-safe update
(config.update_properties), the commit point; only then are the old version's files deleted.
A crash before the commit point leaves the old table and unused files, which the next
migration writes anew; one after it leaves the new table and the old files, which the next
`pipe migrate` (to the same version) deletes. Last, an empty commit records the migration on
the timeline (`pipe.migrated` in its extraMetadata: "6 -> 9")."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from runtime.table import avro
from runtime.table.config import _COMMIT_TIME_PAYLOAD, _COMMIT_TIME_STRATEGY, _EVENT_TIME_PAYLOAD, _EVENT_TIME_STRATEGY, _KEYGEN_TYPES
from runtime.table.errors import TableError
from runtime.table.timeline import (
    ARCHIVED, CLEAN, CLUSTERING, COMMIT, COMPACTION, DELTACOMMIT, HOODIE, REPLACECOMMIT, REQUESTED,
    TIMELINE_V2, WRITE_ACTIONS, CommitMetadata, Instant, completion_of_mtime, decode_metadata, epoch_ms_of, parse_instant_file,
    parse_instant_file_v2, timeline_is_local,
)

VERSIONS = (6, 8, 9)
MIGRATED_KEY = "pipe.migrated"
_EVENT, _COMMIT = "EVENT_TIME_ORDERING", "COMMIT_TIME_ORDERING"
_BOOTSTRAP_INDEX_TYPES = {"org.apache.hudi.common.bootstrap.index.HFileBootstrapIndex": "HFILE",
                          "org.apache.hudi.common.bootstrap.index.NoOpBootstrapIndex": "NO_OP"}
# payloads whose merge pipe applies, and the mode each means (Java's 8 -> 9 handler moves them to
# hoodie.legacy.payload.class); a table with another payload is one pipe does not write
_BUILT_IN = {_EVENT_TIME_PAYLOAD: _EVENT, _COMMIT_TIME_PAYLOAD: _COMMIT}


@dataclass
class Migration:
    """What `migrate` does (or, with dry_run, would do) to one table."""

    table: str
    from_version: int
    to_version: int
    rollbacks: list[str] = field(default_factory=list)  # pending writes rolled back first
    compact_groups: int = 0  # merge-on-read file groups with log files, compacted first
    instants: int = 0  # active instant files written in the new layout
    reserialized: int = 0  # of which commit metadata rewritten (JSON <-> Avro)
    archived: int = 0  # archived instants moved to the new layout's archive
    set_props: dict[str, str] = field(default_factory=dict)
    removed_props: list[str] = field(default_factory=list)
    metadata_table: bool = False  # rebuilt at the new version
    kept: list[str] = field(default_factory=list)  # files left where they are, and why
    instant: str | None = None  # the empty commit recording it
    mtimes_kept: bool = True  # completion times set as modification times (down to 6)
    finished: list[str] = field(default_factory=list)  # an interrupted migration's old files deleted

    def lines(self) -> list[str]:
        out = []
        if self.rollbacks:
            out.append(f"roll back {len(self.rollbacks)} failed write(s): {', '.join(self.rollbacks)}")
        if self.compact_groups:
            out.append(f"compact {self.compact_groups} file group(s) with log files (merge-on-read), as Hudi does before a version change")
        if self.instants:
            layout = "`.hoodie/timeline/`" if self.to_version >= 8 else "`.hoodie/`"
            out.append(f"write {self.instants} active instant file(s) into {layout} ({self.reserialized} commit metadata "
                       f"{'JSON -> Avro' if self.to_version >= 8 else 'Avro -> JSON'})")
        if self.archived:
            where = "the LSM history (.hoodie/timeline/history)" if self.to_version >= 8 else ".hoodie/archived/"
            out.append(f"move {self.archived} archived instant(s) into {where}")
        if self.set_props or self.removed_props:
            changes = [f"{k}={v}" for k, v in sorted(self.set_props.items())] + [f"-{k}" for k in self.removed_props]
            out.append("hoodie.properties: " + ", ".join(changes))
        if self.metadata_table:
            out.append(f"build the metadata table's files partition again at version {self.to_version}")
        out += [f"keep {k}" for k in self.kept]
        if not self.mtimes_kept:
            out.append("the storage keeps its own modification times: version 6 readers order instants by their times")
        return out


# --- hoodie.properties ------------------------------------------------------------------------

def _mode(props: dict[str, str]) -> str:
    mode = (props.get("hoodie.record.merge.mode") or "").upper()
    payload = props.get("hoodie.compaction.payload.class") or props.get("hoodie.legacy.payload.class")
    if payload and payload not in _BUILT_IN:
        raise TableError(f"the table merges with payload class {payload}, which pipe does not migrate",
                         "migrate it with Hudi's own writer (hoodie.write.table.version)")
    if mode in (_EVENT, _COMMIT):
        return mode
    if payload:
        return _BUILT_IN[payload]
    return _EVENT if (props.get("hoodie.table.precombine.field") or props.get("hoodie.table.ordering.fields")) else _COMMIT


def _six_to_eight(props: dict[str, str]) -> None:
    """SevenToEightUpgradeHandler's property changes (6 -> 7 changes nothing)."""
    props.update({"hoodie.table.version": "8", "hoodie.timeline.layout.version": "2", "hoodie.timeline.path": "timeline",
                  "hoodie.timeline.history.path": "history"})
    props.setdefault("hoodie.table.initial.version", "6")
    keygen = props.get("hoodie.table.keygenerator.class", "")
    types = {c: t for t, c in _KEYGEN_TYPES.items()}
    if keygen in types:
        props["hoodie.table.keygenerator.type"] = types[keygen]
    payload = props.get("hoodie.compaction.payload.class")
    precombine = props.get("hoodie.table.precombine.field")
    _mode(props)  # refuses another payload
    if props.get("hoodie.table.type", "").upper() == "MERGE_ON_READ" and precombine:
        mode, payload = _EVENT, _EVENT_TIME_PAYLOAD
    elif payload == _EVENT_TIME_PAYLOAD:
        mode = _EVENT
    else:
        mode, payload = _COMMIT, _COMMIT_TIME_PAYLOAD
    props.update({"hoodie.record.merge.mode": mode, "hoodie.compaction.payload.class": payload,
                  "hoodie.record.merge.strategy.id": _EVENT_TIME_STRATEGY if mode == _EVENT else _COMMIT_TIME_STRATEGY})
    index = props.get("hoodie.bootstrap.index.class")
    if index in _BOOTSTRAP_INDEX_TYPES:
        props["hoodie.bootstrap.index.type"] = _BOOTSTRAP_INDEX_TYPES[index]


def _eight_to_nine(props: dict[str, str]) -> None:
    """EightToNineUpgradeHandler's changes for the built-in merge modes pipe writes."""
    _mode(props)
    props["hoodie.table.version"] = "9"
    props.pop("hoodie.record.merge.strategy.id", None)
    payload = props.pop("hoodie.compaction.payload.class", None)
    if payload:
        props["hoodie.legacy.payload.class"] = payload
    precombine = props.pop("hoodie.table.precombine.field", None)
    if precombine:
        props["hoodie.table.ordering.fields"] = precombine


def _nine_to_eight(props: dict[str, str]) -> None:
    """NineToEightDowngradeHandler's changes; the payload class and merge strategy a table
    Hudi 1.x creates at version 8 declares are set where version 9 had none."""
    mode = _mode(props)
    props["hoodie.table.version"] = "8"
    props.pop("hoodie.table.partial.update.mode", None)
    payload = props.pop("hoodie.legacy.payload.class", None) or (_EVENT_TIME_PAYLOAD if mode == _EVENT else _COMMIT_TIME_PAYLOAD)
    props["hoodie.compaction.payload.class"] = payload
    props["hoodie.record.merge.mode"] = mode
    props.setdefault("hoodie.record.merge.strategy.id", _EVENT_TIME_STRATEGY if mode == _EVENT else _COMMIT_TIME_STRATEGY)
    ordering = props.pop("hoodie.table.ordering.fields", None)
    if ordering:
        props["hoodie.table.precombine.field"] = ordering


def _eight_to_six(props: dict[str, str]) -> None:
    """EightToSevenDowngradeHandler's changes (7 -> 6 changes nothing)."""
    mode = _mode(props)
    for key in ("hoodie.table.initial.version", "hoodie.record.merge.mode", "hoodie.record.merge.strategy.id",
                "hoodie.table.keygenerator.type", "hoodie.bootstrap.index.type", "hoodie.timeline.path", "hoodie.timeline.history.path",
                "hoodie.table.format"):
        props.pop(key, None)
    if not props.get("hoodie.table.keygenerator.class"):
        raise TableError("the table names no key generator class (hoodie.table.keygenerator.class), which version 6 needs")
    props.setdefault("hoodie.compaction.payload.class", _EVENT_TIME_PAYLOAD if mode == _EVENT else _COMMIT_TIME_PAYLOAD)
    props.update({"hoodie.table.version": "6", "hoodie.timeline.layout.version": "1"})


_STEPS = {(6, 8): _six_to_eight, (8, 9): _eight_to_nine, (9, 8): _nine_to_eight, (8, 6): _eight_to_six}


def property_changes(props: dict[str, str], frm: int, to: int) -> tuple[dict[str, str], list[str]]:
    """The keys to set and to remove taking hoodie.properties from version `frm` to `to`, one
    version step at a time as Java's UpgradeDowngrade runs its handlers."""
    now = dict(props)
    path = [v for v in VERSIONS if min(frm, to) <= v <= max(frm, to)]
    path = path if to > frm else path[::-1]
    for a, b in itertools.pairwise(path):
        _STEPS[(a, b)](now)
    changed = {k: v for k, v in now.items() if props.get(k) != v}
    return changed, sorted(k for k in props if k not in now)


# --- the timeline -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _File:
    path: str
    data: bytes
    mtime_ms: int | None = None  # to set after writing (down to version 6)


def _commit_json(meta: dict) -> bytes:
    """Commit metadata (decoded from either layout) as version 6's JSON, Jackson's field names."""
    out = {k: v for k, v in meta.items() if k != "version"}
    return json.dumps(out, indent=2).encode("utf-8")


def _commit_avro(meta: dict, action: str) -> bytes:
    schema = avro.REPLACE_COMMIT_METADATA if action == REPLACECOMMIT else avro.COMMIT_METADATA
    return avro.to_bytes(schema, {**meta, "version": 1})


def _reserialize(data: bytes, action: str, to_layout: int) -> bytes | None:
    """A write action's metadata in the other layout's serialization; None: keep the bytes (empty,
    or already in it)."""
    if action not in WRITE_ACTIONS or not data.strip():
        return None
    is_avro = data[:4] == b"Obj\x01"
    if is_avro == (to_layout >= 2):
        return None
    meta = decode_metadata(data)
    return _commit_avro(meta, action) if to_layout >= 2 else _commit_json(meta)


def _instant_files(storage, folder: str, parse):
    """(file info, instant, bytes) of every instant file directly in `folder`, by name."""
    for f in sorted(storage.list_files(folder, recursive=False), key=lambda f: f.path):
        inst = parse(f.path.rsplit("/", 1)[-1])
        if inst is not None:
            yield f, inst, storage.read_bytes(f.path)


def active_files_up(storage) -> tuple[list[_File], int]:
    """Layout 1 -> 2: every instant file of `.hoodie/` under its layout-2 name in
    `.hoodie/timeline/`, a completed one as `T_C.action` (C its file's modification time),
    commit metadata in Avro. Returns the files and how many were re-serialized."""
    local = timeline_is_local(storage)
    out, reserialized = [], 0
    for f, inst, data in _instant_files(storage, HOODIE, parse_instant_file):
        if inst.is_completed:
            name = f"{inst.time}_{completion_of_mtime(f.mtime_ms, inst.time, local)}.{inst.action}"
        else:
            name = inst.file_name()
        new = _reserialize(data, inst.action, 2)
        reserialized += new is not None and inst.is_completed
        out.append(_File(f"{TIMELINE_V2}/{name}", data if new is None else new))
    return out, reserialized


def active_files_down(storage) -> tuple[list[_File], int]:
    """Layout 2 -> 1: every instant file of `.hoodie/timeline/` under its layout-1 name in
    `.hoodie/` (a clustering's `clustering.*` as `replacecommit.*`), commit metadata as JSON,
    each completed file to get its completion time as modification time."""
    local = timeline_is_local(storage)
    out, reserialized = [], 0
    for f, inst, data in _instant_files(storage, TIMELINE_V2, parse_instant_file_v2):
        if inst.action == CLUSTERING:
            inst = Instant(inst.time, REPLACECOMMIT, inst.state)
        new = _reserialize(data, inst.action, 1)
        reserialized += new is not None and inst.is_completed
        done = inst.completion or (completion_of_mtime(f.mtime_ms, inst.time, local) if inst.is_completed else None)
        out.append(_File(f"{HOODIE}/{inst.file_name()}", data if new is None else new,
                         epoch_ms_of(done, local) if inst.is_completed and done else None))
    return out, reserialized


def archived_up(storage) -> tuple[list[dict], list[str]]:
    """Layout 1 -> 2: rows of the LSM history (lsm_timeline.append) for the instants pipe's
    archiving kept in `.hoodie/archived/` (their files, under their names), completed at their
    own time (the archive kept no completion time), and for those of Java's archive logs
    (java_archive_rows); and the logs pipe could not read, left there."""
    files = {f.path.rsplit("/", 1)[-1]: f for f in storage.list_files(ARCHIVED, recursive=False)}
    rows, java_logs = [], []
    for name in sorted(files):
        inst = parse_instant_file(name)
        if inst is None:
            if name.startswith(".commits_.archive."):
                java_logs.append(name)
            continue
        if not inst.is_completed:
            continue
        data = storage.read_bytes(f"{ARCHIVED}/{name}")
        new = _reserialize(data, inst.action, 2)
        plan_name = {CLEAN: f"{inst.time}.clean.requested", REPLACECOMMIT: f"{inst.time}.replacecommit.requested",
                     COMMIT: f"{inst.time}.compaction.requested"}.get(inst.action)
        plan = storage.read_bytes(f"{ARCHIVED}/{plan_name}") if plan_name in files else None
        rows.append({"instantTime": inst.time, "completionTime": inst.time, "action": inst.action,
                     "metadata": data if new is None else new, "plan": plan or None})
    converted, kept = java_archive_rows(storage, java_logs)
    ours = {(r["instantTime"], r["action"]) for r in rows}
    rows += [r for r in converted if (r["instantTime"], r["action"]) not in ours]
    return sorted(rows, key=lambda r: (r["instantTime"], r["action"])), kept


# HoodieArchivedMetaEntry's field holding each action's completed metadata, and its plan's
_ARCHIVED_FIELDS = {COMMIT: ("hoodieCommitMetadata", avro.COMMIT_METADATA), DELTACOMMIT: ("hoodieCommitMetadata", avro.COMMIT_METADATA),
                    REPLACECOMMIT: ("hoodieReplaceCommitMetadata", avro.REPLACE_COMMIT_METADATA),
                    CLEAN: ("hoodieCleanMetadata", avro.CLEAN_METADATA), "rollback": ("hoodieRollbackMetadata", avro.ROLLBACK_METADATA),
                    "savepoint": ("hoodieSavePointMetadata", avro.SAVEPOINT_METADATA)}


def java_archive_rows(storage, names: list[str]) -> tuple[list[dict], list[str]]:
    """LSM rows of the completed instants in Java's archive logs of layout 1
    (`.hoodie/archived/.commits_.archive.N_<token>`: Avro data blocks of HoodieArchivedMetaEntry
    records), as Java's 7 -> 8 upgrade converts them (LegacyArchivedMetaEntryReader): the
    instant's metadata as its layout-2 Avro file, its completion time the entry's
    stateTransitionTime where it has one, a clean's or compaction's plan. Returns the rows and
    the logs it could not read (kept where they are)."""
    from runtime.table import logfile

    rows: dict[tuple[str, str], dict] = {}
    unread = []
    for name in names:
        try:
            blocks = logfile.read_blocks(storage.read_bytes(f"{ARCHIVED}/{name}"), f"{ARCHIVED}/{name}")
            entries = [r for b in blocks if b.type == logfile.AVRO_DATA for r in logfile.data_rows(b)]
        except Exception:  # noqa: BLE001 - another writer's file pipe cannot read: left where it is, reported
            unread.append(name)
            continue
        for e in entries:
            action, t = e.get("actionType"), e.get("commitTime")
            state = (e.get("actionState") or "COMPLETED").upper()
            if state != "COMPLETED" or action not in _ARCHIVED_FIELDS or not isinstance(t, str):
                continue
            field_name, schema = _ARCHIVED_FIELDS[action]
            meta = e.get(field_name)
            if meta is None:
                continue
            plan = None
            if e.get("hoodieCompactionPlan"):
                plan = avro.to_bytes(avro.COMPACTION_PLAN, e["hoodieCompactionPlan"])
            elif action == CLEAN and e.get("hoodieCleanerPlan"):
                plan = avro.to_bytes(avro.CLEANER_PLAN, e["hoodieCleanerPlan"])
            done = e.get("stateTransitionTime") or t
            rows[(t, action)] = {"instantTime": t, "completionTime": done if isinstance(done, str) and done >= t else t,
                                 "action": action, "metadata": avro.to_bytes(schema, meta), "plan": plan}
    return [rows[k] for k in sorted(rows)], unread


def archived_down(storage) -> list[_File]:
    """Layout 2 -> 1: the LSM history's instants as files of `.hoodie/archived/`, as pipe's
    archiving of version 6 keeps them (the completed file, and a clean's, compaction's or
    replacecommit's plan as its requested file)."""
    from runtime.table import lsm_timeline

    out = []
    for r in lsm_timeline.archived_rows(storage):
        t, action = r["instantTime"], r["action"]
        data = r["metadata"] or b""
        new = _reserialize(data, action, 1)
        out.append(_File(f"{ARCHIVED}/{t}.{action}", data if new is None else new))
        plan = r.get("plan")
        if plan:
            kind = {CLEAN: CLEAN, REPLACECOMMIT: REPLACECOMMIT}.get(action, COMPACTION if action == COMMIT else None)
            if kind:
                out.append(_File(f"{ARCHIVED}/{t}.{kind}.{REQUESTED}", plan))
    return out


def old_layout_files(storage, layout: int) -> list[str]:
    """The timeline files of layout `layout` (instant files and the archive pipe reads), which a
    table of the other layout does not use: what a finished migration deletes."""
    if layout >= 2:
        return [f.path for f in storage.list_files(TIMELINE_V2, recursive=True)]
    out = [f.path for f in storage.list_files(HOODIE, recursive=False) if parse_instant_file(f.path.rsplit("/", 1)[-1])]
    out += [f.path for f in storage.list_files(ARCHIVED, recursive=False) if parse_instant_file(f.path.rsplit("/", 1)[-1])]
    return out


def write_files(storage, files: list[_File]) -> bool:
    """Writes `files` (a completed instant's last, in instant order, so that modification times
    follow completion where they cannot be set); True when every modification time was set."""
    kept = True
    for f in sorted(files, key=lambda f: (f.mtime_ms is not None, f.path)):
        storage.write_atomic(f.path, f.data)
        if f.mtime_ms is not None:
            kept = storage.set_mtime(f.path, f.mtime_ms) and kept
    return kept


def empty_commit_metadata(table_type: str, schema: str | None, frm: int, to: int) -> tuple[str, CommitMetadata]:
    """The action and metadata of the commit recording a migration: no file written."""
    extra = {MIGRATED_KEY: f"{frm} -> {to}"}
    if schema:
        extra["schema"] = schema
    action = DELTACOMMIT if table_type.upper() == "MERGE_ON_READ" else COMMIT
    return action, CommitMetadata("UNKNOWN", [], extra)

