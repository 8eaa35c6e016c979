"""Merge-on-read writes: updates and deletes go to new log files of their file groups (a
deltacommit), new keys to base files; every table written here is read back with hudi-rs."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import MERGE_ON_READ
from runtime.table.logfile import DELETE, PARQUET_DATA, delete_records, deleted_keys, parse_name, read_blocks

CONFIG = TableConfig(name="orders", table_type=MERGE_ON_READ, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
SCHEMA = "id long, region string, ts long, v string"


def hudi_rows(path, **incremental):
    t = hudi.HudiTableBuilder.from_base_uri(path).build()
    if incremental:
        batches = t.read(hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental).with_start_timestamp(incremental["since"]))
    else:
        batches = t.read()
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return sorted((r["id"], r["region"], r["ts"], r["v"]) for r in rows)


def pipe_rows(table, **read):
    return sorted((r["id"], r["region"], r["ts"], r["v"]) for r in table.read(**read).collect())


def logs(root):
    """The table's log files (not the markers naming them under .hoodie/.temp)."""
    return sorted(p for p in root.rglob(".*.log.*") if ".hoodie" not in p.relative_to(root).parts)


def deltacommit(root, instant):
    return json.loads((root / ".hoodie" / f"{instant}.deltacommit").read_text())


def readers_agree(table, path) -> None:
    """pipe's reader and hudi-rs see the same rows: the snapshot, and the incremental read
    after every completed write instant."""
    assert pipe_rows(table) == hudi_rows(str(path)), "snapshot"
    instants = [i.time for i in table.timeline().completed()]
    for since in instants[:-1]:
        assert pipe_rows(table, since=since) == hudi_rows(str(path), since=since), f"incremental after {since}"


@pytest.fixture()
def orders(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    first = table.write(spark.createDataFrame([(i, "EU" if i % 2 else "US", 1, f"v{i}") for i in range(1, 9)], SCHEMA), "upsert")
    yield table, path, first
    readers_agree(table, path)  # whatever the test did, both readers agree on the table it left


def test_updates_and_deletes_go_to_log_files_named_with_the_base_instant(spark, orders):
    table, path, first = orders
    assert first.action == "deltacommit" and first.inserts == 8
    assert logs(path) == [] and len(list(path.rglob("*.parquet"))) == 2  # new keys: base files

    second = table.write(spark.createDataFrame([(1, "EU", 2, "one"), (2, "US", 2, "two")], SCHEMA), "upsert")
    assert (second.action, second.updates, second.inserts) == ("deltacommit", 2, 0)
    written = logs(path)
    assert len(written) == 2
    for log in written:
        name = parse_name(log.name)
        assert name.base_instant == first.instant and name.version == 1
        blocks = read_blocks(log.read_bytes())
        assert [b.type for b in blocks] == [PARQUET_DATA]
        assert blocks[0].instant == second.instant
    assert len(list(path.rglob("*.parquet"))) == 2  # no base file was rewritten

    third = table.write(spark.createDataFrame([(3, "EU"), (2, "US")], "id long, region string"), "delete")
    assert (third.deletes, third.updates) == (2, 0)
    new = sorted(set(logs(path)) - set(written))
    assert [parse_name(p.name).version for p in new] == [2, 2]  # the next version of each slice
    for log in new:
        (block,) = read_blocks(log.read_bytes())
        assert block.type == DELETE and block.instant == third.instant
        assert [k for k, _, _ in deleted_keys(block)] in (["3"], ["2"])

    expected = [(1, "EU", 2, "one"), (4, "US", 1, "v4"), (5, "EU", 1, "v5"), (6, "US", 1, "v6"), (7, "EU", 1, "v7"), (8, "US", 1, "v8")]
    assert hudi_rows(str(path)) == expected
    assert pipe_rows(table) == expected
    # incrementally after the first commit: the update of 1 (2 was deleted)
    assert hudi_rows(str(path), since=first.instant) == [(1, "EU", 2, "one")]
    assert pipe_rows(table, since=first.instant) == [(1, "EU", 2, "one")]
    # as of the second deltacommit: 2 and 3 are still there
    assert pipe_rows(table, as_of=second.instant) == sorted(expected + [(2, "US", 2, "two"), (3, "EU", 1, "v3")])


def test_rolling_back_a_deltacommit_deletes_its_logs(spark, orders):
    table, path, first = orders
    second = table.write(spark.createDataFrame([(1, "EU", 2, "one")], SCHEMA), "upsert")
    assert len(logs(path)) == 1
    table.rollback(second.instant)
    assert logs(path) == []
    before = sorted((i, "EU" if i % 2 else "US", 1, f"v{i}") for i in range(1, 9))
    assert hudi_rows(str(path)) == before and pipe_rows(table) == before
    # the next write takes log version 1 again
    table.write(spark.createDataFrame([(1, "EU", 3, "again")], SCHEMA), "upsert")
    assert [parse_name(p.name).version for p in logs(path)] == [1]
    assert (1, "EU", 3, "again") in hudi_rows(str(path))


def test_the_deltacommit_lists_each_log_with_its_slice(spark, orders):
    table, path, first = orders
    second = table.write(spark.createDataFrame([(1, "EU", 2, "one")], SCHEMA), "upsert")
    meta = deltacommit(path, second.instant)
    assert meta["operationType"] == "UPSERT" and meta["compacted"] is False
    (stat,) = meta["partitionToWriteStats"]["region=EU"]
    log = logs(path)[0]
    base = next((path / "region=EU").glob("*.parquet")).name
    assert stat["path"] == f"region=EU/{log.name}"
    assert stat["baseFile"] == base and stat["logFiles"] == [log.name] and stat["logVersion"] == 1
    assert stat["prevCommit"] == first.instant and stat["numUpdateWrites"] == 1
    assert stat["fileSizeInBytes"] == os.path.getsize(log)
    assert "schema" in meta["extraMetadata"]

    third = table.write(spark.createDataFrame([(1, "EU", 3, "again")], SCHEMA), "upsert")
    (stat,) = deltacommit(path, third.instant)["partitionToWriteStats"]["region=EU"]
    assert len(stat["logFiles"]) == 2 and stat["logFiles"][0] == log.name and stat["logVersion"] == 2


def test_a_stale_update_never_hides_the_newer_row(spark, orders):
    table, path, _ = orders
    table.write(spark.createDataFrame([(1, "EU", 5, "newer")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "EU", 3, "older")], SCHEMA), "upsert")
    assert (1, "EU", 5, "newer") in hudi_rows(str(path))


