"""Tables in a catalog (docs/catalog.md): the example project registered in a Hive metastore
(a metastore service, as a cluster has, and the embedded Derby one pipe makes in the project
folder) and in AWS Glue (the moto server), kept in sync over several runs, and read back by
name by another Spark: Spark 3.5 with Hudi 0.15.0's bundle, in its own process."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import pyarrow as pa
import pytest
import yaml

from tests.conftest import TEMPLATE, compile_errors, write_project
from tests.test_run import assert_clean, hudi_rows, pipe, run_results, steps

pytestmark = pytest.mark.java_hudi

# round 2: order 1 shipped again later, order 5 updated, a new region, an order with a customer
NEW_ORDERS = [
    {"order_id": 1, "customer_id": 101, "amount": 25.5, "status": "delivered", "region": "eu", "updated_at": "2024-03-04T08:00:00Z"},
    {"order_id": 5, "customer_id": 104, "amount": 5.25, "status": "packed", "region": "us", "updated_at": "2024-03-04T09:00:00Z"},
    {"order_id": 9001, "customer_id": 105, "amount": 1234.56, "status": "placed", "region": "latam", "updated_at": "2024-03-04T10:30:00.250Z"},
]
ORDER_COLUMNS = ["order_id", "customer_id", "amount", "status", "region", "updated_at"]
EVENTS = {
    "tables/order_events.yml": """
        tables:
          order_events:
            description: The latest status of each order, merge-on-read (updates go to log files).
            type: merge_on_read
            key: [order_id]
            precombine: updated_at
            partition_by: [region]
            small_file_limit: 0
            compaction:
              max_delta_commits: 5
        """,
    "tables/order_events.sql": "select order_id, lower(status) as status, upper(region) as region, updated_at from {{ source('raw_orders') }}\n",
}


def _targets(hms_uri: str, moto: str) -> str:
    spark = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}}
    with_hms = {**spark, "conf": {**spark["conf"], "spark.hadoop.hive.metastore.uris": hms_uri}}
    down = {**spark, "conf": {**spark["conf"], "spark.hadoop.hive.metastore.uris": "thrift://127.0.0.1:9",
                              "spark.hadoop.hive.metastore.connect.retries": 1}}
    return yaml.safe_dump({"targets": {
        "hms": {"spark": with_hms, "catalog": {"kind": "spark"}},
        "hms_down": {"spark": down, "catalog": {"kind": "spark"}},
        "glue": {"spark": spark, "catalog": {"kind": "glue", "database": "lakehouse", "table_prefix": "shop_",
                                             "region": "us-east-1", "endpoint_url": moto}},
    }}, sort_keys=False)


def _example(root: Path, targets: str) -> Path:
    shutil.copytree(TEMPLATE, root, ignore=shutil.ignore_patterns("__pycache__", "lake", "target", "spark-warehouse"))
    text = (root / "pipe_project.yml").read_text()
    text = text.replace("default_target: dev", "default_target: hms", 1)
    (root / "pipe_project.yml").write_text(text[:text.index("\ntargets:\n")] + "\n" + targets + text[text.index("\nvars:\n"):])
    for rel, body in EVENTS.items():
        (root / rel).write_text(textwrap.dedent(body).lstrip("\n"))
    (root / "tests/unit/orders.yml").unlink()  # orders is redefined here: the example's unit test does not apply
    return root


def _pipe_in_process(root: Path, *args: str) -> tuple[int, str, str]:
    """`pipe ARGS` in this process (the tests' Spark session), its output captured (a module
    fixture has no capsys)."""
    import contextlib
    import io

    from pipe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--project-dir", str(root)])
    return code, out.getvalue(), err.getvalue()


def _java_rows(java, table: str, columns: list[str]) -> list[tuple]:
    java.sql(f"refresh table {table}")
    rows = java.sql(f"select {', '.join(columns)} from {table}")
    return sorted(tuple(r) for r in rows)


def _lake_rows(root: Path, table: str, columns: list[str]) -> list[tuple]:
    """hudi-rs's rows, with timestamps as Spark's JSON answer shows them."""
    out = []
    for r in hudi_rows(root, table, columns):
        out.append(tuple(v.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") if hasattr(v, "strftime") else v for v in r))
    return sorted(out)


def _glue_table(glue, name: str) -> dict:
    t = glue.get_table(DatabaseName="lakehouse", Name=name)["Table"]
    parts = glue.get_partitions(DatabaseName="lakehouse", TableName=name)["Partitions"]
    return {"columns": [(c["Name"], c["Type"]) for c in t["StorageDescriptor"]["Columns"]],
            "keys": [(k["Name"], k["Type"]) for k in t["PartitionKeys"]], "location": t["StorageDescriptor"]["Location"],
            "input": t["StorageDescriptor"]["InputFormat"], "params": t["Parameters"],
            "serde": t["StorageDescriptor"]["SerdeInfo"]["Parameters"],
            "partitions": sorted((tuple(p["Values"]), p["StorageDescriptor"]["Location"]) for p in parts)}


# the example's orders as Spark reads them from the catalog: Hudi's meta columns, then the data's
ORDERS_SCHEMA = ("struct<_hoodie_commit_time:string,_hoodie_commit_seqno:string,_hoodie_record_key:string,_hoodie_partition_path:string,"
                 "_hoodie_file_name:string,order_id:bigint,customer_id:bigint,amount:double,status:string,updated_at:timestamp,region:string>")


def what_a_metastore_holds(root: Path, uris: str = "", database: str = "shop") -> tuple[str, str, str]:
    """What plain Spark with Hive support, started in the project folder `root` in a process of its
    own, finds of `database`.orders: the embedded Derby metastore there, or the one at `uris`.
    Three lines: the tables of the database, the table (provider, type, location, schema), and
    its region partitions."""
    script = textwrap.dedent("""
        import sys
        from pyspark.sql import SparkSession
        builder = SparkSession.builder.master("local[1]").enableHiveSupport()
        if sys.argv[1]:
            builder = builder.config("spark.hadoop.hive.metastore.uris", sys.argv[1])
        spark = builder.getOrCreate()
        db = sys.argv[2]
        print(sorted(r.tableName for r in spark.sql(f"show tables in {db}").collect()))
        catalog = spark._jsparkSession.sharedState().externalCatalog()  # what the metastore holds
        t = catalog.getTable(db, "orders")
        print([t.provider().get(), t.tableType().name(), t.location().toString(), t.schema().simpleString()])
        parts = catalog.listPartitions(db, "orders", spark._jvm.scala.Option.empty())
        print(sorted(parts.apply(i).spec().apply("region") for i in range(parts.size())))
        """)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    proc = subprocess.run([sys.executable, "-c", script, uris, database], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables, table, partitions = proc.stdout.strip().splitlines()[-3:]
    return tables, table, partitions


@pytest.fixture(scope="module")
def hudi_sql(hive_metastore, tmp_path_factory):
    """Spark 3.5 with Hudi 0.15.0's bundle and Hive support, on the tests' metastore service."""
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import HUDI_015, ensure

    ensure()
    java = JavaHudi(HUDI_015, tmp_path_factory.mktemp("hudi-sql"), conf={
        "spark.sql.catalogImplementation": "hive", "spark.hadoop.hive.metastore.uris": hive_metastore.uri})
    yield java
    java.close()


@pytest.fixture(scope="module")
def shop(spark, hive_metastore, moto_server, tmp_path_factory, hudi_sql):
    """The example (with a merge-on-read table) run three rounds: (1) on `hms`, then registered
    in Glue by `pipe sync --target glue`; (2) new orders on `hms_down`, whose metastore is not
    there (the commits stand, the syncs warn), caught up by runs on `glue` and `hms` that find
    no new input; (3) region US deleted by `delete_partition` on `glue`, then `pipe sync
    --target hms orders`. What each reader saw is kept after each round."""
    root = _example(tmp_path_factory.mktemp("catalog") / "shop", _targets(hive_metastore.uri, moto_server))
    glue = boto3.client("glue", endpoint_url=moto_server, region_name="us-east-1")
    out = {"root": root, "glue": glue, "runs": {}, "java": {}, "glue_tables": {}}

    def run(name, *args):
        got, o, e = _pipe_in_process(root, *args)
        assert got == 0, f"pipe {' '.join(args)} exited {got}\n{o}\n{e}"
        assert_clean(o, e)
        out["runs"][name] = (o, e, run_results(root) if args[0] == "run" else None)

    def read(label):
        out["java"][label] = {t: _java_rows(hudi_sql, f"shop.{t}", ["order_id", "status", "region"])
                              for t in ("orders", "order_events_ro", "order_events_rt")}
        out["java"][label]["partitions"] = sorted(r[0] for r in hudi_sql.sql("show partitions shop.orders"))  # Hudi lists storage
        out["java"][label]["metastore"] = hudi_sql.catalog_partitions("shop", "orders", ["region"])  # what the metastore holds
        out["glue_tables"][label] = {t: _glue_table(glue, t) for t in ("shop_orders", "shop_order_events_rt", "shop_customers")}

    run("hms_1", "run")
    run("glue_sync_1", "sync", "--target", "glue")
    read("round 1")
    out["lake"] = {"round 1": _lake_rows(root, "orders", ["order_id", "status", "region"])}

    (root / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
    sql = (root / "tables/orders.sql").read_text()
    (root / "tables/orders.sql").write_text(sql.replace("    updated_at\n", "    updated_at,\n    cast(amount * 100 as bigint) as amount_cents\n"))
    run("hms_down_2", "run", "--target", "hms_down")
    run("glue_2", "run", "--target", "glue")
    run("hms_2", "run")
    read("round 2")
    out["lake"]["round 2"] = _lake_rows(root, "orders", ["order_id", "status", "region"])
    out["java"]["cents"] = _java_rows(hudi_sql, "shop.orders", ["order_id", "amount_cents"])

    (root / "tables/orders.sql").unlink()
    (root / "tables/orders.yml").write_text(textwrap.dedent("""
        tables:
          orders:
            key: [order_id]
            precombine: updated_at
            partition_by: [region]
            operation: delete_partition
            partitions_to_delete: ["region=US"]
        """))
    run("glue_3", "run", "--target", "glue", "--select", "orders")
    run("hms_sync_3", "sync", "orders")
    read("round 3")
    out["lake"]["round 3"] = _lake_rows(root, "orders", ["order_id", "status", "region"])
    return out


def test_a_hive_metastore_has_every_table_and_java_hudi_reads_them_by_name(shop):
    o, e, results = shop["runs"]["hms_1"]
    st = {s["id"]: s for s in results["steps"]}
    assert "registered shop.orders, +3 partition(s)" in st["table.orders"]["message"], st["table.orders"]
    assert st["table.order_events"]["catalog"]["names"] == ["shop.order_events_ro", "shop.order_events_rt"]
    assert st["table.customers"]["catalog"]["created"] == ["shop.customers"]
    java = shop["java"]["round 1"]
    assert java["orders"] == shop["lake"]["round 1"] and len(java["orders"]) == 6
    assert java["partitions"] == ["region=APAC", "region=EU", "region=US"]
    lake = (shop["root"] / "lake").resolve()
    assert java["metastore"] == [((r,), f"file:{lake}/orders/region={r}") for r in ("APAC", "EU", "US")]
    # merge-on-read: one deltacommit so far, so read-optimized and real-time agree
    assert java["order_events_ro"] == java["order_events_rt"]


def test_a_sync_that_failed_warns_and_the_next_run_catches_up(shop):
    o, e, results = shop["runs"]["hms_down_2"]
    st = {s["id"]: s for s in results["steps"]}
    assert results["success"] is True  # the commits stand
    orders = st["table.orders"]
    assert orders["state"] == "warn" and orders["instant"], orders
    assert "catalog sync failed: cannot reach the Hive metastore (thrift://127.0.0.1:9)" in orders["message"], orders
    assert "`pipe sync orders`" in orders["hint"]
    assert "warning in table.orders" in e and "succeeded with a warning" in o
    # the next run (no new input) syncs what the failed one left
    st2 = {s["id"]: s for s in shop["runs"]["hms_2"][2]["steps"]}
    assert st2["table.orders"]["state"] == "no_input"
    assert st2["table.orders"]["catalog"]["instant"] == orders["instant"]
    assert st2["table.orders"]["catalog"]["partitions_added"] == 1 and not st2["table.orders"]["catalog"]["full"]
    assert st2["table.orders"]["catalog"]["columns_changed"] == ["shop.orders"]


def test_a_partition_and_a_column_that_appear_are_read_by_name(shop):
    java = shop["java"]["round 2"]
    assert java["partitions"] == ["region=APAC", "region=EU", "region=LATAM", "region=US"]
    assert [v for v, _ in java["metastore"]] == [("APAC",), ("EU",), ("LATAM",), ("US",)]
    assert java["orders"] == shop["lake"]["round 2"]
    assert (9001, "placed", "LATAM") in java["orders"] and (1, "delivered", "EU") in java["orders"]
    cents = dict(shop["java"]["cents"])
    assert cents[9001] == 123456 and cents[5] == 525 and cents[3] is None  # order 3 was not in the new input
    # merge-on-read: the updates are in log files, which only the real-time table merges
    ro, rt = dict(((r[0], r[1]) for r in java["order_events_ro"])), dict(((r[0], r[1]) for r in java["order_events_rt"]))
    assert rt[1] == "delivered" and ro[1] == "shipped" and rt[9001] == "placed"


def test_delete_partition_drops_the_partition_in_both_catalogs(shop):
    java = shop["java"]["round 3"]
    assert java["partitions"] == ["region=APAC", "region=EU", "region=LATAM"]
    assert [v for v, _ in java["metastore"]] == [("APAC",), ("EU",), ("LATAM",)]
    assert java["orders"] == shop["lake"]["round 3"] and not [r for r in java["orders"] if r[2] == "US"]
    glue = shop["glue_tables"]["round 3"]["shop_orders"]
    assert [v for v, _ in glue["partitions"]] == [("APAC",), ("EU",), ("LATAM",)]
    out = shop["runs"]["hms_sync_3"][0]
    assert "orders: synced shop.orders, -1 partition(s)" in out


def test_glue_holds_the_tables_as_hudis_glue_sync_does(shop):
    root = shop["root"]
    first = shop["glue_tables"]["round 1"]
    assert "registered lakehouse.shop_orders, +3 partition(s)" in shop["runs"]["glue_sync_1"][0]
    orders = first["shop_orders"]
    lake = (root / "lake").resolve().as_uri()
    assert orders["location"] == f"{lake}/orders" and orders["serde"]["path"] == f"{lake}/orders"
    assert orders["input"] == "org.apache.hudi.hadoop.HoodieParquetInputFormat"
    assert orders["columns"][:5] == [(c, "string") for c in ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key",
                                                             "_hoodie_partition_path", "_hoodie_file_name")]
    assert orders["columns"][5:] == [("order_id", "bigint"), ("customer_id", "bigint"), ("amount", "double"), ("status", "string"),
                                     ("updated_at", "timestamp")]
    assert orders["keys"] == [("region", "string")]
    assert orders["partitions"] == [(("APAC",), f"{lake}/orders/region=APAC"), (("EU",), f"{lake}/orders/region=EU"),
                                    (("US",), f"{lake}/orders/region=US")]
    params = orders["params"]
    assert params["spark.sql.sources.provider"] == "hudi" and params["spark.sql.sources.schema.partCol.0"] == "region"
    schema = json.loads(params["spark.sql.sources.schema.part.0"])
    assert [f["name"] for f in schema["fields"]][-1] == "region"  # partition columns last, as Spark keeps them
    rt = first["shop_order_events_rt"]
    assert rt["input"] == "org.apache.hudi.hadoop.realtime.HoodieParquetRealtimeInputFormat" and rt["serde"]["hoodie.query.as.ro.table"] == "false"
    assert first["shop_customers"]["keys"] == [] and first["shop_customers"]["partitions"] == []
    # round 2, synced by a run on the glue target that found no new input: a partition, a column
    second = shop["glue_tables"]["round 2"]["shop_orders"]
    assert ("amount_cents", "bigint") in second["columns"]
    assert [v for v, _ in second["partitions"]] == [("APAC",), ("EU",), ("LATAM",), ("US",)]
    synced = {s["id"]: s for s in shop["runs"]["glue_2"][2]["steps"]}["table.orders"]
    assert synced["state"] == "no_input" and synced["catalog"]["partitions_added"] == 1, synced
    assert second["params"]["last_commit_time_sync"] == synced["catalog"]["instant"]


def test_a_full_sync_compares_every_partition_and_a_missing_marker_brings_one(shop):
    """What others did to the catalog: a partition added by hand, one moved elsewhere, the
    marker of a merge-on-read table's `_ro` lost (a sync that stopped half-way)."""
    root, glue = shop["root"], shop["glue"]
    table = glue.get_table(DatabaseName="lakehouse", Name="shop_orders")["Table"]
    sd = table["StorageDescriptor"]
    glue.batch_create_partition(DatabaseName="lakehouse", TableName="shop_orders", PartitionInputList=[
        {"Values": ["XX"], "StorageDescriptor": {**sd, "Location": "s3://elsewhere/orders/region=XX"}}])
    glue.update_partition(DatabaseName="lakehouse", TableName="shop_orders", PartitionValueList=["EU"],
                          PartitionInput={"Values": ["EU"], "StorageDescriptor": {**sd, "Location": "s3://old-lake/orders/region=EU"}})
    ro = glue.get_table(DatabaseName="lakehouse", Name="shop_order_events_ro")["Table"]
    params = {k: v for k, v in ro["Parameters"].items() if k != "last_commit_time_sync"}
    glue.update_table(DatabaseName="lakehouse", TableInput={
        "Name": ro["Name"], "TableType": ro["TableType"], "Parameters": params, "PartitionKeys": ro["PartitionKeys"],
        "StorageDescriptor": ro["StorageDescriptor"]})

    code, out, err = _pipe_in_process(root, "sync", "--target", "glue")
    assert code == 0, out + err
    assert "orders: lakehouse.shop_orders up to date" in out  # its marker says so: partitions are not looked at
    assert "order_events: synced lakehouse.shop_order_events_ro, lakehouse.shop_order_events_rt" in out and "every partition compared" in out
    assert glue.get_table(DatabaseName="lakehouse", Name="shop_order_events_ro")["Table"]["Parameters"]["last_commit_time_sync"]

    code, out, err = _pipe_in_process(root, "sync", "--target", "glue", "--full", "orders")
    assert code == 0, out + err
    assert "orders: synced lakehouse.shop_orders, -1 partition(s)" in out, out
    lake = (root / "lake").resolve().as_uri()
    assert _glue_table(glue, "shop_orders")["partitions"] == [
        (("APAC",), f"{lake}/orders/region=APAC"), (("EU",), f"{lake}/orders/region=EU"), (("LATAM",), f"{lake}/orders/region=LATAM")]
    # and on the Hive metastore: every partition listed, nothing to change
    code, out, err = _pipe_in_process(root, "sync", "--full", "orders")
    assert code == 0, out + err
    assert "orders: synced shop.orders (instant" in out and "every partition compared" in out


