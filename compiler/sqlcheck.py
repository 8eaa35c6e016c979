"""The SQL of every table checked without Spark: parsed with sqlglot (Spark dialect), then its
column references resolved against what is known of its inputs.

Known columns come from a source's declared `schema:`, a table's declared `schema:`, and the
select list of an upstream table's own SQL when every column of it can be named (so a chain of
tables over declared sources is checked end to end). A table's key, partition_by and precombine
columns must be among the columns its SQL selects.

The check is conservative: it reports only what Spark would certainly refuse. A relation whose
columns are unknown (no schema, a `kind: table` source, a table function, a lateral view, a pivot,
a `select *` over something unknown, ...) switches the column check off for the names it could
provide, and anything sqlglot cannot analyse is left to Spark at run time.

Findings are computed in the coordinates of the rendered SQL and then mapped back to the .sql
file (`map_position`): lines that Jinja left alone map exactly, lines it changed map to the
most similar line of the template. Parsing costs about a millisecond and a half per table, so the
outcome of each table's check is kept in `target/sql_check_cache.json`, keyed by a hash of
everything it depends on (the rendered SQL, the columns of its inputs, the versions of sqlglot
and of this check)."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from compiler.columns import CDC_COLUMNS, KAFKA_COLUMNS, avro_name_problem
from compiler.errors import Collector, Location, did_you_mean
from compiler.project import Project, Table
from compiler.render import ENV_PLACEHOLDER_RE, RenderedTable

# Bump when the check changes what it reports, so that cached outcomes are not reused.
CHECK_VERSION = 1
CACHE_FILE = "sql_check_cache.json"
_MAX_CACHE_ENTRIES = 20000
# Tests set this to see a failure of the column analysis, which users never see (Spark judges).
RAISE_ANALYSIS_ERRORS = False
# The trees `analyse` parsed, by SQL text, while `keep_parsed()` is active: `pipe docs` traces
# column lineage on them instead of parsing every table's SQL a second time.
_kept: dict[str, Any] | None = None


@contextlib.contextmanager
def keep_parsed():
    """Within the block, every tree `analyse` parses is kept in the dict it yields (sqlglot's
    trees, by the SQL text; the check does not change them)."""
    global _kept
    _kept = {}
    try:
        yield _kept
    finally:
        _kept = None

# Columns Spark resolves without any declared schema: file metadata of file-based reads, and
# Hudi's meta columns (not selected by pipe's reads, but left to Spark to judge).
_HIDDEN_PREFIXES = ("_metadata", "_hoodie_")


# --- what a check finds ------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A problem at a 1-based line and column of the rendered SQL."""

    line: int
    col: int | None
    message: str
    hint: str | None = None

    def to_json(self) -> list:
        return [self.line, self.col, self.message, self.hint]

    @classmethod
    def from_json(cls, v: list) -> "Finding":
        line, col, message, hint = v
        if not (type(line) is int and line > 0 and (col is None or type(col) is int) and isinstance(message, str)
                and (hint is None or isinstance(hint, str))):
            raise TypeError("not a finding")
        return cls(line, col, message, hint)


@dataclass(frozen=True)
class Outcome:
    """The check of one rendering of a table's SQL."""

    findings: tuple[Finding, ...]
    columns: tuple[str, ...] | None  # the columns the SQL selects, when every one has a name


# --- entry point -------------------------------------------------------------------------------


