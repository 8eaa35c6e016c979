"""pipe on a real Spark standalone cluster: a Master and two Workers of 1 core (the session
fixture `spark_cluster`), whose nodes' Python is a venv holding only pyspark[sql]. One project
holds the three pipelines a cluster must run: the example project of `pipe init`, a
merge-on-read table with deletes and compaction, and an `s3_events` -> `s3_incremental`
pipeline on the moto server. Each `pipe run` on the cluster is a subprocess with its own Spark
driver (client mode), as users run it; the same project runs on local[2] (the tests' own
session) beside it, and every table of both is read back with hudi-rs and compared."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import gzip
import json
import os
import re
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.cluster import env as cluster_env
from tests.test_example_project import NEW_ORDERS, _pipe, _results
from tests.test_s3_events import S3Env

pytestmark = pytest.mark.cluster

SHOP_TABLES = ("orders", "customers", "customer_revenue")
TABLES = (*SHOP_TABLES, "readings", "landed", "returns", "paid", "site_readings")
# what differs between two writers of the same rows: when and into which file they were written
_RUN_COLUMNS = {"_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_file_name"}
# what differs between two buckets and queues receiving the same objects
_EVENT_COLUMNS = {"bucket", "_hoodie_partition_path", "etag", "sequencer", "message_id", "event_time", "version_id"}

SITES = ("Zürich West", "lyon/part-dieu", "new york")
EPOCH_MS = 1_732_000_000_000  # 2024-11-19, as epoch millis


def _reading(device: int, seq: int, version: int, op: str = "U") -> dict:
    ts = EPOCH_MS + seq * 1000 + version
    return {"device": f"sensor-{device:03d}", "seq": seq, "site": SITES[device % len(SITES)], "ts": ts,
            "value": str(Decimal(device * 1000 + seq) / 1000 + version), "seen_at": dt.datetime.fromtimestamp(ts / 1000, dt.timezone.utc).isoformat(),
            "op": op}


def _readings(round_: int) -> list[dict]:
    """Round 1: 3,000 readings of 60 devices. Round 2: 600 newer versions, 150 deletes, 40 stale
    versions (older ts: ignored) and 200 new readings."""
    if round_ == 1:
        return [_reading(d, s, 0) for d in range(60) for s in range(50)]
    rows = [_reading(d, s, 7) for d in range(0, 60, 2) for s in range(0, 40, 2)]
    rows += [_reading(d, s, 9, op="D") for d in range(1, 60, 4) for s in range(1, 21, 2)]
    rows += [{**_reading(d, 45, 0), "ts": EPOCH_MS - 5, "value": "-1.000"} for d in range(40)]
    rows += [_reading(d, s, 0) for d in range(60, 70) for s in range(20)]
    return rows


def _landed(first: int, count: int, version: int) -> list[dict]:
    return [{"order_id": 9_000_000_000 + i, "amount": f"{(i * 37 % 10_000) / 100 + version:.2f}",
             "placed_at": f"2024-11-{20 + version:02d}T{i % 24:02d}:{i % 60:02d}:00Z", "note": f"ü-{i}, \"quoted\""}
            for i in range(first, first + count)]


_EXTRA_FILES = {
    "sources/cluster.yml": """
sources:
  raw_returns:
    kind: files
    path: data/returns
    format: json
    schema: "order_id BIGINT, reason STRING, returned_at TIMESTAMP"
  raw_readings:
    kind: files
    path: data/readings
    format: json
    schema: "device STRING, seq INT, site STRING, ts BIGINT, value DECIMAL(12,3), seen_at TIMESTAMP, op STRING"
  landing_events:
    kind: s3_events
    queue_url: "{queue}"
    endpoint_url: "{endpoint}"
    region: us-east-1
    long_poll_wait_s: 0
  landing_orders:
    kind: s3_incremental
    metadata_table: s3_meta
    buckets: ["{bucket}"]
    format: json
    key_prefix: orders/
    endpoint_url: "{endpoint}"
    region: us-east-1
    schema: "order_id BIGINT, amount DECIMAL(10,2), placed_at TIMESTAMP, note STRING"
  payments_topic:
    kind: kafka
    bootstrap_servers: "{bootstrap}"
    topic: "{topic}"
    format: json
    schema: "merchant STRING, txn_ref STRING, updated_ms BIGINT, amount DECIMAL(12,2), note STRING, day DATE"
""",
    "tables/cluster.yml": """