def test_a_stale_delete_row_never_deletes_the_newer_version_in_a_log(spark, orders):
    table, path, _ = orders
    table.write(spark.createDataFrame([(1, "EU", 5, "newer")], SCHEMA), "upsert")
    stale = spark.createDataFrame([(1, "EU", 3, "x", True)], SCHEMA + ", _hoodie_is_deleted boolean")
    assert table.write(stale, "upsert").deletes == 0  # older than the version in the log: dropped
    assert (1, "EU", 5, "newer") in hudi_rows(str(path)) and (1, "EU", 5, "newer") in pipe_rows(table)
    table.write(spark.createDataFrame([(1, "EU", 6, "x", True)], SCHEMA + ", _hoodie_is_deleted boolean"), "upsert")
    (block,) = [b for p in logs(path) for b in read_blocks(p.read_bytes()) if b.type == DELETE]
    (record,) = delete_records(block)
    assert (record.record_key, record.ordering.type, record.ordering.value) == ("1", "long", 6)  # typed as the ts column
    assert not [r for r in hudi_rows(str(path)) if r[0] == 1] and not [r for r in pipe_rows(table) if r[0] == 1]


def test_inserts_fill_small_files_without_logs_and_rewrite_them(spark, orders):
    table, path, first = orders
    # US gets an update (a log), EU an insert into its small file (rewritten: a new base version)
    second = table.write(spark.createDataFrame([(2, "US", 2, "two"), (11, "EU", 1, "new")], SCHEMA), "upsert")
    eu = sorted(p.name for p in (path / "region=EU").glob("*.parquet"))
    assert len(eu) == 2 and eu[0].split("_")[0] == eu[1].split("_")[0]  # the same file group, twice
    assert [parse_name(p.name).base_instant for p in logs(path)] == [first.instant]
    # the US group has a log now, so it is no small file: an insert there opens a new group
    table.write(spark.createDataFrame([(12, "US", 1, "new")], SCHEMA), "upsert")
    assert len(list((path / "region=US").glob("*.parquet"))) == 2
    assert len({p.name.split("_")[0] for p in (path / "region=US").glob("*.parquet")}) == 2
    rows = hudi_rows(str(path))
    assert (2, "US", 2, "two") in rows and (11, "EU", 1, "new") in rows and (12, "US", 1, "new") in rows
    assert len(rows) == 10


def test_a_key_moving_partition_leaves_a_delete_in_its_old_group(spark, orders):
    table, path, _ = orders
    table.write(spark.createDataFrame([(1, "US", 2, "moved")], SCHEMA), "upsert")
    eu_logs = [p for p in logs(path) if p.parent.name == "region=EU"]
    assert len(eu_logs) == 1 and read_blocks(eu_logs[0].read_bytes())[0].type == DELETE
    rows = hudi_rows(str(path))
    assert (1, "US", 2, "moved") in rows and not any(r[0] == 1 and r[1] == "EU" for r in rows)