def check_sql(project: Project, rendered: Mapping[str, RenderedTable], order: Iterable[str], errors: Collector,
              cache_dir: Path | None = None, cache_write: bool = True) -> dict[str, tuple[str, ...] | None]:
    """Checks the SQL of every table, upstream before downstream (`order`: table names in
    dependency order), and returns each table's known output columns."""
    cache = _Cache(cache_dir, cache_write)
    known: dict[str, tuple[str, ...] | None] = {}
    source_cols = {name.lower(): _source_columns(s) for name, s in project.sources.items()}
    for name in order:
        table = project.tables.get(name)
        r = rendered.get(name)
        if table is None or r is None or r.sql is None or table.sql_file is None or r.failed:
            known[name] = _declared(table.columns) if table is not None else None
            continue
        catalog: dict[str, list[str] | None] = {}
        for src in sorted(r.sources):
            catalog[src.lower()] = source_cols.get(src.lower())
        for ref in sorted(r.refs):
            catalog[ref.lower()] = list(known[ref]) if known.get(ref) is not None else None
        # {{ this }}: the table as stored, whose columns are its declared ones if any
        catalog.setdefault(name.lower(), _declared(table.columns))
        outcomes = [cache.get_or_check(sql, catalog) for sql in (r.sql, r.sql_full_refresh) if sql is not None]
        for sql, outcome in zip((r.sql, r.sql_full_refresh), outcomes):
            for f in outcome.findings:
                line, col, exact = map_position(table.sql_text, sql, f.line, f.col)
                hint = f.hint
                if not exact:  # show what Spark would see on that line
                    shown = sql.split("\n")[f.line - 1].strip() if 0 < f.line <= sql.count("\n") + 1 else ""
                    hint = (hint + " " if hint else "") + f"(the line as rendered: {shown[:160]})"
                errors.error(Location(table.sql_file, line, col), f.message, hint)
        cols = {o.columns for o in outcomes}
        inferred = outcomes[0].columns if len(cols) == 1 else None
        _check_table_columns(table, inferred, errors)
        if not table.columns:  # declared columns: validate.py checks their names
            _check_avro_names(table, inferred, errors)
        _check_delete_when(table, r, inferred, cache, errors)
        known[name] = inferred if inferred is not None else _declared(table.columns)
    cache.save()
    return known


def _declared(columns) -> list[str] | None:
    return [c["name"] for c in columns] if columns else None


def _source_columns(source) -> list[str] | None:
    """The columns a source offers, when its declaration says them all (else None: unknown)."""
    declared = _declared(source.columns)
    if source.kind in ("files", "s3_incremental"):
        return declared
    if source.kind == "kafka":
        declared = declared or [c["name"] for c in source.config.get("captured_schema") or []] or None  # a fan-out's table
        if declared:
            return declared + (list(CDC_COLUMNS) if str(source.config.get("format")).lower() in ("debezium", "dms") else []) + list(KAFKA_COLUMNS)
    return None


def _check_table_columns(table: Table, selected: tuple[str, ...] | None, errors: Collector) -> None:
    """key, partition_by and precombine name columns the table's SQL selects; reported at the
    YAML line of the setting (the name is what the user mistyped)."""
    if selected is None:
        return
    c = table.config
    op = c["operation"]
    wanted = {"key": c["key"], "partition_by": c["partition_by"], "precombine": [c["precombine"]] if c["precombine"] else []}
    if op == "delete_partition":
        wanted = {"partition_by": c["partition_by"]}
    elif op == "delete":
        wanted = {"key": c["key"]}
    elif op in ("insert_overwrite", "insert_overwrite_table"):
        wanted.pop("precombine")
    lower = {s.lower() for s in selected}
    declared = {x["name"].lower() for x in table.columns} if table.columns else None
    for setting, names in wanted.items():
        for i, col in enumerate(names):
            if col.lower() in lower or col.startswith("_hoodie_"):
                continue
            if declared is not None and col.lower() not in declared:
                continue  # validate.py reports it against the declared schema
            hint = did_you_mean(col, selected) or "columns it selects: " + ", ".join(selected)
            errors.error(_item_at(table, setting, i), f"{setting} column '{col}' of table '{table.name}' is not selected by {table.sql_file}", hint)


