"""Data tests: the checks declared on tables and sources (`columns: [{name, tests}]` and `tests:`
in tables/*.yml and sources/*.yml, the shape dbt uses) and the singular tests in tests/*.sql,
read into DataTests, each with the SQL that returns its failing rows. Besides the built-in
generic tests (GENERIC), a project may write its own as dbt does, `{% test name(model, ...) %}` in
tests/generic/*.sql (rendered by compiler/render.py, once per use, into the plan).

Every DataTest becomes a `test` step of the plan, after the table or source it checks
(runtime/steps/test.py runs it). A test's SQL names tables and sources as the views the runtime
registers for them (render.relation), so the runtime decides what a view holds: the whole table,
or only the rows a build just wrote."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from compiler.errors import Collector, Location, did_you_mean
from compiler.project import Node, Project, Source
from compiler.render import GenericTestDef, relation
from compiler.schema import NAME_RE, type_name

GENERIC = ("unique", "not_null", "accepted_values", "relationships", "expression")
SEVERITIES = ("error", "warn")
# test arguments beyond the settings every test takes; `column` only at table level
_ARGS = {
    "unique": ("column", "columns"),
    "not_null": ("column",),
    "accepted_values": ("column", "values"),
    "relationships": ("column", "to", "field"),
    "expression": ("column", "expression"),
}
_REQUIRED = {"accepted_values": ("values",), "relationships": ("to", "field"), "expression": ("expression",)}
SETTINGS = ("name", "description", "severity", "warn_if", "error_if", "where", "store_failures", "limit", "fail_calc")
# names a generic test of the project's own cannot take: the built-ins, and the kind of a tests/*.sql file
RESERVED = GENERIC + ("sql",)
GENERIC_FOLDER = "tests/generic"
FAILURES_SUFFIX = "__failures"  # store_failures: the failing rows of test x go to table x__failures
DEFAULT_FAIL_CALC = "count(*)"
# a number, negative or with decimals too: with fail_calc the value compared may be a sum of amounts
_THRESHOLD = re.compile(r"^\s*(==|=|!=|<>|>=|<=|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")
_TARGET = re.compile(r"""^\s*(ref|source)\(\s*['"]([^'"]+)['"]\s*\)\s*$""")
# sources whose whole data a test can read (a queue cannot be read again once consumed)
TESTABLE_SOURCES = ("files", "table")


@dataclass(frozen=True)
class DataTest:
    name: str
    test: str  # a GENERIC kind, or "sql" for a tests/*.sql file
    model: str | None  # the table or source it is declared on (None: a tests/*.sql file)
    model_kind: str | None  # "table" | "source"
    location: Location
    columns: tuple[str, ...] = ()
    args: Mapping[str, Any] = field(default_factory=dict)
    severity: str = "error"
    warn_if: str = "!= 0"
    error_if: str = "!= 0"
    where: str | None = None
    description: str = ""
    sql: str = ""
    sql_file: str | None = None
    refs: tuple[str, ...] = ()  # tables and sources its SQL reads, besides the model
    sources: tuple[str, ...] = ()
    env_vars: Mapping[str, str | None] = field(default_factory=dict)
    store_failures: bool = False
    limit: int | None = None  # at most this many failing rows are counted and stored
    fail_calc: str = DEFAULT_FAIL_CALC  # the aggregate over the failing rows that warn_if/error_if compare
    template: str | None = None  # a generic test of the project's own: its tests/generic/*.sql file

    def config(self) -> dict[str, Any]:
        """What the plan keeps of the test (its behaviour, fingerprinted with the SQL)."""
        out: dict[str, Any] = {"test": self.test, "severity": self.severity, "warn_if": self.warn_if, "error_if": self.error_if}
        if self.model is not None:
            out.update(model=self.model, model_kind=self.model_kind)
        if self.columns:
            out["columns"] = list(self.columns)
        if self.where:
            out["where"] = self.where
        if self.template:  # its arguments apart: their names are the template's, and may be any
            out.update(template=self.template, args=dict(self.args))
        else:
            out.update({k: v for k, v in self.args.items() if k not in ("column", "columns")})
        # only when set: the fingerprints of the tests without them stay as they were
        if self.store_failures:
            out["store_failures"] = True
        if self.limit is not None:
            out["limit"] = self.limit
        if self.fail_calc != DEFAULT_FAIL_CALC:
            out["fail_calc"] = self.fail_calc
        return out


def threshold_holds(condition: str, failures: int | float) -> bool:
    """Whether `failures` meets a dbt-style condition such as `!= 0` or `> 10`."""
    m = _THRESHOLD.match(condition)
    op, n = m.group(1), float(m.group(2)) if "." in m.group(2) else int(m.group(2))
    return {"==": failures == n, "=": failures == n, "!=": failures != n, "<>": failures != n, ">=": failures >= n,
            "<=": failures <= n, ">": failures > n, "<": failures < n}[op]


# --- reading the YAML ------------------------------------------------------------------------------

def read_declared(project: Project, errors: Collector, renderer=None) -> list[DataTest]:
    """The generic tests declared on every table and source, in file order, named. `renderer`
    (compiler/render.Renderer) renders the uses of the project's own generic tests."""
    own = read_generic(project, renderer, errors) if renderer is not None else {}
    found: list[DataTest] = []
    for node, kind in [*((s, "source") for s in project.sources.values()), *((t, "table") for t in project.tables.values())]:
        _Reader(project, node, kind, errors, found, own, renderer).read()
    return found