def test_an_embedded_metastore_in_the_project_folder_is_what_spark_finds_there(spark, tmp_path, capsys):
    """No metastore named: pipe makes a Derby one in the project folder, where a Spark session
    with Hive support started in that folder finds the tables (another process, plain Spark)."""
    root = _example(tmp_path / "shop", yaml.safe_dump({"targets": {"hms": {"spark": {"master": "local[2]"}, "catalog": {"kind": "spark"}}}}))
    code, out, err = pipe(capsys, root, "run", "--select", "orders")
    assert code == 0, out + err
    assert_clean(out, err)
    assert steps(root)["table.orders"]["catalog"]["created"] == ["shop.orders"]
    assert (root / "metastore_db").is_dir()
    # Derby lets one process open its database: this one lets go of it, as pipe's process would by ending
    try:
        spark._jvm.java.sql.DriverManager.getConnection(f"jdbc:derby:;databaseName={root / 'metastore_db'};shutdown=true")
    except Exception as exc:  # noqa: BLE001 - Derby says it shut the database down with an exception
        assert "shutdown" in str(exc).lower(), exc
    tables, table, partitions = what_a_metastore_holds(root)
    assert tables == "['orders']"
    assert table == str(["hudi", "EXTERNAL", (root / "lake/orders").as_uri(), ORDERS_SCHEMA])
    assert partitions == "['APAC', 'EU', 'US']"


