"""Column lineage: for each column a table's SQL selects, the columns of its inputs (sources and
upstream tables, as ref() and source() render them) that it is computed from, read from the
rendered SQL with sqlglot (Spark dialect). `pipe docs` draws it; `pipe diff --data` follows a
column with mismatches to the downstream columns computed from it (ColumnGraph).

Only what the SQL says for certain is traced: a column reference is followed to the relation that
provides it through CTEs, derived tables and set operations. Where that is not certain (an
unqualified name over several inputs whose columns are unknown, a scalar subquery, a lateral
view, a `select *` over unknown columns, SQL sqlglot cannot read), the column is "not traced"
(None), never guessed. Columns in WHERE, JOIN and GROUP BY filter rows; they are not lineage.

Parsing costs about a millisecond per table, so outcomes are cached in
`target/lineage_cache.json`, keyed by a hash of the SQL, the columns of its inputs and the
versions of sqlglot and of this module."""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from functools import cache

from compiler.render import ENV_PLACEHOLDER_RE

if TYPE_CHECKING:
    from compiler.plan import Step

LINEAGE_VERSION = 1
CACHE_FILE = "lineage_cache.json"
# Sources whose declared `schema:` is the columns their SQL readers see (as compiler/sqlcheck.py)
_DECLARED_READS = ("files", "s3_incremental")


@dataclass(frozen=True)
class ColumnLineage:
    """Where one output column comes from. `inputs`: (relation, column) pairs, lower-case,
    relation as named in the SQL; empty for a column computed from no column (a literal,
    current_timestamp()); None when it cannot be traced. `direct`: the column is one input
    column passed through unchanged (perhaps renamed)."""

    column: str
    inputs: tuple[tuple[str, str], ...] | None
    direct: bool = False

    def to_json(self) -> list:
        return [self.column, [list(i) for i in self.inputs] if self.inputs is not None else None, self.direct]

    @classmethod
    def from_json(cls, v: list) -> "ColumnLineage":
        column, inputs, direct = v
        return cls(column, tuple((r, c) for r, c in inputs) if inputs is not None else None, bool(direct))


@dataclass(frozen=True)
class TableLineage:
    """The lineage of every column the SQL selects, in select-list order. `complete` is False
    when some output columns could not be named (e.g. `select *` over unknown columns)."""

    columns: tuple[ColumnLineage, ...]
    complete: bool

    @property
    def names(self) -> tuple[str, ...] | None:
        return tuple(c.column for c in self.columns) if self.complete else None


UNKNOWN = TableLineage((), False)


@cache
def _spark():
    """sqlglot's Spark dialect, made once (making it costs as much as parsing a short query).
    sqlglot is imported on first use: with every table's lineage cached, it is not needed."""
    import sqlglot

    return sqlglot.Dialect.get_or_raise("spark")


def table_lineage(sql: str, catalog: Mapping[str, list[str] | None], tree=None) -> TableLineage:
    """The lineage of `sql`'s columns. `catalog`: lower-case relation name -> its columns, or
    None when unknown. `tree`: `sql` as parsed already (compiler/sqlcheck.py's keep_parsed)."""
    from sqlglot import exp
    from sqlglot.optimizer.scope import build_scope

    try:
        if tree is None:
            # env_var() placeholders are filled in at run time; an identifier keeps the SQL parseable
            trees = [t for t in _spark().parse(ENV_PLACEHOLDER_RE.sub(lambda m: "_" * len(m.group(0)), sql)) if t is not None]
            if len(trees) != 1:
                return UNKNOWN
            tree = trees[0]
        if not isinstance(tree, exp.Query):
            return UNKNOWN
        root = build_scope(tree)
        if root is None:
            return UNKNOWN
        return _Tracer(catalog).table(root)
    except Exception:  # noqa: BLE001 - SQL sqlglot cannot read or analyse: nothing is traced
        return UNKNOWN


