"""The timeline: instants in `.hoodie/` (layout version 1, flat), their states and metadata.

An instant moves requested -> inflight -> completed. Completion is one atomic create of the
completed file (`Storage.create_exclusive`); before it exists every reader ignores the
instant's files, afterwards all of them are visible. Instant times have millisecond precision,
are unique and strictly increasing across every action, pending ones included, and follow the
table's `hoodie.table.timeline.timezone`: UTC (pipe's own tables), or local time (LOCAL, Hudi's
default, as in tables Java made): the wall clock of the zone the latest instant was made in."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

from runtime.storage import Storage

HOODIE = ".hoodie"
REQUESTED, INFLIGHT, COMPLETED = "requested", "inflight", "completed"
COMMIT, DELTACOMMIT, REPLACECOMMIT = "commit", "deltacommit", "replacecommit"
CLEAN, ROLLBACK, COMPACTION, SAVEPOINT, RESTORE = "clean", "rollback", "compaction", "savepoint", "restore"
# Actions whose completion makes data files visible.
WRITE_ACTIONS = (COMMIT, DELTACOMMIT, REPLACECOMMIT)
LOGCOMPACTION, INDEXING = "logcompaction", "indexing"
_ACTIONS = (COMMIT, DELTACOMMIT, REPLACECOMMIT, CLEAN, ROLLBACK, COMPACTION, SAVEPOINT, RESTORE, INDEXING, LOGCOMPACTION)
TIMEZONE_KEY = "hoodie.table.timeline.timezone"
# suffixed: a metadata table's own instants on version 6 (Hudi 0.x: <latest deltacommit>001 compactions, <T>010 init)
_NAME = re.compile(r"^(\d{14,17}(?:00[1-6]|010)*)\.([a-z]+)(?:\.(requested|inflight))?$")

# Keys of pipe's own in extraMetadata. Checkpoints of sources live under this prefix, one key
# per source, so several sources can feed one table each with its own checkpoint.
CHECKPOINT_PREFIX = "pipe.checkpoint."
SAMPLE_KEY = "pipe.sample"  # a commit built by --sample or --empty ("empty"): part of the input, nothing consumed
DEFERRED_PREFIX = "pipe.deferred."  # beside a checkpoint read from another target's lake (--defer): that target
RESERVED_EXTRA = ("schema",)


@dataclass(frozen=True, order=True)
class Instant:
    time: str
    action: str
    state: str
    # when it completed: the `_C` of a completed file of timeline layout 2 (`T_C.action`, table
    # versions 8 and 9); None in layout 1, which keeps no completion time
    completion: str | None = field(default=None, compare=False)
    # layout 2: a completed file named without `_C` (Java's "legacy" name), whose completion
    # time was taken from the file's modification time
    legacy: bool = field(default=False, compare=False)

    def file_name(self, state: str | None = None) -> str:
        state = state or self.state
        if state == COMPLETED:
            return f"{self.time}.{self.action}"
        if state == INFLIGHT and self.action == COMMIT:
            return f"{self.time}.inflight"  # the COW commit is the exception (HUDI_FORMAT 2)
        return f"{self.time}.{self.action}.{state}"

    @property
    def is_completed(self) -> bool:
        return self.state == COMPLETED

    @property
    def completed_at(self) -> str:
        """When it completed (timeline layout 2), else its instant time."""
        return self.completion or self.time

    def with_state(self, state: str) -> "Instant":
        return Instant(self.time, self.action, state)


def parse_instant_file(name: str) -> Instant | None:
    if name.endswith(".inflight") and name.count(".") == 1:  # T.inflight (COW commit)
        time = name.split(".")[0]
        return Instant(time, COMMIT, INFLIGHT) if time.isdigit() else None
    m = _NAME.match(name)
    if not m or m.group(2) not in _ACTIONS:
        return None
    return Instant(m.group(1), m.group(2), m.group(3) or COMPLETED)


# Timeline layout 2 (table versions 8 and 9): instants in .hoodie/timeline/, a completed one
# named `T_C.action` with its completion time C (docs/hudi-1x-format.md, 2.1); the pending
# action `clustering` completes as a replacecommit, as `compaction` completes as a commit.
TIMELINE_V2 = f"{HOODIE}/timeline"
CLUSTERING = "clustering"
_NAME_V2 = re.compile(r"^(\d{14,17})(?:_(\d{14,17}))?\.([a-z]+)(?:\.(requested|inflight))?$")


def parse_instant_file_v2(name: str) -> Instant | None:
    """An instant of timeline layout 2 from its file's name (None: not an instant's). A
    completed name without `_C` is Java's "legacy" form, whose completion time is unknown."""
    if name.endswith(".inflight") and name.count(".") == 1:  # T.inflight (COW commit)
        time = name.split(".")[0]
        return Instant(time, COMMIT, INFLIGHT) if time.isdigit() else None
    m = _NAME_V2.match(name)
    if not m or m.group(3) not in (*_ACTIONS, CLUSTERING) or (m.group(2) and m.group(4)):
        return None
    return Instant(m.group(1), m.group(3), m.group(4) or COMPLETED, m.group(2))


