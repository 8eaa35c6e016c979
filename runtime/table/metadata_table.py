"""The metadata table (Hudi's MDT, `.hoodie/metadata/`): a merge-on-read Hudi table of its own,
with HFile base files and HFILE log blocks, that lists the data table's files so that readers
need not list storage. pipe keeps its `files` partition in step as Hudi's writer does
(HoodieBackedTableMetadataWriter, docs/hudi-1x-format.md 6):

- every change of the data table's files (a write, a compaction, a clean, a rollback, a
  restore) first completes a deltacommit of the metadata table with the same instant time, and
  only then its own instant: a reader that trusts the metadata table takes a deltacommit whose
  data instant is not completed for in flight (Java's getValidInstantTimestamps, hudi-rs drops
  its files), so a crash in between shows the table as before;
- a deltacommit appends one log file to the `files-0000-0` file group, holding one HFILE block
  of HoodieMetadataRecords: `__all_partitions__` (type 1) naming the partitions it touches, and
  one record per partition (type 2, `.` for a non-partitioned table) mapping file names to
  {size, isDeleted}; readers merge them by key, later over earlier;
- what pipe writes is the difference between the files the data table has once the change
  completes (its committed files, listed) and what the metadata table lists: the files a write
  added (a log file with its new size), those a clean, a rollback or a restore deleted;
- a metadata deltacommit left by a data instant that never completed is rolled back first
  (its log file deleted, then its instant files), as Java rolls it back with the data instant;
- every `COMPACT_AFTER` deltacommits the file group is compacted into a new HFile base file;
- after the data table's archiving, its own clean (the file slices none of its last
  `CLEAN_RETAIN` commits reads) and archiving (the data table's bounds plus one, never past its
  latest compaction or the data table's first active instant), as Java's metadata writer runs
  them (HoodieMetadataWriteUtils.createMetadataWriteConfig).

Log files are named as the table version has it: in version 6 a new version of the slice's
log (`.files-0000-0_<base instant>.log.<N>_<token>`), in 8 and 9 one file per deltacommit
named with it. The metadata table's other partitions (column_stats, partition_stats,
record_index, bloom_filters, secondary and expression indexes) are not kept: a change drops
them (properties first, then their folders), as Java's writer does when their index is
disabled, so none is ever stale; Java's next writer with them enabled builds them again."""

from __future__ import annotations

import io
import json
import logging
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import fastavro

from runtime.storage import open_storage
from runtime.table import avro as _avro
from runtime.table import hfile
from runtime.table import logfile
from runtime.table.config import PROPERTIES, read_properties, store_properties, update_properties
from runtime.table.errors import TableError
from runtime.table.layout import PARTITION_METADATA, FileSystemView
from runtime.table.timeline import (
    CLEAN, COMMIT, COMPACTION, COMPLETED, DELTACOMMIT, HOODIE, INFLIGHT, REQUESTED, CommitMetadata, Instant, Timeline, WriteStat,
    archived_instants,
)

log = logging.getLogger("pipe.table")

METADATA_TABLE = f"{HOODIE}/metadata"
FILES = "files"
FILE_ID = "files-0000-0"
ALL_PARTITIONS = "__all_partitions__"
NON_PARTITIONED = "."
PARTITIONS_KEY, INFLIGHT_KEY = "hoodie.table.metadata.partitions", "hoodie.table.metadata.partitions.inflight"
COMPACT_AFTER = 10  # hoodie.metadata.compact.max.delta.commits
CLEAN_RETAIN = 20  # Java's metadata writer: KEEP_LATEST_COMMITS, DEFAULT_METADATA_CLEANER_COMMITS_RETAINED
TOKEN = "0-0-0"
_PARTITION_LIST, _FILE_LIST = 1, 2


def init_instant(table_version: int) -> str:
    """The instant of the files partition's initialisation: Hudi 0.x's SOLO_COMMIT_TIMESTAMP + 010
    on version 6, seventeen zeros on 8 and 9 (createIndexInitTimestamp)."""
    return "00000000000000010" if table_version < 8 else "00000000000000000"


def is_init_instant(time: str) -> bool:
    return time.startswith("00000000000000")


@lru_cache(maxsize=2)
def record_schema(table_version: int) -> tuple[str, object]:
    """HoodieMetadataRecord as the Hudi release that writes this table version has it (0.15 for 6,
    1.1 for 8 and 9): its JSON text (a log block's SCHEMA header) and fastavro's parsed form."""
    name = "HoodieMetadataRecord-0.15.avsc" if table_version < 8 else "HoodieMetadataRecord-1.1.avsc"
    with open(os.path.join(os.path.dirname(__file__), "avsc", name), encoding="utf-8") as f:
        text = f.read()
    return text, fastavro.parse_schema(json.loads(text))


@lru_cache(maxsize=8)
def _parsed(text: bytes):
    """fastavro's form of a schema an HFile names (the same text in every block of a table)."""
    return fastavro.parse_schema(json.loads(text))


def _record(kind: int, files: dict[str, tuple[int, bool]], table_version: int) -> dict:
    rec = {"key": "", "type": kind, "filesystemMetadata": {n: {"size": s, "isDeleted": d} for n, (s, d) in sorted(files.items())}}
    for name in ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path",
                 "_hoodie_file_name", "BloomFilterMetadata", "ColumnStatsMetadata", "recordIndexMetadata", "SecondaryIndexMetadata"):
        rec[name] = None
    if table_version < 8:
        rec.pop("SecondaryIndexMetadata")
    return rec


