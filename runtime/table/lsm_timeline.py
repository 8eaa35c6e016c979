"""The archived timeline of timeline layout 2 (table versions 8 and 9): Hudi 1.x's LSM tree of
Parquet files under `.hoodie/timeline/history/`, one row per archived instant (its requested
time, completion time, action and metadata), listed by the latest manifest
(docs/hudi-1x-format.md, 3). pipe reads it; it does not archive into it.

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


def data_files(storage) -> list[str]:
    """Paths (under the table's root) of the Parquet files the latest manifest lists."""
    n = _latest_manifest(storage)
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
    """The archived instants, oldest first, each completed with its completion time."""
    import pyarrow.parquet as pq

    out: list[Instant] = []
    for path in data_files(storage):
        try:
            rows = pq.read_table(io.BytesIO(storage.read_bytes(path)), columns=_COLUMNS).to_pylist()
        except FileNotFoundError:
            raise HistoryError(f"{path} is missing, though the archived timeline's manifest lists it") from None
        except Exception as exc:  # noqa: BLE001 - another writer's file: say which, not a traceback
            raise HistoryError(f"{path} is not a Parquet file of Hudi 1.x's archived timeline ({type(exc).__name__}: {exc})") from None
        for r in rows:
            if r["instantTime"] and r["action"]:
                out.append(Instant(str(r["instantTime"]), str(r["action"]), COMPLETED, r["completionTime"] or None))
    return sorted(out)
