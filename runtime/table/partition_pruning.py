"""Partition pruning: which partitions of a table can hold rows that meet a read's conditions,
decided from the partition paths alone (Hudi's file index prunes partitions the same way from
the paths' values), so that a read lists, reads and merges only their file slices.

A condition is (column, op, values) as runtime/steps/views.view_filters gives them. Only
conditions on a partition field of type string, an integer type or date count, with a literal
of that type (a number for an integer, a string or DATE literal for a date, a string for a
string): the value a path holds is then exactly the text the key generator wrote
(runtime/table/keygen.py), URL-encoded or not, hive-style or not. Anything else (another type, a
literal Spark would cast, a key generator pipe does not reproduce, a path that does not parse)
keeps the partition: pruning only ever skips partitions that cannot hold a row the read keeps,
and Spark applies the whole query to the rows read."""

from __future__ import annotations

import datetime as dt
import re
from typing import Callable

from runtime.table.layout import DEFAULT_PARTITION

_INTEGERS = ("tinyint", "smallint", "int", "bigint")
_INTEGER_TEXT = re.compile(r"-?\d+")
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_KEY_GENERATORS = ("SimpleKeyGenerator", "ComplexKeyGenerator")


def partition_filter(config, struct, conditions) -> Callable[[str], bool] | None:
    """A test of a partition path: False when none of its rows can meet `conditions`; None when
    no condition can prune this table's partitions."""
    fields = list(config.partition_fields)
    if not fields or not conditions or config.key_generator.rsplit(".", 1)[-1] not in _KEY_GENERATORS:
        return None
    types = {f.name.lower(): f.dataType.simpleString() for f in (struct.fields if struct else [])}
    position = {f.lower(): i for i, f in enumerate(fields)}
    tests = []
    for column, op, values in conditions:
        if column not in position or types.get(column) not in ("string", "date", *_INTEGERS):
            continue
        typed = _typed_values(types[column], values)
        if typed is None:
            continue
        tests.append((position[column], types[column], op, typed))
    if not tests:
        return None

    def keeps(partition: str) -> bool:
        values = _path_values(partition, fields, config.hive_style, config.url_encode)
        if values is None:
            return True
        return all(_meets(values[i], kind, op, typed) for i, kind, op, typed in tests)

    return keeps


def _typed_values(kind: str, values) -> tuple | None:
    """The literals as values of the column's type, or None when Spark would cast one (then
    nothing is pruned by the condition)."""
    out = []
    for literal_kind, text in values:
        if kind == "string" and literal_kind == "string":
            out.append(text)
        elif kind in _INTEGERS and literal_kind == "number" and _INTEGER_TEXT.fullmatch(text):
            out.append(int(text))
        elif kind == "date" and literal_kind in ("string", "date") and _DATE_TEXT.fullmatch(text):
            try:
                out.append(dt.date.fromisoformat(text))
            except ValueError:
                return None
        else:
            return None
    return tuple(out)


def _path_values(partition: str, fields: list[str], hive_style: bool, url_encode: bool) -> list[str | None] | None:
    """The text of each partition field in `partition` (None: the default partition, a null or
    empty value), or None when the path does not parse."""
    segments = partition.split("/") if partition else []
    if len(segments) != len(fields):
        return None
    out: list[str | None] = []
    for field, segment in zip(fields, segments):
        if hive_style:
            if not segment.startswith(f"{field}="):
                return None
            segment = segment[len(field) + 1:]
        if segment == DEFAULT_PARTITION:
            out.append(None)
            continue
        out.append(_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), segment) if url_encode else segment)
    return out


def _meets(text: str | None, kind: str, op: str, values: tuple) -> bool:
    """Whether some row of a partition whose field text is `text` may meet the condition."""
    if op == "is null":
        return text is None  # only the default partition holds nulls
    if text is None:  # null (never meets a comparison) or, for a string, ''
        return kind == "string" and _compare("", op, values)
    if kind in _INTEGERS:
        if not _INTEGER_TEXT.fullmatch(text):
            return True
        value = int(text)
    elif kind == "date":
        try:
            value = dt.date.fromisoformat(text) if _DATE_TEXT.fullmatch(text) else None
        except ValueError:
            value = None
        if value is None:
            return True
    else:
        value = text
    return _compare(value, op, values)


def _compare(value, op: str, values: tuple) -> bool:
    if op == "=":
        return value == values[0]
    if op == "in":
        return value in values
    if op == "between":
        return values[0] <= value <= values[1]
    if op == ">":
        return value > values[0]
    if op == ">=":
        return value >= values[0]
    if op == "<":
        return value < values[0]
    if op == "<=":
        return value <= values[0]
    return True
