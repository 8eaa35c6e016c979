"""Plan diffing: what a change to the project does to each step, and to what lies downstream.

`diff_plans(base, head)` compares two compiled plans step by step. Each step is added, removed,
modified, unchanged, or indirectly changed (unchanged itself, but downstream of a change). A
modified step lists the fields that changed and gets the most severe of five classes, by the
rules in docs/diff.md:

    rewrite > destructive > breaking > non-breaking > metadata-only

Nothing here needs Spark or the lake: only the two plans."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Iterable

from compiler.plan import Plan, Step

DIFF_SCHEMA_VERSION = 1
CLASSES = ("rewrite", "destructive", "breaking", "non-breaking", "metadata-only")
SEVERITY = {c: len(CLASSES) - i for i, c in enumerate(CLASSES)}  # rewrite 5 ... metadata-only 1
STATUSES = ("added", "removed", "modified", "indirect", "unchanged")

# table settings the stored Hudi table is built on: the next write cannot take a change
REWRITE_KEYS = {
    "key": "record key",
    "partition_by": "partitioning",
    "type": "table type",
    "hive_style_partitioning": "partition path format (key generator)",
    "precombine": "precombine field (stored in hoodie.properties)",
}
# operations that remove or replace stored data
DESTRUCTIVE_OPERATIONS = ("insert_overwrite", "insert_overwrite_table", "delete_partition", "delete")
# settings that change what a write does to stored rows
BREAKING_KEYS = ("operation", "index", "buckets", "insert_duplicates", "combine_before_insert", "precombine_nulls", "bootstrap", "tombstone_days")
# settings of the table services and file layout: the data stays the same
NON_BREAKING_KEYS = ("max_file_size", "small_file_limit", "bulk_insert_sort_mode", "clean", "archive", "compaction")
# source settings whose change makes a source read other input, or read it differently
SOURCE_BREAKING = ("kind", "format", "path", "queue_url", "metadata_table", "table", "options", "region", "endpoint_url",
                   "key_prefix", "key_suffix", "key_glob", "min_object_size", "max_object_size", "changes")
MIN_RETAINED_COMMITS = 3  # see docs/diff.md, "Incremental consumers"


@dataclass
class Change:
    field: str
    before: Any
    after: Any
    cls: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "before": self.before, "after": self.after, "class": self.cls, "why": self.why}


@dataclass
class StepDiff:
    id: str
    kind: str
    name: str
    status: str
    cls: str | None = None
    changes: list[Change] = field(default_factory=list)
    sql_diff: str | None = None
    command: str | None = None  # what to run after merging, when the class asks for it
    upstream_changes: list[str] = field(default_factory=list)  # for indirect: the changed steps it depends on
    file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind, "name": self.name, "status": self.status, "class": self.cls,
            "changes": [c.to_dict() for c in self.changes], "sql_diff": self.sql_diff, "command": self.command,
            "upstream_changes": self.upstream_changes, "file": self.file,
        }


@dataclass
class Warning_:
    step: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "message": self.message}


@dataclass
class PlanDiff:
    base: str
    head: str
    steps: list[StepDiff]
    warnings: list[Warning_]
    target_changes: list[Change]

    @property
    def changed(self) -> list[StepDiff]:
        return [s for s in self.steps if s.status != "unchanged"]

    @property
    def has_changes(self) -> bool:
        return bool(self.changed) or bool(self.target_changes)

    def worst(self) -> str | None:
        classes = [s.cls for s in self.steps if s.cls] + [c.cls for c in self.target_changes]
        return max(classes, key=SEVERITY.__getitem__) if classes else None

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for s in self.steps:
            out[s.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "diff_schema_version": DIFF_SCHEMA_VERSION,
            "base": self.base,
            "head": self.head,
            "summary": {"counts": self.counts(), "worst_class": self.worst(), "has_changes": self.has_changes},
            "target_changes": [c.to_dict() for c in self.target_changes],
            "steps": [s.to_dict() for s in self.steps],
            "warnings": [w.to_dict() for w in self.warnings],
        }


def diff_plans(base: Plan, head: Plan, base_label: str = "base", head_label: str = "head") -> PlanDiff:
    before = {s.id: s for s in base.steps}
    after = {s.id: s for s in head.steps}
    diffs: dict[str, StepDiff] = {}
    for sid in sorted(set(before) | set(after)):
        b, h = before.get(sid), after.get(sid)
        if b is None:
            diffs[sid] = StepDiff(sid, h.kind, h.name, "added", file=h.file)
            if h.kind == "test":
                diffs[sid].cls = "metadata-only"
                diffs[sid].changes.append(Change("test", None, h.name, "metadata-only", "a new data test; it reads tables, never writes"))
            elif h.kind == "unit":
                diffs[sid].cls = "metadata-only"
                diffs[sid].changes.append(Change("unit_test", None, h.name, "metadata-only", "a new unit test; it writes only a throwaway table"))
        elif h is None:
            d = StepDiff(sid, b.kind, b.name, "removed", file=b.file)
            if b.kind == "test":
                d.cls = "metadata-only"
                d.changes.append(Change("test", b.name, None, "metadata-only", "the data test leaves the project; no data changes"))
            elif b.kind == "unit":
                d.cls = "metadata-only"
                d.changes.append(Change("unit_test", b.name, None, "metadata-only", "the unit test leaves the project; no data changes"))
            elif b.kind == "write":
                d.cls = "destructive"
                d.changes.append(Change("table", b.name, None, "destructive",
                                        "the table leaves the project; its data stays in the lake, unmanaged"))
            else:
                d.cls = "breaking"
                d.changes.append(Change("source", b.name, None, "breaking", "the source leaves the project"))
            diffs[sid] = d
        else:
            diffs[sid] = _modified(b, h)
    _mark_downstream(diffs, base, head)
    ordered = [diffs[s.id] for s in head.steps] + [diffs[s] for s in sorted(before) if s not in after]
    return PlanDiff(base_label, head_label, ordered, _retention_warnings(head, base), _target_changes(base, head))


def _modified(b: Step, h: Step) -> StepDiff:
    d = StepDiff(h.id, h.kind, h.name, "unchanged", file=h.file)
    changes: list[Change] = []
    if h.kind == "write":  # (a step id holds its kind: a source that becomes a table is removed + added)
        changes += _table_changes(b, h)
    elif h.kind == "test":
        changes += [Change(key, b.config.get(key), h.config.get(key), "metadata-only", "a data test's setting; tests read, never write")
                    for key in sorted(set(b.config) | set(h.config)) if b.config.get(key) != h.config.get(key)]
        if (b.sql or "") != (h.sql or ""):
            changes.append(Change("sql", None, None, "metadata-only", "the data test's query changed; tests read, never write"))
    elif h.kind == "unit":
        changes += [Change(key, _unit_said(key, b.config.get(key)), _unit_said(key, h.config.get(key)), "metadata-only",
                           "the unit test's " + {"given": "given rows", "expected": "expected rows"}.get(key, key)
                           + " changed; it writes only a throwaway table")
                    for key in sorted(set(b.config) | set(h.config)) if b.config.get(key) != h.config.get(key)]
    else:
        changes += _source_changes(b, h)
    if b.description != h.description:
        changes.append(Change("description", b.description, h.description, "metadata-only", "documentation only"))
    if tuple(b.tags) != tuple(h.tags):
        changes.append(Change("tags", list(b.tags), list(h.tags), "metadata-only", "selection tags only"))
    if b.code != h.code or (b.sql_full_refresh or "") != (h.sql_full_refresh or ""):
        d.sql_diff = "".join(difflib.unified_diff(
            b.code.splitlines(keepends=True), h.code.splitlines(keepends=True),
            fromfile=f"a/{b.sql_file or b.file}", tofile=f"b/{h.sql_file or h.file}")) or None
    if b.env_vars != h.env_vars:
        changes.append(Change("env_vars", dict(b.env_vars), dict(h.env_vars), "non-breaking", "environment variables the step reads"))
    if not changes and b.fingerprint == h.fingerprint:
        return d
    if not changes:  # something else in the behaviour changed (rendered vars, full-refresh SQL)
        changes.append(Change("behaviour", b.fingerprint[:12], h.fingerprint[:12], "non-breaking", "the rendered step changed"))
    d.status = "modified"
    d.changes = changes
    d.cls = max((c.cls for c in changes), key=SEVERITY.__getitem__)
    if d.cls == "rewrite":
        d.command = f"pipe run --select {h.name} --full-refresh"
    return d


def _unit_said(key: str, value):
    """A unit test's setting as a diff line shows it: its rows counted, not listed."""
    if key == "given" and isinstance(value, list):
        return ", ".join(f"{len(g.get('rows') or [])} rows of {g.get('name')}" for g in value) or "nothing"
    if key == "expected" and isinstance(value, dict):
        return f"{len(value.get('rows') or [])} rows of {', '.join(value.get('columns') or []) or 'no column'}"
    return value


