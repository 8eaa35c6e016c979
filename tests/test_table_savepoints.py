"""Savepoints, restore and rollback of completed writes, and cleaning/archiving that keeps what
savepoints and incremental consumers need. Every result is read back with hudi-rs as well."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableError
from runtime.table import avro
from runtime.table.services import archived_instants
from tests.test_table_services import CONFIG, hudi_rows


def our_rows(table, **kw):
    return sorted((r["id"], r["v"]) for r in table.read(**kw).collect())


def write(spark, table, v, ids=(1, 2), operation="upsert", **kw):
    rows = [(i, "a" if i % 2 else "b", v) for i in ids]
    return table.write(spark.createDataFrame(rows, "id long, p string, v long"), operation, **kw)


def hoodie_files(path, suffix):
    return sorted(f for f in os.listdir(os.path.join(path, ".hoodie")) if f.endswith(suffix))


def test_savepoint_keeps_its_files_and_restore_returns_the_table_to_it(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    first = write(spark, table, 0, clean_retain=1).instant
    kept = write(spark, table, 1, clean_retain=1).instant
    assert table.savepoint(kept, user="ana", comment="before the backfill") == kept
    assert table.savepoints() == [kept]
    meta = avro.from_bytes(open(os.path.join(path, ".hoodie", f"{kept}.savepoint"), "rb").read())
    assert meta["savepointedBy"] == "ana" and meta["comments"] == "before the backfill"
    listed = {f"{p}/{n}" for p, pm in meta["partitionMetadata"].items() for n in pm["savepointDataFile"]}
    assert len(listed) == 2 and all(n.endswith(f"_{kept}.parquet") for n in listed)

    later = [write(spark, table, v, clean_retain=1).instant for v in (2, 3, 4)]
    # retain=1 cleans every older version, except the savepointed ones
    on_disk = {str(p.relative_to(path)) for p in (tmp_path / "t").rglob("*.parquet")}
    assert listed <= on_disk
    assert not any(first in f for f in on_disk)
    assert hudi_rows(path) == [(1, 4), (2, 4)]

    restore_time, undone = table.restore(kept)
    assert undone == later[::-1]  # newest first
    timeline = table.timeline()
    assert [i.time for i in timeline.completed()] == [first, kept]  # ... as far as the active timeline goes
    assert f"{restore_time}.restore" in hoodie_files(path, ".restore")
    assert not any(t in f for f in os.listdir(os.path.join(path, ".hoodie")) for t in later)
    rmeta = avro.from_bytes(open(os.path.join(path, ".hoodie", f"{restore_time}.restore"), "rb").read())
    assert rmeta["instantsToRollback"] == later[::-1]
    assert all(len(rmeta["hoodieRestoreMetadata"][t]) == 1 for t in later)
    plan = avro.from_bytes(open(os.path.join(path, ".hoodie", f"{restore_time}.restore.requested"), "rb").read())
    assert plan["savepointToRestoreTimestamp"] == kept
    assert not any(later[0] in str(p) for p in (tmp_path / "t").rglob("*.parquet"))
    assert hudi_rows(path) == [(1, 1), (2, 1)]
    assert our_rows(table) == [(1, 1), (2, 1)]

    # the table goes on from there
    write(spark, table, 9, ids=(2, 3))
    assert hudi_rows(path) == [(1, 1), (2, 9), (3, 9)]
    assert our_rows(table) == [(1, 1), (2, 9), (3, 9)]


def test_restore_is_refused_when_its_files_are_cleaned_or_a_later_savepoint_exists(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    instants = [write(spark, table, v, clean_retain=1).instant for v in range(3)]
    before = sorted(os.listdir(os.path.join(path, ".hoodie")))
    with pytest.raises(TableError, match=r"can no longer be restored: 2 of its files have been cleaned") as err:
        table.restore(instants[0])
    assert "pipe savepoint" in err.value.hint
    with pytest.raises(TableError, match="is the latest write already"):
        table.restore(instants[-1])
    with pytest.raises(TableError, match="is not a completed write"):
        table.restore("20000101000000000")

    # keep_latest_commits keeps the version before the earliest retained commit: instants[1]
    table.savepoint(instants[2])
    with pytest.raises(TableError, match=rf"instant {instants[2]} after {instants[1]} is savepointed") as err:
        table.restore(instants[1])
    assert f"pipe savepoint TABLE {instants[2]} --delete" in err.value.hint
    table.delete_savepoint(instants[2])
    assert table.savepoints() == []
    with pytest.raises(TableError, match="has no savepoint"):
        table.delete_savepoint(instants[2])
    assert sorted(os.listdir(os.path.join(path, ".hoodie"))) == before  # nothing changed
    table.restore(instants[1])
    assert hudi_rows(path) == [(1, 1), (2, 1)]


def test_rollback_of_the_latest_write_and_only_that(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    write(spark, table, 0, ids=(1, 2, 3, 4))
    second = write(spark, table, 1, ids=(1, 2)).instant
    # an insert_overwrite of partition a replaces its file group; rolling it back brings it back
    over = write(spark, table, 7, ids=(5,), operation="insert_overwrite").instant
    assert hudi_rows(path) == [(2, 1), (4, 0), (5, 7)]

    with pytest.raises(TableError, match=rf"instant {second} is not the latest write \({over} is\)") as err:
        table.rollback(second)
    assert "pipe restore" in err.value.hint
    rb = table.rollback(over)
    timeline = table.timeline()
    assert timeline.latest_completed().time == second
    assert [i.time for i in timeline.completed(("rollback",))] == [rb]
    meta = avro.from_bytes(open(os.path.join(path, ".hoodie", f"{rb}.rollback"), "rb").read())
    assert meta["commitsRollback"] == [over] and meta["totalFilesDeleted"] == 1
    assert hudi_rows(path) == [(1, 1), (2, 1), (3, 0), (4, 0)]
    assert our_rows(table) == [(1, 1), (2, 1), (3, 0), (4, 0)]

    table.savepoint()
    with pytest.raises(TableError, match=f"instant {second} is savepointed"):
        table.rollback(second)


def test_rollback_refuses_when_the_previous_version_was_cleaned(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    write(spark, table, 0)
    last = write(spark, table, 1, clean_policy="keep_latest_file_versions", clean_retain=1).instant
    with pytest.raises(TableError, match="have been cleaned"):
        table.rollback(last)
    assert hudi_rows(path) == [(1, 1), (2, 1)]


def test_archiving_stops_at_the_earliest_savepoint(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    instants = [write(spark, table, 0, clean_inline=False, archive_min=2, archive_max=3).instant]
    sp = write(spark, table, 1, clean_inline=False, archive_min=2, archive_max=3).instant
    table.savepoint(sp)
    instants += [write(spark, table, v, clean_inline=False, archive_min=2, archive_max=3).instant for v in range(2, 7)]
    archived = {i.time for i in archived_instants(table.storage)}
    assert archived == {instants[0]}  # nothing at or after the savepoint
    assert table.timeline().find(sp) is not None
    table.delete_savepoint(sp)
    table.archive(2, 3)
    assert sp in {i.time for i in archived_instants(table.storage)}
    assert hudi_rows(path) == [(1, 6), (2, 6)]


def test_an_incremental_consumer_keeps_the_commits_it_has_not_read(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    read_up_to = write(spark, table, 0, clean_retain=1).instant
    opts = dict(clean_retain=1, archive_min=1, archive_max=2, retain_from=read_up_to)
    later = [write(spark, table, v, **opts).instant for v in (1, 2, 3)]
    timeline = table.timeline()
    assert {i.time for i in timeline.completed()} == {read_up_to, *later}  # nothing archived past it
    # every version written after the checkpoint is still there: time travel and hudi-rs's
    # incremental query (which reads the files each commit wrote) both work
    assert hudi_rows(path, as_of=later[0]) == [(1, 1), (2, 1)]
    t = hudi.HudiTableBuilder.from_base_uri(path).build()
    incremental = (hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental)
                   .with_start_timestamp(read_up_to).with_end_timestamp(later[1]))
    batches = t.read(incremental)
    assert sorted((r["id"], r["v"]) for r in pa.Table.from_batches(batches).to_pylist()) == [(1, 2), (2, 2)]
    # once the consumer has caught up, the next write cleans and archives as configured
    write(spark, table, 4, clean_retain=1, archive_min=1, archive_max=2, retain_from=later[-1])
    assert len(list((tmp_path / "t/p=a").glob("*.parquet"))) == 2
    assert read_up_to in {i.time for i in archived_instants(table.storage)}


RESTORER = textwrap.dedent("""
    import sys
    from runtime.table import Table
    Table.open(None, sys.argv[1]).restore(sys.argv[2])
    print("RESTORED")
""")


def test_a_restore_that_dies_half_way_is_finished_by_the_next_writer(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    target = write(spark, table, 0).instant
    later = [write(spark, table, v, ids=(1, 2, 3)).instant for v in (1, 2)]
    env = {**os.environ, "PIPE_FAULT": "restore_undid_one"}
    proc = subprocess.run([sys.executable, "-c", RESTORER, path, target], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 77, proc.stderr[-2000:]
    # half way: the newest write is undone, readers see the one before it
    assert [i.time for i in table.timeline().completed()] == [target, later[0]]
    assert hudi_rows(path) == [(1, 1), (2, 1), (3, 1)]
    assert [i.action for i in table.timeline().pending()] == ["restore"]

    new = write(spark, table, 5, ids=(4,)).instant
    timeline = table.timeline()
    assert [i.time for i in timeline.completed()] == [target, new]
    assert [i.action for i in timeline.completed(("restore",))] == ["restore"] and timeline.pending() == []
    assert hudi_rows(path) == [(1, 0), (2, 0), (4, 5)]
    assert our_rows(table) == [(1, 0), (2, 0), (4, 5)]
