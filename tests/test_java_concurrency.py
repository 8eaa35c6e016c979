"""Java Hudi 0.15.0 and pipe on one table, one after the other and at the same time: a Java write
killed mid-flight, a live Java writer with heartbeats, a Java writer west of UTC on a table
with Hudi's LOCAL timeline time zone, and fifty commits taking turns with archival on both
sides. The interop audit's "Cases to cover" 3, 4 and 7 (shared/interop-audit/README.md). Every
case ends with pipe, hudi-rs and Java reading the same rows, each key once."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from runtime.table import Table
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from runtime.table.errors import TableError
from runtime.table.timeline import parse_instant_file
from tests.java_hudi.client import JavaHudi, hudi_rs, pipe_read, rows
from tests.java_hudi.env import HUDI_015, ensure
from tests.test_java_interop import (BASE_MS, ORDER_COLS, ORDERS_SQL, REGIONS, as_expected, java_options, orders,
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


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_pipe_rolls_back_a_java_write_killed_mid_flight(spark, tmp_path, java_hudi_015, table_type):
    """A Java 0.15 writer (its defaults: metadata table, timeline-server markers, EAGER
    failed-writes policy) is killed with SIGKILL while its upsert of 300,000 rows into 44
    partitions is writing files. pipe's next write rolls the instant back: every file Java's
    markers name is gone, and the marker folder and the instant with them; then pipe, hudi-rs and
    Java read the rows from before the crash plus pipe's write, each key once; Java writes again
    and all still agree."""
    ensure()
    path = tmp_path / "orders"
    table = pipe_orders(spark, path, table_type)
    before = data_files(path)
    T0=time.monotonic(); print("pipe_orders done")
    crashing = JavaHudi(HUDI_015, tmp_path / "java-crash"); print("jvm", time.monotonic()-T0)
    try:
        crashing.write_async(path, big_batch(300_000, 2), java_options(table.config, "upsert"))
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
        print("killed", time.monotonic()-T0, len(written), len(markers_of(path, instant)) if instant else None)
        crashing.kill()
    assert instant > table.timeline().completed()[-1].time
    assert not (path / ".hoodie" / f"{instant}.commit").exists() and not (path / ".hoodie" / f"{instant}.deltacommit").exists()
    left = data_files(path) - before
    assert left, "the crash left no data files"

    expected = as_expected(orders(range(1000), 1))
    fix = orders(range(3, 1000, 7), 3)
    pipe_write(spark, path, fix); print("pipe write", time.monotonic()-T0)
    expected.update(as_expected(fix))
    hoodie = path / ".hoodie"
    assert not [p.name for p in hoodie.iterdir() if p.name.startswith(instant)], "Java's instant is gone"
    assert not (hoodie / ".temp" / instant).exists(), "its markers are gone"
    assert not (data_files(path) & left), "every file the crashed write left is gone"
    rollbacks = sorted(hoodie.glob("*.rollback"))
    assert rollbacks, "pipe completed a rollback instant"
    three_readers_agree(Table.open(spark, str(path)), path, java_hudi_015, expected)

    again = orders(range(0, 1000, 5), 4)
    print("agree", time.monotonic()-T0)
    java_hudi_015.write(path, again, java_options(table.config, "upsert")); print("java write", time.monotonic()-T0)
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
    from runtime.table import TableConfig

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
