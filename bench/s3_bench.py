#!/usr/bin/env python
"""The S3 sources (`s3_events`, `s3_incremental`) against a moto server, side by side with bare
boto3 and Spark baselines in the same run, on local[2]:

  A  notifications -> metadata table: a full queue of N S3 event notifications (10,000) drained
     into the S3 metadata table by pipe, with `max_messages_per_batch` 5 (the default) and 10
     (pipe always deletes after the commit, 10 per delete_message_batch), against two bare
     boto3 loops at 5 and 10 per receive that do nothing else:
       floor, receive+delete   receive a batch, delete it (delete_message_batch), repeat
       floor, hold then delete receive everything, then delete it 10 per call: the same SQS
                               calls pipe makes, without Spark
     pipe's time is split by timing its functions in-process: receive (runtime.sources.s3_events
     .receive), parse (the rest of s3_events.pending), DataFrame (S3EventsPending.dataframe),
     commit (Table.write of the metadata table: the Spark write and the commit), delete
     (S3EventsPending._delete) and other (the rest of the table step). Every SQS call pipe makes
     is counted with botocore event hooks on its client. The default case runs once more with
     visibility_timeout_s 600, so that pipe's visibility keeper has nothing to renew.
  B  objects end to end: N objects put into a bucket whose notifications go to the queue
     (2,000 small JSON-lines objects of 20 rows, and 50 objects of 2 MB), then one `pipe run` of
     both tables (s3_meta, then orders, which reads the objects inside the executors), against:
       boto3 loop              one Python process: get_object + json.loads of every line
       Spark, local files      spark.read.json of the same bytes written to local files, to Parquet
       pipe, local files       `pipe run` of a `kind: files` source over those local files into a
                               table with the same key (what the S3 path adds to pipe's own cost)

pipe runs in-process (compile + Executor.run, as `pipe run` does, on one SparkSession from
runtime.spark.session.get_spark('local[2]')); a warm-up round (both parts, small) runs first, so JVM
start, class loading and the Python workers' imports are not counted. Each pipe case writes a
fresh table. After each case the tables are read back (row counts) and the queue must be empty.

The moto server (moto.server.ThreadedMotoServer) runs in a child process, so its CPU time can be
told apart. moto's SQS does O(queue depth) work per call, several times over, which makes 10,000
messages take hours; the child therefore patches those hot spots (same results, standard queues
only; `install_fast_sqs` below), and the bench measures stock moto's per-call cost at the same
queue depth for comparison. Results go to the `s3` section of bench/RESULTS.md; the raw
measurements to a JSON file (--save), from which --render writes the section again.

    python bench/s3_bench.py            # about 7 minutes on 2 cores
    python bench/s3_bench.py --quick    # 1,000 notifications, 200 + 10 objects; prints, writes nothing
    python bench/s3_bench.py --render /tmp/pipe-s3-bench.json   # the report again, from saved measurements
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for p in (str(REPO), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

# Before anything starts Spark: the JVM and its Python workers inherit these (boto3 in the
# executors reads them), and so does the moto child.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
os.environ.update(AWS_ENV)
for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(k, None)

REGION = "us-east-1"
NO_RENEWAL = "pipe run, visibility_timeout_s 600"
ORDERS_DDL = "order_id BIGINT, customer_id BIGINT, amount DOUBLE, status STRING, region STRING, updated_at STRING"


# --- the moto server (child process) ---------------------------------------------------------


def install_fast_sqs(flag: dict) -> None:
    """Patches moto's SQS hot spots; each patched function runs moto's own code while
    flag["fast"] is false. Behaviour is unchanged for standard (non-FIFO) queues:

    1. moto.sqs.models.unix_time / unix_time_millis: time.time() instead of datetime arithmetic
       (the same value); moto calls them twice per message per scan of the queue;
    2. Queue.attributes: each attribute computed when asked for, instead of all of them (three
       full scans of the queue) on every access; SendMessage reads one attribute per message,
       GetQueueAttributes each asked one three times;
    3. Queue.messages: one clock read per call instead of two per message;
    4. Queue.pending_message_groups: empty for standard queues without iterating the in-flight set;
    5. SQSBackend.is_message_valid_based_on_retention_period: reads the retention period instead
       of computing every attribute, once per received message;
    6. delete_message_batch / change_message_visibility_batch: one pass over the queue per call
       instead of one (deletes: two, and a copy of the list) per entry."""
    import time as _time
    from collections.abc import Mapping

    from moto.core.utils import camelcase_to_underscores
    from moto.sqs import models as m
    from moto.sqs.constants import MAXIMUM_VISIBILITY_TIMEOUT
    from moto.sqs.exceptions import InvalidParameterValue

    stock_ut, stock_utm = m.unix_time, m.unix_time_millis

    def unix_time(d=None):
        return _time.time() if (d is None and flag["fast"]) else stock_ut(d)

    def unix_time_millis(d=None):
        return _time.time() * 1000.0 if (d is None and flag["fast"]) else stock_utm(d)

    m.unix_time, m.unix_time_millis = unix_time, unix_time_millis
    Q, B = m.Queue, m.SQSBackend

    class LazyAttributes(Mapping):
        def __init__(self, q):
            self.q = q
            self.names = list(Q.BASE_ATTRIBUTES) + (Q.FIFO_ATTRIBUTES if q.fifo_queue else []) + (Q.KMS_ATTRIBUTES if q.kms_master_key_id else [])

        def __getitem__(self, name):
            if name not in self.names:
                raise KeyError(name)
            value = getattr(self.q, camelcase_to_underscores(name))
            if name == "RedrivePolicy" and self.q.redrive_policy:
                value = json.dumps(self.q.redrive_policy)
            return str(value).lower() if isinstance(value, bool) else value

        def __iter__(self):
            return iter(self.names)

        def __len__(self):
            return len(self.names)

    stock_attributes, stock_messages, stock_groups = Q.attributes.fget, Q.messages.fget, Q.pending_message_groups.fget

    def attributes(self):
        return LazyAttributes(self) if flag["fast"] else stock_attributes(self)

    def messages(self):
        if not flag["fast"]:
            return stock_messages(self)
        now = _time.time() * 1000.0
        return [x for x in self._messages if now > x.visible_at and not now < x.delayed_until]

    def pending_message_groups(self):
        return set() if (flag["fast"] and not self.fifo_queue) else stock_groups(self)

    Q.attributes, Q.messages, Q.pending_message_groups = property(attributes), property(messages), property(pending_message_groups)

    stock_valid = B.is_message_valid_based_on_retention_period

    def is_valid(self, queue_name, message):
        if not flag["fast"]:
            return stock_valid(self, queue_name, message)
        return int(self.get_queue(queue_name).message_retention_period) + message.sent_timestamp / 1000 > _time.time()

    B.is_message_valid_based_on_retention_period = is_valid

    def _matches(q, handles):
        """(message, handle) for each message of q that has (had) one of `handles`: one pass."""
        out = []
        for msg in q._messages:
            old = msg._old_receipt_handles
            if msg.receipt_handle in handles or (old and not handles.isdisjoint(old)):
                out.append((msg, [h for h in msg.all_receipt_handles if h in handles]))
        return out

    def _invalid(entry_id, handle):
        return {"Id": entry_id, "SenderFault": True, "Code": "ReceiptHandleIsInvalid",
                "Message": f'The input receipt handle "{handle}" is not a valid receipt handle.'}

    stock_delete = B.delete_message_batch

    def delete_message_batch(self, queue_name, receipts):
        if not flag["fast"]:
            return stock_delete(self, queue_name, receipts)
        q = self.get_queue(queue_name)
        handles = {r["ReceiptHandle"] for r in receipts if r["ReceiptHandle"] not in q.deleted_messages}
        gone = set()
        hits = _matches(q, handles)
        for msg, hs in hits:
            q.pending_messages.discard(msg)
            q.deleted_messages.update(msg.all_receipt_handles)
            gone.add(id(msg))
        if gone:
            q._messages = [x for x in q._messages if id(x) not in gone]
        success, errors = [], []
        for r in receipts:
            (success.append(r["Id"]) if r["ReceiptHandle"] in q.deleted_messages else errors.append(_invalid(r["Id"], r["ReceiptHandle"])))
        return success, errors

    B.delete_message_batch = delete_message_batch
    stock_visibility = B.change_message_visibility_batch

    def change_message_visibility_batch(self, queue_name, entries):
        if not flag["fast"]:
            return stock_visibility(self, queue_name, entries)
        q = self.get_queue(queue_name)
        success, errors, wanted = [], [], {}
        for e in entries:
            try:
                timeout = int(e["VisibilityTimeout"])
                assert timeout <= MAXIMUM_VISIBILITY_TIMEOUT
            except Exception:  # noqa: BLE001 - as moto's own
                errors.append({"Id": e["Id"], "SenderFault": True, "Code": "InvalidParameterValue", "Message": "Visibility timeout invalid"})
                continue
            wanted[e["ReceiptHandle"]] = (e["Id"], timeout)
        done = set()
        for msg, hs in _matches(q, set(wanted)):
            for h in hs:
                entry_id, timeout = wanted[h]
                if unix_time_millis() + timeout * 1000 - msg.sent_timestamp > 43200 * 1000:
                    raise InvalidParameterValue(f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: Total "
                                                "VisibilityTimeout for the message is beyond the limit [43200 seconds]")
                msg.change_visibility(timeout)
                if msg.visible and msg in q.pending_messages:
                    q.pending_messages.remove(msg)
                done.add(h)
        for h, (entry_id, _) in wanted.items():
            (success.append(entry_id) if h in done else errors.append(_invalid(entry_id, h)))
        return success, errors

    B.change_message_visibility_batch = change_message_visibility_batch


def serve() -> None:
    """The child: a ThreadedMotoServer on a free port (printed), then commands on stdin:
    `fast` / `stock` switch the SQS patches, `quit` stops."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log line per request
    flag = {"fast": True}
    install_fast_sqs(flag)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"http://{host}:{port}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd in ("fast", "stock"):
            flag["fast"] = cmd == "fast"
            print("ok", flush=True)
        elif cmd == "quit":
            break
    server.stop()