def _table_changes(b: Step, h: Step) -> list[Change]:
    bc, hc = b.config, h.config
    out: list[Change] = []
    for key, what in REWRITE_KEYS.items():
        if bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "rewrite",
                              f"the stored table is built on its {what}: the next write is refused until the table is rebuilt"))
    op_b, op_h = bc.get("operation"), hc.get("operation")
    if op_b != op_h:
        cls = "destructive" if op_h in DESTRUCTIVE_OPERATIONS else "breaking"
        why = (f"{op_h} removes or replaces stored rows" if cls == "destructive"
               else f"{op_b} -> {op_h} changes what a write does to stored rows")
        out.append(Change("operation", op_b, op_h, cls, why))
    if bc.get("delete_when") != hc.get("delete_when"):
        if hc.get("delete_when"):
            out.append(Change("delete_when", bc.get("delete_when"), hc.get("delete_when"), "destructive",
                              "rows matching the new predicate are deleted from the table"))
        else:
            out.append(Change("delete_when", bc.get("delete_when"), None, "breaking", "matching rows are no longer deleted"))
    if (bc.get("partitions_to_delete") or []) != (hc.get("partitions_to_delete") or []):
        if hc.get("partitions_to_delete"):
            out.append(Change("partitions_to_delete", bc.get("partitions_to_delete"), hc.get("partitions_to_delete"), "destructive",
                              "the partitions listed are removed by the next run"))
        else:
            out.append(Change("partitions_to_delete", bc.get("partitions_to_delete"), [], "breaking", "no partition is removed any more"))
    for key in BREAKING_KEYS:
        if key == "index" and {bc.get(key), hc.get(key)} == {"global", "record"}:
            out.append(Change(key, bc.get(key), hc.get(key), "non-breaking",
                              "keys stay unique across the table; only how a write finds them changes (a record index in the "
                              "metadata table, built at the next write, or none)"))
        elif key != "operation" and bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "breaking", "changes how incoming rows meet stored ones"))
    out += _column_changes(bc.get("schema"), hc.get("schema"), "table")
    if b.code != h.code or (b.sql_full_refresh or "") != (h.sql_full_refresh or ""):
        what = "the Python model's code" if h.python is not None else "the query"
        if hc.get("schema"):
            why = f"{what} changed; its declared columns are compared separately"
        else:
            why = f"{what} changed (no declared `schema`, so removed or retyped columns cannot be told; declare one to have them checked)"
        out.append(Change("python" if h.python is not None else "sql", None, None, "non-breaking", why))
    for key in NON_BREAKING_KEYS:
        if bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "non-breaking", "file layout or table services; the rows stay the same"))
    if bc.get("expect") != hc.get("expect"):
        out.append(_expect_change(h.name, bc.get("expect"), hc.get("expect")))
    if bc.get("table_version", 6) != hc.get("table_version", 6):
        out.append(Change("table_version", bc.get("table_version", 6), hc.get("table_version", 6), "non-breaking",
                          "the Hudi table version a new table is created with; the stored table keeps its own until it is "
                          "rebuilt (`--full-refresh`)"))
    if bc.get("cdc_logging") != hc.get("cdc_logging"):
        if hc.get("cdc_logging"):
            out.append(Change("cdc_logging", bc.get("cdc_logging"), hc.get("cdc_logging"), "rewrite",
                              "a table keeps the change data capture log it was created with: the next write is refused until the "
                              "table is rebuilt (`--full-refresh`), unless it already keeps this one"))
        else:
            out.append(Change("cdc_logging", bc.get("cdc_logging"), None, "non-breaking",
                              "undeclared, the stored table keeps the change data capture log it has"))
    if bc.get("seed") != hc.get("seed"):
        out.append(_seed_change(bc.get("seed"), hc.get("seed")))
    known = set(REWRITE_KEYS) | set(BREAKING_KEYS) | set(NON_BREAKING_KEYS) | {"operation", "delete_when", "partitions_to_delete", "schema",
                                                                                  "expect", "table_version", "cdc_logging", "seed"}
    for key in sorted(set(bc) | set(hc)):
        if key not in known and bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "non-breaking", "a table setting"))
    if b.action != h.action and not any(c.field == "operation" for c in out):
        out.append(Change("action", b.action, h.action, "breaking", "the timeline action of the table's writes"))
    return out


