"""pipe over Spark Connect, against one real Connect server for the module: the example
project's own `pipe server` (started with `pipe server start`, as a user would). Its project uses
it as pipe's own server (fixed sessions, no code shipped); the other projects here reach the same
server through SPARK_REMOTE, as a remote Connect server (sessions cloned per step, pipe's code
shipped as an artifact, the server's Python probed).

Every `pipe` runs in a subprocess: a process is a Spark Connect client or a classic driver, not
both, and this one holds the tests' classic session. What a run wrote is read back with hudi-rs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import REPO, write_project
from tests.test_run import hudi_rows, run_results, steps, write_jsonl

pytestmark = pytest.mark.spark


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(PIPE_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), COLUMNS="200", **extra)
    return env


SECRET = "sekrit-Tq2/9+xY=ä"


def _as_remote(cache: Path, url: str) -> dict[str, str]:
    """The environment of a command that reaches the module's server as a remote Connect
    server: its URL, and its token (which pipe's own commands take from the state file)."""
    state = json.loads(next((cache / "servers").glob("*.json")).read_text())
    return {"SPARK_REMOTE": url, "SPARK_CONNECT_AUTHENTICATE_TOKEN": state["token"]}


def pipe(root: Path, cache: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipe", "--project-dir", str(root), *args], capture_output=True,
                          text=True, env=_env(cache, **env), timeout=timeout)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The example project, with its pipe server started: (project folder, cache folder, URL)."""
    base = tmp_path_factory.mktemp("connect")
    cache = base / "cache"
    ok(subprocess.run([sys.executable, "-m", "pipe", "init", "shop"], cwd=base, capture_output=True, text=True,
                      env=_env(cache)))
    root = base / "shop"
    # the documented place for s3a keys: the target's Spark settings (C.16: on no command line)
    project_file = root / "pipe_project.yml"
    project_file.write_text(project_file.read_text().replace('master: "local[*]"\n', f'master: "local[*]"\n      conf:\n        '
                                                             f'spark.hadoop.fs.s3a.secret.key: "{SECRET}"\n', 1))
    # start and warm-up: about 2 min on an idle machine, over 4 when the other workers start their JVMs too
    started = ok(pipe(root, cache, "server", "start", timeout=600))
    assert "Started the pipe server of target dev at sc://localhost:" in started.stdout and ", warmed up in " in started.stdout
    assert not list(Path(tempfile.gettempdir()).glob("pipe-server-warmup-*")), "the warm-up project is removed"
    state = json.loads(next((cache / "servers").glob("*.json")).read_text())
    yield root, cache, state["url"]
    pipe(root, cache, "server", "stop")  # the last test stops it; this is for a failed run


def test_the_example_project_runs_on_its_pipe_server_and_a_new_file_is_read_alone(server):
    root, cache, url = server
    first = ok(pipe(root, cache, "run"))
    assert first.stderr.splitlines()[0].startswith(f"Spark: the pipe server of target dev at {url}"), first.stderr
    st = steps(root)
    assert st["table.orders"]["state"] == "success" and st["table.customer_revenue"]["state"] == "success"
    orders = hudi_rows(root, "orders", ["order_id", "customer_id", "amount", "region"])
    assert orders and len(orders) == len({r[0] for r in orders})

    # one new file: only it is read; an update and a new order
    changed = orders[0]
    write_jsonl(root / "data/orders/orders-0009.json", [
        {"order_id": changed[0], "customer_id": changed[1], "amount": 1234.5, "status": "shipped", "region": changed[3].lower(),
         "updated_at": "2026-11-25T10:00:00Z"},
        {"order_id": 990001, "customer_id": changed[1], "amount": 7.25, "status": "placed", "region": "eu",
         "updated_at": "2026-11-25T10:05:00Z"}])
    again = ok(pipe(root, cache, "run"))
    assert "pipe server" in again.stderr.splitlines()[0]
    st = steps(root)
    assert st["table.orders"]["rows_read"] == 2 and st["table.customers"]["state"] == "no_input"
    after = {r[0]: r for r in hudi_rows(root, "orders", ["order_id", "customer_id", "amount", "region"])}
    assert after[changed[0]][2] == 1234.5 and after[990001][2] == 7.25 and len(after) == len(orders) + 1

    # the project's tests run on the server too; the data tests pass
    tested = ok(pipe(root, cache, "test"))
    assert "pipe server" in tested.stderr.splitlines()[0]
    assert run_results(root)["success"] is True

    # the fixed sessions the steps used outlive the commands, without the steps' views (which
    # would shadow a catalog table of the same name in the next step, and keep its input cached)
    assert _temporary_views(root, cache, ["step", "step-1"]) == {"step": [], "step-1": []}


def test_commands_on_the_server_are_forked_from_a_process_that_has_imported_pipe_and_pyspark(server, tmp_path):
    """`pipe server start` started pipe's fork server too (pipe/forkserver.py): the command is
    handed to it, and its child imports none of what a run on the server needs."""
    root, cache, _ = server
    write_jsonl(root / "data/orders/orders-0010.json", [
        {"order_id": 990002, "customer_id": 101, "amount": 19.5, "status": "placed", "region": "us", "updated_at": "2026-11-25T11:00:00Z"}])
    imported = tmp_path / "imported.txt"
    r = ok(pipe(root, cache, "run", PIPE_FORKSERVER_IMPORTS=str(imported)))
    assert "pipe server" in r.stderr.splitlines()[0] and steps(root)["table.orders"]["rows_read"] == 1
    assert {r[0]: r[1] for r in hudi_rows(root, "orders", ["order_id", "amount"])}[990002] == 19.5
    log = (cache / "servers" / "forkserver.log").read_text()
    assert re.search(rf"pid (\d+): pipe --project-dir {re.escape(str(root))} run \(in .*\n(.*\n)*.*pid \1: exit 0", log), log
    heavy = [m for m in imported.read_text().split() if m.split(".")[0] in (
        "pipe", "compiler", "runtime", "pyspark", "pandas", "pyarrow", "numpy", "grpc", "networkx", "sqlglot", "fastavro", "boto3")]
    assert heavy == [], "preload these in pipe/forkserver.py PRELOAD"


def _temporary_views(root: Path, cache: Path, sessions: list[str]) -> dict[str, list[str]]:
    """The temporary views in fixed sessions of the project's pipe server, read by a client of
    its own (a subprocess: this process is a classic Spark driver)."""
    code = f"""
import json, os
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
from pathlib import Path
from pyspark.sql.connect.session import SparkSession
from runtime.spark.server import read_state
state = read_state(Path({str(root)!r}), "dev")
out = {{}}
for name in {sessions!r}:
    spark = SparkSession.builder.remote(state.session_url(name)).create()
    out[name] = sorted(t.name for t in spark.catalog.listTables() if t.isTemporary)
    spark.client.close()
print(json.dumps(out))
"""
    r = ok(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(cache), timeout=120))
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_server_belongs_to_one_project_and_its_settings(server, tmp_path):
    root, cache, url = server
    status = ok(pipe(root, cache, "server", "status"))
    assert url in status.stdout and "runs at" in status.stdout

    # another project, even of the same name, has none
    ok(subprocess.run([sys.executable, "-m", "pipe", "init", "shop"], cwd=tmp_path, capture_output=True, text=True, env=_env(cache)))
    other = pipe(tmp_path / "shop", cache, "server", "status")
    assert other.returncode == 1 and "No pipe server runs for target dev" in other.stdout

    # the same project with other Spark settings does not use it
    project_file = root / "pipe_project.yml"
    text = project_file.read_text()
    try:
        project_file.write_text(text.replace(f'secret.key: "{SECRET}"\n', f'secret.key: "{SECRET}"\n        spark.sql.shuffle.partitions: 3\n', 1))
        changed = pipe(root, cache, "server", "status")
        assert changed.returncode == 1 and "started with other Spark settings" in changed.stdout, changed.stdout
    finally:
        project_file.write_text(text)

    # nor does another version of pipe's code (an upgrade, an edit): its workers run the old one
    module = REPO / "runtime" / "table" / "writer.py"
    before = module.stat()
    try:
        os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        upgraded = pipe(root, cache, "server", "status")
        assert upgraded.returncode == 1 and "another version of pipe's code" in upgraded.stdout, upgraded.stdout
    finally:
        os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ok(pipe(root, cache, "server", "status")).returncode == 0


MOR_PROJECT = {
    "sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, status STRING, amount DECIMAL(12,2), ts BIGINT, note STRING"
        """,
    "tables/orders.yml": """
        tables:
          orders:
            type: merge_on_read
            key: [order_id, status_group]
            precombine: ts
            partition_by: [status_group]
            compaction: {inline: false}
        """,
    "tables/orders.sql": "select order_id, substr(status, 1, 1) as status_group, status, amount, ts, note from {{ source('raw') }}\n",
}