def _check_avro_names(table: Table, selected: tuple[str, ...] | None, errors: Collector) -> None:
    """The columns the SQL selects become Avro field names; reported where the SQL names them
    (the first place the name appears in the file), or at the file when a `*` brings them."""
    for name in selected or ():
        problem = avro_name_problem(name, f"table '{table.name}'")
        if problem is None:
            continue
        at = table.sql_text.find(name)
        line, col = _line_col(table.sql_text, at) if at >= 0 else (None, None)
        errors.error(Location(table.sql_file, line, col), *problem)


def _check_delete_when(table: Table, r: RenderedTable, selected: tuple[str, ...] | None, cache: "_Cache", errors: Collector) -> None:
    """delete_when is a predicate over the rows the SQL selects: its syntax, and its columns
    when those are known; reported at the YAML value."""
    predicate = r.config.get("delete_when")
    if not isinstance(predicate, str) or not predicate.strip() or "${env:" in predicate:
        return
    sql = f"select * from `{table.name}` where\n{predicate}\n"
    outcome = cache.get_or_check(sql, {table.name.lower(): list(selected) if selected is not None else None})
    for f in outcome.findings:
        errors.error(table.at("delete_when"), f"delete_when of table '{table.name}': {f.message}", f.hint)


def _item_at(table: Table, key: str, index: int) -> Location:
    return table.at(key, index) if isinstance(table.doc.value_at(table.path + (key,)), list) else table.at(key)


# --- the cache ---------------------------------------------------------------------------------


