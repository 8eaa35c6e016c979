"""pipe on tables a Java Hudi writer shares: pending async compactions (read across, executed,
never rolled back), write markers and rollback command blocks, heartbeats of live writers, and
the timeline time zone. Java's states are built on disk as Hudi 0.15 leaves them."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import textwrap
import time

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table import avro
from runtime.table import compaction as C
from runtime.table import logfile as L
from runtime.table.config import MERGE_ON_READ
from runtime.table.errors import TableError
from runtime.table.timeline import Timeline, new_instant_time

CONFIG = TableConfig(name="trips", table_type=MERGE_ON_READ, record_key_fields=("trip_id", "city"), partition_fields=("city",),
                     precombine_field="ts_ms")
SCHEMA = "trip_id long, city string, ts_ms long, fare decimal(10,2), note string"
MS = 1_700_000_000_000  # epoch millis, as event times are


def row(trip, city, ts, fare, note):
    import decimal

    return (trip, city, MS + ts, decimal.Decimal(fare), note)


def pipe_rows(table):
    return sorted((r["trip_id"], r["city"], r["ts_ms"] - MS, str(r["fare"]), r["note"]) for r in table.read(meta=False).collect())


def hudi_rows(path):
    batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return sorted((r["trip_id"], r["city"], r["ts_ms"] - MS, str(r["fare"]), r["note"]) for r in rows)


def timeline_files(path):
    return sorted(p.name for p in (path / ".hoodie").iterdir() if p.is_file())


def next_instant(table) -> str:
    return new_instant_time(table.timeline().last_time())


def schedule_compaction(table) -> str:
    """What a Java writer with hoodie.compact.schedule.inline=true leaves: a requested
    compaction plan over the latest slices (base file and logs so far)."""
    timeline = table.timeline()
    t = next_instant(table)
    slices = table.view(timeline).latest_slices()
    table.storage.write_atomic(f".hoodie/{t}.compaction.requested", avro.to_bytes(avro.COMPACTION_PLAN, java_plan(slices)))
    return t


def java_plan(slices) -> dict:
    """A compaction plan as Java schedules it: pipe's, without the mark of a plan pipe scheduled."""
    return {**C.plan(slices), "extraMetadata": None}


@pytest.fixture()
def trips(spark, tmp_path):
    path = tmp_path / "trips"
    table = Table.create(spark, str(path), CONFIG)
    table.write(spark.createDataFrame([row(1, "São Paulo", 1, "10.50", "a"), row(2, "São Paulo", 1, "7.25", "b")], SCHEMA), "upsert")
    return table, path


# --- #2: Java's pending async compaction -----------------------------------------------------------


def test_logs_named_with_a_pending_compaction_are_read_and_the_compaction_survives_a_write(spark, trips):
    """Java (v6) names the log of a deltacommit D made after compaction T was scheduled with T.
    Readers merge it into the slice before T; pipe's next write keeps T and its plan."""
    table, path = trips
    t = next_instant(table)  # the compaction's instant, before D's
    d = table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert").instant
    b = table.timeline().completed()[0].time
    # the plan covers the slice as it was at T: the base file, no log yet
    (sl,) = table.view().latest_slices()
    plan = java_plan([type(sl)(sl.partition, sl.file_id, sl.base_file)])
    table.storage.write_atomic(f".hoodie/{t}.compaction.requested", avro.to_bytes(avro.COMPACTION_PLAN, plan))
    (log,) = path.rglob(".*.log.*")
    java_name = log.name.replace(f"_{b}.log.1_", f"_{t}.log.1_")
    log.rename(log.with_name(java_name))
    meta = json.loads((path / ".hoodie" / f"{d}.deltacommit").read_text())
    for stats in meta["partitionToWriteStats"].values():
        for st in stats:
            st.update(path=st["path"].replace(log.name, java_name), prevCommit=t, baseFile="", logFiles=[java_name])
    (path / ".hoodie" / f"{d}.deltacommit").write_text(json.dumps(meta))

    expected = [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 1, "7.25", "b")]
    assert pipe_rows(table) == expected

    table.write(spark.createDataFrame([row(2, "São Paulo", 3, "8.00", "b3")], SCHEMA), "upsert")
    expected = [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 3, "8.00", "b3")]
    assert f"{t}.compaction.requested" in timeline_files(path)  # never rolled back, its plan kept
    assert not [n for n in timeline_files(path) if n.endswith(".rollback")]
    named = sorted(L.parse_name(p.name).base_instant for p in path.rglob(".*.log.*"))
    assert named == [t, t]  # pipe's new log is named with the pending compaction, as Java's are
    assert pipe_rows(table) == expected
    # hudi-rs 0.5.0 leaves out logs named with a pending compaction (as the audit found): it
    # reads the slice before T alone until the compaction completes
    assert hudi_rows(path) == [(1, "São Paulo", 1, "10.50", "a"), (2, "São Paulo", 1, "7.25", "b")]
    assert table.compact() > t  # the pending compaction first, then one over its slice's logs
    assert f"{t}.commit" in timeline_files(path) and table.timeline().pending() == []
    assert pipe_rows(table) == expected and hudi_rows(path) == expected