def _cells(changes: dict[str, dict[str, tuple[int, bool]]], partitions: dict[str, tuple[int, bool]], table_version: int) -> list[tuple[bytes, bytes]]:
    """The HFile cells of one deltacommit (or a base file): key, Avro datum with key "" (readers
    take the key from the cell), sorted by key bytes."""
    _, parsed = record_schema(table_version)
    records = {ALL_PARTITIONS: _record(_PARTITION_LIST, partitions, table_version)} if partitions else {}
    for part, files in changes.items():
        records[part or NON_PARTITIONED] = _record(_FILE_LIST, files, table_version)
    cells = []
    for key in sorted(records, key=lambda k: k.encode("utf-8")):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, records[key])
        cells.append((key.encode("utf-8"), buf.getvalue()))
    return cells


@dataclass
class State:
    """What the files partition lists: partition -> file name -> size, and the partitions."""

    files: dict[str, dict[str, int]]
    partitions: set[str]


class MetadataTable:
    """The metadata table of the data table at `storage` (whose version it has)."""

    def __init__(self, storage, table_version: int):
        self.data = storage
        self.version = table_version
        self.storage = open_storage(storage.spec.child(METADATA_TABLE))

    # --- the table itself ---------------------------------------------------------------------

    def exists(self) -> bool:
        return self.storage.exists(PROPERTIES)

    def properties(self, data_props: dict[str, str]) -> dict[str, str]:
        """hoodie.properties of a metadata table pipe creates, as Hudi's writer of this version
        creates it (HoodieTableMetaClient of the metadata table)."""
        name = f"{data_props.get('hoodie.table.name', 'table')}_metadata"
        database = data_props.get("hoodie.database.name", "")
        props = {"hoodie.table.name": name, "hoodie.table.type": "MERGE_ON_READ", "hoodie.table.version": str(self.version),
                 "hoodie.table.recordkey.fields": "key", "hoodie.populate.meta.fields": "false",
                 "hoodie.table.base.file.format": "HFILE", "hoodie.datasource.write.drop.partition.columns": "false",
                 "hoodie.compaction.payload.class": "org.apache.hudi.metadata.HoodieMetadataPayload",
                 "hoodie.table.checksum": str(zlib.crc32(f"{database}.{name}".encode("utf-8")))}  # ".name" without a database, as Java
        if database:
            props["hoodie.database.name"] = database
        if self.version < 8:
            props.update({"hoodie.timeline.layout.version": "1", "hoodie.archivelog.folder": "archived",
                          "hoodie.table.keygenerator.class": "org.apache.hudi.metadata.HoodieTableMetadataKeyGenerator",
                          "hoodie.compaction.record.merger.strategy": "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5"})
        else:
            props.update({"hoodie.timeline.layout.version": "2", "hoodie.timeline.path": "timeline", "hoodie.timeline.history.path": "history",
                          "hoodie.archivelog.folder": "history", "hoodie.table.initial.version": str(self.version),
                          "hoodie.table.keygenerator.type": "HOODIE_TABLE_METADATA", "hoodie.record.merge.mode": "CUSTOM",
                          "hoodie.record.merge.strategy.id": "00000000-0000-0000-0000-000000000000"})
        return props

    def unkeepable_reason(self, data: Timeline) -> str | None:
        """Why pipe cannot keep this metadata table in step (None: it can): another table
        version than the data table's, or files pipe cannot read."""
        try:
            props = read_properties(self.storage)
        except FileNotFoundError:
            return "it has no hoodie.properties"
        if props.get("hoodie.table.version") != str(self.version):
            return f"it is table version {props.get('hoodie.table.version')}, the data table {self.version}"
        try:
            self.state(self.timeline(), data)
        except (ValueError, KeyError, TypeError, EOFError, OSError) as exc:  # another writer's files: say what, not a traceback
            return f"its files partition cannot be read ({type(exc).__name__}: {exc})"
        return None

    def timeline(self) -> Timeline:
        return Timeline.load(self.storage, 2 if self.version >= 8 else 1)

    # --- reading ------------------------------------------------------------------------------

    def partition_files(self, partition: str) -> dict[str, tuple[list[tuple[str, str, int]], list[tuple[logfile.LogFileName, str, int]]]]:
        """file id -> (base files as (instant, path, size), sorted; log files as (name, path,
        size)) of every file group of a partition of the metadata table."""
        groups: dict[str, tuple[list, list]] = {}
        for info in self.storage.list_files(partition, recursive=False):
            name = info.path.rsplit("/", 1)[-1]
            if name.endswith(".hfile") and not name.startswith(".") and "_" in name:
                groups.setdefault(name.split("_", 1)[0], ([], []))[0].append((name[:-len(".hfile")].rsplit("_", 1)[-1], info.path, info.size))
            elif name.startswith("."):
                parsed = logfile.parse_name(name)
                if parsed is not None:
                    groups.setdefault(parsed.file_id, ([], []))[1].append((parsed, info.path, info.size))
        return {fid: (sorted(bases), logs) for fid, (bases, logs) in groups.items()}

    def _group_files(self) -> tuple[list[tuple[str, str, int]], list[tuple[logfile.LogFileName, str, int]]]:
        """(base files as (instant, path, size), log files as (name, path, size)) of files-0000-0."""
        return self.partition_files(FILES).get(FILE_ID, ([], []))

    @staticmethod
    def _committed(mdt: Timeline):
        """Whether an instant of the metadata table completed: on its active timeline, or
        before that timeline starts (archived; Java's containsOrBeforeTimelineStarts)."""
        from runtime.table.record_index import Validity

        return Validity(frozenset(i.time for i in mdt.instants if i.is_completed), mdt.instants[0].time if mdt.instants else None).committed

    def slice_of(self, mdt: Timeline, valid, bases, logs) -> tuple[str | None, str | None, list[str], int]:
        """A file group's latest slice as a reader that trusts the metadata table takes it:
        (its base instant, its committed base file's path, the paths of its logs in the order
        they apply, the version its next log file gets on table version 6). On 8 and 9 a log
        belongs to the slice of the latest base before its deltacommit completed; on 6 to the
        slice its name gives (a group with no base file yet: the latest base instant its logs name)."""
        committed = self._committed(mdt)
        bases = [b for b in bases if committed(b[0])]
        base_instant = bases[-1][0] if bases else None
        if self.version >= 8:
            completion = {i.time: i.completed_at for i in mdt.instants if i.is_completed}
            chosen = sorted(((n.base_instant, n.version), p) for n, p, _ in logs
                            if valid(n.base_instant) and (base_instant is None or completion.get(n.base_instant, "") > base_instant))
            next_version = 1
        else:
            if base_instant is None:
                named = [n.base_instant for n, _, _ in logs if committed(n.base_instant)]
                base_instant = max(named) if named else None
            chosen = sorted(((n.base_instant, n.version), p) for n, p, _ in logs if n.base_instant == base_instant)
            next_version = max((n.version for n, _, _ in logs if n.base_instant == base_instant), default=0) + 1
        return base_instant, (bases[-1][1] if bases else None), [p for _, p in chosen], next_version

    def state(self, mdt: Timeline, data: Timeline) -> State:
        """The files partition as a reader that trusts it sees it: the latest committed base
        file, then the blocks of valid instants of its slice's logs, in order."""
        files: dict[str, dict[str, int]] = {}
        partitions: set[str] = set()
        valid = self._valid(mdt, data)
        bases, logs = self._group_files()
        _, base, chosen, _ = self.slice_of(mdt, valid, bases, logs)
        if base is not None:
            self._apply(hfile.read(self.storage.read_bytes(base)), files, partitions)
        for block in applied_blocks(self.storage, chosen, valid):
            if block.type == logfile.HFILE:
                self._apply(hfile.read(block.content), files, partitions)
        return State(files, partitions)

    def record_index_spec(self, data: Timeline, instant: str = "") -> "record_index.IndexSpec | None":
        """What tasks need to read the record index as of now, or to add `instant`'s changes
        to it (record_index.IndexSpec); None when its file groups are not numbered 0..n-1 as
        Java numbers them (another layout pipe does not know)."""
        from runtime.table import record_index
        from runtime.table.timeline import epoch_ms_of, timeline_is_local

        mdt = self.timeline()
        valid = self._valid(mdt, data)
        groups = self.partition_files(record_index.PARTITION)
        numbers = {record_index.file_group_number(fid): fid for fid in groups}
        if not numbers or None in numbers or sorted(numbers) != list(range(len(numbers))):
            return None
        slices = []
        for i in range(len(numbers)):
            bases, logs = groups[numbers[i]]
            base_instant, base, chosen, next_version = self.slice_of(mdt, valid, bases, logs)
            size = next((n for _, p, n in bases if p == base), None)
            slices.append(record_index.Slice(i, base, tuple(chosen), base_instant, next_version, size))
        text, _ = record_schema(self.version)
        return record_index.IndexSpec(self.storage.spec.uri, self.storage.spec.options, self.version, tuple(slices), valid, instant,
                                      epoch_ms_of(instant, timeline_is_local(self.data)) if instant else 0, text)

    def _valid(self, mdt: Timeline, data: Timeline):
        """Whether a reader takes the blocks of an instant (record_index.Validity)."""
        from runtime.table.record_index import Validity

        return Validity(frozenset(i.time for i in mdt.instants if i.is_completed), mdt.instants[0].time if mdt.instants else None,
                        frozenset(i.time for i in data.instants if i.is_completed), data.instants[0].time if data.instants else None,
                        frozenset(i.time for i in data.pending()), frozenset(mdt.compactions))

    def _apply(self, h: hfile.HFile, files: dict[str, dict[str, int]], partitions: set[str]) -> None:
        text = h.file_info.get("schema")
        parsed = _parsed(text) if text else record_schema(self.version)[1]
        for key, value in h.cells:
            if not value:
                continue
            rec = fastavro.schemaless_reader(io.BytesIO(value), parsed)
            entries = rec.get("filesystemMetadata") or {}
            name = key.decode("utf-8")
            if rec.get("type") == _PARTITION_LIST:
                for part, info in entries.items():
                    (partitions.discard if info.get("isDeleted") else partitions.add)(part)
            elif rec.get("type") == _FILE_LIST:
                part = "" if name == NON_PARTITIONED else name
                listed = files.setdefault(part, {})
                for fname, info in entries.items():
                    if info.get("isDeleted"):
                        listed.pop(fname, None)
                    else:
                        listed[fname] = max(int(info.get("size") or 0), listed.get(fname, 0))

    # --- writing ------------------------------------------------------------------------------

    def initialize(self, data_props: dict[str, str], data: Timeline) -> None:
        """Creates the metadata table with its files partition built from a listing of the data
        table's committed files: hoodie.properties, the partition's metadata, the init
        deltacommit with an HFile base file; the data table's hoodie.properties then names
        `files` (the caller holds the writer lock). A crash before that leaves a folder no reader
        trusts, which the next change deletes and builds again."""
        for f in sorted(self.storage.list_files("", recursive=True), key=lambda f: not f.path.endswith(PROPERTIES)):
            self.storage.delete(f.path)
        self.storage.write_atomic(PROPERTIES, store_properties(self.properties(data_props), "Created by pipe").encode("iso-8859-1"))
        t = init_instant(self.version)
        self.storage.write_atomic(f"{FILES}/{PARTITION_METADATA}", f"#partition metadata\ncommitTime={t}\npartitionDepth=1\n".encode("ascii"))
        listing = _committed_files(self.data, data)
        data_bytes, cells = self._base_file(listing, set(listing))
        name = f"{FILE_ID}_{TOKEN}_{t}.hfile"
        timeline = self.timeline()
        instant = Instant(t, DELTACOMMIT, REQUESTED)
        self._begin(timeline, instant)
        self.storage.write_atomic(f"{FILES}/{name}", data_bytes)
        stat = WriteStat(FILE_ID, f"{FILES}/{name}", FILES, "null", len(cells), len(cells), 0, 0, len(data_bytes))
        self._complete(timeline, instant, [stat], "BULK_INSERT")
        update_properties(self.data, {PARTITIONS_KEY: FILES, INFLIGHT_KEY: ""})

    def initialize_record_index(self, spark, data_props: dict[str, str], data: Timeline, located, keys: int) -> str:
        """Builds the record index (record_index.py) from `located` (every key of the data
        table's committed snapshot, with its partition and file id; `keys` of them) at a new
        init instant (`00000000000000NNN`, the next one free, as Java numbers an index's
        initialisation after the files partition's); the data table's hoodie.properties then
        names `record_index` (the caller holds the writer lock). What an interrupted build left
        (its folder, its pending instant) is deleted first. Returns the init instant."""
        from runtime.table import record_index
        from runtime.table.timeline import epoch_ms_of, timeline_is_local

        mdt = self.timeline()
        for inst in [i for i in mdt.instants if is_init_instant(i.time) and i.time != init_instant(self.version)
                     and (not i.is_completed or record_index.PARTITION in _partitions_written(mdt, i))]:
            self._roll_back(mdt, inst)  # an interrupted build's (its files go below)
        for f in self.storage.list_files(record_index.PARTITION, recursive=True):
            self.storage.delete(f.path)
        partitions = listed(data_props)
        # listed as being built first, as Java lists an index it builds: a crash leaves it to be dropped
        update_properties(self.data, {INFLIGHT_KEY: record_index.PARTITION})
        mdt = self.timeline()
        used = {i.time for i in mdt.instants} | {init_instant(self.version)}
        first = int(init_instant(self.version)[-3:])
        t = next(f"00000000000000{n:03d}" for n in range(first + 1, 1000) if f"00000000000000{n:03d}" not in used)
        self.storage.write_atomic(f"{record_index.PARTITION}/{PARTITION_METADATA}",
                                  f"#partition metadata\ncommitTime={t}\npartitionDepth=1\n".encode("ascii"))
        text, _ = record_schema(self.version)
        n = record_index.groups_for(keys)
        latest = data.latest_data_write()  # the entries' instant: the one the index is built as of
        spec = record_index.IndexSpec(self.storage.spec.uri, self.storage.spec.options, self.version,
                                      tuple(record_index.Slice(i, None, (), t, 1) for i in range(n)), self._valid(mdt, data), t,
                                      epoch_ms_of(latest.time, timeline_is_local(self.data)) if latest else 0, text)
        instant = Instant(t, DELTACOMMIT, REQUESTED)
        self._begin(mdt, instant)
        stats = record_index.build(spark, spec, located)
        self._complete(mdt, instant, stats, "BULK_INSERT")
        update_properties(self.data, {PARTITIONS_KEY: ",".join(sorted(set(partitions) | {record_index.PARTITION})), INFLIGHT_KEY: ""})
        return t

    def sync(self, data: Timeline, instant: str, written: list[tuple[str, str, int]] = (), index_stats: list[WriteStat] = (),
             spark=None, mdt: Timeline | None = None) -> bool:
        """Brings the files partition in step with the data table as it will be once `instant`
        completes: its committed files (on `data`, the timeline before `instant` completes) and
        `written` ((partition, name, size) of the files `instant` wrote). Writes and completes
        the metadata deltacommit `instant`, which also lists `index_stats` (the record index's
        log files `instant` wrote: record_index.write_delta); call before completing `instant`
        itself, under the writer lock (`mdt`: the metadata table's timeline, given by a caller
        that ran compact_if_due already). Returns whether anything changed."""
        if mdt is None:
            mdt = self.compact_if_due(data, spark)
        state = self.state(mdt, data)
        target = _committed_files(self.data, data)
        for part, name, size in written:
            target.setdefault(part, {})[name] = size
        changes: dict[str, dict[str, tuple[int, bool]]] = {}
        for part in set(target) | set(state.files):
            now, before = target.get(part, {}), state.files.get(part, {})
            delta = {n: (s, False) for n, s in now.items() if before.get(n) != s}
            delta.update({n: (0, True) for n in before if n not in now})
            if delta:
                changes[part] = delta
        # the partitions the deltacommit touches, the new ones among them, as Java lists them
        touched = {p: (0, False) for p in (set(changes) & set(target)) | (set(target) - state.partitions)}
        if not changes and not touched and not index_stats:
            return False
        self._deltacommit(mdt, instant, _cells(changes, touched, self.version), sum(len(v) for v in changes.values()), index_stats)
        return True

    def compact_if_due(self, data: Timeline, spark=None) -> Timeline:
        """Before a deltacommit: the orphans rolled back, then the metadata table compacted
        once COMPACT_AFTER deltacommits followed its latest base, of the valid ones only (as
        Java's metadata writer runs its table services first): the deltacommit then goes to a
        log of the new slice. Returns the metadata table's timeline after."""
        mdt = self.roll_back_orphans(data)
        base = self._latest_base(mdt)
        if sum(1 for i in mdt.completed((DELTACOMMIT,)) if i.time > (base or "") and not is_init_instant(i.time)) >= COMPACT_AFTER:
            if self.compact(data, spark) is not None:
                mdt = self.timeline()
        return mdt

    def slice_start(self, mdt: Timeline) -> str:
        """The earliest instant of the files partition's latest slice: its base file's (the
        latest compaction), or on 8 and 9 that of a deltacommit that started before the
        compaction and completed after it (it is in the slice: a reader needs its completion
        time). Archiving stops there."""
        base = self._latest_base(mdt) or init_instant(self.version)
        return min([base] + [i.time for i in mdt.instants if i.is_completed and i.completed_at > base])

    def _latest_base(self, mdt: Timeline) -> str | None:
        """The instant of the files partition's latest committed base file (None: none)."""
        committed = self._committed(mdt)
        bases = [b[0] for b in self._group_files()[0] if committed(b[0])]
        return bases[-1] if bases else None

    def _deltacommit(self, mdt: Timeline, time: str, cells, writes: int, index_stats: list[WriteStat] = ()) -> None:
        text, _ = record_schema(self.version)
        block = logfile.Block(logfile.HFILE, {logfile.INSTANT_TIME: time, logfile.SCHEMA: text},
                              hfile.write(cells, {"schema": text.encode("utf-8")}))
        instant = Instant(time, DELTACOMMIT, REQUESTED)
        base = self._latest_base(mdt)
        # the inflight file has the workload, as Java's writer saves it (the file group and its
        # slice's base instant): Java 0.x rolls a failed deltacommit back by it, with a rollback
        # block in that slice's log (its metadata writer does not use markers)
        self._begin(mdt, instant, [WriteStat(FILE_ID, "", FILES, base or init_instant(self.version), 0, 0, 0, 0, 0)])
        _, logs = self._group_files()
        if self.version >= 8:
            name = logfile.LogFileName(FILE_ID, time, 1, TOKEN)
            log_names = [name.name]
        else:
            versions = [n.version for n, _, _ in logs if n.base_instant == base]
            name = logfile.LogFileName(FILE_ID, base or init_instant(self.version), max(versions, default=0) + 1, TOKEN)
            log_names = sorted({n.name for n, _, _ in logs if n.base_instant == base} | {name.name})
        data = logfile.encode_block(block)
        self.storage.write_atomic(f"{FILES}/{name.name}", data)
        stat = WriteStat(FILE_ID, f"{FILES}/{name.name}", FILES, time if self.version >= 8 else (base or "null"), writes, 0, writes, 0,
                         len(data), base_file=(f"{FILE_ID}_{TOKEN}_{base}.hfile" if base and self.version < 8 else None),
                         log_files=tuple(log_names), log_version=name.version)
        from runtime.table import services

        services.fault("metadata_table_before_commit")
        self._complete(mdt, instant, [stat, *index_stats], "UPSERT_PREPPED")

    def _begin(self, mdt: Timeline, instant: Instant, workload: list[WriteStat] = ()) -> None:
        for state, data in ((REQUESTED, b""), (INFLIGHT, CommitMetadata("UPSERT_PREPPED", list(workload), {}).to_bytes(mdt.layout))):
            path = mdt.path(instant, state)
            if not self.storage.create_exclusive(path, data):
                raise TableError(f"the metadata table's instant file {path} exists already; another writer is active")

    def _complete(self, mdt: Timeline, instant: Instant, stats: list[WriteStat], operation: str) -> None:
        text, _ = record_schema(self.version)
        meta = CommitMetadata(operation, stats, {"schema": text})
        if mdt.complete(instant.with_state(COMPLETED), meta.to_bytes(mdt.layout)) is None:
            raise TableError(f"the metadata table's instant {instant.time} was completed by someone else")

    def _base_file(self, files: dict[str, dict[str, int]], partitions: set[str]) -> tuple[bytes, list]:
        """An HFile base file of the files partition listing `files`, with what Hudi's base files
        carry besides: the schema, the key range and a bloom filter of the keys (meta block
        `bloomFilter`). Returns its bytes and cells."""
        cells = _cells({p: {n: (size, False) for n, size in fs.items()} for p, fs in files.items()},
                       {p: (0, False) for p in partitions}, self.version)
        return base_hfile(cells, record_schema(self.version)[0]), cells

    def compact(self, data: Timeline, spark=None) -> str | None:
        """Folds the files partition's slice into a new HFile base file at a new instant (a
        compaction completing as a commit), as Java compacts the metadata table; and, when the
        table has a record index, each of its file groups with logs, in Spark tasks (`spark`;
        without one, nothing is compacted then: a record index slice must never start before
        the files partition's, where archiving stops). Returns the instant, or None."""
        from runtime.table import record_index

        keeps_index = keeps_record_index(read_properties(self.data))
        if keeps_index and spark is None:
            return None
        mdt = self.timeline()
        state = self.state(mdt, data)
        base = self._latest_base(mdt)
        if self.version >= 8:
            time = mdt.new_instant_time()
        else:  # 0.x names the metadata table's compaction after its latest deltacommit
            time = (mdt.completed((DELTACOMMIT,))[-1].time + "001") if mdt.completed((DELTACOMMIT,)) else mdt.new_instant_time()
        data_bytes, cells = self._base_file({p: fs for p, fs in state.files.items() if fs}, state.partitions)
        text, _ = record_schema(self.version)
        _, logs = self._group_files()
        slice_logs = [p for n, p, _ in logs if (n.base_instant > (base or "") if self.version >= 8 else n.base_instant == base)]
        index_spec = self.record_index_spec(data, time) if keeps_index else None
        plan = {"operations": [{"baseInstantTime": base or "", "deltaFilePaths": [p.rsplit("/", 1)[-1] for p in slice_logs],
                                "dataFilePath": f"{FILE_ID}_{TOKEN}_{base}.hfile" if base else None, "fileId": FILE_ID,
                                "partitionPath": FILES, "metrics": {}, "bootstrapFilePath": None}]
                + (record_index.compaction_operations(index_spec) if index_spec is not None else []),
                "extraMetadata": None, "version": 2}
        requested = Instant(time, COMPACTION, REQUESTED)
        for state_, payload in ((REQUESTED, _avro.to_bytes(_avro.COMPACTION_PLAN, plan)), (INFLIGHT, b"")):
            if not self.storage.create_exclusive(mdt.path(requested, state_), payload):
                raise TableError(f"the metadata table's compaction {time} exists already; another writer is active")
        name = f"{FILE_ID}_{TOKEN}_{time}.hfile"
        self.storage.write_atomic(f"{FILES}/{name}", data_bytes)
        stat = WriteStat(FILE_ID, f"{FILES}/{name}", FILES, base or "null", len(cells), 0, len(cells), 0, len(data_bytes))
        index_stats = record_index.compact(spark, index_spec) if index_spec is not None else []
        meta = CommitMetadata("COMPACT", [stat, *index_stats], {"schema": text}, compacted=True)
        if mdt.complete(Instant(time, COMMIT, COMPLETED), meta.to_bytes(mdt.layout)) is None:
            raise TableError(f"the metadata table's compaction {time} was completed by someone else")
        return time

    # --- its own table services ---------------------------------------------------------------

    def _plan_clean(self, mdt: Timeline) -> tuple[dict[str, list[str]], str | None]:
        """The files of the slices none of the last CLEAN_RETAIN commits reads (Java's
        KEEP_LATEST_COMMITS on the metadata table), by partition (the files partition's and the
        record index's file groups): in each group the slices older than its newest one before
        the earliest retained commit, base file and logs; and that commit."""
        commits = mdt.completed((COMMIT, DELTACOMMIT))
        if len(commits) <= CLEAN_RETAIN:
            return {}, None
        earliest = commits[-CLEAN_RETAIN].time
        committed = self._committed(mdt)
        completion = {i.time: i.completed_at for i in mdt.instants if i.is_completed}
        if self.version >= 8:  # and of the archived ones, from the LSM history
            completion.update({i.time: i.completed_at for i in archived_instants(self.storage, 2)})
        doomed: dict[str, list[str]] = {}
        for partition in (FILES, RECORD_INDEX):
            groups = self.partition_files(partition)
            for fid, (bases, logs) in sorted(groups.items()):
                if partition == FILES and fid != FILE_ID:
                    continue
                older = [b for b in bases if committed(b[0]) and b[0] < earliest]
                if len(older) < 2:
                    continue
                keep_from = older[-1][0]  # the newest slice before the earliest retained commit stays
                paths = [path for t, path, _ in older if t < keep_from]
                for n, path, _ in logs:
                    if self.version >= 8:  # a log is in the slice of the latest base before its completion
                        done = completion.get(n.base_instant)
                        old = done <= keep_from if done else n.base_instant < keep_from
                    else:
                        old = n.base_instant < keep_from
                    if old:
                        paths.append(path)
                if paths:
                    doomed.setdefault(partition, []).extend(paths)
        return {p: sorted(v) for p, v in doomed.items()}, earliest

    def clean(self) -> str | None:
        """Cleans the files partition's old slices (_plan_clean) as a clean instant on the
        metadata table's timeline: on 8 and 9 at a new instant time, on 6 at its latest
        deltacommit's time + `002` (as Java 0.x names it). Returns the instant, or None."""
        from runtime.table import services

        mdt = self.timeline()
        doomed, earliest = self._plan_clean(mdt)
        if not doomed:
            return None
        if self.version >= 8:
            time = mdt.new_instant_time()
        else:
            deltas = mdt.completed((DELTACOMMIT,))
            time = (deltas[-1].time if deltas else mdt.new_instant_time()) + "002"
            if any(i.time == time for i in mdt.instants):
                return None
        return services.record_clean(self.storage, mdt, Instant(time, CLEAN, REQUESTED), doomed, earliest,
                                     services.KEEP_LATEST_COMMITS).instant

    def archive(self, min_instants: int, max_instants: int) -> list[str]:
        """Archives the metadata table's timeline between `min_instants` and `max_instants`
        (services.archive_timeline), never its latest compaction or anything after it (its
        slice's deltacommits must stay valid) nor an instant at or after the data table's first
        active one (the deltacommit of an active data instant is judged by it)."""
        from runtime.table import services

        mdt = self.timeline()
        if len(mdt.instants) <= max_instants:  # nothing to archive: no listing, no data timeline
            return []
        stops = [self.slice_start(mdt)]
        data = Timeline.load(self.data, 2 if self.version >= 8 else 1)
        if data.instants:
            stops.append(data.instants[0].time)
        return services.archive_timeline(self.storage, min_instants, max_instants, keep_from=min(stops))

    def _delete_logs_of(self, time: str) -> None:
        """Deletes the log files a deltacommit `time` wrote (the files partition's and the
        record index's): named with it (8, 9), or the log versions whose blocks are all its (6)."""
        from runtime.table import record_index

        for n, path, _ in self._group_files()[1]:
            if self.version >= 8 and n.base_instant == time:
                self.storage.delete(path)
            elif self.version < 8:
                blocks = logfile.read_blocks(self.storage.read_bytes(path), path)
                if blocks and all(b.instant == time for b in blocks):
                    self.storage.delete(path)
        # the record index's logs hold keys: on 6 only their block headers are read
        for _, (_, logs) in self.partition_files(record_index.PARTITION).items():
            for n, path, size in logs:
                if n.base_instant == time if self.version >= 8 else logfile.written_by(self.storage, path, size) == time:
                    self.storage.delete(path)

    def forget(self, time: str) -> None:
        """Rolls back the metadata deltacommit `time` (if any) of a data instant being undone,
        while that instant is still pending on the data timeline (Java 1.1's readers take a
        metadata deltacommit whose data instant is gone for valid): its log file, then its
        instant files, the completed one first."""
        mdt = self.timeline()
        inst = next((i for i in mdt.instants if i.time == time and i.action == DELTACOMMIT), None)
        if inst is not None:
            self._roll_back(mdt, inst)
        elif keeps_record_index(read_properties(self.data)):
            self._delete_logs_of(time)  # the record index's logs are written before the deltacommit begins

    def _roll_back(self, mdt: Timeline, inst: Instant) -> None:
        """Undoes a metadata deltacommit or a pending compaction: its completed file first (no
        reader takes it any more), then the files it wrote, then its pending instant files."""
        if inst.is_completed:
            self.storage.delete(mdt.path(inst))
        self._delete_logs_of(inst.time)
        if inst.action == COMPACTION:
            for info in self.storage.list_files(FILES, recursive=False) + self.storage.list_files(RECORD_INDEX, recursive=False):
                if info.path.endswith(f"_{inst.time}.hfile"):
                    self.storage.delete(info.path)
        for state in (INFLIGHT, REQUESTED):
            if self.storage.exists(mdt.path(inst, state)):
                self.storage.delete(mdt.path(inst, state))

    def roll_back_orphans(self, data: Timeline) -> Timeline:
        """Rolls back the metadata deltacommits whose data instant never completed and is no
        longer pending (a crash between the two commits, or a data write rolled back since):
        each as _roll_back undoes it; the metadata table's compactions and init instants stay. Returns its timeline after."""
        mdt = self.timeline()
        data_done = {i.time for i in data.instants if i.is_completed}
        first = data.instants[0].time if data.instants else None
        # only instants of data writes (17 digits): Java 0.x's own are suffixed (<T>010 init, <T>003 restore sync)
        orphans = [i for i in mdt.instants if i.action == DELTACOMMIT and not is_init_instant(i.time) and len(i.time) <= 17
                   and i.time not in data_done and (first is None or i.time >= first)]
        orphans += [i for i in mdt.instants if i.action == COMPACTION and not i.is_completed]
        if not orphans:
            return mdt
        for inst in orphans:
            self._roll_back(mdt, inst)
            log.info("rolled back the metadata table's %s %s, whose data instant never completed", inst.action, inst.time)
        return self.timeline()