# --- compile time: settings checked where they are written; pipe diff ------------------------------


def test_catalog_settings_are_checked_with_their_line(tmp_path):
    root = write_project(tmp_path / "p", {"pipe_project.yml": """
        name: shop
        targets:
          dev:
            catalog:
              kind: hive
          prod:
            catalog:
              kind: glue
              database: Sales-DB
              table_prefix: "raw-"
          other:
            catalog:
              kind: spark
              region: eu-west-1
        """})
    errs = compile_errors(root)
    assert [(str(d.location), d.message) for d in errs] == [
        ("pipe_project.yml:5:13", "unknown value 'hive' for 'kind' in 'catalog' of target 'dev'"),
        ("pipe_project.yml:9:17", "invalid catalog database name 'Sales-DB'"),
        ("pipe_project.yml:10:21", "invalid table_prefix 'raw-'"),
        ("pipe_project.yml:14:15", "'region' applies to catalog kind glue only (this target's kind is spark)")]
    assert errs[1].hint.endswith("(catalogs keep names in lower case)") and "choose one of: none, spark, glue" in errs[0].hint


def test_diff_names_the_tables_a_catalog_change_renames_or_moves(tmp_path, capsys):
    from compiler.api import compile_project
    from compiler.diff import diff_plans

    root = _example(tmp_path / "shop", _targets("thrift://127.0.0.1:9083", "http://127.0.0.1:5000"))
    base = compile_project(root, target="hms").plan
    head = compile_project(root, target="glue").plan
    change = next(c for c in diff_plans(base, head).target_changes if c.field == "catalog")
    assert change.cls == "metadata-only"
    assert change.before == {"kind": "spark", "database": "shop", "table_prefix": ""}
    assert "tables are registered in AWS Glue instead of Spark's Hive metastore" in change.why
    assert "orders: shop.orders -> lakehouse.shop_orders" in change.why
    assert "order_events: shop.order_events_ro, shop.order_events_rt -> lakehouse.shop_order_events_ro, lakehouse.shop_order_events_rt" in change.why
    assert base.to_dict()["target"]["catalog"] == {"kind": "spark", "database": "shop", "table_prefix": ""}
    # a target without a catalog leaves the plan as it was
    plain = write_project(tmp_path / "plain", {})
    assert "catalog" not in compile_project(plain).plan.to_dict()["target"]