def test_a_key_moved_twice_stays_one_row(spark, orders):
    table, path, _ = orders
    table.write(spark.createDataFrame([(1, "US", 2, "moved")], SCHEMA), "upsert")  # EU -> US: a delete in EU's log
    table.write(spark.createDataFrame([(1, "US", 3, "again")], SCHEMA), "upsert")  # the index must not find 1 in EU
    table.write(spark.createDataFrame([(1, "EU", 4, "back")], SCHEMA), "upsert")
    for rows in (hudi_rows(str(path)), pipe_rows(table)):
        assert [r for r in rows if r[0] == 1] == [(1, "EU", 4, "back")]
        assert len(rows) == 8


def test_a_key_deleted_in_a_log_comes_back_with_any_precombine_value(spark, orders):
    table, path, _ = orders
    table.write(spark.createDataFrame([(2, "US", 10, "late")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(2, "US")], "id long, region string"), "delete")
    table.write(spark.createDataFrame([(2, "US", 5, "back")], SCHEMA), "upsert")  # as copy-on-write: the key was gone
    assert (2, "US", 5, "back") in hudi_rows(str(path)) and (2, "US", 5, "back") in pipe_rows(table)


CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    table = Table.open(spark, sys.argv[1])
    df = spark.createDataFrame([(1, "EU", 5, "crashed"), (3, "EU", 5, "crashed")], "id long, region string, ts long, v string")
    table.write(df, "upsert")
    print("WROTE")
""")


def test_a_writer_killed_after_writing_logs_is_rolled_back(spark, warm_python, orders):
    table, path, first = orders
    env = {**os.environ, "PIPE_FAULT": "after_files"}
    proc = warm_python.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    (dead,) = [i.time for i in table.timeline().pending()]
    (crashed_log,) = logs(path)
    assert read_blocks(crashed_log.read_bytes())[0].instant == dead  # the dead writer's log is there
    before = [(i, "EU" if i % 2 else "US", 1, f"v{i}") for i in range(1, 9)]
    assert hudi_rows(str(path)) == sorted(before)  # readers ignore it

    result = table.write(spark.createDataFrame([(5, "EU", 2, "five")], SCHEMA), "upsert")
    assert table.timeline().pending() == []
    assert not crashed_log.exists()
    (log,) = logs(path)
    assert parse_name(log.name).version == 1 and read_blocks(log.read_bytes())[0].instant == result.instant
    assert not list(path.rglob(f"*{dead}*"))
    assert hudi_rows(str(path)) == sorted([r for r in before if r[0] != 5] + [(5, "EU", 2, "five")])


def test_archiving_past_a_java_rollback_keeps_the_failed_update_hidden(spark, tmp_path):
    """The rollback fixture: a failed deltacommit's log block is hidden by a rollback block in
    its own log file. Writes that archive the timeline past both must not delete the rollback
    block's log (the failed block would then count as archived, i.e. committed)."""
    from tests.test_fixtures import rows_of, unpack

    path, expected = unpack("mor_parquet_v6_nonpartitioned_rollback", tmp_path)
    table = Table.open(spark, path)
    before = rows_of(expected["snapshot"], drop_meta=True)
    first = table.read(meta=False).limit(1)
    row = spark.createDataFrame(first.collect(), first.schema)  # not read again after later writes
    for n in range(3):
        table.write(row.withColumn("id", row["id"] * 0 + 1000 + n), "upsert", archive_min=1, archive_max=2)
    assert list((tmp_path / "v6_nonpartitioned_rollback" / ".hoodie" / "archived").glob("*.rollback"))  # archived past the rollback
    # the rollback block's log file is Java's record that the failed blocks do not count: it stays
    assert "2_1-0-1" in [p.name.split(".log.")[1] for p in (tmp_path / "v6_nonpartitioned_rollback").glob(".*.log.*")]
    t = hudi.HudiTableBuilder.from_base_uri(path).build()
    ids = sorted(r["id"] for b in t.read() for r in b.to_pylist())
    assert ids == sorted([r["id"] for r in before] + [1000, 1001, 1002])
    ours = rows_of(table.read(meta=False).where("id < 1000").toArrow())
    assert ours == before