_STATE_ORDER = {REQUESTED: 0, INFLIGHT: 1, COMPLETED: 2}
# pending actions that complete under another action's name (the last two in layout 2 only)
_COMPLETES_AS = {COMPACTION: COMMIT, CLUSTERING: REPLACECOMMIT, LOGCOMPACTION: DELTACOMMIT}


def instant_path(instant: Instant, layout: int = 1, state: str | None = None) -> str:
    """The file of `instant` in `state` (default its own) under the table's root, in timeline
    layout `layout`; a completed instant that knows its completion time is of layout 2."""
    state = state or instant.state
    if state == COMPLETED and instant.completion is not None and not instant.legacy:
        return f"{TIMELINE_V2}/{instant.time}_{instant.completion}.{instant.action}"
    return f"{TIMELINE_V2 if layout >= 2 else HOODIE}/{instant.file_name(state)}"


class Timeline:
    """The active timeline as listed once; reload to see later changes."""

    def __init__(self, storage: Storage, instants: Iterable[Instant], made_ms: dict[str, int] | None = None, layout: int = 1):
        self.storage = storage
        self.layout = layout  # 1: instants in .hoodie/ (versions 4 to 6); 2: in .hoodie/timeline/ (versions 8, 9)
        # instant time -> when its earliest timeline file was written (epoch ms), as listed
        self.made_ms = dict(made_ms or {})
        latest: dict[tuple[str, str], Instant] = {}
        for i in instants:
            key = (i.time, i.action)
            if key not in latest or _STATE_ORDER[i.state] > _STATE_ORDER[latest[key].state]:
                latest[key] = i
        # a completed compaction is `T.commit`; its `T.compaction.requested/inflight` stay
        # beside it and are not pending (in layout 2, so do a clustering's beside its
        # `T_C.replacecommit` and a log compaction's beside its `T_C.deltacommit`)
        finished = {(t, a) for (t, a), i in latest.items() if i.is_completed}
        completed_as = {(t, a) for (t, a) in latest if a in _COMPLETES_AS and (t, _COMPLETES_AS[a]) in finished}
        self.instants: list[Instant] = sorted(i for key, i in latest.items() if key not in completed_as)
        # the completed commits that are compactions: they rewrite file slices, not data
        self.compactions: set[str] = {t for (t, a) in completed_as if a == COMPACTION}

    @classmethod
    def load(cls, storage: Storage, layout: int | None = None) -> "Timeline":
        """The active timeline of timeline layout `layout` (TableConfig.timeline_layout; None:
        the one hoodie.properties declares)."""
        layout = layout_of(storage) if layout is None else layout
        found, made = [], {}
        folder, parse = (TIMELINE_V2, parse_instant_file_v2) if layout >= 2 else (HOODIE, parse_instant_file)
        local = None
        for f in storage.list_files(folder, recursive=False):
            inst = parse(f.path.rsplit("/", 1)[-1])
            if inst is not None:
                if layout >= 2 and inst.is_completed and inst.completion is None:
                    # Java's "legacy" completed name (no _C, as its 7->8 upgrade of an old table
                    # leaves): completed when the file was written, in the timeline's time zone
                    local = timeline_is_local(storage) if local is None else local
                    inst = Instant(inst.time, inst.action, inst.state, completion_of_mtime(f.mtime_ms, inst.time, local), legacy=True)
                found.append(inst)
                made[inst.time] = min(made.get(inst.time, f.mtime_ms), f.mtime_ms)
        return cls(storage, found, made, layout=2 if layout >= 2 else 1)

    def path(self, instant: Instant, state: str | None = None) -> str:
        """The file of `instant` (in `state`, default its own) under the table's root."""
        return instant_path(instant, self.layout, state)

    # --- views ----------------------------------------------------------------------------

    def completed(self, actions: Iterable[str] = WRITE_ACTIONS) -> list[Instant]:
        actions = tuple(actions)
        return [i for i in self.instants if i.is_completed and i.action in actions]

    def pending(self) -> list[Instant]:
        return [i for i in self.instants if not i.is_completed]

    def latest_completed(self, actions: Iterable[str] = WRITE_ACTIONS) -> Instant | None:
        done = self.completed(actions)
        return done[-1] if done else None

    def latest_data_write(self) -> Instant | None:
        """The latest completed write that brought data (a commit, deltacommit or
        replacecommit that is not a compaction): what a writer based its input on. A
        compaction (or a clean, an archival) in between changes no row, so Hudi's optimistic
        concurrency does not take it for a conflict with a write of other file groups."""
        done = [i for i in self.completed(WRITE_ACTIONS) if i.time not in self.compactions]
        return done[-1] if done else None

    def last_time(self) -> str | None:
        """The latest time on the timeline: of an instant, or in layout 2 of a completion (a new
        instant or completion time must be later than both, as Java 1.x's time generator has it)."""
        times = [i.time for i in self.instants[-1:]] + [i.completion for i in self.instants if i.completion]
        return max(times) if times else None

    def pending_compactions(self) -> list[str]:
        """Times of the compactions planned (requested) or running (inflight), not committed."""
        return [i.time for i in self.instants if i.action == COMPACTION and not i.is_completed]

    def new_instant_time(self) -> str:
        """A new instant time, later than every instant of this timeline, in the table's
        timeline time zone (hoodie.table.timeline.timezone). In a LOCAL table that is the
        wall clock of the zone its latest instant was made in (writers_utc_offset), else the
        process's own."""
        table = getattr(getattr(self.storage, "spec", None), "uri", None)
        if not timeline_is_local(self.storage):
            return new_instant_time(self.last_time(), table=table)
        return new_instant_time(self.last_time(), local=True, utc_offset=self.writers_utc_offset(), table=table)

    def writers_utc_offset(self) -> dt.timedelta | None:
        """The UTC offset of the clock that made the latest instant, for LOCAL tables: its time
        read as a wall clock, less the moment its first timeline file was written, to the nearest
        quarter hour. Hudi's writers make LOCAL instants in their JVM's zone and only keep them
        increasing within their own process, so a writer in another zone must use the same
        clock: pipe in UTC after a Java writer in Los Angeles made instants 8 hours ahead of
        Java's, and Java's next commit sorted before pipe's, its updates hidden. None when
        unknown (no instant, or an implausible offset)."""
        t = self.instants[-1].time if self.instants else None  # an instant's time, whose file's write time is known
        made = self.made_ms.get(t) if t else None
        if made is None:
            return None
        try:
            wall = dt.datetime.strptime(t[:14], "%Y%m%d%H%M%S").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            return None
        seconds = (wall - dt.datetime.fromtimestamp(made / 1000, dt.timezone.utc)).total_seconds()
        quarters = round(seconds / 900)
        if abs(quarters) > 14 * 4:  # no zone is that far from UTC
            return None
        return dt.timedelta(minutes=15 * quarters)

    def completed_by(self, completion: str | None) -> "Timeline":
        """Timeline layout 2: the timeline as a reader saw it at `completion` (a completion
        time): every instant that completed later is in flight (a commit that started earlier
        may complete later, so this is not a cut by instant time). Itself for None."""
        if completion is None:
            return self
        seen = [i if not i.is_completed or i.completed_at <= completion
                else Instant(i.time, COMPACTION if i.time in self.compactions else i.action, INFLIGHT) for i in self.instants]
        out = Timeline(self.storage, seen, self.made_ms, self.layout)
        out.compactions = {i.time for i in seen if i.is_completed and i.time in self.compactions}
        return out

    def completed_after(self, completion: str | None, actions: Iterable[str] = WRITE_ACTIONS) -> list[Instant]:
        """Timeline layout 2: the completed instants whose completion time is later than
        `completion` (all for None), in completion order."""
        done = [i for i in self.completed(actions) if completion is None or i.completed_at > completion]
        return sorted(done, key=lambda i: (i.completed_at, i.time))

    def complete(self, instant: Instant, data: bytes) -> Instant | None:
        """Completes `instant` by creating its completed file with `data` exclusively: `T.action`
        in layout 1; in layout 2 `T_C.action`, C a new time from the table's clock (later than
        every instant and completion), after checking no completed file of `T` exists (its name
        has another C). Returns the completed instant, or None when it was completed already."""
        done = Instant(instant.time, instant.action, COMPLETED)
        if self.layout >= 2:
            prefix = f"{instant.time}_"
            if any(f.path.rsplit("/", 1)[-1].startswith(prefix) and f.path.endswith(f".{instant.action}")
                   for f in self.storage.list_files(TIMELINE_V2, recursive=False)):
                return None
            done = Instant(instant.time, instant.action, COMPLETED, self.new_instant_time())
        return done if self.storage.create_exclusive(self.path(done), data) else None

    def find(self, time: str) -> Instant | None:
        for i in self.instants:
            if i.time == time:
                return i
        return None

    # --- metadata -----------------------------------------------------------------------------

    def read_json(self, instant: Instant) -> dict[str, Any]:
        """The instant's metadata as a dict: JSON in layout 1 (and Java's "legacy" completed
        files of layout 2), an Avro object container in layout 2, whose records have the same
        field names (HoodieCommitMetadata, HoodieReplaceCommitMetadata)."""
        return decode_metadata(self.storage.read_bytes(self.path(instant)))

    def commit_metadata(self, instant: Instant) -> "CommitMetadata":
        return CommitMetadata.from_json(self.read_json(instant))

    def log_inserts(self, since: str) -> set[tuple[str, str]] | None:
        """The (partition, file id) of the file groups whose log files took new keys in the
        completed deltacommits at or after `since` (requested or completed then), by their
        write stats: what Java's indexes that index log files, Flink and pipe's bucket index
        write. A log file's stat without `numInserts` counts as inserts. None when more than
        LOG_INSERT_INSTANTS such deltacommits are not yet known to this process (a completed
        instant's file never changes: each is read once), or when `since` is older than the
        active timeline (archived deltacommits' stats are not at hand)."""
        from concurrent.futures import ThreadPoolExecutor

        if self.instants and since < self.instants[0].time:  # logs of archived deltacommits: their stats are not at hand
            return None
        instants = [i for i in self.completed((DELTACOMMIT,)) if max(i.time, i.completed_at) >= since]
        at = {i: self.storage.full_path(self.path(i)) for i in instants}
        with _log_inserts_lock:
            known = {i: _log_inserts[at[i]] for i in instants if at[i] in _log_inserts}
        missing = [i for i in instants if i not in known]
        if len(missing) > LOG_INSERT_INSTANTS:
            return None

        def read(instant):
            out = set()
            for partition, stats in (self.read_json(instant).get("partitionToWriteStats") or {}).items():
                for raw in stats or ():
                    stat = WriteStat.from_json(raw)
                    if stat.path and stat.is_log and (raw.get("numInserts") is None or stat.num_inserts > 0):
                        out.add((stat.partition_path or partition or "", stat.file_id))
            return frozenset(out)

        if missing:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                read_now = dict(zip(missing, pool.map(read, missing)))
            with _log_inserts_lock:
                for i, found in read_now.items():
                    _log_inserts[at[i]] = found
                while len(_log_inserts) > _LOG_INSERTS_KEPT:
                    _log_inserts.popitem(last=False)
            known.update(read_now)
        return set().union(*known.values()) if known else set()


