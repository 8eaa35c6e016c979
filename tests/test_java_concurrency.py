"""Java Hudi 0.15.0 and pipe on one table, one after the other and at the same time: a Java write
killed mid-flight, a live Java writer with heartbeats, a Java writer west of UTC on a table
with Hudi's LOCAL timeline time zone, and thirty commits taking turns with archival on both
sides. The interop audit's "Cases to cover" 3, 4 and 7 (shared/interop-audit/README.md). Every
case ends with pipe, hudi-rs and Java reading the same rows, each key once."""

from __future__ import annotations

import time
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig, markers
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from runtime.table.errors import TableError
from runtime.table.timeline import parse_instant_file
from tests.java_hudi.client import JavaHudi, hudi_rs, pipe_read, rows
from tests.java_hudi.env import HUDI_015, ensure
from tests.test_java_interop import (BASE_MS, ORDER_COLS, ORDERS, ORDERS_SQL, REGIONS, as_expected, java_options, orders,
                                     pipe_orders, three_readers_agree)

pytestmark = [pytest.mark.java_hudi, pytest.mark.spark]

OFF = {"hoodie.metadata.enable": "false"}


def pipe_write(spark, path: Path, batch: pa.Table, operation: str = "upsert", **options):
    return Table.open(spark, str(path)).write(spark.createDataFrame(batch.to_pylist(), ORDERS_SQL), operation, **options)


def pending_instant(path: Path) -> str | None:
    """The time of the table's newest requested or inflight write, if any."""
    names = [parse_instant_file(p.name) for p in (path / ".hoodie").iterdir() if p.is_file()]
    done = {i.time for i in names if i is not None and i.is_completed}
    pending = sorted(i.time for i in names if i is not None and not i.is_completed and i.time not in done
                     and i.action in ("commit", "deltacommit", "replacecommit"))
    return pending[-1] if pending else None


def data_files(path: Path) -> set[str]:
    """Every data file of the table (base and log files, partial ones too), relative paths."""
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".hoodie" not in p.relative_to(path).parts
            and (p.name.endswith(".parquet") or ".log." in p.name)}


def markers_of(path: Path, instant: str) -> list[Path]:
    folder = path / ".hoodie" / ".temp" / instant
    return [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []


# --- 1. a Java write killed mid-flight ----------------------------------------------------------

def big_batch(n: int, version: int) -> pa.Table:
    """`n` rows: the first 1000 update pipe_orders' keys in their partitions, the rest are new
    keys spread over 40 new partitions, so Java writes many files, one after another."""
    return orders(range(n), version, region=lambda i: REGIONS[i % 4] if i < 1000 else f"part-{i % 40:02d}")


def test_pipe_rolls_back_a_java_write_killed_mid_flight(spark, tmp_path, java_hudi_015):
    """A Java 0.15 writer (its defaults: metadata table, timeline-server markers, EAGER
    failed-writes policy) is killed with SIGKILL while its upsert of 100,000 rows into 44
    partitions is writing files. pipe's next write rolls the instant back: every file Java's
    markers name is gone, and the marker folder and the instant with them; then pipe, hudi-rs and
    Java read the rows from before the crash plus pipe's write, each key once; Java writes again
    and all still agree."""
    ensure()
    path = tmp_path / "orders"
    table = pipe_orders(spark, path, MERGE_ON_READ)  # base files and logs: both kinds of leftovers
    before = data_files(path)
    crashing = JavaHudi(HUDI_015, tmp_path / "java-crash")
    try:
        crashing.write_async(path, big_batch(100_000, 2), java_options(table.config, "upsert"))
        deadline = time.monotonic() + 240
        instant, written = None, set()
        while time.monotonic() < deadline:
            instant = instant or pending_instant(path)
            if instant and markers_of(path, instant):
                written = data_files(path) - before
                if len(written) >= 3:
                    break
            assert crashing.proc.poll() is None, f"the Java writer ended early:\n{crashing.log_tail()}"
            time.sleep(0.05)
        else:
            pytest.fail(f"Java wrote no data files of a pending instant in time:\n{crashing.log_tail()}")
    finally:
        crashing.kill()
    assert instant > table.timeline().completed()[-1].time
    assert not (path / ".hoodie" / f"{instant}.commit").exists() and not (path / ".hoodie" / f"{instant}.deltacommit").exists()
    left = data_files(path) - before  # with the .crc sidecars Java's local file system writes
    assert left, "the crash left no data files"
    marked = {m.path for m in markers.read(table.storage, instant)}
    assert {f for f in left if not f.endswith(".crc")} <= marked, "Java marked every file before writing it"

    expected = as_expected(orders(range(1000), 1))
    fix = orders(range(3, 1000, 7), 3)
    pipe_write(spark, path, fix)
    expected.update(as_expected(fix))
    hoodie = path / ".hoodie"
    assert not [p.name for p in hoodie.iterdir() if p.name.startswith(instant)], "Java's instant is gone"
    assert not (hoodie / ".temp" / instant).exists(), "its markers are gone"
    assert not (data_files(path) & left), "every file the crashed write left is gone"
    undone = []
    for done in hoodie.glob("*.rollback"):
        with open(done, "rb") as f:
            undone += next(iter(fastavro.reader(f)))["commitsRollback"]
    assert instant in undone, "a completed rollback instant names Java's"
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)

    again = orders(range(0, 1000, 5), 4)
    java_hudi_015.write(path, again, java_options(table.config, "upsert"))
    expected.update(as_expected(again))
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)


