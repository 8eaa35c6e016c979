"""What a lake remembers of its latest successful run: `<lake>/.pipe-last-success.json`, beside
the run lock, written at the end of every `pipe run`/`pipe build` whose every step succeeded
(while the run still holds the run lock, so runs never interleave their records).

It holds when the run started and finished (UTC instant times) and the instant each table it
wrote committed. `--defer prod` (runtime/defer.py) reads prod's record to pin every upstream it
defers to prod as it was at the end of that run: the tables the run wrote at their commits, the
others at their latest commit completed by then. The tables' timelines stay the only state of
their data; the record only names a moment of them."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Mapping

from runtime.storage import StorageSpec, open_storage

RECORD_PATH = ".pipe-last-success.json"  # beside the tables (whose names never start with a dot)


def utc_instant(at: dt.datetime | None = None) -> str:
    """`at` (default now) as a UTC instant time, yyyyMMddHHmmssSSS."""
    from runtime.table.timeline import format_time

    return format_time((at or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc))


@dataclass(frozen=True)
class RunRecord:
    started: str  # UTC instant times
    finished: str
    target: str
    command: str
    written: dict[str, str] = field(default_factory=dict)  # table -> the instant this run committed

    def to_bytes(self) -> bytes:
        return json.dumps({"v": 1, **self.__dict__}, sort_keys=True, indent=1).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes) -> "RunRecord | None":
        """The record, or None when it is not one (written by hand, cut short): a lake without a
        record defers to each table's latest commit."""
        try:
            d = json.loads(data)
            written = {str(k): str(v) for k, v in (d.get("written") or {}).items()}
            record = cls(str(d["started"]), str(d["finished"]), str(d.get("target", "")), str(d.get("command", "")), written)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not all(_is_instant(t) for t in (record.started, record.finished, *written.values())):
            return None
        return record

    def describe(self) -> str:
        return f"finished {shown(self.finished)}"


def _is_instant(text: str) -> bool:
    return len(text) in (14, 17) and text.isdigit()


def shown(instant: str) -> str:
    """An instant time as people read it: 2026-12-06 05:00:01 UTC."""
    return f"{instant[:4]}-{instant[4:6]}-{instant[6:8]} {instant[8:10]}:{instant[10:12]}:{instant[12:14]} UTC"


def write(lake_uri: str, storage_options: tuple, record: RunRecord) -> None:
    open_storage(StorageSpec(lake_uri, storage_options)).write_atomic(RECORD_PATH, record.to_bytes())


def read(lake_uri: str, storage_options: tuple = ()) -> RunRecord | None:
    try:
        data = open_storage(StorageSpec(lake_uri, storage_options)).read_bytes(RECORD_PATH)
    except FileNotFoundError:
        return None
    return RunRecord.parse(data)


def record_success(lake_uri: str, storage_options: tuple, started: str, target: str, command: str,
                   written: Mapping[str, tuple[str | None, str]]) -> None:
    """After a run whose every step succeeded: its record (`written`: RunContext.written)."""
    write(lake_uri, storage_options, RunRecord(started, utc_instant(), target, command, {t: w[1] for t, w in sorted(written.items())}))