def applied_blocks(storage, paths, valid) -> Iterator[logfile.Block]:
    """The blocks of a slice's log files (`paths`, in order) a reader applies: those of valid
    instants (`valid`, MetadataTable._valid) that no rollback block of the slice targets."""
    blocks = []
    rolled_back: set[str] = set()
    for path in paths:
        for block in logfile.read_blocks(storage.read_bytes(path), f"metadata table log {path}"):
            if block.is_rollback:
                rolled_back.add(block.header.get(logfile.TARGET_INSTANT_TIME, ""))
            blocks.append(block)
    return (b for b in blocks if valid(b.instant) and b.instant not in rolled_back)


def _partitions_written(mdt: Timeline, inst: Instant) -> set[str]:
    """The metadata table partitions a completed deltacommit wrote files in."""
    try:
        return {s.partition_path for s in mdt.commit_metadata(inst).write_stats}
    except (OSError, ValueError, KeyError):
        return set()


def listed(props: dict[str, str], key: str = PARTITIONS_KEY) -> list[str]:
    """The metadata table partitions hoodie.properties lists as built (or, with INFLIGHT_KEY, being built)."""
    return [p.strip() for p in (props.get(key) or "").split(",") if p.strip()]


def kept(props: dict[str, str]) -> bool:
    """Whether the data table with these properties has a metadata table whose files partition
    pipe keeps in step (Java's isMetadataTableAvailable: `files` is listed)."""
    return FILES in listed(props)