class _Cache:
    """Outcomes by hash of their inputs, read from and written to cache_dir (best effort: a
    cache that cannot be read or written only costs time)."""

    def __init__(self, cache_dir: Path | None, write: bool = True):
        self.path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
        self.write = write
        self.old: dict[str, Any] = {}
        self.used: dict[str, Any] = {}
        self.changed = False
        self._salt: str | None = None
        if self.path is not None:
            try:
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f)
                if isinstance(data, dict) and isinstance(data.get("entries"), dict):
                    self.old = data["entries"]
            except (OSError, ValueError, RecursionError):
                pass

    def salt(self) -> str:
        if self._salt is None:
            from importlib.metadata import version

            from compiler.cache_key import keyed

            # keyed: outcomes written to target/ by anyone else (a committed file) never match
            self._salt = f"{CHECK_VERSION}:{version('sqlglot')}:{keyed('sql checks') or os.urandom(16).hex()}"
        return self._salt

    def get_or_check(self, sql: str, catalog: Mapping[str, list[str] | None]) -> Outcome:
        key = hashlib.sha256(json.dumps([self.salt(), sql, catalog], sort_keys=True).encode("utf-8")).hexdigest()
        entry = self.used.get(key) or self.old.get(key)
        outcome = None
        if entry is not None:
            try:
                columns = entry[1]
                if columns is not None and not all(isinstance(c, str) for c in columns):
                    raise TypeError("not columns")
                outcome = Outcome(tuple(Finding.from_json(f) for f in entry[0]), tuple(columns) if columns is not None else None)
            except (TypeError, ValueError, IndexError, KeyError):  # a damaged cache: check again
                outcome = None
        if outcome is None:
            outcome = analyse(sql, catalog)
            self.changed = True
        self.used[key] = [[f.to_json() for f in outcome.findings], list(outcome.columns) if outcome.columns is not None else None]
        return outcome

    def save(self) -> None:
        if self.path is None or not self.write or not (self.changed or set(self.used) != set(self.old)):
            return
        entries = dict(self.used)
        for k, v in self.old.items():  # keep outcomes of other targets and vars, up to a bound
            if len(entries) >= max(_MAX_CACHE_ENTRIES, 2 * len(self.used)):
                break
            entries.setdefault(k, v)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{CACHE_FILE}.{os.getpid()}.tmp")
            # json.dumps, not json.dump: a stream is encoded in pure Python, a string by the C encoder (6x faster)
            tmp.write_text(json.dumps({"version": CHECK_VERSION, "entries": entries}, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass


# --- the analysis of one SQL text --------------------------------------------------------------


def analyse(sql: str, catalog: Mapping[str, list[str] | None]) -> Outcome:
    """Parses `sql` and checks its column references. `catalog` maps lower-case relation
    names (as ref() and source() render them) to their columns, or None when unknown."""
    import sqlglot
    from sqlglot import errors as sqlerrors

    # env_var() placeholders are resolved by the runtime; an identifier of the same length
    # keeps every position in place and is never reported
    text = ENV_PLACEHOLDER_RE.sub(lambda m: "_" * len(m.group(0)), sql)
    dialect = sqlglot.Dialect.get_or_raise("spark")
    try:
        tokens = dialect.tokenizer_class(dialect=dialect).tokenize(text)
    except sqlerrors.TokenError as exc:
        return Outcome((_token_finding(text, exc),), None)
    except Exception:  # noqa: BLE001 - what sqlglot cannot read is left to Spark
        return Outcome((), None)
    if not any(t.token_type.name != "SEMICOLON" for t in tokens):
        return Outcome((Finding(1, None, "the SQL holds no statement (only comments or nothing)",
                                "write the SELECT that produces the table's rows"),), None)
    try:
        trees = dialect.parser().parse(tokens, text)
    except sqlerrors.ParseError as exc:
        return Outcome((_parse_finding(text, exc),), None)
    except Exception:  # noqa: BLE001 - e.g. RecursionError on very deep nesting: Spark judges
        return Outcome((), None)
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        return Outcome((), None)
    if _kept is not None:
        _kept[sql] = trees[0]
    try:
        return _Resolver(text, catalog).run(trees[0])
    except Exception:  # noqa: BLE001 - an analysis sqlglot cannot do is no finding
        if RAISE_ANALYSIS_ERRORS:
            raise
        return Outcome((), None)


def _line_col(text: str, offset: int) -> tuple[int, int]:
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _token_finding(text: str, exc) -> Finding:
    # the inner error names the position: the cause in pure-Python sqlglot, the context in its
    # compiled build (sqlglotc raises without `from`)
    cause = str(exc.__cause__ or exc.__context__ or "")
    m = re.search(r"Missing (.+) from \d+:(\d+)", cause)
    if m:
        line, col = _line_col(text, int(m.group(2)))
        what = {"'": "string", '"': "string", "`": "quoted name", "*/": "comment"}.get(m.group(1), "quoted text")
        return Finding(line, col, f"SQL syntax error: {what} is not closed (no {m.group(1)} after it)", f"close it with {m.group(1)}")
    start = getattr(exc, "start", None) or 0
    line, col = _line_col(text, start)
    return Finding(line, None, "SQL syntax error: the SQL cannot be split into tokens near here", "look for unbalanced quotes")


def _parse_finding(text: str, exc) -> Finding:
    err = (exc.errors or [{}])[0]
    line = err.get("line") or 1
    col = err.get("col")
    highlight = err.get("highlight") or ""
    if isinstance(col, int) and highlight and "\n" not in highlight:
        col = max(1, col - len(highlight) + 1)  # sqlglot points at the token's last character
    elif not isinstance(col, int):
        col = None
    description = (err.get("description") or "invalid SQL").rstrip(".")
    description = re.sub(r"Required keyword: '(\w+)' missing for <class 'sqlglot\.expressions\.[\w.]*?(\w+)'>",
                         lambda m: f"incomplete {m.group(2).upper()} clause" if m.group(2) in _CLAUSES else "incomplete expression", description)
    near = f" near '{highlight}'" if highlight and len(highlight) <= 40 else ""
    return Finding(line, col, f"SQL syntax error{near}: {description}", "Spark would refuse this SQL; check the words and brackets here")


_CLAUSES = ("Where", "Having", "Group", "Order", "Limit", "Join", "From", "Select", "Qualify", "Window", "With")


class _ScopeInfo:
    __slots__ = ("sources", "aliases", "open")

    def __init__(self, sources: dict[str, list[str] | None], aliases: set[str], open_: bool):
        self.sources = sources  # lower-case alias -> lower-case columns or None
        self.aliases = aliases  # lower-case names of select-list aliases
        self.open = open_  # names may come from somewhere unknown

    def has_column(self, name: str) -> bool:
        return any(cols is not None and name in cols for cols in self.sources.values())


class _Resolver:
    def __init__(self, text: str, catalog: Mapping[str, list[str] | None]):
        self.text = text
        self.catalog = catalog
        self.outputs: dict[int, list[str] | None] = {}
        self.infos: dict[int, _ScopeInfo] = {}
        self.findings: list[Finding] = []

    def run(self, tree) -> Outcome:
        from sqlglot import exp
        from sqlglot.optimizer.scope import traverse_scope

        if not isinstance(tree, exp.Query):
            return Outcome((), None)
        scopes = list(traverse_scope(tree))  # children before their parents
        owner: dict[int, Any] = {}
        for scope in scopes:
            for column in scope.columns:
                owner.setdefault(id(column), scope)
        root = scopes[-1] if scopes else None
        for scope in scopes:
            if not isinstance(scope.expression, exp.Select):
                continue
            for column in scope.columns:
                if owner.get(id(column)) is scope:
                    self._check(scope, column)
        columns = self._output(root) if root is not None else None
        display = None
        if columns is not None:
            display = tuple(self._display_names(root))
        return Outcome(tuple(self.findings), display)

    # -- what a scope provides --

    def _info(self, scope) -> _ScopeInfo:
        info = self.infos.get(id(scope))
        if info is not None:
            return info
        from sqlglot import exp
        from sqlglot.optimizer.scope import Scope

        select = scope.expression
        sources: dict[str, list[str] | None] = {}
        open_ = not isinstance(select, exp.Select)
        named = dict((alias, source) for alias, (_node, source) in scope.selected_sources.items())
        if isinstance(select, exp.Select):  # semi and anti joins select nothing but are named in ON
            for join in select.args.get("joins") or []:
                alias = join.this.alias_or_name
                if alias and alias not in named and alias in scope.sources:
                    named[alias] = scope.sources[alias]
        for alias, source in named.items():
            cols = self._source_columns(source)
            sources[alias.lower()] = cols
            if cols is None:
                open_ = True
            if isinstance(source, Scope) and not isinstance(source.expression, (exp.Select, exp.SetOperation)):
                open_ = True  # a lateral view, a table function
        if isinstance(select, exp.Select):
            if select.args.get("laterals") or any(isinstance(j.this, exp.Lateral) for j in select.args.get("joins") or []):
                open_ = True
            if any(node.parent_select is select for node in select.find_all(exp.Pivot, exp.Unnest, exp.Values, exp.Lateral)):
                open_ = True
        aliases = set()
        if isinstance(select, exp.Select):
            for p in select.expressions:
                if isinstance(p, exp.Alias):
                    aliases.add(p.alias.lower())
                elif isinstance(p, exp.Aliases):
                    aliases.update(a.name.lower() for a in p.expressions)
        info = _ScopeInfo(sources, aliases, open_)
        self.infos[id(scope)] = info
        return info

    def _source_columns(self, source) -> list[str] | None:
        from sqlglot import exp
        from sqlglot.optimizer.scope import Scope

        if isinstance(source, Scope):
            return self._output(source)
        if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier) and not source.args.get("db") \
                and not source.args.get("pivots") and not source.args.get("catalog"):
            cols = self.catalog.get(source.name.lower())
            return [c.lower() for c in cols] if cols is not None else None
        return None

    def _output(self, scope) -> list[str] | None:
        """Lower-case names of the columns a scope selects, or None when any is unknown."""
        key = id(scope)
        if key in self.outputs:
            return self.outputs[key]
        self.outputs[key] = None  # a query that reaches itself stays unknown
        names = self._names(scope)
        self.outputs[key] = [n.lower() for n in names] if names is not None else None
        return self.outputs[key]

    def _display_names(self, scope) -> list[str]:
        return self._names(scope) or []

    def _names(self, scope) -> list[str] | None:
        from sqlglot import exp

        expr = scope.expression
        if isinstance(expr, exp.SetOperation):
            branches = getattr(scope, "set_operation_scopes", None) or getattr(scope, "union_scopes", None)
            return self._names(branches[0]) if branches else None
        if not isinstance(expr, exp.Select):
            return None
        names: list[str] = []
        for p in expr.expressions:
            if isinstance(p, exp.Star):
                if p.args.get("except") or p.args.get("replace") or p.args.get("rename"):
                    return None
                star = self._star(scope, expr)
                if star is None:
                    return None
                names.extend(star)
            elif isinstance(p, exp.Column) and isinstance(p.this, exp.Star):
                if p.this.args.get("except") or p.this.args.get("replace") or len(p.parts) != 2:
                    return None
                alias = p.table.lower()
                source = scope.selected_sources.get(alias) or next((v for k, v in scope.selected_sources.items() if k.lower() == alias), None)
                if source is None:
                    return None
                cols = self._source_display(source[1])
                if cols is None:
                    return None
                names.extend(cols)
            elif isinstance(p, exp.Aliases):
                names.extend(a.name for a in p.expressions)
            else:
                name = p.output_name
                if not name or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)):
                    return None
                names.append(name)
        return names

    def _source_display(self, source) -> list[str] | None:
        from sqlglot import exp
        from sqlglot.optimizer.scope import Scope

        if isinstance(source, Scope):
            return self._names(source)
        if isinstance(source, exp.Table) and self._source_columns(source) is not None:
            return list(self.catalog[source.name.lower()])
        return None

    def _star(self, scope, select) -> list[str] | None:
        """The columns of `select *`: FROM then each join, as Spark orders them."""
        from sqlglot import exp

        if select.args.get("laterals") or self._info(scope).open:
            return None
        frm = select.args.get("from_") or select.args.get("from")
        if frm is None:
            return None

        def cols_of(node) -> list[str] | None:
            alias = node.alias_or_name
            source = scope.selected_sources.get(alias)
            return self._source_display(source[1]) if source is not None else None

        cols = cols_of(frm.this)
        if cols is None:
            return None
        for join in select.args.get("joins") or []:
            kind = (join.args.get("kind") or "").upper()
            if (join.args.get("method") or "").upper() == "NATURAL":
                return None
            right = cols_of(join.this)
            if kind in ("SEMI", "ANTI"):
                continue
            if right is None:
                return None
            using = join.args.get("using")
            if using:
                u = [i.name for i in using]
                ul = {x.lower() for x in u}
                cols = [c for c in cols if c.lower() in ul][: len(u)] + [c for c in cols if c.lower() not in ul] + [c for c in right if c.lower() not in ul]
            else:
                cols = cols + right
        return cols

    # -- one column reference --

    def _check(self, scope, column) -> None:
        from sqlglot import exp
        from sqlglot.optimizer.scope import ScopeType

        if isinstance(column.this, exp.Star):
            return
        parts = column.parts
        if len(parts) > 2 or not all(isinstance(p, exp.Identifier) for p in parts):
            return
        name = column.name.lower()
        if not name or set(name) == {"_"} or name.startswith(_HIDDEN_PREFIXES):
            return
        qualifier = column.table.lower() if len(parts) == 2 else None
        if qualifier is not None and (set(qualifier) == {"_"} or qualifier.startswith(_HIDDEN_PREFIXES)):
            return
        s = scope
        candidates: list[str] = []
        relations: list[str] = []
        while s is not None:
            if isinstance(s.expression, exp.Select):
                info = self._info(s)
                if qualifier is None:
                    if name in info.aliases or info.has_column(name) or info.open:
                        return
                    for alias, cols in info.sources.items():
                        candidates.extend(cols or [])
                        relations.append(alias)
                    candidates.extend(info.aliases)
                else:
                    if qualifier in info.sources:
                        cols = info.sources[qualifier]
                        if cols is None or name in cols or info.open or info.has_column(qualifier):
                            return
                        ident = column.args["this"]
                        self._report(ident, f"column '{column.name}' is not a column of {self._label(s, qualifier)}",
                                     did_you_mean(name, cols) or "its columns: " + ", ".join(self._display(s, qualifier) or cols))
                        return
                    if info.has_column(qualifier) or qualifier in info.aliases or info.open:
                        return  # a struct's field
                    relations.extend(info.sources)
            # only subqueries (and lateral ones) see the columns of the query around them; a
            # branch of a set operation is judged as the set operation is
            if s.scope_type in (ScopeType.ROOT, ScopeType.CTE, ScopeType.DERIVED_TABLE):
                break
            s = s.parent
        if qualifier is None:
            hint = did_you_mean(name, candidates) or ("columns here: " + ", ".join(sorted(set(candidates))) if candidates else None)
            names = [f"'{r}'" for r in dict.fromkeys(relations)]
            where = (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]) if names else "anything (the query reads no relation)"
            self._report(column.args["this"], f"unknown column '{column.name}': not a column of {where}", hint)
        else:
            hint = did_you_mean(qualifier, relations) or ("relations here: " + ", ".join(sorted(set(relations))) if relations else None)
            self._report(column.args["table"], f"unknown name '{column.table}' in '{column.table}.{column.name}': no relation or column is called '{column.table}'", hint)

    def _label(self, scope, alias: str) -> str:
        source = next((v[1] for k, v in scope.selected_sources.items() if k.lower() == alias), None)
        from sqlglot import exp

        if isinstance(source, exp.Table) and source.name.lower() != alias:
            return f"'{alias}' ({source.name})"
        return f"'{alias}'"

    def _display(self, scope, alias: str) -> list[str] | None:
        source = next((v[1] for k, v in scope.selected_sources.items() if k.lower() == alias), None)
        return self._source_display(source) if source is not None else None

    def _report(self, node, message: str, hint: str | None) -> None:
        meta = getattr(node, "meta", None) or {}
        start = meta.get("start")
        if isinstance(start, int):
            line, col = _line_col(self.text, start)
        else:
            line, col = meta.get("line") or 1, None
        self.findings.append(Finding(line, col, message, hint))


