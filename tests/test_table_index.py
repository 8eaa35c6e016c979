"""pipe's index against tables Java's writers share: keys a partition-scoped writer left in
several partitions (Java's default SIMPLE index), and bucket-index tables."""

from __future__ import annotations

import os

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table.errors import TableError

SCHEMA = "id long, p string, ts long, v string"


def rows(table):
    return sorted(tuple(r[c] for c in ("id", "p", "ts", "v")) for r in table.read().collect())


def hudi_rows(path):
    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return sorted(tuple(r[c] for c in ("id", "p", "ts", "v")) for r in pa.Table.from_batches(batches).to_pylist())


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_a_key_stored_in_two_partitions_ends_up_once(spark, tmp_path, table_type):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", table_type=table_type, record_key_fields=("id",), partition_fields=("p",),
                                                   precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "a", 1, "v1"), (2, "a", 1, "v1")], SCHEMA), "upsert")
    # what Java's default (partition-scoped SIMPLE) index does when key 1's partition changes
    table.write(spark.createDataFrame([(1, "b", 2, "v2")], SCHEMA), "upsert", index="partition")
    assert rows(table) == [(1, "a", 1, "v1"), (1, "b", 2, "v2"), (2, "a", 1, "v1")]
    # pipe's global index: updated where the key is in the incoming partition, gone elsewhere
    table.write(spark.createDataFrame([(1, "b", 3, "v3")], SCHEMA), "upsert")
    assert rows(table) == [(1, "b", 3, "v3"), (2, "a", 1, "v1")]
    table.write(spark.createDataFrame([(2, "b", 2, "v2")], SCHEMA), "upsert", index="partition")
    # in neither stored partition: inserted once in the new one, both old copies deleted
    table.write(spark.createDataFrame([(2, "c", 4, "v4")], SCHEMA), "upsert")
    assert rows(table) == [(1, "b", 3, "v3"), (2, "c", 4, "v4")]
    if table_type == "COPY_ON_WRITE":  # hudi-rs reads merge-on-read deletes of this kind too, but slower
        assert hudi_rows(path) == rows(table)


def test_a_bucket_index_table_is_refused_without_its_number_of_buckets(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "a", 1, "v1")], SCHEMA), "upsert")
    # the file group as Java's BUCKET index names it: bucket 3 of the partition
    folder = f"{path}/p=a"
    (name,) = [n for n in os.listdir(folder) if n.endswith(".parquet")]
    bucket = "00000003" + name[8:]
    os.rename(f"{folder}/{name}", f"{folder}/{bucket}")
    commit = next(f for f in os.listdir(f"{path}/.hoodie") if f.endswith(".commit"))
    text = open(f"{path}/.hoodie/{commit}").read().replace(name[:name.index("_")], bucket[:bucket.index("_")])
    open(f"{path}/.hoodie/{commit}", "w").write(text)
    instants = sorted(os.listdir(f"{path}/.hoodie"))
    with pytest.raises(TableError) as info:
        table.write(spark.createDataFrame([(2, "a", 2, "v2")], SCHEMA), "upsert")
    assert "bucket index" in str(info.value) and "table t" in str(info.value) and bucket.split("_")[0] in str(info.value)
    assert "hoodie.index.type=BUCKET" in str(info.value) and "`index: bucket` and `buckets:`" in info.value.hint
    assert sorted(os.listdir(f"{path}/.hoodie")) == instants
    assert rows(table) == [(1, "a", 1, "v1")]  # still read