def test_pipe_sync_says_what_is_missing(tmp_path, capsys):
    root = _example(tmp_path / "shop", _targets("thrift://127.0.0.1:9083", "http://127.0.0.1:5000"))
    code, out, err = pipe(capsys, root, "sync", "--target", "glue", "order")
    assert code == 2 and "no table named 'order' in project shop" in err and "orders" in err
    plain = _example(tmp_path / "plain", yaml.safe_dump({"targets": {"plain": {"spark": {"master": "local[1]"}}}}))
    code, out, err = pipe(capsys, plain, "sync", "--target", "plain")
    assert code == 2 and "target plain has no catalog to sync to" in err and "docs/catalog.md" in err
    # a table not built yet is said, not an error; Glue is reached without Spark
    code, out, err = pipe(capsys, root, "sync", "--target", "glue", "customers")
    assert code == 0, err
    assert "customers: not built yet" in out and "its first run registers it" in out


def test_two_tables_registered_under_one_name_are_refused(tmp_path):
    root = write_project(tmp_path / "p", {
        "pipe_project.yml": "name: shop\ntargets:\n  dev:\n    catalog:\n      kind: glue\n",
        "sources/s.yml": "sources:\n  raw:\n    kind: files\n    path: data\n    format: json\n    schema: 'id BIGINT'\n",
        "tables/t.yml": "tables:\n  events:\n    type: merge_on_read\n    key: [id]\n  events_rt:\n    key: [id]\n",
        "tables/events.sql": "select * from {{ source('raw') }}\n",
        "tables/events_rt.sql": "select * from {{ source('raw') }}\n",
    })
    errs = compile_errors(root)
    assert [(str(d.location), d.message) for d in errs] == [
        ("tables/t.yml:5:3", "table events_rt would be registered as shop.events_rt, which table events is registered as too")]
    assert "table_prefix" in errs[0].hint