def _proc_cpu(pid: int) -> float:
    """utime + stime (+ waited-for children) of one process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Moto:
    def __init__(self, log: Path):
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=dict(os.environ))
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise SystemExit(f"the moto server did not start; see {log}")

    def mode(self, name: str) -> None:
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def cpu(self) -> float:
        return _proc_cpu(self.proc.pid)

    def stop(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# --- CPU and timing --------------------------------------------------------------------------


def _descendants(root: int, skip: set[int]) -> list[tuple[int, list[str]]]:
    """(pid, /proc/pid/stat fields after the name) of the live descendants of `root`, minus the
    subtrees in `skip`."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                pass
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, f in stats.items():
        children[int(f[1])].append(pid)
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in skip:
                out.append((child, stats[child]))
                stack.append(child)
    return out


def _tree_cpu(root: int, skip: set[int]) -> float:
    """CPU seconds (with waited-for children) of the live descendants of `root`."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum(sum(int(x) for x in f[11:15]) for _, f in _descendants(root, skip)) / tick


class TreeCpu(threading.Thread):
    """CPU seconds used by the Spark JVM and its Python workers (the bench's descendants other
    than moto), sampled every 0.2 s per process (utime + stime, keyed by pid and start time), so
    that a worker that exits keeps counting with its last sample instead of vanishing."""

    def __init__(self, skip: set[int]):
        super().__init__(daemon=True, name="bench-cpu")
        self.skip = skip
        self.seen: dict[tuple[int, str], float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> float:
        with self.lock:
            for pid, f in _descendants(os.getpid(), self.skip):
                self.seen[(pid, f[19])] = (int(f[11]) + int(f[12])) / self.tick
            return sum(self.seen.values())

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()


def _machine_cpu() -> tuple[float, float, float]:
    """(busy CPU seconds of the whole machine, steal seconds, CPU seconds of this process and all
    its live descendants: moto, the JVM, the Python workers)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    tick = os.sysconf("SC_CLK_TCK")
    v = [int(x) / tick for x in fields[1:]]
    me = resource.getrusage(resource.RUSAGE_SELF)
    return v[0] + v[1] + v[2] + v[5] + v[6], (v[7] if len(v) > 7 else 0.0), me.ru_utime + me.ru_stime + _tree_cpu(os.getpid(), set())


class Meter:
    """Wall time and CPU seconds of moto, the Python driver and the JVM tree over one case."""

    tree: TreeCpu | None = None

    def __init__(self, moto: Moto):
        self.moto = moto
        if Meter.tree is None:
            Meter.tree = TreeCpu({moto.proc.pid})
            Meter.tree.start()

    def _sample(self):
        me = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), self.moto.cpu(), me.ru_utime + me.ru_stime, Meter.tree.sample()

    def __enter__(self):
        self.t0 = self._sample()
        return self

    def __exit__(self, *exc):
        t1 = self._sample()
        self.wall, self.moto_cpu, self.driver_cpu, self.jvm_cpu = (b - a for a, b in zip(self.t0, t1))


class Probe:
    """Times functions of pipe's runtime in-process (wrapped while a case runs) and counts the
    SQS calls pipe's clients make (botocore event hooks)."""

    def __init__(self):
        self.t: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()
        self.call_s: dict[str, float] = collections.defaultdict(float)
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner, attr: str, label: Callable[..., str] | str) -> None:
        orig = getattr(owner, attr)
        probe = self

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                probe.t[label(*args, **kwargs) if callable(label) else label] += time.perf_counter() - t0

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, orig))

    def hook_clients(self, module) -> None:
        orig = module.sqs_client
        probe = self

        def client(config):
            c = orig(config)

            def before(model, context, **_):
                context["_bench_t0"] = time.perf_counter()
                probe.calls[model.name] += 1

            def after(model, context, **_):
                probe.call_s[model.name] += time.perf_counter() - context.get("_bench_t0", time.perf_counter())

            c.meta.events.register("before-call.sqs", before)
            c.meta.events.register("after-call.sqs", after)
            return c

        module.sqs_client = client
        self._undo.append((module, "sqs_client", orig))

    def __enter__(self):
        from runtime.sources import s3_events, s3_incremental
        from runtime.table.table import Table

        self.wrap(s3_events, "receive", "receive")
        self.wrap(s3_events, "pending", lambda *a, dry_run=False, **k: "queue count" if dry_run else "pending")
        self.wrap(s3_events.S3EventsPending, "dataframe", "dataframe")
        self.wrap(s3_events.S3EventsPending, "_delete", "delete")
        self.wrap(s3_incremental.S3IncrementalPending, "plan", "plan")
        self.wrap(s3_incremental, "read_in_executors", "fetch")
        self.wrap(Table, "write", lambda table, *a, **k: "write:" + table.config.name)
        self.hook_clients(s3_events)
        return self

    def __exit__(self, *exc):
        for owner, attr, orig in reversed(self._undo):
            setattr(owner, attr, orig)
        self._undo.clear()


