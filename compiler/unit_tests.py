"""Unit tests: rows given for a table's inputs (and, optionally, for the table before the run),
and the rows the table must hold after the write, as dbt 1.8 declares them:

    unit_tests:
      - name: latest_version_wins
        model: orders
        given:
          - input: source('raw_orders')
            rows:
              - {order_id: 1, amount: 10.50, updated_ms: 1700000000000}
          - input: ref('customers')
            format: csv
            fixture: customers            # tests/fixtures/customers.csv
          - input: this                   # the table before the run
            rows: [...]
        expect:
          rows: [...]

in `tests/unit/*.yml` or beside the table in `tables/*.yml`. Unlike dbt's, `expect` is the table
after pipe's write (runtime/steps/unit.py): precombine, delete_when, tombstones, duplicates,
expectations and quarantine, partition moves and merge-on-read all apply.

Every value is kept as text (None for null) in the plan, with each input's columns and their
Spark types: declared ones (a source's or a table's `schema`) or, for the others, inferred from
the values as seeds' are (compiler/seeds.py). Mistakes are reported at the file's line."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping

from compiler import seeds
from compiler.data_tests import _TARGET as _INPUT  # ref('x') / source('x'), as a test's `to:` is written
from compiler.errors import Collector, Location, did_you_mean
from compiler.project import Project
from compiler.schema import NAME_RE
from compiler.yamlsrc import Doc, load_yaml

FOLDER = "tests/unit"
FIXTURES = "tests/fixtures"
_KEYS = ("name", "model", "description", "given", "expect", "tags")
_GIVEN_KEYS = ("input", "rows", "format", "fixture", "column_types")
_EXPECT_KEYS = ("rows", "format", "fixture")


@dataclass(frozen=True)
class Rows:
    columns: list[dict[str, str]]  # [{name, type}]; type "" when not known (expect)
    rows: list[list[str | None]]


@dataclass(frozen=True)
class UnitTest:
    name: str
    model: str
    location: Location
    given: list[dict[str, Any]]  # {input: "source"|"table"|"this", name, columns, rows}
    expect: Rows
    description: str = ""
    tags: tuple[str, ...] = ()
    inputs_said: Mapping[tuple[str, str], Location] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        return {"model": self.model, "given": self.given,
                "expected": {"columns": [c["name"] for c in self.expect.columns], "rows": self.expect.rows}}


def read(project: Project, errors: Collector) -> list[UnitTest]:
    """Every unit test of tests/unit/*.yml and of `unit_tests:` in tables/*.yml."""
    found: list[UnitTest] = []
    files = []
    for rel in project.files.listing("tests", (".yml", ".yaml")):
        if rel.startswith(FOLDER + "/"):
            files.append(rel)
        else:
            errors.warning(Location(rel, 1), f"pipe does not read {rel}: unit tests live in {FOLDER}/*.yml",
                           f"move it to {FOLDER}/ (data tests are declared in tables/*.yml and tests/*.sql)")
    files += [rel for rel in project.files.listing("tables", (".yml", ".yaml"))
              if b"unit_tests" in (project.files.contents[rel] if isinstance(project.files.contents[rel], bytes) else b"")]
    for rel in files:
        text = project.files.text(rel, errors)
        doc = load_yaml(text, rel, errors) if text is not None else None
        if doc is None or doc.value is None:
            continue
        in_tables = rel.startswith("tables/")
        if not isinstance(doc.value, dict):
            errors.error(doc.at(()), f"{rel} must be a mapping with a top-level 'unit_tests:' key")
            continue
        if not in_tables:
            for key in doc.value:
                if key != "unit_tests":
                    errors.error(doc.at((key,), key=True), f"unknown top-level key '{key}' in a unit test file",
                                 did_you_mean(str(key), ["unit_tests"]) or "the only top-level key here is 'unit_tests:'")
        entries = doc.value.get("unit_tests")
        if entries is None:
            continue
        if not isinstance(entries, list):
            errors.error(doc.at(("unit_tests",)), "'unit_tests:' must be a list of tests (`- name: ...`)")
            continue
        for i, body in enumerate(entries):
            test = _read_one(project, doc, ("unit_tests", i), body, errors)
            if test is not None:
                found.append(test)
    seen: dict[str, UnitTest] = {}
    for t in found:
        if t.name in seen:
            errors.error(t.location, f"unit test '{t.name}' is declared twice (first at {seen[t.name].location})", "give each unit test its own name")
        seen.setdefault(t.name, t)
    return list(seen.values())


def _read_one(project: Project, doc: Doc, p: tuple, body: Any, errors: Collector) -> UnitTest | None:
    at = doc.at(p)
    if not isinstance(body, dict):
        errors.error(at, "a unit test is a mapping with name, model, given and expect")
        return None
    for key in body:
        if key not in _KEYS:
            errors.error(doc.at(p + (key,), key=True), f"unknown key '{key}' in a unit test",
                         did_you_mean(str(key), _KEYS) or "keys: " + ", ".join(_KEYS))
    name, model = body.get("name"), body.get("model")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.error(doc.at(p + ("name",)) if "name" in body else at, f"a unit test needs a name of letters, digits and _ (not {name!r})",
                     "add `name: orders_keep_the_latest_version`")
        return None
    where = f"unit test '{name}'"
    if not isinstance(model, str) or model not in project.tables:
        hint = did_you_mean(str(model), project.tables) if isinstance(model, str) else None
        errors.error(doc.at(p + ("model",)) if "model" in body else at,
                     f"{where}: model {model!r} is not a table of the project" if model is not None else f"{where} names no model",
                     hint or "name the table it tests: `model: orders`")
        return None
    table = project.tables[model]
    if table.config.get("seed"):
        errors.error(doc.at(p + ("model",)), f"{where}: {model} is a seed: its rows are its CSV file, there is no query to test",
                     "test the tables that read it, or check the seed with data tests")
        return None
    if table.config.get("operation") == "bootstrap":
        errors.error(doc.at(p + ("model",)), f"{where}: {model} is bootstrapped from a dataset, not made by a query from inputs",
                     "test the tables that read it")
        return None
    given_items = body.get("given")
    if not isinstance(given_items, list):
        errors.error(doc.at(p + ("given",)) if "given" in body else at, f"{where}: `given:` must be a list of inputs",
                     "- input: source('raw_orders')\n  rows: [{order_id: 1}]")
        return None
    given: list[dict[str, Any]] = []
    said: dict[tuple[str, str], Location] = {}
    for j, item in enumerate(given_items):
        gp = p + ("given", j)
        if not isinstance(item, dict):
            errors.error(doc.at(gp), f"{where}: each given is a mapping with input and rows")
            continue
        for key in item:
            if key not in _GIVEN_KEYS:
                errors.error(doc.at(gp + (key,), key=True), f"unknown key '{key}' in a given input of {where}",
                             did_you_mean(str(key), _GIVEN_KEYS) or "keys: " + ", ".join(_GIVEN_KEYS))
        parsed = _input(project, doc, gp, item.get("input"), where, errors)
        if parsed is None:
            continue
        kind, input_name = parsed
        if (kind, input_name) in said:
            errors.error(doc.at(gp + ("input",)), f"{where} gives rows for {input_said(kind, input_name)} twice (first at {said[kind, input_name]})", "keep one")
            continue
        said[kind, input_name] = doc.at(gp + ("input",))
        declared = _declared(project, kind, input_name if kind != "this" else model)
        what = f"{input_said(kind, input_name)} in {where}"
        typed = _column_types(doc, gp, item, declared, what, errors)
        rows = _rows(project, doc, gp, item, declared, what, errors, infer=True, typed=typed)
        if rows is not None and kind == "this":
            _check_this(table, rows, doc.at(gp + ("input",)), what, errors)
        if rows is not None:
            given.append({"input": kind, "name": input_name, "columns": rows.columns, "rows": rows.rows})
    expect_item = body.get("expect")
    if not isinstance(expect_item, dict):
        errors.error(doc.at(p + ("expect",)) if "expect" in body else at, f"{where}: `expect:` must hold the rows of {model} after the write",
                     "expect:\n  rows: [{order_id: 1, amount: 10.5}]")
        return None
    for key in expect_item:
        if key not in _EXPECT_KEYS:
            errors.error(doc.at(p + ("expect", key), key=True), f"unknown key '{key}' in expect of {where}",
                         did_you_mean(str(key), _EXPECT_KEYS) or "keys: " + ", ".join(_EXPECT_KEYS))
    expect = _rows(project, doc, p + ("expect",), expect_item, None, f"expect of {where}", errors, infer=False)
    if expect is None:
        return None
    tags = body.get("tags") or []
    if isinstance(tags, str):
        tags = [tags]
    return UnitTest(name=name, model=model, location=at, given=given, expect=expect,
                    description=str(body.get("description") or ""), tags=tuple(str(t) for t in tags), inputs_said=said)


def _check_this(table, rows: Rows, where: Location, what: str, errors: Collector) -> None:
    """The rows given for `this` are a stored table's: they hold its key, partition and
    precombine columns."""
    have = {c["name"].lower() for c in rows.columns}
    config = table.config
    for setting in ("key", "partition_by"):
        for col in config.get(setting) or []:
            if col.lower() not in have:
                errors.error(where, f"{what}: no column '{col}', which the table's {setting} names", f"give '{col}' in the rows of this")
    pre = config.get("precombine")
    if pre and pre.lower() not in have:
        errors.error(where, f"{what}: no column '{pre}', which the table's precombine names", f"give '{pre}' in the rows of this")


def input_said(kind: str, name: str) -> str:
    """An input as a test names it: `ref('x')`, `source('x')` or `this`."""
    return "this" if kind == "this" else f"{'ref' if kind == 'table' else 'source'}('{name}')"


def _input(project: Project, doc: Doc, gp: tuple, text: Any, where: str, errors: Collector) -> tuple[str, str] | None:
    if text == "this":
        return "this", "this"
    m = _INPUT.match(text) if isinstance(text, str) else None
    if m is None:
        errors.error(doc.at(gp + ("input",)) if text is not None else doc.at(gp),
                     f"{where}: input {text!r} is not ref('table'), source('source') or this", "e.g. `input: source('raw_orders')`")
        return None
    kind, name = ("table" if m.group(1) == "ref" else "source"), m.group(2)
    known = project.tables if kind == "table" else project.sources
    if name not in known:
        errors.error(doc.at(gp + ("input",)), f"{where}: {m.group(1)}('{name}') names no {'table' if kind == 'table' else 'source'}",
                     did_you_mean(name, known) or f"declare it, or give rows for an input the model reads")
        return None
    return kind, name


def _declared(project: Project, kind: str, name: str) -> list[dict[str, str]] | None:
    """The columns an input declares (`schema`), with their types; None when not declared."""
    node = project.sources.get(name) if kind == "source" else project.tables.get(name)
    columns = node.columns if node is not None else None
    if not columns:
        return None
    return [{"name": c["name"], "type": c["type"]} for c in columns]


def _column_types(doc: Doc, gp: tuple, item: dict, declared, what: str, errors: Collector) -> dict[str, str]:
    """`column_types: {col: TYPE}` of a given input whose columns are not declared (as a seed's):
    column -> its Spark type, checked as a seed's are (compiler/seeds.py), in the order written."""
    raw = item.get("column_types")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.error(doc.at(gp + ("column_types",)), f"{what}: column_types must map columns to Spark types", "column_types: {amount: DECIMAL(12,2)}")
        return {}
    if declared is not None:
        errors.error(doc.at(gp + ("column_types",)), f"{what}: its columns and types are declared already (its `schema`)", "remove column_types")
        return {}
    out = {}
    for col, typ in raw.items():
        canon = seeds.column_type(str(col), typ, what, doc.at(gp + ("column_types", col)), errors)
        if canon is not None:
            out[str(col)] = canon
    return out


def _rows(project: Project, doc: Doc, gp: tuple, item: dict, declared: list[dict[str, str]] | None, what: str,
          errors: Collector, infer: bool, typed: Mapping[str, str] | None = None) -> Rows | None:
    """The rows of a given or an expect: inline dicts (`format: dict`, the default) or CSV
    (`format: csv` with `rows: |` text or `fixture:`), as text, with their columns."""
    fmt = item.get("format", "dict")
    if fmt not in ("dict", "csv"):
        errors.error(doc.at(gp + ("format",)), f"{what}: format {fmt!r} is not dict or csv", "write `format: csv`, or rows as mappings")
        return None
    records: list[tuple[Location, dict[str, Any]]] = []
    if fmt == "csv":
        records = _csv_records(project, doc, gp, item, what, errors)
        if records is None:
            return None
    else:
        if "fixture" in item:
            errors.error(doc.at(gp + ("fixture",)), f"{what}: a fixture is a CSV file", "add `format: csv`")
            return None
        rows = item.get("rows")
        if rows is None:
            rows = []
        if not isinstance(rows, list):
            errors.error(doc.at(gp + ("rows",)), f"{what}: rows must be a list of mappings (column: value)", "rows: [{order_id: 1, amount: 10.5}]")
            return None
        for k, row in enumerate(rows):
            if not isinstance(row, dict):
                errors.error(doc.at(gp + ("rows", k)), f"{what}: row {k + 1} is not a mapping of column: value", "- {order_id: 1, amount: 10.5}")
                continue
            records.append((doc.at(gp + ("rows", k)), row))
    names: list[str] = []
    for _, row in records:
        for col in row:
            if str(col) not in names:
                names.append(str(col))
    if declared is not None:
        known = {c["name"].lower(): c for c in declared}
        for where, row in records:
            for col in row:
                if str(col).lower() not in known:
                    errors.error(where, f"{what}: '{col}' is not a column of it",
                                 did_you_mean(str(col), [c["name"] for c in declared]) or "its columns: " + ", ".join(c["name"] for c in declared))
        names = [c["name"] for c in declared]
    texts: list[list[str | None]] = []
    for where, row in records:
        lowered = {str(k).lower(): v for k, v in row.items()}
        out = []
        for col in names:
            value = lowered.get(col.lower())
            text = _text(value)
            if text is _NESTED:
                errors.error(where, f"{what}: column '{col}' holds a list or mapping, which unit tests cannot give yet",
                             "give it as text and convert it in the model, or leave the column out")
                text = None
            out.append(text)
        texts.append(out)
    if declared is not None:
        columns = list(declared)
        checked = {c["name"].lower() for c in declared}
    elif infer:
        have = {n.lower() for n in names}
        for col in (c for c in typed or {} if c.lower() not in have):  # a column no row has: null in every row
            names.append(col)
            for row in texts:
                row.append(None)
        if not names:
            errors.error(doc.at(gp), f"{what}: no rows and no columns, so the table's query cannot read it",
                         "name its columns and types: `column_types: {customer_id: BIGINT, name: STRING}`")
        checked = {c.lower(): t for c, t in (typed or {}).items()}
        columns = [{"name": col, "type": checked.get(col.lower()) or seeds.infer_type([r[i] for r in texts])} for i, col in enumerate(names)]
    else:
        columns, checked = [{"name": col, "type": ""} for col in names], set()
    for (where, _), row in zip(records, texts):  # declared types: every value must fit
        for c, value in zip(columns, row):
            if value is not None and c["name"].lower() in checked and (problem := seeds.value_problem(value, c["type"].lower())):
                errors.error(where, f"{what}: {c['name']} = {value!r} does not fit its type {c['type']}: {problem}", "correct the value")
    return Rows(columns, texts)


_NESTED = object()


def _text(value: Any):
    """A YAML value as the text the runtime casts: numbers and dates as written, booleans as
    true/false, timestamps in ISO form; None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, (list, dict)):
        return _NESTED
    return str(value)


def _csv_records(project: Project, doc: Doc, gp: tuple, item: dict, what: str, errors: Collector):
    """(location, {column: text}) of each CSV record: from `rows: |` or a fixture file."""
    if "fixture" in item:
        name = item["fixture"]
        rel = name if isinstance(name, str) and name.startswith("tests/") else f"{FIXTURES}/{name}"
        rel = rel if rel.endswith(".csv") else rel + ".csv"
        if not isinstance(name, str) or ".." in rel.split("/") or rel not in project.files.contents:
            errors.error(doc.at(gp + ("fixture",)), f"{what}: fixture {name!r} is not a file of the project ({rel})",
                         f"put the CSV in {FIXTURES}/ and name it without .csv: `fixture: customers`")
            return None
        text = project.files.text(rel, errors)
        if text is None:
            return None
        file, first_line = rel, 0
    else:
        text = item.get("rows")
        if not isinstance(text, str):
            errors.error(doc.at(gp + ("rows",)) if "rows" in item else doc.at(gp), f"{what}: with format: csv, rows is CSV text (`rows: |`) or use fixture:",
                         "rows: |\n  order_id,amount\n  1,10.50")
            return None
        start = doc.at(gp + ("rows",))
        file, first_line = start.file, start.line  # a block scalar starts on the next line
    try:
        parsed = seeds.parse(text.removeprefix("\ufeff"))  # the text is decoded already (files.text, or YAML)
    except seeds.SeedFileError as exc:
        errors.error(Location(file, first_line + exc.line, exc.col), f"{what}: {exc}", exc.hint)
        return None
    header = [h for h, _ in parsed.header]
    out = []
    for line, fields in parsed.rows:
        where = Location(file, first_line + line)
        if len(fields) != len(header):
            errors.error(where, f"{what}: {len(fields)} values for {len(header)} columns ({', '.join(header)})", "give one value per column")
            continue
        out.append((where, dict(zip(header, fields))))
    return out


def check(tests: list[UnitTest], project: Project, rendered: Mapping[str, Any], known_columns: Mapping[str, Any], errors: Collector) -> None:
    """Each test gives rows for exactly the inputs its model reads, and expects columns the
    model has (when pipe can tell)."""
    for t in tests:
        r = rendered.get(t.model)
        if r is None:
            continue
        reads = {("table", n) for n in r.refs} | {("source", n) for n in r.sources}
        for (kind, name), where in t.inputs_said.items():
            if kind != "this" and (kind, name) not in reads:
                errors.error(where, f"unit test '{t.name}': {t.model} does not read {input_said(kind, name)}",
                             "give rows only for what the model reads: " + (", ".join(input_said(k, n) for k, n in sorted(reads)) or "nothing"))
        for kind, name in sorted(reads - set(t.inputs_said)):
            if kind == "table" and project.tables[name].config.get("seed"):
                continue  # a seed not given is read as it is in seeds/ (as dbt does)
            errors.error(t.location, f"unit test '{t.name}' gives no rows for {input_said(kind, name)}, which {t.model} reads",
                         f"add `- input: {input_said(kind, name)}` with its rows (`rows: []` for none)")
        for g in t.given:  # a table's columns known from its SQL: a column the rows name and it lacks is a typo
            if g["input"] == "source":
                continue
            has = known_columns.get(t.model if g["input"] == "this" else g["name"])
            if not has:
                continue
            lowered = {c.lower() for c in has}
            for c in g["columns"]:
                if c["name"].lower() not in lowered:
                    what = input_said(g["input"], g["name"])
                    errors.error(t.inputs_said[g["input"], g["name"]], f"unit test '{t.name}': {what} gives column '{c['name']}', "
                                 f"which {t.model if g['input'] == 'this' else g['name']} does not have",
                                 did_you_mean(c["name"], has) or "its columns: " + ", ".join(has))
        known = known_columns.get(t.model)
        if known:
            lowered = {c.lower() for c in known}
            for c in t.expect.columns:
                if c["name"].lower() not in lowered:
                    errors.error(t.location, f"unit test '{t.name}': expect names column '{c['name']}', which {t.model} does not have",
                                 did_you_mean(c["name"], known) or "its columns: " + ", ".join(known))