# --- positions in the rendered SQL back to the template ----------------------------------------


def map_position(template: str, rendered: str, line: int, col: int | None) -> tuple[int, int | None, bool]:
    """(line, column, exact): where in `template` rendered `line`:`col` comes from. The column
    is None when it cannot be told; `exact` is False when Jinja changed that line.

    Lines the template renders unchanged map exactly. A line Jinja changed maps to the most
    similar template line among those the change came from, and its column through the
    characters both share; a line Jinja added (a macro's body) maps to the line before it."""
    if template == rendered:
        return line, col, True
    src = template.split("\n")
    out = rendered.split("\n")
    r = min(max(line - 1, 0), len(out) - 1)
    matcher = difflib.SequenceMatcher(None, src, out, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if not j1 <= r < j2:
            continue
        if tag == "equal":
            return i1 + (r - j1) + 1, col, True
        if tag == "insert" or i1 == i2:
            return max(i1, 1), None, False
        best = max(range(i1, i2), key=lambda i: (difflib.SequenceMatcher(None, src[i], out[r], autojunk=False).ratio(), -abs((i - i1) - (r - j1))))
        return best + 1, _map_col(src[best], out[r], col), False
    return max(1, min(line, len(src))), None, False


def _map_col(src_line: str, out_line: str, col: int | None) -> int | None:
    if col is None:
        return None
    c = col - 1
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, src_line, out_line, autojunk=False).get_opcodes():
        if j1 <= c < j2:
            return (i1 + (c - j1) if tag == "equal" else i1) + 1
    return None
