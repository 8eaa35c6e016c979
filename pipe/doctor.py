"""`pipe doctor [PATH...]`: an audit of an existing lake before pipe writes to it.

It finds every Hudi table under the paths (a folder whose `.hoodie/hoodie.properties` exists;
nothing below a table is searched further), and says of each what a team must know before it
points pipe, or any new writer, at it: its version and type, its key generator and key encoding,
partitioning, ordering, index, metadata table, timeline (layout, time zone, pending instants,
writers running now), change data capture, schema-on-read and clustering; then whether pipe can
take it over as it is, and if not, why and what to change. It reads `hoodie.properties` and lists
the timeline: no data file is opened, no Spark is started, nothing is written.

The verdicts are the rules pipe's engine applies when it opens and writes a table
(runtime/table/config.py), so that the audit and the write cannot disagree."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runtime.storage import StorageSpec, open_storage
from runtime.table import heartbeat
from runtime.table.layout import bucket_index_file_ids, parse_base_file, parse_log_file
from runtime.table.errors import TableError
from runtime.table.config import (METADATA_TABLE, PROPERTIES, PROPERTIES_BACKUP, TABLE_VERSION,
                                  TableConfig, read_properties)
from runtime.table.timeline import (ARCHIVED, CLUSTERING, COMPACTION, HOODIE, REPLACECOMMIT, WRITE_ACTIONS,
                                    Timeline, archived_instants)

READY, READ_ONLY, UNREADABLE = "ready", "read_only", "unreadable"
MAX_DEPTH = 6  # folders below a path searched for tables: a lake's tables sit a few levels down


@dataclass
class Finding:
    """One table as the audit found it."""

    path: str
    facts: dict[str, Any] = field(default_factory=dict)
    verdict: str = READY
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, **self.facts, "verdict": self.verdict, "reason": self.reason, "notes": self.notes}


def find_tables(uri: str, options: tuple = (), max_depth: int = MAX_DEPTH) -> list[str]:
    """The URIs of the Hudi tables at or below `uri`, in order; a table's own folders (its
    partitions, its metadata table) are not searched. Hidden folders (`.x`, `_x`) are skipped."""
    storage = open_storage(StorageSpec(uri, options))
    found: list[str] = []

    def walk(rel: str, depth: int) -> None:
        prefix = f"{rel}/" if rel else ""
        if storage.exists(prefix + PROPERTIES) or storage.exists(prefix + PROPERTIES_BACKUP):
            found.append(uri.rstrip("/") + ("/" + rel if rel else ""))
            return
        if depth >= max_depth:
            return
        for name in storage.list_dirs(rel):
            if not name.startswith((".", "_")):
                walk(prefix + name, depth + 1)

    walk("", 0)
    return found


def audit_table(uri: str, options: tuple = (), now_ms: int | None = None) -> Finding:
    """What pipe makes of the table at `uri` (Finding)."""
    storage = open_storage(StorageSpec(uri, options))
    found = Finding(uri)
    try:
        props = read_properties(storage)
        config = TableConfig.from_properties_map(props)
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        found.verdict, found.reason = UNREADABLE, f"its {PROPERTIES} cannot be read ({type(exc).__name__}: {exc})"
        return found
    version, layout = config.table_version, config.timeline_layout
    keygen = props.get("hoodie.table.keygenerator.class") or props.get("hoodie.table.keygenerator.type") or config.key_generator
    ordering = props.get("hoodie.table.ordering.fields") or props.get("hoodie.table.precombine.field") or None
    index = (props.get("hoodie.index.type") or "").upper() or None
    bucket_engine = (props.get("hoodie.index.bucket.engine") or "SIMPLE").upper() if index == "BUCKET" else None
    if index is None and _bucket_file_ids(storage, config):  # Java keeps its index settings out of hoodie.properties
        index, bucket_engine = "BUCKET", "SIMPLE"
    if storage.list_files(f"{HOODIE}/.hashing_meta", recursive=True):  # Hudi 1.1's bucket numbers per partition
        index, bucket_engine = "BUCKET", "SIMPLE, partition-level"
    facts: dict[str, Any] = {
        "name": config.name,
        "version": version,
        "initial_version": int(props["hoodie.table.initial.version"]) if props.get("hoodie.table.initial.version", "").isdigit() else None,
        "timeline_layout": layout,
        "type": config.table_type.lower(),
        "base_file_format": (props.get("hoodie.table.base.file.format") or "PARQUET").lower(),
        "record_key": list(config.record_key_fields),
        "key_generator": keygen.rsplit(".", 1)[-1],
        "key_encoding": _key_encoding(config, props),
        "meta_fields": config.populate_meta_fields,
        "partition_fields": list(config.partition_fields),
        "hive_style": config.hive_style,
        "url_encoded": config.url_encode,
        "ordering_fields": [f for f in (ordering or "").split(",") if f],
        "merge_mode": props.get("hoodie.record.merge.mode") or None,
        "payload_class": (props.get("hoodie.compaction.payload.class") or props.get("hoodie.legacy.payload.class") or "").rsplit(".", 1)[-1] or None,
        "index": index,
        "bucket_engine": bucket_engine,
        "metadata_table": _metadata_table(storage, props),
        "timeline_timezone": (props.get("hoodie.table.timeline.timezone") or "LOCAL").upper(),
        "cdc": props.get("hoodie.table.cdc.enabled", "false").lower() == "true",
        "cdc_logging": props.get("hoodie.table.cdc.supplemental.logging.mode") or None,
        "schema_on_read": bool([f for f in storage.list_files(f"{HOODIE}/.schema", recursive=True) if not f.path.endswith("/.keep")]),
    }
    facts.update(_timeline_facts(storage, layout, now_ms))
    found.facts = facts

    unreadable = config.unreadable_reason(storage)
    unwritable = unreadable or config.unwritable_reason(storage)
    if unreadable:
        found.verdict, found.reason = UNREADABLE, unreadable
    elif unwritable:
        found.verdict, found.reason = READ_ONLY, unwritable
    elif facts["index"] == "BUCKET" and config.buckets is None:  # what the writer finds from the file ids (Table._refuse_layout)
        found.verdict, found.reason = READ_ONLY, ("its file groups are those of Hudi's bucket index (file ids start with an 8-digit "
                                                  "bucket number), which routes every key to its bucket's file group, and its number "
                                                  "of buckets is a Java write setting, not in the table: pipe writes it once the "
                                                  "table's YAML says `index: bucket` and `buckets:` (hoodie.bucket.index.num.buckets)")
    found.notes = _notes(facts, found.verdict)
    return found


def _bucket_file_ids(storage, config: TableConfig) -> list[str]:
    """The file ids of one partition, when they are all a simple bucket index's (Java writes the
    index's settings into no file: its file ids say it), else []. Two listings at most per level."""
    rel = ""
    for _ in config.partition_fields:
        folders = [d for d in storage.list_dirs(rel) if not d.startswith((".", "_"))]
        if not folders:
            return []
        rel = f"{rel}/{folders[0]}" if rel else folders[0]
    ids = set()
    for f in storage.list_files(rel, recursive=False):
        name = f.path.rsplit("/", 1)[-1]
        parsed = parse_base_file(rel, name, f.size) or parse_log_file(rel, name, f.size)
        if parsed is not None:
            ids.add(parsed.file_id)
    return bucket_index_file_ids(sorted(ids))


