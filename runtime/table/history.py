"""What each instant of a table's timeline did, for people: `pipe timeline` prints these rows and
`pipe docs` shows them. Read from the timeline and its commit metadata alone (no Spark)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from runtime.table import avro
from runtime.table.timeline import WRITE_ACTIONS, Instant, Timeline, archived_instants, instant_path


def instant_rows(table, archived: bool = False, last: int | None = None, timeline: Timeline | None = None) -> list[dict[str, Any]]:
    """One row per instant, oldest first: instant, action, state, timeline (active or
    archived), its completion time (`completed`, timeline layout 2 only) and, for a completed
    write of the active timeline, its operation, counts, files, checkpoints and expectation
    outcomes; for a completed service, what it did (`detail`).
    `archived` adds the archived instants; `last` keeps only the latest so many."""
    timeline = timeline or table.timeline()
    found = [(i, "archived") for i in archived_instants(table.storage, table.config.timeline_layout)] if archived else []
    found += [(i, "active") for i in timeline.instants]
    rows = []
    for inst, where in found[-last:] if last else found:
        row: dict[str, Any] = {"instant": inst.time, "action": inst.action, "state": inst.state, "timeline": where}
        if inst.completion:  # timeline layout 2 (Hudi 1.x): what incremental reads and their checkpoints go by
            row["completed"] = inst.completion
        if inst.is_completed and inst.action in WRITE_ACTIONS and where == "active":
            meta = timeline.commit_metadata(inst)
            row.update(operation=meta.operation_type, inserts=sum(s.num_inserts for s in meta.write_stats),
                       updates=sum(s.num_update_writes for s in meta.write_stats), deletes=sum(s.num_deletes for s in meta.write_stats),
                       files=len(meta.write_stats), checkpoints=meta.checkpoints())
            if "pipe.expectations" in meta.extra:  # runtime/steps/expect.py
                row["expectations"] = json.loads(meta.extra["pipe.expectations"])
            if "pipe.migrated" in meta.extra:  # upgrade_downgrade.py: the empty commit of `pipe migrate`
                row["detail"] = f"migrated from version {meta.extra['pipe.migrated'].replace(' -> ', ' to ')}"
        elif inst.is_completed and where == "active":
            detail = service_detail(table.storage, inst, table.config.timeline_layout)
            if detail:
                row["detail"] = detail
        rows.append(row)
    return rows


def service_detail(storage, inst: Instant, layout: int = 1) -> str | None:
    """What a clean, rollback, restore or savepoint instant did, from its Avro metadata."""
    if inst.action not in ("clean", "rollback", "restore", "savepoint"):
        return None
    try:
        meta = avro.from_bytes(storage.read_bytes(instant_path(inst, layout)))
    except Exception:  # noqa: BLE001 - written by another tool in a form we do not know
        return None
    if inst.action == "clean":
        return f"deleted {meta.get('totalFilesDeleted', 0)} file(s)"
    if inst.action == "rollback":
        return "undid " + ", ".join(meta.get("commitsRollback") or [])
    if inst.action == "restore":
        undone = meta.get("instantsToRollback") or []
        return f"undid {len(undone)} write(s): " + ", ".join(undone)
    files = sum(len(pm.get("savepointDataFile") or []) for pm in (meta.get("partitionMetadata") or {}).values())
    return f"keeps {files} file(s)" + (f": {meta['comments']}" if meta.get("comments") else "")


def short_checkpoint(value: str) -> str:
    """A files checkpoint is JSON with a file list; show its watermark and the list's size."""
    try:
        d = json.loads(value)
    except ValueError:
        return value
    if isinstance(d, dict) and "mtime_ms" in d:
        t = dt.datetime.fromtimestamp(d["mtime_ms"] / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"files up to {t} (+{len(d.get('files', []))} named)"
    return value