class _Tracer:
    def __init__(self, catalog: Mapping[str, list[str] | None]):
        self.catalog = {k.lower(): ([c.lower() for c in v] if v is not None else None) for k, v in catalog.items()}
        self.owned: dict[int, set[int]] = {}  # scope -> ids of the column nodes that belong to it
        self._names: dict[int, list[str | None] | None] = {}  # scope -> names(scope)

    def table(self, root) -> TableLineage:
        names = self.names(root)
        if names is None:
            return UNKNOWN
        out = []
        for i, name in enumerate(names):
            if name is None:  # e.g. `count(*)` without an alias: Spark names it, we do not
                continue
            inputs, direct = self.trace(root, name.lower(), i, set())
            out.append(ColumnLineage(name, inputs, direct))
        return TableLineage(tuple(out), all(n is not None for n in names))

    # -- what a scope selects --

    def names(self, scope) -> list[str | None] | None:
        """The names of the columns a scope selects (None for an unnamed one), or None when
        they cannot all be counted."""
        key = id(scope)
        if key not in self._names:
            self._names[key] = None  # a query that reaches itself stays unknown
            self._names[key] = self._count_names(scope)
        return self._names[key]

    def _count_names(self, scope) -> list[str | None] | None:
        from sqlglot import exp

        expr = scope.expression
        if isinstance(expr, exp.SetOperation):  # named by its first branch
            return self.names(scope.set_operation_scopes[0]) if scope.set_operation_scopes else None
        if not isinstance(expr, exp.Select):
            return None
        names: list[str | None] = []
        for p in expr.expressions:
            if isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)):
                star = self.star(scope, p)
                if star is None:
                    return None
                names.extend(c for _, c in star)
            else:
                names.append(p.output_name or None)
        return names

    def star(self, scope, p) -> list[tuple[str, str]] | None:
        """(source alias, column) of each column a `*` or `t.*` stands for; None if unknown."""
        from sqlglot import exp

        star = p if isinstance(p, exp.Star) else p.this
        if any(star.args.get(k) for k in ("except", "replace", "rename")):
            return None
        select = scope.expression
        if select.args.get("laterals") or any(isinstance(j.this, exp.Lateral) for j in select.args.get("joins") or []):
            return None
        if isinstance(p, exp.Column):
            aliases = [p.table]
        else:
            if any((j.args.get("method") or "").upper() == "NATURAL" or j.args.get("using") for j in select.args.get("joins") or []):
                return None  # Spark merges the join columns: not a plain concatenation
            aliases = [a for a, (node, _) in scope.selected_sources.items()
                       if not (isinstance(node.parent, exp.Join) and (node.parent.args.get("kind") or "").upper() in ("SEMI", "ANTI"))]
        out = []
        for alias in aliases:
            cols = self.columns_of(scope, alias)
            if cols is None:
                return None
            out.extend((alias, c) for c in cols)
        return out

    def columns_of(self, scope, alias: str) -> list[str] | None:
        """The columns the source `alias` of a scope provides, or None when unknown."""
        from sqlglot import exp
        from sqlglot.optimizer.scope import Scope

        source = scope.sources.get(alias)
        if isinstance(source, Scope):
            names = self.names(source)
            return None if names is None or None in names else names
        if isinstance(source, exp.Table) and not source.args.get("db") and not source.args.get("catalog"):
            return self.catalog.get(source.name.lower())
        return None

    # -- one output column --

    def trace(self, scope, name: str, position: int, seen: set) -> tuple[tuple[tuple[str, str], ...] | None, bool]:
        """The inputs of the column `name` (at `position`) that `scope` selects."""
        from sqlglot import exp

        key = (id(scope), name, position)
        if key in seen:  # a recursive CTE reaching itself
            return None, False
        seen = seen | {key}
        expr = scope.expression
        if isinstance(expr, exp.SetOperation):  # each branch gives its column at the same position
            found: list[tuple[str, str]] = []
            direct = True
            for branch in scope.set_operation_scopes:
                names = self.names(branch)
                if names is None or position >= len(names):
                    return None, False
                inputs, d = self.trace(branch, (names[position] or "").lower(), position, seen)
                if inputs is None:
                    return None, False
                found.extend(inputs)
                direct = direct and d
            return tuple(dict.fromkeys(found)), direct and len(set(found)) == 1
        if not isinstance(expr, exp.Select):
            return None, False
        projection = self.projection(scope, name, position)
        if projection is None:
            return None, False
        if isinstance(projection, tuple):  # a column a `*` stands for
            alias, column = projection
            return self.from_source(scope, alias, column, seen)
        if projection.find(exp.Subquery, exp.Select) is not None:
            return None, False  # a scalar subquery: not followed
        owned = self._owned(scope)
        found, direct = [], isinstance(projection.unalias(), exp.Column)
        for column in projection.find_all(exp.Column):
            if isinstance(column.this, exp.Star):
                return None, False
            if id(column) not in owned:  # a lambda's variable, a struct field access, ...
                continue
            inputs, d = self.resolve(scope, column, seen)
            if inputs is None:
                return None, False
            found.extend(inputs)
            direct = direct and d
        return tuple(dict.fromkeys(found)), direct and len(found) == 1

    def projection(self, scope, name: str, position: int):
        """The select-list expression that makes column `name`, or (alias, column) when a `*`
        makes it; None when unknown."""
        from sqlglot import exp

        at = 0
        for p in scope.expression.expressions:
            if isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)):
                star = self.star(scope, p)
                if star is None:
                    return None
                if at <= position < at + len(star):
                    return star[position - at]
                at += len(star)
            else:
                if at == position and (p.output_name or "").lower() == name:
                    return p
                at += 1
        return None

    def _owned(self, scope) -> set[int]:
        owned = self.owned.get(id(scope))
        if owned is None:
            owned = self.owned[id(scope)] = {id(c) for c in scope.columns}
        return owned

    def resolve(self, scope, column, seen: set) -> tuple[tuple[tuple[str, str], ...] | None, bool]:
        """The inputs behind one column reference of a scope's select list."""
        from sqlglot import exp

        name = column.name.lower()
        if len(column.parts) > 2 or not all(isinstance(p, exp.Identifier) for p in column.parts):
            return None, False
        if column.table:
            alias = next((a for a in scope.sources if a.lower() == column.table.lower()), None)
            return self.from_source(scope, alias, name, seen) if alias is not None else (None, False)
        # unqualified: the one source that has it; with a source of unknown columns, or a
        # select-list alias of the same name (Spark's lateral alias), it is not certain
        selected = list(scope.selected_sources)
        having = [a for a in selected if name in (self.columns_of(scope, a) or ())]
        unknown = [a for a in selected if self.columns_of(scope, a) is None]
        if len(having) == 1 and not unknown:
            return self.from_source(scope, having[0], name, seen)
        if len(selected) == 1 and unknown and not self._is_select_alias(scope, name):
            return self.from_source(scope, selected[0], name, seen)
        return None, False

    def _is_select_alias(self, scope, name: str) -> bool:
        from sqlglot import exp

        return any(isinstance(p, exp.Alias) and p.alias.lower() == name for p in scope.expression.expressions)

    def from_source(self, scope, alias: str, column: str, seen: set) -> tuple[tuple[tuple[str, str], ...] | None, bool]:
        """Column `column` of the source `alias` of a scope: a relation of the project, or a
        CTE or derived table traced further."""
        from sqlglot import exp
        from sqlglot.optimizer.scope import Scope

        source = scope.sources.get(alias)
        if isinstance(source, Scope):
            names = self.names(source)
            if names is None or column not in [n.lower() for n in names if n]:
                return None, False
            return self.trace(source, column, [(n or "").lower() for n in names].index(column), seen)
        if isinstance(source, exp.Table) and not source.args.get("db") and not source.args.get("catalog"):
            relation = source.name.lower()
            known = self.catalog.get(relation)
            if relation not in self.catalog or (known is not None and column not in known):
                return None, False  # not an input of the table, or a column it does not have
            return ((relation, column),), True
        return None, False


