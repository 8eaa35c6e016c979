"""Crash safety: a writer process that dies hard at a named point of the write path leaves a
table every reader still sees in its previous state, and the next write rolls it back."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from dataclasses import replace

import hudi
import pyarrow as pa
import pytest

from runtime.table import LockTimeout, Table, TableConfig

CONFIG = TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")

CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    table = Table.open(spark, sys.argv[1])
    df = spark.createDataFrame([(1, "EU", 5, "crashed"), (9, "US", 5, "crashed-new")], "id long, region string, ts long, v string")
    table.write(df, "upsert")
    print("WROTE")
""")


def hudi_rows(path):
    t = hudi.HudiTableBuilder.from_base_uri(path).build()
    batches = t.read()
    return sorted((r["id"], r["v"]) for r in pa.Table.from_batches(batches).to_pylist()) if batches else []


def crash_writer(warm_python, path, point):
    env = {**os.environ, "PIPE_FAULT": point}
    return warm_python.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True, timeout=300,
                           task_env=point.startswith("task_"))


# each kill point once, and each timeline layout (versions 6 and 9) once
@pytest.mark.parametrize("point,version", [("after_inflight", 6), ("after_files", 9)])
def test_a_writer_killed_before_completion_changes_nothing_readers_see(spark, warm_python, tmp_path, point, version):
    """Also at version 9 (Hudi 1.x's timeline layout 2): its dead instant stays requested and
    inflight in .hoodie/timeline/, with no completed `T_C` file, until the next writer rolls
    it back."""
    path = str(tmp_path / "orders")
    table = Table.create(spark, path, replace(CONFIG, create_version=version))
    table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b")], "id long, region string, ts long, v string"), "upsert")
    committed = [i.time for i in table.timeline().completed()]

    proc = crash_writer(warm_python, path, point)
    assert proc.returncode == 77, proc.stderr[-2000:]
    assert "WROTE" not in proc.stdout
    timeline = table.timeline()
    assert [i.time for i in timeline.completed()] == committed
    assert len(timeline.pending()) == 1  # the dead writer's instant
    dead = timeline.pending()[0].time
    if point == "after_files":
        assert list((tmp_path / "orders").rglob(f"*_{dead}.parquet")), "the crashed writer had written its files"
    # readers see the last completed state
    assert hudi_rows(path) == [(1, "a"), (2, "b")]
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a"), (2, "b")]

    # the dead writer's lock is still there; its process is gone, so the next writer takes the
    # lock over at once and rolls the dead instant back before writing
    assert (tmp_path / "orders/.hoodie/pipe.lock").exists()
    result = table.write(spark.createDataFrame([(3, "EU", 1, "c")], "id long, region string, ts long, v string"), "upsert")
    timeline = table.timeline()
    assert timeline.pending() == []
    assert [i.time for i in timeline.completed()] == committed + [result.instant]
    assert list((tmp_path / "orders").rglob(f"*{dead}*")) == []  # its files and instant files are gone
    assert hudi_rows(path) == [(1, "a"), (2, "b"), (3, "c")]


@pytest.mark.parametrize("version", [6, 9])
def test_a_writer_killed_after_commit_keeps_its_commit(spark, warm_python, tmp_path, version):
    path = str(tmp_path / "orders")
    table = Table.create(spark, path, replace(CONFIG, create_version=version))
    table.write(spark.createDataFrame([(1, "EU", 1, "a")], "id long, region string, ts long, v string"), "upsert")
    proc = crash_writer(warm_python, path, "after_commit")
    assert proc.returncode == 77, proc.stderr[-2000:]
    assert hudi_rows(path) == [(1, "crashed"), (9, "crashed-new")]
    assert len(table.timeline().completed()) == 2


def test_a_live_lock_keeps_a_second_writer_out_and_an_expired_one_does_not(spark, tmp_path):
    path = str(tmp_path / "orders")
    table = Table.create(spark, path, CONFIG)
    other = Table.open(spark, path)
    with table.lock(ttl_s=30):
        with pytest.raises(LockTimeout, match="is being written by"):
            with other.lock(wait_s=0.5):
                pass
    # a holder that died leaves a lock that expires
    (tmp_path / "orders/.hoodie/pipe.lock").write_text('{"owner": "dead:1", "expires_ms": 1}')
    with other.lock(wait_s=2):
        pass
    assert not (tmp_path / "orders/.hoodie/pipe.lock").exists()


