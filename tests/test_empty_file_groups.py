"""A write that leaves a file group without rows writes an empty base file for it. Tables with
TIMESTAMP, DATE and DECIMAL columns once crashed there (an Arrow schema built without a time
zone), and every later write of the table failed the same way."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import hudi
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ

SCHEMA = "order_id bigint, order_date date, region string, amount decimal(12,2), updated_at timestamp, v string"
UTC = dt.timezone.utc


def _row(order_id, day, region, amount, minute, v):
    return (order_id, dt.date(2024, 3, day), region, Decimal(amount), dt.datetime(2024, 3, day, 9, minute, tzinfo=UTC), v)


FIRST = [_row(1, 1, "EU", "25.50", 0, "a"), _row(2, 1, "EU", "99.99", 5, "b"), _row(3, 2, "APAC", "240.00", 10, "c")]


def _create(spark, path, table_type, partition):
    config = TableConfig(name="orders", table_type=table_type, record_key_fields=("order_id",),
                         partition_fields=(partition,), precombine_field="updated_at")
    table = Table.create(spark, path, config)
    table.write(spark.createDataFrame(FIRST, SCHEMA), "upsert")
    return table


def _ours(table):
    return sorted((r["order_id"], r["region"], r["v"]) for r in table.read(meta=False).collect())


def _hudi(path):
    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return sorted((r["order_id"], r["region"], r["v"]) for r in rows)


def _empty_partition_emptied(table, path, partition_dir):
    """The partition's latest base file has the table's columns and no rows."""
    view = table.view()
    slices = [s for s in view.latest_slices() if s.partition == partition_dir]
    assert slices, f"no file group left in {partition_dir}"
    for s in slices:
        assert s.base_file is not None and not s.has_logs
        meta = pq.read_metadata(f"{path}/{s.base_file.path}")
        assert meta.num_rows == 0
        schema = meta.schema.to_arrow_schema()
        assert schema.field("updated_at").type == pa.timestamp("us", "UTC")
        assert schema.field("order_date").type == pa.date32()
        assert schema.field("amount").type == pa.decimal128(12, 2)


def _empty_then_write_again(spark, table, path, table_type):
    if table_type == MERGE_ON_READ:  # the delete went to a log file; compaction empties the group
        assert table.compact() is not None
    # the table is not stuck: the next write and both readers work
    table.write(spark.createDataFrame([_row(4, 3, "US", "5.25", 30, "d")], SCHEMA), "upsert")
    return _ours(table), _hudi(path)


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_an_upsert_that_deletes_the_last_row_of_a_partition(spark, tmp_path, table_type):
    path = str(tmp_path / "t")
    table = _create(spark, path, table_type, "region")
    gone = spark.createDataFrame([(*_row(3, 2, "APAC", "240.00", 20, "c"), True)], SCHEMA + ", _hoodie_is_deleted boolean")
    result = table.write(gone, "upsert")
    assert result.deletes == 1
    ours, theirs = _empty_then_write_again(spark, table, path, table_type)
    assert ours == theirs == [(1, "EU", "a"), (2, "EU", "b"), (4, "US", "d")]
    _empty_partition_emptied(table, path, "region=APAC")


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_delete_of_every_row_of_a_partition(spark, tmp_path, table_type):
    path = str(tmp_path / "t")
    table = _create(spark, path, table_type, "order_date")
    keys = spark.createDataFrame([_row(1, 1, "EU", "0", 40, ""), _row(2, 1, "EU", "0", 40, "")], SCHEMA)
    assert table.write(keys, "delete").deletes == 2
    ours, theirs = _empty_then_write_again(spark, table, path, table_type)
    assert ours == theirs == [(3, "APAC", "c"), (4, "US", "d")]
    _empty_partition_emptied(table, path, "order_date=2024-03-01")


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_row_that_moves_out_of_the_only_row_of_its_partition(spark, tmp_path, table_type):
    path = str(tmp_path / "t")
    table = _create(spark, path, table_type, "order_date")
    # order 3 was the only order of 2024-03-02; its date changes (the global index moves it)
    moved = spark.createDataFrame([_row(3, 4, "APAC", "240.00", 0, "moved")], SCHEMA)
    table.write(moved, "upsert")
    ours, theirs = _empty_then_write_again(spark, table, path, table_type)
    assert ours == theirs == [(1, "EU", "a"), (2, "EU", "b"), (3, "APAC", "moved"), (4, "US", "d")]
    _empty_partition_emptied(table, path, "order_date=2024-03-02")


def test_an_emptied_partition_keeps_the_tables_columns_for_readers(spark, tmp_path):
    """A table whose only rows were deleted still reads with its columns and types."""
    path = str(tmp_path / "t")
    table = _create(spark, path, COPY_ON_WRITE, "region")
    everything = spark.createDataFrame(FIRST, SCHEMA)
    table.write(everything, "delete")
    df = table.read(meta=False)
    assert df.count() == 0
    assert dict(df.dtypes)["updated_at"] == "timestamp" and dict(df.dtypes)["amount"] == "decimal(12,2)"


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_first_commit_without_rows_still_has_the_tables_columns(spark, tmp_path, table_type):
    """A downstream `ref()` joins on the columns of a table whose first run had no input."""
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="orders", table_type=table_type, record_key_fields=("order_id",),
                                                  partition_fields=("region",), precombine_field="updated_at"))
    table.write(spark.createDataFrame([], SCHEMA), "upsert")
    df = Table.open(spark, path).read(meta=False)
    assert df.dtypes == [("order_id", "bigint"), ("order_date", "date"), ("region", "string"), ("amount", "decimal(12,2)"),
                         ("updated_at", "timestamp"), ("v", "string")]
    other = spark.createDataFrame([(1, "x")], "order_id bigint, w string")
    assert other.join(df, "order_id", "left").select("w", "v").collect()[0].asDict() == {"w": "x", "v": None}