def read_generic(project: Project, renderer, errors: Collector) -> dict[str, GenericTestDef]:
    """The generic tests of tests/generic/*.sql by name; one named as a built-in is refused
    (a YAML `- unique` would otherwise mean one thing or the other)."""
    files = []
    for rel in project.files.listing(GENERIC_FOLDER, (".sql",)):
        text = project.files.text(rel, errors)
        if text is not None:
            files.append((rel, text))
    out = {}
    for d in renderer.load_generic_tests(files):
        if d.name in RESERVED:
            errors.error(d.location, f"generic test '{d.name}' has the name of pipe's built-in test '{d.name}'",
                         "rename it: built-in tests are " + ", ".join(GENERIC))
            continue
        out[d.name] = d
    return out


class _Reader:
    def __init__(self, project: Project, node: Node, kind: str, errors: Collector, out: list[DataTest],
                 own: Mapping[str, GenericTestDef] | None = None, renderer=None):
        self.project, self.node, self.kind, self.errors, self.out = project, node, kind, errors, out
        self.own, self.renderer = own or {}, renderer
        self.what = f"{kind} '{node.name}'"

    def read(self) -> None:
        body = self.node.doc.value_at(self.node.path)
        if not isinstance(body, dict):
            return
        columns = body.get("columns")
        if columns is not None:
            self._columns(columns)
        tests, key = _tests_of(body, self.node, (), self.errors, self.what)
        for i, item in enumerate(tests or []):
            self._test(item, (key, i), column=None)

    def _columns(self, columns: Any) -> None:
        path = ("columns",)
        if not isinstance(columns, list):
            self.errors.error(self.node.at(*path), f"'columns' of {self.what} must be a list of `- name: column` entries, not {type_name(columns)}",
                              "write it as dbt does: `columns:` then `- name: order_id` with `tests: [unique, not_null]` under it")
            return
        seen: dict[str, int] = {}
        for i, entry in enumerate(columns):
            at = path + (i,)
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                self.errors.error(self.node.at(*at), f"each entry of 'columns' in {self.what} needs `name: <column>`",
                                  "e.g. `- name: order_id` with `tests: [unique]` under it")
                continue
            for key in entry:
                if key not in ("name", "description", "tests", "data_tests"):
                    self.errors.error(self.node.doc.at(self.node.path + at + (key,), key=True), f"unknown key '{key}' in column '{entry['name']}' of {self.what}",
                                      did_you_mean(str(key), ("name", "description", "tests", "data_tests")) or "a column takes name, description and tests")
            name = entry["name"]
            if name.lower() in seen:
                self.errors.error(self.node.at(*at), f"column '{name}' is listed twice in 'columns' of {self.what}", "list each column once, with all its tests")
                continue
            seen[name.lower()] = i
            tests, key = _tests_of(entry, self.node, at, self.errors, f"column '{name}' of {self.what}")
            for j, item in enumerate(tests or []):
                self._test(item, at + (key, j), column=name)

    def _test(self, item: Any, at: tuple, column: str | None) -> None:
        where = self.node.at(*at)
        if isinstance(item, str):
            test, args, args_at = item, {}, at
        elif isinstance(item, dict) and len(item) == 1:
            test, args = next(iter(item.items()))
            args_at = at + (test,)
            if test == "expression" and isinstance(args, str):
                args = {"expression": args}
            elif args is None:
                args = {}
            elif not isinstance(args, dict):
                self.errors.error(self.node.at(*args_at), f"the settings of test '{test}' on {self.what} must be a mapping, not {type_name(args)}",
                                  "e.g. `- accepted_values: {values: [a, b]}`")
                return
        else:
            self.errors.error(where, f"a test on {self.what} is a test name (`- unique`) or a mapping of one test name to its settings, not {type_name(item)}",
                              "e.g. `- not_null` or `- accepted_values: {values: [placed, shipped]}`")
            return
        if test not in GENERIC and test not in self.own:
            hint = did_you_mean(str(test), [*GENERIC, *self.own]) or ""
            own = f"; your own: {', '.join(sorted(self.own))}" if self.own else ""
            self.errors.error(where, f"unknown test '{test}' on {self.what}",
                              (hint + " " if hint else "") + f"tests: {', '.join(GENERIC)}{own}; define a generic test in "
                              f"{GENERIC_FOLDER}/<name>.sql, or a test of its own SQL in tests/<name>.sql")
            return
        args = self._flatten_config(test, args, args_at)
        if test in self.own:
            self._own_test(test, args, args_at, where, column)
            return
        ok = True
        for key in args:
            if key not in _ARGS[test] + SETTINGS:
                hint = did_you_mean(str(key), _ARGS[test] + SETTINGS)
                self.errors.error(self.node.doc.at(self.node.path + args_at + (key,), key=True), f"unknown setting '{key}' of test '{test}' on {self.what}",
                                  hint or "settings: " + ", ".join(sorted(_ARGS[test] + SETTINGS)))
                ok = False
        for key in _REQUIRED.get(test, ()):
            if args.get(key) in (None, "", []):
                self.errors.error(self.node.at(*args_at), f"test '{test}' on {self.what} needs '{key}'", _REQUIRED_HINT[(test, key)])
                ok = False
        columns = self._columns_of(test, args, column, args_at)
        if columns is None or not ok:
            return
        settings = self._settings(test, args, args_at)
        if settings is None:
            return
        if not self._args_ok(test, args, args_at):
            return
        self.out.append(DataTest(
            name=settings["name"] or "", test=test, model=self.node.name, model_kind=self.kind, location=where,
            columns=columns, args={k: v for k, v in args.items() if k in _ARGS[test] + ("to_kind",)}, **_without(settings, "name")))

    def _flatten_config(self, test: str, args: dict, at: tuple) -> dict:
        """The test's arguments and settings, with those under `config:` (dbt 1.5+) among them."""
        args = dict(args)
        nested = args.pop("config", None)
        if nested is not None:
            if isinstance(nested, dict):
                for k, v in nested.items():
                    args.setdefault(k, v)
            else:
                self.errors.error(self.node.at(*at, "config"), f"'config' of test '{test}' must be a mapping")
        return args

    # --- generic tests of the project's own ---------------------------------------------------

    def _own_test(self, test: str, args: dict, at: tuple, where: Location, column: str | None) -> None:
        """A use of a test of tests/generic/: its arguments checked against the template's, then
        the template rendered with them (`model` the table or source, as `where:` filters it)."""
        d = self.own[test]
        takes = tuple(a for a in d.arguments[1:] if a != "column_name")
        known = takes + SETTINGS + (() if column is not None else ("column", "column_name"))
        ok = True
        for key in args:
            if key not in known:
                hint = did_you_mean(str(key), known)
                self.errors.error(self.node.doc.at(self.node.path + at + (key,), key=True), f"unknown argument '{key}' of test '{test}' on {self.what}",
                                  (hint + " " if hint else "") + f"{d.location} declares {test}({', '.join(d.arguments)}); "
                                  f"settings: {', '.join(SETTINGS)}")
                ok = False
        columns = self._own_columns(test, d, args, column, at)
        for key in d.required[1:]:
            if key == "column_name" and not columns:
                self.errors.error(self.node.at(*at), f"test '{test}' on {self.what} needs a column (its argument column_name)",
                                  "declare it under the column (`columns: [{name: x, tests: [" + test + "]}]`) or give `column: x`")
                ok = False
            elif key != "column_name" and key not in args:
                self.errors.error(self.node.at(*at), f"test '{test}' on {self.what} needs '{key}'",
                                  f"{d.location} declares {test}({', '.join(d.arguments)}); e.g. `- {test}: {{{key}: ...}}`")
                ok = False
        settings = self._settings(test, args, at)
        if columns is None or settings is None or not ok:
            return
        kwargs, refs, sources = self._own_arguments(test, {k: args[k] for k in takes if k in args}, at)
        if kwargs is None:
            return
        if columns and "column_name" in d.arguments:
            kwargs["column_name"] = columns[0]
        model = relation(self.node.name)
        kwargs["model"] = TestModel(f"(select * from {model} where {settings['where']})" if settings["where"] else model, self.node.name)
        rendered = self._render_own(test, d, kwargs, where)
        if rendered is None:
            return
        settings = self._template_settings(test, d, rendered.config, settings, args)
        if settings is None:
            return
        self.out.append(DataTest(
            name=settings["name"] or "", test=test, model=self.node.name, model_kind=self.kind, location=where, columns=columns,
            args={k: args[k] for k in takes if k in args}, sql=rendered.sql, template=d.location.file,
            refs=tuple(sorted(refs | set(rendered.refs))), sources=tuple(sorted(sources | set(rendered.sources))),
            env_vars=dict(rendered.env_vars), **_without(settings, "name")))

    def _own_columns(self, test: str, d: GenericTestDef, args: dict, column: str | None, at: tuple) -> tuple[str, ...] | None:
        """The column a use names: the one it is declared under, or `column:` (or dbt's
        `column_name:`) at table level; () for none."""
        if column is None and "column" in args and "column_name" in args:
            self.errors.error(self.node.at(*at), f"test '{test}' on {self.what} gives both 'column' and 'column_name'", "keep one of them")
            return None
        given = column if column is not None else args.get("column", args.get("column_name"))
        if given is None:
            return ()
        if not isinstance(given, str):
            self.errors.error(self.node.at(*at, "column" if "column" in args else "column_name"), f"'column' of test '{test}' on {self.what} must be a column name")
            return None
        if "column_name" not in d.arguments:
            self.errors.error(self.node.at(*at), f"test '{test}' on {self.what} names column '{given}', but {d.location} declares "
                              f"{test}({', '.join(d.arguments)}) without column_name",
                              "declare it in the table's `tests:` without a column, or add column_name to the test's arguments")
            return None
        return (given,)

    def _own_arguments(self, test: str, given: dict, at: tuple) -> tuple[dict | None, set[str], set[str]]:
        """The arguments as the template gets them: `ref('t')` and `source('s')` (as dbt users
        write a relationships' `to:`) become that relation, and the test reads it."""
        kwargs, refs, sources = {}, set(), set()
        for key, value in given.items():
            if isinstance(value, str) and _TARGET.match(value):
                target = _relationship_target(value, self.project)
                if isinstance(target, str):
                    self.errors.error(self.node.at(*at, key), f"argument '{key}' of test '{test}' on {self.what}: it {target.split(' ', 1)[1]}",
                                      _relationship_hint(value, self.project))
                    return None, refs, sources
                (refs if target[0] == "table" else sources).add(target[1])
                value = relation(target[1])
            kwargs[key] = value
        return kwargs, refs, sources

    def _render_own(self, test: str, d: GenericTestDef, kwargs: dict, where: Location):
        """The template rendered for this use, and its SQL parsed; what fails is reported at the
        template's line (once, however many uses fail alike), naming this use."""
        from compiler.sqlcheck import analyse

        before = len(self.errors.diagnostics)
        rendered = self.renderer.render_generic_test(test, kwargs)
        if rendered is None:
            seen = {(x.location, x.message) for x in self.errors.diagnostics[:before]}
            fresh = [x for x in self.errors.diagnostics[before:] if (x.location, x.message) not in seen]
            use = f"rendering test '{test}' for {self.what} ({where})"
            self.errors.diagnostics[before:] = [type(x)(x.location, x.message, f"{x.hint + '; ' if x.hint else ''}{use}", x.severity) for x in fresh]
            return None
        for src in rendered.sources:
            kind = self.project.sources[src].kind
            if kind not in TESTABLE_SOURCES:
                self.errors.error(rendered.sources[src], f"test '{test}' reads source '{src}' of kind {kind}, which a test cannot read again",
                                  "read the table it feeds with ref() instead")
                return None
        findings = analyse(rendered.sql, {}).findings
        if findings:
            f = findings[0]
            self.errors.error(where, f"test '{test}' on {self.what}: the SQL rendered from {d.location.file} does not parse: "
                              f"{f.message} (line {f.line} of the rendered SQL)",
                              f"{f.hint + '; ' if f.hint else ''}see the template at {d.location}, rendered with this test's arguments")
            return None
        return rendered

    def _template_settings(self, test: str, d: GenericTestDef, config: Mapping[str, Any], settings: dict, args: dict) -> dict | None:
        """The settings a template's `{{ config(...) }}` gives its uses (dbt's defaults of a
        generic test); a use's own settings win."""
        out = dict(settings)
        for key, value in config.items():
            if key not in SETTINGS or key in ("name", "where"):
                self.errors.error(d.location, f"config() of generic test '{test}': unknown setting '{key}'",
                                  "settings a generic test may give its uses: " + ", ".join(k for k in SETTINGS if k not in ("name", "where")))
                return None
            if key in args:
                continue
            value, problem = _setting(key, value)
            if problem is not None:
                self.errors.error(d.location, f"config() of generic test '{test}': {key} is {value!r}; {problem[0]}", problem[1])
                return None
            out[key] = value
        return out

    def _columns_of(self, test: str, args: dict, column: str | None, at: tuple) -> tuple[str, ...] | None:
        given = args.get("columns") if test == "unique" else None
        if column is not None:
            if "column" in args or given is not None:
                self.errors.error(self.node.at(*at), f"test '{test}' under column '{column}' of {self.what} names its column already",
                                  "leave out `column:`/`columns:` here, or move the test to the table's `tests:`")
                return None
            return (column,)
        if given is not None:
            if not isinstance(given, list) or not given or not all(isinstance(c, str) for c in given):
                self.errors.error(self.node.at(*at, "columns"), f"'columns' of test 'unique' on {self.what} must be a list of column names")
                return None
            if "column" in args:
                self.errors.error(self.node.at(*at), f"test 'unique' on {self.what} gives both 'column' and 'columns'", "keep one of them")
                return None
            return tuple(given)
        one = args.get("column")
        if one is None:
            if test == "expression":
                return ()
            self.errors.error(self.node.at(*at), f"test '{test}' in the `tests:` of {self.what} needs `column:`" + (" or `columns:`" if test == "unique" else ""),
                              "or declare it under the column: `columns: [{name: <column>, tests: [...]}]`")
            return None
        if not isinstance(one, str):
            self.errors.error(self.node.at(*at, "column"), f"'column' of test '{test}' on {self.what} must be a column name")
            return None
        return (one,)

    def _settings(self, test: str, args: dict, at: tuple) -> dict[str, Any] | None:
        out: dict[str, Any] = {"name": None, **_DEFAULTS}
        ok = True
        for key in SETTINGS:
            if key not in args:
                continue
            value = args[key]
            loc = self.node.at(*at, key)
            if key == "severity":
                if not isinstance(value, str) or value.lower() not in SEVERITIES:
                    self.errors.error(loc, f"unknown severity '{value}' of test '{test}' on {self.what}", "choose one of: error, warn")
                    ok = False
                    continue
                value = value.lower()
            elif key in ("warn_if", "error_if"):
                if not isinstance(value, str) or not _THRESHOLD.match(value):
                    self.errors.error(loc, f"'{key}' of test '{test}' on {self.what} is {value!r}; it compares the number of failing rows "
                                      "(or the value of fail_calc) with a number",
                                      "write a comparison with a number, quoted: \">10\", \"!=0\", \">= 100\"")
                    ok = False
                    continue
            elif key in ("store_failures", "limit", "fail_calc"):
                value, problem = _setting(key, value)
                if problem is not None:
                    self.errors.error(loc, f"'{key}' of test '{test}' on {self.what} is {value!r}; {problem[0]}", problem[1])
                    ok = False
                    continue
            elif key == "name":
                if not isinstance(value, str) or not NAME_RE.match(value):
                    self.errors.error(loc, f"invalid test name {value!r} on {self.what}", "use letters, digits and _, starting with a letter or _")
                    ok = False
                    continue
            elif not isinstance(value, str) or (key == "where" and not value.strip()):
                self.errors.error(loc, f"'{key}' of test '{test}' on {self.what} must be a string" + (" (a SQL condition)" if key == "where" else ""))
                ok = False
                continue
            out[key] = value
        return out if ok else None

    def _args_ok(self, test: str, args: dict, at: tuple) -> bool:
        if test == "accepted_values":
            values = args["values"]
            if not isinstance(values, list) or any(isinstance(v, (dict, list)) or v is None for v in values):
                self.errors.error(self.node.at(*at, "values"), f"'values' of test 'accepted_values' on {self.what} must be a list of plain values",
                                  "e.g. `values: [placed, shipped, delivered]`")
                return False
        if test == "expression" and not isinstance(args["expression"], str):
            self.errors.error(self.node.at(*at, "expression"), f"'expression' of test 'expression' on {self.what} must be a SQL condition, not {type_name(args['expression'])}",
                              "e.g. `expression: \"amount >= 0\"`")
            return False
        if test == "relationships":
            if not isinstance(args["field"], str):
                self.errors.error(self.node.at(*at, "field"), f"'field' of test 'relationships' on {self.what} must be a column name")
                return False
            target = _relationship_target(args["to"], self.project)
            if isinstance(target, str):
                self.errors.error(self.node.at(*at, "to"), f"test 'relationships' on {self.what}: {target}",
                                  _relationship_hint(args["to"], self.project))
                return False
            args["to"] = target[1]
            args["to_kind"] = target[0]
        return True