def test_a_merge_on_read_table_and_its_compaction_over_a_remote_connect_server(server, tmp_path):
    _, cache, url = server
    root = write_project(tmp_path / "p", MOR_PROJECT)
    base_ts = 1_732_000_000_000
    rows = [{"order_id": i, "status": "new", "amount": f"{i * 10.25:.2f}", "ts": base_ts + i, "note": f"ä/{i}#x y"}
            for i in range(1, 2001)]
    write_jsonl(root / "data/orders/1.json", rows)
    first = ok(pipe(root, cache, "run", **_as_remote(cache, url)))
    assert f"Spark: Spark Connect server {url}" in first.stderr
    assert "pipe's code shipped as pipe-" in first.stderr  # a remote server gets pipe's code with the session
    write_jsonl(root / "data/orders/2.json", [{**r, "status": "new", "amount": "1.50", "ts": base_ts + 10_000} for r in rows[:500]])
    ok(pipe(root, cache, "run", **_as_remote(cache, url)))
    assert list((root / "lake/orders").rglob(".*.log.*")), "the second write went to log files"

    compacted = ok(pipe(root, cache, "compact", "orders", **_as_remote(cache, url)))
    assert "compacted orders:" in compacted.stdout
    got = {r[0]: r for r in hudi_rows(root, "orders", ["order_id", "status", "amount", "ts", "note"])}
    assert len(got) == 2000
    assert str(got[1][2]) == "1.50" and got[1][3] == base_ts + 10_000
    assert str(got[1999][2]) == "20489.75" and got[1999][4] == "ä/1999#x y"
    timeline = [json.loads(line) for line in ok(pipe(root, cache, "timeline", "orders", "--output", "json")).stdout.splitlines()]
    done = [(i["action"], i.get("operation")) for i in timeline if i["state"] == "completed"]
    assert done == [("deltacommit", "UPSERT"), ("deltacommit", "UPSERT"), ("commit", "COMPACT")], done


