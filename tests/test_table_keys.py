"""Record keys and partition paths as Hudi's Java key generators write them (keygen.py): the
ComplexKeyGenerator's single-key encoding (HUDI-7001) and the text of timestamp, decimal and
binary values; tables whose stored keys have another text keep it, never two texts at once."""

from __future__ import annotations

import datetime as dt
import glob
import os
from decimal import Decimal

import hudi
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from runtime.table import Table, TableConfig
from runtime.table.errors import TableError

SCHEMA = "id long, a string, b string, ts long, v string"


def stored(table, *cols):
    return sorted(tuple(r[c] for c in ("_hoodie_record_key", "_hoodie_partition_path", *cols)) for r in table.read().collect())


def hudi_keys(path):
    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return sorted(r["_hoodie_record_key"] for r in pa.Table.from_batches(batches).to_pylist())


def rewrite_stored(path, column, fn):
    """Rewrites one meta column of every base file: a table as another writer left it."""
    for f in glob.glob(f"{path}/**/*.parquet", recursive=True):
        t = pq.read_table(f)
        i = t.schema.get_field_index(column)
        t = t.set_column(i, column, fn(t))
        pq.write_table(t, f)


def set_properties(path, **changes):
    p = f"{path}/.hoodie/hoodie.properties"
    lines = [ln for ln in open(p).read().splitlines() if ln.split("=", 1)[0] not in changes]
    lines += [f"{k}={v}" for k, v in changes.items() if v is not None]
    open(p, "w").write("\n".join(lines) + "\n")


# --- ComplexKeyGenerator with one key field ----------------------------------------------------


def test_one_key_two_partition_fields_writes_field_prefixed_keys_and_declares_it(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("a", "b"), precombine_field="ts"))
    props = open(f"{path}/.hoodie/hoodie.properties").read()
    assert "hoodie.table.keygenerator.class=org.apache.hudi.keygen.ComplexKeyGenerator" in props
    assert "hoodie.table.complex.keygen.encoding=FIELD_PREFIXED" in props
    table.write(spark.createDataFrame([(1, "x", "y", 1, "v1")], SCHEMA), "bulk_insert")  # keys made in the write tasks
    table.write(spark.createDataFrame([(2, "x", "y", 1, "v1")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "x", "y", 2, "v2"), (2, "x", "y", 2, "v2")], SCHEMA), "upsert")
    assert stored(table, "v") == [("id:1", "a=x/b=y", "v2"), ("id:2", "a=x/b=y", "v2")]
    assert hudi_keys(path) == ["id:1", "id:2"]
    assert Table.open(spark, path).config.complex_key_encoding == "FIELD_PREFIXED"


def _java_complex_table(spark, path, prefixed: bool):
    """A table keyed like one Java's ComplexKeyGenerator wrote with one key field and no
    encoding property: `id:1` (0.14.0, or 0.14.2+ by default) or `1` (0.14.1, 0.15.0, 1.0.0-1.0.2)."""
    s = "id long, p string, ts long, v string"
    table = Table.create(spark, path, TableConfig(name="jc", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "a", 1, "v1"), (2, "a", 1, "v1")], s), "upsert")
    set_properties(path, **{"hoodie.table.keygenerator.class": "org.apache.hudi.keygen.ComplexKeyGenerator"})
    if prefixed:
        rewrite_stored(path, "_hoodie_record_key", lambda t: pc.binary_join_element_wise("id:", t.column("_hoodie_record_key"), ""))
    return Table.open(spark, path), s


@pytest.mark.parametrize("prefixed", [True, False], ids=["id:1", "bare"])
def test_upsert_and_delete_keep_the_single_key_text_the_table_has(spark, tmp_path, prefixed):
    path = str(tmp_path / "t")
    table, s = _java_complex_table(spark, path, prefixed)
    assert "complex.keygen.encoding" not in open(f"{path}/.hoodie/hoodie.properties").read()
    table.write(spark.createDataFrame([(1, "a", 2, "v2"), (3, "a", 2, "v2")], s), "upsert")
    table.write(spark.createDataFrame([(2,)], "id long"), "delete")
    k = (lambda i: f"id:{i}") if prefixed else str
    assert stored(table, "id", "v") == [(k(1), "p=a", 1, "v2"), (k(3), "p=a", 3, "v2")]


# --- the text of timestamp, decimal and binary values -----------------------------------------

VALUES = "k timestamp, n timestamp_ntz, d decimal(20,10), bin binary, day date, x double, v string"
ROW_TS = dt.datetime(2024, 1, 1, 10, 0, tzinfo=dt.timezone.utc)