def test_a_version_9_table_is_synced_by_completion_time_so_a_commit_that_completes_late_is_not_missed(spark, moto_server, tmp_path):
    """Hudi 1.x's tables sync as Hudi 1.x's sync tools do: write A (new partition APAC) starts
    before write B (new partition LATAM) and completes after it, as an overlapping writer's
    does. The sync after B (A still in flight) registers LATAM and marks B's completion time;
    the next sync looks at what completed after that, A, and registers APAC without listing
    the table. last_commit_time_sync and last_commit_completion_time_sync are Java 1.x's."""
    from runtime.sync import definitions, sync_table
    from runtime.sync.glue import GlueCatalog
    from runtime.table import Table, TableConfig

    schema = "id long, region string, ts long, v string"
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",),
                                                       precombine_field="ts", create_version=9))
    rows = [(i, ("EU", "US")[i % 2], 1_700_000_000_000 + i, f"Zoë {i}") for i in range(400)]
    table.write(spark.createDataFrame(rows, schema), "bulk_insert")
    catalog = GlueCatalog("us-east-1", moto_server)
    glue = boto3.client("glue", endpoint_url=moto_server, region_name="us-east-1")

    def sync():
        table_now = Table.open(spark, str(path))
        timeline = table_now.timeline()
        specs = definitions({"kind": "glue"}, ["late.orders"], table_now, table_now.writer_schema(timeline), path.as_uri())
        return sync_table(catalog, specs, table_now, timeline), timeline

    first, _ = sync()
    assert first.created == ["late.orders"] and first.full and first.added == 2
    a = table.write(spark.createDataFrame([(i, "APAC", 1_700_000_100_000, "a") for i in range(1000, 1050)], schema), "upsert")
    b = table.write(spark.createDataFrame([(i, "LATAM", 1_700_000_200_000, "b") for i in range(2000, 2030)], schema), "upsert")
    folder = path / ".hoodie" / "timeline"
    done_a = next(folder.glob(f"{a.instant}_*.commit"))
    hidden = done_a.rename(tmp_path / done_a.name)  # A in flight
    after_b, timeline = sync()
    done_b = timeline.find(b.instant).completion
    assert not after_b.full and after_b.added == 1 and after_b.completion == done_b
    params = glue.get_table(DatabaseName="late", Name="orders")["Table"]["Parameters"]
    assert (params["last_commit_time_sync"], params["last_commit_completion_time_sync"]) == (b.instant, done_b)
    assert sorted(p["Values"][0] for p in glue.get_partitions(DatabaseName="late", TableName="orders")["Partitions"]) == ["EU", "LATAM", "US"]
    late = str(int(done_b) + 1)
    hidden.rename(folder / f"{a.instant}_{late}.commit")  # A completes after B
    after_a, _ = sync()
    assert not after_a.full and after_a.added == 1 and (after_a.instant, after_a.completion) == (b.instant, late)
    assert sorted(p["Values"][0] for p in glue.get_partitions(DatabaseName="late", TableName="orders")["Partitions"]) == ["APAC", "EU", "LATAM", "US"]
    again, _ = sync()
    assert again.up_to_date