def test_compact_executes_a_pending_java_plan_and_later_logs_stay_with_its_base_file(spark, trips):
    table, path = trips
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")  # a log in the plan
    t = schedule_compaction(table)
    table.write(spark.createDataFrame([row(2, "São Paulo", 3, "8.00", "b3"), row(3, "São Paulo", 3, "1.00", "c")], SCHEMA), "upsert")
    expected = [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 3, "8.00", "b3"), (3, "São Paulo", 3, "1.00", "c")]
    assert pipe_rows(table) == expected

    last = table.compact()  # the pending plan is executed under its own instant, then the logs since
    assert last > t and f"{t}.commit" in timeline_files(path) and table.timeline().pending() == []
    (base,) = [p for p in path.rglob(f"*_{t}.parquet") if not p.name.startswith(".")]
    # T's base file holds what its plan named (the base file and the log before T), not the
    # update written after T, which stayed in a log named with T
    import pyarrow.parquet as pq

    compacted = sorted((r["trip_id"], r["note"]) for r in pq.read_table(base).to_pylist())
    assert compacted == [(1, "a2"), (2, "b")]
    assert pipe_rows(table) == expected
    assert hudi_rows(path) == expected


def test_a_pending_plan_pipe_cannot_execute_is_refused_and_kept(spark, trips):
    table, path = trips
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    t = schedule_compaction(table)
    (log,) = path.rglob(".*.log.*")
    log.unlink()  # the plan names a log that is gone
    with pytest.raises(TableError) as err:
        table.compact()
    assert f"pending compaction {t}" in str(err.value) and log.name in str(err.value)
    assert "never rolls back a pending compaction" in err.value.hint
    assert f"{t}.compaction.requested" in timeline_files(path) and f"{t}.compaction.inflight" not in timeline_files(path)


# --- #11: heartbeats --------------------------------------------------------------------------------


def java_pending_deltacommit(table, path) -> str:
    t = next_instant(table)
    (path / ".hoodie" / f"{t}.deltacommit.requested").write_bytes(b"")
    (path / ".hoodie" / f"{t}.deltacommit.inflight").write_bytes(b"")
    return t


def test_a_live_java_write_is_not_rolled_back_and_an_expired_one_is(spark, trips):
    table, path = trips
    t = java_pending_deltacommit(table, path)
    beat = path / ".hoodie" / ".heartbeat" / t
    beat.parent.mkdir(exist_ok=True)
    beat.write_bytes(b"")  # Java's heartbeat: an empty file, rewritten every 60 s
    before = timeline_files(path)
    with pytest.raises(TableError) as err:
        table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    assert f"instant {t} (deltacommit, inflight)" in str(err.value) and "another writer" in str(err.value)
    assert "heartbeat expires 120 s" in err.value.hint
    assert timeline_files(path) == before  # nothing rolled back, nothing written

    old = time.time() - 121  # two missed beats: the writer is dead
    os.utime(beat, (old, old))
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    assert f"{t}.deltacommit.inflight" not in timeline_files(path)
    assert pipe_rows(table) == [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 1, "7.25", "b")]


def test_a_heartbeat_dated_in_the_future_does_not_block_rollback_forever(spark, trips):
    """Java's expiry test (now - last beat > 120 s) never expires a beat from the future: a
    heartbeat touched to 2099 kept every later write out. One dated more than a beat interval
    ahead (clock skew between hosts is allowed for) is not trusted: its writer is dead."""
    table, path = trips
    t = java_pending_deltacommit(table, path)
    beat = path / ".hoodie" / ".heartbeat" / t
    beat.parent.mkdir(exist_ok=True)
    beat.write_bytes(b"")
    skewed = time.time() + 30  # another host's clock a little ahead: still a live writer
    os.utime(beat, (skewed, skewed))
    with pytest.raises(TableError, match=f"instant {t} .* another writer"):
        table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")

    future = dt.datetime(2099, 12, 31, 23, 59, tzinfo=dt.timezone.utc).timestamp()
    os.utime(beat, (future, future))
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    assert f"{t}.deltacommit.inflight" not in timeline_files(path) and not beat.exists()
    assert pipe_rows(table) == hudi_rows(path) == [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 1, "7.25", "b")]