# Timeline.log_inserts: deltacommits read at most for one answer, and the answers kept per
# process (an instant file's full path -> the groups whose logs it gave new keys)
LOG_INSERT_INSTANTS = 64
_LOG_INSERTS_KEPT = 100_000
_log_inserts: "OrderedDict[str, frozenset[tuple[str, str]]]" = OrderedDict()
_log_inserts_lock = threading.Lock()


def layout_of(storage) -> int:
    """The timeline layout hoodie.properties declares (TableConfig.timeline_layout); 1 for no
    table yet."""
    from runtime.table.config import TableConfig, read_properties

    try:
        return TableConfig.from_properties_map(read_properties(storage)).timeline_layout
    except FileNotFoundError:
        return 1


# --- instant times ----------------------------------------------------------------------------

_clock_lock = threading.Lock()
# the last time issued, by table and zone (UTC, or the local zone's UTC offset): a UTC table's
# times must not push a LOCAL one's ahead, nor times issued before the process's zone changed, nor
# one table's another's (a table whose latest instant is ahead of the clock, a foreign writer's,
# would put every later table of the process ahead of the clock: a Java commit made after
# pipe's would sort before it)
_last_issued: dict[object, str] = {}


def format_time(t: dt.datetime) -> str:
    """`t` as an instant time, yyyyMMddHHmmssSSS (in `t`'s own zone)."""
    return t.strftime("%Y%m%d%H%M%S") + f"{t.microsecond // 1000:03d}"