def _seed_change(b, h) -> Change:
    """A seed's CSV (or how it is read) changed: the next run replaces its table whole
    (compiler/seeds.py); its columns' types are compared as `schema`."""
    def said(seed):
        return None if not seed else f"{seed['file']} ({seed['rows']:,} rows, sha256 {seed['sha256'][:12]})"
    if not b or not h:
        return Change("seed", said(b), said(h), "destructive", "the table's rows come from " + ("its CSV now" if h else "its SQL now"))
    return Change("seed", said(b), said(h), "destructive",
                  "the seed's file changed: the next run replaces its table whole (rows removed from the file leave the table)")


# what an expectation's action does to the rows that fail it, and how strict that is for the table
_FATE = {"warn": "counted and kept", "drop": "left out", "quarantine": "left out", "fail": "refused: the write stops"}
_STRICTNESS = {"warn": 0, "drop": 1, "quarantine": 1, "fail": 2}


def _expect_change(table: str, before: list | None, after: list | None) -> Change:
    """One change for `expect`, saying what each changed expectation does to the table's rows.
    Breaking when rows the table kept are now left out or stop the write (an expectation added or
    its condition changed, with an action other than warn; an action made stricter). drop and
    quarantine leave the same rows out of the table: between them only `<table>__quarantine`
    changes (it stops or starts receiving the failing rows), so that is non-breaking."""
    old = {e["name"]: e for e in before or ()}
    new = {e["name"]: e for e in after or ()}
    quarantine = f"{table}__quarantine"
    breaking: list[str] = []
    notes: list[str] = []
    for name, e in new.items():
        o = old.get(name)
        if o == e:
            continue
        action = e.get("action", "warn")
        if o is None or o.get("expression") != e.get("expression"):
            (breaking if action != "warn" else notes).append(
                f"{name} {'added' if o is None else 'changed'}: failing rows are {_FATE.get(action, action)}"
                + (f" (written to {quarantine})" if action == "quarantine" else ""))
            continue
        was = o.get("action", "warn")
        if (was, action) == ("quarantine", "drop"):
            notes.append(f"{name} quarantine -> drop: {table} keeps the same rows; {quarantine} stops receiving the failing rows "
                         "(the rows it holds stay)")
        elif (was, action) == ("drop", "quarantine"):
            notes.append(f"{name} drop -> quarantine: {table} keeps the same rows; the failing rows now also go to {quarantine}")
        elif _STRICTNESS.get(action, 0) > _STRICTNESS.get(was, 0):
            breaking.append(f"{name} {was} -> {action}: failing rows are {_FATE.get(action, action)}"
                            + (f" (written to {quarantine})" if action == "quarantine" else ""))
        else:
            notes.append(f"{name} {was} -> {action}: failing rows are {_FATE.get(action, action)}")
    notes += [f"{name} removed: its failing rows are kept" for name in old if name not in new]
    cls = "breaking" if breaking else "non-breaking"
    return Change("expect", before, after, cls, "; ".join(breaking + notes) + (" from the next run on" if breaking else ""))