def test_pending_table_services_of_java_are_not_rolled_back_but_a_clustering_blocks_writes(spark, trips):
    table, path = trips
    hoodie = path / ".hoodie"
    t1 = next_instant(table)
    (hoodie / f"{t1}.logcompaction.requested").write_bytes(b"")
    t2 = next_instant(table)
    (hoodie / f"{t2}.indexing.requested").write_bytes(b"")
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    assert {f"{t1}.logcompaction.requested", f"{t2}.indexing.requested"} <= set(timeline_files(path))
    assert not [n for n in timeline_files(path) if n.endswith(".rollback")]

    t3 = next_instant(table)
    plan = {"operationType": "CLUSTER", "clusteringPlan": None, "extraMetadata": None, "version": 1}
    (hoodie / f"{t3}.replacecommit.requested").write_bytes(avro.to_bytes(avro.REQUESTED_REPLACE_METADATA, plan))
    with pytest.raises(TableError) as err:
        table.write(spark.createDataFrame([row(2, "São Paulo", 2, "9.00", "b2")], SCHEMA), "upsert")
    assert f"pending clustering {t3}" in str(err.value) and "HoodieClusteringJob" in err.value.hint
    assert f"{t3}.replacecommit.requested" in timeline_files(path)


# --- #7 and #11: markers and pipe's own heartbeat, around a crashed write ------------------------------

CHILD = textwrap.dedent("""
    import decimal, sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    df = spark.createDataFrame([(1, "São Paulo", 1700000000005, decimal.Decimal("12.00"), "crash"),
                                (9, "Zürich", 1700000000005, decimal.Decimal("3.00"), "new")], sys.argv[2])
    Table.open(spark, sys.argv[1]).write(df, "upsert")
""")


def test_a_crashed_write_leaves_java_markers_and_a_heartbeat_then_is_rolled_back(spark, warm_python, trips):
    table, path = trips
    env = {**os.environ, "PIPE_FAULT": "after_files"}
    proc = warm_python.run([sys.executable, "-c", CHILD, str(path), SCHEMA], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    (pending,) = table.timeline().pending()
    t = pending.time
    # every data file the dead write made has the marker Java's MarkerBasedRollbackStrategy reads
    made = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".hoodie" not in p.parts
                  and (p.name.endswith(f"_{t}.parquet") or (".log." in p.name and L.written_by(table.storage, str(p.relative_to(path)), p.stat().st_size) == t)))
    marker_dir = path / ".hoodie" / ".temp" / t
    marked = sorted(str(p.relative_to(marker_dir)) for p in marker_dir.rglob("*") if p.is_file())
    assert made and marked == sorted(f"{m}.marker.{'APPEND' if '.log.' in m else 'CREATE'}" for m in made)
    assert json.loads((path / ".hoodie" / ".heartbeat" / t).read_text())["writer"] == "pipe"

    # the dead pipe writer's fresh heartbeat does not block pipe (it holds the table's lock)
    table.write(spark.createDataFrame([row(2, "São Paulo", 6, "7.75", "b6")], SCHEMA), "upsert")
    assert not marker_dir.exists() and not (path / ".hoodie" / ".heartbeat" / t).exists()
    assert not list((path / ".hoodie" / ".temp").iterdir())  # the completed write's markers are gone too
    assert not list((path / ".hoodie" / ".heartbeat").iterdir())
    expected = [(1, "São Paulo", 1, "10.50", "a"), (2, "São Paulo", 6, "7.75", "b6")]
    assert pipe_rows(table) == expected and hudi_rows(path) == expected


# --- #7: a Java deltacommit that appended to a shared log --------------------------------------------


