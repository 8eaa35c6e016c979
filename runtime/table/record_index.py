"""The metadata table's record index (Hudi's `record_index` partition, its RECORD_INDEX index):
every record key of the data table mapped to the partition and file group that hold it, so
that a writer finds where a batch's keys are without reading the data table's files.

The format, as Hudi 0.15 (table version 6) and 1.1 (8, 9) write it (docs/hudi-1x-format.md 6):

- a fixed number of file groups `record-index-<NNNN>-0` (Java starts with 10); a key lives in
  group `abs(abs(h) % n)`, h being Java's String.hashCode of the key (31-polynomial over its
  UTF-16 code units, 32-bit), with n the number of groups listed;
- each group is a merge-on-read slice of the metadata table: an HFile base file (after a
  compaction; none right after the partition is built on an empty table) and log files with,
  per deltacommit, one HFILE block of upserts (HoodieMetadataRecord type 5, the cell's row the
  record key, `recordIndexMetadata` = HoodieRecordIndexInfo: the partition path, the file id as
  a UUID's two longs and the `-N` index, or as text (encoding 1), the instant in epoch
  milliseconds) and one DELETE block naming the keys that left the table (partition path
  `record_index`); later blocks win, a delete removes the key;
- log files are named as the files partition's are (metadata_table.py): one per deltacommit
  named with it on 8 and 9, the next version of the slice's log on 6.

Everything a record index holds is data (one entry a row), so it is read and written only in
Spark tasks; the driver sees file names, sizes and counts."""

from __future__ import annotations

import io
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

PARTITION = "record_index"
PREFIX = "record-index-"
RECORD_INDEX = 5  # HoodieMetadataRecord.type
_FILE_GROUP = re.compile(r"^record-index-(\d{4})-0$")
_UUID_FILE_ID = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?:-(\d{1,9}))?$")
_MISSING_INDEX = -1  # Java's RECORD_INDEX_MISSING_FILEINDEX_FALLBACK: a 36-character file id without -N
TOKEN = "0-0-0"  # the write token of every file pipe writes into the record index (as the metadata table's)


def file_group_id(i: int) -> str:
    return f"{PREFIX}{i:04d}-0"


def file_group_number(file_id: str) -> int | None:
    m = _FILE_GROUP.match(file_id)
    return int(m.group(1)) if m else None


def java_hashes(keys):
    """Java's String.hashCode of each key (a signed 32-bit int) over its UTF-16 code units, as
    a numpy int64 array: the Python reference (checks and tests; tasks ask the JVM, with_group).
    `keys`: a list of str or an Arrow string array."""
    import numpy as np

    if hasattr(keys, "to_pylist"):
        keys = keys.to_pylist()
    out = np.zeros(len(keys), dtype=np.int64)
    mask = (1 << 32) - 1
    for i, key in enumerate(keys):
        h = 0
        for unit in np.frombuffer(key.encode("utf-16-be"), dtype=">u2").tolist():
            h = (h * 31 + unit) & mask
        out[i] = h - (1 << 32) if h >= 1 << 31 else h
    return out


def file_groups_of(keys, n: int):
    """The record-index file group (0..n-1) of each key (Java's mapRecordKeyToFileGroupIndex:
    abs(abs(h) % n), where abs of Integer.MIN_VALUE stays negative)."""
    import numpy as np

    h = java_hashes(keys)
    a = np.where(h == -(1 << 31), h, np.abs(h))
    return np.abs(np.fmod(a, n)).astype(np.int64)


# --- records ---------------------------------------------------------------------------------

def _to_signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def location_info(partition: str, file_id: str, instant_ms: int, table_version: int) -> dict:
    """HoodieRecordIndexInfo of a key stored in `file_id` of `partition` since `instant_ms`, as
    Java encodes it: a UUID file id (`<uuid>-<N>` or a bare UUID) as two longs and N (0), any
    other as its text (1)."""
    m = _UUID_FILE_ID.match(file_id)
    if m:
        u = uuid.UUID(m.group(1)).int
        info = {"partitionName": partition, "fileIdHighBits": _to_signed(u >> 64), "fileIdLowBits": _to_signed(u & ((1 << 64) - 1)),
                "fileIndex": int(m.group(2)) if m.group(2) is not None else _MISSING_INDEX, "fileId": "",
                "instantTime": instant_ms, "fileIdEncoding": 0}
    else:
        info = {"partitionName": partition, "fileIdHighBits": -1, "fileIdLowBits": -1, "fileIndex": -1, "fileId": file_id,
                "instantTime": instant_ms, "fileIdEncoding": 1}
    if table_version >= 8:
        info["position"] = None
    return info