class LineageCache:
    """Outcomes by hash of their inputs, in target/ (best effort: a cache that cannot be read
    or written only costs time)."""

    def __init__(self, cache_dir: Path | None):
        self.path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
        self.old: dict[str, Any] = {}
        self.used: dict[str, Any] = {}
        self._salt: str | None = None
        if self.path is not None:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and data.get("version") == LINEAGE_VERSION and isinstance(data.get("entries"), dict):
                    self.old = data["entries"]
            except (OSError, ValueError, RecursionError):
                pass

    def lineage(self, sql: str, catalog: Mapping[str, list[str] | None], tree=None) -> TableLineage:
        if self._salt is None:
            from importlib.metadata import version

            from compiler.cache_key import keyed

            # keyed: outcomes written to target/ by anyone else (a committed file) never match
            self._salt = f"{LINEAGE_VERSION}:{version('sqlglot')}:{keyed('column lineage') or os.urandom(16).hex()}"
        key = hashlib.sha256(json.dumps([self._salt, sql, catalog], sort_keys=True).encode("utf-8")).hexdigest()
        entry = self.used.get(key) or self.old.get(key)
        if entry is not None:
            try:
                out = TableLineage(tuple(ColumnLineage.from_json(c) for c in entry[0]), bool(entry[1]))
                self.used[key] = entry
                return out
            except (TypeError, ValueError):  # a damaged entry: trace again
                pass
        out = table_lineage(sql, catalog, tree)
        self.used[key] = [[c.to_json() for c in out.columns], out.complete]
        return out

    def save(self) -> None:
        if self.path is None or set(self.used) == set(self.old):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{CACHE_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": LINEAGE_VERSION, "entries": self.used}, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass


def plan_lineage(steps: Mapping[str, "Step"], cache: LineageCache, parsed: Mapping[str, Any] | None = None) -> dict[str, TableLineage]:
    """Each table's column lineage, by step id, upstream before downstream: the columns a table's
    SQL selects are what the SQL of the tables reading it sees. `steps`: the plan's sources and
    tables by id, in the plan's (topological) order; `parsed`: SQL text -> its tree, if parsed."""
    parsed = parsed or {}
    known: dict[str, list[str] | None] = {}
    for sid, s in steps.items():
        if s.kind == "ingest":
            declared = _declared(s.config.get("schema"))
            known[sid] = declared if s.config.get("kind") in _DECLARED_READS else None
    out: dict[str, TableLineage] = {}
    for sid, s in steps.items():  # the plan's order is topological
        if s.kind != "write":
            continue
        declared = _declared(s.config.get("schema"))
        if s.sql:
            catalog = {steps[d].name.lower(): known.get(d) for d in s.depends_on if d in steps}
            catalog.setdefault(s.name.lower(), declared)  # {{ this }}: the table as stored
            out[sid] = cache.lineage(s.sql, catalog, parsed.get(s.sql))
        names = out[sid].names if sid in out else None
        known[sid] = list(names) if names is not None else declared
    return out


def _declared(schema) -> list[str] | None:
    return [c["name"] for c in schema] if schema else None


class ColumnGraph:
    """Which tables' columns are computed from which: `downstream(table, column)` follows a
    column through every table that reads it (by ref(), or through a `kind: table` source, whose
    columns are the table's), as far as lineage traces. Names are compared lower-case."""

    def __init__(self, steps: Mapping[str, "Step"], lineages: Mapping[str, TableLineage]):
        by_name = {s.name.lower(): s for s in steps.values()}
        self._edges: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        for sid, table in lineages.items():
            name = steps[sid].name
            for col in table.columns:
                for relation, column in col.inputs or ():
                    src = by_name.get(relation)
                    if src is not None and src.kind == "ingest" and src.config.get("kind") == "table" and src.config.get("table"):
                        relation = str(src.config["table"]).lower()
                    if relation != name.lower():  # {{ this }}: the table's own stored rows
                        self._edges[(relation, column.lower())].add((name, col.column))

    def downstream(self, table: str, column: str) -> tuple[str, ...]:
        """`table.column` names of every column computed, directly or further down, from `column`
        of `table`, sorted."""
        seen: set[tuple[str, str]] = set()
        todo = [(table.lower(), column.lower())]
        while todo:
            for nxt in self._edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt[0].lower(), nxt[1].lower()))
        return tuple(sorted(f"{t}.{c}" for t, c in seen))