_DEFAULTS: dict[str, Any] = {"description": "", "severity": "error", "warn_if": "!= 0", "error_if": "!= 0", "where": None,
                             "store_failures": False, "limit": None, "fail_calc": DEFAULT_FAIL_CALC}


def _without(settings: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in keys}


def _setting(key: str, value: Any) -> tuple[Any, tuple[str, str] | None]:
    """A store_failures, limit or fail_calc value as the plan keeps it, or what is wrong with
    it (a message, a hint)."""
    if key == "store_failures":
        if not isinstance(value, bool):
            return value, ("it is true or false", f"`store_failures: true` writes the failing rows to table <test>{FAILURES_SUFFIX}")
    elif key == "limit":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return value, ("it is the most failing rows counted and stored, a positive whole number", "e.g. `limit: 1000`")
    elif key == "fail_calc":
        problem = _aggregate_problem(value)
        if problem is not None:
            return value, (problem, "an aggregate over the failing rows, e.g. `fail_calc: \"sum(n_records)\"` (the default is count(*))")
        value = value.strip()
    return value, None


def _aggregate_problem(text: Any) -> str | None:
    """Why `text` is not one SQL expression (parsed with sqlglot, Spark's dialect), or None."""
    if not isinstance(text, str) or not text.strip():
        return "it must be a SQL expression"
    import sqlglot
    from sqlglot import exp

    from compiler.sqlcheck import analyse

    sql = f"select {text}\nfrom failures"  # the failing rows, as the runtime aggregates them
    findings = [f for f in analyse(sql, {}).findings if f.message.startswith("SQL syntax error")]
    if findings:
        message = findings[0].message
        if findings[0].line > text.count("\n") + 1:  # at the `from` added here: the expression ended too soon
            message = message.replace(" near 'from'", " at its end")
        return f"it does not parse as a SQL expression ({message})"
    try:
        parsed = sqlglot.parse(sql, read="spark")
    except Exception:  # noqa: BLE001 - what sqlcheck let through and sqlglot still refuses
        parsed = []
    select = parsed[0] if len(parsed) == 1 else None
    if not isinstance(select, exp.Select) or len(select.expressions) != 1 or select.args.get("where") or select.args.get("group") \
            or select.args.get("joins") or select.args.get("limit") or select.args.get("order"):
        return "it must be one SQL expression, e.g. sum(n_records)"
    return None


