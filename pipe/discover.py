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


def table_names(topics: list[str], known: dict[str, str] | None = None) -> dict[str, str]:
    """{topic: table name}: the name the captured file gives it already (`known`: {topic: name}),
    else the topic's last part (`shop.public.customers` -> customers), made a valid name, or its
    last two parts where that name is taken (`billing_customers`). Raises ValueError when two
    topics would still share a name."""
    def clean(text: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", text).lower()
        return name if re.match(r"^[a-z_]", name) else "_" + name

    known = dict(known or {})
    out = {t: known[t] for t in topics if t in known}
    new = [t for t in topics if t not in known]
    counts: dict[str, int] = {}
    for t in new:
        counts[clean(t.rsplit(".", 1)[-1])] = counts.get(clean(t.rsplit(".", 1)[-1]), 0) + 1
    taken = set(out.values()) | set(known.values())
    for t in new:
        name = clean(t.rsplit(".", 1)[-1])
        if counts[name] > 1 or name in taken:
            name = clean("_".join(t.split(".")[-2:]))
        out[t] = name
    by_name: dict[str, str] = {}
    for t, name in sorted(out.items()):
        if name in by_name:
            raise ValueError(f"topics {by_name[name]} and {t} would both be table {name}")
        by_name[name] = t
    return out


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
    try:
        names = table_names(found, {e["topic"]: t for t, e in before.items()})
    except ValueError as exc:
        raise ProjectError([Diagnostic(Location(path.relative_to(root).as_posix()), f"source {source}: {exc}",
                                       f"name them yourself in {path.name} (`<table>: {{topic: ..., key: [...]}}`) and run discover again: "
                                       "names already in the file are kept")]) from exc
    entries: dict[str, dict[str, Any]] = {}
    said: list[str] = []
    for topic in found:
        try:
            seen = debezium.captured_table(kafka.latest_messages(source, config, topic), avro.registry_settings(config))
        except SourceError as exc:
            raise ProjectError([Diagnostic(Location(declared.file), str(exc), exc.hint)]) from exc
        except avro.RegistryError as exc:
            raise ProjectError([Diagnostic(Location(declared.file), f"source {source}: {str(exc).removeprefix('pipe: ')}",
                                           "check the source's `schema_registry` and that this machine reaches it")]) from exc
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
    _write_new(path, text)
    return path, said or ["  (no change)"]


def _write_new(path: Path, text: str) -> None:
    """Replaces `path` by a new file holding `text`, made beside it with O_EXCL (never through a
    link a project could hold), then renamed over it (a link at `path` is replaced, not followed)."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _captured_now(result, source: str) -> dict[str, dict[str, Any]]:
    """The captured tables the project's file holds now: {table: {topic, key, schema}}."""
    from compiler.errors import Collector

    _, entries = fan_out.read_captured(result.project.files, Collector()).get(source, (None, {}))
    return {t: dict(e) for t, e in entries.items()}