# --- S3 / SQS helpers ------------------------------------------------------------------------


def clients(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name=REGION), boto3.client("sqs", endpoint_url=url, region_name=REGION)


def make_queue(sqs, name: str) -> tuple[str, str]:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def make_bucket(s3, bucket: str, queue_arn: str) -> None:
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [{"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"]}]})


def queue_depth(sqs, url: str) -> int:
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                                                                "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    return sum(int(v) for v in a.values())


def event_template(s3, sqs) -> dict:
    """One real notification from moto (put_object into a bucket that notifies a queue), whose
    shape the generated notifications of part A copy."""
    url, arn = make_queue(sqs, "template")
    make_bucket(s3, "template", arn)
    s3.put_object(Bucket="template", Key="t/one.json", Body=b'{"a": 1}\n')
    for _ in range(10):
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            doc = json.loads(m["Body"])
            if "Records" in doc:
                sqs.delete_queue(QueueUrl=url)
                return doc
    raise SystemExit("moto sent no S3 event notification to the queue")


def fill_queue(sqs, url: str, template: dict, bucket: str, n: int, prefix: str) -> float:
    """n notifications of distinct objects, in moto's exact S3 event JSON (the template with the
    key, size, eTag and time of each object), sent 10 per send_message_batch. Returns seconds."""
    t0 = time.perf_counter()
    rec = template["Records"][0]
    for start in range(0, n, 10):
        entries = []
        for i in range(start, min(n, start + 10)):
            key = f"{prefix}/e-{i:06d}.json"
            r = json.loads(json.dumps(rec))
            r["eventTime"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            r["s3"]["bucket"] = {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"}
            r["s3"]["object"] = {"key": urllib.parse.quote_plus(key), "size": 100 + i % 900, "eTag": hashlib.md5(key.encode()).hexdigest()}
            entries.append({"Id": str(i - start), "MessageBody": json.dumps({"Records": [r]})})
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    depth = queue_depth(sqs, url)
    assert depth == n, (depth, n)
    return time.perf_counter() - t0


def order_lines(obj: int, rows: int, start_id: int) -> bytes:
    regions = ("eu", "us", "apac")
    out = []
    for j in range(rows):
        oid = start_id + j
        out.append(json.dumps({"order_id": oid, "customer_id": 1000 + oid % 997, "amount": round((oid % 10007) * 0.37, 2),
                               "status": ("placed", "paid", "shipped", "cancelled")[oid % 4], "region": regions[oid % 3],
                               "updated_at": f"2026-11-{1 + oid % 28:02d}T{oid % 24:02d}:{oid % 60:02d}:00Z"}))
    return ("\n".join(out) + "\n").encode()


@dataclass
class ObjectSet:
    label: str
    bucket: str
    queue_url: str
    prefix: str
    keys: list[str]
    rows: int
    bytes: int
    local_dir: Path
    put_s: float


def put_objects(s3, sqs, label: str, bucket: str, n: int, rows: int, local_root: Path) -> ObjectSet:
    """n JSON-lines objects of `rows` orders each into a bucket that notifies its own queue (real
    S3 notifications), and the same bytes into local files for the baselines."""
    url, arn = make_queue(sqs, f"{bucket}-events")
    make_bucket(s3, bucket, arn)
    local = local_root / bucket
    local.mkdir(parents=True)
    keys, total = [], 0
    t0 = time.perf_counter()
    for i in range(n):
        key = f"orders/{label}/part-{i:05d}.json"
        body = order_lines(i, rows, i * rows)
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        (local / f"part-{i:05d}.json").write_bytes(body)
        keys.append(key)
        total += len(body)
    put_s = time.perf_counter() - t0
    return ObjectSet(label, bucket, url, f"orders/{label}/", keys, n * rows, total, local, put_s)


# --- pipe projects ---------------------------------------------------------------------------

PROJECT_YML = "name: s3bench\ntargets:\n  dev:\n    spark:\n      master: 'local[2]'\n"


def write_project(root: Path, sources: dict[str, dict], tables: dict[str, tuple[dict, str]]) -> Path:
    if root.exists():
        shutil.rmtree(root)
    (root / "sources").mkdir(parents=True)
    (root / "tables").mkdir()
    (root / "pipe_project.yml").write_text(PROJECT_YML)
    (root / "sources" / "s3.yml").write_text(json.dumps({"sources": sources}, indent=2))  # JSON is YAML
    for name, (config, sql) in tables.items():
        (root / "tables" / f"{name}.yml").write_text(json.dumps({"tables": {name: config}}, indent=2))
        (root / "tables" / f"{name}.sql").write_text(sql + "\n")
    return root


def events_source(moto_url: str, queue_url: str, per_batch: int, **extra) -> dict:
    return {"kind": "s3_events", "queue_url": queue_url, "endpoint_url": moto_url, "region": REGION, "max_messages_per_batch": per_batch, **extra}


META_TABLE = ({"key": ["object_key", "event_name"], "partition_by": ["bucket"], "precombine": "event_time", "index": "partition"},
              "select * from {{ source('landing_events') }}")


def project_a(root: Path, moto_url: str, queue_url: str, per_batch: int, **extra) -> Path:
    return write_project(root, {"landing_events": events_source(moto_url, queue_url, per_batch, **extra)}, {"s3_meta": META_TABLE})


def project_b(root: Path, moto_url: str, objs: ObjectSet) -> Path:
    return write_project(root, {
        "landing_events": events_source(moto_url, objs.queue_url, 5),
        "landing_orders": {"kind": "s3_incremental", "metadata_table": "s3_meta", "format": "json", "key_prefix": objs.prefix,
                           "endpoint_url": moto_url, "region": REGION, "schema": ORDERS_DDL},
    }, {"s3_meta": META_TABLE, "orders": ({"key": ["order_id"]}, "select * from {{ source('landing_orders') }}")})


def project_files(root: Path, objs: ObjectSet) -> Path:
    return write_project(root, {"local_orders": {"kind": "files", "path": str(objs.local_dir), "format": "json", "schema": ORDERS_DDL}},
                         {"orders": ({"key": ["order_id"]}, "select * from {{ source('local_orders') }}")})


def pipe_run(root: Path, spark):
    """`pipe run` in-process: compile, then the Executor on the bench's SparkSession."""
    from compiler.api import compile_project
    from runtime.executor import Executor, RunOptions

    plan = compile_project(root).plan
    run = Executor(plan, root, plan.step_ids, RunOptions(), spark_factory=lambda: spark).run()
    if run.failed:
        raise SystemExit("pipe run failed: " + "; ".join(f"{s.id}: {s.state} {s.message}" for s in run.steps if s.state != "success"))
    return run


def table_rows(spark, root: Path, name: str) -> int:
    from runtime.table.table import Table

    return Table.open(spark, str(root / "lake" / name)).read().count()


# --- part A ----------------------------------------------------------------------------------


@dataclass
class Case:
    part: str
    label: str
    per_call: int | None
    items: int
    wall: float
    moto_cpu: float
    driver_cpu: float
    jvm_cpu: float
    split: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    rows: int | None = None
    baseline: bool = False
    note: str = ""


def floor_loop(sqs, url: str, per_call: int, hold: bool, expect: int) -> tuple[int, dict[str, float], dict[str, int]]:
    """Receive (per_call per call, the same wait and visibility as pipe), delete with
    delete_message_batch: each batch at once, or (hold) everything after the queue is drained,
    10 per call. Nothing else."""
    recv_s = del_s = 0.0
    calls = collections.Counter()
    held: dict[str, str] = {}
    wait = 20

    def delete(receipts):
        nonlocal del_s
        t0 = time.perf_counter()
        for i in range(0, len(receipts), 10):
            chunk = receipts[i:i + 10]
            r = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(j), "ReceiptHandle": h} for j, h in enumerate(chunk)])
            calls["DeleteMessageBatch"] += 1
            assert len(r.get("Successful", [])) == len(chunk), r.get("Failed")
        del_s += time.perf_counter() - t0

    while True:
        t0 = time.perf_counter()
        ms = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=per_call, WaitTimeSeconds=wait, VisibilityTimeout=30,
                                 MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"]).get("Messages", [])
        recv_s += time.perf_counter() - t0
        calls["ReceiveMessage"] += 1
        wait = 1  # as pipe: after the first answer, the last (empty) receive waits 1 s
        new = [m for m in ms if m["MessageId"] not in held]
        if not new:
            break
        for m in new:
            held[m["MessageId"]] = m["ReceiptHandle"]
        if not hold:
            delete([m["ReceiptHandle"] for m in new])
    if hold:
        delete(list(held.values()))
    assert len(held) == expect, (len(held), expect)
    return len(held), {"receive": recv_s, "delete": del_s}, dict(calls)