def location_of(info: dict) -> tuple[str, str]:
    """(partition path, file id) of a HoodieRecordIndexInfo (Java's getLocationFromRecordIndexInfo)."""
    if info.get("fileIdEncoding", 0) == 1:
        return info["partitionName"], info["fileId"]
    u = uuid.UUID(int=((info["fileIdHighBits"] & ((1 << 64) - 1)) << 64) | (info["fileIdLowBits"] & ((1 << 64) - 1)))
    index = info.get("fileIndex")
    return info["partitionName"], str(u) + ("" if index is None or index == _MISSING_INDEX else f"-{index}")


def _record(info: dict, table_version: int) -> dict:
    rec = {"key": "", "type": RECORD_INDEX, "filesystemMetadata": None, "recordIndexMetadata": info}
    for name in ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path",
                 "_hoodie_file_name", "BloomFilterMetadata", "ColumnStatsMetadata", "SecondaryIndexMetadata"):
        rec[name] = None
    if table_version < 8:
        rec.pop("SecondaryIndexMetadata")
    return rec


def _varint(n: int) -> bytes:
    """Avro's zig-zag variable-length long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _varint(len(data)) + data


# HoodieMetadataRecord's fields before recordIndexMetadata, for a record-index entry: the five
# meta fields null, key "" (readers take it from the cell), type 5, three null indexes; then
# the union's branch 1 (the record)
_HEAD = b"\x00" * 5 + b"\x00" + _varint(RECORD_INDEX) + b"\x00" * 3 + b"\x02"


@lru_cache(maxsize=4096)
def _located(partition: str, file_id: str) -> tuple[bytes, bytes]:
    """The bytes of an entry before and after its instant (a write has few places)."""
    m = _UUID_FILE_ID.match(file_id)
    if m:
        u = uuid.UUID(m.group(1)).int
        index = int(m.group(2)) if m.group(2) is not None else _MISSING_INDEX
        return (_HEAD + b"\x02" + _text(partition) + b"\x02" + _varint(_to_signed(u >> 64)) + b"\x02" + _varint(_to_signed(u & ((1 << 64) - 1)))
                + b"\x02" + _varint(index) + b"\x02\x00" + b"\x02", _varint(0))
    return (_HEAD + b"\x02" + _text(partition) + b"\x02" + _varint(-1) + b"\x02" + _varint(-1) + b"\x02" + _varint(-1)
            + b"\x02" + _text(file_id) + b"\x02", _varint(1))


def encode_entry(partition: str, file_id: str, instant_ms: int, table_version: int) -> bytes:
    """The Avro datum of a record-index entry in this table version's HoodieMetadataRecord,
    written directly (as fastavro would, tests/test_record_index.py checks; far faster, which
    building the index of a large table needs)."""
    head, encoding = _located(partition, file_id)
    # 1.x: `position` null, then SecondaryIndexMetadata null
    return head + _varint(instant_ms) + encoding + (b"\x00\x00" if table_version >= 8 else b"")


def upsert_cells(entries: list[tuple[str, str, str]], instant_ms: int, table_version: int) -> list[tuple[bytes, bytes]]:
    """The HFile cells of (key, partition, file id) entries, sorted by key bytes."""
    tail = _varint(instant_ms)
    end = b"\x00\x00" if table_version >= 8 else b""
    cells = []
    for key, partition, file_id in entries:
        head, encoding = _located(partition, file_id)
        cells.append((key.encode("utf-8"), head + tail + encoding + end))
    cells.sort(key=lambda c: c[0])
    return cells


def info_cells(infos: dict[str, dict | bytes], table_version: int) -> list[tuple[bytes, bytes]]:
    """The HFile cells of key -> HoodieRecordIndexInfo (of any version's schema: `position`
    is added or dropped as this version has it; or an entry's datum, kept), sorted by key bytes."""
    import fastavro

    from runtime.table.metadata_table import record_schema

    _, parsed = record_schema(table_version)
    cells = []
    for key in sorted(infos, key=lambda k: k.encode("utf-8")):
        if isinstance(infos[key], bytes):
            cells.append((key.encode("utf-8"), infos[key]))
            continue
        info = dict(infos[key])
        if table_version >= 8:
            info.setdefault("position", None)
        else:
            info.pop("position", None)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, _record(info, table_version))
        cells.append((key.encode("utf-8"), buf.getvalue()))
    return cells