def completion_of_mtime(mtime_ms: int, time: str, local: bool) -> str:
    """The completion time Java 1.x gives a completed instant file of timeline layout 1 (or a
    "legacy" one of layout 2): the file's modification time, in the timeline's time zone (the
    process's for LOCAL), never before the instant itself."""
    at = dt.datetime.fromtimestamp(mtime_ms / 1000, None if local else dt.timezone.utc)
    return max(format_time(at), time)


def epoch_ms_of(time: str, local: bool) -> int:
    """The epoch milliseconds of an instant or completion time of the timeline's time zone."""
    at = dt.datetime.strptime(time[:14], "%Y%m%d%H%M%S").replace(microsecond=int(time[14:17] or 0) * 1000)
    if not local:
        at = at.replace(tzinfo=dt.timezone.utc)
    return int(at.timestamp() * 1000)


def timeline_is_local(storage) -> bool:
    """Whether the table's instant times are the local time of the writing process: Hudi's
    hoodie.table.timeline.timezone is LOCAL, or absent (Hudi's default; pipe writes UTC into
    every table it creates), as Java's HoodieInstantTimeGenerator reads it."""
    from runtime.table.config import PROPERTIES, parse_properties

    try:
        text = storage.read_bytes(PROPERTIES).decode("latin-1")
    except FileNotFoundError:
        return False  # no table yet: pipe creates it with UTC
    return parse_properties(text).get(TIMEZONE_KEY, "LOCAL").strip().upper() != "UTC"