def _source_changes(b: Step, h: Step) -> list[Change]:
    bc, hc = b.config, h.config
    out: list[Change] = []
    for key in SOURCE_BREAKING:
        if bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "breaking", "the source reads other input, or reads it differently"))
    out += _column_changes(bc.get("schema"), hc.get("schema"), "source")
    out += _column_changes(bc.get("captured_schema"), hc.get("captured_schema"), "captured table", field="captured_schema")
    for key in sorted(set(bc) | set(hc)):
        if key not in SOURCE_BREAKING and key not in ("schema", "captured_schema") and bc.get(key) != hc.get(key):
            out.append(Change(key, bc.get(key), hc.get(key), "non-breaking", "a source setting (limits, filters, polling)"))
    return out


def _column_changes(before, after, what: str, field: str = "schema") -> list[Change]:
    if before == after or before is None and after is None:
        return []
    b = {c["name"].lower(): c["type"] for c in before or []}
    a = {c["name"].lower(): c["type"] for c in after or []}
    out = []
    if before is None or after is None:
        return [Change(field, before, after, "non-breaking", f"the {what}'s columns are now {'declared' if after else 'inferred'}")]
    removed = sorted(set(b) - set(a))
    retyped = sorted(n for n in set(b) & set(a) if b[n] != a[n])
    added = sorted(set(a) - set(b))
    if removed:
        out.append(Change(field, removed, None, "breaking", f"column(s) removed: {', '.join(removed)}"))
    if retyped:
        out.append(Change(field, {n: b[n] for n in retyped}, {n: a[n] for n in retyped}, "breaking",
                          f"column(s) retyped: {', '.join(f'{n} {b[n]} -> {a[n]}' for n in retyped)}"))
    if added:
        out.append(Change(field, None, added, "non-breaking", f"column(s) added: {', '.join(added)}"))
    return out