def _kept_by(storage) -> MetadataTable | None:
    """The metadata table the data table at `storage` keeps in step (kept), or None."""
    props = read_properties(storage)
    if not kept(props):
        return None
    from runtime.table.config import TableConfig

    return MetadataTable(storage, TableConfig.from_properties_map(props).table_version)


def before_complete(storage, instant: str, stats: list[WriteStat] = (), index_changes=None, spark=None) -> None:
    """What every change of the data table's files does right before completing its instant:
    the metadata deltacommit of the same time, when the table keeps a metadata table (`stats`:
    the files the instant wrote). `index_changes` ((spark, DataFrame of the keys whose location
    the instant changed: record_index.write_delta)), when the table keeps a record index: its
    log files are written first and listed by the same deltacommit. The timeline is listed
    anew: a stale one would take a later commit's files for uncommitted."""
    mdt = _kept_by(storage)
    if mdt is not None:
        written = [(s.partition_path, s.path.rsplit("/", 1)[-1], s.file_size) for s in stats]
        written += [(s.partition_path, p.rsplit("/", 1)[-1], n) for s in stats for p, n in (s.cdc_stats or {}).items()]
        data = Timeline.load(storage, 2 if mdt.version >= 8 else 1)
        index_stats: list[WriteStat] = []
        timeline = None
        if index_changes is not None:
            spark, changes = index_changes
        if index_changes is not None and keeps_record_index(read_properties(storage)):
            from runtime.table import record_index

            # first: a failed write's log versions would come before this one's, and a compaction
            # due now must come before this instant's logs are named (on 6, after their slice)
            timeline = mdt.compact_if_due(data, spark)
            spec = mdt.record_index_spec(data, instant)
            if spec is None:
                raise TableError(f"the record index of {storage.spec} changed its layout during the write; nothing was committed",
                                 "run again")
            index_stats = record_index.write_delta(spark, spec, changes)
        mdt.sync(data, instant, written, index_stats, spark, timeline)
        from runtime.table import services

        services.fault("after_metadata_table")  # its deltacommit complete, the data instant not yet