# --- a file group's slice, as the driver names it to a task ------------------------------------

@dataclass(frozen=True)
class Validity:
    """Which instants' blocks of the metadata table a reader takes (metadata_table._valid, as
    data a task can be given)."""

    done: frozenset[str]  # completed instants of the metadata table
    first: str | None  # its first active instant (earlier ones are archived: completed)
    data_done: frozenset[str] = frozenset()
    data_first: str | None = None
    data_pending: frozenset[str] = frozenset()
    compactions: frozenset[str] = frozenset()

    def committed(self, t: str) -> bool:
        return t in self.done or t.startswith("00000000000000") or (self.first is not None and t < self.first)

    def __call__(self, t: str) -> bool:
        if t.startswith("00000000000000"):
            return True
        if not self.committed(t):
            return False
        if len(t) > 17:
            return True
        return (t in self.data_done or t not in self.data_pending and (self.data_first is None or t < self.data_first)
                or t in self.compactions)


@dataclass(frozen=True)
class Slice:
    """One record-index file group's latest slice: its base file and log files (relative to the
    metadata table), in the order a reader applies them."""

    number: int
    base: str | None
    logs: tuple[str, ...]
    base_instant: str | None  # the slice's base instant (on 6, new log versions are named with it)
    next_version: int  # on 6: the version of the slice's next log file
    base_size: int | None = None  # the base file's bytes, as listed (a lookup reads it in ranges)


@dataclass(frozen=True)
class IndexSpec:
    """What a task needs to read or write the record index, picklable."""

    storage_uri: str  # the metadata table's
    storage_options: tuple
    table_version: int
    slices: tuple[Slice, ...]
    validity: Validity
    instant: str = ""
    instant_ms: int = 0
    schema_text: str = ""

    @property
    def groups(self) -> int:
        return len(self.slices)


def _storage(spec: IndexSpec):
    from runtime.storage import StorageSpec, open_storage

    return open_storage(StorageSpec(spec.storage_uri, spec.storage_options))