_REQUIRED_HINT = {
    ("accepted_values", "values"): "list the values the column may hold: `values: [placed, shipped]`",
    ("relationships", "to"): "name the parent: `to: ref('customers')` or `to: source('raw_customers')`",
    ("relationships", "field"): "name the parent's column the values must exist in: `field: customer_id`",
    ("expression", "expression"): "give the SQL condition every row must meet: `expression: \"amount >= 0\"`",
}


def _tests_of(body: dict, node: Node, at: tuple, errors: Collector, what: str) -> tuple[list | None, str]:
    """`tests:` (or dbt 1.8's `data_tests:`) of a table, source or column entry."""
    if "tests" in body and "data_tests" in body:
        errors.error(node.at(*at, "data_tests"), f"{what} has both 'tests' and 'data_tests'", "they mean the same; keep one")
    key = "data_tests" if "data_tests" in body and "tests" not in body else "tests"
    tests = body.get(key)
    if tests is None:
        return None, key
    if not isinstance(tests, list):
        errors.error(node.at(*at, key), f"'{key}' of {what} must be a list of tests, not {type_name(tests)}", "e.g. `tests: [unique, not_null]`")
        return None, key
    return tests, key


def _relationship_target(to: Any, project: Project) -> tuple[str, str] | str:
    """("table" | "source", name) of `to:`, or what is wrong with it."""
    if not isinstance(to, str):
        return f"'to' must be ref('<table>') or source('<source>'), not {type_name(to)}"
    m = _TARGET.match(to)
    kind, name = (m.group(1), m.group(2)) if m else (None, to.strip())
    in_tables, in_sources = name in project.tables, name in project.sources
    if kind == "ref" and not in_tables or kind == "source" and not in_sources or kind is None and not (in_tables or in_sources):
        return f"'to' names {to!r}, which is no {'table' if kind == 'ref' else 'source' if kind == 'source' else 'table or source'} of the project"
    if kind is None:
        kind = "ref" if in_tables else "source"
    if kind == "source" and project.sources[name].kind not in TESTABLE_SOURCES:
        return f"'to' names source {name!r} of kind {project.sources[name].kind}, which a test cannot read again"
    return ("table" if kind == "ref" else "source"), name