def archive_stop(storage) -> list[str]:
    """Where the data table's archiving stops when it keeps a metadata table: at the start of
    the files partition's latest slice (MetadataTable.slice_start; a data instant sorts before
    `<T>001` iff it is at or before T); [] without a metadata table."""
    mdt = _kept_by(storage)
    if mdt is None:
        return []
    return [mdt.slice_start(mdt.timeline())]


def table_services(storage, min_instants: int, max_instants: int) -> None:
    """The metadata table's own clean and archiving, after the data table's archiving (bounds
    `min_instants`/`max_instants`; the metadata table's are one more each, as Java sets them),
    when the data table keeps one."""
    mdt = _kept_by(storage)
    if mdt is None or not mdt.exists():
        return
    if mdt.clean():
        log.info("cleaned the metadata table's old file slices of %s", storage.spec)
    mdt.archive(min_instants + 1, max_instants + 1)


def forget(storage, time: str) -> None:
    """MetadataTable.forget for the data table at `storage`, when it keeps a metadata table."""
    mdt = _kept_by(storage)
    if mdt is not None:
        mdt.forget(time)


def base_hfile(cells: list[tuple[bytes, bytes]], schema_text: str) -> bytes:
    """An HFile base file of a metadata table partition's cells (sorted), with what Hudi's base
    files carry besides: the schema, the key range and a bloom filter of the keys (meta block
    `bloomFilter`)."""
    bf = _bloom([c[0].decode("utf-8") for c in cells])
    info = {"schema": schema_text.encode("utf-8"), "bloomFilterTypeCode": bf.type_code.encode("ascii"),
            "minRecordKey": cells[0][0] if cells else b"", "maxRecordKey": cells[-1][0] if cells else b""}
    return hfile.write(cells, info, {"bloomFilter": bf.serialize_to_string().encode("ascii")})


