"""`pipe discover SOURCE`: write down the tables a fan-out source captures (compiler/fan_out.py).

It lists the topics matching the source's `topic_pattern`, reads the newest few messages of each
(on this machine: metadata and a handful of messages, never a range) and writes, beside the
source's file, `<source>.captured.yml`: per captured table its topic, its key (the fields of the
Debezium message key, i.e. the primary key) and its columns. The file is the project's record of
what the database holds: commit it, and `pipe diff` shows what a new discovery changes (a new
table: added; a new column: non-breaking)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from compiler import fan_out
from compiler.errors import Diagnostic, Location, ProjectError


def table_names(topics: list[str]) -> dict[str, str]:
    """{topic: table name}: the topic's last part (`shop.public.customers` -> customers), made a
    valid name; the last two parts where two topics would share one (`public_orders`)."""
    def clean(text: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", text).lower()
        return name if re.match(r"^[a-z_]", name) else "_" + name

    short = {t: clean(t.rsplit(".", 1)[-1]) for t in topics}
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {t: (short[t] if counts[short[t]] == 1 else clean("_".join(t.split(".")[-2:]))) for t in topics}


def discover(result, root: Path, source: str, environ=None) -> tuple[Path, list[str]]:
    """Writes the captured file of fan-out source `source` of the compiled project `result`.
    Returns (the file, the lines that say what changed)."""
    from runtime.sources import SourceError, avro, debezium, kafka
    from runtime.steps.context import RunContext

    project = result.project
    declared = project.sources.get(source)
    if declared is None or not declared.config.get("fan_out"):
        fan_outs = sorted(n for n, s in project.sources.items() if s.config.get("fan_out"))
        raise ProjectError([Diagnostic(Location("<command line>"), f"no fan-out source named '{source}'",
                                       ("fan-out sources: " + ", ".join(fan_outs)) if fan_outs else
                                       "declare a `kind: kafka` source with `format: debezium`, a `topic_pattern` and `fan_out:`")])
    step = result.plan.step(f"source.{source}")
    config = RunContext(result.plan, project.root, environ=environ).config(step)
    path = root / (declared.file.rsplit("/", 1)[0] if "/" in declared.file else "") / f"{source}{fan_out.SUFFIX}"
    before = _captured_now(result, source)
    try:
        found = sorted(kafka.topics(source, config))
    except SourceError as exc:
        raise ProjectError([Diagnostic(Location(declared.file), str(exc), exc.hint)]) from exc
    names = table_names(found)
    entries: dict[str, dict[str, Any]] = {}
    said: list[str] = []
    for topic in found:
        try:
            seen = debezium.captured_table(kafka.latest_messages(source, config, topic), avro.registry_settings(config))
        except SourceError as exc:
            raise ProjectError([Diagnostic(Location(declared.file), str(exc), exc.hint)]) from exc
        if seen is None:
            said.append(f"  ? {topic}: no change event with a key among its newest messages yet; not captured")
            continue
        key, columns = seen
        entries[names[topic]] = {"topic": topic, "key": key, "schema": columns}
    kept = {t: e for t, e in before.items() if e["topic"] not in found and t not in entries}
    for table, entry in sorted(kept.items()):
        entries[table] = entry
        said.append(f"  = {table}: topic {entry['topic']} no longer matches or exists; kept (delete it from the file to drop the table)")
    for table, entry in sorted(entries.items()):
        old = before.get(table)
        if old is None:
            said.append(f"  + {table}: topic {entry['topic']}, key {', '.join(entry['key'])}, {len(entry['schema'])} column(s)")
            continue
        if old["key"] != entry["key"]:
            said.append(f"  ~ {table}: key {', '.join(old['key'])} -> {', '.join(entry['key'])} (the table must be rebuilt)")
        added = [c for c in entry["schema"] if c not in old["schema"]]
        gone = [c for c in old["schema"] if c not in entry["schema"]]
        if added:
            said.append(f"  ~ {table}: column(s) added: {', '.join(added)}")
        if gone:
            said.append(f"  ~ {table}: column(s) no longer in the events: {', '.join(gone)}")
    note = (f"The tables source {source} captures, written by `pipe discover {source}` on "
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. Review and commit it; run it again when tables or columns are added.")
    text = fan_out.captured_text(source, entries, note)
    old_text = path.read_text(encoding="utf-8") if path.is_file() else None
    if old_text is not None and old_text.split("\n", 1)[-1] == text.split("\n", 1)[-1]:
        return path, said or ["  (no change)"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path, said or ["  (no change)"]


def _captured_now(result, source: str) -> dict[str, dict[str, Any]]:
    """The captured tables the project's file holds now: {table: {topic, key, schema}}."""
    from compiler.errors import Collector

    _, entries = fan_out.read_captured(result.project.files, Collector()).get(source, (None, {}))
    return {t: dict(e) for t, e in entries.items()}
