"""Fan-out: one `kafka` source of change events (`format: debezium`, a `topic_pattern` and
`fan_out:`) becomes one source and one table per captured database table.

Which tables a source captures is written down in the project, in `<folder>/<source>.captured.yml`
beside the source's file, by `pipe discover <source>` (pipe/discover.py), and reviewed like any
other change:

    captured:
      shop_cdc:
        customers:
          topic: shop.public.customers
          key: [id]
          schema: {id: BIGINT, email: STRING, updated_at: TIMESTAMP}

so compiling stays offline and deterministic: a table added in the database becomes a table of the
project when the file says so, in the pull request that says so (`pipe diff`: a new table).

Each captured table `t` of source `s` gives
- a source `s__t`: the parent's settings with `topic: <its topic>`, so each table keeps its own
  offsets in its own commits and runs beside the others (`--threads`); its `captured_schema` is
  the columns `pipe discover` saw: what the compiler checks downstream SQL against and `pipe diff`
  compares (a column added: non-breaking). The run takes the columns the events carry, so a
  column added in the database flows in before the file says so;
- a table `<table_prefix>t` (`s_t` by default): `select * from {{ source('s__t') }}`, keyed by the
  captured key, `precombine: _cdc_position` (the database's log order), operation upsert,
  `tombstone_days: 7` (deletes stay deleted against late events), plus the settings of
  `fan_out.table` (type, tombstone_days, partition_by, tags, ...).

The parent source stays a source: a table may still read all its topics at once, and its step
names topics that match its pattern but are not captured yet."""

from __future__ import annotations

from typing import Any, Mapping

from compiler import schema
from compiler.errors import Collector
from compiler.yamlsrc import Doc, load_yaml

SUFFIX = ".captured.yml"
TOP = "captured"
PRECOMBINE = "_cdc_position"
DEFAULT_TOMBSTONE_DAYS = 7
_FIXED = ("key", "precombine", "operation")  # what fan_out.table may not set: the capture decides


def is_captured_file(rel: str) -> bool:
    return rel.endswith(SUFFIX)


def source_table_name(source: str, table: str) -> str:
    """The name of the generated source of one captured table."""
    return f"{source}__{table}"


def table_name(source: str, config: Mapping[str, Any], table: str) -> str:
    prefix = (config.get("fan_out") or {}).get("table_prefix")
    return (f"{source}_" if prefix is None else prefix) + table


def sql(source: str, table: str) -> str:
    return "select * from {{ source('" + source_table_name(source, table) + "') }}\n"


def read_captured(files, errors: Collector) -> dict[str, tuple[Doc, dict[str, dict[str, Any]]]]:
    """{source: (doc, {table: {topic, key, schema}})} of every captured file, checked."""
    out: dict[str, tuple[Doc, dict[str, dict[str, Any]]]] = {}
    for rel in sorted(r for r in files.listing("sources", (".yml",)) if is_captured_file(r)):
        text = files.text(rel, errors)
        doc = load_yaml(text, rel, errors) if text is not None else None
        if doc is None:
            continue
        body = doc.value
        if not isinstance(body, dict) or set(body) != {TOP} or not isinstance(body[TOP], dict):
            errors.error(doc.at(()), f"{rel} is not a captured-tables file (`captured:` mapping each source to its tables)",
                         "write it again with `pipe discover <source>`")
            continue
        for source, tables in body[TOP].items():
            path = (TOP, source)
            if not isinstance(tables, dict):
                errors.error(doc.at(path), f"the captured tables of source '{source}' must be a mapping of table names",
                             "write it again with `pipe discover <source>`")
                continue
            if source in out:
                errors.error(doc.at(path, key=True), f"the captured tables of source '{source}' are written twice (also in {out[source][0].file})",
                             "keep one file per source")
                continue
            checked = {}
            for table, entry in tables.items():
                where = path + (table,)
                if not isinstance(table, str) or not schema.NAME_RE.match(table):
                    errors.error(doc.at(where, key=True), f"captured table name {table!r} of source '{source}' is not a valid name",
                                 "use letters, digits and _, starting with a letter or _")
                    continue
                if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) \
                        or not isinstance(entry.get("key"), list) or not entry["key"] or not all(isinstance(k, str) for k in entry["key"]):
                    errors.error(doc.at(where), f"captured table '{table}' of source '{source}' needs `topic` (a string) and `key` "
                                                "(a list of column names)",
                                 "write it again with `pipe discover <source>`, or give the key of a table without a primary key")
                    continue
                columns = entry.get("schema") or {}
                if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
                    errors.error(doc.at(where + ("schema",)), f"schema of captured table '{table}' of source '{source}' must map names to types")
                    columns = {}
                checked[table] = {"topic": entry["topic"], "key": list(entry["key"]), "schema": dict(columns)}
            out[source] = (doc, checked)
    return out