@pytest.mark.parametrize("ts_type, versions", [
    ("bigint", (1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002)),  # epoch millis
    ("int", (100, 200, 300)),  # a version number
    ("timestamp", ("2024-01-01 00:00:00", "2024-02-01 00:00:00", "2024-03-01 00:00:00")),
    ("double", (1.5, 2.5, 3.5)),
    ("string", ("2024-01-01", "2024-02-01", "2024-03-01")),
])
def test_typed_deletes_of_every_precombine_type_are_read_by_hudi_rs(spark, tmp_path, ts_type, versions):
    # hudi-rs decodes delete blocks with Java's wrapper union: an unwrapped long or int failed
    # ("varint overflow", "bad varint") and made the whole table unreadable
    config = TableConfig(name="events", table_type=MERGE_ON_READ, record_key_fields=("id", "region"), partition_fields=("region",),
                         precombine_field="ts")
    table = Table.create(spark, str(tmp_path / "events"), config)
    schema = f"id long, region string, ts {ts_type}, v string"
    cast = (lambda v: __import__("datetime").datetime.fromisoformat(v)) if ts_type == "timestamp" else (lambda v: v)  # noqa: E731
    first, second, third = (cast(v) for v in versions)
    table.write(spark.createDataFrame([(i, "EU/west", first, "new") for i in (1, 2, 3, 4)], schema), "upsert")
    table.write(spark.createDataFrame([(1, "EU/west", second, "updated")], schema), "upsert")
    # 1 was updated in the previous log and is deleted in this one
    table.write(spark.createDataFrame([(1, "EU/west", third, "cancelled"), (2, "EU/west", third, "cancelled")], schema), "upsert",
                delete_when="v = 'cancelled'")
    table.write(spark.createDataFrame([(3, "EU/west")], "id long, region string"), "delete")  # by key: IntWrapper(0)
    rs = hudi.HudiTableBuilder.from_base_uri(str(tmp_path / "events")).build().read()
    assert [r["id"] for r in pa.Table.from_batches(rs).to_pylist()] == [4]
    assert [r["id"] for r in table.read().collect()] == [4]


@pytest.mark.parametrize("ts_type, versions", [
    ("bigint", (1_700_000_000_123, 1_700_000_060_456, 1_700_000_120_789)),  # epoch millis: LongWrapper
    ("timestamp", ("2024-01-01 09:30:00.125", "2024-01-02 10:00:00.5", "2024-01-03 23:59:59.999999")),  # LongWrapper (micros)
    ("int", (20240101, 20240102, 20240103)),  # IntWrapper, as the move's delete
])
def test_a_partition_move_and_typed_deletes_in_one_batch_are_read_by_hudi_rs(spark, tmp_path, ts_type, versions):
    # a key that moves partition leaves Java's IntWrapper(0) delete in its old group; hudi-rs
    # refused a delete block that also held the batch's typed deletes ("Delete block mixes
    # ordering types"), so each ordering type gets a delete block of its own
    config = TableConfig(name="payments", table_type=MERGE_ON_READ, record_key_fields=("merchant", "txn_ref"),
                         partition_fields=("day",), precombine_field="ts")
    path = tmp_path / "payments"
    table = Table.create(spark, str(path), config)
    schema = f"merchant string, txn_ref string, day string, ts {ts_type}, amount decimal(12,2), status string"
    cast = (lambda v: __import__("datetime").datetime.fromisoformat(v)) if ts_type == "timestamp" else (lambda v: v)  # noqa: E731
    first, second, third = (cast(v) for v in versions)
    from decimal import Decimal

    table.write(spark.createDataFrame([("Café Zoë", f"T-{i}", "2024-01-01", first, Decimal(f"{i}.50"), "ok") for i in range(1, 7)], schema),
                "upsert")
    table.write(spark.createDataFrame([("Café Zoë", "T-1", "2024-01-01", second, Decimal("1.75"), "ok")], schema), "upsert")  # a log
    table.write(spark.createDataFrame([
        ("Café Zoë", "T-1", "2024-01-02", third, Decimal("1.75"), "ok"),  # moves day: IntWrapper(0) delete in 2024-01-01
        ("Café Zoë", "T-2", "2024-01-01", third, Decimal("2.50"), "void"),  # typed deletes in the same group
        ("Café Zoë", "T-3", "2024-01-01", third, Decimal("3.50"), "void"),
    ], schema), "upsert", delete_when="status = 'void'")
    old_day = [p for p in logs(path) if p.parent.name == "day=2024-01-01"]
    kinds = {d.ordering.type for p in old_day for b in read_blocks(p.read_bytes()) if b.type == DELETE for d in delete_records(b)}
    assert kinds == ({"int"} if ts_type == "int" else {"int", "long"})
    expected = [("T-1", "day=2024-01-02"), ("T-4", "day=2024-01-01"), ("T-5", "day=2024-01-01"), ("T-6", "day=2024-01-01")]
    rs = pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()).to_pylist()
    assert sorted((r["txn_ref"], r["_hoodie_partition_path"]) for r in rs) == expected
    assert sorted((r["txn_ref"], r["_hoodie_partition_path"]) for r in table.read().collect()) == expected
