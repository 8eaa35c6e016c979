"""The archived timeline of timeline layout 2 (table versions 8 and 9): Hudi 1.x's LSM tree of
Parquet files under `.hoodie/timeline/history/`, one row per archived instant (its requested
time, completion time, action and metadata), listed by the latest manifest
(docs/hudi-1x-format.md, 3). pipe reads it, and archives into it (`append`) as Java 1.x's
archiver does: a level-0 file per archiving, then a new manifest naming it, then `_version_`.

    _version_            the latest manifest's number N (text)
    manifest_N           {"files": [{"fileName": "<min>_<max>_<level>.parquet", "fileLen": n}, ...]}
    <min>_<max>_<level>.parquet

Another writer's files are untrusted: a manifest names only files of the history folder, by
the pattern above, or the history is reported unreadable (HistoryError)."""

from __future__ import annotations

import io
import json
import re

from runtime.table.errors import TableError
from runtime.table.timeline import COMPLETED, TIMELINE_V2, Instant

HISTORY = f"{TIMELINE_V2}/history"
VERSION_FILE = f"{HISTORY}/_version_"
_MANIFEST = re.compile(r"^manifest_(\d+)$")
_DATA_FILE = re.compile(r"^(\d{14,17})_(\d{14,17})_(\d)\.parquet$")
_COLUMNS = ["instantTime", "completionTime", "action"]
_TIME = re.compile(r"^\d{14,17}$")
_ACTION = re.compile(r"^[a-z]{1,32}$")
# (table root, manifest number) -> its instants: a manifest never changes once written
_READ: dict[tuple[str, int], tuple[Instant, ...]] = {}


class HistoryError(TableError):
    """The archived timeline exists but cannot be read as Hudi 1.x writes it."""


def _latest_manifest(storage) -> int | None:
    """N of the manifest to read: `_version_`, or the highest manifest_N when it is missing or
    unreadable (Java's reader does the same); None when nothing was archived."""
    try:
        text = storage.read_bytes(VERSION_FILE).decode("ascii").strip()
        if text.isdigit():
            return int(text)
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    found = [int(m[1]) for f in storage.list_files(HISTORY, recursive=False)
             if (m := _MANIFEST.match(f.path.rsplit("/", 1)[-1]))]
    return max(found, default=None)


def data_files(storage, n: int | None = None) -> list[str]:
    """Paths (under the table's root) of the Parquet files the latest manifest (or manifest_`n`) lists."""
    n = _latest_manifest(storage) if n is None else n
    if n is None:
        return []
    where = f"{HISTORY}/manifest_{n}"
    try:
        doc = json.loads(storage.read_bytes(where))
        names = [entry["fileName"] for entry in doc["files"]]
    except FileNotFoundError:
        raise HistoryError(f"{where} is missing, though {VERSION_FILE} names it") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise HistoryError(f"{where} is not a manifest of Hudi 1.x's archived timeline ({type(exc).__name__}: {exc})") from None
    bad = [name for name in names if not isinstance(name, str) or not _DATA_FILE.match(name)]
    if bad:
        raise HistoryError(f"{where} names {bad[0]!r}, which is not a file of the archived timeline (<min>_<max>_<level>.parquet)")
    return [f"{HISTORY}/{name}" for name in names]


def archived_instants(storage) -> list[Instant]:
    """The archived instants, oldest first, each completed with its completion time (read once
    per manifest)."""
    n = _latest_manifest(storage)
    if n is None:
        return []
    key = (storage.full_path(""), n)
    if key not in _READ:
        _READ[key] = tuple(_read(storage, n))
    return list(_READ[key])


def _read(storage, n: int) -> list[Instant]:
    import pyarrow.parquet as pq

    out: list[Instant] = []
    for path in data_files(storage, n):
        try:
            rows = pq.read_table(io.BytesIO(storage.read_bytes(path)), columns=_COLUMNS).to_pylist()
        except FileNotFoundError:
            raise HistoryError(f"{path} is missing, though the archived timeline's manifest lists it") from None
        except Exception as exc:  # noqa: BLE001 - another writer's file: say which, not a traceback
            raise HistoryError(f"{path} is not a Parquet file of Hudi 1.x's archived timeline ({type(exc).__name__}: {exc})") from None
        for r in rows:
            time, done, action = r["instantTime"], r["completionTime"], r["action"]
            if not (isinstance(time, str) and _TIME.match(time) and isinstance(action, str) and _ACTION.match(action)
                    and (done is None or (isinstance(done, str) and _TIME.match(done)))):
                raise HistoryError(f"{path} holds a row that is not an archived instant "
                                   f"(instantTime {str(time)[:40]!r}, completionTime {str(done)[:40]!r}, action {str(action)[:40]!r})")
            out.append(Instant(time, action, COMPLETED, done))
    return sorted(out)