@pytest.fixture(scope="module")
def hudi_11_sql(hive_metastore, tmp_path_factory):
    """Spark 3.5 with Hudi 1.1's bundle and Hive support, on the tests' metastore service."""
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import HUDI_11, ensure

    ensure()
    java = JavaHudi(HUDI_11, tmp_path_factory.mktemp("hudi-11-sql"), conf={
        "spark.sql.catalogImplementation": "hive", "spark.hadoop.hive.metastore.uris": hive_metastore.uri})
    yield java
    java.close()


def _tblproperties(java, table: str) -> dict[str, str]:
    return {k: v for k, v in java.sql(f"show tblproperties {table}")}


def test_version_9_tables_are_registered_java_11_reads_them_by_name_and_its_hive_sync_and_pipes_take_turns(
        spark, hive_metastore, moto_server, tmp_path, hudi_11_sql):
    """The example with its orders (copy-on-write) and order_events (merge-on-read) at table
    version 9 on the Hive metastore: Spark with Hudi 1.1 reads pipe's tables by name; a Java
    1.1 write with its Hive sync (HMS mode) adds a region and moves the markers; pipe's next run
    syncs what completed after Java's marker, without a listing; Java reads all by name."""
    java = hudi_11_sql
    root = _example(tmp_path / "shop9", _targets(hive_metastore.uri, moto_server))
    project = (root / "pipe_project.yml").read_text()
    (root / "pipe_project.yml").write_text(project.replace("name: shop\n", "name: shop9\n", 1).replace('"shop_"', '"shop9_"'))
    for rel in ("tables/orders.yml", "tables/order_events.yml"):
        text = (root / rel).read_text()
        (root / rel).write_text(text.replace("    key: [order_id]\n", "    key: [order_id]\n    table_version: 9\n", 1))
    code, o, e = _pipe_in_process(root, "run")
    assert code == 0, o + e
    assert_clean(o, e)
    st = steps(root)
    orders = st["table.orders"]["catalog"]
    assert orders["created"] == ["shop9.orders"] and orders["completion"] > orders["instant"], orders
    assert "hoodie.table.version=9" in (root / "lake/orders/.hoodie/hoodie.properties").read_text()
    props = _tblproperties(java, "shop9.orders")
    assert (props["last_commit_time_sync"], props["last_commit_completion_time_sync"]) == (orders["instant"], orders["completion"])
    cols = ["order_id", "status", "region"]
    assert _java_rows(java, "shop9.orders", cols) == _lake_rows(root, "orders", cols) and len(_lake_rows(root, "orders", cols)) == 6
    assert _java_rows(java, "shop9.order_events_rt", cols) == _lake_rows(root, "order_events", cols)

    # Java 1.1 writes a region with its defaults and its Hive sync, on the table pipe registered
    lake = (root / "lake/orders").resolve()
    asia = pa.table({"order_id": pa.array([7001, 7002], pa.int64()), "customer_id": pa.array([201, None], pa.int64()),
                     "amount": [19.99, 0.5], "status": ["placed", "packed"], "region": ["ASIA", "ASIA"],
                     "updated_at": pa.array([dt.datetime(2024, 3, 5, 8, 0, tzinfo=dt.timezone.utc)] * 2, pa.timestamp("us", tz="UTC"))})
    java.write(lake, asia, {
        "hoodie.table.name": "orders", "hoodie.datasource.write.operation": "upsert", "hoodie.datasource.write.recordkey.field": "order_id",
        "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "updated_at",
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
        "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
        "hoodie.datasource.hive_sync.enable": "true", "hoodie.datasource.hive_sync.mode": "hms",
        "hoodie.datasource.hive_sync.metastore.uris": hive_metastore.uri, "hoodie.datasource.hive_sync.database": "shop9",
        "hoodie.datasource.hive_sync.table": "orders", "hoodie.datasource.hive_sync.partition_fields": "region",
        "hoodie.datasource.hive_sync.support_timestamp": "true"})
    regions = lambda: [v for (v,), _ in java.catalog_partitions("shop9", "orders", ["region"])]  # noqa: E731
    assert regions() == ["APAC", "ASIA", "EU", "US"]
    by_java = _tblproperties(java, "shop9.orders")
    assert by_java["last_commit_completion_time_sync"] > orders["completion"], by_java

    # pipe's next run: a new region (LATAM) and updates; its sync starts from Java's marker
    (root / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
    code, o, e = _pipe_in_process(root, "run")
    assert code == 0, o + e
    synced = steps(root)["table.orders"]["catalog"]
    assert not synced["full"] and synced["partitions_added"] == 1 and not synced["created"], synced
    assert regions() == ["APAC", "ASIA", "EU", "LATAM", "US"]
    props = _tblproperties(java, "shop9.orders")
    assert (props["last_commit_time_sync"], props["last_commit_completion_time_sync"]) == (synced["instant"], synced["completion"])
    lake_rows = _lake_rows(root, "orders", cols)
    assert (7001, "placed", "ASIA") in lake_rows and (9001, "placed", "LATAM") in lake_rows and (1, "delivered", "EU") in lake_rows
    assert _java_rows(java, "shop9.orders", cols) == lake_rows
    assert _java_rows(java, "shop9.order_events_rt", cols) == _lake_rows(root, "order_events", cols)
