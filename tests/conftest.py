"""Shared helpers: build small projects on disk from a dict of files, and compile them."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from compiler.api import compile_project
from compiler.errors import ProjectError

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "project_template"

MINIMAL_PROJECT = "name: shop\n"

# pytest runs three workers (pyproject.toml: -n 3 --dist loadfile), each a session of its own with
# its own shared Spark, moto server and Java Hudi processes; a file's tests stay on one worker, so
# its module fixtures are made once. Measured on 2 cores, clean clones of the same commit an hour
# apart: 863 tests in 33.4 min on two workers, 27.7 min on three (both cores then stay busy while
# tests wait on JVM start-ups, Java Hudi and subprocesses); one process took 40.0 min for 851.
# The JVMs the tests start live seconds to minutes, on a machine of 2 cores, with little data.
# - Every one of them collects garbage with the serial collector (tests/jvm_options.py): G1's concurrent
#   and parallel threads took more CPU than they saved (a module mix of Spark writes, crash
#   children, `pipe run` subprocesses and Java Hudi: 388 s against 337 s, CPU 535 s against 445 s).
# - pipe's own (the shared session, `pipe` subprocesses, the cluster's executors) compile with the
#   JIT's first tier only: their jobs are small and short, so C2's compilations cost more CPU
#   than they save. Java Hudi's sessions keep the full JIT (tests/java_hudi/client.py): they do
#   their work in the JVM (Avro, Parquet, merging).
# - pipe's drivers map a class-data-sharing archive of Spark's classes (tests/jvm_options.py).
# The options reach Spark through PYSPARK_SUBMIT_ARGS (pipe's sessions append it to their own), as
# defaultJavaOptions, which any extraJavaOptions follow; a PYSPARK_SUBMIT_ARGS the user set is left alone.
if "PYSPARK_SUBMIT_ARGS" not in os.environ:
    from tests.jvm_options import pyspark_submit_args

    os.environ["PYSPARK_SUBMIT_ARGS"] = pyspark_submit_args()

# The tests' drivers map the tests' own class archive (tests/jvm_options.py); pipe's own
# (runtime/spark/class_archive.py, in the user's cache folder) is only made by the tests of it
os.environ.setdefault("PIPE_JVM_CACHE", "off")

# Test credentials for the moto server, set before any SparkSession starts: Spark's Python workers
# (which read S3 objects with boto3) take their environment from the JVM, started with this one.
for _k, _v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
    os.environ.setdefault(_k, _v)


def write_project(root: Path, files: dict[str, str]) -> Path:
    """Writes `files` (relative path -> text, dedented) under root; adds a minimal
    pipe_project.yml unless one is given."""
    files = dict(files)
    files.setdefault("pipe_project.yml", MINIMAL_PROJECT)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def compile_errors(root: Path, **kwargs) -> list:
    """The diagnostics of a project that must fail to compile."""
    with pytest.raises(ProjectError) as info:
        compile_project(root, **kwargs)
    return info.value.diagnostics


@pytest.fixture
def project(tmp_path):
    """project({...files...}) -> root folder of a new project in a temporary directory."""

    def make(files: dict[str, str]) -> Path:
        return write_project(tmp_path / "proj", files)

    return make


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for every integration test (2 cores, quiet)."""
    from runtime.spark.session import get_spark

    session = get_spark("local[2]", {"spark.sql.shuffle.partitions": "4"}, app_name="pipe-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def moto_server():
    """A real moto server (S3, SQS) on a free loopback port, for the whole test session."""
    import os

    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log on the tests' stderr

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_server, request):
    """A fresh bucket on the moto server; returns (bucket name, endpoint url)."""
    import re

    import boto3

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-b"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=name)
    return name, moto_server


def _java_hudi(bundle, tmp_path_factory):
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import ensure

    ensure()
    java = JavaHudi(bundle, tmp_path_factory.mktemp(f"java-hudi-{bundle.hudi}"))
    yield java
    java.close()


@pytest.fixture(scope="session")
def java_hudi_015(tmp_path_factory):
    """Java Hudi 0.15.0 on Spark 3.5 (writes table version 6), one process for the session."""
    from tests.java_hudi.env import HUDI_015

    yield from _java_hudi(HUDI_015, tmp_path_factory)


