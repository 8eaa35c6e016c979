"""Sources: the JSON-lines files of the shop, as streaming tables.

A streaming table reads its folder with Structured Streaming's file source, so every run appends
only the files it has not consumed yet (its checkpoint lives under the spec's `storage`); this is
the counterpart of pipe's `kind: files` sources and their checkpoints."""

import os

from pyspark import pipelines as dp

DATA = os.path.abspath(spark.conf.get("shop.data_dir"))  # noqa: F821 - `spark` is injected by spark-pipelines

ORDERS_SCHEMA = "order_id BIGINT, customer_id BIGINT, amount DOUBLE, status STRING, region STRING, updated_at TIMESTAMP"
CUSTOMERS_SCHEMA = "customer_id BIGINT, name STRING, email STRING, country STRING, updated_at TIMESTAMP"


@dp.table(comment="Order events exported by the shop, JSON lines, one file per export (append-only).")
def raw_orders():
    return spark.readStream.schema(ORDERS_SCHEMA).json(os.path.join(DATA, "orders"))  # noqa: F821


@dp.table(comment="Customer records from the CRM, JSON lines (append-only).")
def raw_customers():
    return spark.readStream.schema(CUSTOMERS_SCHEMA).json(os.path.join(DATA, "customers"))  # noqa: F821
