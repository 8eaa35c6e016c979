"""Table schemas: Spark types to the Avro writer schema Hudi keeps in commit metadata
(`extraMetadata.schema`), and the rules for how a table's schema may change between writes."""

from __future__ import annotations

import json
import re
from typing import Any

META_COLUMNS = ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path", "_hoodie_file_name")
IS_DELETED = "_hoodie_is_deleted"


class SchemaChangeError(ValueError):
    """An incoming schema the stored table cannot take."""


def _decimal_size(precision: int) -> int:
    size = 1
    while 2 ** (8 * size - 1) < 10**precision:
        size += 1
    return size


def arrow_schema(struct):
    """The Arrow schema of a Spark struct as write tasks store it: timestamps as UTC instants
    tagged UTC (files._with_meta), whatever the session's time zone."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def avro_type(data_type: Any, name: str, namespace: str) -> Any:
    from pyspark.sql import types as T

    t = data_type
    primitive = {
        T.BooleanType: "boolean", T.ByteType: "int", T.ShortType: "int", T.IntegerType: "int", T.LongType: "long",
        T.FloatType: "float", T.DoubleType: "double", T.StringType: "string", T.VarcharType: "string",
        T.CharType: "string", T.BinaryType: "bytes",
    }.get(type(t))
    if primitive is not None:
        return primitive
    if isinstance(t, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(t, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(t, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(t, T.DecimalType):
        return {"type": "fixed", "name": "fixed", "namespace": f"{namespace}.{name}", "size": _decimal_size(t.precision),
                "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if isinstance(t, T.ArrayType):
        return {"type": "array", "items": ["null", avro_type(t.elementType, name, namespace)]}
    if isinstance(t, T.MapType):
        return {"type": "map", "values": ["null", avro_type(t.valueType, name, namespace)]}
    if isinstance(t, T.StructType):
        return {"type": "record", "name": name, "namespace": namespace,
                "fields": [_field(f, f"{namespace}.{name}") for f in t.fields]}
    raise SchemaChangeError(f"column type {t.simpleString()} cannot be stored in a Hudi table")


def _field(f: Any, namespace: str) -> dict[str, Any]:
    return {"name": f.name, "type": ["null", avro_type(f.dataType, f.name, namespace)], "default": None}


# Avro's rule for names (compiler/columns.py has the same one for compile time): Java's
# Schema.Parser and hudi-rs refuse a table schema with any other field name.
_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def invalid_avro_names(struct: Any, prefix: str = "") -> list[str]:
    """The column and nested field names of `struct` that Avro refuses, as dotted paths."""
    from pyspark.sql import types as T

    out = []

    def visit(t: Any, path: str) -> None:
        if isinstance(t, T.StructType):
            for f in t.fields:
                where = f"{path}.{f.name}" if path else f.name
                if not _AVRO_NAME.match(f.name):
                    out.append(where)
                visit(f.dataType, where)
        elif isinstance(t, T.ArrayType):
            visit(t.elementType, path)
        elif isinstance(t, T.MapType):
            visit(t.valueType, path)

    visit(struct, prefix)
    return out


def avro_schema_json(struct: Any, table_name: str, meta: bool = False) -> str:
    """The writer schema Hudi stores in commit metadata: record `<table>_record`, namespace
    `hoodie.<table>`, every field nullable with default null, no meta columns. With `meta`,
    the five meta columns come first, as in a log block's header."""
    namespace = f"hoodie.{table_name}"
    meta_fields = [{"name": c, "type": ["null", "string"], "doc": "", "default": None} for c in META_COLUMNS] if meta else []
    record = {
        "type": "record",
        "name": f"{table_name}_record",
        "namespace": namespace,
        "fields": meta_fields + [_field(f, f"{namespace}.{table_name}_record") for f in struct.fields if f.name not in META_COLUMNS],
    }
    return json.dumps(record, separators=(",", ":"))


def spark_struct(avro_json: str) -> Any:
    """The Spark StructType of a writer schema as commit metadata stores it (the inverse of
    avro_schema_json; Avro's int stands for tinyint and smallint too), meta columns left out.
    For a table whose commits wrote no file yet: its columns are still known."""
    from pyspark.sql import types as T

    def spark_type(t: Any) -> Any:
        if isinstance(t, list):
            branches = [b for b in t if b != "null"]
            if len(branches) != 1:
                raise SchemaChangeError(f"the Avro union {t} has no Spark type")
            return spark_type(branches[0])
        if isinstance(t, str):
            simple = {"boolean": T.BooleanType(), "int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(),
                      "double": T.DoubleType(), "string": T.StringType(), "bytes": T.BinaryType()}.get(t)
            if simple is None:
                raise SchemaChangeError(f"the Avro type {t} has no Spark type")
            return simple
        logical = t.get("logicalType")
        if logical == "date":
            return T.DateType()
        if logical in ("timestamp-micros", "timestamp-millis"):
            return T.TimestampType()
        if logical in ("local-timestamp-micros", "local-timestamp-millis"):
            return T.TimestampNTZType()
        if logical == "decimal":
            return T.DecimalType(t["precision"], t.get("scale", 0))
        kind = t["type"]
        if kind == "array":
            return T.ArrayType(spark_type(t["items"]), True)
        if kind == "map":
            return T.MapType(T.StringType(), spark_type(t["values"]), True)
        if kind == "record":
            return T.StructType([T.StructField(f["name"], spark_type(f["type"]), True) for f in t["fields"]])
        if kind == "enum":
            return T.StringType()
        return spark_type(kind)

    record = spark_type(json.loads(avro_json))
    return T.StructType([f for f in record.fields if f.name not in META_COLUMNS])


# Widenings a stored column may take (Hudi's schema evolution on write allows these).
# Only widenings Spark's Parquet reader performs on files written before the change.
_WIDER = {
    "tinyint": {"smallint", "int", "bigint"},
    "smallint": {"int", "bigint"},
    "int": {"bigint", "double"},
    "float": {"double"},
}


def merge_schemas(stored: Any, incoming: Any, protected: tuple[str, ...]) -> Any:
    """The schema after writing `incoming` into a table whose schema is `stored` (Spark
    StructTypes). New columns are added (old rows read them as null); a stored column missing
    from the input stays (the rows written now hold null); a column may widen. Anything else
    raises SchemaChangeError naming the column. `protected` columns (key, partition,
    precombine) must be present and keep their type."""
    from pyspark.sql import types as T

    by_name = {f.name: f for f in incoming.fields}
    fields = []
    for f in stored.fields:
        new = by_name.get(f.name)
        if new is None:
            if f.name in protected:
                raise SchemaChangeError(f"column '{f.name}' is missing from the input; it is a key, partition or precombine column of the table")
            fields.append(f)
            continue
        old_t, new_t = f.dataType.simpleString(), new.dataType.simpleString()
        if old_t == new_t:
            fields.append(f)
        elif new_t in _WIDER.get(old_t, ()) and f.name not in protected:
            fields.append(T.StructField(f.name, new.dataType, True))
        else:
            raise SchemaChangeError(
                f"column '{f.name}' is {old_t} in the table but {new_t} in the input; "
                "cast it in the SELECT, or rebuild the table with --full-refresh"
            )
    stored_names = {f.name for f in stored.fields}
    fields += [T.StructField(f.name, f.dataType, True) for f in incoming.fields if f.name not in stored_names]
    return T.StructType(fields)