def _key_encoding(config: TableConfig, props: dict[str, str]) -> str | None:
    """How a ComplexKeyGenerator with one key field writes its keys: `field:value`
    (FIELD_PREFIXED) or `value` (VALUE_ONLY); None where the question does not arise."""
    if not config.complex_single_key:
        return None
    declared = (props.get("hoodie.table.complex.keygen.encoding") or "").strip().upper()
    return declared or "undeclared (pipe reads it from a stored key)"


def _metadata_table(storage, props: dict[str, str]) -> dict[str, Any] | None:
    partitions = [p for p in (props.get("hoodie.table.metadata.partitions") or "").split(",") if p]
    building = [p for p in (props.get("hoodie.table.metadata.partitions.inflight") or "").split(",") if p]
    present = storage.exists(f"{METADATA_TABLE}/{PROPERTIES}")
    if not (partitions or building or present):
        return None
    return {"partitions": partitions, "being_built": building, "folder": present}


def _timeline_facts(storage, layout: int, now_ms: int | None) -> dict[str, Any]:
    instants = Timeline.load(storage, layout).instants
    history_error = None
    if layout >= 2:
        try:
            archived = len(archived_instants(storage, layout))
        except TableError as exc:
            archived, history_error = 0, str(exc)
    else:
        archived = len(archived_instants(storage)) + len([f for f in storage.list_files(ARCHIVED, recursive=False)
                                                          if ".archive." in f.path])
    completed = [i for i in instants if i.is_completed]
    writes = [i for i in completed if i.action in WRITE_ACTIONS]
    pending = [i for i in instants if not i.is_completed]
    live = heartbeat.live_foreign(storage, [i.time for i in pending], now_ms=now_ms)
    return {
        "instants": len(completed),
        "latest_write": writes[-1].time if writes else None,
        "pending": [{"instant": i.time, "action": i.action, "state": i.state,
                     **({"writer_alive_ms": live[i.time]} if i.time in live else {})} for i in pending],
        "archived": archived,
        "history_error": history_error,
        "clustering": any(i.action == CLUSTERING or (i.action == REPLACECOMMIT and not i.is_completed) for i in pending),
    }


