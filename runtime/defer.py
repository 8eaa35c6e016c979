"""`pipe run --target dev --defer prod`: the tables a run reads but does not build are read from
prod's lake, each at a pinned instant, so that a developer builds one table against production's
data without copying it, and a rerun reads exactly the same upstream rows.

The pins are chosen once, before the run, for every table a selected step reads and the run does
not build (by `ref()`, or through a `kind: table` or `s3_incremental` source):

- by default, prod as it was at the end of its latest successful run (runtime/run_record.py): a
  table that run wrote at its commit, any other at its latest commit completed by then. A commit
  of a prod run still going on, or of a failed run after it, is not seen;
- `--defer-as-of WHEN` (an instant time, or an ISO date and time, UTC unless it says otherwise):
  each table's latest commit completed by then;
- `--defer-as-of latest`: each table's latest commit now.

A pinned table is read through a view of its timeline cut at the pin (PinnedTable): a `ref()`
reads its snapshot at the pin, an incremental source reads up to the pin and no further. Each
dev commit stores the instant it read (`pipe.checkpoint.<name>`, as always) and where it read it
from (`pipe.deferred.<name>`: the target)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from compiler.errors import PipeError
from compiler.plan import Plan
from runtime import run_record
from runtime.table.table import Table
from runtime.table.timeline import DEFERRED_PREFIX, Timeline, timeline_is_local

__all__ = ["DEFERRED_PREFIX", "DeferError", "Deferral", "Pin", "PinnedTable", "cut", "deferred_tables", "parse_as_of", "plan_deferral"]


class DeferError(PipeError):
    """The deferral cannot be set up; nothing was run. Exit code 2 for a mistake on the command
    line, 1 for what the deferred target's lake lacks."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.hint = hint
        self.exit_code = exit_code


@dataclass(frozen=True)
class Pin:
    table: str
    instant: str  # the instant time of the commit read (what a ref() stores as its checkpoint)
    completion: str | None  # its completion time (Hudi 1.x tables), else None
    cut: str  # the view's cut: instants (layout 1) or completions (layout 2) up to this time are seen
    # layout 1: the instants up to the cut still in flight when the pin was chosen; never seen,
    # even once they complete (layout 1 keeps no completion time to tell them by)
    pending: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"instant": self.instant, "cut": self.cut, **({"completion": self.completion} if self.completion else {}),
                **({"pending": list(self.pending)} if self.pending else {})}

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "Pin":
        return cls(name, str(d["instant"]), d.get("completion"), str(d.get("cut") or d.get("completion") or d["instant"]),
                   tuple(str(t) for t in d.get("pending") or ()))


@dataclass(frozen=True)
class Deferral:
    target: str
    lake: str
    storage_options: tuple
    how: str  # what the pins are: "prod's latest successful run (finished ...)"
    as_of: str | None  # the UTC cut every table was pinned at (None: each table's latest commit)
    pins: Mapping[str, Pin]

    def open(self, name: str, spark=None) -> "PinnedTable":
        pin = self.pins[name]
        table = Table.open(spark, f"{self.lake}/{name}", self.storage_options)
        return PinnedTable(table, pin)

    @classmethod
    def again(cls, stored: dict, lake: str, storage_options: tuple) -> "Deferral":
        """The deferral a run recorded in run_results.json (`to_dict`), for `pipe retry`: the same
        pins, so that the retried steps read what the failed run read (checked: still readable)."""
        try:
            pins = {str(n): Pin.from_dict(str(n), p) for n, p in (stored.get("tables") or {}).items()}
            target = str(stored["target"])
            out = cls(target, lake, storage_options, str(stored.get("pinned_by") or "the pins of the run retried"), stored.get("as_of"), pins)
        except (KeyError, TypeError, AttributeError) as exc:
            raise DeferError("target/run_results.json does not say what the run deferred to", "run the command again instead of retrying it") from exc
        for name, pin in pins.items():
            _check_readable(target, name, _open(target, lake, storage_options, name), pin)
        return out

    def with_pins(self, more: Mapping[str, Pin]) -> "Deferral":
        return replace(self, pins={**self.pins, **more})

    def to_dict(self) -> dict:
        return {"target": self.target, "lake": self.lake, "pinned_by": self.how, "as_of": self.as_of,
                "tables": {n: p.to_dict() for n, p in sorted(self.pins.items())}}

    def summary(self) -> str:
        tables = ", ".join(f"{n} at {p.instant}" for n, p in sorted(self.pins.items()))
        return f"deferring to {self.target}: {tables or 'no table'} ({self.how})"