def test_rolling_back_a_java_append_to_a_shared_log_hides_its_blocks_even_after_archival(spark, trips):
    table, path = trips
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    (log,) = path.rglob(".*.log.*")
    (block,) = L.read_blocks(log.read_bytes())
    # a Java writer (HDFS) appended its block to the same log file, then died
    d2 = java_pending_deltacommit(table, path)
    rows = L.data_rows(block)
    rows = rows.set_column(rows.schema.get_field_index("_hoodie_commit_time"), "_hoodie_commit_time", pa.array([d2] * rows.num_rows))
    rows = rows.set_column(rows.schema.get_field_index("note"), "note", pa.array(["uncommitted"] * rows.num_rows))
    with open(log, "ab") as f:
        f.write(L.encode_block(L.parquet_block(d2, block.header[L.SCHEMA], rows)))
    rel = str(log.relative_to(path))
    marker = path / ".hoodie" / ".temp" / d2 / f"{rel}.marker.APPEND"
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    expected = [(1, "São Paulo", 2, "11.00", "a2"), (2, "São Paulo", 1, "7.25", "b")]
    assert pipe_rows(table) == expected

    assert table.rollback_pending() == [d2]
    assert log.exists()  # older committed blocks live in it
    (rb,) = [p for p in path.rglob(".*.log.*") if p != log]
    (cmd,) = L.read_blocks(rb.read_bytes())
    assert cmd.is_rollback and cmd.header[L.TARGET_INSTANT_TIME] == d2
    assert L.parse_name(rb.name).version == 2 and L.parse_name(rb.name).base_instant == L.parse_name(log.name).base_instant
    assert pipe_rows(table) == expected and hudi_rows(path) == expected

    # archival moves the timeline's start past d2: its blocks would count as committed now
    for i in range(4):
        table.write(spark.createDataFrame([row(5 + i, "Lyon", 1, "1.00", "x")], SCHEMA), "upsert", clean_inline=False,
                    archive_min=2, archive_max=3)
    assert Timeline.load(table.storage).instants[0].time > d2
    expected += [(5 + i, "Lyon", 1, "1.00", "x") for i in range(4)]
    assert pipe_rows(table) == sorted(expected)
    assert hudi_rows(path) == sorted(expected)


# --- #8: the timeline time zone ----------------------------------------------------------------------


@pytest.fixture()
def west_of_utc():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/Los_Angeles"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def _close(instant: str, now: dt.datetime) -> bool:
    t = dt.datetime.strptime(instant[:14], "%Y%m%d%H%M%S")
    return abs((t - now.replace(tzinfo=None, microsecond=0)).total_seconds()) < 60


def test_instants_follow_the_table_timeline_time_zone(spark, tmp_path, west_of_utc):
    pipe_table = Table.create(spark, str(tmp_path / "pipe_made"), CONFIG)
    r = pipe_table.write(spark.createDataFrame([row(1, "São Paulo", 1, "10.50", "a")], SCHEMA), "upsert")
    assert _close(r.instant, dt.datetime.now(dt.timezone.utc))  # pipe's own: UTC

    java = tmp_path / "java_made"
    table = Table.create(spark, str(java), CONFIG)
    props = java / ".hoodie" / "hoodie.properties"
    props.write_text("".join(line + "\n" for line in props.read_text().splitlines() if "timeline.timezone" not in line))
    table = Table.open(spark, str(java))  # Hudi's default: LOCAL
    r = table.write(spark.createDataFrame([row(1, "São Paulo", 1, "10.50", "a")], SCHEMA), "upsert")
    assert _close(r.instant, dt.datetime.now())  # the process's local time, hours behind UTC
    assert not _close(r.instant, dt.datetime.now(dt.timezone.utc))

    # an instant pipe made earlier in UTC is later than local now: new instants stay after it
    ahead = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=1)).strftime("%Y%m%d%H%M%S") + "000"
    (java / ".hoodie" / f"{ahead}.clean.requested").write_bytes(b"")
    assert Timeline.load(table.storage).new_instant_time() > ahead
    # ... and only in that table: another table of the same zone (this one's instants were found
    # to be UTC+0 by their files' times) keeps the clock; a floor shared by every table once put
    # a later test's pipe commits a minute ahead of Java's, which then sorted before them
    assert new_instant_time(local=True, utc_offset=dt.timedelta(0), table=str(tmp_path / "elsewhere")) < ahead


# --- issue 39 C.14: paths read from .hoodie files never leave the table ---------------------------------