def _relationship_hint(to: Any, project: Project) -> str:
    name = _TARGET.match(to).group(2) if isinstance(to, str) and _TARGET.match(to) else str(to)
    near = did_you_mean(name, [*project.tables, *project.sources])
    return near or "name a table (`ref('customers')`) or a source (`source('raw_customers')`) of the project"


# --- names, columns and SQL ---------------------------------------------------------------------

def finish(tests: list[DataTest], project: Project, known_columns: Mapping[str, tuple[str, ...] | list[str] | None],
           errors: Collector) -> list[DataTest]:
    """Names every test, checks its columns against what is known of its model, refuses tests on
    sources a test cannot read again, and writes the SQL of its failing rows."""
    out = []
    taken: dict[str, Location] = {}
    for t in tests:
        if t.model_kind == "source" and project.sources[t.model].kind not in TESTABLE_SOURCES:
            s = project.sources[t.model]
            errors.error(t.location, f"test '{t.test}' on source '{s.name}': a source of kind {s.kind} cannot be read again by a test",
                         "test the table it feeds instead (declare the test in tables/*.yml)")
            continue
        if not _columns_exist(t, project, known_columns, errors):
            continue
        name = t.name or _generated_name(t)
        if t.name and name in taken:
            errors.error(t.location, f"test name '{name}' is taken (by the test at {taken[name]})", "give this test another `name:`")
            continue
        if not t.name:
            base, n = name, 2
            while name in taken:
                name, n = f"{base}_{n}", n + 1
        taken[name] = t.location
        if t.store_failures and name + FAILURES_SUFFIX in project.tables:
            errors.error(project.tables[name + FAILURES_SUFFIX].location,
                         f"table name '{name}{FAILURES_SUFFIX}' is taken by the failures table of test '{name}' (store_failures, {t.location})",
                         "rename the table, or give the test another `name:`")
            continue
        out.append(_with(t, name=name, sql=_sql(t)))
    return out