def _bloom(keys: list[str]):
    import pyarrow as pa

    from runtime.table import bloom

    bf = bloom.BloomFilter.create(num_entries=10000, fpp=0.000000001)  # hoodie.metadata's bloom filter settings
    bf.add(pa.array(keys, pa.string()))
    return bf


def _committed_files(storage, timeline: Timeline) -> dict[str, dict[str, int]]:
    """partition -> name -> size of the data table's committed base and log files (those of
    replaced file groups too, until cleaned), as the metadata table lists them."""
    view = FileSystemView.load(storage, timeline)
    out: dict[str, dict[str, int]] = {}
    for bf in view.files:
        out.setdefault(bf.partition, {})[bf.name] = bf.size
    for lf in view.logs:
        out.setdefault(lf.partition, {})[lf.name] = lf.size
    for c in view.cdc:  # Java's metadata writer lists a CDC-enabled table's .cdc files too
        out.setdefault(c.partition, {})[c.name] = c.size
    return out


RECORD_INDEX = "record_index"


def keeps_record_index(props: dict[str, str]) -> bool:
    """Whether the data table with these properties has a built record index (record_index.py)."""
    return RECORD_INDEX in listed(props)


def unkept_partitions(props: dict[str, str], keep: frozenset[str] = frozenset()) -> list[str]:
    """The metadata table's partitions (built or being built) other than `files` and `keep`
    (built ones only)."""
    built = listed(props)
    return sorted({p for p in built + listed(props, INFLIGHT_KEY) if p != FILES and not (p in keep and p in built)})


def drop_unkept_partitions(storage, props: dict[str, str], keep: frozenset[str] = frozenset()) -> list[str]:
    """Drops the partitions pipe does not keep in step (all but `files` and those of `keep`
    this change keeps in step), as Java's writer drops a disabled index: hoodie.properties
    first (crash-safely), then their folders. Returns them."""
    drop = unkept_partitions(props, keep)
    if not drop:
        return []
    keep = [p for p in listed(props) if p not in drop]
    update_properties(storage, {PARTITIONS_KEY: ",".join(keep), INFLIGHT_KEY: ""})
    mdt = open_storage(storage.spec.child(METADATA_TABLE))
    for part in drop:
        for f in mdt.list_files(part, recursive=True):
            mdt.delete(f.path)
    return drop