def test_a_crafted_marker_list_is_refused_and_the_file_outside_the_table_survives(spark, trips, tmp_path):
    """A timeline-server marker list is plain text: `../precious.txt.marker.CREATE` in it
    would have had the rollback of the failed instant delete a file beside the table."""
    table, path = trips
    precious = tmp_path / "precious.txt"
    precious.write_text("ledger totals, 2024-06-30: 1 204 511,07 €\n")
    t = java_pending_deltacommit(table, path)
    (committed,) = [p for p in path.rglob("*.parquet")]
    made = committed.with_name(f"{committed.name.split('_')[0]}_1-0-1_{t}.parquet")  # the failed write's new version
    made.write_bytes(committed.read_bytes())
    folder = path / ".hoodie" / ".temp" / t
    folder.mkdir(parents=True)
    (folder / "MARKERS.type").write_text("TIMELINE_SERVER_BASED")
    (folder / "MARKERS0").write_text(f"{made.parent.name}/{made.name}.marker.MERGE\n../precious.txt.marker.CREATE\n")
    before = pipe_rows(table)

    with pytest.raises(TableError) as err:
        table.write(spark.createDataFrame([row(2, "São Paulo", 6, "7.75", "b6")], SCHEMA), "upsert")
    message = str(err.value)
    assert f".hoodie/.temp/{t}/MARKERS0:2" in message and "'../precious.txt'" in message and "leaves the table's folder" in message
    assert "deleted nothing" in message and "remove the bad entry" in err.value.hint
    assert precious.read_text() == "ledger totals, 2024-06-30: 1 204 511,07 €\n"
    assert made.exists() and pipe_rows(table) == before == hudi_rows(path)

    # a marker naming a committed base file of another instant, or the timeline, is refused too
    (folder / "MARKERS0").write_text(f"{committed.parent.name}/{committed.name}.marker.CREATE\n")
    with pytest.raises(TableError, match=f"is a base file of instant .*, not of {t}"):
        table.write(spark.createDataFrame([row(2, "São Paulo", 6, "7.75", "b6")], SCHEMA), "upsert")
    (folder / "MARKERS0").write_text(".hoodie/hoodie.properties.marker.CREATE\n")
    with pytest.raises(TableError, match="points into the timeline folder"):
        table.write(spark.createDataFrame([row(2, "São Paulo", 6, "7.75", "b6")], SCHEMA), "upsert")
    assert committed.exists() and (path / ".hoodie" / "hoodie.properties").exists()

    # with the list as Java writes it, the failed instant is rolled back and the write goes ahead
    (folder / "MARKERS0").write_text(f"{made.parent.name}/{made.name}.marker.MERGE\n")
    table.write(spark.createDataFrame([row(2, "São Paulo", 6, "7.75", "b6")], SCHEMA), "upsert")
    assert not made.exists() and precious.exists()
    assert pipe_rows(table) == hudi_rows(path) == [(1, "São Paulo", 1, "10.50", "a"), (2, "São Paulo", 6, "7.75", "b6")]


def test_a_compaction_plan_naming_a_partition_outside_the_table_is_refused(spark, trips, tmp_path):
    table, path = trips
    table.write(spark.createDataFrame([row(1, "São Paulo", 2, "11.00", "a2")], SCHEMA), "upsert")
    (sl,) = table.view().latest_slices()
    # a copy of the partition beside the table: executing the plan would read it and write there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for f in (path / sl.partition).iterdir():
        (elsewhere / f.name).write_bytes(f.read_bytes())
    copied = sorted(p.name for p in elsewhere.iterdir())
    t = next_instant(table)
    plan = C.plan([sl])
    plan["operations"][0]["partitionPath"] = "../elsewhere"
    table.storage.write_atomic(f".hoodie/{t}.compaction.requested", avro.to_bytes(avro.COMPACTION_PLAN, plan))

    with pytest.raises(TableError) as err:
        table.compact()
    assert f".hoodie/{t}.compaction.requested" in str(err.value) and "'../elsewhere'" in str(err.value)
    assert "leaves the table's folder" in str(err.value) and "no Hudi writer writes such a plan" in err.value.hint
    assert sorted(p.name for p in elsewhere.iterdir()) == copied  # nothing written outside
    assert f"{t}.compaction.requested" in timeline_files(path) and f"{t}.compaction.inflight" not in timeline_files(path)

    # an operation whose file group is not that of its files (a new base file would be named by it)
    plan = C.plan([sl])
    plan["operations"][0]["fileId"] = "../../x"
    table.storage.write_atomic(f".hoodie/{t}.compaction.requested", avro.to_bytes(avro.COMPACTION_PLAN, plan))
    with pytest.raises(TableError, match="operation for file group '../../x' whose files belong to"):
        table.compact()