def new_instant_time(after: str | None = None, local: bool = False, utc_offset: dt.timedelta | None = None,
                     table: str | None = None) -> str:
    """Now (UTC, or the local time when `local`, as Hudi's LOCAL timeline time zone has it: of
    the zone `utc_offset` when given, else the process's) with ms precision, strictly greater
    than `after` and than any time issued by this process in that zone for `table` (its URI),
    even for back-to-back calls (the clock is nudged forward by 1 ms)."""
    with _clock_lock:
        if local and utc_offset is not None:
            now = dt.datetime.now(dt.timezone.utc) + utc_offset
            zone = utc_offset
        elif local:
            now = dt.datetime.now()
            zone = now.astimezone().utcoffset()
        else:
            now = dt.datetime.now(dt.timezone.utc)
            zone = "UTC"
        slot = (table, zone)
        floor = max(after or "", _last_issued.get(slot, ""))
        candidate = format_time(now)
        if floor and candidate <= floor:
            base = dt.datetime.strptime(floor[:14], "%Y%m%d%H%M%S")
            base += dt.timedelta(milliseconds=int(floor[14:17] or 0) + 1)
            candidate = format_time(base)
        _last_issued[slot] = candidate
        return candidate


# --- commit metadata --------------------------------------------------------------------------


@dataclass
class WriteStat:
    """One file written by a commit (Hudi's HoodieWriteStat)."""

    file_id: str
    path: str  # relative to the table base
    partition_path: str
    prev_commit: str  # "null" or the base instant of the slice it replaces
    num_writes: int
    num_inserts: int
    num_update_writes: int
    num_deletes: int
    file_size: int
    # merge-on-read log files (Hudi's HoodieDeltaWriteStat): the slice's base file name and
    # every log file of the slice, this one included (bare names)
    base_file: str | None = None
    log_files: tuple[str, ...] = ()
    log_version: int = 0
    # a CDC-enabled table's rewritten base file: its `.cdc` file (path under the table) -> size
    cdc_stats: dict[str, int] | None = None

    @property
    def is_log(self) -> bool:
        return not self.path.endswith((".parquet", ".hfile"))

    def to_json(self) -> dict[str, Any]:
        out = {
            "fileId": self.file_id,
            "path": self.path or None,  # (none in an inflight file's workload)
            "cdcStats": dict(self.cdc_stats) if self.cdc_stats else None,
            "prevCommit": self.prev_commit,
            "numWrites": self.num_writes,
            "numDeletes": self.num_deletes,
            "numUpdateWrites": self.num_update_writes,
            "numInserts": self.num_inserts,
            "totalWriteBytes": self.file_size,
            "totalWriteErrors": 0,
            "tempPath": None,
            "partitionPath": self.partition_path,
            "totalLogRecords": 0,
            "totalLogFilesCompacted": 0,
            "totalLogSizeCompacted": 0,
            "totalUpdatedRecordsCompacted": 0,
            "totalLogBlocks": 0,
            "totalCorruptLogBlock": 0,
            "totalRollbackBlocks": 0,
            "fileSizeInBytes": self.file_size,
            "minEventTime": None,
            "maxEventTime": None,
            "runtimeStats": None,
        }
        if self.is_log:
            out.update({"logVersion": self.log_version, "logOffset": 0, "baseFile": self.base_file or "",
                        "logFiles": list(self.log_files), "recordsStats": {"val": None}})
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "WriteStat":
        return cls(
            file_id=d.get("fileId", ""),
            path=d.get("path") or "",
            partition_path=d.get("partitionPath") or "",
            prev_commit=str(d.get("prevCommit") or "null"),
            num_writes=int(d.get("numWrites") or 0),
            num_inserts=int(d.get("numInserts") or 0),
            num_update_writes=int(d.get("numUpdateWrites") or 0),
            num_deletes=int(d.get("numDeletes") or 0),
            file_size=int(d.get("fileSizeInBytes") or d.get("totalWriteBytes") or 0),
            base_file=d.get("baseFile") or None,
            log_files=tuple(d.get("logFiles") or ()),
            log_version=int(d.get("logVersion") or 0),
            cdc_stats={str(k): int(v) for k, v in (d.get("cdcStats") or {}).items()} or None,
        )