def _notes(facts: dict[str, Any], verdict: str) -> list[str]:
    """What a team should know that does not stop pipe: what pipe's first write changes, and
    what is under way on the table now."""
    notes = []
    for p in facts["pending"]:
        what = f"{p['action']} {p['instant']} is {p['state']}"
        if "writer_alive_ms" in p:
            notes.append(f"{what}, and its writer is alive (heartbeat {p['writer_alive_ms'] // 1000} s ago): a writer runs on it "
                         "now; pipe waits for it and never rolls it back while it beats")
        elif p["action"] == COMPACTION:
            notes.append(f"{what}: a compaction planned by another writer; pipe's next compaction of the table carries it out")
        elif p["action"] in (CLUSTERING, REPLACECOMMIT) and p["state"] == "requested":
            notes.append(f"{what}: a clustering or replace planned by another writer and not started; pipe writes "
                         "nothing into the table until Hudi completes it or rolls it back")
        elif verdict == READY:
            notes.append(f"{what}, and no writer beats for it: a failed write, which pipe rolls back on its first write")
        else:
            notes.append(f"{what}, and no writer beats for it: a failed write")
    if facts.get("history_error"):
        notes.append(f"its archived timeline cannot be read: {facts['history_error']}; `pipe timeline --archived` cannot list it")
    mdt = facts["metadata_table"]
    if mdt and verdict == READY:
        parts = ", ".join(mdt["partitions"] + mdt["being_built"]) or "no partition listed"
        others = [p for p in mdt["partitions"] + mdt["being_built"] if p != "files"]
        if "files" in mdt["partitions"]:
            what = "pipe keeps its files partition in step with every commit"
            if others:
                what += (f" and drops {', '.join(others)} on its first change, as Hudi drops a disabled index (Java writers with "
                         "those indexes on build them again)")
        else:
            what = "it lists no files partition: pipe retires it on its first change (readers then list files, and Java writers rebuild it)"
        notes.append(f"it has a metadata table ({parts}): {what}")
    if facts["timeline_timezone"] != "UTC" and verdict == READY:
        notes.append("its instant times are local time (hoodie.table.timeline.timezone is LOCAL or absent): pipe writes its instants "
                     "in the zone of the latest one, as Java's writers of that zone do")
    if facts["version"] >= 8 and verdict == READY:
        notes.append(f"it is table version {facts['version']} (Hudi 1.x): pipe writes it at that version, archiving into its LSM "
                     "history as Java 1.x does")
    if facts["version"] < TABLE_VERSION and verdict == READY:
        notes.append(f"it is table version {facts['version']}, which pipe reads; its first write by Hudi 0.14 or 0.15 upgrades it to 6")
    return notes


