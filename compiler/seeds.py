"""Seeds: small reference tables kept as CSV files in git (`seeds/**/<name>.csv`), as dbt has them.

Each CSV becomes a table step (kind `write`) whose config holds `seed`: the file, its sha256, its
delimiter and its columns with their types (declared in `seeds/*.yml` `column_types`, else
inferred here from the values). The compiler reads and checks the whole file (RFC 4180: quoted
fields, embedded delimiters, quotes and newlines; UTF-8 with an optional BOM; CRLF or LF), so a
ragged row, a value that does not fit its type or a duplicate key is reported with file:line before
anything runs. The runtime (runtime/steps/seed.py) reads the same bytes again, checks their sha256
against the plan's and parses them with `parse` below; the sha256 in the step's fingerprint is what
makes an unchanged seed a no-op."""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from compiler import schema
from compiler.columns import ColumnsError, avro_name_problem, parse_columns
from compiler.errors import Collector, Location, did_you_mean
from compiler.yamlsrc import Doc

FOLDER = "seeds"
# A seed travels through the driver (compile and run): past this, data belongs in a `files` source.
MAX_BYTES = 50 * 1024 * 1024
_MAX_REPORTED = 10  # problems of one kind reported per file; the rest are counted

SEED = schema.Section(
    "seed",
    (
        schema.Key("description", "string", "Free text for people; metadata only.", default=""),
        schema.Key("tags", "string_list", "Tags for selection (`--select tag:x`); metadata only.", default=[]),
        schema.Key("column_types", "mapping", "Spark types of some or all columns (`{code: STRING, rate: DECIMAL(9,4)}`); the others are inferred from the values (docs/project.md, Seeds).", default={}),
        schema.Key("key", "string_list", "Record key column(s): every row's key must be present and unique in the file.", default=[]),
        schema.Key("partition_by", "string_list", "Partition column(s), in path order.", default=[]),
        schema.Key("delimiter", "string", "The character between fields: `,` (default), `;`, `|` or a tab (`\"\\t\"`).", default=","),
    ) + schema._TESTS,
    "A seed: a CSV file `seeds/**/<name>.csv` pipe writes as a copy-on-write table `<name>` whenever its content changes.",
)

# Types a CSV value can be cast to (Spark's canonical spelling, compiler/columns.py).
_INTEGERS = {"tinyint": 2**7, "smallint": 2**15, "int": 2**31, "bigint": 2**63}
_SCALAR = ("boolean", "float", "double", "string", "date", "timestamp", "timestamp_ntz", *_INTEGERS)

_INT = re.compile(r"[+-]?\d+")
_PLAIN_INT = re.compile(r"[+-]?(?:0|[1-9]\d*)")  # no leading zero: `007` is a code, not a number
_DECIMAL = re.compile(r"[+-]?(\d+)(?:\.(\d+))?")
_DECIMAL_LOOSE = re.compile(r"[+-]?(\d*)(?:\.(\d*))?")
_FLOAT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?))?(Z|[+-]\d{2}:?\d{2})?")
_TRUE_FALSE = {"true", "false"}
_BOOLEAN_WORDS = {"true", "false", "t", "f", "yes", "no", "y", "n", "1", "0"}  # what Spark's cast accepts


class SeedFileError(ValueError):
    """A CSV that cannot be split into records; `line` and `col` are 1-based."""

    def __init__(self, message: str, line: int, col: int, hint: str):
        super().__init__(message)
        self.line, self.col, self.hint = line, col, hint


@dataclass(frozen=True)
class Parsed:
    header: list[tuple[str, int]]  # (name as written, column number)
    rows: list[tuple[int, list[str | None]]]  # (line where the record starts, fields); None: an empty unquoted field


