"""Sources: what is new for one consuming table since the checkpoint stored in its timeline.

Each kind offers a `Pending`: how much new input waits (files, bytes or commits), the
checkpoint to store in the commit that consumes it, and a DataFrame of that input. Nothing is
read before `dataframe()` is called, so `pipe run --dry-run` needs no Spark."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from compiler.errors import PipeError


class SourceError(PipeError):
    """Input a source cannot read; the message names the source and what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class NothingToRead(SourceError):
    """No new record, and no declared schema gives the (empty) input its columns: the step has
    no input this run (its checkpoint moves once there is some)."""


class Pending:
    """New input of one source for one table. `checkpoint` is None when nothing is new."""

    def __init__(self, name: str, checkpoint: str | None, count: int, bytes_: int | None = None):
        self.name = name
        self.checkpoint = checkpoint
        self.count = count
        self.bytes = bytes_
        self.rows: int | None = None  # known once read
        self.bad_records = 0  # records left out by `on_bad_record: drop`
        self.bad_samples: list[str] = []  # where the first of them are, and why
        self._cache: list = []  # DataFrames persisted while the step runs

    @property
    def is_empty(self) -> bool:
        return self.checkpoint is None

    def describe(self) -> str:  # pragma: no cover - every kind says it its way
        raise NotImplementedError

    def dataframe(self, spark):  # pragma: no cover
        raise NotImplementedError

    def release(self) -> None:
        """Drops what `dataframe()` persisted; called once the step's write is over."""
        for df in self._cache:
            try:
                df.unpersist()
            except Exception:  # noqa: BLE001 - the session may be gone already
                pass
        self._cache = []

    def to_dict(self) -> dict[str, Any]:
        out = {"new": self.count, "bytes": self.bytes, "rows": self.rows, "checkpoint": self.checkpoint, "detail": self.describe()}
        if self.bad_records:
            out["bad_records_dropped"] = self.bad_records
            out["bad_record_samples"] = list(self.bad_samples)
        return out


def columns_ddl(columns: Iterable[Mapping[str, str]]) -> str:
    """The plan's `[{name, type}]` as a Spark DDL string."""
    return ", ".join(f"`{c['name']}` {c['type']}" for c in columns)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
