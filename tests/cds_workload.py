"""What the driver that makes the tests' class-data-sharing archive does (tests/jvm_options.py):
what pipe's drivers do, so that the classes they load are the archive's. `python -m
tests.cds_workload FOLDER`."""

from __future__ import annotations

import sys

from runtime.spark.session import get_spark
from runtime.table import Table, TableConfig
from runtime.table.config import MERGE_ON_READ


def main(folder: str) -> None:
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    schema = "id long, region string, ts long, amount decimal(12,2), at timestamp, v string"
    rows = lambda n, v: [(i, "EU" if i % 2 else "US", n, None, None, f"{v}-{i}") for i in range(1, 50)]  # noqa: E731
    for kind in ("cow", "mor"):
        config = TableConfig(name=kind, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts",
                             **({"table_type": MERGE_ON_READ} if kind == "mor" else {}))
        table = Table.create(spark, f"{folder}/{kind}", config)
        table.write(spark.createDataFrame(rows(1, "a"), schema), "upsert")
        table.write(spark.createDataFrame(rows(2, "b"), schema), "upsert")
        table.read().groupBy("region").count().collect()
    spark.sql("select 1 as x").toPandas()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