def decode(data: bytes) -> str:
    """The text of a seed: UTF-8 with an optional BOM, line ends as LF (CRLF and CR alike, also
    inside quoted values: a checkout on Windows holds the same rows). UnicodeDecodeError as is."""
    text = data.decode("utf-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse(text: str, delimiter: str = ",") -> Parsed:
    """RFC 4180 records of `text` (see `decode`): the first is the header. A quoted field may hold
    the delimiter, newlines and quotes written twice (`""`); `""` is an empty string, an empty
    unquoted field is null. Wholly blank lines are skipped. SeedFileError at the first record
    that cannot be split."""
    d = re.escape(delimiter)
    quoted = re.compile(r'"((?:[^"]|"")*)"')
    plain = re.compile(rf'[^{d}"\n]*')
    records: list[tuple[int, list[str | None]]] = []
    pos, line, line_start, n = 0, 1, 0, len(text)
    while pos < n:
        if text[pos] == "\n":  # a blank line
            pos += 1
            line += 1
            line_start = pos
            continue
        start_line, fields = line, []
        while True:
            if pos < n and text[pos] == '"':
                m = quoted.match(text, pos)
                if m is None:
                    raise SeedFileError("a quoted value is never closed", line, pos - line_start + 1,
                                        'close it with a quote; a quote inside a quoted value is written twice ("")')
                value = m.group(1)
                breaks = value.count("\n")
                if breaks:
                    line += breaks
                    line_start = text.rfind("\n", pos, m.end()) + 1
                fields.append(value.replace('""', '"'))
            else:
                m = plain.match(text, pos)
                fields.append(m.group(0) or None)
            pos = m.end()
            if pos >= n or text[pos] == "\n":
                records.append((start_line, fields))
                pos += 1
                line += 1
                line_start = pos
                break
            if text[pos] == delimiter:
                pos += 1
                continue
            col = pos - line_start + 1
            if text[pos] == '"':
                raise SeedFileError("a quote inside an unquoted value", line, col,
                                    'quote the whole value and write the quote twice: "say ""hi"""')
            raise SeedFileError(f"text after the closing quote of a value: {text[pos:pos + 10]!r}", line, col,
                                "a quoted value ends at a delimiter or the end of the line")
    if not records:
        return Parsed([], [])
    (_, head), rows = records[0], records[1:]
    return Parsed([((name or "").strip(), i + 1) for i, name in enumerate(head)], rows)


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_file(root, rel: str) -> bytes | OSError:
    """The bytes of the seed root/rel as a compile reads them (no link, no special file, at most
    MAX_BYTES + 1 bytes)."""
    from compiler.project import _read_regular

    return _read_regular(root, rel, MAX_BYTES + 1)


def unreadable_seed(files, name: str) -> str | None:
    """The file of seed `name` when there is one but it did not become a table (its errors are
    reported at it): what a ref() to it says instead of "no table"."""
    return next((rel for rel in files.listing(FOLDER, (".csv",)) if rel.rsplit("/", 1)[-1] == f"{name}.csv"), None)


def is_seed(step) -> bool:
    """Whether a plan step (or its graph node's attributes) writes a seed."""
    config = step.get("config") if isinstance(step, Mapping) else step.config
    return bool((config or {}).get("seed"))


# --- reading the project's seeds -------------------------------------------------------------


def add_seeds(files, sources: Mapping[str, Any], tables: dict[str, Any], errors: Collector, cache=None) -> None:
    """Reads seeds/**/*.csv and seeds/**/*.yml and adds a table to `tables` for each seed."""
    from compiler import project as p

    csvs = files.listing(FOLDER, (".csv",))
    yml = files.listing(FOLDER, (".yml", ".yaml"))
    if not csvs and not yml:
        return
    declared: dict[str, tuple[Doc, tuple, dict]] = {}
    for doc, name, path, config in p._entries(files, FOLDER, "tables", errors, _check_seed, cache):
        if name in declared:
            errors.error(doc.at(path, key=True), f"seed '{name}' is declared twice (first at {declared[name][0].at(declared[name][1], key=True)})",
                         "seed names are unique across all files in seeds/")
            continue
        declared[name] = (doc, path, config)
    found: dict[str, str] = {}
    for rel in csvs:
        name = rel.rsplit("/", 1)[-1][: -len(".csv")]
        if not p._check_name(Doc(rel, None), (), name, "seed", errors):
            continue
        if name in found:
            errors.error(Location(rel, 1), f"seed '{name}' has two files: {found[name]} and {rel}", "seed names are unique across all folders of seeds/: rename one")
            continue
        found[name] = rel
        doc, path, config = declared.get(name) or (Doc(rel, None), (), schema.Checker(Doc(rel, None), errors).section(SEED, {}, (), f"seed '{name}'"))
        where = doc.at(path, key=True) if path else Location(rel, 1)
        other = tables.get(name) or next((t for t in tables.values() if t.name.lower() == name.lower()), None)
        if other is not None:
            errors.error(where, f"seed '{name}' ({rel}) has the name of table '{other.name}' (declared at {other.location})",
                         "rename the CSV file or the table: ref() names one table or seed")
            continue
        src = sources.get(name) or next((s for s in sources.values() if s.name.lower() == name.lower()), None)
        if src is not None:
            errors.error(where, f"seed '{name}' ({rel}) has the name of source '{src.name}' (declared at {src.location})",
                         "rename the CSV file or the source: tables and sources share one namespace of SQL names")
            continue
        seed = _read_seed(files, rel, name, doc, path, config, errors)
        if seed is not None:
            tables[name] = p.Table(name=name, config=_table_config(config, seed, doc, errors), doc=doc, path=path)
    for name, (doc, path, _) in sorted(declared.items()):
        if name not in found:
            errors.error(doc.at(path, key=True), f"seed '{name}' is declared here but there is no seeds/**/{name}.csv",
                         did_you_mean(name, found) or f"add the CSV file seeds/{name}.csv, or remove the entry")


def _check_seed(doc: Doc, name: str, body: Any, p: tuple, errors: Collector) -> dict[str, Any]:
    config = schema.Checker(doc, errors).section(SEED, body, p, f"seed '{name}'")
    delimiter = config["delimiter"]
    if delimiter is not None and (len(delimiter) != 1 or delimiter in '"\n\r'):
        errors.error(doc.at(p + ("delimiter",)), f"delimiter of seed '{name}' is {delimiter!r}; it must be one character, not a quote or a newline",
                     "e.g. `delimiter: \";\"` or a tab: `delimiter: \"\\t\"`")
        config["delimiter"] = ","
    types = {}
    for col, typ in (config["column_types"] or {}).items():
        canon = column_type(col, typ, f"seed '{name}'", doc.at(p + ("column_types", col)), errors)
        if canon is not None:
            types[col] = canon
    config["column_types"] = types
    return config


def column_type(col: str, typ: Any, owner: str, at: Location, errors: Collector) -> str | None:
    """The canonical Spark type `typ` declares for column `col` in `column_types`, or None with
    the mistake reported: a type a value written as text can be cast to (a scalar)."""
    if not isinstance(typ, str):
        errors.error(at, f"type of column '{col}' in column_types of {owner} must be a string such as BIGINT")
        return None
    try:
        parsed = parse_columns(f"`{col}` {typ}")
    except ColumnsError as exc:
        errors.error(at, f"column '{col}' in column_types of {owner}: {exc}", exc.hint)
        return None
    canon = parsed[0]["type"]
    if _base(canon) not in (*_SCALAR, "decimal", "varchar", "char"):
        errors.error(at, f"column '{col}' of {owner} has type {canon}, which a value written as text cannot hold",
                     "use scalar columns (STRING, BOOLEAN, INT, BIGINT, DOUBLE, DECIMAL(p,s), DATE, TIMESTAMP, ...): "
                     "declare it STRING and convert it in SQL")
        return None
    return canon


def _base(typ: str) -> str:
    return typ.split("(", 1)[0]


@dataclass(frozen=True)
class _Seed:
    rel: str
    sha256: str
    size: int
    rows: int
    columns: list[dict[str, str]]


def _read_seed(files, rel: str, name: str, doc: Doc, path: tuple, config: dict, errors: Collector) -> _Seed | None:
    data = files.contents[rel]
    if not isinstance(data, OSError) and len(data) > MAX_BYTES:
        errors.error(Location(rel, 1), f"seed '{name}' is larger than {MAX_BYTES // (1024 * 1024)} MB; a seed goes through the driver whole",
                     "keep large data out of seeds/: read it with a `kind: files` source (sources/*.yml), which Spark's executors read")
        return None
    text = files.text(rel, errors)  # UTF-8, universal newlines; what cannot be read is reported at its line
    if text is None:
        return None
    text = text.removeprefix("\ufeff")  # as `decode` reads it at run time
    try:
        parsed = parse(text, config["delimiter"])
    except SeedFileError as exc:
        errors.error(Location(rel, exc.line, exc.col), f"seed '{name}': {exc}", exc.hint)
        return None
    if not parsed.header:
        errors.error(Location(rel, 1), f"seed file '{rel}' is empty: it needs a header line naming the columns",
                     "write the column names on the first line, e.g. `code,name`")
        return None
    before = len(errors.errors)
    names = _check_header(rel, name, parsed, config["delimiter"], errors)
    if len(errors.errors) > before:
        return None
    _check_ragged(rel, parsed, len(names), config["delimiter"], errors)
    if len(errors.errors) > before:
        return None
    lower = {n.lower(): n for n in names}
    for col in config["column_types"]:
        if col.lower() not in lower:
            errors.error(doc.at(path + ("column_types", col), key=True), f"column_types names column '{col}', which {rel} does not have",
                         did_you_mean(col, names) or "its columns: " + ", ".join(names))
    for setting in ("key", "partition_by"):
        for i, col in enumerate(config[setting]):
            if col.lower() not in lower:
                errors.error(doc.at(path + (setting, i)), f"{setting} column '{col}' of seed '{name}' is not a column of {rel}",
                             did_you_mean(col, names) or "its columns: " + ", ".join(names))
    declared = {lower[c.lower()]: t for c, t in config["column_types"].items() if c.lower() in lower}
    columns = []
    for i, col in enumerate(names):
        values = (fields[i] for _, fields in parsed.rows)
        if col in declared:
            _check_values(rel, col, declared[col], ((line, fields[i]) for line, fields in parsed.rows), errors)
            columns.append({"name": col, "type": declared[col]})
        else:
            columns.append({"name": col, "type": infer_type(values)})
    keys = [lower[c.lower()] for c in config["key"] if c.lower() in lower]
    if keys and len(keys) == len(config["key"]):  # (a key column the file lacks is reported above)
        _check_keys(rel, name, names, keys, columns, parsed, errors)
    if len(errors.errors) > before:
        return None
    return _Seed(rel, file_hash(data), len(data), len(parsed.rows), columns)


def _check_header(rel: str, name: str, parsed: Parsed, delimiter: str, errors: Collector) -> list[str]:
    names, seen = [], {}
    for col_name, number in parsed.header:
        at = Location(rel, 1, number)
        if not col_name:
            errors.error(at, f"column {number} of seed '{name}' has no name in the header", "name every column on the first line")
        elif not schema.NAME_RE.match(col_name) or avro_name_problem(col_name, "") is not None:
            fixed = re.sub(r"[^A-Za-z0-9_]", "_", col_name)
            errors.error(at, f"header of seed '{name}': '{col_name}' is not a valid column name",
                         f"use letters, digits and _, starting with a letter or _ (it becomes a SQL and Avro name), e.g. {fixed if schema.NAME_RE.match(fixed) else '_' + fixed}")
        elif col_name.lower() in seen:
            errors.error(at, f"header of seed '{name}' names column '{col_name}' twice (first as column {seen[col_name.lower()]})",
                         "give every column its own name (Spark ignores case in names)")
        else:
            seen[col_name.lower()] = number
        names.append(col_name)
    return names


def _check_ragged(rel: str, parsed: Parsed, width: int, delimiter: str, errors: Collector) -> None:
    bad = [(line, len(fields)) for line, fields in parsed.rows if len(fields) != width]
    for line, count in bad[:_MAX_REPORTED]:
        errors.error(Location(rel, line), f"row has {count} field{'s' if count != 1 else ''}, the header has {width}",
                     f"a value that holds the delimiter {delimiter!r} or a newline must be quoted: \"Paris, France\"")
    if len(bad) > _MAX_REPORTED:
        errors.error(Location(rel, bad[_MAX_REPORTED][0]), f"{len(bad) - _MAX_REPORTED} more rows have another number of fields than the header")


def _check_values(rel: str, col: str, typ: str, values, errors: Collector) -> None:
    bad = 0
    for line, value in values:
        if value is None:
            continue
        problem = value_problem(value, typ)
        if problem is None:
            continue
        bad += 1
        if bad <= _MAX_REPORTED:
            errors.error(Location(rel, line), f"value {value!r} of column '{col}' does not fit its type {typ}: {problem}",
                         f"fix the value, or declare another type in column_types (STRING holds anything)")
    if bad > _MAX_REPORTED:
        errors.error(Location(rel, 1), f"{bad - _MAX_REPORTED} more values of column '{col}' do not fit its type {typ}")


def _check_keys(rel: str, name: str, names: list[str], keys: list[str], columns: list[dict[str, str]], parsed: Parsed, errors: Collector) -> None:
    index = [names.index(k) for k in keys]
    types = [columns[i]["type"] for i in index]
    first: dict[tuple, int] = {}
    reported = 0
    for line, fields in parsed.rows:
        values = [fields[i] for i in index]
        said = ", ".join(f"{k}={v!r}" for k, v in zip(keys, values))
        if any(v is None for v in values):
            missing = [k for k, v in zip(keys, values) if v is None]
            errors.error(Location(rel, line), f"key column {', '.join(missing)} of seed '{name}' is empty in this row ({said})",
                         "every row needs its key: fill it in, or remove the row")
            reported += 1
        else:
            canon = tuple(_canonical(v, t) for v, t in zip(values, types))
            if canon in first:
                errors.error(Location(rel, line), f"duplicate key ({said}) in seed '{name}': line {first[canon]} has it too",
                             "keep one row per key, or change `key:` in the seed's YAML")
                reported += 1
            else:
                first[canon] = line
        if reported >= _MAX_REPORTED:
            return


def _canonical(value: str, typ: str) -> Any:
    """A key value as the table will hold it (`01` and `1` are one BIGINT)."""
    v = value.strip()
    base = _base(typ)
    try:
        if base in _INTEGERS:
            return int(v)
        if base == "decimal":
            return Decimal(v).normalize()
        if base == "boolean":
            return v.lower() in ("true", "t", "yes", "y", "1")
        if base in ("double", "float"):
            return float(v)
        if base == "date":
            return _dt.date.fromisoformat(v)
        if base in ("timestamp", "timestamp_ntz"):
            return _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except (ValueError, InvalidOperation):
        pass
    return value


# --- types -------------------------------------------------------------------------------------


def infer_type(values) -> str:
    """The Spark type of a column that column_types does not declare, from its non-null values:
    `boolean` when all are true/false; `bigint` when all are integers that fit (without a
    leading zero: `007` is a code); `decimal(p,s)` when all are plain decimals (`12.50`) that
    fit in 38 digits, else `double` (also for exponents: `1.5e3`); `date` for ISO dates
    (`2024-03-01`); `timestamp` for ISO timestamps, or dates mixed with them
    (`2024-03-01T10:15:00`, `2024-03-01 10:15:00.123`, with `Z` or an offset); else `string`.
    A column with no value at all is a string."""
    kinds: set[str] = set()
    int_digits = scale = 0
    for value in values:
        if value is None:
            continue
        v = value.strip()
        if v.lower() in _TRUE_FALSE:
            kinds.add("boolean")
        elif _PLAIN_INT.fullmatch(v) and -(2**63) <= int(v) < 2**63:
            kinds.add("bigint")
            int_digits = max(int_digits, len(v.lstrip("+-")))
        elif (m := _DECIMAL.fullmatch(v)) and not (len(m.group(1)) > 1 and m.group(1).startswith("0")):
            kinds.add("decimal")
            int_digits = max(int_digits, len(m.group(1)))
            scale = max(scale, len(m.group(2) or ""))
        elif _FLOAT.fullmatch(v) and not _INT.fullmatch(v):
            kinds.add("double")
        elif _DATE.fullmatch(v) and _valid_date(v):
            kinds.add("date")
        elif _TIMESTAMP.fullmatch(v) and _valid_timestamp(v):
            kinds.add("timestamp")
        else:
            return "string"
    if not kinds:
        return "string"
    if len(kinds) == 1 and kinds <= {"boolean", "bigint", "date", "timestamp", "double"}:
        return kinds.pop()
    if kinds <= {"bigint", "decimal"}:
        precision = max(int_digits + scale, 1)
        return f"decimal({precision},{scale})" if precision <= 38 else "double"
    if kinds <= {"bigint", "decimal", "double"}:
        return "double"
    if kinds == {"date", "timestamp"}:
        return "timestamp"
    return "string"


def value_problem(value: str, typ: str) -> str | None:
    """Why `value` (not null) cannot be cast to Spark type `typ`, or None when it can."""
    v = value.strip()
    base = _base(typ)
    if base in _INTEGERS:
        if not _INT.fullmatch(v):
            return "not an integer"
        bound = _INTEGERS[base]
        return None if -bound <= int(v) < bound else f"outside the range of {base} ({-bound} to {bound - 1})"
    if base == "decimal":
        m = _DECIMAL_LOOSE.fullmatch(v)
        if not m or not (m.group(1) or m.group(2)):
            return "not a decimal number"
        precision, scale = (int(x) for x in re.findall(r"\d+", typ)) if "(" in typ else (10, 0)
        whole, frac = (m.group(1) or "").lstrip("0"), m.group(2) or ""
        if len(frac.rstrip("0")) > scale:
            return f"more than {scale} digit{'s' if scale != 1 else ''} after the point"
        if len(whole) > precision - scale:
            return f"more than {precision - scale} digit{'s' if precision - scale != 1 else ''} before the point"
        return None
    if base in ("float", "double"):
        return None if _FLOAT.fullmatch(v) else "not a number"
    if base == "boolean":
        return None if v.lower() in _BOOLEAN_WORDS else "not true or false"
    if base == "date":
        return None if _DATE.fullmatch(v) and _valid_date(v) else "not a date written YYYY-MM-DD"
    if base in ("timestamp", "timestamp_ntz"):
        m = _TIMESTAMP.fullmatch(v)
        if not m or not _valid_timestamp(v):
            return "not a timestamp written YYYY-MM-DD[ HH:MM[:SS[.ffffff]]][Z|+HH:MM]"
        if base == "timestamp_ntz" and m.group(3):
            return "a timestamp_ntz has no time zone"
        return None
    if base in ("varchar", "char"):
        length = int(re.findall(r"\d+", typ)[0])
        return None if len(value) <= length else f"longer than {length} characters"
    return None


def _valid_date(v: str) -> bool:
    try:
        _dt.date.fromisoformat(v)
        return True
    except ValueError:
        return False


def _valid_timestamp(v: str) -> bool:
    try:
        _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


# --- the table of a seed -------------------------------------------------------------------------


def _table_config(config: dict, seed: _Seed, doc: Doc, errors: Collector) -> dict[str, Any]:
    """The table settings of a seed: a table's defaults with the seed's key and partitioning,
    written whole each time (insert_overwrite_table), its columns declared as `schema` (what
    SQL reading it may select) and `seed` (what the runtime reads)."""
    base = schema.Checker(doc, errors).section(schema.TABLE, {}, (), "seed")
    names = {c["name"].lower(): c["name"] for c in seed.columns}
    return {
        **base,
        "description": config["description"],
        "tags": config["tags"],
        "columns": config.get("columns"),
        "tests": config.get("tests"),
        "data_tests": config.get("data_tests"),
        "key": [names[k.lower()] for k in config["key"]],
        "partition_by": [names[k.lower()] for k in config["partition_by"]],
        "operation": "insert_overwrite_table",
        "schema": seed.columns,
        "seed": {"file": seed.rel, "sha256": seed.sha256, "bytes": seed.size, "rows": seed.rows,
                 "delimiter": config["delimiter"], "columns": seed.columns},
    }