def _with(t: DataTest, **changes: Any) -> DataTest:
    return DataTest(**{**t.__dict__, **changes})


def _generated_name(t: DataTest) -> str:
    """As dbt names them: `<test>_<model>_<column>` (`not_null_orders_customer_id`)."""
    parts = [t.test, t.model or "", *t.columns]
    return "_".join(p for p in parts if p)


def _columns_exist(t: DataTest, project: Project, known: Mapping[str, Any], errors: Collector) -> bool:
    columns = _model_columns(t.model, t.model_kind, project, known)
    ok = True
    if columns is not None:
        lower = {c.lower() for c in columns}
        for c in t.columns:
            if c.lower() not in lower:
                errors.error(t.location, f"test '{t.test}' on {t.model_kind} '{t.model}' names column '{c}', which it does not have",
                             (did_you_mean(c, columns) or f"its columns: {', '.join(columns)}"))
                ok = False
    if t.test == "relationships":
        parent = _model_columns(t.args["to"], t.args["to_kind"], project, known)
        field_ = t.args["field"]
        if parent is not None and field_.lower() not in {c.lower() for c in parent}:
            errors.error(t.location, f"test 'relationships' on {t.model_kind} '{t.model}': {t.args['to_kind']} '{t.args['to']}' has no column '{field_}'",
                         did_you_mean(field_, parent) or f"its columns: {', '.join(parent)}")
            ok = False
    return ok


