"""Column lists in Spark's DDL (`"id BIGINT, tags ARRAY<STRING>, price DECIMAL(10,2)"`),
parsed without Spark so that `pipe compile` can check key and precombine columns and name the
column a typo is in. Types are normalised to Spark's lower-case spelling."""

from __future__ import annotations

import re

from compiler.errors import did_you_mean

# Spark SQL type names and their canonical spelling.
_ATOMIC = {
    "boolean": "boolean", "bool": "boolean",
    "tinyint": "tinyint", "byte": "tinyint",
    "smallint": "smallint", "short": "smallint",
    "int": "int", "integer": "int",
    "bigint": "bigint", "long": "bigint",
    "float": "float", "real": "float",
    "double": "double",
    "string": "string",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp", "timestamp_ltz": "timestamp", "timestamp_ntz": "timestamp_ntz",
    "void": "void",
}
_PARAMETRIC = {"decimal": "decimal", "dec": "decimal", "numeric": "decimal", "varchar": "varchar", "char": "char"}

# The columns a `kafka` source adds to the fields of every message's value (runtime/sources/kafka.py)
KAFKA_COLUMNS = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key")
# The columns `format: debezium` adds to each change's row (runtime/sources/debezium.py);
# `_hoodie_is_deleted` makes a delete event delete its key
CDC_COLUMNS = ("_cdc_op", "_cdc_position", "_cdc_ts", "_cdc_table", "_hoodie_is_deleted")

# Avro's rule for a field name (Hudi keeps a table's schema in Avro: commit metadata, log block
# headers); Java's Schema.Parser and hudi-rs refuse any other name, so such a table is unreadable.
_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def avro_name_problem(name: str, what: str) -> tuple[str, str] | None:
    """(message, hint) when column `name` of `what` cannot be an Avro field name, else None."""
    if _AVRO_NAME.match(name):
        return None
    fixed = re.sub(r"[^A-Za-z0-9_]", "_", name)
    fixed = fixed if _AVRO_NAME.match(fixed) else "_" + fixed
    return (f"column '{name}' of {what} is not a valid Avro name, so Hudi readers (Java, hudi-rs) could not read the table",
            f"names are letters, digits and _, not starting with a digit: rename it with `as`, e.g. `{name}` as {fixed}")


_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')|(.))")


class ColumnsError(ValueError):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class _Parser:
    def __init__(self, text: str):
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                break
            tok = next((g for g in m.groups() if g is not None), None)
            if tok is not None and tok.strip():
                self.tokens.append(tok)
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ColumnsError("the column list ends too early")
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.take()
        if got != tok:
            raise ColumnsError(f"expected '{tok}' but found '{got}'")

    def name(self) -> str:
        tok = self.take()
        if tok.startswith("`"):
            return tok[1:-1].replace("``", "`")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", tok):
            raise ColumnsError(f"expected a column name but found '{tok}'")
        return tok

    def type(self) -> str:
        word = self.take()
        low = word.lower()
        if low in _ATOMIC:
            return _ATOMIC[low]
        if low in _PARAMETRIC:
            canon = _PARAMETRIC[low]
            if self.peek() != "(":
                if canon == "decimal":
                    return "decimal(10,0)"  # as Spark reads a bare DECIMAL
                raise ColumnsError(f"{word.upper()} needs a length, e.g. {word.upper()}(255)",
                                   f"write {word.upper()}(n), or STRING for text of any length")
            self.expect("(")
            args = [self.take()]
            while self.peek() == ",":
                self.take()
                args.append(self.take())
            self.expect(")")
            if not all(a.isdigit() for a in args):
                raise ColumnsError(f"{word}(...) takes numbers, found {', '.join(args)}")
            _check_parameters(word, canon, [int(a) for a in args])
            return f"{canon}({','.join(args)})"
        if low == "array":
            self.expect("<")
            inner = self.type()
            self.expect(">")
            return f"array<{inner}>"
        if low == "map":
            self.expect("<")
            k = self.type()
            self.expect(",")
            v = self.type()
            self.expect(">")
            return f"map<{k},{v}>"
        if low == "struct":
            self.expect("<")
            fields = []
            while self.peek() != ">":
                fname = self.name()
                if self.peek() == ":":
                    self.take()
                fields.append(f"{fname}:{self.type()}")
                self._modifiers()
                if self.peek() == ",":
                    self.take()
            self.expect(">")
            return f"struct<{','.join(fields)}>"
        known = sorted(set(_ATOMIC) | set(_PARAMETRIC) | {"array", "map", "struct"})
        raise ColumnsError(f"unknown type '{word}'", did_you_mean(low, known) or "use a Spark SQL type such as BIGINT, STRING, DOUBLE, TIMESTAMP, DECIMAL(10,2)")

    def _modifiers(self) -> None:
        while (tok := self.peek()) is not None and tok.upper() in ("NOT", "NULL", "COMMENT"):
            self.take()
            if tok.upper() == "NOT":
                self.expect("NULL") if self.peek() and self.peek().upper() == "NULL" else None
            elif tok.upper() == "COMMENT":
                comment = self.take()
                if not comment.startswith("'"):
                    raise ColumnsError("COMMENT must be followed by a quoted string")


MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType.MAX_PRECISION (and Avro's fixed-size decimals in Hudi)


def _check_parameters(word: str, canon: str, args: list[int]) -> None:
    """The numbers of DECIMAL(p,s), VARCHAR(n) and CHAR(n) as Spark accepts them."""
    shown = f"{word.upper()}({','.join(map(str, args))})"
    if canon == "decimal":
        if len(args) > 2:
            raise ColumnsError(f"{shown} has {len(args)} numbers", "write DECIMAL(precision,scale), e.g. DECIMAL(10,2)")
        precision, scale = args[0], args[1] if len(args) == 2 else 0
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ColumnsError(f"{shown}: precision {precision} is out of range (1 to {MAX_DECIMAL_PRECISION}, Spark's maximum)",
                               f"use at most DECIMAL({MAX_DECIMAL_PRECISION},{min(scale, MAX_DECIMAL_PRECISION)}), or DOUBLE or STRING for larger numbers")
        if scale > precision:
            raise ColumnsError(f"{shown}: scale {scale} is larger than precision {precision}",
                               f"the scale counts digits after the point, within the precision: e.g. DECIMAL({max(scale, 10)},{scale})")
    elif len(args) != 1:
        raise ColumnsError(f"{shown} takes one number, the length", f"write {word.upper()}(n), e.g. {word.upper()}(255)")


def parse_columns(text: str) -> list[dict[str, str]]:
    """[{"name": ..., "type": ...}] from a DDL column list; ColumnsError says what is wrong."""
    p = _Parser(text)
    cols: list[dict[str, str]] = []
    seen: set[str] = set()
    if p.peek() is None:
        raise ColumnsError("the column list is empty", "write columns as \"id BIGINT, name STRING\"")
    while p.peek() is not None:
        name = p.name()
        if p.peek() == ":":
            p.take()
        typ = p.type()
        p._modifiers()
        if name.lower() in seen:
            raise ColumnsError(f"column '{name}' is declared twice")
        seen.add(name.lower())
        cols.append({"name": name, "type": typ})
        if p.peek() is None:
            break
        p.expect(",")
    return cols