def _rows(spark, v="v1"):
    rows = [
        (ROW_TS, dt.datetime(2024, 1, 1, 10, 0), Decimal("0.0000000001"), b"abc", dt.date(2024, 1, 1), 1e-5, v),
        (ROW_TS + dt.timedelta(microseconds=1), dt.datetime(1969, 12, 31, 23, 59, 59), Decimal("0"), b"\x00\xff", dt.date(2024, 1, 2), 1e10, v),
        (ROW_TS + dt.timedelta(seconds=1), dt.datetime(2024, 1, 1), Decimal("-0.0000000150"), b"/:", dt.date(2024, 1, 3), 0.5, v),
        (ROW_TS + dt.timedelta(seconds=2), dt.datetime(2024, 1, 1), Decimal("1.5"), b"", dt.date(2024, 1, 4), -0.0, v),
    ]
    return spark.createDataFrame(rows, VALUES)


# What Java's key generators write for the rows above (Long.toString of the epoch micros,
# BigDecimal.toString, lower-case hex, LocalDate, Double.toString)
JAVA_KEYS = [
    "k:1704103200000000,n:1704103200000000,d:1E-10",
    "k:1704103200000001,n:-1000000,d:0E-10",
    "k:1704103201000000,n:1704067200000000,d:-1.50E-8",
    "k:1704103202000000,n:1704067200000000,d:1.5000000000",
]
JAVA_PARTITIONS = [
    "bin=616263/day=2024-01-01/x=1.0E-5/d=1E-10",
    "bin=00ff/day=2024-01-02/x=1.0E10/d=0E-10",
    "bin=2f3a/day=2024-01-03/x=0.5/d=-1.50E-8",
    "bin=__HIVE_DEFAULT_PARTITION__/day=2024-01-04/x=-0.0/d=1.5000000000",
]


@pytest.mark.parametrize("operation, zone", [("upsert", "America/Los_Angeles"), ("bulk_insert", "UTC")])
def test_keys_and_partition_paths_of_timestamps_decimals_and_binary_are_javas(spark, tmp_path, zone, operation):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k", "n", "d"), partition_fields=("bin", "day", "x", "d")))
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        table.write(_rows(spark), operation)
        table.write(_rows(spark, "v2"), "upsert")  # the same keys again: updates, in place
        got = stored(table, "v")
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert [(k, p) for k, p, _ in got] == sorted(zip(JAVA_KEYS, JAVA_PARTITIONS))
    assert {v for *_, v in got} == {"v2"}
    assert sorted(os.listdir(f"{path}/bin=616263/day=2024-01-01/x=1.0E-5")) == ["d=1E-10"]


def test_single_timestamp_key_and_partition_are_epoch_micros(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("k",)))
    table.write(spark.createDataFrame([(ROW_TS, "x")], "k timestamp, v string"), "upsert")
    assert stored(table) == [("1704103200000000", "k=1704103200000000")]
    assert hudi_keys(path) == ["1704103200000000"]


def test_a_table_with_pipes_former_timestamp_text_keeps_it(spark, tmp_path):
    """Tables pipe wrote before took Spark's cast to string; their keys stay as they are."""
    path = str(tmp_path / "t")
    s = "k timestamp, p string, v string"
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("p",)))
    table.write(spark.createDataFrame([(ROW_TS, "a", "v1")], s), "upsert")
    rewrite_stored(path, "_hoodie_record_key", lambda t: pa.array(["2024-01-01 10:00:00"]))
    table = Table.open(spark, path)
    table.write(spark.createDataFrame([(ROW_TS, "a", "v2"), (ROW_TS + dt.timedelta(hours=1), "a", "v2")], s), "upsert")
    assert stored(table, "v") == [("2024-01-01 10:00:00", "p=a", "v2"), ("2024-01-01 11:00:00", "p=a", "v2")]


def test_a_table_whose_key_text_pipe_cannot_make_is_refused(spark, tmp_path):
    path = str(tmp_path / "t")
    s = "k timestamp, p string, v string"
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("p",)))
    table.write(spark.createDataFrame([(ROW_TS, "a", "v1")], s), "upsert")
    # Java with consistent.logical.timestamp.enabled, in a JVM west of UTC: java.sql.Timestamp text
    rewrite_stored(path, "_hoodie_record_key", lambda t: pa.array(["2024-01-01 02:00:00.0"]))
    table = Table.open(spark, path)
    instants = sorted(os.listdir(f"{path}/.hoodie"))
    with pytest.raises(TableError) as info:
        table.write(spark.createDataFrame([(ROW_TS, "a", "v2")], s), "upsert")
    assert "2024-01-01 02:00:00.0" in str(info.value) and "table t" in str(info.value)
    assert "consistent.logical.timestamp" in info.value.hint
    assert sorted(os.listdir(f"{path}/.hoodie")) == instants  # nothing written


def test_partitions_named_by_rows_take_the_tables_text(spark, tmp_path):
    """delete_partition with SQL names partitions by rows (executor): their paths are the text
    the table writes, e.g. epoch micros for a timestamp."""
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", partition_fields=("ts", "d")))
    df = spark.createDataFrame([(ROW_TS, Decimal("0.0000000001"))], "ts timestamp, d decimal(20,10)")
    assert table.partition_paths(df) == {"ts=1704103200000000/d=1E-10"}
