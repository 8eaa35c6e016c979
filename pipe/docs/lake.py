"""Each table's latest commits for the site, read from its Hudi timeline and commit metadata with
the table engine's own readers (runtime/table/), in this process: no Spark, no JVM. Only a lake
on a local disk is read; otherwise the site says why its pages show no commits."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from compiler.plan import Plan

LATEST = 10  # instants shown per table


@dataclass(frozen=True)
class History:
    """What the lake holds of one table. `rows`: the latest instants, newest first (as
    `pipe timeline --output json` gives them); `last_write`: when the latest completed write
    was made, for people; `schema`: (column, type) of the latest commit's writer schema;
    `note`: why there is nothing to show."""

    rows: tuple[dict[str, Any], ...] = ()
    last_write: str | None = None
    last_write_instant: str | None = None
    schema: tuple[tuple[str, str], ...] | None = None
    note: str = ""


def read_histories(plan: Plan, root: Path, names: Iterable[str]) -> tuple[dict[str, History], str]:
    """The History of each table `names` in the target's lake, and a note for the whole site
    when the lake cannot be read ("" when it was)."""
    from runtime import s3
    from runtime.steps.context import RunContext
    from runtime.errors import RunError

    try:
        lake = RunContext(plan, root)
    except RunError as exc:
        return {}, f"Commits are not shown: {exc}."
    if s3.is_s3(lake.lake):
        return {}, f"Commits are not shown: the lake of target {plan.target.name} is on S3 ({lake.lake}); pipe docs reads a lake on a local disk."
    if not Path(lake.lake.removeprefix("file://")).is_dir():
        return {}, f"Commits are not shown: nothing has been written to the lake yet ({lake.lake})."
    out = {}
    for name in names:
        try:
            out[name] = _history(lake, name) if lake.table_exists(name) else History(note="Not built yet (`pipe run` builds it).")
        except Exception as exc:  # noqa: BLE001 - one unreadable table must not hide the others
            out[name] = History(note=f"The timeline could not be read: {type(exc).__name__}: {exc}")
    return out, ""


def _history(lake, name: str) -> History:
    from runtime.table.history import instant_rows
    from runtime.table.timeline import timeline_is_local

    table = lake.open_table(name)
    timeline = table.timeline()
    rows = instant_rows(table, last=LATEST, timeline=timeline)
    latest = timeline.latest_completed()
    struct = table.writer_schema(timeline)
    schema = tuple((f.name, f.dataType.simpleString()) for f in struct.fields) if struct is not None else None
    when = None
    if latest is not None:
        zone = "local time of the writer" if timeline_is_local(table.storage) else "UTC"
        when = f"{dt.datetime.strptime(latest.time[:14], '%Y%m%d%H%M%S'):%Y-%m-%d %H:%M:%S} ({zone})"
    return History(rows=tuple(reversed(rows)), last_write=when, last_write_instant=latest.time if latest else None, schema=schema,
                   note="" if rows else "No commit yet.")