# What Java Hudi makes of a file name in a partition folder (hudi-common FSUtils and
# AbstractTableFileSystemView): 0.15 lists names whose extension is a file format's or that
# contain ".log", takes a listed name containing ".parquet" as a base file, and one its
# unanchored LOG_FILE_PATTERN finds as a log file; 1.1 anchors the pattern.
JAVA_LOG_FILE_0_15 = __import__("re").compile(r"^\.(.+)_(.*)\.(log|archive)\.(\d+)(_((\d+)-(\d+)-(\d+))(.cdc)?)?")
JAVA_LOG_FILE_1_1 = __import__("re").compile(r"^\.([^._]+)_([^.]*)\.(log|archive)\.(\d+)(_((\d+)-(\d+)-(\d+))(\.cdc)?)?$")


def java_sees(name: str) -> str | None:
    listed = name.rsplit(".", 1)[-1] in ("parquet", "log", "hfile", "orc") or ".log" in name
    if listed and ".parquet" in name:
        return "base file"
    if (listed and JAVA_LOG_FILE_0_15.search(name)) or JAVA_LOG_FILE_1_1.search(name):
        return "log file"
    return None


def test_temporary_names_are_nothing_java_lists_as_a_data_file():
    from runtime.storage import temp_name
    from runtime.table.services import partial_file_instant

    dead = "20260101000000001"
    # the names pipe wrote before: Java took the log one for file group `.<file id>`
    assert java_sees("..0f0f0f0f-1111-2222-3333-444444444444-0_20260101000000000.log.1_0-209-0.20260101000000001.0a1b.tmp") == "log file"
    assert java_sees(".0f0f0f0f-1111-2222-3333-444444444444-0_20260101000000000.log.1_0-209-0") == "log file"  # a real one
    for tag in ("", dead):  # every temp name pipe makes: timeline and lock files, and data files tagged with their instant
        name = temp_name(tag)
        assert java_sees(name) is None, name
        assert partial_file_instant(name) == (tag or None)


def test_a_task_killed_while_writing_leaves_a_temp_file_that_rollback_removes(spark, warm_python, tmp_path):
    from runtime.table import avro

    path = str(tmp_path / "orders")
    table = Table.create(spark, path, CONFIG)
    table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b")], "id long, region string, ts long, v string"), "upsert")
    proc = crash_writer(warm_python, path, "task_before_rename")  # the Python worker dies before renaming its file
    assert proc.returncode != 0 and "WROTE" not in proc.stdout
    # the failed write rolled itself back, and with it the file its task left half-written
    (rollback,) = (tmp_path / "orders/.hoodie").glob("*.rollback.requested")
    plan = avro.from_bytes(rollback.read_bytes())
    dead = plan["instantToRollback"]["commitTime"]
    left = [f.rsplit("/", 1)[-1] for r in plan["RollbackRequests"] for f in r["filesToBeDeleted"]]
    assert left and all(name.startswith(f".pipe_{dead}_") and java_sees(name) is None for name in left)
    assert list((tmp_path / "orders").rglob("*.tmp")) == [] and table.timeline().pending() == []
    assert hudi_rows(path) == [(1, "a"), (2, "b")]


# --- issue 39 B.10: a successful write after crashes leaves no debris ---------------------------------

MOR_CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    rows = [(int(i), r, 1_717_000_000_000 + int(sys.argv[2]), f"{r}-{i}-v{sys.argv[2]}") for i, r in ((1, "EU"), (2, "US"), (5, "EU"))]
    Table.open(spark, sys.argv[1]).write(spark.createDataFrame(rows, "id long, region string, ts long, v string"), "upsert", compact_after=1)
    print("WROTE")