def _model_columns(name: str | None, kind: str | None, project: Project, known: Mapping[str, Any]) -> list[str] | None:
    if name is None:
        return None
    node = project.tables.get(name) if kind == "table" else project.sources.get(name)
    if node is None:
        return None
    if kind == "table" and known.get(name) is not None:
        return list(known[name])
    if kind == "source" and isinstance(node, Source) and node.kind == "table":
        upstream = node.config.get("table")
        return list(known[upstream]) if known.get(upstream) is not None else None
    return [c["name"] for c in node.columns] if node.columns else None


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql(t: DataTest) -> str:
    """The SQL whose rows are the test's failures."""
    if t.test == "sql" or t.template:
        return t.sql
    model = relation(t.model)
    rows = f"(select * from {model} where {t.where}) as model" if t.where else f"{model} as model"
    cols = [f"model.{_quote(c)}" for c in t.columns]
    if t.test == "not_null":
        return f"select * from {rows}\nwhere {cols[0]} is null\n"
    if t.test == "unique":
        listed = ", ".join(cols)
        present = " and ".join(f"{c} is not null" for c in cols)
        return f"select {listed}, count(*) as n_records from {rows}\nwhere {present}\ngroup by {listed}\nhaving count(*) > 1\n"
    if t.test == "accepted_values":
        values = ", ".join(_literal(v) for v in t.args["values"])
        return f"select * from {rows}\nwhere {cols[0]} is not null and {cols[0]} not in ({values})\n"
    if t.test == "relationships":
        parent = relation(t.args["to"])
        return (f"select * from {rows}\nwhere {cols[0]} is not null\n"
                f"  and not exists (select 1 from {parent} as parent where parent.{_quote(t.args['field'])} = {cols[0]})\n")
    if t.test == "expression":
        return f"select * from {rows}\nwhere not ({t.args['expression']})\n"
    raise AssertionError(t.test)


class TestModel(str):
    """`model` in a generic test's template, as dbt's: written as it is, the relation the test
    reads (the view of the table or source, or its rows meeting `where:`); `model.name` and
    `model.identifier` are its plain name."""

    def __new__(cls, relation_text: str, name: str) -> "TestModel":
        self = super().__new__(cls, relation_text)
        self.name = self.identifier = name
        return self


# --- tests/*.sql ----------------------------------------------------------------------------------

def read_singular(project: Project, renderer, errors: Collector) -> list[DataTest]:
    """The tests in tests/**/*.sql: a SELECT (Jinja, with ref() and source()) returning the
    failing rows; `{{ config(severity='warn', warn_if='>10') }}` sets what a YAML test sets."""
    from compiler.project import read_test_files

    out = []
    for rel, text in read_test_files(project, errors):
        name = rel.rsplit("/", 1)[-1][: -len(".sql")]
        if not NAME_RE.match(name):
            errors.error(Location(rel, 1, 1), f"invalid test name '{name}'", "name the file with letters, digits and _ (it becomes the test's name)")
            continue
        r = renderer.render_test(rel, text)
        if r is None:
            continue
        settings = _singular_settings(rel, r.config, errors)
        if settings is None:
            continue
        if not r.refs and not r.sources:
            errors.error(Location(rel, 1, 1), f"test '{name}' reads no table or source", "select from {{ ref('table') }} or {{ source('name') }}")
            continue
        for src in r.sources:
            kind = project.sources[src].kind
            if kind not in TESTABLE_SOURCES:
                errors.error(r.sources[src], f"test '{name}' reads source '{src}' of kind {kind}, which a test cannot read again",
                             "read the table it feeds with ref() instead")
                settings = None
        if settings is None:
            continue
        out.append(DataTest(name=name, test="sql", model=None, model_kind=None, location=Location(rel, 1), sql=r.sql, sql_file=rel,
                            refs=tuple(sorted(r.refs)), sources=tuple(sorted(r.sources)), env_vars=dict(r.env_vars), **settings))
    return out