def run_floor(moto: Moto, sqs, url: str, template: dict, n: int, per_call: int, hold: bool) -> Case:
    fill_queue(sqs, url, template, "events", n, "a")
    with Meter(moto) as m:
        got, split, calls = floor_loop(sqs, url, per_call, hold, n)
    assert queue_depth(sqs, url) == 0
    label = "floor: hold, then delete" if hold else "floor: receive + delete"
    return Case("A", label, per_call, got, m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu, split, calls, baseline=True)


def _a_split(probe: Probe, run, table: str = "s3_meta") -> dict[str, float]:
    step = next(s for s in run.steps if s.id == f"table.{table}")
    split = {"receive": probe.t["receive"], "parse": probe.t["pending"] - probe.t["receive"], "dataframe": probe.t["dataframe"],
             "commit": probe.t[f"write:{table}"], "delete": probe.t["delete"]}
    split["other"] = step.elapsed_s - sum(split.values())
    return split


def run_pipe_a(moto: Moto, spark, sqs, url: str, template: dict, n: int, per_call: int, work: Path, tag: str,
               label: str = "pipe run", **extra) -> Case:
    fill_queue(sqs, url, template, "events", n, "a")
    root = project_a(work / f"a-{tag}", moto.url, url, per_call, **extra)
    with Probe() as probe, Meter(moto) as m:
        run = pipe_run(root, spark)
    rows = table_rows(spark, root, "s3_meta")
    depth = queue_depth(sqs, url)
    assert rows == n and depth == 0, f"pipe A {per_call}/call: {rows} rows in s3_meta (expected {n}), {depth} messages left in the queue"
    split = _a_split(probe, run)
    split["source step"] = next(s.elapsed_s for s in run.steps if s.id == "source.landing_events")
    return Case("A", label, per_call, n, m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu, split, dict(probe.calls), rows=rows)


def stock_calibration(moto: Moto, sqs, template: dict, depth: int) -> list[tuple[str, int, float]]:
    """Per-call seconds of stock moto (patches off) at `depth` messages in the queue."""
    url, _ = make_queue(sqs, "calibration")
    fill_queue(sqs, url, template, "events", depth, "c")
    out = []
    moto.mode("stock")
    try:
        for per in (5, 10):
            t0 = time.perf_counter()
            ms = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=per, WaitTimeSeconds=0, VisibilityTimeout=300)["Messages"]
            out.append((f"ReceiveMessage ({per})", depth, time.perf_counter() - t0))
            t0 = time.perf_counter()
            sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(ms)])
            out.append((f"DeleteMessageBatch ({per})", depth, time.perf_counter() - t0))
        t0 = time.perf_counter()
        queue_depth(sqs, url)
        out.append(("GetQueueAttributes (3 counts)", depth, time.perf_counter() - t0))
    finally:
        moto.mode("fast")
    # the same calls with the patches on, for the ratio
    for per in (5, 10):
        t0 = time.perf_counter()
        ms = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=per, WaitTimeSeconds=0, VisibilityTimeout=300)["Messages"]
        out.append((f"ReceiveMessage ({per}), patched", depth, time.perf_counter() - t0))
        t0 = time.perf_counter()
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(ms)])
        out.append((f"DeleteMessageBatch ({per}), patched", depth, time.perf_counter() - t0))
    sqs.delete_queue(QueueUrl=url)
    return out


# --- part B ----------------------------------------------------------------------------------


def run_pipe_b(moto: Moto, spark, sqs, objs: ObjectSet, work: Path) -> Case:
    root = project_b(work / f"b-{objs.label}", moto.url, objs)
    with Probe() as probe, Meter(moto) as m:
        run = pipe_run(root, spark)
    meta, rows, depth = table_rows(spark, root, "s3_meta"), table_rows(spark, root, "orders"), queue_depth(sqs, objs.queue_url)
    n = len(objs.keys)
    assert meta == n and rows == objs.rows and depth == 0, f"pipe B {objs.label}: s3_meta {meta} (expected {n}), orders {rows} (expected {objs.rows}), queue {depth}"
    steps = {s.id: s.elapsed_s for s in run.steps}
    split = _a_split(probe, run)
    split = {f"meta {k}": v for k, v in split.items()}
    split.update({"orders plan": probe.t["plan"], "orders fetch+check": probe.t["fetch"], "orders commit": probe.t["write:orders"]})
    split["orders other"] = steps["table.orders"] - probe.t["plan"] - probe.t["fetch"] - probe.t["write:orders"]
    split["source steps"] = steps["source.landing_events"] + steps["source.landing_orders"]
    split["table.s3_meta"], split["table.orders"] = steps["table.s3_meta"], steps["table.orders"]
    return Case("B", "pipe run (s3_meta + orders)", None, n, m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu, split, dict(probe.calls), rows=rows)


def run_boto3_b(moto: Moto, s3, objs: ObjectSet) -> Case:
    with Meter(moto) as m:
        rows = 0
        for key in objs.keys:
            body = s3.get_object(Bucket=objs.bucket, Key=key)["Body"].read()
            for line in body.decode("utf-8").splitlines():
                if line.strip():
                    json.loads(line)
                    rows += 1
    assert rows == objs.rows, (rows, objs.rows)
    return Case("B", "boto3 loop: get_object + json.loads (no write)", None, len(objs.keys), m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu,
                rows=rows, baseline=True)