def archived_rows(storage) -> list[dict]:
    """Every archived instant's row (instantTime, completionTime, action, metadata, plan: the
    last two bytes or None), oldest first. Read anew each call."""
    import pyarrow.parquet as pq

    known = {(i.time, i.action) for i in archived_instants(storage)}  # validated rows
    out: list[dict] = []
    for path in data_files(storage):
        try:
            rows = pq.read_table(io.BytesIO(storage.read_bytes(path)), columns=["instantTime", "completionTime", "action", "metadata", "plan"]).to_pylist()
        except Exception as exc:  # noqa: BLE001 - another writer's file: say which, not a traceback
            raise HistoryError(f"{path} is not a Parquet file of Hudi 1.x's archived timeline ({type(exc).__name__}: {exc})") from None
        out += [r for r in rows if (r["instantTime"], r["action"]) in known]
    return sorted(out, key=lambda r: (r["instantTime"], r["action"]))


def archived_metadata(storage, actions) -> list[tuple[Instant, bytes]]:
    """The archived instants of `actions`, oldest first, with their completed files' bytes (the
    `metadata` column; rows without it are left out). Read anew each call: only time travel
    that must prove its files are still there asks for it."""
    wanted = {i.time: i for i in archived_instants(storage) if i.action in actions}
    return sorted(((wanted[r["instantTime"]], r["metadata"]) for r in archived_rows(storage)
                   if r["instantTime"] in wanted and r["action"] == wanted[r["instantTime"]].action and isinstance(r["metadata"], bytes)),
                  key=lambda x: x[0])


# Hudi 1.x's org.apache.hudi.avro.model.HoodieLSMTimelineInstant: the row of an archived instant
LSM_INSTANT = {
    "type": "record", "name": "HoodieLSMTimelineInstant", "namespace": "org.apache.hudi.avro.model",
    "fields": [{"name": n, "type": ["null", t], "default": None}
               for n, t in (("instantTime", "string"), ("completionTime", "string"), ("action", "string"), ("metadata", "bytes"),
                            ("plan", "bytes"))] + [{"name": "version", "type": "int", "default": 1}],
}


def append(storage, rows: list[dict]) -> str:
    """Archives `rows` (instantTime, completionTime, action, metadata, plan: the instant's
    completed file and plan, as bytes) as Java 1.x's LSMTimelineWriter does: one level-0
    Parquet file `<min>_<max>_0.parquet` (written with the Avro schema Java reads it with),
    then `manifest_<N+1>`, the latest manifest's files and this one, then `_version_` = N+1.
    A crash before the manifest leaves a file no manifest names, which readers ignore and the
    next archiving of the same range overwrites; one before `_version_` leaves a manifest that
    readers without a readable `_version_` take, with the same instants. Returns the file's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sorted(rows, key=lambda r: r["instantTime"])
    name = f"{rows[0]['instantTime']}_{rows[-1]['instantTime']}_0.parquet"
    schema = pa.schema([pa.field(n, t) for n, t in (("instantTime", pa.string()), ("completionTime", pa.string()),
                                                     ("action", pa.string()), ("metadata", pa.binary()), ("plan", pa.binary()))]
                       + [pa.field("version", pa.int32(), nullable=False)],
                       metadata={"parquet.avro.schema": json.dumps(LSM_INSTANT)})
    table = pa.Table.from_pylist([{**r, "version": 1} for r in rows], schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    storage.write_atomic(f"{HISTORY}/{name}", data)
    n = _latest_manifest(storage)
    files = []
    if n is not None:
        sizes = {f.path: f.size for f in storage.list_files(HISTORY, recursive=False)}
        files = [{"fileName": p.rsplit("/", 1)[-1], "fileLen": sizes.get(p, 0)} for p in data_files(storage, n)]
    files = [f for f in files if f["fileName"] != name] + [{"fileName": name, "fileLen": len(data)}]
    new = (n or 0) + 1
    storage.write_atomic(f"{HISTORY}/manifest_{new}", json.dumps({"files": files}, indent=2).encode("utf-8"))
    _READ.pop((storage.full_path(""), new), None)  # a history deleted and written anew (a migration) numbers from 1 again
    storage.write_atomic(VERSION_FILE, str(new).encode("ascii"))
    return f"{HISTORY}/{name}"