@pytest.fixture(scope="session")
def java_hudi_11(tmp_path_factory):
    """Java Hudi 1.1.x on Spark 3.5 (reads version 6; its writers upgrade by default)."""
    from tests.java_hudi.env import HUDI_11

    yield from _java_hudi(HUDI_11, tmp_path_factory)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """An Apache Kafka broker (KRaft) on 127.0.0.1 (tests/kafka/env.py), for the whole session."""
    from tests.kafka.env import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A PostgreSQL server with logical decoding on 127.0.0.1 (tests/postgres/env.py), for the whole
    session; tests make databases of their own in it (`postgres.create_database`)."""
    from tests.postgres.env import PostgresServer

    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    yield server
    server.remove()


@pytest.fixture
def pg_database(request, postgres):
    """A new database in `postgres` for one test; the Debezium connectors the test added on it
    are removed (their slots dropped) and the database is dropped after the test."""
    import secrets

    name = f"t_{secrets.token_hex(4)}"
    postgres.create_database(name)
    yield name
    if "debezium" in request.fixturenames:
        debezium = request.getfixturevalue("debezium")
        for connector, about in list(debezium.connectors.items()):
            if about["database"] == name:
                debezium.remove_connector(connector)
    postgres.drop_database(name)


@pytest.fixture(scope="session")
def debezium(tmp_path_factory, kafka, postgres):
    """A Kafka Connect worker (standalone) with Debezium's Postgres connector (tests/kafka/connect.py),
    writing `postgres`'s changes into `kafka`, for the whole session; tests add connectors of their
    own (`debezium.add_connector`, with a topic prefix of their own) and remove them."""
    from tests.kafka.connect import DebeziumConnect

    connect = DebeziumConnect(tmp_path_factory.mktemp("debezium"), kafka, postgres)
    yield connect
    connect.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """Apicurio Registry in memory on 127.0.0.1 (tests/registry/env.py), for the whole session:
    `.url` is its Confluent-compatible API, `.api_url` what `debezium.add_connector(...,
    avro_registry=schema_registry.api_url)` writes Avro change events through."""
    from tests.registry.env import SchemaRegistry

    registry = SchemaRegistry(tmp_path_factory.mktemp("registry"))
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def hive_metastore(tmp_path_factory):
    """A Hive metastore service on 127.0.0.1 (tests/hive_metastore.py), for the whole session."""
    from tests.hive_metastore import HiveMetastore

    store = HiveMetastore(tmp_path_factory.mktemp("hive-metastore"))
    yield store
    store.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster on 127.0.0.1 for the whole test session: one Master, two Workers
    (1 core, 1 GiB each); the nodes' Python (tests/cluster/env.py) is a venv holding only
    pyspark[sql], so neither pipe nor its other task dependencies. Tests run `pipe run` against it in a subprocess, as users do:
    this process already holds the local `spark` session."""
    from tests.cluster import env

    env.ensure()
    cluster = env.start(tmp_path_factory.mktemp("spark-cluster"))
    yield cluster
    cluster.stop()


# --- pre-warmed children for the crash tests (tests/warm_child.py) ---------------------------

WARM_AHEAD = 5  # a test this many tests ahead that uses `warm_python` gets a child warming now

_warm_pool = None
_current_item = None


def _warm():
    global _warm_pool
    if _warm_pool is None:
        from tests.warm_child import WarmPool

        _warm_pool = WarmPool()
        _warm_pool.after_job = lambda: _current_item is not None and _warm_if_needed_after(_current_item)
    return _warm_pool


def _warm_if_needed_after(item) -> None:
    items = item.session.items
    try:
        at = items.index(item)
    except ValueError:
        return
    ahead = items[at + 1:at + 1 + WARM_AHEAD]
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the next files may go to another worker: warm for this file only
        ahead = [later for later in ahead if later.fspath == item.fspath]
    if any("warm_python" in getattr(later, "fixturenames", ()) for later in ahead):
        _warm().prepare()


def pytest_collection_modifyitems(session, config, items):
    """The longest test files first (tests/durations.py): xdist hands files to its workers in
    this order, so that no long file starts last while the other workers have nothing left."""
    from tests.durations import load

    seconds = load()
    counts: dict[str, int] = {}
    for item in items:
        counts[item.nodeid.split("::", 1)[0]] = counts.get(item.nodeid.split("::", 1)[0], 0) + 1
    cost = {f: seconds.get(f, 3.0 * n) for f, n in counts.items()}
    first_seen = {f: i for i, f in enumerate(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in items))}
    items.sort(key=lambda item: (-cost[item.nodeid.split("::", 1)[0]], first_seen[item.nodeid.split("::", 1)[0]]))


def pytest_runtest_setup(item):
    global _current_item
    _current_item = item
    _warm_if_needed_after(item)


# seconds per test file and per worker of this run (setup, call and teardown), gathered where the
# reports arrive (xdist's controller, or the only process): tests/durations.py keeps them
_file_seconds: dict[str, float] = {}
_worker_seconds: dict[str, float] = {}
_test_seconds: dict[str, float] = {}


def _cpu_times() -> tuple[float, float] | None:
    """(busy, all) jiffies of the machine's CPUs so far (Linux' /proc/stat), None elsewhere."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


_cpu_at_start = _cpu_times()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    _test_seconds[report.nodeid] = _test_seconds.get(report.nodeid, 0.0) + report.duration
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    _worker_seconds[worker] = _worker_seconds.get(worker, 0.0) + report.duration


def pytest_sessionfinish(session):
    if _warm_pool is not None:
        _warm_pool.close()
    if _file_seconds and not hasattr(session.config, "workerinput"):
        from tests.durations import save_last

        save_last(_file_seconds, _test_seconds)


@pytest.fixture(scope="session")
def warm_python():
    """Runs `python -c/-m` jobs like subprocess.run, in a child that has Spark started and warm
    (tests/warm_child.py): for the crash tests, whose children die hard at a PIPE_FAULT point."""
    return _warm()


def pytest_terminal_summary(terminalreporter):
    if len(_worker_seconds) > 1:
        terminalreporter.write_line("test seconds per worker: " + ", ".join(
            f"{w} {s:.0f}" for w, s in sorted(_worker_seconds.items())))
    now = _cpu_times()
    if now and _cpu_at_start and now[1] > _cpu_at_start[1]:
        # how busy the machine's CPUs were while the session ran: below ~90% the workers waited
        # (on services, sleeps, one long file at the end) and another worker could use the slack
        busy = (now[0] - _cpu_at_start[0]) / (now[1] - _cpu_at_start[1])
        terminalreporter.write_line(f"CPU busy over the session: {busy:.0%} of {os.cpu_count()} CPUs")
    if _warm_pool is not None and (_warm_pool.warm or _warm_pool.cold):
        why = f" ({'; '.join(sorted(set(_warm_pool.cold)))})" if _warm_pool.cold else ""
        terminalreporter.write_line(f"warm_python: {_warm_pool.warm} jobs ran in a warm child, {len(_warm_pool.cold)} cold{why}")