class PinnedTable(Table):
    """A table of another target's lake, read as it was at a pin: its timeline is cut there, so
    every read (snapshot, time travel, incremental) sees nothing later. Never written."""

    def __init__(self, table: Table, pin: Pin):
        super().__init__(table.spark, table.storage, table.config)
        self.pin = pin

    def timeline(self) -> Timeline:
        return view(super().timeline(), self.pin)

    def _check_writable(self) -> None:
        from runtime.table.errors import TableError

        raise TableError(f"table {self.config.name} at {self.storage.spec.uri} is deferred to (read at {self.pin.instant}); "
                         "a run never writes it")


def cut(timeline: Timeline, at: str) -> Timeline:
    """`timeline` as it was at `at`: in layout 2 every instant completed later is in flight (a
    commit that started before may complete after); in layout 1, which keeps no completion
    times, the instants after `at` are gone."""
    return _without_later(timeline.completed_by(at) if timeline.layout >= 2 else timeline, at)


def view(timeline: Timeline, pin: Pin) -> Timeline:
    """The timeline a pinned read sees: cut at the pin, without the instants that were in flight
    when the pin was chosen (layout 1)."""
    out = cut(timeline, pin.cut)
    if pin.pending:
        out.instants = [i for i in out.instants if i.time not in pin.pending]
    return out


def _without_later(timeline: Timeline, at: str) -> Timeline:
    out = Timeline(timeline.storage, [], timeline.made_ms, timeline.layout)
    out.instants = [i for i in timeline.instants if i.time <= at]
    out.compactions = {t for t in timeline.compactions if t <= at}
    return out


_ISO = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:?\d{2})?")


def parse_as_of(text: str) -> str | None:
    """`--defer-as-of`: `latest` (None), an instant time (14 or 17 digits), or an ISO date and
    time (UTC unless it names an offset); the UTC instant time it means. ValueError otherwise."""
    text = text.strip()
    if text.lower() == "latest":
        return None
    if re.fullmatch(r"\d{14}|\d{17}", text):
        dt.datetime.strptime(text[:14], "%Y%m%d%H%M%S")  # a real date
        return text.ljust(17, "9") if len(text) == 14 else text  # the whole second
    if _ISO.fullmatch(text):
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.timezone.utc)
        if len(text) == 10:  # a date alone: the end of that day
            at += dt.timedelta(days=1, milliseconds=-1)
        return run_record.utc_instant(at)
    raise ValueError(text)


def _in_clock(utc: str, timeline: Timeline) -> str:
    """The UTC instant time `utc` in the clock of the table's timeline: a LOCAL table (written by
    Java in its JVM's zone) counts its instants in its writers' wall clock."""
    if not timeline_is_local(timeline.storage):
        return utc
    offset = timeline.writers_utc_offset()
    at = dt.datetime.strptime(utc, "%Y%m%d%H%M%S%f").replace(tzinfo=dt.timezone.utc)
    at = at + offset if offset is not None else at.astimezone().replace(tzinfo=dt.timezone.utc)
    return run_record.utc_instant(at)


def pin_at(name: str, timeline: Timeline, at: str | None, written: str | None, exact: str | None = None) -> Pin | None:
    """The pin of table `name`: the commit the run record says was written (`written`), the
    instant `exact` (an instant time given as --defer-as-of that the table has), else its latest
    commit completed by `at` (UTC; None: now)."""
    done = {i.time: i for i in timeline.completed()}
    chosen = done.get(written) if written is not None else None
    chosen = chosen or (done.get(exact) if exact is not None else None)
    if chosen is None:
        seen = timeline if at is None else cut(timeline, _in_clock(at, timeline))
        chosen = seen.latest_completed()
    if chosen is None:
        return None
    if timeline.layout >= 2:
        return Pin(name, chosen.time, chosen.completion, chosen.completed_at)
    pending = tuple(i.time for i in timeline.instants if not i.is_completed and i.time <= chosen.time)
    return Pin(name, chosen.time, None, chosen.time, pending)