def run_spark_local_b(moto: Moto, spark, objs: ObjectSet, work: Path) -> Case:
    out = work / f"parquet-{objs.label}"
    with Meter(moto) as m:
        df = spark.read.schema(ORDERS_DDL).json(str(objs.local_dir))
        df.write.mode("overwrite").parquet(str(out))
    rows = spark.read.parquet(str(out)).count()
    assert rows == objs.rows, (rows, objs.rows)
    return Case("B", "Spark: read.json(local files) -> Parquet", None, len(objs.keys), m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu,
                rows=rows, baseline=True)


def run_pipe_files_b(moto: Moto, spark, objs: ObjectSet, work: Path) -> Case:
    root = project_files(work / f"files-{objs.label}", objs)
    with Probe() as probe, Meter(moto) as m:
        run = pipe_run(root, spark)
    rows = table_rows(spark, root, "orders")
    assert rows == objs.rows, (rows, objs.rows)
    steps = {s.id: s.elapsed_s for s in run.steps}
    split = {"orders commit": probe.t["write:orders"], "table.orders": steps["table.orders"]}
    return Case("B", "pipe run, local files (kind: files)", None, len(objs.keys), m.wall, m.moto_cpu, m.driver_cpu, m.jvm_cpu, split,
                rows=rows, baseline=True)


# --- report ----------------------------------------------------------------------------------