def expand(files, sources: dict, tables: dict, errors: Collector) -> None:
    """Adds the generated sources and tables of every fan-out source to `sources` and `tables`
    (project.Source and project.Table, declared where the captured file names them)."""
    from compiler.project import Source, Table, _with_default_operation

    captured = read_captured(files, errors)
    for name in sorted(captured):
        doc, entries = captured[name]
        parent = sources.get(name)
        if parent is None or not parent.config.get("fan_out"):
            what = "no source" if parent is None else "a source without `fan_out`"
            errors.error(doc.at((TOP, name), key=True), f"captured tables are written for source '{name}', {what}",
                         "declare the source with `fan_out:`, or delete this file")
            continue
    for name, parent in sorted(sources.items()):
        c = parent.config
        if not c.get("fan_out"):
            continue
        if c.get("kind") != "kafka" or str(c.get("format")).lower() != "debezium" or not c.get("topic_pattern"):
            errors.error(parent.at("fan_out"), f"fan_out of source '{name}' needs `kind: kafka`, `format: debezium` and a `topic_pattern`",
                         "fan-out makes one table per table a change-data-capture connector writes a topic for")
            continue
        doc, entries = captured.get(name, (None, {}))
        if not entries:
            errors.warning(parent.at("fan_out"), f"source '{name}' fans out to no table yet: no captured tables are written down",
                           f"run `pipe discover {name}` to write them to {parent.file.rsplit('/', 1)[0]}/{name}{SUFFIX}, then review and commit it")
            continue
        settings = dict(c["fan_out"].get("table") or {})
        for fixed in _FIXED:
            if fixed in settings:
                errors.error(parent.at("fan_out", "table", fixed), f"fan_out.table of source '{name}' sets {fixed}, which the capture decides",
                             "the key comes from the captured table's primary key, the order from the database's log (_cdc_position)")
                settings.pop(fixed)
        # deletes stay deleted against older events arriving later, unless the project says otherwise
        settings.setdefault("tombstone_days", DEFAULT_TOMBSTONE_DAYS)
        # the settings are checked once, where they are written; each table takes them as checked
        schema.Checker(parent.doc, errors).section(schema.TABLE, settings, parent.path + ("fan_out", "table"),
                                                   f"fan_out.table of source '{name}'")
        for table, entry in sorted(entries.items()):
            where = (TOP, name, table)
            src_name, tbl_name = source_table_name(name, table), table_name(name, c, table)
            if src_name in sources or tbl_name in tables:
                clash = f"source '{src_name}'" if src_name in sources else f"table '{tbl_name}'"
                errors.error(doc.at(where, key=True), f"captured table '{table}' of source '{name}' would make {clash}, which is declared already",
                             "rename the declared one, or set `fan_out.table_prefix`")
                continue
            src_config = {k: v for k, v in c.items() if k != "fan_out"}
            src_config.update(topic=entry["topic"], topic_pattern=None,
                              captured_schema=[{"name": k, "type": v} for k, v in entry["schema"].items()] or None,
                              description=f"The change events of {table}, topic {entry['topic']} (fan-out of source {name}).")
            sources[src_name] = Source(name=src_name, config=src_config, doc=doc, path=where)
            body = {**settings, "key": entry["key"], "precombine": PRECOMBINE}
            body.setdefault("description", f"{table} as captured by source {name} (topic {entry['topic']}), changes applied in log order.")
            checked = schema.Checker(doc, Collector()).section(schema.TABLE, body, where, f"table '{tbl_name}' (fan-out of source '{name}')")
            tables[tbl_name] = Table(name=tbl_name, config=_with_default_operation(checked), doc=doc, path=where,
                                     sql_file=f"{doc.file}#{table}", sql_text=sql(name, table))


def captured_text(source: str, entries: Mapping[str, Mapping[str, Any]], note: str) -> str:
    """The captured file's text for `entries` ({table: {topic, key, schema}}), sorted: the same
    tables give the same bytes."""
    import yaml

    body = {TOP: {source: {t: {"topic": e["topic"], "key": list(e["key"]), "schema": dict(e.get("schema") or {})}
                           for t, e in sorted(entries.items())}}}
    return f"# {note}\n" + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, default_flow_style=False)