# --- 2. a live Java writer with heartbeats --------------------------------------------------------

# Java writes heartbeats only under its LAZY failed-writes policy, which optimistic concurrency
# control needs; the lock provider is Java's own (pipe's writer lock is .hoodie/pipe.lock).
OCC = {"hoodie.write.concurrency.mode": "optimistic_concurrency_control", "hoodie.cleaner.policy.failed.writes": "LAZY",
       "hoodie.write.lock.provider": "org.apache.hudi.client.transaction.lock.InProcessLockProvider"}


def wait_for(what: str, check, java: JavaHudi, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert java.proc.poll() is None, f"the Java writer ended:\n{java.log_tail()}"
        time.sleep(0.05)
    pytest.fail(f"no {what} in {timeout_s} s:\n{java.log_tail()}")


def test_a_live_java_writer_is_neither_rolled_back_nor_disturbed(spark, tmp_path, java_hudi_015):
    """Java 0.15 with optimistic concurrency control (LAZY failed writes: heartbeats) and its
    default metadata table upserts 60,000 rows into a pipe table. While its instant is in flight
    with a fresh heartbeat under .hoodie/.heartbeat/, a pipe write is refused with a message
    naming the instant and the heartbeat, and changes nothing: Java's instant, its markers and
    its metadata table stay (pipe retired the metadata table first, before), and Java's write
    completes. Then pipe writes, and pipe, hudi-rs and Java agree."""
    path = tmp_path / "orders"
    table = pipe_orders(spark, path, MERGE_ON_READ)
    java_hudi_015.write(path, orders(range(0, 1000, 9), 2), java_options(table.config, "upsert", **OCC))
    expected = as_expected(orders(range(1000), 1))
    expected.update(as_expected(orders(range(0, 1000, 9), 2)))
    assert (path / ".hoodie" / "metadata").is_dir()

    batch = big_batch(60_000, 3)
    running = java_hudi_015.write_async(path, batch, java_options(table.config, "upsert", **OCC))
    try:
        instant = wait_for("heartbeat of a pending Java write",
                           lambda: (t := pending_instant(path)) and (path / ".hoodie" / ".heartbeat" / t).is_file() and t,
                           java_hudi_015)
        hoodie_before = sorted(p.name for p in (path / ".hoodie").iterdir() if p.is_file())
        with pytest.raises(TableError) as err:
            pipe_write(spark, path, orders(range(1, 1000, 9), 4))
        assert f"instant {instant} (" in str(err.value) and f".hoodie/.heartbeat/{instant}" in str(err.value)
        assert "another writer" in str(err.value) and "wait for that writer to finish" in err.value.hint
        assert pending_instant(path) == instant, "Java's write was still running while pipe was refused"
        assert not [p for p in (path / ".hoodie").glob("*.rollback*")], "nothing rolled back"
        hoodie_now = sorted(p.name for p in (path / ".hoodie").iterdir() if p.is_file())
        assert set(hoodie_before) <= set(hoodie_now), "pipe removed nothing from .hoodie"
        assert "hoodie.table.metadata.partitions=" in (path / ".hoodie" / "hoodie.properties").read_text()
        assert (path / ".hoodie" / "metadata" / ".hoodie" / "hoodie.properties").is_file(), "Java's metadata table stays"
    finally:
        running.wait()
    assert (path / ".hoodie" / f"{instant}.deltacommit").is_file()
    expected.update(as_expected(batch))
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)

    fix = orders(range(1, 1000, 9), 4)
    pipe_write(spark, path, fix)
    expected.update(as_expected(fix))
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)


# --- 3. a Java writer west of UTC on a table in Hudi's LOCAL timeline time zone ------------------

WEST = "America/Los_Angeles"