def _mark_downstream(diffs: dict[str, StepDiff], base: Plan, head: Plan) -> None:
    """Unchanged steps downstream of a change (in the head graph, or in the base graph for a
    removed step) are indirectly changed; `upstream_changes` names the nearest changed steps
    upstream. A metadata-only change (description, tags) touches nothing downstream, and data
    tests are never indirectly changed. One pass per graph, in topological order."""
    changed = {sid for sid, d in diffs.items()
               if d.status in ("added", "removed") or (d.status == "modified" and d.cls != "metadata-only")}
    for plan in (head, base):
        nearest: dict[str, set[str]] = {}
        for s in plan.steps:  # plans list their steps in topological order
            near: set[str] = set()
            for dep in s.depends_on:
                near |= {dep} if dep in changed else nearest.get(dep, set())
            nearest[s.id] = near
            d = diffs.get(s.id)
            # a test downstream of a change is not marked: it reads, and is run again anyway
            if near and d is not None and d.status in ("unchanged", "indirect") and d.kind != "test":
                d.status = "indirect"
                d.upstream_changes = sorted(set(d.upstream_changes) | near)


def _retention_warnings(head: Plan, base: Plan) -> list[Warning_]:
    """Incremental consumers (`kind: table` sources) whose upstream keeps too few commits:
    a consumer that lags behind the cleaner fails (apache/hudi#2934)."""
    tables = {s.name: s for s in head.steps if s.kind == "write"}
    base_tables = {s.name: s for s in base.steps if s.kind == "write"}
    out = []
    for s in head.steps:
        if s.kind != "ingest" or s.config.get("kind") not in ("table", "s3_incremental"):
            continue
        upstream = s.reads_table
        t = tables.get(upstream)
        if t is None or s.config.get("on_checkpoint_lost") == "full_read":
            continue  # a full_read consumer reads the whole table again instead of failing
        clean = t.config.get("clean") or {}
        policy, retain = clean.get("policy"), clean.get("retain")
        before = (base_tables.get(upstream).config.get("clean") or {}) if upstream in base_tables else {}
        if policy == "keep_latest_file_versions":
            out.append(Warning_(s.id, f"table {upstream} cleans by file versions (keep_latest_file_versions, {retain}); source "
                                      f"{s.name} reads it incrementally and fails once a commit it has not read yet is cleaned: "
                                      f"use `clean: {{policy: keep_latest_commits, retain: N}}` with N at least the commits "
                                      f"{upstream} may gain between two runs of the consumer"))
        elif isinstance(retain, int) and retain < MIN_RETAINED_COMMITS:
            out.append(Warning_(s.id, f"table {upstream} keeps only {retain} commit(s) (clean.retain); source {s.name} reads it "
                                      f"incrementally and fails if it falls {retain} commit(s) behind: keep at least {MIN_RETAINED_COMMITS}"))
        elif isinstance(retain, int) and isinstance(before.get("retain"), int) and retain < before["retain"]:
            out.append(Warning_(s.id, f"table {upstream} now keeps {retain} commits instead of {before['retain']} (clean.retain); "
                                      f"source {s.name} reads it incrementally and fails once it lags more than {retain} commits"))
    return out