""")


def debris(root):
    """What a dead writer leaves that a successful write must not leave behind."""
    from runtime.table.timeline import Timeline
    from runtime.storage import StorageSpec, open_storage

    temps = sorted(str(p.relative_to(root)) for p in root.rglob(".pipe_*.tmp"))
    lock = (root / ".hoodie" / "pipe.lock").exists()
    pending = [i.file_name() for i in Timeline.load(open_storage(StorageSpec(str(root)))).pending()]
    return temps, lock, pending


@pytest.fixture(scope="module")
def crashed_twice(spark, warm_python, tmp_path_factory):
    """A merge-on-read table after two crashes, made once for the module (each test copies it):
    a run killed in its inline compaction after the compaction's files (its deltacommit stands),
    the debris of a task and of a metadata rewrite killed before their renames, then a run killed
    after writing its files, before its commit. Returns (the table's folder, the compaction's instant)."""
    from runtime.table.config import MERGE_ON_READ

    root = tmp_path_factory.mktemp("crashed") / "orders"
    path = str(root)
    table = Table.create(spark, path, TableConfig(name="orders", table_type=MERGE_ON_READ, record_key_fields=("id",),
                                                  partition_fields=("region",), precombine_field="ts"))
    t0 = 1_717_000_000_000
    table.write(spark.createDataFrame([(i, "EU" if i % 2 else "US", t0, f"first-{i}") for i in range(1, 7)], ORDERS_DDL), "upsert")
    table.write(spark.createDataFrame([(3, "EU", t0 + 1, "third-v1"), (4, "US", t0 + 1, None)], ORDERS_DDL), "upsert")

    # 1. a run killed in its inline compaction, after the compaction's files: its deltacommit stands
    env = {**os.environ, "PIPE_FAULT": "compaction_after_files"}
    proc = warm_python.run([sys.executable, "-c", MOR_CHILD, path, "2"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    (compaction,) = table.timeline().pending_compactions()
    # what a task killed before its rename, and a metadata rewrite killed before its rename, leave
    made = next(root.rglob(f"*_{compaction}.parquet"))
    made.rename(made.with_name(f".pipe_{compaction}_{'ab' * 16}.tmp"))
    stale = root / ".hoodie" / f".pipe_{'cd' * 16}.tmp"
    stale.write_bytes(b"#Updated at ...")
    long_ago = time.time() - 600
    os.utime(stale, (long_ago, long_ago))
    # 2. a run killed after writing its files, before its commit
    env = {**os.environ, "PIPE_FAULT": "after_files"}
    proc = warm_python.run([sys.executable, "-c", MOR_CHILD, path, "3"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    temps, lock, pending = debris(root)
    assert len(temps) == 2 and lock and len(pending) == 2  # the compaction and the write
    return root, compaction


ORDERS_DDL = "id long, region string, ts long, v string"


@pytest.mark.parametrize("then", ["write", "no_input"])
def test_after_crashes_a_successful_write_leaves_no_pending_instant_stale_lock_or_temp_file(spark, crashed_twice, tmp_path, then):
    import shutil

    root = tmp_path / "orders"
    shutil.copytree(crashed_twice[0], root)  # times of change kept: the temp file stays stale
    path, compaction = str(root), crashed_twice[1]
    table = Table.open(spark, path)
    expected = [(1, "EU-1-v2"), (2, "US-2-v2"), (3, "third-v1"), (4, None), (5, "EU-5-v2"), (6, "first-6")]
    if then == "write":  # the next run writes (no compaction due)
        table.write(spark.createDataFrame([(6, "US", 1_717_000_000_009, "six-v9")], ORDERS_DDL), "upsert")
        expected[-1] = (6, "six-v9")
    else:  # the next run has no new input for the table: it tidies it
        done = table.tidy()
        assert any(d.startswith("finished compaction") for d in done) and any(d.startswith("rolled back") for d in done)
    assert debris(root) == ([], False, [])
    assert f"{compaction}.commit" in os.listdir(root / ".hoodie")  # pipe's plan executed, not rolled back
    assert hudi_rows(path) == expected
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == expected


def test_a_file_a_task_leaves_after_its_instant_was_rolled_back_is_never_read(spark, warm_python, tmp_path):
    """A task of a failed write can finish after the rollback of its instant and leave a file
    named with it. On a table whose first write failed, the timeline then starts with the
    rollback, so the dead instant is older than every active one: it must not count as archived."""
    import shutil

    path = str(tmp_path / "orders")
    table = Table.create(spark, path, CONFIG)
    proc = crash_writer(warm_python, path, "after_files")
    assert proc.returncode == 77, proc.stderr[-2000:]
    dead = table.timeline().pending()[0].time
    late = {p: p.read_bytes() for p in (tmp_path / "orders").rglob(f"*_{dead}.parquet")}
    assert late, "the crashed writer had written its files"

    table.write(spark.createDataFrame([(2, "US", 1, "b"), (3, "EU", 1, "c")], "id long, region string, ts long, v string"), "upsert")
    assert not list((tmp_path / "orders").rglob(f"*_{dead}.parquet")), "the rollback removed the dead instant's files"
    for p, data in late.items():  # the late task's rename
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    shutil.rmtree(tmp_path / "orders" / ".hoodie" / ".temp", ignore_errors=True)

    rows = sorted((r["id"], r["v"]) for r in Table.open(spark, path).read().collect())
    assert rows == [(2, "b"), (3, "c")]
