"""S3 event ingestion against a real moto server: bucket notifications into SQS, `kind: s3_events`
into an S3 metadata table, `kind: s3_incremental` reading the objects it names inside the
executors. `pipe run` is called as a user calls it (in-process, one shared SparkSession; in a
subprocess where a crash is injected), and every table is read back with pipe's reader and
with hudi-rs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from compiler.api import compile_project
from runtime.sources.s3_events import MalformedMessage, parse_body
from runtime.sources.s3_incremental import Cursor
from tests.conftest import REPO, compile_errors, write_project
from tests.test_run import PROJECT_YML, assert_clean, assert_rows, commits, hudi_rows, pipe, pipe_rows, run_ok, run_results, steps, timeline


# --- parsing messages (no AWS, no Spark) ---------------------------------------------------------


def _event(key: str, name: str = "ObjectCreated:Put", size: int = 10, bucket: str = "b", when: str = "2026-11-21T10:00:00.123Z") -> dict:
    return {"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "eu-west-1", "eventTime": when, "eventName": name,
            "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": size, "eTag": "e1", "sequencer": "0055AED6DCD90281E5"}}}


def test_parse_an_s3_notification_url_decodes_the_key():
    records = parse_body(json.dumps({"Records": [_event("in/a+b%2Bc%3D1.json")]}), "m1")
    assert records == [{
        "bucket": "b", "object_key": "in/a b+c=1.json", "object_size": 10, "etag": "e1", "sequencer": "0055AED6DCD90281E5",
        "version_id": None, "event_name": "ObjectCreated:Put", "event_time": records[0]["event_time"], "region": "eu-west-1", "message_id": "m1",
    }]
    assert records[0]["event_time"].isoformat() == "2026-11-21T10:00:00.123000+00:00"


def test_parse_an_sns_envelope_and_skip_test_events():
    inner = json.dumps({"Records": [_event("x.json"), _event("y.json", "ObjectRemoved:Delete")]})
    records = parse_body(json.dumps({"Type": "Notification", "MessageId": "n", "Message": inner}))
    assert [(r["object_key"], r["event_name"]) for r in records] == [("x.json", "ObjectCreated:Put"), ("y.json", "ObjectRemoved:Delete")]
    assert parse_body(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"})) == []


@pytest.mark.parametrize("body, why", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"hello": 1}', "no Records[]"),
    ('{"Records": [{"eventName": "ObjectCreated:Put"}]}', "record 0 lacks"),
    (json.dumps({"Records": [_event("k", when="yesterday")]}), "not an ISO-8601 timestamp"),
    (json.dumps({"Type": "Notification", "Message": "{oops"}), "SNS notification whose Message is not JSON"),
])
def test_malformed_messages_say_why(body, why):
    with pytest.raises(MalformedMessage, match=re.escape(why)):
        parse_body(body)


def test_cursor_round_trips_inside_an_instant():
    assert Cursor.parse("20261121100000123") == Cursor("20261121100000123")
    c = Cursor.parse("20261121100000123#bucket/dir/a#b.json")
    assert c == Cursor("20261121100000123", "bucket/dir/a#b.json")
    assert Cursor.parse(c.to_str()) == c


# --- compile-time checks -------------------------------------------------------------------------

QUEUE_SOURCES = """
    sources:
      ev:
        kind: s3_events
        queue_url: https://sqs.us-east-1.amazonaws.com/123456789012/q
      objs:
        kind: s3_incremental
        metadata_table: meta
        buckets: [landing]
        format: json
    """


def test_two_tables_cannot_share_one_queue(project):
    root = project({
        "sources/s.yml": QUEUE_SOURCES,
        "tables/meta.sql": "select * from {{ source('ev') }}",
        "tables/meta2.sql": "select * from {{ source('ev') }}",
    })
    [d] = compile_errors(root)
    assert d.location.file == "tables/meta2.sql" and d.location.line == 1
    assert "source 'ev' (kind s3_events) is read by table 'meta' already" in d.message
    assert "kind: s3_incremental" in d.hint


def test_metadata_table_must_read_an_s3_events_source(project):
    root = project({
        "sources/s.yml": QUEUE_SOURCES.replace("metadata_table: meta", "metadata_table: other"),
        "tables/meta.sql": "select * from {{ source('ev') }}",
        "tables/other.sql": "select 1 as x",
    })
    [d] = compile_errors(root)
    assert d.location.file == "sources/s.yml" and "metadata_table of source 'objs' is 'other', which reads no `s3_events` source" in d.message


def test_dead_letter_table_name_is_reserved(project):
    root = project({
        "sources/s.yml": QUEUE_SOURCES,
        "tables/meta.sql": "select * from {{ source('ev') }}",
        "tables/ev_dead_letter.sql": "select 1 as x",
    })
    [d] = compile_errors(root)
    assert "'ev_dead_letter' is taken by the dead-letter table of source 'ev'" in d.message


def test_the_dead_letter_table_name_of_an_s3_incremental_source_is_reserved(project):
    root = project({
        "sources/s.yml": QUEUE_SOURCES,
        "tables/meta.sql": "select * from {{ source('ev') }}",
        "tables/objs_dead_letter.sql": "select * from {{ source('objs') }}",
    })
    [d] = compile_errors(root)
    assert d.location.file == "tables/objs_dead_letter.sql"
    assert "'objs_dead_letter' is taken by the dead-letter table of source 'objs'" in d.message


def test_a_valid_s3_project_compiles_with_its_dependencies(project):
    root = project({"sources/s.yml": QUEUE_SOURCES, "tables/meta.sql": "select * from {{ source('ev') }}",
                    "tables/t.sql": "select * from {{ source('objs') }}"})
    plan = compile_project(root).plan
    assert plan.step("source.objs").depends_on == ("table.meta",) or list(plan.step("source.objs").depends_on) == ["table.meta"]
    assert list(plan.step("table.t").depends_on) == ["source.objs"]


# --- against moto ----------------------------------------------------------------------------------


class S3Env:
    def __init__(self, endpoint: str, name: str):
        self.endpoint = endpoint
        self.bucket = name + "-b"
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        self.queue = self.sqs.create_queue(QueueName=name + "-q")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.s3.create_bucket(Bucket=self.bucket)
        self.s3.put_bucket_notification_configuration(Bucket=self.bucket, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]})

    def put(self, key: str, rows: list[dict] | None = None, body: bytes | None = None) -> int:
        """Puts the object (JSON lines of `rows`, or `body`); returns its size."""
        if body is None:
            body = "".join(json.dumps(r) + "\n" for r in rows).encode()
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        return len(body)

    def waiting(self) -> int:
        a = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
        return int(a["Attributes"]["ApproximateNumberOfMessages"]) + int(a["Attributes"]["ApproximateNumberOfMessagesNotVisible"])

    def visible(self) -> int:
        a = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["ApproximateNumberOfMessages"])
        return int(a["Attributes"]["ApproximateNumberOfMessages"])


@pytest.fixture
def s3env(moto_server, request):
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    return S3Env(moto_server, name)


def s3_project(tmp_path: Path, env: S3Env, events: dict | None = None, objects: dict | None = None,
               more_sources: dict | None = None, extra: dict[str, str] | None = None) -> Path:
    """landing_events -> s3_meta -> landing_orders -> orders (keyed by order_id)."""
    import yaml

    aws = {"endpoint_url": env.endpoint, "region": "us-east-1"}
    sources = {
        "landing_events": {"kind": "s3_events", "queue_url": env.queue, **aws, "long_poll_wait_s": 0, **(events or {})},
        "landing_orders": {"kind": "s3_incremental", "metadata_table": "s3_meta", "buckets": [env.bucket], "format": "json", "key_prefix": "orders/", **aws,
                           "schema": "order_id BIGINT, amount DOUBLE", **(objects or {})},
        **{k: {**aws, "buckets": [env.bucket], **v} for k, v in (more_sources or {}).items()},
    }
    files = {
        "pipe_project.yml": PROJECT_YML,
        "sources/s3.yml": yaml.safe_dump({"sources": sources}, sort_keys=False),
        "tables/s3_meta.yml": """
            tables:
              s3_meta:
                key: [object_key, event_name]
                partition_by: [bucket]
                precombine: event_time
                index: partition
            """,
        "tables/s3_meta.sql": "select * from {{ source('landing_events') }}\n",
        "tables/orders.yml": "tables:\n  orders:\n    key: [order_id]\n",
        "tables/orders.sql": "select * from {{ source('landing_orders') }}\n",
        **(extra or {}),
    }
    return write_project(tmp_path / "p", files)


def meta_rows(spark, root: Path) -> list[tuple]:
    from runtime.table.table import Table

    df = Table.open(spark, str(root / "lake" / "s3_meta")).read(meta=False)
    return sorted((r["bucket"], r["object_key"], r["event_name"], r["object_size"]) for r in df.collect())


def test_objects_flow_from_notifications_to_the_target_table(spark, tmp_path, capsys, s3env):
    size1 = s3env.put("orders/o-1.json", [{"order_id": 1, "amount": 1.5}, {"order_id": 2, "amount": 2.5}])
    size2 = s3env.put("orders/o 2+x.json", [{"order_id": 3, "amount": 3.5}])
    size3 = s3env.put("other/ignored.json", [{"order_id": 99, "amount": 0.0}])
    root = s3_project(tmp_path, s3env)

    code, out, err = pipe(capsys, root, "run", "--dry-run")
    assert code == 0, err
    assert "about 4 messages waiting in the queue" in out  # the test event + 3 objects, nothing received
    assert s3env.visible() == 4

    run_ok(capsys, root)
    st = steps(root)
    assert st["table.s3_meta"]["state"] == "success" and st["table.s3_meta"]["rows_written"] == 3
    assert st["table.orders"]["rows_read"] == 3
    b = s3env.bucket
    expected_meta = [(b, "orders/o 2+x.json", "ObjectCreated:Put", size2), (b, "orders/o-1.json", "ObjectCreated:Put", size1),
                     (b, "other/ignored.json", "ObjectCreated:Put", size3)]
    assert meta_rows(spark, root) == expected_meta
    assert hudi_rows(root, "s3_meta", ["bucket", "object_key", "event_name", "object_size"]) == expected_meta
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.5), (2, 2.5), (3, 3.5)])
    assert s3env.waiting() == 0, "messages are deleted once the commit holding them completed"

    # the checkpoint of the objects source is the metadata table's instant, in the orders commit
    meta_commit = commits(timeline(capsys, root, "s3_meta"))[-1]
    orders_commit = commits(timeline(capsys, root, "orders"))[-1]
    assert orders_commit["checkpoints"]["landing_orders"] == meta_commit["instant"]

    # nothing new: no commit anywhere, no Spark job needed
    out, _ = run_ok(capsys, root)
    assert {s["state"] for s in steps(root).values() if s["kind"] == "write"} == {"no_input"}
    assert len(commits(timeline(capsys, root, "orders"))) == 1

    # a removed object is recorded in the metadata table and read by nobody
    s3env.s3.delete_object(Bucket=b, Key="other/ignored.json")
    s3env.put("orders/o-3.json", [{"order_id": 4, "amount": 4.5}])
    run_ok(capsys, root)
    assert [r[2] for r in meta_rows(spark, root) if r[1] == "other/ignored.json"] == ["ObjectCreated:Put", "ObjectRemoved:Delete"]
    assert steps(root)["table.orders"]["rows_read"] == 1
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.5), (2, 2.5), (3, 3.5), (4, 4.5)])


def test_an_object_written_twice_ends_up_as_its_latest_version(spark, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env)
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 2.0}])  # twice before a run
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 2.0)])
    assert steps(root)["table.orders"]["rows_read"] == 1, "one event per (key, event name): the object is read once"
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 3.0}, {"order_id": 2, "amount": 3.0}])  # and again, later
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 3.0), (2, 3.0)])
    assert [r[1] for r in meta_rows(spark, root)] == ["orders/a.json"]


def test_thousands_of_objects_within_a_second_and_a_byte_limit_read_each_object_once(spark, tmp_path, capsys, s3env):
    # moto's receive slows down with the queue's length, so the events of 2,000 objects (all
    # in one second, as S3 would stamp a burst) come as 40 messages of 50 records each
    n, per_message = 2000, 50
    bucket = s3env.bucket + "-burst"
    s3env.s3.create_bucket(Bucket=bucket)
    bodies = {i: (json.dumps({"order_id": i, "amount": float(i)}) + "\n").encode() for i in range(n)}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3env.s3.put_object(Bucket=bucket, Key=f"orders/{i:05d}.json", Body=bodies[i]), range(n)))
    for first in range(0, n, per_message):
        records = [_event(f"orders/{i:05d}.json", size=len(bodies[i]), bucket=bucket, when="2026-11-21T10:00:00.500Z")
                   for i in range(first, first + per_message)]
        s3env.sqs.send_message(QueueUrl=s3env.queue, MessageBody=json.dumps({"Records": records}))
    size = sum(len(b) for b in bodies.values())
    root = s3_project(tmp_path, s3env, objects={"max_bytes_per_run": size // 2 + 10, "buckets": [bucket]})
    run_ok(capsys, root)
    assert len(meta_rows(spark, root)) == n
    assert s3env.waiting() == 0
    first = steps(root)["table.orders"]
    assert 0 < first["rows_read"] < n
    cp = commits(timeline(capsys, root, "orders"))[-1]["checkpoints"]["landing_orders"]
    assert "#" in cp, f"the byte limit stops inside the metadata instant: {cp}"
    run_ok(capsys, root)
    second = steps(root)["table.orders"]
    assert first["rows_read"] + second["rows_read"] == n
    assert "#" not in commits(timeline(capsys, root, "orders"))[-1]["checkpoints"]["landing_orders"]
    from runtime.table.table import Table

    df = Table.open(spark, str(root / "lake" / "orders")).read(meta=False)
    assert df.count() == n and df.select("order_id").distinct().count() == n
    run_ok(capsys, root)
    assert steps(root)["table.orders"]["state"] == "no_input"


def test_malformed_messages_are_reported_then_dead_lettered(spark, tmp_path, capsys, s3env):
    s3env.sqs.send_message(QueueUrl=s3env.queue, MessageBody="this is not an S3 event")
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    root = s3_project(tmp_path, s3env, events={"max_receive_count": 2})
    out, _ = run_ok(capsys, root)
    st = steps(root)["table.s3_meta"]
    assert st["state"] == "success"
    assert re.search(r"landing_events: 1 malformed message\(s\) left in the queue, e\.g\. \S+: not JSON", st["message"]), st["message"]
    assert "malformed message(s) left in the queue" in out
    assert s3env.visible() == 1, "the malformed message is back in the queue, the others are deleted"

    run_ok(capsys, root)  # second receive: it has failed twice -> dead-letter table
    st = steps(root)["table.s3_meta"]
    assert st["state"] == "no_input"
    assert "moved to table landing_events_dead_letter after 2 receives" in st["message"], st["message"]
    assert s3env.waiting() == 0
    dead = hudi_rows(root, "landing_events_dead_letter", ["source", "receive_count", "body"])
    assert dead == [("landing_events", 2, "this is not an S3 event")]
    code, out, err = pipe(capsys, root, "show", "landing_events_dead_letter", "--output", "json")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["body"] == "this is not an S3 event"


def test_a_malformed_object_fails_the_step_and_the_next_run_resumes_from_the_checkpoint(spark, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env)
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    run_ok(capsys, root)
    s3env.put("orders/b.json", body=b'{"order_id": 2, "amount": 2.0}\n{"order_id": oops\n')
    s3env.put("orders/c.json", [{"order_id": 3, "amount": 3.0}])
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert_clean(out, err)
    st = steps(root)
    assert st["table.s3_meta"]["state"] == "success", "the events are stored; only the objects' table failed"
    assert st["table.orders"]["state"] == "error"
    assert st["table.orders"]["message"] == f'source landing_orders: s3://{s3env.bucket}/orders/b.json line 2: not a valid JSON object: {{"order_id": oops'
    assert len(commits(timeline(capsys, root, "orders"))) == 1
    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.0}])  # fixed
    run_ok(capsys, root)
    assert steps(root)["table.orders"]["rows_read"] == 2, "b and c; a is not read again"
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0), (2, 2.0), (3, 3.0)])


def test_fan_out_two_tables_each_with_its_own_checkpoint(spark, tmp_path, capsys, s3env):
    refunds = {"landing_refunds": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "csv",
                                   "key_glob": "refunds/*/part-*.csv", "options": {"header": True}}}
    root = s3_project(tmp_path, s3env, more_sources=refunds, extra={
        "tables/refunds.yml": "tables:\n  refunds:\n    key: [refund_id]\n",
        "tables/refunds.sql": "select cast(refund_id as bigint) as refund_id, cast(amount as double) as amount from {{ source('landing_refunds') }}\n",
    })
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    s3env.put("refunds/2026/part-1.csv", body=b"refund_id,amount\n7,0.5\n8,0.25\n")
    s3env.put("refunds/2026/notes.txt", body=b"not a part file\n")
    s3env.put("archive/refunds/2026/part-0.csv", body=b"refund_id,amount\n6,9.0\n")  # the glob is anchored at the key's start
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0)])
    assert_rows(spark, root, "refunds", ["refund_id", "amount"], [(7, 0.5), (8, 0.25)])
    s3env.put("refunds/2026/part-2.csv", body=b"refund_id,amount\n9,1.0\n")
    run_ok(capsys, root)
    st = steps(root)
    assert st["table.refunds"]["rows_read"] == 1
    assert st["table.orders"]["state"] == "success" and st["table.orders"]["rows_read"] == 0, \
        "a new metadata commit with no matching object still moves the orders checkpoint on"
    meta_latest = commits(timeline(capsys, root, "s3_meta"))[-1]["instant"]
    assert commits(timeline(capsys, root, "orders"))[-1]["checkpoints"]["landing_orders"] == meta_latest
    assert_rows(spark, root, "refunds", ["refund_id", "amount"], [(7, 0.5), (8, 0.25), (9, 1.0)])


def test_read_latest_on_missing_checkpoint_and_full_refresh(spark, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env, objects={"read_latest_on_missing_checkpoint": True})
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    run_ok(capsys, root, "--select", "s3_meta")
    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.0}])
    run_ok(capsys, root, "--select", "s3_meta")
    run_ok(capsys, root)  # orders starts from the latest metadata commit only
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(2, 2.0)])

    out, _ = run_ok(capsys, root, "--full-refresh")
    st = steps(root)
    assert st["table.s3_meta"]["state"] == "no_input"
    assert "--full-refresh does not apply" in st["table.s3_meta"]["message"]
    assert st["table.orders"]["state"] == "success" and st["table.orders"]["action"] == "replacecommit"
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0), (2, 2.0)])
    assert len(commits(timeline(capsys, root, "s3_meta"))) == 2


def _subprocess_run(warm_python, root: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if fault:
        env["PIPE_FAULT"] = fault
    return warm_python.run([sys.executable, "-m", "pipe", "run", "--project-dir", str(root)], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=300)


def test_a_crash_between_the_commit_and_the_sqs_delete_makes_no_duplicates(spark, warm_python, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env, events={"visibility_timeout_s": 2})
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.0}])
    r = _subprocess_run(warm_python, root, "before_sqs_delete")
    assert r.returncode == 77, r.stderr[-2000:]
    assert len(commits(timeline(capsys, root, "s3_meta"))) == 1, "the metadata commit completed"
    assert s3env.waiting() == 3, "and no message was deleted"
    time.sleep(2.5)  # the visibility timeout: the messages come back
    run_ok(capsys, root)
    assert len(meta_rows(spark, root)) == 2, "redelivered messages upsert the same keys"
    assert steps(root)["table.s3_meta"]["updates"] == 2 and steps(root)["table.s3_meta"]["inserts"] == 0
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0), (2, 2.0)])
    assert s3env.waiting() == 0


def test_a_crash_before_the_commit_loses_nothing(spark, warm_python, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env, events={"visibility_timeout_s": 2})
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    r = _subprocess_run(warm_python, root, "after_files")
    assert r.returncode == 77, r.stderr[-2000:]
    assert commits(timeline(capsys, root, "s3_meta")) == []
    time.sleep(2.5)
    assert s3env.visible() == 2
    run_ok(capsys, root)
    assert len(meta_rows(spark, root)) == 1
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0)])
    assert s3env.waiting() == 0


def test_continuous_runs_rounds_until_ctrl_c_and_exits_0(spark, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env)
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    results = root / "target" / "run_results.json"
    put_after: list[int] = []

    def driver():
        """Once a round has finished, puts a second object; once a later round has written it
        to orders, presses Ctrl-C."""
        deadline = time.time() + 240
        while time.time() < deadline:
            if results.exists():
                r = json.loads(results.read_text())
                rnd = r["args"]["round"]
                if not put_after:
                    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.0}])
                    put_after.append(rnd)
                elif rnd > put_after[0] and (any(s["id"] == "table.orders" and s["state"] == "success" for s in r["steps"])
                                             or rnd > put_after[0] + 5):
                    os.kill(os.getpid(), signal.SIGINT)
                    return
            time.sleep(0.05)

    t = threading.Thread(target=driver, daemon=True)
    t.start()
    code, out, err = pipe(capsys, root, "run", "--continuous", "--min-sync-interval-s", "1")
    t.join(5)
    assert code == 0, err
    assert_clean(out, err)
    assert "round 1" in out and "round 2" in out
    assert re.search(r"stopped after \d+ rounds", err)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0), (2, 2.0)])


def test_parquet_objects_take_their_schema_from_the_footer_and_multiline_json_errors_name_the_object(spark, tmp_path, capsys, s3env):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    more = {
        "landing_pq": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "parquet", "key_suffix": ".parquet"},
        "landing_docs": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "json", "key_prefix": "docs/",
                         "options": {"multiLine": True}, "schema": "doc_id BIGINT, title STRING"},
    }
    root = s3_project(tmp_path, s3env, more_sources=more, extra={
        "tables/pq.yml": "tables:\n  pq:\n    key: [k]\n",
        "tables/pq.sql": "select * from {{ source('landing_pq') }}\n",
        "tables/docs.yml": "tables:\n  docs:\n    key: [doc_id]\n",
        "tables/docs.sql": "select * from {{ source('landing_docs') }}\n",
    })
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": pa.array([1, 2], pa.int64()), "label": ["a", "b"], "price": [0.5, 1.5]}), buf)
    s3env.put("pq/part-1.parquet", body=buf.getvalue())
    s3env.put("docs/one.json", body=b'{\n  "doc_id": 1,\n  "title": "first"\n}\n')
    s3env.put("docs/many.json", body=b'[{"doc_id": 2, "title": "second"},\n {"doc_id": 3, "title": "third"}]\n')
    run_ok(capsys, root)
    assert_rows(spark, root, "pq", ["k", "label", "price"], [(1, "a", 0.5), (2, "b", 1.5)])
    assert_rows(spark, root, "docs", ["doc_id", "title"], [(1, "first"), (2, "second"), (3, "third")])

    s3env.put("docs/broken.json", body=b'{"doc_id": 4, "title": \n')
    code, out, err = pipe(capsys, root, "run", "--select", "+docs")
    assert code == 1
    assert_clean(out, err)
    msg = steps(root)["table.docs"]["message"]
    assert msg == f'source landing_docs: s3://{s3env.bucket}/docs/broken.json record 1: not a valid JSON object: {{"doc_id": 4, "title": \n', msg
    assert_rows(spark, root, "docs", ["doc_id", "title"], [(1, "first"), (2, "second"), (3, "third")])


def test_a_value_that_does_not_fit_its_type_stops_the_step_naming_object_line_column_and_value(spark, tmp_path, capsys, s3env):
    root = s3_project(tmp_path, s3env)
    s3env.put("orders/a.json", [{"order_id": 1, "amount": None}])  # a null is a null
    run_ok(capsys, root)
    before = timeline(capsys, root, "orders")
    s3env.put("orders/b.json", body=b'{"order_id": 2, "amount": 2.0}\n{"order_id": 3, "amount": "abc"}\n')
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert_clean(out, err)
    st = steps(root)["table.orders"]
    assert st["message"] == f'source landing_orders: s3://{s3env.bucket}/orders/b.json line 2: column amount: "abc" is not a DOUBLE'
    assert "checkpoint did not move" in st["hint"]
    assert timeline(capsys, root, "orders") == before
    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.0}, {"order_id": 3, "amount": 3.0}])  # fixed
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, None), (2, 2.0), (3, 3.0)])


def test_parquet_objects_keep_their_timestamps_and_a_type_mismatch_names_object_and_column(spark, tmp_path, capsys, s3env):
    import datetime as dt
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    more = {
        "landing_typed": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "parquet", "key_prefix": "typed/",
                          "schema": "k BIGINT, ts TIMESTAMP, amount BIGINT"},
        "landing_footer": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "parquet", "key_prefix": "footer/"},
    }
    root = s3_project(tmp_path, s3env, more_sources=more, extra={
        "tables/typed.yml": "tables:\n  typed:\n    key: [k]\n    precombine: ts\n",
        "tables/typed.sql": "select * from {{ source('landing_typed') }}\n",
        "tables/footer.yml": "tables:\n  footer:\n    key: [k]\n",
        "tables/footer.sql": "select * from {{ source('landing_footer') }}\n",
    })

    def put(key: str, table) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        s3env.put(key, body=buf.getvalue())

    when = dt.datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
    stamps = pa.array([when, when + dt.timedelta(days=1)], pa.timestamp("us", tz="UTC"))
    put("typed/a.parquet", pa.table({"k": pa.array([1, 2], pa.int64()), "ts": stamps, "amount": pa.array([5, 6], pa.int32())}))
    put("footer/a.parquet", pa.table({"k": pa.array([1, 2], pa.int64()), "ts": stamps}))
    run_ok(capsys, root)
    naive = when.replace(tzinfo=None)  # Spark's TIMESTAMP in the session's zone, UTC in the tests
    day = dt.timedelta(days=1)
    assert pipe_rows(spark, root, "typed", ["k", "ts", "amount"]) == [(1, naive, 5), (2, naive + day, 6)]
    assert hudi_rows(root, "typed", ["k", "ts", "amount"]) == [(1, when, 5), (2, when + day, 6)]  # hudi-rs: instants in UTC
    assert pipe_rows(spark, root, "footer", ["k", "ts"]) == [(1, naive), (2, naive + day)]
    assert hudi_rows(root, "footer", ["k", "ts"]) == [(1, when), (2, when + day)]

    before = timeline(capsys, root, "typed")
    put("typed/b.parquet", pa.table({"k": pa.array([3], pa.int64()), "ts": stamps[:1], "amount": ["abc"]}))
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert_clean(out, err)
    msg = steps(root)["table.typed"]["message"]
    assert msg.startswith(f"source landing_typed: s3://{s3env.bucket}/typed/b.parquet: column amount holds string values, "
                          "which do not convert to the declared type"), msg
    assert timeline(capsys, root, "typed") == before


def test_without_a_schema_and_no_matching_object_the_step_waits(spark, tmp_path, capsys, s3env):
    more = {"landing_any": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "json", "key_prefix": "any/"}}
    root = s3_project(tmp_path, s3env, more_sources=more, extra={"tables/anything.sql": "select * from {{ source('landing_any') }}\n"})
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.0}])
    run_ok(capsys, root)
    st = steps(root)["table.anything"]
    assert st["state"] == "no_input"
    assert "no new object to read, and without a declared `schema`" in st["message"]
    s3env.put("any/x.json", [{"x": 1, "y": "z"}])
    run_ok(capsys, root)
    assert steps(root)["table.anything"]["state"] == "success"
    assert hudi_rows(root, "anything", ["x", "y"]) == [(1, "z")]


def test_held_messages_stay_invisible_while_the_run_holds_them(s3env):
    """The visibility keeper renews held messages before their timeout runs out; once the run
    lets go of them without deleting, they come back."""
    from runtime.sources import s3_events

    for i in range(3):
        s3env.sqs.send_message(QueueUrl=s3env.queue, MessageBody=json.dumps({"Records": [_event(f"k{i}")]}))
    config = {"queue_url": s3env.queue, "endpoint_url": s3env.endpoint, "region": "us-east-1",
              "long_poll_wait_s": 0, "visibility_timeout_s": 2}
    p = s3_events.pending("ev", config)
    assert len(p.records) == 3
    time.sleep(5)  # more than twice the timeout
    assert s3env.visible() == 0, "the keeper renewed them"
    p.finish(committed=False, succeeded=False)  # a failed run: nothing deleted
    # back in the queue at once, for the next run (a fix and a rerun need not wait for the timeout)
    assert s3env.visible() == len(p.messages) == 4  # the 3 events and the bucket's s3:TestEvent


def test_events_naming_an_undeclared_bucket_are_not_followed_and_object_sizes_come_from_s3(spark, tmp_path, capsys, s3env):
    """Anyone who can send to the queue writes the events: an event naming another bucket the
    credentials can read is not followed, and the size an event states is not believed."""
    secret = s3env.bucket + "-secret"
    s3env.s3.create_bucket(Bucket=secret)
    s3env.s3.put_object(Bucket=secret, Key="orders/payroll.json", Body=b'{"order_id": 666, "amount": 99999.0}\n')
    s3env.put("orders/a.json", [{"order_id": 1, "amount": 1.5}])
    big_rows = [{"order_id": 100 + i, "amount": i + 0.25} for i in range(200)]
    big = s3env.put("orders/big.json", big_rows)
    assert big > 4096
    s3env.put("orders/gone.json", [{"order_id": 7, "amount": 7.0}])
    s3env.s3.delete_object(Bucket=s3env.bucket, Key="orders/gone.json")  # named by an event, gone when the run asks its size
    forged = [_event("orders/payroll.json", bucket=secret, size=40, when="2026-11-21T10:00:01.000Z"),
              _event("orders/big.json", bucket=s3env.bucket, size=10, when="2026-11-21T10:00:02.000Z")]  # a later event: 10 bytes, it says
    s3env.sqs.send_message(QueueUrl=s3env.queue, MessageBody=json.dumps({"Records": forged}))
    root = s3_project(tmp_path, s3env, objects={"max_object_size": "4KB"})
    run_ok(capsys, root)

    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.5)])  # neither the payroll nor the 'small' big object
    source = steps(root)["table.orders"]["inputs"]["landing_orders"]
    assert source["undeclared_bucket_objects"] == 1
    assert source["undeclared_bucket_samples"] == [f"s3://{secret}/orders/payroll.json"]
    assert (f"1 named by events in buckets the source does not declare (not read, to table landing_orders_dead_letter), "
            f"e.g. s3://{secret}/orders/payroll.json") in source["detail"]
    assert f"1 named by events but gone from the bucket (skipped), e.g. s3://{s3env.bucket}/orders/gone.json" in source["detail"]
    assert source["bytes"] == s3env.s3.head_object(Bucket=s3env.bucket, Key="orders/a.json")["ContentLength"]
    # the object not followed is recorded in the source's dead-letter table, with why and which event
    assert source["dead_lettered"] == 1
    dead = hudi_rows(root, "landing_orders_dead_letter", ["bucket", "object_key", "source", "metadata_table", "consumer", "reason"])
    assert dead == [(secret, "orders/payroll.json", "landing_orders", "s3_meta", "orders", "the bucket is not in the source's `buckets`")]
    code, out, err = pipe(capsys, root, "show", "landing_orders_dead_letter", "--output", "json")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["object_key"] == "orders/payroll.json"
    dead_commits = len(commits(timeline(capsys, root, "landing_orders_dead_letter")))

    # a second round: one more forged event among real ones; the first is not written again
    s3env.put("orders/b.json", [{"order_id": 2, "amount": 2.5}])
    s3env.sqs.send_message(QueueUrl=s3env.queue, MessageBody=json.dumps({"Records": [
        _event("orders/quarterly.json", bucket=secret, size=40, when="2026-11-21T11:00:00.000Z")]}))
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.5), (2, 2.5)])
    assert sorted(hudi_rows(root, "landing_orders_dead_letter", ["object_key"])) == [("orders/payroll.json",), ("orders/quarterly.json",)]
    assert len(commits(timeline(capsys, root, "landing_orders_dead_letter"))) == dead_commits + 1
    run_ok(capsys, root)  # nothing new: no dead-letter commit either
    assert len(commits(timeline(capsys, root, "landing_orders_dead_letter"))) == dead_commits + 1

    # declared, the other bucket is read; without the size limit the object is read whole
    (root / "sources/s3.yml").write_text((root / "sources/s3.yml").read_text().replace("max_object_size: 4KB\n", ""), encoding="utf-8")
    import yaml

    config = yaml.safe_load((root / "sources/s3.yml").read_text())
    config["sources"]["landing_orders"]["buckets"].append(secret)
    (root / "sources/s3.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    code, out, err = pipe(capsys, root, "run", "--select", "orders", "--full-refresh")
    assert code == 0, out + err
    assert_rows(spark, root, "orders", ["order_id", "amount"],
                [(1, 1.5), (2, 2.5), (666, 99999.0)] + [(r["order_id"], r["amount"]) for r in big_rows])