tables:
  readings:
    type: merge_on_read
    key: [device, seq]
    precombine: ts
    partition_by: [site]
    delete_when: "op = 'D'"
    small_file_limit: 0           # updates go to log files, which the compaction folds in
    compaction:
      max_delta_commits: 2
  s3_meta:
    key: [object_key, event_name]
    partition_by: [bucket]
    precombine: event_time
    index: partition
  landed:
    key: [order_id]
    precombine: placed_at
  returns:
    key: [order_id]
    precombine: returned_at
  site_readings:
    key: [site]
    operation: insert_overwrite_table
  paid:
    key: [merchant, txn_ref]
    precombine: updated_ms
    partition_by: [day]
""",
    # a Python model whose UDF runs on the executors, which have no copy of the project
    "tables/site_readings.py": """
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from pipe.model import ref


def _slug(site):
    return None if site is None else "-".join(site.lower().replace("/", " ").split())


slug = F.udf(_slug, StringType())


def model(readings=ref("readings")):
    by_site = readings.groupBy("site").agg(F.count("*").alias("readings"), F.max("ts").alias("last_ts"))
    return by_site.withColumn("slug", slug(F.col("site")))
""",
    "tables/returns.sql": "select * from {{ source('raw_returns') }}\n",
    "tables/readings.sql": "select device, seq, site, ts, value, seen_at, op from {{ source('raw_readings') }}\n",
    "tables/s3_meta.sql": "select * from {{ source('landing_events') }}\n",
    "tables/landed.sql": "select * from {{ source('landing_orders') }}\n",
    "tables/paid.sql": "select merchant, txn_ref, updated_ms, amount, note, day from {{ source('payments_topic') }}\n",
}


def _targets(cluster, home: Path, packed: dict[str, str]) -> str:
    """`local2`; `cluster` (the pack-env settings: one for the archive, one for its Python);
    `bare` (the nodes' own Python); `unshared` (`cluster` without naming the shared folder)."""
    common = {"spark.executor.memory": "1g", "spark.cores.max": "2", "spark.driver.host": "127.0.0.1",
              "spark.sql.shuffle.partitions": "4",
              # a standalone cluster's executors get their AWS credentials from the target
              **{f"spark.executorEnv.{k}": os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}}

    def target(name: str, conf: dict, shared: bool = True) -> list[str]:
        lines = [f"  {name}:", *([f'    shared_paths: ["{home}"]'] if shared else []), "    spark:",
                 f'      master: "{cluster.master_url}"', "      conf:"]
        return lines + [f'        {k}: "{v}"' for k, v in {**common, **conf}.items()]

    lines = ["targets:", "  local2:", "    spark:", '      master: "local[2]"', "      conf:", '        spark.sql.shuffle.partitions: "4"']
    lines += target("cluster", packed)
    lines += target("bare", {"spark.pyspark.python": str(cluster_env.PYSPARK_ONLY.python)})
    lines += target("unshared", packed, shared=False)
    return "\n".join(lines) + "\n"


def _project(home: Path, s3: S3Env, cluster, packed: dict[str, str], kafka, topic: str) -> Path:
    """The example project of `pipe init` with the readings and S3 pipelines added."""
    home.mkdir(parents=True, exist_ok=True)
    _pipe(home, "init", "shop")
    project = home / "shop"
    config = project / "pipe_project.yml"
    text = config.read_text()
    assert "\ntargets:\n" in text
    config.write_text(text.replace("\ntargets:\n", "\n" + _targets(cluster, home, packed), 1))
    for name, text in _EXTRA_FILES.items():
        (project / name).write_text(text.replace("{queue}", s3.queue).replace("{endpoint}", s3.endpoint).replace("{bucket}", s3.bucket)
                                    .replace("{bootstrap}", kafka.bootstrap).replace("{topic}", topic))
    (project / "data/readings").mkdir()
    (project / "data/returns").mkdir()
    return project


def _input(project: Path, s3: S3Env, round_: int, kafka=None, topic: str = "") -> None:
    """The new input of a round: files for the shop and the readings, objects in the bucket,
    payments in the topic (900 a round over its 3 partitions, 300 of them updates)."""
    from tests.test_kafka import payment, send

    if kafka is not None:
        send(kafka, topic, [payment(i, round_) for i in range((round_ - 1) * 600, (round_ - 1) * 600 + 900)])
    lines = "".join(json.dumps(r) + "\n" for r in _readings(round_))
    (project / f"data/readings/readings-{round_}.json").write_text(lines)
    returns = [{"order_id": 7_000 + i, "reason": ["damaged", "late", "wrong size, \"XL\""][i % 3],
                "returned_at": f"2024-11-2{round_}T{i % 24:02d}:00:00Z"} for i in range(300 * round_)]
    (project / f"data/returns/returns-{round_}.json").write_text("".join(json.dumps(r) + "\n" for r in returns))
    if round_ == 2:  # a file cut short among the new returns: the step fails, its table stays as it was
        (project / "data/returns/returns-3.json.gz").write_bytes(gzip.compress(b'{"order_id": 9}\n')[:12])
    if round_ == 1:
        s3.put("orders/o-1.json", _landed(0, 700, 0))
        s3.put("orders/o 2+x.json", _landed(700, 300, 0))
        s3.put("other/ignored.json", _landed(0, 5, 0))
    else:
        (project / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
        s3.put("orders/o-3.json", _landed(800, 400, 1))  # 200 newer versions, 200 new orders


def _run_local(project: Path, round_: int) -> dict:
    """`pipe run --target local2` in this process, on the tests' own local[2] session."""
    from pipe.cli import main

    code = main(["run", "--target", "local2", "--project-dir", str(project)])
    assert code == (0 if round_ == 1 else 1), _results(project)  # round 2 has the damaged file
    return _results(project)


def _hudi_table(uri: Path, leave_out: set[str] = frozenset()) -> set[tuple]:
    """Every row of a table as hudi-rs reads it, without the columns that say when it was written."""
    from hudi import HudiTableBuilder

    rows: set[tuple] = set()
    for batch in HudiTableBuilder.from_base_uri(str(uri)).build().read():
        d = batch.to_pydict()
        cols = sorted(c for c in d if c not in _RUN_COLUMNS | leave_out)
        rows |= set(zip(*[d[c] for c in cols]))
    return rows


def _instants(table: Path) -> list[str]:
    """The completed instants' actions, in timeline order."""
    done = sorted(p.name for p in (table / ".hoodie").iterdir() if p.is_file() and re.fullmatch(r"\d{17}\.(commit|deltacommit|replacecommit)", p.name))
    return [name.split(".", 1)[1] for name in done]


@pytest.fixture(scope="module")
def shop(spark, spark_cluster, moto_server, kafka, tmp_path_factory):
    """The project refused twice on the cluster (a local lake not named shared; the nodes' own
    Python), then packed with `pipe pack-env` and run two rounds on the cluster while it runs two
    rounds on local[2] here (the second with a damaged file among the new input)."""
    home = tmp_path_factory.mktemp("cluster-shop")
    os.environ["PIPE_CACHE_DIR"] = str(cluster_env.HOME / "pipe-cache")  # the packed environment, built once
    packed_out = _pipe(home, "pack-env")
    packed = dict(re.findall(r'^  (spark\.[\w.]+): "(.+)"$', packed_out.stdout, re.M))
    s3_cluster, s3_local = S3Env(moto_server, "cluster-shop"), S3Env(moto_server, "local-shop")
    kafka.create_topic("cluster.payments", partitions=3)
    kafka.create_topic("local.payments", partitions=3)
    on_cluster = _project(home / "cluster", s3_cluster, spark_cluster, packed, kafka, "cluster.payments")
    on_local = _project(home / "local", s3_local, spark_cluster, packed, kafka, "local.payments")
    out = dict(cluster=on_cluster, local=on_local, packed=packed, packed_out=packed_out, s3=s3_cluster)

    _input(on_cluster, s3_cluster, 1, kafka, "cluster.payments")
    out["unshared"] = _pipe(on_cluster, "run", "--target", "unshared", check=False)
    out["bare"] = _pipe(on_cluster, "run", "--target", "bare", check=False)
    out["bare_results"] = _results(on_cluster)
    out["lake_after_refusals"] = sorted(p.name for p in (on_cluster / "lake").iterdir()) if (on_cluster / "lake").exists() else []

    out["cluster_runs"], out["local_results"] = [], []
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for round_ in (1, 2):
            if round_ == 2:
                _input(on_cluster, s3_cluster, 2, kafka, "cluster.payments")
            _input(on_local, s3_local, round_, kafka, "local.payments")
            on_the_cluster = pool.submit(_pipe, on_cluster, "run", "--target", "cluster", check=False)
            out["local_results"].append(_run_local(on_local, round_))  # beside the cluster's run: less waiting
            out["cluster_runs"].append(on_the_cluster.result())
            out.setdefault("cluster_results", []).append(_results(on_cluster))
            if round_ == 1:
                out["returns_after_round_1"] = _hudi_table(on_cluster / "lake/returns")
    out["instants"] = {t: _instants(on_cluster / "lake" / t) for t in TABLES}
    return out


def test_the_nodes_python_has_neither_pipe_nor_its_task_packages(spark_cluster):
    """The premise of every test here: whatever of pipe (and fastavro, boto3) runs on the
    executors, pipe shipped."""
    for module, missing in (("runtime", "No module named 'runtime'"), ("fastavro", "No module named 'fastavro'"),
                            ("boto3", "No module named 'boto3'")):
        done = subprocess.run([str(cluster_env.PYSPARK_ONLY.python), "-c", f"import {module}"], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd="/")
        assert done.returncode != 0 and missing in done.stderr, module


def test_a_local_lake_not_named_shared_is_refused_before_spark_starts(shop):
    proc = shop["unshared"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lake = shop["cluster"] / "lake"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error in")]
    master = re.search(r"master (spark://127\.0\.0\.1:\d+) ", proc.stderr)
    assert master, proc.stderr
    assert errors[0].endswith(f"the lake of target unshared {lake} is a folder on this machine, but master {master.group(1)} "
                              "runs the executors on other machines, which cannot reach it"), errors
    assert f"shared_paths: [{shop['cluster']}]" in proc.stderr  # the hint names the project folder
    assert "executors' Python" not in proc.stderr  # refused before Spark started
    assert shop["lake_after_refusals"] == []


def test_executors_without_pipes_packages_are_refused_before_anything_is_written(shop):
    proc = shop["bare"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error in")]
    where = f"{cluster_env.PYSPARK_ONLY.python} (Python 3.{os.sys.version_info[1]}.{os.sys.version_info[2]} on {os.uname().nodename})"
    assert len(errors) == 1 and errors[0].startswith(
        "error in table.customers, table.orders, table.paid, table.readings, table.regions, table.returns, table.s3_meta: the executors' Python cannot "
        f"run pipe's tasks: {where} lacks fastavro, boto3, confluent-kafka (pipe's tasks need fastavro>=1.9, boto3>=1.34, "
        "confluent-kafka>=2.6)"), proc.stderr
    # pyspark[sql] brought the newest pandas, which pipe does not support yet: said in the same line
    assert re.search(rf"; {re.escape(where)} has pandas 3\.[\d.]+ \(pipe needs pandas>=2\.0,<3\)$", errors[0]), errors[0]
    assert "hint: give the executors a Python that has them" in proc.stderr and "spark.archives" in proc.stderr
    assert shop["lake_after_refusals"] == []
    assert {s: r["state"] for s, r in shop["bare_results"].items() if s.startswith("table.")}["table.customer_revenue"] == "skipped"
    # the fix is the one setting the hint names: `pipe pack-env` prints it
    assert shop["packed"]["spark.pyspark.python"] == "./pipe_env/bin/python"
    assert shop["packed"]["spark.archives"].endswith(".tar.gz#pipe_env")
    # with the bytecode pip compiled: a worker that may not write it does not compile pandas again
    import tarfile

    with tarfile.open(shop["packed"]["spark.archives"].split("#")[0]) as archive:
        names = set(archive.getnames())
    assert any(n.startswith("lib/python3.") and "/site-packages/pandas/__pycache__/__init__.cpython-" in n for n in names)


def test_every_pipeline_on_the_cluster_equals_it_on_local(shop):
    assert [proc.returncode for proc in shop["cluster_runs"]] == [0, 1]  # round 2 has the damaged file
    for proc in shop["cluster_runs"]:
        text = proc.stdout + proc.stderr
        assert "Traceback" not in text, proc.stderr
        # the tasks ran in the packed environment's Python, with pipe's code shipped
        assert "executors' Python: ./pipe_env/bin/python (Python 3." in proc.stderr, proc.stderr
        assert "on 1 host; pipe's code shipped as pipe-" in proc.stderr
    for on_cluster, on_local in zip(shop["cluster_results"], shop["local_results"]):
        assert {s: r["state"] for s, r in on_cluster.items()} == {s: r["state"] for s, r in on_local.items()}
    assert set(r["state"] for r in shop["cluster_results"][0].values()) == {"success"}
    assert {s: r["state"] for s, r in shop["cluster_results"][1].items() if r["state"] not in ("success", "no_input")} == {"table.returns": "error"}
    assert shop["cluster_results"][1]["table.customers"]["state"] == "no_input"  # no new customers in round 2
    for on_cluster, on_local in zip(shop["cluster_results"], shop["local_results"]):
        for step in on_cluster:
            if step.startswith("table."):
                assert [on_cluster[step].get(k) for k in ("rows_read", "inserts", "updates", "deletes")] == \
                       [on_local[step].get(k) for k in ("rows_read", "inserts", "updates", "deletes")], step
    second = shop["cluster_results"][1]
    assert (second["table.orders"]["inserts"], second["table.orders"]["updates"], second["table.orders"]["deletes"]) == (1, 1, 2)
    assert second["table.landed"]["rows_read"] == 400
    for table in TABLES:
        on_cluster = _hudi_table(shop["cluster"] / "lake" / table)
        on_local = _hudi_table(shop["local"] / "lake" / table)
        assert on_cluster and on_cluster == on_local, table
        assert shop["instants"][table] == _instants(shop["local"] / "lake" / table), table
    meta = _hudi_table(shop["cluster"] / "lake/s3_meta", _EVENT_COLUMNS)
    assert meta == _hudi_table(shop["local"] / "lake/s3_meta", _EVENT_COLUMNS) and len(meta) == 4


def test_the_merge_on_read_table_deleted_and_compacted_on_the_cluster(shop):
    # two deltacommits, then the compaction they made due (a commit), all run by the executors
    assert shop["instants"]["readings"] == ["deltacommit", "deltacommit", "commit"]
    rows = {(r[0], r[3]): r for r in _hudi_table(shop["cluster"] / "lake/readings", {"_hoodie_record_key", "_hoodie_partition_path"})}
    expected = {}
    for round_ in (1, 2):
        for r in _readings(round_):
            key = (r["device"], r["seq"])
            if key in expected and expected[key]["ts"] > r["ts"]:
                continue  # a stale version
            expected[key] = r
    kept = {k: r for k, r in expected.items() if r["op"] != "D"}
    assert len(expected) - len(kept) == 150 and len(kept) == 3_050
    assert set(rows) == set(kept)
    by_name = dict(zip(sorted(["device", "seq", "site", "ts", "value", "seen_at", "op"]), rows[("sensor-000", 0)]))  # columns by name
    assert by_name["ts"] == EPOCH_MS + 7 and by_name["value"] == Decimal("7.000") and by_name["site"] == "Zürich West"


def test_the_kafka_source_was_read_on_the_executors_round_after_round(shop):
    """The packed environment's Python (confluent-kafka in it) read the topic's partitions on the
    cluster's executors: the table holds the latest version of each of the 1,500 payments."""
    from tests.test_kafka import as_row, payment

    expected = {}
    for round_ in (1, 2):
        for i in range((round_ - 1) * 600, (round_ - 1) * 600 + 900):
            p = payment(i, round_)
            expected[(p["merchant"], p["txn_ref"])] = as_row(p)
    paid = _hudi_table(shop["cluster"] / "lake/paid", {"_hoodie_record_key", "_hoodie_partition_path"})
    # _hudi_table's columns are in name order: amount, day, merchant, note, txn_ref, updated_ms
    by_name = {(m, t, u, a, n, d): (a, d, m, n, t, u) for m, t, u, a, n, d in expected.values()}
    assert len(paid) == 1_500 and paid == set(by_name.values())
    assert [r["table.paid"]["rows_read"] for r in shop["cluster_results"]] == [900, 900]


def test_the_s3_pipeline_read_each_object_once_on_the_executors(shop):
    landed = _hudi_table(shop["cluster"] / "lake/landed", {"_hoodie_record_key", "_hoodie_partition_path"})
    assert len(landed) == 1_200  # 1,000 orders, then 200 newer versions and 200 new ones
    assert shop["s3"].waiting() == 0  # every message deleted once its commit completed


def test_a_damaged_file_read_on_an_executor_is_one_line_naming_table_and_file(shop):
    proc = shop["cluster_runs"][1]
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "\tat org.apache." not in text and "Lost task" not in text, text
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error in")]
    assert errors == ["error in table.returns: source raw_returns: cannot read the json files "
                      "(data/returns/returns-3.json.gz: EOFError: Compressed file ended before the end-of-stream marker was reached)"], proc.stderr
    assert "tables/returns.sql" not in text  # not the SQL's fault
    # nothing written: the commit and rows of round 1, on the cluster as on local[2]
    returns = shop["cluster"] / "lake/returns"
    assert shop["instants"]["returns"] == ["commit"]
    assert _hudi_table(returns) == shop["returns_after_round_1"] and len(shop["returns_after_round_1"]) == 300