@dataclass
class CommitMetadata:
    operation_type: str
    write_stats: list[WriteStat]
    extra: dict[str, str]
    replaced: dict[str, list[str]] | None = None  # partition -> file ids (replacecommit)
    compacted: bool = False  # a compaction's commit

    def to_json(self) -> dict[str, Any]:
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for s in self.write_stats:
            by_partition.setdefault(s.partition_path, []).append(s.to_json())
        out = {
            "partitionToWriteStats": by_partition,
            "compacted": self.compacted,
            "extraMetadata": dict(sorted(self.extra.items())),
            "operationType": self.operation_type,
        }
        if self.replaced is not None:
            out["partitionToReplaceFileIds"] = self.replaced
        return out

    def to_bytes(self, layout: int = 1) -> bytes:
        """JSON in timeline layout 1; in layout 2 an Avro object container of Hudi 1.x's
        HoodieCommitMetadata (HoodieReplaceCommitMetadata for a replacecommit)."""
        if layout >= 2:
            from runtime.table import avro

            record = self.to_json()
            record["version"] = 1
            schema = avro.COMMIT_METADATA if self.replaced is None else avro.REPLACE_COMMIT_METADATA
            return avro.to_bytes(schema, record)
        return json.dumps(self.to_json(), indent=2).encode("utf-8")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CommitMetadata":
        stats = [WriteStat.from_json(s) for lst in (d.get("partitionToWriteStats") or {}).values() for s in (lst or ())]
        return cls(
            operation_type=d.get("operationType") or "UNKNOWN",
            write_stats=stats,
            extra=dict(d.get("extraMetadata") or {}),
            replaced=d.get("partitionToReplaceFileIds"),
            compacted=bool(d.get("compacted")),
        )

    @property
    def schema(self) -> str | None:
        return self.extra.get("schema")

    def checkpoints(self) -> dict[str, str]:
        return {k[len(CHECKPOINT_PREFIX):]: v for k, v in self.extra.items() if k.startswith(CHECKPOINT_PREFIX)}