def rebuild_warnings(diff: PlanDiff, head: Plan) -> list[Warning_]:
    """A table whose key, partitioning, type or precombine changes (class rewrite) is created
    anew by `pipe run --full-refresh`: its instants start over, so every incremental consumer
    (a `kind: table` or `s3_incremental` source reading it) loses its checkpoint. One warning
    per such source, saying what its table's next run does (`pipe diff` adds them)."""
    out = []
    for d in diff.steps:
        fields = [c.field for c in d.changes if c.field in REWRITE_KEYS]
        if d.kind != "write" or d.status != "modified" or not fields:
            continue
        what = ", ".join(REWRITE_KEYS[f] for f in fields)
        for src in head.steps:
            if src.reads_table != d.name:
                continue
            if src.config.get("kind") not in ("table", "s3_incremental"):
                continue
            readers = [s.name for s in head.steps if s.kind == "write" and src.id in s.depends_on]
            for reader in readers:
                if src.config.get("on_checkpoint_lost") == "full_read":
                    then = f"then reads all of {d.name} again (on_checkpoint_lost: full_read)"
                else:
                    then = (f"then stops with a lost checkpoint unless it is rebuilt in the same run "
                            f"(`pipe run --select {d.name}+ --full-refresh`) or its source sets `on_checkpoint_lost: full_read`")
                out.append(Warning_(src.id, f"the {what} of table {d.name} changes, so `pipe run --full-refresh` creates it anew and its "
                                            f"instants start over: table {reader} reads it incrementally through source {src.name} and "
                                            f"loses its checkpoint; its next run {then}"))
    return out


def _target_changes(base: Plan, head: Plan) -> list[Change]:
    out = []
    b, h = base.target, head.target
    if b.name != h.name:
        out.append(Change("target", b.name, h.name, "metadata-only", "the plans were compiled for different targets"))
    if b.lake != h.lake:
        out.append(Change("lake", b.lake, h.lake, "rewrite", "tables are read and written at another place"))
    if b.spark_master != h.spark_master or dict(b.spark_conf) != dict(h.spark_conf):
        out.append(Change("spark", {"master": b.spark_master, "conf": dict(b.spark_conf)}, {"master": h.spark_master, "conf": dict(h.spark_conf)},
                          "non-breaking", "Spark settings"))
    if tuple(b.shared_paths) != tuple(h.shared_paths):
        out.append(Change("shared_paths", list(b.shared_paths), list(h.shared_paths), "non-breaking",
                          "folders every node of the cluster mounts (where a local lake or input may be)"))
    if (b.catalog or None) != (h.catalog or None):
        out.append(Change("catalog", dict(b.catalog or {"kind": "none"}), dict(h.catalog or {"kind": "none"}), "metadata-only",
                          _catalog_moves(base, head)))
    if dict(base.vars) != dict(head.vars):
        out.append(Change("vars", dict(base.vars), dict(head.vars), "non-breaking", "project variables (their effect shows in the steps)"))
    return out


def _catalog_moves(base: Plan, head: Plan) -> str:
    """What a change of the catalog settings does to each table's registration. Nothing is
    rewritten; the next run registers the tables under their new names, and the old entries
    stay in the catalog until dropped there."""
    b_kind = (base.target.catalog or {}).get("kind", "none")
    h_kind = (head.target.catalog or {}).get("kind", "none")
    moved, added, left = [], [], []
    for step in head.steps:
        if step.kind != "write":
            continue
        old = base.target.catalog_names(base.step(step.id)) if step.id in base.step_ids else []
        new = head.target.catalog_names(step)
        if old and new and old != new:
            moved.append(f"{step.name}: {', '.join(old)} -> {', '.join(new)}")
        elif new and not old:
            added.append(f"{step.name} as {', '.join(new)}")
        elif old and not new:
            left.append(f"{step.name} ({', '.join(old)})")
    parts = []
    if b_kind != h_kind:
        parts.append(f"tables are registered in {_CATALOG_WORDS[h_kind]} instead of {_CATALOG_WORDS[b_kind]}")
    if moved:
        parts.append("renamed or moved by the next run: " + "; ".join(moved) + " (the old entries stay until dropped in the catalog)")
    if added:
        parts.append("registered by the next run: " + "; ".join(added))
    if left:
        parts.append("no longer kept in sync: " + "; ".join(left))
    return "; ".join(parts) or "catalog settings (no table's name changes)"


_CATALOG_WORDS = {"none": "no catalog", "spark": "Spark's Hive metastore", "glue": "AWS Glue"}


def fails(diff: PlanDiff, threshold: str | None) -> bool:
    """`--fail-on`: a change at or above the class."""
    if threshold is None:
        return False
    classes: Iterable[str] = [s.cls for s in diff.steps if s.cls] + [c.cls for c in diff.target_changes]
    return any(SEVERITY[c] >= SEVERITY[threshold] for c in classes)