def test_quarantine_keeps_working_round_after_round_over_connect(server, tmp_path):
    from tests.test_data_tests import QUARANTINE_ROUNDS, _quarantine_tables, assert_quarantine_round, quarantine_round

    _, cache, url = server
    root = write_project(tmp_path / "p", {"pipe_project.yml": "name: q\n", **QUARANTINE_ROUNDS,
                                          "tables/orders.yml": _quarantine_tables("merge_on_read")})
    good: dict = {}
    quarantined: set = set()
    for round_ in range(4):
        write_jsonl(root / f"data/orders/round-{round_}.json", quarantine_round(round_, good, quarantined))
        r = ok(pipe(root, cache, "run", **_as_remote(cache, url)))
        assert "has_customer quarantined 1, positive_amount quarantined 1; quarantine commit" in r.stdout
        assert_quarantine_round(root, round_, good, quarantined)


def test_the_examples_unit_test_runs_on_its_pipe_server_and_leaves_nothing(server):
    """`pipe test --unit` on the warm server: the throwaway table is written and read by the
    server, then removed; the lake is not touched."""
    root, cache, _ = server
    lake_before = sorted(p.name for p in (root / "lake").iterdir()) if (root / "lake").exists() else []
    for _ in range(2):
        r = ok(pipe(root, cache, "test", "--unit"))
        assert r.stderr.startswith("Spark: the pipe server of target dev"), r.stderr
        results = {s["id"]: s for s in run_results(root)["steps"]}
        assert set(results) == {"unit.orders_keep_the_latest_version"}
        assert results["unit.orders_keep_the_latest_version"]["message"] == "orders after the write holds the 3 expected rows"
    assert not list((root / "target/unit").iterdir())
    assert (sorted(p.name for p in (root / "lake").iterdir()) if (root / "lake").exists() else []) == lake_before