@pytest.fixture(scope="module")
def java_west(tmp_path_factory):
    """Java Hudi 0.15.0 in a JVM whose time zone is America/Los_Angeles (8 or 7 hours west of
    UTC): one process for the module, since a JVM's zone is fixed when it starts."""
    ensure()
    java = JavaHudi(HUDI_015, tmp_path_factory.mktemp("java-west"), timezone=WEST)
    yield java
    java.close()


def test_a_java_writer_west_of_utc_and_pipe_take_turns_on_a_local_time_zone_table(spark, tmp_path, java_west):
    """Java 0.15 in Los Angeles makes a copy-on-write table with its default timeline time zone
    (hoodie.table.timeline.timezone=LOCAL), so its instants are Los Angeles wall-clock times.
    pipe, in a process whose zone is UTC, upserts, and Java upserts the same keys again: every
    instant sorts after the one before it (pipe's instant was 8 hours ahead of Java's clock, so
    Java's next commit sorted before it and its updates were hidden), the latest values win in
    every reader, and an incremental read across the three commits returns exactly their rows."""
    assert time.strftime("%z") == "+0000", "pipe's process runs in UTC here"
    path = tmp_path / "orders"
    config = TableConfig(name="orders", table_type=COPY_ON_WRITE, record_key_fields=("id",), partition_fields=("region",),
                         precombine_field="ts")
    java_west.write(path, orders(range(1000), 1), java_options(config, "upsert", **OFF))
    assert "hoodie.table.timeline.timezone=LOCAL\n" in (path / ".hoodie" / "hoodie.properties").read_text()
    expected = as_expected(orders(range(1000), 1))
    table = Table.open(spark, str(path))
    (first,) = [i.time for i in table.timeline().completed()]

    mine = orders(range(0, 1000, 3), 2)
    second = pipe_write(spark, path, mine).instant
    expected.update(as_expected(mine))
    theirs = orders(range(0, 1000, 2), 3)
    java_west.write(path, theirs, java_options(config, "upsert", **OFF))
    expected.update(as_expected(theirs))
    writes = [i.time for i in Table.open(spark, str(path)).timeline().completed()]
    assert writes[:2] == [first, second] and len(writes) == 3 and first < second < writes[2], writes
    three_readers_agree(Table.open(spark, str(path)), path, java_west, expected)

    cols = ["_hoodie_commit_time", "_hoodie_record_key"] + ORDER_COLS
    changed = {**as_expected(mine), **as_expected(theirs)}
    got = rows(pipe_read(Table.open(spark, str(path)), since=first, until=writes[2]), cols)
    assert {r[2]: r[3:] for r in got} == changed and len(got) == len(changed)
    assert {r[0] for r in got} == {second, writes[2]}
    assert rows(hudi_rs(path, since=first, until=writes[2]), cols) == got, "hudi-rs"
    assert rows(java_west.read(path, query="incremental", begin=first, end=writes[2]), cols) == got, "Java"


# --- 4. thirty commits taking turns -------------------------------------------------------------------

# Java archives commits (deltacommits, commits) past 6 down to 4, but never the deltacommits a
# compaction may still need (the last max.delta.commits since the latest compaction); pipe
# counts every instant (cleans and rollbacks too), so it archives at 12 down to 8, or it would
# keep Java below its threshold for good.
JAVA_TURN = {**OFF, "hoodie.index.type": "GLOBAL_SIMPLE", "hoodie.simple.index.update.partition.path": "true",
             "hoodie.keep.min.commits": "4", "hoodie.keep.max.commits": "6", "hoodie.cleaner.commits.retained": "3",
             "hoodie.compact.inline.max.delta.commits": "3"}
PIPE_TURN = {"clean_retain": 3, "archive_min": 8, "archive_max": 12, "compact_after": 3}


