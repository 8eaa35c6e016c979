"""A lake on S3 through Spark's own file system (s3a) against a real moto server.

`pipe run` runs as users run it: a subprocess with its own Spark, whose target gives it
hadoop-aws and the AWS SDK (`spark.jars`, fetched by tests/s3a/env.py) and the S3 settings
(`spark.hadoop.fs.s3a.*`) that pipe's own boto3 reads and writes take too. One project, two
rounds: the first on `s3a://bucket/shop`, the second on `s3://bucket/shop` (the same objects, the
s3:// scheme served by S3A); its tables are read back with hudi-rs and compared with the same
project run on a local lake. Without s3a (the in-process `spark` of the other tests): the
objects of an `s3_incremental` source are read with boto3, with the same fs.s3a settings, and a
lake on S3 is refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest
import yaml

from runtime import s3
from tests.conftest import write_project
from tests.s3a import env as s3a_env
from tests.test_example_project import _pipe
from tests.test_run import assert_clean, pipe, run_results, steps

RUN_COLUMNS = {"_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_file_name"}
ORDERS = "order_id BIGINT, region STRING, amount DECIMAL(12,2), placed_at TIMESTAMP, updated_ms BIGINT, status STRING"

ROUND_1 = [
    {"order_id": 1, "region": "EU", "amount": 12.34, "placed_at": "2026-11-20T08:00:00.123Z", "updated_ms": 1763625600123, "status": "open"},
    {"order_id": 2, "region": "EU", "amount": 0.01, "placed_at": "2026-11-20T09:30:00Z", "updated_ms": 1763631000000, "status": "open"},
    {"order_id": 1, "region": "US", "amount": 99999.99, "placed_at": "2026-11-20T10:00:00Z", "updated_ms": 1763632800000, "status": "open"},
    {"order_id": 3, "region": "US/West", "amount": -5.5, "placed_at": "2026-11-21T00:00:00Z", "updated_ms": 1763683200000, "status": "open"},
]
ROUND_2 = [  # an update, a delete, a stale version that loses, a new key
    {"order_id": 1, "region": "EU", "amount": 15.0, "placed_at": "2026-11-20T08:00:00.123Z", "updated_ms": 1763712000456, "status": "paid"},
    {"order_id": 2, "region": "EU", "amount": 0.01, "placed_at": "2026-11-20T09:30:00Z", "updated_ms": 1763712000457, "status": "cancelled"},
    {"order_id": 1, "region": "US", "amount": 1.0, "placed_at": "2026-11-20T10:00:00Z", "updated_ms": 1763600000000, "status": "open"},
    {"order_id": 4, "region": "EU", "amount": 7.25, "placed_at": "2026-11-22T12:00:00.999Z", "updated_ms": 1763812800999, "status": "open"},
]
EVENTS_1 = [{"order_id": 10, "region": "EU", "amount": 3.5, "updated_ms": 1763625600001}, {"order_id": 11, "region": "US", "amount": 4.5, "updated_ms": 1763625600002}]
EVENTS_2 = [{"order_id": 10, "region": "EU", "amount": 30.5, "updated_ms": 1763712000003}]


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def s3a_conf(endpoint: str, jars: str | None) -> dict[str, str]:
    conf = {
        "spark.sql.shuffle.partitions": "4",
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.access.key": "testing",
        "spark.hadoop.fs.s3a.secret.key": "testing",
    }
    return {**conf, "spark.jars": jars} if jars else conf


def shop_project(root: Path, bucket: str, endpoint: str, queue: str, jars: str | None) -> Path:
    """Orders from local JSON files into a copy-on-write and a merge-on-read table (deletes,
    compacted after each deltacommit); objects named by bucket notifications into an S3
    metadata table and a table of their rows. Targets `local` (lake under the project), `s3a`
    and `s3` (the bucket, through s3a)."""
    local = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}}
    on_s3 = {"master": "local[2]", "conf": s3a_conf(endpoint, jars)}
    project = {
        "name": "s3shop", "lake": "lake", "default_target": "local",
        "targets": {"local": {"spark": local},
                    "s3a": {"lake": f"s3a://{bucket}/shop", "spark": on_s3},
                    "s3": {"lake": f"s3://{bucket}/shop", "spark": on_s3}},
    }
    sources = {
        "orders_in": {"kind": "files", "path": "data/orders", "format": "json", "schema": ORDERS},
        "landing_events": {"kind": "s3_events", "queue_url": queue, "endpoint_url": endpoint, "region": "us-east-1", "long_poll_wait_s": 0},
        # no endpoint of its own: the objects are read with the target's S3 settings
        "landing_orders": {"kind": "s3_incremental", "metadata_table": "s3_meta", "buckets": ["s3a-landing", "boto3-landing"], "format": "json", "key_prefix": "in/",
                           "schema": "order_id BIGINT, region STRING, amount DECIMAL(12,2), updated_ms BIGINT"},
    }
    keyed = {"key": ["order_id", "region"], "precombine": "updated_ms", "delete_when": "status = 'cancelled'"}
    tables = {
        "orders": {**keyed, "partition_by": ["region"]},
        "order_log": {**keyed, "type": "merge_on_read", "small_file_limit": 0, "compaction": {"max_delta_commits": 1}},
        "s3_meta": {"key": ["object_key", "event_name"], "partition_by": ["bucket"], "precombine": "event_time", "index": "partition"},
        "landed": {"key": ["order_id", "region"], "precombine": "updated_ms"},
    }
    return write_project(root, {
        "pipe_project.yml": yaml.safe_dump(project, sort_keys=False),
        "sources/sources.yml": yaml.safe_dump({"sources": sources}, sort_keys=False),
        "tables/tables.yml": yaml.safe_dump({"tables": tables}, sort_keys=False),
        "tables/orders.sql": "select * from {{ source('orders_in') }}\n",
        "tables/order_log.sql": "select order_id, region, amount, placed_at, updated_ms, status, amount * 2 as doubled from {{ source('orders_in') }}\n",
        "tables/s3_meta.sql": "select * from {{ source('landing_events') }}\n",
        "tables/landed.sql": "select * from {{ source('landing_orders') }}\n",
    })


def _pipe_process(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`pipe` in its own process with its own Spark, as a user runs it, in the project folder."""
    proc = _pipe(root, *args)
    assert_clean(proc.stdout, proc.stderr)
    return proc