def test_a_python_model_with_a_udf_runs_over_a_remote_connect_server_round_after_round(server, tmp_path):
    """model() gets Connect DataFrames; its UDF reaches the server's Python workers by value."""
    from tests.test_python_models import CUSTOMERS, _expected, _files, _orders

    _, cache, url = server
    root = write_project(tmp_path / "p", {"pipe_project.yml": "name: py\n", **_files()})
    write_jsonl(root / "data/customers/c.json", CUSTOMERS)
    rounds = []
    for round_ in (1, 2):
        rounds.append(_orders(round_, 800))
        write_jsonl(root / f"data/orders/o{round_}.json", rounds[-1])
        r = ok(pipe(root, cache, "run", **_as_remote(cache, url)))
        assert f"Spark: Spark Connect server {url}" in r.stderr
    got = {(r[0], r[1]): r for r in hudi_rows(root, "orders", ["order_id", "line", "customer", "amount", "country", "initial"])}
    want = _expected(rounds)
    assert set(got) == set(want)
    for k, r in want.items():
        assert got[k][2:] == (r["customer"], Decimal(r["amount"]), r["country"], None if r["customer"] is None else r["customer"][0].upper()), k
    totals = {r[0]: r for r in hudi_rows(root, "totals", ["customer", "lines", "was"])}
    assert sum(t[1] for t in totals.values()) == sum(1 for r in want.values() if r["customer"] is not None)
    assert {t[2] for t in totals.values()} == {len(CUSTOMERS)}  # the second round saw `this`


def test_s3_events_flow_to_the_table_over_connect(server, tmp_path, s3env):
    from tests.test_s3_events import s3_project

    _, cache, url = server
    s3env.put("orders/o-1.json", [{"order_id": 1_000_000_000_001, "amount": 12.5}, {"order_id": 2, "amount": 0.1}])
    s3env.put("orders/o 2+x.json", [{"order_id": 3, "amount": 3.5}])
    root = s3_project(tmp_path, s3env)
    ok(pipe(root, cache, "run", **_as_remote(cache, url)))
    assert steps(root)["table.orders"]["rows_read"] == 3
    assert hudi_rows(root, "orders", ["order_id", "amount"]) == [(2, 0.1), (3, 3.5), (1_000_000_000_001, 12.5)]
    assert s3env.waiting() == 0, "the messages are deleted once their commit completed"


def test_kafka_messages_flow_to_the_table_over_connect_round_after_round(server, tmp_path, kafka):
    """A kafka source over a remote Connect server: the server's Python workers read the
    partitions (the probe checked they have confluent-kafka); the schema is inferred there."""
    from tests.test_kafka import COLUMNS, as_row, kafka_project, payment, send

    _, cache, url = server
    kafka.create_topic("connect.payments", partitions=3)
    root = kafka_project(tmp_path, kafka, "connect.payments")
    model: dict = {}
    for round_no in range(2):
        batch = [payment(i, round_no) for i in range(round_no * 200, round_no * 200 + 300)]
        send(kafka, "connect.payments", batch)
        model.update({(p["merchant"], p["txn_ref"]): p for p in batch})
        r = ok(pipe(root, cache, "run", **_as_remote(cache, url)))
        assert f"Spark: Spark Connect server {url}" in r.stderr
        assert steps(root)["table.payments"]["inputs"]["payments_topic"]["rows"] == 300
        assert hudi_rows(root, "payments", COLUMNS) == sorted(as_row(p) for p in model.values())
    # declared nowhere: the values' columns are inferred on the server from the new messages
    other = kafka_project(tmp_path, kafka, "connect.payments", name="inferred", schema=None)
    ok(pipe(other, cache, "run", **_as_remote(cache, url)))
    assert len(hudi_rows(other, "payments", ["merchant", "txn_ref"])) == len(model)