def read_slice(storage, s: Slice, validity: Validity, keys: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """key -> (partition, file id) of the live keys a slice holds (only `keys`, when given)."""
    places: dict[int, tuple[str, str]] = {}  # entries of a place and instant share one info (read_infos)
    out = {}
    for k, info in read_infos(storage, s, validity, keys).items():
        place = places.get(id(info))
        if place is None:
            place = places[id(info)] = location_of(info)
        out[k] = place
    return out


def read_infos(storage, s: Slice, validity: Validity, keys: list[str] | None = None, raw_schema: bytes | None = None) -> dict[str, dict | bytes]:
    """key -> HoodieRecordIndexInfo of the live keys a slice holds (only `keys`, when given).
    With `raw_schema` (a HoodieMetadataRecord schema's text), an entry of an HFile written
    with that very schema stays its Avro datum (bytes): compaction copies it as it is."""
    import json

    import fastavro

    from runtime.table import hfile, logfile

    rows = sorted(k.encode("utf-8") for k in keys) if keys is not None else None
    wanted = set(keys) if keys is not None else None
    out: dict[str, dict] = {}
    parsed_cache: dict[bytes, object] = {}
    decoded_cache: dict[bytes, dict[bytes, dict | None]] = {}

    def apply(h) -> None:
        text = h.file_info.get("schema")
        if raw_schema is not None and text == raw_schema:
            for row, value in h.cells:  # the entry's type and its union branch sit at fixed places in this schema
                if len(value) > len(_HEAD) and value[:len(_HEAD)] == _HEAD:
                    out[row.decode("utf-8")] = value
            return
        if text not in parsed_cache:
            parsed_cache[text] = fastavro.parse_schema(json.loads(text))
        parsed = parsed_cache[text]
        # an entry's datum depends on its place and instant only: a slice has few distinct
        # ones, each decoded once (the decoded infos are shared, never changed)
        decoded = decoded_cache.setdefault(text, {})
        for row, value in h.cells:
            if not value:
                continue
            info = decoded.get(value, decoded)
            if info is decoded:
                rec = fastavro.schemaless_reader(io.BytesIO(value), parsed)
                info = decoded[value] = rec.get("recordIndexMetadata") if rec.get("type") == RECORD_INDEX else None
            if info:
                out[row.decode("utf-8")] = info

    if s.base is not None and rows is not None and s.base_size:
        # a lookup reads the index and the blocks its keys may be in, not the whole file
        apply(hfile.read_stored(lambda start, end: storage.read_range(s.base, start, end), s.base_size, rows))
    elif s.base is not None:
        apply(hfile.read(storage.read_bytes(s.base), rows))
    from runtime.table.metadata_table import applied_blocks

    for block in applied_blocks(storage, s.logs, validity):
        if block.type == logfile.HFILE:
            h = hfile.read(block.content, rows)
            if not h.file_info.get("schema"):
                h.file_info["schema"] = block.header.get(logfile.SCHEMA, "").encode("utf-8")
            apply(h)
        elif block.type == logfile.DELETE:
            for d in logfile.delete_records(block):
                if wanted is None or d.record_key in wanted:
                    out.pop(d.record_key, None)
    return out


# --- tasks -------------------------------------------------------------------------------------

LOOKUP_SCHEMA = "_pipe_part string, _pipe_file string"
PLACED_SCHEMA = "_pipe_part string, _pipe_file string, _moves long"
DELTA_STATS_SCHEMA = "number int, path string, size long, upserts long, deletes long"


def _by_group(batches: Iterator, names: tuple[str, ...], column: str = "_pipe_ri_group") -> Iterator[tuple[int, dict[str, list]]]:
    """(group number, {name: values}) of the `names` columns, from batches sorted by the
    group column (a group's rows may span batches)."""
    import numpy as np

    current, cols = None, {n: [] for n in names}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        groups = batch.column(batch.schema.get_field_index(column)).to_numpy(zero_copy_only=False)
        values = {n: batch.column(batch.schema.get_field_index(n)).to_pylist() for n in names}
        starts = [0, *(np.nonzero(groups[1:] != groups[:-1])[0] + 1).tolist(), len(groups)]
        for lo, hi in zip(starts, starts[1:]):
            g = int(groups[lo])
            if g != current and current is not None and cols[names[0]]:
                yield current, cols
                cols = {n: [] for n in names}
            current = g
            for n in names:
                cols[n].extend(values[n][lo:hi])
    if current is not None and cols[names[0]]:
        yield current, cols


def lookup_task(spec: IndexSpec, batches: Iterator) -> Iterator:
    """mapInArrow: the batch's keys (`_pipe_ri_group`, `_k`), sorted by group; out, the distinct
    (partition, file id) that hold any of them."""
    import pyarrow as pa

    storage = _storage(spec)
    found: set[tuple[str, str]] = set()
    for number, cols in _by_group(batches, ("_k",)):
        found.update(read_slice(storage, spec.slices[number], spec.validity, sorted(set(cols["_k"]))).values())
    if found:
        parts, files = zip(*sorted(found))
        yield pa.RecordBatch.from_pydict({"_pipe_part": list(parts), "_pipe_file": list(files)})


def placed_task(spec: IndexSpec, batches: Iterator) -> Iterator:
    """mapInArrow: the batch's keys and the partitions they come in (`_pipe_ri_group`, `_k`,
    `_p`), sorted by group and key; out, the distinct (partition, file id) holding any of
    them, and one row without a place counting the keys that cannot be settled in their own
    partition: stored in another, or coming in two partitions of the batch."""
    import pyarrow as pa

    storage = _storage(spec)
    found: set[tuple[str, str]] = set()
    moves = 0
    for number, cols in _by_group(batches, ("_k", "_p")):
        places = read_slice(storage, spec.slices[number], spec.validity, sorted(set(cols["_k"])))
        found.update(places.values())
        first: dict[str, str] = {}
        for k, p in zip(cols["_k"], cols["_p"]):
            if first.setdefault(k, p) != p:
                moves += 1  # a key in two partitions of the batch: the later row moves it
            at = places.get(k)
            if at is not None and at[0] != p:
                moves += 1
    rows = sorted(found)
    yield pa.RecordBatch.from_pydict({"_pipe_part": [p for p, _ in rows] + [None], "_pipe_file": [f for _, f in rows] + [None],
                                      "_moves": pa.array([0] * len(rows) + [moves], pa.int64())})


def delta_task(spec: IndexSpec, batches: Iterator) -> Iterator:
    """mapInArrow: the write's index changes (`_pipe_ri_group`, `_k`, `_pipe_part`, `_pipe_file`
    (null: the key left the table)), sorted by group; each group gets a new log file with an
    HFILE block of its upserts and a DELETE block of its deletes. Out: one stats row a group."""
    import pyarrow as pa

    from runtime.table import hfile, logfile

    storage = _storage(spec)
    token = TOKEN  # a retried task writes the same file again, never a second one
    stats = []
    for number, cols in _by_group(batches, ("_k", "_pipe_part", "_pipe_file")):
        s = spec.slices[number]
        rows = list(zip(cols["_k"], cols["_pipe_part"], cols["_pipe_file"]))
        places = {k: (p, f) for k, p, f in rows if f is not None}  # one place a key
        upserts = [(k, p, f) for k, (p, f) in places.items()]
        deletes = sorted({k for k, _, f in rows if f is None} - set(places))
        blocks = []
        if upserts:
            cells = upsert_cells(upserts, spec.instant_ms, spec.table_version)
            blocks.append(logfile.Block(logfile.HFILE, {logfile.INSTANT_TIME: spec.instant, logfile.SCHEMA: spec.schema_text},
                                        hfile.write(cells, {"schema": spec.schema_text.encode("utf-8")})))
        if deletes:
            blocks.append(logfile.delete_block(spec.instant, [(k, PARTITION, None) for k in deletes], spec.schema_text))
        if not blocks:
            continue
        fid = file_group_id(number)
        if spec.table_version >= 8:
            name = logfile.LogFileName(fid, spec.instant, 1, token)
        else:
            name = logfile.LogFileName(fid, s.base_instant, s.next_version, token)
        data = b"".join(logfile.encode_block(b) for b in blocks)
        path = f"{PARTITION}/{name.name}"
        storage.write_atomic(path, data)
        stats.append({"number": number, "path": path, "size": len(data), "upserts": len(upserts), "deletes": len(deletes)})
    if stats:
        yield pa.RecordBatch.from_pylist(stats, schema=pa.schema([("number", pa.int32()), ("path", pa.string()), ("size", pa.int64()),
                                                                   ("upserts", pa.int64()), ("deletes", pa.int64())]))


BASE_STATS_SCHEMA = "number int, path string, size long, records long"
EMPTY_DELETE_BLOCK = b"\x00\x00\x00\x03\x00\x00\x00\x01\x00"  # version 3, an empty record list: Java's init log


def _write_base(storage, spec: IndexSpec, number: int, cells: list[tuple[bytes, bytes]]) -> dict:
    """Writes group `number`'s base file of `cells` at `spec.instant` (the same name on a
    retried task); returns its stats row."""
    from runtime.table.metadata_table import base_hfile

    data = base_hfile(cells, spec.schema_text)
    path = f"{PARTITION}/{file_group_id(number)}_{TOKEN}_{spec.instant}.hfile"
    storage.write_atomic(path, data)
    return {"number": number, "path": path, "size": len(data), "records": len(cells)}


def _base_stats(stats: list[dict]) -> Iterator:
    import pyarrow as pa

    if stats:
        yield pa.RecordBatch.from_pylist(stats, schema=pa.schema([("number", pa.int32()), ("path", pa.string()), ("size", pa.int64()),
                                                                   ("records", pa.int64())]))


def compact_task(spec: IndexSpec, batches: Iterator) -> Iterator:
    """mapInArrow: file group numbers (`number`) in; each group's slice is merged into a new
    HFile base file named with `spec.instant`. Out: one stats row a group."""
    storage = _storage(spec)
    stats = []
    for batch in batches:
        for number in batch.column(0).to_pylist():
            infos = read_infos(storage, spec.slices[number], spec.validity, raw_schema=spec.schema_text.encode("utf-8"))
            stats.append(_write_base(storage, spec, number, info_cells(infos, spec.table_version)))
    yield from _base_stats(stats)


def build_task(spec: IndexSpec, batches: Iterator) -> Iterator:
    """mapInArrow: every key of the table (`_pipe_ri_group`, `_k`, `_pipe_part`, `_pipe_file`),
    sorted by group; each group's base file at `spec.instant` (the index's init instant).
    Out: one stats row a group."""
    storage = _storage(spec)
    stats = [_write_base(storage, spec, number, upsert_cells(list(zip(cols["_k"], cols["_pipe_part"], cols["_pipe_file"])),
                                                             spec.instant_ms, spec.table_version))
             for number, cols in _by_group(batches, ("_k", "_pipe_part", "_pipe_file"))]
    yield from _base_stats(stats)


def groups_for(keys: int) -> int:
    """How many file groups a record index of `keys` keys starts with: Java's minimum of 10,
    and one per million keys above that (a group's base file stays near 40 MB, which a lookup
    reads the index blocks of), at most Java's 10,000."""
    return max(10, min(10_000, -(-keys // 1_000_000)))


def build(spark, spec: IndexSpec, located) -> list:
    """Writes a new record index's file groups (spec.slices: as many as it will have) at its
    init instant `spec.instant` from `located` (every key of the table as `_k`, `_pipe_part`,
    `_pipe_file`): a base file for each group holding keys, and for every group the empty log
    Java's initialisation leaves (so that every group is listed). Returns the WriteStats."""
    from runtime.table import logfile
    from runtime.table.timeline import WriteStat

    def run(batches):
        return build_task(spec, batches)

    rows = _grouped(spark, spec, located.select("_k", "_pipe_part", "_pipe_file")).mapInArrow(run, BASE_STATS_SCHEMA).collect()
    storage = _storage(spec)
    stats = [WriteStat(file_group_id(n), path, PARTITION, "null", records, records, 0, 0, size) for n, path, size, records in sorted(rows)]
    empty = logfile.encode_block(logfile.Block(logfile.DELETE, {logfile.INSTANT_TIME: spec.instant}, EMPTY_DELETE_BLOCK))
    for s in spec.slices:
        name = logfile.LogFileName(file_group_id(s.number), spec.instant, 1, TOKEN).name
        storage.write_atomic(f"{PARTITION}/{name}", empty)
        stats.append(WriteStat(file_group_id(s.number), f"{PARTITION}/{name}", PARTITION, spec.instant, 0, 0, 0, 0, len(empty),
                               log_files=(name,), log_version=1))
    return stats


def with_group(spark, df, key: str, groups: int):
    """`df` with `_pipe_ri_group`, its key's record-index file group (file_groups_of), computed
    by the JVM in the executors: no Python stage."""
    from pyspark.sql import functions as F

    from runtime.table.bucket_index import java_string_hash

    # Java's abs(abs(h) % n) in 64 bits: abs of Integer.MIN_VALUE, negative in Java, gives the
    # same remainder's absolute value
    return df.withColumn("_pipe_ri_group", F.abs(F.abs(java_string_hash(F, F.col(key))) % F.lit(groups)).cast("int"))


# --- the driver's side -----------------------------------------------------------------------

def _tasks(spark, spec: IndexSpec) -> int:
    from runtime.spark import api as spark_api

    return max(1, min(spec.groups, spark_api.default_parallelism(spark) * 2))


def _grouped(spark, spec: IndexSpec, df, one_task: bool = False):
    """`df`'s rows by record-index file group, sorted by group and key within each task: a
    shuffle by group; or, `one_task` (a small batch), all in one task with no shuffle (a Spark
    job fewer; the task reads each group's blocks once)."""
    df = with_group(spark, df, "_k", spec.groups)
    df = df.coalesce(1) if one_task else df.repartition(_tasks(spark, spec), "_pipe_ri_group")
    return df.sortWithinPartitions("_pipe_ri_group", "_k")


def lookup(spark, spec: IndexSpec, keys, one_task: bool = False) -> set[tuple[str, str]]:
    """The (partition, file id) of the stored file groups holding any of `keys` (a DataFrame
    with the record keys as `_k`): one Spark job, each task reading the slices of the index's
    file groups its keys hash to, only the HFile blocks that may hold them (`one_task`: a
    small batch, all in one task, _grouped)."""
    def run(batches):
        return lookup_task(spec, batches)

    # each task yields its distinct places: at most tasks x file groups rows, made a set here
    # (no shuffle stage for a distinct)
    found = _grouped(spark, spec, keys.select("_k").where("_k is not null"), one_task).mapInArrow(run, LOOKUP_SCHEMA).collect()
    return {(r[0], r[1]) for r in found}


def placed(spark, spec: IndexSpec, probe, one_task: bool = False) -> tuple[set[tuple[str, str]], int]:
    """lookup's answer for `probe` (the batch's keys `_k` and the partitions `_p` they come in),
    and how many keys cannot be settled in their own partition (stored in another, or in
    two partitions of the batch): when none, the write may be decided partition by partition
    (writer._upsert_by_partition), each partition reading only the groups found. One Spark
    job (`one_task`: a small batch, all in one task, _grouped)."""
    def run(batches):
        return placed_task(spec, batches)

    found = _grouped(spark, spec, probe.select("_k", "_p").where("_k is not null"), one_task).mapInArrow(run, PLACED_SCHEMA).collect()
    return {(r[0], r[1]) for r in found if r[1] is not None}, sum(r[2] for r in found)


class _NoChanges:
    def __repr__(self) -> str:
        return "NO_CHANGES"


# A write's index changes when it knows it has none (partition tasks that only updated keys
# in place): write_delta runs no Spark job for it.
NO_CHANGES = _NoChanges()


def write_delta(spark, spec: IndexSpec, changes) -> list:
    """Writes `spec.instant`'s changes to the record index (`changes`: `_k`, `_pipe_part`,
    `_pipe_file`, the latter null for a key that left the table; an upsert of a key wins over
    its delete; or NO_CHANGES) as one new log file per file group they touch; returns their
    WriteStats, for the metadata table's deltacommit."""
    from runtime.table.timeline import WriteStat

    if changes is NO_CHANGES:
        return []
    def run(batches):
        return delta_task(spec, batches)

    rows = _grouped(spark, spec, changes.select("_k", "_pipe_part", "_pipe_file")).mapInArrow(run, DELTA_STATS_SCHEMA).collect()
    stats = []
    for number, path, size, upserts, deletes in sorted(rows):
        s = spec.slices[number]
        name = path.rsplit("/", 1)[-1]
        if spec.table_version >= 8:
            prev, base_file, logs = spec.instant, None, (name,)
        else:
            prev = s.base_instant or "null"
            base_file = s.base.rsplit("/", 1)[-1] if s.base else None
            logs = tuple(sorted({p.rsplit("/", 1)[-1] for p in s.logs} | {name}))
        stats.append(WriteStat(file_group_id(number), path, PARTITION, prev, upserts + deletes, 0, upserts, deletes, size,
                               base_file=base_file, log_files=logs, log_version=s.next_version if spec.table_version < 8 else 1))
    return stats


def read_all(spec: IndexSpec) -> dict[str, tuple[str, str]]:
    """Every key the record index holds with its location (on the driver: for tests and small tables)."""
    storage = _storage(spec)
    out: dict[str, tuple[str, str]] = {}
    for s in spec.slices:
        out.update(read_slice(storage, s, spec.validity))
    return out


def compaction_operations(spec: IndexSpec) -> list[dict]:
    """The operations of a metadata-table compaction plan for the record index's file groups
    with log files (HoodieCompactionOperation)."""
    return [{"baseInstantTime": s.base_instant or "", "deltaFilePaths": [p.rsplit("/", 1)[-1] for p in s.logs],
             "dataFilePath": s.base.rsplit("/", 1)[-1] if s.base else None, "fileId": file_group_id(s.number), "partitionPath": PARTITION,
             "metrics": {}, "bootstrapFilePath": None} for s in spec.slices if s.logs]


def compact(spark, spec: IndexSpec) -> list:
    """Compacts every file group of the record index with log files into a new base file at
    `spec.instant`, a few groups a Spark task; returns their WriteStats."""
    from runtime.table.timeline import WriteStat

    todo = [s.number for s in spec.slices if s.logs]
    if not todo:
        return []

    def run(batches):
        return compact_task(spec, batches)

    numbers = spark.createDataFrame([(n,) for n in todo], "number int").repartition(_tasks(spark, spec))
    return [WriteStat(file_group_id(number), path, PARTITION, spec.slices[number].base_instant or "null", records, 0, records, 0, size)
            for number, path, size, records in sorted(numbers.mapInArrow(run, BASE_STATS_SCHEMA).collect())]