def _download(client, bucket: str, prefix: str, to: Path) -> Path:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", ()):
            path = to / obj["Key"][len(prefix) + 1:]
            path.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(path))
    return to


def hudi_rows(table: Path) -> list[tuple]:
    """Every row as hudi-rs reads it, without the columns that say when it was written."""
    from hudi import HudiTableBuilder

    rows = []
    for batch in HudiTableBuilder.from_base_uri(str(table)).build().read():
        d = batch.to_pydict()
        cols = sorted(c for c in d if c not in RUN_COLUMNS)
        rows += [tuple(zip(cols, r)) for r in zip(*[d[c] for c in cols])]
    return sorted(rows)


def completed_actions(table: Path) -> list[str]:
    return sorted(p.name.split(".", 1)[1] for p in (table / ".hoodie").iterdir()
                  if p.is_file() and p.name[:1].isdigit() and p.name.count(".") == 1)


def landing(endpoint: str, bucket: str) -> str:
    """A bucket whose new objects are announced in a queue (its URL returned)."""
    s3c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    s3c.create_bucket(Bucket=bucket)
    url = sqs.create_queue(QueueName=bucket + "-q")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3c.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    return url


@pytest.fixture(scope="module")
def shop(moto_server, spark, tmp_path_factory):
    jars = s3a_env.spark_jars()
    bucket, inbox = "s3a-shop", "s3a-landing"
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    queue = landing(moto_server, inbox)
    home = tmp_path_factory.mktemp("s3a")
    root = shop_project(home / "shop", bucket, moto_server, queue, jars)
    orders = root / "data/orders"
    orders.mkdir(parents=True)
    out: dict = {"root": root, "bucket": bucket, "client": client, "results": [], "stderr": []}

    for i, (rows, events, target) in enumerate(((ROUND_1, EVENTS_1, "s3a"), (ROUND_2, EVENTS_2, "s3")), 1):
        (orders / f"orders-{i}.json").write_text(_lines(rows))
        client.put_object(Bucket=inbox, Key=f"in/round {i}.json", Body=_lines(events).encode())
        proc = _pipe_process(root, "run", "--target", target)
        out["results"].append(run_results(root))
        out["stderr"].append(proc.stderr)
        local = subprocess_free_local_run(root)
        assert local["success"] is True, local["steps"]
    out["s3"] = _download(client, bucket, "shop", home / "downloaded")
    return out


def subprocess_free_local_run(root: Path) -> dict:
    """The file-fed tables on the local lake, in this process (the shared local[2] session)."""
    from pipe.cli import main

    code = main(["run", "--target", "local", "--exclude", "+landed", "--quiet", "--project-dir", str(root)])
    assert code == 0
    return run_results(root)


def _pick(rows: list[tuple], *columns: str) -> list[tuple]:
    return sorted(tuple(dict(r)[c] for c in columns) for r in rows)