def _code_hash() -> str:
    h = hashlib.sha256()
    for d in ("runtime", "compiler", "pipe"):
        for p in sorted((REPO / d).rglob("*.py")):
            h.update(p.relative_to(REPO).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _machine() -> dict[str, str]:
    import boto3
    import moto
    import pyspark

    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "runtime", "compiler", "pipe"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        commit += " (runtime/compiler/pipe modified in the working tree)" if dirty else ""
    except OSError:
        commit = "unknown"
    return {
        "CPU": f"{model or 'unknown'}, {os.cpu_count()} cores; Spark local[2]",
        "OS": platform.platform(),
        "Python / PySpark": f"{platform.python_version()} / {pyspark.__version__}",
        "moto / boto3": f"{moto.__version__} (ThreadedMotoServer in a child process, SQS hot spots patched: see below) / {boto3.__version__}",
        "pipe commit": f"{commit}; code hash {_code_hash()} (sha256 of runtime/, compiler/, pipe/ *.py)",
    }


def _f(x: float | None, nd: int = 1) -> str:
    return "" if x is None else f"{x:,.{nd}f}"


def render(args, env: dict, a_cases: list[Case], calib: list, b_sets: list[ObjectSet], b_cases: list[Case], info: dict) -> str:
    n = args.notifications
    out: list[str] = []
    w = out.append
    w("## S3 sources: SQS notifications and S3 objects against a moto server")
    w("")
    w("Generated by `python bench/s3_bench.py` — do not edit by hand; run the script again.")
    w("")
    w(f"- Date: {info['started']:%Y-%m-%d %H:%M} UTC; whole run {info['wall']:.0f} s; load average before {info['load_before'][0]:.2f}, after {info['load_after'][0]:.2f}; "
      f"other processes used {info['other_cpu']:.0f} CPU-s and the hypervisor stole {info['steal']:.0f} CPU-s during the run"
      + (" — **the machine was not idle: wall times are inflated**" if info["other_cpu"] + info["steal"] > 0.1 * info["wall"] else ""))
    for k, v in env.items():
        w(f"- {k}: {v}")
    if info["code_before"] != info["code_after"]:
        w(f"- **WARNING: pipe's code changed during the run** (hash {info['code_before']} at the start, {info['code_after']} at the end); the run used the code imported at the start.")
    w("- pipe runs in-process: `compile_project` + `Executor.run` (what `pipe run` does) on one SparkSession "
      "(`runtime.spark.session.get_spark('local[2]')`). A warm-up round of both parts (small) ran first: JVM start, class loading and the "
      "Python workers' imports are not counted. Every pipe case writes fresh tables; one repetition per case.")
    w("- CPU columns: seconds of CPU over the case — *moto*: the server process; *driver*: the bench's Python process (pipe's driver code, boto3 "
      "calls, py4j); *JVM+workers*: the Spark JVM and its Python workers (live processes, read from /proc).")
    w("")
    small = max(b_sets, key=lambda o: len(o.keys))
    put_s_per_object = small.put_s / len(small.keys)
    w(f"### A. Notifications → S3 metadata table ({n:,} notifications)")
    w("")
    w(f"Each case starts from a queue holding {n:,} notifications of distinct objects. They are sent with `send_message_batch` in the exact JSON "
      "moto produces for an S3 `ObjectCreated:Put` notification (a template taken from a real `put_object` into a notifying bucket, with each "
      f"object's key, size, eTag and time): putting {n:,} objects through moto would take about {n * put_s_per_object:.0f} s per case "
      f"(part B's `put_object`s with notifications ran at {1 / put_s_per_object:,.0f}/s). Part B uses real notifications.")
    w("")
    w("- *floor: receive + delete*: a boto3 loop that receives (5 or 10 per call) and deletes each batch at once with `delete_message_batch`.")
    w("- *floor: hold, then delete*: receives everything, then deletes 10 per `delete_message_batch` — the SQS calls pipe makes "
      "(pipe may delete only after the commit), without Spark. On moto, holding makes each receive dearer (moto scans every in-flight "
      "message on each receive), while deleting as it goes makes one delete call per receive (twice as many at 5 per receive).")
    w("- *pipe run*: `landing_events` (kind s3_events, `max_messages_per_batch` 5 — the default — or 10; long poll and visibility defaults: "
      "20 s, 30 s) → table `s3_meta` (key object_key + event_name, partitioned by bucket, precombine event_time, `index: partition`).")
    w(f"- *{NO_RENEWAL}*: the default case again with a visibility timeout that outlasts the run, so pipe's visibility keeper "
      "(which renews the held messages every half timeout) has nothing to do.")
    w("- pipe's split, timed in-process by wrapping pipe's functions: *receive* = `s3_events.receive` (the SQS receive loop, with the last, "
      "empty receive that waits up to 1 s, as the floors do), *parse* = the rest of `s3_events.pending` (JSON parsing of the bodies), "
      "*DataFrame* = `S3EventsPending.dataframe` (createDataFrame of the records in the driver), *commit* = `Table.write` of s3_meta "
      "(the Spark write and the Hudi commit), *delete* = `S3EventsPending._delete` (batched deletes after the commit), *other* = the rest of the "
      "table step (timeline, SQL, table open) — the source step (queue attributes) and compile are in the wall time only.")
    w("")
    w("| case | per receive | wall s | notifications/s | × floor (hold) | receive s | parse s | DataFrame s | commit s | delete s | other s | SQS calls | moto CPU s | driver CPU s | JVM+workers CPU s |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    holds = {c.per_call: c.wall for c in a_cases if c.label.startswith("floor: hold")}
    for c in a_cases:
        s = c.split
        calls = ", ".join(f"{k} {v:,}" for k, v in sorted(c.calls.items()))
        ratio = c.wall / holds[c.per_call] if c.per_call in holds else None
        w(f"| {'**' + c.label + '**' if not c.baseline else c.label} | {c.per_call} | {_f(c.wall)} | {_f(c.items / c.wall, 0)} | {_f(ratio, 2)} | "
          f"{_f(s.get('receive'))} | {_f(s.get('parse'), 2)} | {_f(s.get('dataframe'), 2)} | {_f(s.get('commit'))} | {_f(s.get('delete'))} | "
          f"{_f(s.get('other'), 2)} | {calls} | {_f(c.moto_cpu)} | {_f(c.driver_cpu)} | {_f(c.jvm_cpu)} |")
    w("")
    w(f"Checked after each case: the queue is empty (visible + in flight + delayed = 0); after each pipe case `s3_meta` holds {n:,} rows "
      "(read back with `Table.open(...).read().count()`).")
    w("")
    w("#### Stock moto")
    w("")
    w("moto's SQS (stock " + env["moto / boto3"].split(" ")[0] + ") does O(queue depth) work per call, several times over: for every received message it "
      "computes all queue attributes three times over (each time three full scans of the queue, reading the clock through `datetime` for "
      "every message); `delete_message_batch` "
      "scans the queue twice and copies it per entry. The child process therefore patches these hot spots for the measurements above "
      "(`install_fast_sqs` in the script: same results, one pass per call). The same calls against the same server with the patches off "
      f"(queue of {calib[0][1]:,} messages; in flight: none at first):")
    w("")
    w("| call | stock s/call | patched s/call |")
    w("|---|---:|---:|")
    stock = collections.defaultdict(list)
    patched = {}
    for name, _, s in calib:
        if name.endswith(", patched"):
            patched[name[:-len(", patched")]] = s
        else:
            stock[name].append(s)
    for name, ss in stock.items():
        w(f"| {name} | {_f(sum(ss) / len(ss), 3)} | {_f(patched.get(name), 3)} |")
    r10 = sum(stock["ReceiveMessage (10)"]) / len(stock["ReceiveMessage (10)"])
    r5 = sum(stock["ReceiveMessage (5)"]) / len(stock["ReceiveMessage (5)"])
    w("")
    w(f"pipe holds every received message in flight until its commit, so for pipe moto's queue stays at {calib[0][1]:,} messages for the whole "
      f"receive loop: on stock moto receiving {n:,} notifications would take about {n / 5 * r5 / 60:.0f} min at 5 per call and "
      f"{n / 10 * r10 / 60:.0f} min at 10 per call (receives alone, at the per-call cost above) — moto, not pipe, would be all there is to measure.")
    w("")
    w("### B. Objects end to end")
    w("")
    w("Objects are put with `put_object` into a bucket whose notification configuration sends `s3:ObjectCreated:*` to the case's own queue "
      "(real moto notifications; the puts are not timed), and the same bytes are written to local files. JSON lines of orders "
      "(order_id, customer_id, amount, status, region, updated_at; ~130 bytes a row).")
    w("")
    w("- *pipe run (s3_meta + orders)*: the project above plus `landing_orders` (kind s3_incremental over s3_meta, format json, declared schema; "
      "no s3a in this Spark, so the objects are read inside the executors with boto3) → table `orders` (key order_id). Wall time of the whole "
      "run: both source steps, s3_meta (receive, commit, delete), then orders (list the new objects from s3_meta, fetch + parse + check them, commit).")
    w("- *boto3 loop*: one Python process, one client: `get_object` + `json.loads` of each line, keys known in advance, nothing written — the floor "
      "of fetching the objects from this moto server serially.")
    w("- *Spark: read.json(local files) → Parquet*: the same bytes from local disk, no S3, no Hudi — what Spark needs for the rows alone.")
    w("- *pipe run, local files*: a `kind: files` source over the local copies into a table with the same key — pipe without S3 and SQS; the "
      "difference to *pipe run (s3_meta + orders)* is what the S3 path costs.")
    w("")
    w("| objects | case | wall s | objects/s | rows/s | MB/s | × Spark local | moto CPU s | driver CPU s | JVM+workers CPU s |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for objs in b_sets:
        cases = [c for c in b_cases if c.note == objs.label]
        spark_local = next(c.wall for c in cases if c.label.startswith("Spark"))
        what = f"{len(objs.keys):,} × {objs.bytes / len(objs.keys) / 1024:,.1f} KB ({objs.rows:,} rows, {objs.bytes / 2**20:,.1f} MB)"
        for c in cases:
            w(f"| {what} | {'**' + c.label + '**' if not c.baseline else c.label} | {_f(c.wall)} | {_f(c.items / c.wall, 0)} | {_f(c.rows / c.wall, 0)} | "
              f"{_f(objs.bytes / 2**20 / c.wall, 2)} | {_f(c.wall / spark_local, 2)} | {_f(c.moto_cpu)} | {_f(c.driver_cpu)} | {_f(c.jvm_cpu)} |")
    w("")
    w("Where pipe's time went (seconds, timed in-process as in part A; *fetch+check* = `s3_incremental.read_in_executors`: every object read "
      "with boto3 inside the executors into a cached DataFrame, parsed and checked for malformed records; *plan* = the incremental read of "
      "s3_meta for the new objects, collected to the driver):")
    w("")
    w("| objects | s3_meta step | receive | commit | delete | orders step | plan | fetch+check | commit | other | SQS calls | puts (untimed) s | local files: orders step | local files: commit |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for objs in b_sets:
        c = next(c for c in b_cases if c.note == objs.label and not c.baseline)
        f = next(c for c in b_cases if c.note == objs.label and c.label.startswith("pipe run, local")).split
        s = c.split
        calls = ", ".join(f"{k} {v:,}" for k, v in sorted(c.calls.items()))
        w(f"| {len(objs.keys):,} | {_f(s['table.s3_meta'])} | {_f(s['meta receive'])} | {_f(s['meta commit'])} | {_f(s['meta delete'], 2)} | "
          f"{_f(s['table.orders'])} | {_f(s['orders plan'])} | {_f(s['orders fetch+check'])} | {_f(s['orders commit'])} | {_f(s['orders other'], 2)} | "
          f"{calls} | {_f(objs.put_s)} | {_f(f['table.orders'])} | {_f(f['orders commit'])} |")
    w("")
    w("Checked after each case: `s3_meta` holds one row per object, `orders` every row, the queue is empty; the baselines count every row.")
    w("")
    w("### What it shows")
    w("")
    for para in conclusions(args, a_cases, calib, b_sets, b_cases):
        w(para)
        w("")
    return "\n".join(out)


def conclusions(args, a_cases: list[Case], calib, b_sets: list[ObjectSet], b_cases: list[Case]) -> list[str]:
    """The "what it shows" paragraphs, from the measurements (every figure and comparison is computed)."""
    n = args.notifications
    paras = []
    pipe = {c.per_call: c for c in a_cases if c.label == "pipe run"}
    long = next((c for c in a_cases if c.label == NO_RENEWAL), None)
    hold = {c.per_call: c for c in a_cases if c.label.startswith("floor: hold")}
    inter = {c.per_call: c for c in a_cases if c.label.startswith("floor: receive")}
    p5, p10 = pipe[5], pipe[10]

    def sqs_s(c):
        return c.split["receive"] + c.split["delete"]

    def spark_s(c):
        return c.split["dataframe"] + c.split["commit"]

    paras.append(
        f"**Notifications.** pipe took {n:,} notifications into the metadata table at {n / p5.wall:,.0f}/s with the default 5 per receive "
        f"and {n / p10.wall:,.0f}/s with 10 per receive. The SQS calls are most of the time: receive + delete {sqs_s(p5):.1f} s of {p5.wall:.1f} s "
        f"at 5 ({100 * sqs_s(p5) / p5.wall:.0f}%) and {sqs_s(p10):.1f} s of {p10.wall:.1f} s at 10 ({100 * sqs_s(p10) / p10.wall:.0f}%); the "
        f"Spark side (DataFrame + commit of {n:,} rows) {spark_s(p5):.1f} s and {spark_s(p10):.1f} s; parsing the bodies {p5.split['parse']:.2f} s "
        f"and {p10.split['parse']:.2f} s. 10 per receive halves the receive calls ({p5.calls.get('ReceiveMessage', 0):,} → "
        f"{p10.calls.get('ReceiveMessage', 0):,}; receive time {p5.split['receive']:.1f} s → {p10.split['receive']:.1f} s); the deletes are "
        f"{p5.calls.get('DeleteMessageBatch', 0):,} calls of 10 either way. The bare loops reach {n / hold[5].wall:,.0f}/s and "
        f"{n / hold[10].wall:,.0f}/s making pipe's SQS calls (hold, then delete), and {n / inter[5].wall:,.0f}/s and {n / inter[10].wall:,.0f}/s "
        f"deleting each batch as it comes: pipe takes {p5.wall / hold[5].wall:.2f}× and {p10.wall / hold[10].wall:.2f}× the time of the first.")

    vis = {k: c.calls.get("ChangeMessageVisibilityBatch", 0) for k, c in pipe.items()}
    if long is not None and not any(vis.values()):
        paras.append(f"**Visibility keeper.** The runs were shorter than 15 s, so pipe's visibility keeper renewed nothing "
                     f"({NO_RENEWAL}: {long.wall:.1f} s vs {p5.wall:.1f} s).")
    elif long is not None:
        def sweep(k):
            c, f = pipe[k], hold[k]
            return (f"{vis[k]:,} `ChangeMessageVisibilityBatch` calls at {k} per receive (receive {c.split['receive']:.1f} s vs the floor's "
                    f"{f.split['receive']:.1f} s, delete {c.split['delete']:.1f} s vs {f.split['delete']:.1f} s)")

        text = ("**Where the rest goes: the visibility keeper.** pipe's `_VisibilityKeeper` (runtime/sources/s3_events.py) renews *every* "
                "message the run holds once per half visibility timeout (every 15 s by default), 10 per `ChangeMessageVisibilityBatch`, one call "
                f"after the other from its own thread: {n // 10:,} calls per sweep for {n:,} held messages, including messages received a moment "
                "before. The sweep works on a snapshot, so once started it also renews messages the run has meanwhile released for deletion. "
                "Here: " + "; ".join(sweep(k) for k in (5, 10)) + ". ")
        for k in (5, 10):
            if not vis[k]:
                c = pipe[k]
                t_del = sum(c.split[x] for x in ("receive", "parse", "dataframe", "commit", "other"))
                text += (f"At {k} per receive no sweep fell inside the run: its deletes, which first release every held message, began "
                         f"{t_del:.1f} s after the keeper started" + (", before its first sweep at 15 s" if t_del < 15 else "")
                         + " — whether a run pays for a sweep depends on whether it still holds messages 15 s after it started receiving. ")
        text += (f"With `visibility_timeout_s: 600` (nothing to renew within the run) the default case made "
                 f"{long.calls.get('ChangeMessageVisibilityBatch', 0):,} renewal calls, received in {long.split['receive']:.1f} s instead of "
                 f"{p5.split['receive']:.1f} s and took {long.wall:.1f} s instead of {p5.wall:.1f} s ({n / long.wall:,.0f}/s, "
                 f"{long.wall / hold[5].wall:.2f}× the floor; the commit itself varied between {min(c.split['commit'] for c in (p5, p10, long)):.1f} "
                 f"and {max(c.split['commit'] for c in (p5, p10, long)):.1f} s over the three pipe runs).")
        paras.append(text)

    def per_call_ms(c):
        calls = sum(c.calls.values())
        return 1000 * (c.split["receive"] + c.split["delete"] - 1.0) / max(1, calls)  # minus the 1 s drain wait

    pcs = [per_call_ms(c) for c in a_cases if c.baseline]
    busy = [c.moto_cpu / c.wall for c in a_cases]
    serial = [(c.moto_cpu + c.driver_cpu) / max(0.01, c.wall - 1.0) for c in a_cases if c.baseline]
    r10 = next(s for name, _, s in calib if name == "ReceiveMessage (10)")
    r10p = next(s for name, _, s in calib if name == "ReceiveMessage (10), patched")
    paras.append(
        f"**Is moto the bottleneck?** For the queue, yes: the floors measure moto and botocore, not SQS. One call took {min(pcs):.1f}–{max(pcs):.1f} ms "
        f"in the floors (one call at a time, each a new HTTP connection to moto's threaded WSGI server), and moto's CPU plus the client's add up "
        f"to {min(serial) * 100:.0f}–{max(serial) * 100:.0f}% of the floors' wall time (without the 1 s drain wait): each call is CPU work on both "
        f"sides in turn. moto's process was busy {min(busy) * 100:.0f}–{max(busy) * 100:.0f}% of the wall time in part A (its ceiling is one core: "
        f"one GIL). That is moto with its SQS hot spots patched; stock moto spends {r10:.1f} s on one receive of 10 at {calib[0][1]:,} queued "
        f"messages ({r10 / r10p:,.0f}× the patched server), so a stock-moto run of {n:,} notifications would take hours and show nothing of pipe. "
        f"What carries over to real SQS (a network round trip per call, no per-message server CPU) are the call counts and the ratios to the "
        f"floor, not the rates.")

    parts = []
    for objs in b_sets:
        cs = [c for c in b_cases if c.note == objs.label]
        p = next(c for c in cs if not c.baseline)
        b3 = next(c for c in cs if c.label.startswith("boto3"))
        sl = next(c for c in cs if c.label.startswith("Spark"))
        pf = next(c for c in cs if c.label.startswith("pipe run, local"))
        s = p.split
        text = (f"*{len(objs.keys):,} objects of {objs.bytes / len(objs.keys) / 1024:,.0f} KB*: pipe {len(objs.keys) / p.wall:,.1f} objects/s, "
                f"{objs.rows / p.wall:,.0f} rows/s end to end ({p.wall:.1f} s: s3_meta step {s['table.s3_meta']:.1f} s, orders step "
                f"{s['table.orders']:.1f} s, of which fetch+check {s['orders fetch+check']:.1f} s and commit {s['orders commit']:.1f} s). "
                f"The serial boto3 loop fetches and parses the same objects in {b3.wall:.1f} s, Spark reads the local copies into Parquet in "
                f"{sl.wall:.1f} s, pipe's own pipeline from the local copies takes {pf.wall:.1f} s (commit {pf.split['orders commit']:.1f} s); "
                f"the S3 path costs {p.wall - pf.wall:+.1f} s over it.")
        fetch_rate, loop_rate = len(objs.keys) / s["orders fetch+check"], len(objs.keys) / b3.wall
        if fetch_rate < 1.3 * loop_rate:
            text += (f" The executors' fetch+check ({fetch_rate:,.0f} objects/s) is no faster than the one-process loop ({loop_rate:,.0f} objects/s)")
            if p.moto_cpu > 0.5 * s["orders fetch+check"]:
                text += (f": moto (one process; {p.moto_cpu:.1f} CPU-s over this run) and the two Python workers share the 2 cores, and every "
                         f"GET costs CPU on both sides, so the per-object cost is CPU, not parallelism.")
            else:
                text += (f"; moto is not the limit here ({p.moto_cpu:.1f} CPU-s over the run): fetch+check also splits, caches and parses "
                         f"every line in Spark (the check pass), which costs more than the GETs.")
        if s["orders commit"] > 1.2 * pf.split["orders commit"]:
            text += (f" The commit of the same rows takes {s['orders commit'] / pf.split['orders commit']:.1f}× as long from S3 as from local "
                     f"files ({s['orders commit']:.1f} s vs {pf.split['orders commit']:.1f} s); its input is a `from_json` projection over the "
                     f"cached object lines instead of a file scan.")
        parts.append(text)
    paras.append("**Objects end to end.** " + " ".join(parts))
    return paras


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,000 notifications, 200 small + 10 big objects; print only (no RESULTS.md)")
    ap.add_argument("--notifications", type=int, default=None)
    ap.add_argument("--small-objects", type=int, default=None)
    ap.add_argument("--big-objects", type=int, default=None)
    ap.add_argument("--write", action="store_true", help="with --quick: write the RESULTS.md section anyway")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (projects, tables, local copies)")
    ap.add_argument("--save", default=str(Path(tempfile.gettempdir()) / "pipe-s3-bench.json"),
                    help="where the raw measurements go (JSON; default %(default)s)")
    ap.add_argument("--render", metavar="JSON", help="render the report from saved measurements instead of measuring")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    if args.render:
        render_saved(Path(args.render), args.write)
        return
    args.notifications = args.notifications or (1_000 if args.quick else 10_000)
    args.small_objects = args.small_objects or (200 if args.quick else 2_000)
    args.big_objects = args.big_objects or (10 if args.quick else 50)
    small_rows, big_bytes = 20, 2 * 1024 * 1024
    big_rows = big_bytes // len(order_lines(0, 100, 10**6) ) * 100  # rows of ~2 MB

    info = {"started": dt.datetime.now(dt.timezone.utc), "load_before": os.getloadavg(), "code_before": _code_hash()}
    cpu0 = _machine_cpu()
    t_start = time.perf_counter()
    env = _machine()
    work = Path(tempfile.mkdtemp(prefix="pipe-s3-bench-"))
    moto = Moto(work / "moto.log")
    spark = None
    a_cases: list[Case] = []
    b_cases: list[Case] = []
    b_sets: list[ObjectSet] = []
    try:
        s3, sqs = clients(moto.url)
        template = event_template(s3, sqs)
        from runtime.spark.session import get_spark

        print(f"moto at {moto.url}; starting Spark", flush=True)
        spark = get_spark("local[2]", {}, app_name="pipe-s3-bench")

        # warm-up: both parts, small, nothing recorded
        wq, _ = make_queue(sqs, "warmup")
        run_pipe_a(moto, spark, sqs, wq, template, 200, 5, work, "warmup")
        w_objs = put_objects(s3, sqs, "warmup", "warmup", 20, small_rows, work / "local")
        run_pipe_b(moto, spark, sqs, w_objs, work)
        run_pipe_files_b(moto, spark, w_objs, work)
        run_spark_local_b(moto, spark, w_objs, work)
        print(f"warm-up done ({time.perf_counter() - t_start:.0f} s)", flush=True)

        # A: one queue, refilled before each case
        qa, _ = make_queue(sqs, "events-a")
        for per in (5, 10):
            for case in (lambda: run_floor(moto, sqs, qa, template, args.notifications, per, hold=False),
                         lambda: run_floor(moto, sqs, qa, template, args.notifications, per, hold=True),
                         lambda: run_pipe_a(moto, spark, sqs, qa, template, args.notifications, per, work, f"p{per}")):
                c = case()
                a_cases.append(c)
                print(f"A {c.label} {per}/call: {c.wall:.1f} s, {c.items / c.wall:,.0f}/s {c.split} {c.calls}", flush=True)
        # the default again, with a visibility timeout long enough that the keeper renews nothing during the run
        c = run_pipe_a(moto, spark, sqs, qa, template, args.notifications, 5, work, "p5-long", label=NO_RENEWAL, visibility_timeout_s=600)
        a_cases.append(c)
        print(f"A {c.label} 5/call: {c.wall:.1f} s, {c.items / c.wall:,.0f}/s {c.split} {c.calls}", flush=True)

        calib = stock_calibration(moto, sqs, template, args.notifications)
        print("stock moto:", calib, flush=True)

        # B
        for label, bucket, n, rows in (("small", "landing-small", args.small_objects, small_rows), ("big", "landing-big", args.big_objects, big_rows)):
            objs = put_objects(s3, sqs, label, bucket, n, rows, work / "local")
            b_sets.append(objs)
            print(f"B {label}: put {n} objects ({objs.bytes / 2**20:.1f} MB, {objs.rows:,} rows) in {objs.put_s:.1f} s", flush=True)
            for fn in (lambda: run_pipe_b(moto, spark, sqs, objs, work), lambda: run_boto3_b(moto, s3, objs),
                       lambda: run_spark_local_b(moto, spark, objs, work), lambda: run_pipe_files_b(moto, spark, objs, work)):
                c = fn()
                c.note = label
                b_cases.append(c)
                print(f"B {label} {c.label}: {c.wall:.1f} s, {c.items / c.wall:,.0f} objects/s, {c.rows / c.wall:,.0f} rows/s", flush=True)
        cpu1 = _machine_cpu()
        info["other_cpu"] = max(0.0, (cpu1[0] - cpu0[0]) - (cpu1[2] - cpu0[2]))
        info["steal"] = cpu1[1] - cpu0[1]
    finally:
        if spark is not None:
            spark.stop()
        moto.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work folder kept: {work}")

    info.update(wall=time.perf_counter() - t_start, load_after=os.getloadavg(), code_after=_code_hash())
    saved = {"args": vars(args), "env": env, "info": {**info, "started": info["started"].isoformat()}, "calib": calib,
             "a": [asdict(c) for c in a_cases], "b": [asdict(c) for c in b_cases],
             "b_sets": [{**asdict(o), "local_dir": str(o.local_dir)} for o in b_sets]}
    Path(args.save).write_text(json.dumps(saved, indent=1))
    print(f"measurements saved to {args.save}")
    render_saved(Path(args.save), args.write)


def render_saved(path: Path, write: bool) -> None:
    d = json.loads(path.read_text())
    args = argparse.Namespace(**d["args"])
    info = {**d["info"], "started": dt.datetime.fromisoformat(d["info"]["started"])}
    b_sets = [ObjectSet(**{**o, "local_dir": Path(o["local_dir"])}) for o in d["b_sets"]]
    body = render(args, d["env"], [Case(**c) for c in d["a"]], [tuple(x) for x in d["calib"]], b_sets, [Case(**c) for c in d["b"]], info)
    print(body)
    if not args.quick or write:
        from report import write_section

        write_section("s3", body)


if __name__ == "__main__":
    main()