@pytest.fixture
def s3env(moto_server, request):
    from tests.test_s3_events import S3Env

    return S3Env(moto_server, "connect-" + request.node.name.lower()[5:30].replace("_", "-").strip("-"))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_cancels_the_runs_jobs_on_the_server_and_writes_nothing(server, tmp_path):
    _, cache, url = server
    root = write_project(tmp_path / "p", {
        "sources/s.yml": "sources:\n  s:\n    kind: files\n    path: data/s\n    format: json\n    schema: \"id BIGINT, v STRING\"\n",
        "tables/slow.yml": "tables:\n  slow:\n    key: [id]\n",
        # slow on purpose: a scan of 50 billion generated rows that keeps nothing
        "tables/slow.sql": "select s.id, s.v from {{ source('s') }} s cross join range(50000000000) r where (r.id * 7) % 1000003 = -1\n",
    })
    write_jsonl(root / "data/s/s-1.json", [{"id": 1, "v": "x"}])
    proc, state = _run_until_busy(root, cache, _env(cache, **_as_remote(cache, url)))
    try:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:  # where its threads are (docs/run.md), then Ctrl-C again, which stops at once
            proc.send_signal(signal.SIGUSR2)
            time.sleep(3)
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail(f"pipe run did not end within 150 s of Ctrl-C (exit {proc.returncode} after a second one):\n{out}\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and "internal error" not in out + err, out + err
    step = steps(root)["table.slow"]
    assert step["state"] == "cancelled" and step["message"].startswith("cancelled: the run was interrupted (Ctrl-C); slow wrote nothing")
    assert not list((root / "lake/slow/.hoodie").glob("*.commit")) if (root / "lake/slow/.hoodie").exists() else True
    # the server stopped the scan: its JVM is idle again (within a minute: a loaded machine is slow
    # to kill tasks; the scan itself would keep a core busy for hours)
    deadline = time.monotonic() + 60
    while True:
        before = _cpu_seconds(state["server_pid"])
        time.sleep(3)
        used = _cpu_seconds(state["server_pid"]) - before
        if used < 1.5 or time.monotonic() > deadline:
            break
    assert used < 1.5, f"the server still runs the cancelled job ({used:.1f} CPU-s in 3 s)"


def test_a_hive_metastore_catalog_is_synced_over_connect_by_a_jvm_of_pipes_own(server, tmp_path, hive_metastore):
    """`catalog: {kind: spark}` over Connect: the server's JVM is out of pipe's reach, so Hive's
    metastore client runs in a JVM pipe starts beside its session (the same jars, no Spark)."""
    from tests.test_catalog import ORDERS_SCHEMA, what_a_metastore_holds

    # pipe's own server, no metastore named: the embedded Derby one in the project folder, as embedded Spark makes it
    root, cache, url = server
    project_file = root / "pipe_project.yml"
    text = project_file.read_text()
    write_jsonl(root / "data/orders/orders-0100.json", [
        {"order_id": 4_000_000_000_001, "customer_id": 101, "amount": 99.5, "status": "paid",
         "updated_at": "2024-03-01T10:00:00Z", "region": "latam"}])
    try:
        # the fixture put a conf: block under master:, so the catalog goes before spark:
        project_file.write_text(text.replace('    spark:\n      master: "local[*]"',
                                             '    catalog: {kind: spark}\n    spark:\n      master: "local[*]"', 1))
        assert "catalog: {kind: spark}" in project_file.read_text()
        ran = ok(pipe(root, cache, "run"))
    finally:
        project_file.write_text(text)
    assert "Spark: the pipe server of target dev" in ran.stderr.splitlines()[0], ran.stderr
    assert steps(root)["table.orders"]["catalog"]["created"] == ["shop.orders"], steps(root)["table.orders"]
    tables, table, partitions = what_a_metastore_holds(root)
    assert tables == "['customer_revenue', 'customers', 'orders', 'regions']"
    assert table == str(["hudi", "EXTERNAL", (root / "lake/orders").as_uri(), ORDERS_SCHEMA])
    assert partitions == "['APAC', 'EU', 'LATAM', 'US']"

    # a remote Connect server: an embedded metastore would be pipe's alone, so one must be named
    ok(subprocess.run([sys.executable, "-m", "pipe", "init", "shop"], cwd=tmp_path, capture_output=True, text=True, env=_env(cache)))
    other = tmp_path / "shop"
    other_file = other / "pipe_project.yml"
    other_text = other_file.read_text()
    other_file.write_text(other_text.replace('master: "local[*]"', 'master: "local[*]"\n    catalog: {kind: spark, database: remote_shop}', 1))
    warned = ok(pipe(other, cache, "run", **_as_remote(cache, url)))
    orders = steps(other)["table.orders"]
    assert orders["state"] == "warn" and "no Hive metastore is named for this target" in orders["message"], orders
    assert "spark.hadoop.hive.metastore.uris" in warned.stdout + warned.stderr
    assert not (other / "metastore_db").exists()
    other_file.write_text(other_text.replace(
        'master: "local[*]"', f'master: "local[*]"\n      conf:\n        spark.hadoop.hive.metastore.uris: "{hive_metastore.uri}"'
                              '\n    catalog: {kind: spark, database: remote_shop}', 1))
    synced = ok(pipe(other, cache, "sync", **_as_remote(cache, url)))
    assert "✓ orders: registered remote_shop.orders, +3 partition(s)" in synced.stdout, synced.stdout
    tables, table, partitions = what_a_metastore_holds(tmp_path, hive_metastore.uri, "remote_shop")
    assert tables == "['customer_revenue', 'customers', 'orders', 'regions']"
    assert table == str(["hudi", "EXTERNAL", (other / "lake/orders").as_uri(), ORDERS_SCHEMA])
    assert partitions == "['APAC', 'EU', 'US']"


def _cmdlines(pids: set[int]) -> dict[int, str]:
    """The command lines of `pids` and of all their descendants (what `ps` shows any local user)."""
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, grew = set(pids), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        grew, found = bool(more), found | more
    lines = {}
    for pid in found:
        try:
            lines[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            pass
    return lines


def test_the_server_serves_only_clients_with_its_token_which_no_other_user_can_see(server):
    root, cache, url = server
    state = json.loads(next((cache / "servers").glob("*.json")).read_text())
    # a plain Spark Connect client of another local user: refused, by address or by name
    code = f"""
import os
os.environ.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
from pyspark.sql.connect.session import SparkSession
for url in ("sc://127.0.0.1:{state['port']}", "sc://localhost:{state['port']}/;token=guessed"):
    try:
        rows = SparkSession.builder.remote(url).create().sql("select current_user() as u").collect()
        print("SERVED", url, rows)
    except Exception as exc:
        print("REFUSED", url, type(exc).__name__, (str(exc).splitlines() or [""])[0][:200])
"""
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(cache), timeout=180)
    assert plain.stdout.count("REFUSED") == 2 and "SERVED" not in plain.stdout, plain.stdout + plain.stderr
    # pipe's own commands give it
    write_jsonl(root / "data/orders/orders-0011.json", [
        {"order_id": 990003, "customer_id": 102, "amount": 42.75, "status": "placed", "region": "eu", "updated_at": "2026-11-25T12:00:00Z"}])
    ran = ok(pipe(root, cache, "run"))
    assert "pipe server" in ran.stderr.splitlines()[0] and {r[0]: r[1] for r in hudi_rows(root, "orders", ["order_id", "amount"])}[990003] == 42.75
    # neither the token nor a Spark setting's secret is on a command line of the supervisor, the
    # JVM or its Python workers; the state file (token, session ids) and log are this user's only
    lines = _cmdlines({state["supervisor_pid"], state["server_pid"]})
    assert state["server_pid"] in lines and any("SparkConnectServer" in line for line in lines.values()), lines
    assert [pid for pid, line in lines.items() if state["token"] in line or "sekrit-" in line] == [], lines
    servers = cache / "servers"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and stat.S_IMODE(servers.stat().st_mode) == 0o700
    files = [p for p in servers.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert {p.suffix for p in files} >= {".json", ".log"}, files
    assert {str(p.relative_to(servers)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files if stat.S_IMODE(p.stat().st_mode) != 0o600} == {}
    assert [p for p in servers.rglob("*") if p.is_dir() and stat.S_IMODE(p.stat().st_mode) != 0o700] == []
    assert "sekrit-" not in Path(state["log"]).read_text(errors="replace")


def test_pipe_server_stop_ends_it_and_commands_go_back_to_embedded_spark(server):
    root, cache, url = server
    state = json.loads(next((cache / "servers").glob("*.json")).read_text())
    stopped = ok(pipe(root, cache, "server", "stop"))
    assert f"Stopped the pipe server of target dev ({url}" in stopped.stdout
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{state['server_pid']}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{state['server_pid']}").exists(), "the server's JVM is gone"
    status = pipe(root, cache, "server", "status")
    assert status.returncode == 1 and "No pipe server runs" in status.stdout
    again = ok(pipe(root, cache, "run"))  # nothing new: no Spark is started at all
    assert "pipe server" not in again.stderr and {s["state"] for s in steps(root).values() if s["kind"] == "write"} == {"no_input"}


def test_a_server_is_idle_only_when_no_command_holds_a_lease_and_none_used_it_lately(tmp_path, monkeypatch):
    from runtime.spark import server

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path))
    state = server.ServerState(project=str(tmp_path), target="dev", fingerprint="f", url="sc://127.0.0.1:1", port=1,
                               supervisor_pid=os.getpid(), server_pid=os.getpid(), session_base="1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                               started_at=time.time() - 600, idle_timeout_s=60, log="", master="local[2]", token="t")
    assert server.idle_for(state) >= 599  # never used: idle since it started
    server.touch(state)
    assert server.idle_for(state) < 5
    old = time.time() - 300
    os.utime(server.lease_dir(state) / "last_used", (old, old))
    assert 299 <= server.idle_for(state) < 310
    held = server.lease(state)  # a command of this process uses it: never idle
    assert server.idle_for(state) == 0.0
    held.rename(held.with_name("lease-999999999"))  # a command that died: its lease is dropped
    assert server.idle_for(state) >= 299 and not held.with_name("lease-999999999").exists()
    # the two sessions' ids are fixed by the server, different from each other and from another server's
    other = dataclasses.replace(state, session_base="2b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert state.session_id("main") == state.session_id("main") != state.session_id("step")
    assert state.session_id("main") != other.session_id("main")


def test_an_unreachable_connect_server_is_one_clear_error_within_seconds(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = tmp_path / "cache"
    ok(subprocess.run([sys.executable, "-m", "pipe", "init", "shop"], cwd=tmp_path, capture_output=True, text=True, env=_env(cache)))
    t0 = time.time()
    r = pipe(tmp_path / "shop", cache, "run", timeout=120, SPARK_REMOTE=f"sc://127.0.0.1:{port}")
    assert r.returncode == 1 and time.time() - t0 < 60
    assert f"cannot reach the Spark Connect server at sc://127.0.0.1:{port}: Connection refused" in r.stderr
    assert "pipe server start" in r.stderr and "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "shop/lake/orders/.hoodie").exists() or not list((tmp_path / "shop/lake/orders/.hoodie").glob("*.commit"))


SLOW_PROJECT = {
    "pipe_project.yml": "name: doomed\n",
    "sources/s.yml": "sources:\n  s:\n    kind: files\n    path: data/s\n    format: json\n"
                     "    schema: \"id BIGINT, shop STRING, amount DECIMAL(12,2), ts BIGINT\"\n",
    "tables/slow.yml": "tables:\n  slow:\n    key: [id, shop]\n    precombine: ts\n",
    # slow on purpose: a scan of 50 billion generated rows that keeps nothing
    "tables/slow.sql": "select s.id, s.shop, s.amount, s.ts from {{ source('s') }} s cross join range(50000000000) r "
                       "where (r.id * 7) % 1000003 = -1\n",
}
FAST_SQL = "select id, shop, amount, ts from {{ source('s') }}\n"
SLOW_ROWS = [{"id": 1_732_000_000_000 + i, "shop": ("Zürich", "O'Brien \"B\"", "köln")[i % 3], "amount": f"{i * 19.99:.2f}",
              "ts": 1_732_000_000_000 + i * 1000} for i in range(30)]


@pytest.fixture(scope="module")
def doomed_server(tmp_path_factory):
    """A project of its own with its own pipe server (started without its warm-up), which its
    tests stop with SIGTERM runs and finally kill: (project folder, cache folder)."""
    base = tmp_path_factory.mktemp("doomed")
    cache = base / "cache"
    root = write_project(base / "p", SLOW_PROJECT)
    write_jsonl(root / "data/s/s-1.json", SLOW_ROWS)
    started = ok(pipe(root, cache, "server", "start", "--no-warmup", timeout=240))
    assert "not warmed up (--no-warmup)" in started.stdout
    yield root, cache
    pipe(root, cache, "server", "stop")


def _run_until_busy(root: Path, cache: Path, env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    """A `pipe run` of the slow project, once its scan keeps the server's JVM busy."""
    state = json.loads(next((cache / "servers").glob("*.json")).read_text())
    # as a terminal starts it: with Ctrl-C's default action. A test session started in the
    # background of a script inherits SIGINT ignored (POSIX shells do that to `cmd &`), and a
    # Python started that way never turns SIGINT into KeyboardInterrupt: the CI failures of
    # this test, whose stacks showed no thread ever handling the signal
    proc = subprocess.Popen([sys.executable, "-m", "pipe", "--project-dir", str(root), "run", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env(cache),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if '"step_start"' in line and '"table.slow"' in line:
            break
    busy = _cpu_seconds(state["server_pid"])
    deadline = time.time() + 120
    while _cpu_seconds(state["server_pid"]) - busy < 4 and time.time() < deadline:  # the scan is running
        time.sleep(0.5)
    return proc, state


def _pending(root: Path) -> list[str]:
    """The table's instants left requested or inflight: with no completed instant file."""
    names = {p.name for p in (root / "lake/slow/.hoodie").glob("*") if p.is_file()}
    begun = {n.split(".")[0] for n in names if n.endswith((".requested", ".inflight"))}
    done = {n.split(".")[0] for n in names if n[:1].isdigit() and not n.endswith((".requested", ".inflight"))}
    return sorted(begun - done)


def test_sigterm_cancels_a_run_on_the_pipe_server_with_exit_143_and_releases_its_lock(doomed_server):
    """The run is handed to the fork server's child: `pipe` passes SIGTERM on to it."""
    root, cache = doomed_server
    proc, _ = _run_until_busy(root, cache)
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)  # a hang guard, not a measure of speed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out + err
    assert "Traceback" not in out + err and "internal error" not in out + err, out + err
    step = steps(root)["table.slow"]
    assert step["state"] == "cancelled" and step["message"].startswith("cancelled: the run was interrupted (SIGTERM); slow wrote nothing"), step
    assert not (root / "lake/.pipe-run.lock").exists(), "the run lock is released"


def test_a_pipe_server_killed_during_a_run_fails_it_with_what_to_do_and_the_next_run_succeeds(doomed_server):
    root, cache = doomed_server
    proc, state = _run_until_busy(root, cache)
    try:
        os.kill(state["server_pid"], signal.SIGKILL)  # the server's JVM dies in the middle of the scan
        out, err = proc.communicate(timeout=300)  # a hang guard (it hung for 15 minutes), not a measure of speed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err and "RETRIES_EXCEEDED" not in out + err, out + err
    step = steps(root)["table.slow"]
    assert step["state"] == "error", step
    assert step["message"] == f"table.slow: the pipe server at {state['url']} went away (its Spark is gone) during this step", step
    assert "nothing of the steps that had not finished was committed" in step["hint"] and "pipe server start" in step["hint"], step
    assert not (root / "lake/.pipe-run.lock").exists(), "the run lock is released"
    assert not list((root / "lake/slow/.hoodie").glob("*.commit")) if (root / "lake/slow/.hoodie").exists() else True

    # the supervisor forgets the dead server: the next run starts embedded Spark, and writes every row
    deadline = time.time() + 60
    while time.time() < deadline and pipe(root, cache, "server", "status").returncode == 0:
        time.sleep(1)
    (root / "tables/slow.sql").write_text(FAST_SQL)
    again = ok(pipe(root, cache, "run"))
    assert "pipe server" not in again.stderr
    got = hudi_rows(root, "slow", ["id", "shop", "amount", "ts"])
    assert [(r[0], r[1], str(r[2])) for r in got] == sorted((r["id"], r["shop"], r["amount"]) for r in SLOW_ROWS)
    assert _pending(root) == [], "no instant is left requested or inflight"


def test_a_port_another_process_took_is_never_taken_for_the_servers(tmp_path):
    """pipe chooses a free port and starts the server on it; another process may take the port
    first. What then answers there must not pass for pipe's server (it would get the token):
    readiness is the server's own process listening (the CI failure of f336af4's first run)."""
    import socket

    from runtime.spark.server import _listening, _listening_by

    mine = socket.socket()
    mine.bind(("127.0.0.1", 0))
    mine.listen()
    other = subprocess.Popen([sys.executable, "-c", "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                              "print(s.getsockname()[1], flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        assert _listening(port)  # something answers there
        assert not _listening_by(os.getpid(), port)  # but not this process
        assert _listening_by(other.pid, port)
        assert _listening_by(os.getpid(), mine.getsockname()[1])
    finally:
        other.kill()
        mine.close()