def _open(target: str, lake: str, storage_options: tuple, name: str) -> Table:
    """Table `name` of the deferred target's lake; a DeferError when it is missing or cannot be
    reached (credentials, a bucket that is not there)."""
    uri = f"{lake}/{name}"
    try:
        if not Table.exists(uri, storage_options):
            raise DeferError(f"--defer {target}: table {name} is read by this run but not built, and there is no table {name} "
                             f"in {target}'s lake ({uri})",
                             f"build it in {target}, or select it too (`--select +...`) to build it in this target")
        return Table.open(None, uri, storage_options)
    except DeferError:
        raise
    except Exception as exc:  # noqa: BLE001 - the lake cannot be reached: say where, before Spark starts
        raise DeferError(f"--defer {target}: cannot read table {name} in {target}'s lake ({uri}): {type(exc).__name__}: {exc}",
                         f"check the location of {target}'s lake and credentials that can read it (docs/dev-loop.md)") from exc


def _check_readable(target: str, name: str, table: Table, pin: Pin, timeline: Timeline | None = None) -> None:
    """The files of the pinned version are still there: a version the cleaner removed files of
    would read as fewer rows (the full `timeline`, default listed now, knows the cleans after the pin)."""
    from runtime.table.errors import TableError

    try:
        table._check_not_cleaned(timeline or table.timeline(), pin.instant)
    except TableError as exc:
        raise DeferError(f"--defer {target}: {exc}", f"pin {name} later (`--defer-as-of`), or keep more versions of it in {target}") from exc


def deferred_tables(plan: Plan, selected: Iterable[str]) -> list[str]:
    """The tables the selected steps read and the run does not build: a ref() of a selected
    table or test, or the table of a `kind: table`/`s3_incremental` source one reads."""
    chosen = set(selected)
    built = {plan.step(s).name for s in chosen if plan.step(s).kind == "write"}
    out = set()
    for sid in chosen:
        step = plan.step(sid)
        for dep in step.depends_on:
            up = plan.step(dep)
            table = up.name if up.kind == "write" else up.reads_table
            if table is not None:
                out.add(table)
    return sorted(out - built)


def plan_deferral(plan: Plan, selected: Iterable[str], target: str, lake: str, storage_options: tuple,
                  as_of_text: str | None, names: Iterable[str] | None = None) -> Deferral:
    """The pins of the run (see the module's doc) of the tables `names` (default: every table the
    selected steps defer); a DeferError when a deferred table is not in prod's lake or has no
    commit at the pin."""
    names = deferred_tables(plan, selected) if names is None else sorted(names)
    if as_of_text is not None:
        try:
            as_of = parse_as_of(as_of_text)
        except ValueError as exc:
            raise DeferError(f"--defer-as-of {as_of_text!r} is neither an instant time nor a date and time",
                             "give an instant (20261206050001123, see `pipe timeline TABLE --target "
                             f"{target}`), an ISO time ('2026-12-06 05:00', UTC unless it names an offset) or `latest`", exit_code=2) from exc
        record = None
        how = "each table's latest commit" if as_of is None else f"each table's latest commit by {run_record.shown(as_of)}"
    else:
        record = run_record.read(lake, storage_options)
        as_of = record.finished if record else None
        how = (f"{target}'s latest successful run, {record.describe()}" if record else
               f"each table's latest commit: {target}'s lake has no record of a successful run ({run_record.RECORD_PATH})")
    pins = {}
    exact = as_of_text.strip() if as_of_text is not None and re.fullmatch(r"\d{17}", as_of_text.strip()) else None
    for name in names:
        table = _open(target, lake, storage_options, name)
        timeline = table.timeline()
        pin = pin_at(name, timeline, as_of, record.written.get(name) if record else None, exact)
        if pin is None:
            when = f" by {run_record.shown(as_of)}" if as_of else ""
            older = " (its earlier commits have been archived)" if timeline.instants else ""
            raise DeferError(f"--defer {target}: table {name} has no completed commit{when} in {target}'s lake ({table.storage.spec.uri}){older}",
                             "choose a later --defer-as-of, or build the table in this target too")
        _check_readable(target, name, table, pin, timeline)
        pins[name] = pin
    return Deferral(target, lake, storage_options, how, as_of, pins)