_SINGULAR_SETTINGS = ("severity", "warn_if", "error_if", "description", "store_failures", "limit", "fail_calc")


def _singular_settings(rel: str, config: Mapping[str, Any], errors: Collector) -> dict[str, Any] | None:
    out: dict[str, Any] = _without(_DEFAULTS, "where")
    for key, value in config.items():
        where = Location(rel, 1)
        if key not in _SINGULAR_SETTINGS:
            errors.error(where, f"config() of test {rel}: unknown setting '{key}'", "settings: " + ", ".join(_SINGULAR_SETTINGS))
            return None
        if key in ("store_failures", "limit", "fail_calc"):
            value, problem = _setting(key, value)
            if problem is not None:
                errors.error(where, f"config() of test {rel}: {key} is {value!r}; {problem[0]}", problem[1])
                return None
            out[key] = value
            continue
        if key == "severity" and (not isinstance(value, str) or value.lower() not in SEVERITIES):
            errors.error(where, f"config() of test {rel}: unknown severity {value!r}", "choose one of: error, warn")
            return None
        if key in ("warn_if", "error_if") and (not isinstance(value, str) or not _THRESHOLD.match(value)):
            errors.error(where, f"config() of test {rel}: {key} is {value!r}", "write a comparison with a number: '>10', '!=0'")
            return None
        out[key] = value.lower() if key == "severity" else value
    return out


# --- expectations: checks on a table's batch before its commit ----------------------------------

ACTIONS = ("warn", "drop", "quarantine", "fail")
QUARANTINE_SUFFIX = "__quarantine"
_EXPECT_OPERATIONS = ("upsert", "insert", "bulk_insert", "insert_overwrite", "insert_overwrite_table")


def read_expectations(project: Project, rendered: Mapping[str, Mapping[str, Any]], errors: Collector) -> dict[str, list[dict[str, str]]]:
    """Each table's `expect:` (from its rendered settings, `rendered`) as a list of {name,
    expression, action}, in the order written. `expect: {name: "<SQL condition>"}` warns;
    `{name: {expression: ..., action: ...}}` picks its action."""
    out: dict[str, list[dict[str, str]]] = {}
    for table in project.tables.values():
        value = (rendered.get(table.name) or table.config).get("expect")
        if value is None:
            continue
        what = f"table '{table.name}'"
        if not isinstance(value, dict) or not value:
            errors.error(table.at("expect"), f"'expect' of {what} must be a mapping of names to SQL conditions",
                         "e.g. `expect: {positive_amount: {expression: \"amount > 0\", action: drop}}`")
            continue
        if table.operation not in _EXPECT_OPERATIONS:
            errors.error(table.at("expect"), f"'expect' of {what} checks rows the table writes; operation {table.operation} writes none",
                         f"expectations apply to {', '.join(_EXPECT_OPERATIONS)}")
            continue
        checks = []
        for name, body in value.items():
            at = ("expect", name)
            if not isinstance(name, str) or not NAME_RE.match(name):
                errors.error(table.doc.at(table.path + at, key=True), f"invalid expectation name {name!r} in {what}",
                             "use letters, digits and _, starting with a letter or _")
                continue
            if isinstance(body, str):
                body = {"expression": body}
            if not isinstance(body, dict):
                errors.error(table.at(*at), f"expectation '{name}' of {what} must be a SQL condition or a mapping with `expression` and `action`")
                continue
            for key in body:
                if key not in ("expression", "action", "description"):
                    errors.error(table.doc.at(table.path + at + (key,), key=True), f"unknown setting '{key}' of expectation '{name}' in {what}",
                                 did_you_mean(str(key), ("expression", "action", "description")) or "settings: expression, action, description")
            expression, action = body.get("expression"), body.get("action", "warn")
            if not isinstance(expression, str) or not expression.strip():
                errors.error(table.at(*at), f"expectation '{name}' of {what} needs `expression:`, the SQL condition every row must meet",
                             "e.g. `expression: \"amount > 0\"`")
                continue
            if action not in ACTIONS:
                hint = did_you_mean(str(action), ACTIONS) or ""
                errors.error(table.at(*at, "action"), f"unknown action '{action}' of expectation '{name}' in {what}",
                             (hint + " " if hint else "") + "choose one of: " + ", ".join(ACTIONS))
                continue
            checks.append({"name": name, "expression": expression, "action": action})
        if any(c["action"] == "quarantine" for c in checks) and table.name + QUARANTINE_SUFFIX in project.tables:
            errors.error(project.tables[table.name + QUARANTINE_SUFFIX].location,
                         f"table name '{table.name}{QUARANTINE_SUFFIX}' is taken by the quarantine table of table '{table.name}'", "rename the table")
        out[table.name] = checks
    return out
