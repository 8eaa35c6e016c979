"""Details of the files pipe writes that Java Hudi reads the way it writes them itself:
hoodie.table.create.schema, the savepoint's time, and the clean plan's file list."""

from __future__ import annotations

import json

import hudi

from runtime.table import Table, TableConfig
from runtime.table import avro
from runtime.table.config import read_properties

CONFIG = TableConfig(name="orders", record_key_fields=("id", "region"), partition_fields=("region",), precombine_field="ts")
SCHEMA = "id long, region string, ts long, amount decimal(12,2), v string"


def write(spark, table, rows):
    from decimal import Decimal

    return table.write(spark.createDataFrame([(i, r, ts, Decimal("10.25"), v) for i, r, ts, v in rows], SCHEMA), "upsert")


def test_the_first_write_stores_its_schema_as_the_create_schema(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    assert "hoodie.table.create.schema" not in read_properties(table.storage)  # unknown until the first write
    first = write(spark, table, [(1, "eu west", 1_700_000_000_000, "a")])
    props = read_properties(table.storage)
    committed = json.loads((path / f".hoodie/{first.instant}.commit").read_text())["extraMetadata"]["schema"]
    assert props["hoodie.table.create.schema"] == committed
    schema = json.loads(props["hoodie.table.create.schema"])
    assert schema["name"] == "orders_record" and [f["name"] for f in schema["fields"]] == ["id", "region", "ts", "amount", "v"]
    # stored as Java stores it (`:` escaped), and read by hudi-rs, which does not unescape other keys
    raw = (path / ".hoodie/hoodie.properties").read_bytes().decode("ascii")
    assert 'hoodie.table.create.schema={"type"\\:"record"' in raw
    assert not (path / ".hoodie/hoodie.properties.backup").exists()
    write(spark, table, [(1, "eu west", 1_700_000_000_001, "b"), (2, "us", 1_700_000_000_000, "c")])
    assert read_properties(table.storage)["hoodie.table.create.schema"] == committed  # set once, as Java does
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    assert sorted((r["id"], r["v"]) for b in t.read() for r in b.to_pylist()) == [(1, "b"), (2, "c")]


def test_savepoint_time_is_in_millis_and_the_clean_plan_names_files_java_resolves_against_its_base_path(spark, tmp_path):
    import time

    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    writes = [write(spark, table, [(1, "eu west", 1_700_000_000_000 + n, f"v{n}")]).instant for n in range(3)]
    before = time.time() * 1000
    table.savepoint(writes[-1])
    meta = avro.from_bytes((path / f".hoodie/{writes[-1]}.savepoint").read_bytes())
    assert before - 1000 <= meta["savepointedAt"] <= time.time() * 1000  # System.currentTimeMillis(), as Java

    listed = lambda: {p.name for p in (path / "region=eu west").glob("*.parquet")}  # noqa: E731
    before_clean = listed()
    result = table.clean(retain=1)
    deleted = sorted(before_clean - listed())
    plan = avro.from_bytes((path / f".hoodie/{result.instant}.clean.requested").read_bytes())
    # version 1: names per partition; Java's CleanPlanV2MigrationHandler makes each
    # `new StoragePath(constructAbsolutePath(basePath, partition), name)` with its own base path
    # (s3a://, s3://, hdfs://, file:), where a full path of pipe's (s3://) could be the wrong scheme
    assert plan["version"] == 1 and plan["filePathsToBeDeletedPerPartition"] is None
    assert deleted and {p: sorted(fs) for p, fs in plan["filesToBeDeletedPerPartition"].items()} == {"region=eu west": deleted}


def test_columns_avro_refuses_are_refused_before_anything_is_written(spark, tmp_path):
    """Audit exp3: `order-id`, `my col`, `1st` were written, and hudi-rs then failed with
    "Invalid field name order-id" (Java's Schema.Parser refuses them too)."""
    import pytest

    from runtime.table.errors import TableError

    path = tmp_path / "orders"
    table = Table.create(spark, str(path), TableConfig(name="orders", record_key_fields=("id",)))
    before = sorted(p for p in path.rglob("*") if p.is_file())
    df = spark.sql("select 1L as id, 2L as `order-id`, 'x' as `my col`, named_struct('1st', 1) as nested")
    with pytest.raises(TableError) as info:
        table.write(df, "upsert")
    assert "'order-id', 'my col', 'nested.1st'" in str(info.value) and "rename them in the SELECT with `as`" in info.value.hint
    assert sorted(p for p in path.rglob("*") if p.is_file()) == before