def test_tables_on_s3a_and_s3_equal_the_same_project_on_a_local_lake(shop):
    from decimal import Decimal

    lake, downloaded = shop["root"] / "lake", shop["s3"]
    for table in ("orders", "order_log"):
        assert hudi_rows(downloaded / table) == hudi_rows(lake / table), f"table {table} on S3 and on the local lake"
        assert completed_actions(downloaded / table) == completed_actions(lake / table), table
    want = [(1, "EU", Decimal("15.00"), 1763712000456), (1, "US", Decimal("99999.99"), 1763632800000),
            (3, "US/West", Decimal("-5.50"), 1763683200000), (4, "EU", Decimal("7.25"), 1763812800999)]
    assert _pick(hudi_rows(downloaded / "orders"), "order_id", "region", "amount", "updated_ms") == want
    assert _pick(hudi_rows(downloaded / "order_log"), "order_id", "region", "doubled") == [(o, r, a * 2) for o, r, a, _ in want]
    # merge-on-read: a deltacommit per round, the second one's log files compacted (a commit)
    assert completed_actions(downloaded / "order_log") == ["commit", "deltacommit", "deltacommit"]
    for i, results in enumerate(shop["results"], 1):
        st = {s["id"]: s for s in results["steps"]}
        assert results["success"] is True, results["steps"]
        assert st["table.orders"]["state"] == st["table.order_log"]["state"] == "success", f"round {i}"
    assert {s["id"]: s for s in shop["results"][1]["steps"]}["table.orders"]["deletes"] == 1


def test_an_s3_incremental_source_reads_its_objects_through_s3a(shop):
    from decimal import Decimal

    for results in shop["results"]:
        landed = {s["id"]: s for s in results["steps"]}["table.landed"]
        assert landed["state"] == "success" and landed["inputs"]["landing_orders"]["read_through"] == "s3a", landed
        assert landed["rows_read"] == 2 if results is shop["results"][0] else landed["rows_read"] == 1
    assert _pick(hudi_rows(shop["s3"] / "landed"), "order_id", "region", "amount", "updated_ms") == [
        (10, "EU", Decimal("30.50"), 1763712000003), (11, "US", Decimal("4.50"), 1763625600002)]
    assert _pick(hudi_rows(shop["s3"] / "s3_meta"), "object_key", "event_name") == [
        ("in/round 1.json", "ObjectCreated:Put"), ("in/round 2.json", "ObjectCreated:Put")]


def test_pipe_commands_without_spark_reach_the_lake_with_the_targets_s3_settings(shop, capsys):
    """No AWS endpoint in this process's environment: `pipe timeline` finds moto only through the
    target's fs.s3a settings."""
    assert "AWS_ENDPOINT_URL" not in os.environ and "AWS_ENDPOINT_URL_S3" not in os.environ
    code, out, err = pipe(capsys, shop["root"], "timeline", "order_log", "--target", "s3a", "--output", "json")
    assert code == 0, out + err
    instants = [json.loads(line) for line in out.splitlines()]
    assert [i["action"] for i in instants if i["state"] == "completed"] == ["deltacommit", "deltacommit", "commit"]


def test_a_dev_lake_defers_to_the_lake_on_s3_pinned_at_its_latest_successful_run(shop, moto_server, tmp_path):
    """`--defer s3a` from a local dev lake (docs/dev-loop.md): the pins come from the record the
    runs on S3 wrote there, read with boto3 and the target's fs.s3a settings; Spark reads the
    pinned version of orders through s3a; nothing is written to the bucket."""
    from decimal import Decimal

    root, client, bucket = shop["root"], shop["client"], shop["bucket"]
    record = json.loads(client.get_object(Bucket=bucket, Key="shop/.pipe-last-success.json")["Body"].read())
    assert record["target"] == "s3" and set(record["written"]) >= {"orders", "order_log"}
    project = yaml.safe_load((root / "pipe_project.yml").read_text())
    project["targets"]["dev"] = {"lake": str(tmp_path / "devlake"), "spark": project["targets"]["s3a"]["spark"]}
    (root / "pipe_project.yml").write_text(yaml.safe_dump(project, sort_keys=False))
    (root / "tables/region_totals.sql").write_text(
        "select region, count(*) as orders, sum(amount) as amount from {{ ref('orders') }} group by region\n")
    (root / "tables/region_totals.yml").write_text("tables:\n  region_totals:\n    key: [region]\n")
    before = sorted(o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page.get("Contents", ()))
    proc = _pipe_process(root, "run", "--target", "dev", "--defer", "s3a", "--select", "region_totals")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pinned = record["written"]["orders"]
    assert f"deferring to s3a: orders at {pinned} (s3a's latest successful run" in proc.stderr
    results = run_results(root)
    assert results["defer"]["lake"] == f"s3a://{bucket}/shop" and results["defer"]["tables"]["orders"]["instant"] == pinned
    assert sorted(tuple(r) for r in _pick(hudi_rows(tmp_path / "devlake/region_totals"), "region", "orders", "amount")) == [
        ("EU", 2, Decimal("22.25")), ("US", 1, Decimal("99999.99")), ("US/West", 1, Decimal("-5.50"))]
    after = sorted(o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page.get("Contents", ()))
    assert after == before  # the deferred lake is only read


