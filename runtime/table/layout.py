"""Where data lives: base file names, partition paths, file groups and file slices (a base
file and the log files named with its instant), and the file-system view that picks the latest
valid slice of every group as of an instant."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Iterable

from runtime.storage import Storage
from runtime.table.logfile import parse_name as parse_log_name
from runtime.table.timeline import COMPACTION, HOODIE, REPLACECOMMIT, REQUESTED, WRITE_ACTIONS, Instant, Timeline

PARTITION_METADATA = ".hoodie_partition_metadata"
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_BASE_FILE = re.compile(r"^(?P<file_id>[^_.][^_]*)_(?P<token>\d+-\d+-\d+)_(?P<instant>\d{14,17})\.parquet$")

# Characters Hudi's PartitionPathEncodeUtils escapes (besides control characters); '%' first,
# so that a chain of replacements never escapes an escape.
ESCAPED = '%"#\'*/:=?\\{[]^'
# Hudi also escapes the control characters; few values have any, so writers look for them first
CONTROL = "".join(chr(c) for c in range(0x20)) + "\x7f"
CONTROL_PATTERN = "[\\x00-\\x1f\\x7f]"  # a regular expression (Java's and RE2's) matching one


def ensure_partition_metadata(storage: Storage, partition: str, instant: str) -> None:
    """Writes `<partition>/.hoodie_partition_metadata` if the partition has none; a writer calls
    it before the first data file it puts in a partition."""
    import datetime as dt

    path = f"{partition}/{PARTITION_METADATA}" if partition else PARTITION_METADATA
    if storage.exists(path):
        return
    depth = 0 if not partition else partition.count("/") + 1
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y")
    storage.write_atomic(path, f"#partition metadata\n#{stamp}\ncommitTime={instant}\npartitionDepth={depth}\n".encode("utf-8"))


def new_file_id() -> str:
    while True:
        fid = f"{uuid.uuid4()}-0"
        if not _BUCKET_FILE_ID.match(fid):  # never one that reads as a bucket index's file id
            return fid


# A file id of Hudi's simple bucket index: a uuid whose first 8 characters are the bucket
# number, zero-padded (BucketIdentifier.newBucketFileIdPrefix); bucket numbers are small, so
# they start with zeros, which a random uuid's first group seldom does (about 1 in 40,000).
_BUCKET_FILE_ID = re.compile(r"^000\d{5}-")


def bucket_index_file_ids(file_ids: Iterable[str]) -> list[str]:
    """The file ids, when every one of them is a bucket index's (a table Java's BUCKET index
    writes); else []."""
    ids = list(file_ids)
    return ids if ids and all(_BUCKET_FILE_ID.match(f) for f in ids) else []


def base_file_name(file_id: str, write_token: str, instant: str) -> str:
    return f"{file_id}_{write_token}_{instant}.parquet"


@dataclass(frozen=True)
class BaseFile:
    partition: str
    name: str
    size: int

    @property
    def file_id(self) -> str:
        return _BASE_FILE.match(self.name).group("file_id")

    @property
    def instant(self) -> str:
        return _BASE_FILE.match(self.name).group("instant")

    @property
    def path(self) -> str:
        return f"{self.partition}/{self.name}" if self.partition else self.name


def parse_base_file(partition: str, name: str, size: int) -> BaseFile | None:
    return BaseFile(partition, name, size) if _BASE_FILE.match(name) else None


def encode_partition_value(value: object, url_encode: bool = True) -> str:
    """One partition value as Hudi writes it: nulls and empty strings become
    __HIVE_DEFAULT_PARTITION__; special characters are %XX-escaped when url_encode is on."""
    if value is None or value == "":
        return DEFAULT_PARTITION
    text = str(value)
    if not url_encode:
        return text
    return "".join(f"%{ord(c):02X}" if (c in ESCAPED or c in CONTROL) else c for c in text)


def unsafe_partition(partition: str) -> str | None:
    """Why `partition` (a relative partition path, made from a row's values) cannot be a folder
    of the table, or None. Its '/'-separated segments become folders, as in Hudi (a '/' in a
    value not URL-encoded nests folders); a segment that is empty, '.' or '..', or that starts
    with '.hoodie' (the timeline's folder), would write outside the table or into its metadata.
    Other names starting with '.' ('.net') are ordinary folders that Hudi's readers list."""
    if not partition:
        return None
    if partition.startswith("/"):
        return "it starts with '/' (an absolute path)"
    for segment in partition.split("/"):
        if segment in ("", ".", ".."):
            return f"it has the folder name {segment!r}" if segment else "it has an empty folder name ('//' or a '/' at an end)"
        if segment.lower().startswith(".hoodie"):
            return f"its folder {segment!r} starts with '.hoodie' (the table's metadata)"
    return None


def partition_path(values: dict[str, object], fields: Iterable[str], hive_style: bool, url_encode: bool = True) -> str:
    parts = []
    for f in fields:
        v = encode_partition_value(values.get(f), url_encode)
        parts.append(f"{f}={v}" if hive_style else v)
    return "/".join(parts)


@dataclass(frozen=True)
class LogFile:
    """A log file of a merge-on-read slice: `.<fileId>_<instant>.log.<version>_<token>`. In
    timeline layout 1 its name carries its slice's BASE instant (`base_instant`), and the
    deltacommits that wrote it are only in its blocks; in layout 2 (Hudi 1.x) the name carries
    the deltacommit that wrote it, and FileSystemView.log_slices says its slice."""

    partition: str
    name: str
    size: int

    @property
    def file_id(self) -> str:
        return parse_log_name(self.name).file_id

    @property
    def base_instant(self) -> str:
        return parse_log_name(self.name).base_instant

    @property
    def version(self) -> int:
        return parse_log_name(self.name).version

    @property
    def token(self) -> str:
        return parse_log_name(self.name).token

    @property
    def path(self) -> str:
        return f"{self.partition}/{self.name}" if self.partition else self.name


def parse_log_file(partition: str, name: str, size: int) -> LogFile | None:
    return LogFile(partition, name, size) if parse_log_name(name) is not None else None


@dataclass(frozen=True)
class CdcFile:
    """A `.cdc` log file of a CDC-enabled table (cdc_log.py): the changes its instant made to
    the base file of the same file id and instant, beside which it was written. Readers of the
    table's rows skip it; the cleaner deletes it with that base file."""

    partition: str
    name: str
    size: int
    file_id: str
    instant: str

    @property
    def path(self) -> str:
        return f"{self.partition}/{self.name}" if self.partition else self.name


def parse_cdc_file(partition: str, name: str, size: int) -> CdcFile | None:
    from runtime.table.cdc_log import parse_name

    parsed = parse_name(name)
    return CdcFile(partition, name, size, *parsed) if parsed else None


@dataclass(frozen=True)
class FileSlice:
    """A base file (None in a log-only group, which Java writers can make) and the log files
    named with its instant, in (version, token) order."""

    partition: str
    file_id: str
    base_file: BaseFile | None
    log_files: tuple[LogFile, ...] = ()
    # the pending compaction the group is under, if any: its logs named with that instant are
    # merged into this slice (as Java's getLatestMergedFileSlicesBeforeOrOn does), and new log
    # files of the group are named with it (Java's HoodieAppendHandle, table version 6)
    pending_compaction: str | None = None

    @property
    def base_instant(self) -> str:
        return self.base_file.instant if self.base_file is not None else self.log_files[0].base_instant

    @property
    def has_logs(self) -> bool:
        return bool(self.log_files)


@dataclass(frozen=True)
class InstantValidity:
    """Which instants' files and log blocks count (HUDI_FORMAT 3): completed write instants,
    and instants older than every instant on the active timeline (archived), unless pending.
    Small and picklable: it travels to the tasks that merge log files."""

    committed: frozenset[str]
    pending: frozenset[str] = frozenset()
    first_active: str | None = None
    compacting: frozenset[str] = frozenset()  # pending compactions: logs named with them count
    # instants the active timeline's completed rollbacks undid: never taken for archived. A task
    # of a failed write may finish after its rollback and leave a file named with that instant;
    # on a table whose timeline starts with the rollback, that instant is older than every
    # active one and would otherwise count as archived, its rows visible
    rolled_back: frozenset[str] = frozenset()

    @classmethod
    def of(cls, timeline: Timeline) -> "InstantValidity":
        return cls(frozenset(i.time for i in timeline.completed(WRITE_ACTIONS)), frozenset(i.time for i in timeline.pending()),
                   timeline.instants[0].time if timeline.instants else None, frozenset(timeline.pending_compactions()),
                   rolled_back_instants(timeline))

    def __call__(self, instant: str) -> bool:
        if instant in self.committed:
            return True
        return (instant not in self.pending and instant not in self.rolled_back and self.first_active is not None
                and instant < self.first_active)


# (storage root, rollback instant time) -> the instants it undid; a completed rollback never changes
_ROLLED_BACK: dict[tuple[str, str], tuple[str, ...]] = {}


def rolled_back_instants(timeline: Timeline) -> frozenset[str]:
    """The instants undone by the completed rollbacks on the active timeline, from their Avro
    metadata (`commitsRollback`); one another tool wrote in a form we cannot read undoes none."""
    from runtime.table import avro
    from runtime.table.timeline import ROLLBACK

    out: set[str] = set()
    root = timeline.storage.full_path("")
    for inst in timeline.completed((ROLLBACK,)):
        key = (root, inst.time)
        undone = _ROLLED_BACK.get(key)
        if undone is None:
            try:
                meta = avro.from_bytes(timeline.storage.read_bytes(timeline.path(inst)))
                undone = tuple(str(t) for t in (meta.get("commitsRollback") or ()))
            except Exception:  # noqa: BLE001 - an empty or foreign rollback file: nothing known undone
                undone = ()
            _ROLLED_BACK[key] = undone
        out.update(undone)
    return frozenset(out)


@dataclass
class FileSystemView:
    """Committed base files and the log files of valid slices of a table, grouped into file
    groups, as of a timeline."""

    timeline: Timeline
    files: list[BaseFile]
    replaced: dict[tuple[str, str], str] = field(default_factory=dict)  # (partition, file id) -> replacing instant
    logs: list[LogFile] = field(default_factory=list)
    compacting: frozenset[str] = frozenset()  # pending compaction instants
    # (partition, file id) -> the pending compaction whose plan names the group
    compacted_groups: dict[tuple[str, str], str] = field(default_factory=dict)
    # timeline layout 2: the base instant of the slice each log file belongs to (its name
    # carries the deltacommit that wrote it, not its slice's base instant: _slices_of_logs)
    log_slices: dict[LogFile, str] = field(default_factory=dict)
    cdc: list[CdcFile] = field(default_factory=list)  # committed `.cdc` files (CDC-enabled tables)

    @classmethod
    def load(cls, storage: Storage, timeline: Timeline, partitions: Iterable[str] | None = None) -> "FileSystemView":
        """Lists base and log files (all partitions, or only `partitions`). Keeps base files
        written by a valid instant (InstantValidity), and every log file whose base instant is
        valid or a pending compaction (Java names the logs it writes into a group under a
        pending compaction with the compaction's instant): which of its blocks count is decided
        by the reader from their headers. In timeline layout 2 a log file's name carries the
        deltacommit that wrote it: it is kept if that deltacommit is valid, and put in its slice
        by completion time (_slices_of_logs)."""
        valid = InstantValidity.of(timeline)
        files: list[BaseFile] = []
        logs: list[LogFile] = []
        cdc: list[CdcFile] = []
        prefixes = [""] if partitions is None else sorted(set(partitions))
        for prefix in prefixes:
            for info in storage.list_files(prefix, recursive=partitions is None or prefix != ""):
                folder, _, name = info.path.rpartition("/")
                if info.path.startswith(HOODIE + "/"):
                    continue
                if name.startswith("."):  # log files; .hoodie_partition_metadata and hidden temp files are skipped
                    log = parse_log_file(folder, name, info.size)
                    if log is not None and (valid(log.base_instant) or log.base_instant in valid.compacting):
                        logs.append(log)
                    elif log is None and name.endswith(".cdc"):
                        c = parse_cdc_file(folder, name, info.size)
                        if c is not None and valid(c.instant):
                            cdc.append(c)
                    continue
                bf = parse_base_file(folder, name, info.size)
                if bf is not None and valid(bf.instant):
                    files.append(bf)
        replaced: dict[tuple[str, str], str] = {}
        for inst in timeline.completed((REPLACECOMMIT,)):
            meta = timeline.read_json(inst)
            for part, ids in (meta.get("partitionToReplaceFileIds") or {}).items():
                for fid in ids:
                    replaced[(part, fid)] = inst.time
        compacted_groups = _pending_compaction_groups(storage, timeline)
        log_slices = {}
        if timeline.layout >= 2:
            logs = [lf for lf in logs if valid(lf.base_instant)]  # a pending deltacommit's log holds nothing to read
            log_slices = _slices_of_logs(storage, timeline, files, logs, compacted_groups)
        return cls(timeline, files, replaced, logs, frozenset(valid.compacting), compacted_groups, log_slices, cdc)

    def latest_slices(self, as_of: str | None = None) -> list[FileSlice]:
        """The latest slice of every file group as of `as_of` (inclusive), minus replaced
        groups. A slice's base instant is that of a base file, or, for a group whose logs
        name an instant no base file has (a log-only group), that of the logs. A slice opened
        by a pending compaction (logs only: its base file does not exist yet) is merged into
        the slice before it, whose base file and logs the compaction will fold."""
        bases: dict[tuple[str, str, str], BaseFile] = {(bf.partition, bf.file_id, bf.instant): bf for bf in self.files}
        logs: dict[tuple[str, str, str], list[LogFile]] = {}
        for lf in self.logs:
            logs.setdefault((lf.partition, lf.file_id, self.log_slices.get(lf, lf.base_instant)), []).append(lf)
        candidates: dict[tuple[str, str], list[str]] = {}
        for part, fid, instant in set(bases) | set(logs):
            if as_of is not None and instant > as_of:
                continue
            r = self.replaced.get((part, fid))
            if r is not None and (as_of is None or r <= as_of):
                continue
            candidates.setdefault((part, fid), []).append(instant)

        def ordered(p: str, fid: str, *slices: str) -> list[LogFile]:  # in layout 2, by the deltacommits that wrote them
            return sorted((lf for b in slices for lf in logs.get((p, fid, b), ())), key=lambda lf: (lf.base_instant, lf.version, lf.token))

        out = []
        for (p, fid), instants in sorted(candidates.items()):
            instants.sort()
            b = instants[-1]
            pending = self.compacted_groups.get((p, fid))
            if pending is not None and as_of is not None and pending > as_of:
                pending = None
            if b in self.compacting and len(instants) > 1:
                prev = instants[-2]
                out.append(FileSlice(p, fid, bases.get((p, fid, prev)), tuple(ordered(p, fid, prev, b)), b))
            else:
                out.append(FileSlice(p, fid, bases.get((p, fid, b)), tuple(ordered(p, fid, b)), b if b in self.compacting else pending))
        return out

    def slices_of(self, as_of: str | None = None) -> dict[tuple[str, str], FileSlice]:
        return {(s.partition, s.file_id): s for s in self.latest_slices(as_of)}


def _pending_compaction_groups(storage: Storage, timeline: Timeline) -> dict[tuple[str, str], str]:
    """The file groups each pending compaction's plan names (Java's view opens a new slice at
    the compaction's instant for them, which its writers name new logs with)."""
    from runtime.table import avro

    out: dict[tuple[str, str], str] = {}
    for t in timeline.pending_compactions():
        try:
            plan = avro.from_bytes(storage.read_bytes(timeline.path(Instant(t, COMPACTION, REQUESTED))))
        except Exception:  # noqa: BLE001 - missing or unreadable: executing it reports that; reads go on
            continue
        for op in plan.get("operations") or ():
            out[(op.get("partitionPath") or "", op.get("fileId") or "")] = t
    return out


def _slices_of_logs(storage: Storage, timeline: Timeline, files: list[BaseFile], logs: list[LogFile],
                    compacted_groups: dict[tuple[str, str], str]) -> dict[LogFile, str]:
    """Timeline layout 2 (docs/hudi-1x-format.md, 4): the slice each log file belongs to, as
    Java's HoodieFileGroup decides: the slice with the greatest base instant (a base file's, or
    a pending compaction's of the group) at or before the completion time of the deltacommit
    that wrote the log; the log's own instant when there is none (a log-only group). So a log
    whose deltacommit completed after a compaction was planned is in the compaction's slice,
    whenever that deltacommit started. The completion time of an archived deltacommit is in
    the LSM history, read only when a log needs it."""
    completion = {i.time: i.completed_at for i in timeline.instants if i.is_completed}
    first_active = timeline.instants[0].time if timeline.instants else None
    bases: dict[tuple[str, str], set[str]] = {}
    for bf in files:
        bases.setdefault((bf.partition, bf.file_id), set()).add(bf.instant)
    for group, t in compacted_groups.items():
        bases.setdefault(group, set()).add(t)
    archived: dict[str, str] | None = None
    out: dict[LogFile, str] = {}
    for lf in sorted(logs, key=lambda lf: (lf.base_instant, lf.version, lf.token)):
        t = lf.base_instant  # the deltacommit that wrote it
        done = completion.get(t)
        if done is None and first_active is not None and t < first_active:
            if archived is None:
                archived = _archived_completions(storage)
            done = archived.get(t, t)
        candidates = bases.setdefault((lf.partition, lf.file_id), set())
        if done is None:  # not completed: Java puts it in the latest slice (its blocks do not count)
            out[lf] = max(candidates, default=t)
        else:
            out[lf] = max((b for b in candidates if b <= done), default=t)
        candidates.add(out[lf])  # the first log of a log-only group opens its slice
    return out


def _archived_completions(storage: Storage) -> dict[str, str]:
    """Requested time -> completion time of the archived instants of timeline layout 2 (a
    HistoryError when the history cannot be read: the logs' slices would be guesses)."""
    from runtime.table.lsm_timeline import archived_instants

    return {i.time: i.completed_at for i in archived_instants(storage)}


def completed_write_instants(timeline: Timeline, since: str | None, until: str | None) -> list[Instant]:
    return [i for i in timeline.completed(WRITE_ACTIONS) if (since is None or i.time > since) and (until is None or i.time <= until)]


def writes_archived_after(timeline: Timeline, since: str | None) -> bool:
    """Whether some completed writes after `since` have left the active timeline (archived):
    their write stats are gone, so the file groups they touched cannot be named."""
    done = timeline.completed()
    return since is not None and bool(done) and since < done[0].time and timeline.instants[0].time > since
