"""Java Hudi's BLOOM and GLOBAL_BLOOM indexes on pipe tables (interop audit #13): Java 0.15
upserts into a table pipe wrote, looking keys up in the bloom filters and key ranges of pipe's
base-file footers; every reader then sees each key once, with Java's update. Before pipe wrote
those footers, Java's upsert failed (NullPointerException in HoodieKeyLookupHandle.addKey).
Needs the Java harness of tests/java_hudi (fixture java_hudi_015); run alone with
`pytest -m java_hudi`."""

from __future__ import annotations

import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from tests.java_hudi.client import hudi_rs, pipe_read, rows

pytestmark = [pytest.mark.java_hudi, pytest.mark.spark]

SQL = "id string, region string, ts bigint, v string"
COLUMNS = ["_hoodie_record_key", "id", "region", "ts", "v"]


def orders(ids, version: int) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": [f"id-{i}/ü" for i in ids], "region": ["EU" if i % 2 else "US/East" for i in ids],
                     "ts": [1_732_000_000_000 + version * 1000 + i for i in ids], "v": [f"v{version}-{i}" for i in ids]})


@pytest.mark.parametrize("index", ["BLOOM", "GLOBAL_BLOOM"])
@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_java_bloom_index_upserts_into_a_pipe_table(spark, tmp_path, java_hudi_015, table_type, index):
    path = tmp_path / "orders"
    config = TableConfig("orders", table_type=table_type, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    Table.create(spark, str(path), config).write(spark.createDataFrame(orders(range(500), 1).to_pylist(), SQL), "upsert")
    update = orders(list(range(0, 500, 7)) + list(range(500, 520)), 2)  # updates in both partitions, and new keys
    java_hudi_015.write(path, update, {
        "hoodie.table.name": "orders", "hoodie.datasource.write.operation": "upsert",
        "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
        "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
        "hoodie.datasource.write.keygenerator.class": config.key_generator,
        "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
        "hoodie.index.type": index, "hoodie.metadata.enable": "false"})

    expected = {r["id"]: r["v"] for r in orders(range(500), 1).to_pylist()}
    expected.update({r["id"]: r["v"] for r in update.to_pylist()})
    mine = rows(pipe_read(Table.open(spark, str(path))), COLUMNS)
    assert len(mine) == len({r[1] for r in mine}) == 520, "a key twice"
    assert {r[1]: r[4] for r in mine} == expected
    assert rows(java_hudi_015.read(path), COLUMNS) == mine, "Java"
    assert rows(hudi_rs(path), COLUMNS) == mine, "hudi-rs"