# --- without s3a: the in-process Spark of the other tests has no hadoop-aws ----------------------


def test_s3_incremental_reads_with_boto3_and_the_targets_s3_settings_when_spark_has_no_s3a(spark, tmp_path, capsys, moto_server):
    """The source names no endpoint: its objects are read in the tasks with boto3, configured by
    the target's fs.s3a settings (no AWS endpoint in the environment)."""
    from decimal import Decimal

    queue = landing(moto_server, "boto3-landing")
    root = shop_project(tmp_path / "shop", "unused", moto_server, queue, jars=None)
    text = (root / "pipe_project.yml").read_text()
    (root / "pipe_project.yml").write_text(text.replace("spark.sql.shuffle.partitions: 4\n", "spark.sql.shuffle.partitions: 4\n" + "".join(
        f"        {k}: {json.dumps(v)}\n" for k, v in s3a_conf(moto_server, None).items() if k.startswith(s3.PREFIX)), 1))
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    client.put_object(Bucket="boto3-landing", Key="in/a+b.json", Body=_lines(EVENTS_1).encode())
    code, out, err = pipe(capsys, root, "run", "--target", "local", "--select", "+landed")
    assert code == 0, out + err
    assert_clean(out, err)
    landed = steps(root)["table.landed"]
    assert landed["inputs"]["landing_orders"]["read_through"] == "boto3", landed
    assert _pick(hudi_rows(root / "lake" / "landed"), "order_id", "region", "amount", "updated_ms") == [
        (10, "EU", Decimal("3.50"), 1763625600001), (11, "US", Decimal("4.50"), 1763625600002)]


@pytest.mark.parametrize("scheme", ["s3a", "s3"])
def test_a_lake_on_s3_is_refused_before_anything_is_written_when_spark_has_no_s3a(spark, tmp_path, capsys, moto_server, scheme):
    bucket = f"refused-{scheme}"
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    root = shop_project(tmp_path / "shop", bucket, moto_server, "http://unused", jars=None)
    (root / "data/orders").mkdir(parents=True)
    (root / "data/orders/orders-1.json").write_text(_lines(ROUND_1))
    code, out, err = pipe(capsys, root, "run", "--target", scheme, "--select", "orders")
    text = out + err
    assert code == 1, text
    assert_clean(out, err)
    assert (f"table orders: the lake of table orders is on S3 ({scheme}://{bucket}/shop/orders), but this Spark cannot read {scheme}:// paths"
            in " ".join(text.split())), text
    assert "`spark.jars.packages: org.apache.hadoop:hadoop-aws:3.5.0`" in text
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "nothing is left in the bucket"


def test_boto3_options_come_from_the_s3a_settings_per_bucket():
    settings = s3.s3a_settings({
        "spark.hadoop.fs.s3a.endpoint": "minio.internal:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "TRUE",
        "spark.hadoop.fs.s3a.access.key": "AKIA-lake",
        "spark.hadoop.fs.s3a.secret.key": "s3cr3t",
        "spark.hadoop.fs.s3a.bucket.archive.endpoint": "https://s3.eu-west-1.amazonaws.com",
        "spark.hadoop.fs.s3a.bucket.archive.endpoint.region": "eu-west-1",
        "spark.executor.memory": "1g",
    })
    assert dict(s3.client_options(settings, "lake")) == {
        "endpoint_url": "http://minio.internal:9000", "path_style": "true", "access_key_id": "AKIA-lake", "secret_access_key": "s3cr3t"}
    assert dict(s3.client_options(settings, "archive")) == {
        "endpoint_url": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1", "path_style": "true",
        "access_key_id": "AKIA-lake", "secret_access_key": "s3cr3t"}
    assert s3.client_options({}, "lake") == ()
    from runtime.storage import StorageSpec

    assert "s3cr3t" not in repr(StorageSpec("s3a://lake/shop", s3.client_options(settings, "lake")))