def audit(paths: list[str], options_for, now_ms: int | None = None) -> list[Finding]:
    """The findings of every table under `paths`; `options_for(uri)`: the storage options that
    reach it (the target's S3 settings, or none)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for path in paths:
        options = options_for(path)
        for uri in find_tables(path, options):
            try:
                out.append(audit_table(uri, options, now_ms))
            except Exception as exc:  # noqa: BLE001 - one damaged table does not stop the audit of the others
                out.append(Finding(uri, verdict=UNREADABLE, reason=f"pipe could not audit it ({type(exc).__name__}: {str(exc)[:300]})"))
    return out


def exit_code(findings: list[Finding]) -> int:
    """0: pipe can take over every table as it is; 1: at least one needs a change first."""
    return 0 if all(f.verdict == READY for f in findings) else 1


def describe(f: Finding) -> list[str]:
    """The text lines of one finding (rich markup)."""
    from rich.markup import escape

    x = _escaped(f.facts)
    verdict = {READY: "[green]ready[/]: pipe reads and writes it as it is",
               READ_ONLY: "[yellow]read only[/]: pipe reads it, and will not write it",
               UNREADABLE: "[red]not readable by pipe[/]"}[f.verdict]
    if not x:
        return [f"[bold]{escape(f.path)}[/]", f"  {verdict}: {escape(f.reason or '')}"]
    lines = [f"[bold]{escape(f.path)}[/]  {x['name']}: version {x['version']}, {x['type']}, {x['base_file_format']}"]
    key = ", ".join(x["record_key"]) or "none"
    enc = f", keys {x['key_encoding']}" if x["key_encoding"] else ""
    meta = "" if x["meta_fields"] else ", without meta fields"
    lines.append(f"  key           {key} ({x['key_generator']}{enc}{meta})")
    if x["partition_fields"]:
        style = "hive-style" if x["hive_style"] else "values only"
        lines.append(f"  partitions    {', '.join(x['partition_fields'])} ({style}{', url-encoded' if x['url_encoded'] else ''})")
    else:
        lines.append("  partitions    none")
    order = ", ".join(x["ordering_fields"]) or "none"
    merge = ", ".join(v for v in (x["merge_mode"], x["payload_class"]) if v)
    lines.append(f"  ordering      {order}{f' ({merge})' if merge else ''}")
    engine = f" ({x['bucket_engine']})" if x["bucket_engine"] else ""
    lines.append(f"  index         {x['index'] or 'not set'}{engine}")
    mdt = x["metadata_table"]
    if mdt:
        parts = ", ".join(mdt["partitions"]) or "none listed"
        building = f"; being built: {', '.join(mdt['being_built'])}" if mdt["being_built"] else ""
        lines.append(f"  metadata      {parts}{building}")
    else:
        lines.append("  metadata      none")
    archived = f", {x['archived']} archived" if x["archived"] else ""
    latest = f" (latest write {x['latest_write']})" if x["latest_write"] else ""
    lines.append(f"  timeline      layout {x['timeline_layout']}, {x['timeline_timezone']}, {x['instants']} completed{latest}, "
                 f"{len(x['pending'])} pending{archived}")
    extras = [name for name, on in (("change data capture" + (f" ({x['cdc_logging']})" if x["cdc_logging"] else ""), x["cdc"]),
                                    ("schema-on-read evolution", x["schema_on_read"]), ("clustering pending", x["clustering"])) if on]
    if extras:
        lines.append(f"  features      {', '.join(extras)}")
    lines.append(f"  verdict       {verdict}" + (f": {escape(f.reason)}" if f.reason else ""))
    lines.extend(f"  [yellow]![/] {escape(n)}" for n in f.notes)
    return lines


def _escaped(value: Any) -> Any:
    """`value` with every string escaped for rich's markup (a table's properties are another
    writer's text: `[/x]` in one would stop the printing)."""
    from rich.markup import escape

    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


def summary(findings: list[Finding]) -> str:
    counts = {v: sum(1 for f in findings if f.verdict == v) for v in (READY, READ_ONLY, UNREADABLE)}
    n = len(findings)
    return (f"{n} table{'s' if n != 1 else ''}: {counts[READY]} ready, {counts[READ_ONLY]} read only, "
            f"{counts[UNREADABLE]} not readable by pipe")