ARCHIVED = f"{HOODIE}/archived"


def archived_instants(storage, layout: int = 1) -> list[Instant]:
    """The instants archiving moved to .hoodie/archived/ (their files, under the same names), or
    in timeline layout 2 into the LSM history (lsm_timeline; HistoryError if unreadable)."""
    if layout >= 2:
        from runtime.table import lsm_timeline

        return lsm_timeline.archived_instants(storage)
    found = [parse_instant_file(f.path.rsplit("/", 1)[-1]) for f in storage.list_files(ARCHIVED, recursive=False)]
    return Timeline(storage, [i for i in found if i is not None]).instants


def archived_write_metadata(storage, layout: int = 1) -> list[tuple[Instant, dict[str, Any]]]:
    """The metadata (as Timeline.read_json gives it) of the archived completed writes whose
    metadata pipe can read, oldest first: in layout 1 the instant files pipe's archiving keeps
    in .hoodie/archived/ (Java's .commits_.archive.N logs are not read), in layout 2 the LSM
    history's rows (HistoryError if it is unreadable)."""
    if layout >= 2:
        from runtime.table import lsm_timeline

        found = lsm_timeline.archived_metadata(storage, WRITE_ACTIONS)
    else:
        found = []
        for inst in archived_instants(storage, layout):
            if inst.is_completed and inst.action in WRITE_ACTIONS:
                try:
                    found.append((inst, storage.read_bytes(f"{ARCHIVED}/{inst.file_name()}")))
                except FileNotFoundError:
                    continue
    out = []
    for inst, data in found:
        try:
            meta = decode_metadata(data)
        except Exception:  # noqa: BLE001 - another writer's file pipe cannot read: its groups go unchecked
            continue
        if isinstance(meta, dict):
            out.append((inst, meta))
    return out


def decode_metadata(data: bytes) -> dict[str, Any]:
    """An instant file's metadata as a dict: JSON in layout 1 (and Java's "legacy" completed
    files of layout 2), an Avro object container in layout 2."""
    if data[:4] == b"Obj\x01":
        from runtime.table import avro

        return avro.from_bytes(data) or {}
    return json.loads(data) if data.strip() else {}
