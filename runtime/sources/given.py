"""Rows a unit test gives for a table's input (compiler/unit_tests.py), in place of the source or
table the input is in the project: the runtime makes each given input a source of this kind, so
the table step reads it as new input and registers its view under the input's name.

The rows travel from the driver (`createDataFrame`): they are a test's fixture, written in the
project, a few dozen rows, not the data of a source."""

from __future__ import annotations

from typing import Any, Mapping

from runtime.sources import Pending


class GivenPending(Pending):
    def __init__(self, name: str, config: Mapping[str, Any]):
        rows = config["rows"]
        super().__init__(name, "given" if rows else None, len(rows))
        self.columns = config["columns"]
        self.given = rows
        self.rows = len(rows)

    @property
    def is_empty(self) -> bool:
        return False  # no rows is what the test gives: the view exists, empty

    def describe(self) -> str:
        return f"{len(self.given):,} given row{'s' if len(self.given) != 1 else ''}"

    def dataframe(self, spark):
        return frame(spark, self.columns, self.given, f"the rows given for {self.name}")


def frame(session, columns: list[dict[str, str]], rows: list[list[str | None]], what: str,
          hint: str = "declare the column's type in the input's `schema`"):
    """`rows` (text, None for null) as a DataFrame of `columns` and their Spark types: sent as
    strings and cast by Spark (a timestamp without a zone is read in the session's time zone, as
    a SQL literal is). Seeds (runtime/steps/seed.py) and unit tests' rows are made so."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from runtime.errors import RunError, spark_message

    raw = StructType([StructField(f"c{i}", StringType(), True) for i in range(len(columns))])
    df = session.createDataFrame([tuple(r) for r in rows], raw)
    casts = []
    for i, c in enumerate(columns):
        value = F.col(f"c{i}")
        typ = (c["type"] or "string").lower()
        if typ != "string" and not typ.startswith(("varchar", "char")):  # lengths: checked by the compiler
            value = F.trim(value).cast(c["type"])
        casts.append(value.alias(c["name"]))
    try:
        return df.select(*casts)
    except Exception as exc:  # noqa: BLE001 - a type Spark refuses
        raise RunError(f"Spark cannot cast {what}: {spark_message(exc)}", hint) from exc


def pending(name: str, config: Mapping[str, Any]) -> GivenPending:
    return GivenPending(name, config)