def turn_batch(k: int, expected: dict[int, tuple]) -> tuple[str, pa.Table]:
    """Commit k's operation and batch: every third one deletes 10 live keys; the others update
    20 live keys (a quarter of them moved to the next partition) and add 10 new ones."""
    live = sorted(expected)
    if k % 3 == 2:
        ids = live[k % 7::max(1, len(live) // 10)][:10]
        regions, values, operation = [expected[i][0] for i in ids], [None] * len(ids), "delete"
    else:
        ids = live[k % 5::max(1, len(live) // 20)][:20] + list(range(2000 + 10 * k, 2010 + 10 * k))
        regions = [REGIONS[(REGIONS.index(expected[i][0]) + 1) % 4] if i in expected and i % 4 == k % 4  # moves
                   else expected[i][0] if i in expected else REGIONS[i % 4] for i in ids]
        values, operation = [f"c{k}-{i}" for i in ids], "upsert"
    ts = [BASE_MS + 10_000_000 * (k + 2) + i for i in ids]
    return operation, pa.table({"id": ids, "region": regions, "ts": ts, "v": values}, schema=ORDERS)


def test_twenty_commits_alternating_java_and_pipe_with_archival_on_both_sides(spark, tmp_path, java_hudi_015):
    """Java 0.15 (GLOBAL_SIMPLE index moving keys between partitions, inline compaction every 3
    deltacommits, cleaning 3 commits back and archiving at 6 commits down to 4, no metadata
    table) and pipe (compaction every 3 deltacommits, cleaning 3 commits back, archiving at 12
    instants down to 8) take
    turns on one merge-on-read table for twenty commits of upserts, deletes and keys that change
    partition (both archive more than once). After 10 commits and at the end, pipe, hudi-rs and Java read the same rows,
    each key once; at the end an incremental read over the active timeline agrees too."""
    path = tmp_path / "orders"
    table = pipe_orders(spark, path, MERGE_ON_READ)
    config = table.config
    expected = as_expected(orders(range(1000), 1))
    for k in range(20):
        operation, batch = turn_batch(k, expected)
        if k % 2 == 0:
            java_hudi_015.write(path, batch, java_options(config, operation, **JAVA_TURN))
        else:
            pipe_write(spark, path, batch, operation, **PIPE_TURN)
        if operation == "delete":
            for i in batch.column("id").to_pylist():
                del expected[i]
        else:
            expected.update(as_expected(batch))
        if k % 10 == 9:
            three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)
    hoodie = path / ".hoodie"
    assert list((hoodie / "archived").glob(".commits_.archive*")), "Java archived"
    assert [p for p in (hoodie / "archived").iterdir() if parse_instant_file(p.name)], "pipe archived"
    table = Table.open(spark, str(path))
    assert len(table.timeline().instants) <= 14
    assert any(i.action == "commit" for i in table.timeline().completed()), "a compaction is on the active timeline"

    writes = [i.time for i in table.timeline().completed()]
    cols = ["_hoodie_commit_time", "_hoodie_record_key"] + ORDER_COLS
    got = rows(pipe_read(table, since=writes[0], until=writes[-1]), cols)
    assert got and all(r[0] > writes[0] for r in got)
    assert rows(hudi_rs(path, since=writes[0], until=writes[-1]), cols) == got, "hudi-rs"
    assert rows(java_hudi_015.read(path, query="incremental", begin=writes[0], end=writes[-1]), cols) == got, "Java"


CRASHING_PIPE = """
import sys
from runtime.spark.session import get_spark
from runtime.table import Table
spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
rows = [(i, "plain", 1_732_000_000_000 + i, f"crash-{i}") for i in range(5000, 5050)]
Table.open(spark, sys.argv[1]).write(spark.createDataFrame(rows, "id bigint, region string, ts bigint, v string"), "upsert")
"""


def test_java_lazy_rollback_leaves_a_pipe_write_with_a_fresh_heartbeat_alone(spark, warm_python, tmp_path, java_hudi_015):
    """The other way round: a pipe write dies after its files (PIPE_FAULT), leaving its instant,
    markers and a fresh heartbeat. Java 0.15 with the LAZY failed-writes policy (which rolls back
    pending writes whose heartbeat expired, when it cleans) writes twice: while pipe's heartbeat
    is fresh, Java leaves the instant alone; once it is older than Java's 120 s, Java rolls it
    back. pipe, hudi-rs and Java then agree, without the dead write's rows."""
    import os
    import sys

    path = tmp_path / "orders"
    table = pipe_orders(spark, path, COPY_ON_WRITE)
    proc = warm_python.run([sys.executable, "-c", CRASHING_PIPE, str(path)], env={**os.environ, "PIPE_FAULT": "after_files"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    dead = pending_instant(path)
    beat = path / ".hoodie" / ".heartbeat" / dead
    assert dead and beat.is_file() and markers_of(path, dead)
    expected = as_expected(orders(range(1000), 1))
    for version, ids in ((2, range(0, 1000, 4)), (3, range(1, 1000, 4))):
        java_hudi_015.write(path, orders(ids, version), java_options(table.config, "upsert", **OFF, **OCC))
        expected.update(as_expected(orders(ids, version)))
        if version == 2:
            assert (path / ".hoodie" / f"{dead}.inflight").is_file(), "Java left pipe's write with a fresh heartbeat alone"
            assert markers_of(path, dead)
            old = time.time() - 121  # two missed beats of Java's defaults
            os.utime(beat, (old, old))
    assert not [p.name for p in (path / ".hoodie").iterdir() if p.name.startswith(dead)], "Java rolled the dead write back"
    assert not [p for p in data_files(path) if dead in p]
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)
