"""Compaction of merge-on-read tables: plan, run, commit; inline after N deltacommits; cleaning
the compacted slices; a compaction killed half way; schema changes; Hudi-written tables."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table import avro
from runtime.table.config import MERGE_ON_READ
from runtime.table.logfile import parse_name
from tests.test_fixtures import rows_of, unpack
from tests.test_mor_write import readers_agree

CONFIG = TableConfig(name="orders", table_type=MERGE_ON_READ, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
SCHEMA = "id long, region string, ts long, v string"


def hudi_read(path, options=None):
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    batches = t.read(options) if options is not None else t.read()
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def hudi_rows(path, options=None):
    return sorted((r["id"], r["region"], r["ts"], r["v"]) for r in hudi_read(path, options))


def pipe_rows(table, **read):
    return sorted((r["id"], r["region"], r["ts"], r["v"]) for r in table.read(**read).collect())


def logs(root):
    """The table's log files (not the markers naming them under .hoodie/.temp)."""
    return sorted(p for p in root.rglob(".*.log.*") if ".hoodie" not in p.relative_to(root).parts)


@pytest.fixture()
def orders(spark, tmp_path):
    """A merge-on-read table with an insert, an update and a delete (two slices have logs)."""
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    table.write(spark.createDataFrame([(i, "EU" if i % 2 else "US", 1, f"v{i}") for i in range(1, 9)], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "EU", 2, "one"), (2, "US", 2, "two")], SCHEMA), "upsert")
    last = table.write(spark.createDataFrame([(3, "EU")], "id long, region string"), "delete")
    yield table, path, last.instant
    readers_agree(table, path)  # whatever the test did, both readers agree on the table it left


EXPECTED = [(1, "EU", 2, "one"), (2, "US", 2, "two"), (4, "US", 1, "v4"), (5, "EU", 1, "v5"), (6, "US", 1, "v6"), (7, "EU", 1, "v7"), (8, "US", 1, "v8")]


def test_compaction_folds_logs_into_new_base_files_in_one_commit(spark, orders):
    table, path, before = orders
    assert hudi_rows(path) == EXPECTED
    commit_times = {r["id"]: r["_hoodie_commit_time"] for r in hudi_read(path)}

    instant = table.compact()
    hoodie = path / ".hoodie"
    plan = avro.from_bytes((hoodie / f"{instant}.compaction.requested").read_bytes())
    ops = sorted(plan["operations"], key=lambda o: o["partitionPath"])
    assert [o["partitionPath"] for o in ops] == ["region=EU", "region=US"]
    assert [len(o["deltaFilePaths"]) for o in ops] == [2, 1]  # EU: an update and a delete
    assert all(o["dataFilePath"].endswith(".parquet") and o["baseInstantTime"] < instant for o in ops)
    assert (hoodie / f"{instant}.compaction.inflight").read_bytes() == b""
    meta = json.loads((hoodie / f"{instant}.commit").read_text())
    assert meta["compacted"] is True and meta["operationType"] == "COMPACT"
    new_files = sorted(s["path"] for stats in meta["partitionToWriteStats"].values() for s in stats)
    assert [p.split("/")[0] for p in new_files] == ["region=EU", "region=US"]
    assert all(p.endswith(f"_{instant}.parquet") and (path / p).exists() for p in new_files)
    assert table.timeline().pending() == []

    # both readers: the same rows, which keep the commit time that wrote them
    assert hudi_rows(path) == EXPECTED
    assert pipe_rows(table) == EXPECTED
    rows = hudi_read(path)
    assert {r["id"]: r["_hoodie_commit_time"] for r in rows} == commit_times
    assert all(r["_hoodie_file_name"].endswith(f"_{instant}.parquet") for r in rows)
    # nothing was written by the compaction: an incremental read after the last deltacommit is empty
    incremental = hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental).with_start_timestamp(before)
    assert hudi_read(path, incremental) == []
    assert table.read(since=before).count() == 0
    # the old slices stay until cleaned: time travel to before the compaction still works
    assert pipe_rows(table, as_of=before) == EXPECTED
    assert table.compact() is None  # nothing left to compact


def test_cleaning_after_compaction_removes_the_old_slices_with_their_logs(spark, orders):
    table, path, _ = orders
    table.compact()
    result = table.clean(policy="keep_latest_file_versions", retain=1)
    assert result.files_deleted == 2 + 3  # two old base files and their three logs
    assert logs(path) == []
    assert len(list(path.rglob("*.parquet"))) == 2
    assert hudi_rows(path) == EXPECTED


def test_inline_compaction_after_n_deltacommits(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    first = table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "EU", 1, "b")], SCHEMA), "upsert", compact_after=2)
    assert first.compaction is None  # a deltacommit with no logs
    second = table.write(spark.createDataFrame([(1, "EU", 2, "a2")], SCHEMA), "upsert", compact_after=2)
    assert second.compaction is not None and second.compaction > second.instant
    assert logs(path) and table.timeline().completed()[-1].action == "commit"
    third = table.write(spark.createDataFrame([(2, "EU", 2, "b2")], SCHEMA), "upsert", compact_after=2)
    assert third.compaction is None  # one deltacommit since the compaction
    assert hudi_rows(path) == [(1, "EU", 2, "a2"), (2, "EU", 2, "b2")]
    readers_agree(table, path)


def test_archived_deltacommits_keep_their_log_blocks_visible(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    table.write(spark.createDataFrame([(1, "EU", 0, "v0"), (2, "EU", 0, "w0")], SCHEMA), "upsert")
    for n in range(1, 7):  # six more deltacommits, each a log in the same slice
        table.write(spark.createDataFrame([(1, "EU", n, f"v{n}")], SCHEMA), "upsert", archive_min=2, archive_max=4)
    active = table.timeline().completed()
    assert len(active) <= 4 and len(logs(path)) == 6  # most deltacommits were archived; their logs stay
    assert (path / ".hoodie/archived").is_dir() and list((path / ".hoodie/archived").glob("*.deltacommit"))
    expected = [(1, "EU", 6, "v6"), (2, "EU", 0, "w0")]
    assert hudi_rows(path) == expected
    assert pipe_rows(table) == expected
    table.compact()
    assert hudi_rows(path) == expected and pipe_rows(table) == expected
    readers_agree(table, path)


CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    Table.open(spark, sys.argv[1]).compact()
    print("COMPACTED")
""")


def test_a_compaction_killed_after_its_files_stays_pending_and_the_next_compact_finishes_it(spark, warm_python, orders):
    table, path, _ = orders
    env = {**os.environ, "PIPE_FAULT": "compaction_after_files"}
    proc = warm_python.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]
    (pending,) = table.timeline().pending()
    assert (pending.action, pending.state) == ("compaction", "inflight")
    assert list(path.rglob(f"*_{pending.time}.parquet")), "the killed compaction had written its base files"
    assert hudi_rows(path) == EXPECTED  # readers ignore the unfinished compaction
    assert pipe_rows(table) == EXPECTED

    # the next write's update goes to a log named with it (its group is under the compaction);
    # after its commit the write executes the compaction pipe scheduled (its partial files
    # replaced): no pending instant is left (issue 39 B.10)
    w = table.write(spark.createDataFrame([(9, "US", 1, "v9"), (1, "EU", 3, "uno")], SCHEMA), "upsert")
    assert w.compaction == pending.time and w.service_error is None and table.timeline().pending() == []
    assert [p.name for p in logs(path) if parse_name(p.name).base_instant == pending.time]
    assert f"{pending.time}.commit" in {p.name for p in (path / ".hoodie").iterdir()}
    expected = sorted([r for r in EXPECTED if r[0] != 1] + [(1, "EU", 3, "uno"), (9, "US", 1, "v9")])
    assert hudi_rows(path) == expected and pipe_rows(table) == expected

    table.compact()  # compacts the logs since
    assert table.timeline().pending() == []
    assert hudi_rows(path) == expected and pipe_rows(table) == expected


def test_a_write_adding_a_column_rewrites_the_groups_whose_logs_it_touches(spark, orders):
    table, path, _ = orders
    # bulk_insert adds the column (new groups only); the upsert after it reaches a slice with logs
    table.write(spark.createDataFrame([(20, "EU", 1, "twenty", "n20")], SCHEMA + ", note string"), "bulk_insert")
    table.write(spark.createDataFrame([(5, "EU", 3, "five", "note")], SCHEMA + ", note string"), "upsert")
    rows = {r["id"]: r for r in hudi_read(path)}
    assert rows[5]["note"] == "note" and rows[5]["v"] == "five"
    assert rows[1]["note"] is None and rows[1]["v"] == "one"  # an update from a log, now in the rewritten base
    assert 3 not in rows and rows[20]["note"] == "n20"  # the delete in the log still holds
    assert len(rows) == len(EXPECTED) + 1
    assert not [i for i in table.timeline().completed() if i.action == "commit"]  # no compaction was needed
    eu = [p for p in logs(path) if p.parent.name == "region=EU"]
    assert eu and all(parse_name(p.name).base_instant < table.timeline().completed()[-1].time for p in eu)  # the old slice's
    assert sorted((r["id"], r["region"], r["ts"], r["v"]) for r in hudi_read(path)) == pipe_rows(table)


def test_a_widened_column_is_not_narrowed_in_logs(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    narrow = "id long, region string, ts long, v string, qty int"
    table.write(spark.createDataFrame([(1, "EU", 1, "a", 1), (2, "EU", 1, "b", 2)], narrow), "upsert")
    table.write(spark.createDataFrame([(1, "EU", 2, "a2", 3)], narrow), "upsert")  # a log
    big = 2**40
    table.write(spark.createDataFrame([(2, "EU", 2, "b2", big)], "id long, region string, ts long, v string, qty long"), "upsert")
    rows = {r["id"]: r for r in hudi_read(path)}
    assert rows[2]["qty"] == big and rows[1]["qty"] == 3 and rows[1]["v"] == "a2"
    assert {r["id"]: r["qty"] for r in table.read().collect()} == {1: 3, 2: big}
    readers_agree(table, path)


def test_rolling_back_a_compaction_leaves_no_pending_instant(spark, orders):
    table, path, _ = orders
    instant = table.compact()
    table.rollback(instant)
    assert table.timeline().pending() == []
    assert not list((path / ".hoodie").glob(f"{instant}.*"))
    assert hudi_rows(path) == EXPECTED and pipe_rows(table) == EXPECTED


def test_compacting_a_table_hudi_wrote(spark, tmp_path):
    path, expected = unpack("mor_parquet_v6_simplekeygen_nonhivestyle", tmp_path)
    table = Table.open(spark, path)
    instant = table.compact()
    assert instant is not None
    assert rows_of(hudi_read(path), drop_meta=True) == rows_of(expected["snapshot"], drop_meta=True)
    assert not [r for r in hudi_read(path) if not r["_hoodie_file_name"].endswith(f"_{instant}.parquet") and r["_hoodie_partition_path"] == "10"]


# --- in a project: pipe run, pipe compact, pipe timeline ------------------------------------------

PROJECT = {
    "sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, status STRING, ts BIGINT"
        """,
    "tables/orders.yml": """
        tables:
          orders:
            type: merge_on_read
            key: [order_id]
            precombine: ts
            compaction: {inline: false}
          totals:
            key: [status]
        """,
    "tables/orders.sql": "select order_id, status, ts from {{ source('raw') }}\n",
    "tables/totals.sql": "select status, count(*) as n from {{ ref('orders') }} group by status\n",
}


def test_a_merge_on_read_table_in_a_project(spark, tmp_path, capsys):
    from tests.test_run import assert_clean, assert_rows, pipe, project, run_ok, timeline, write_jsonl

    root = project(tmp_path, PROJECT)
    write_jsonl(root / "data/orders/1.json", [{"order_id": i, "status": "new", "ts": 1} for i in range(1, 5)])
    run_ok(capsys, root)
    write_jsonl(root / "data/orders/2.json", [{"order_id": 1, "status": "paid", "ts": 2}, {"order_id": 2, "status": "paid", "ts": 2}])
    run_ok(capsys, root)
    expected = [(1, "paid", 2), (2, "paid", 2), (3, "new", 1), (4, "new", 1)]
    assert_rows(spark, root, "orders", ["order_id", "status", "ts"], expected)
    assert_rows(spark, root, "totals", ["status", "n"], [("new", 2), ("paid", 2)])  # read through the merge
    assert [i["action"] for i in timeline(capsys, root, "orders") if i["state"] == "completed"] == ["deltacommit", "deltacommit"]
    assert list((root / "lake/orders").rglob(".*.log.*"))

    code, out, err = pipe(capsys, root, "compact", "orders")
    assert code == 0, err
    assert_clean(out, err)
    assert "compacted orders: 1 file group(s), 1 log file(s) folded into new base files" in out
    instants = [i for i in timeline(capsys, root, "orders") if i["state"] == "completed"]
    assert [(i["action"], i.get("operation")) for i in instants][-1] == ("commit", "COMPACT")
    assert_rows(spark, root, "orders", ["order_id", "status", "ts"], expected)
    code, out, err = pipe(capsys, root, "compact", "orders")
    assert code == 0 and "nothing to compact in orders" in out

    code, out, err = pipe(capsys, root, "compact", "totals")
    assert code == 1 and "copy-on-write" in err
    assert_clean(out, err)


def test_pipe_run_compacts_inline_when_due(spark, tmp_path, capsys):
    from tests.test_run import assert_rows, project, run_ok, timeline, write_jsonl

    files = dict(PROJECT)
    files["tables/orders.yml"] = """
        tables:
          orders:
            type: merge_on_read
            key: [order_id]
            precombine: ts
            compaction: {max_delta_commits: 2}
        """
    del files["tables/totals.sql"]
    root = project(tmp_path, files)
    write_jsonl(root / "data/orders/1.json", [{"order_id": 1, "status": "new", "ts": 1}, {"order_id": 2, "status": "new", "ts": 1}])
    out, _ = run_ok(capsys, root)
    assert "compacted" not in out
    write_jsonl(root / "data/orders/2.json", [{"order_id": 1, "status": "paid", "ts": 2}])
    out, _ = run_ok(capsys, root)
    assert "compacted (commit " in out
    actions = [(i["action"], i.get("operation")) for i in timeline(capsys, root, "orders") if i["state"] == "completed"]
    assert actions == [("deltacommit", "UPSERT"), ("deltacommit", "UPSERT"), ("commit", "COMPACT")]
    assert_rows(spark, root, "orders", ["order_id", "status", "ts"], [(1, "paid", 2), (2, "new", 1)])


# --- issue 39 B.9: a compaction while a run writes is no conflict unless it rewrote the same file group ---


def test_a_compaction_between_reading_the_input_and_writing_is_no_conflict(spark, orders):
    """`pipe compact` while `pipe run` reads its input: the run's write (based on the latest
    write it read) went on failing as 'another run wrote it meanwhile'. A compaction brings
    no data; another writer's commit does, and is named."""
    from runtime.steps.context import stored
    from runtime.table.errors import TableError

    table, path, last = orders
    based_on = stored(table).based_on  # what `pipe run` notes when it reads its input
    assert based_on == last
    compacted = Table.open(spark, str(path)).compact()  # `pipe compact`, from another process
    assert compacted > last
    table.write(spark.createDataFrame([(2, "US", 3, "two-3"), (9, "EU", 3, "nine")], SCHEMA), "upsert", expect_latest=based_on)
    expected = sorted([r for r in EXPECTED if r[0] != 2] + [(2, "US", 3, "two-3"), (9, "EU", 3, "nine")])
    assert pipe_rows(table) == hudi_rows(path) == expected

    based_on = stored(table).based_on
    other = Table.open(spark, str(path)).write(spark.createDataFrame([(4, "US", 4, "four-4")], SCHEMA), "upsert")
    with pytest.raises(TableError) as err:
        table.write(spark.createDataFrame([(4, "US", 5, "four-5")], SCHEMA), "upsert", expect_latest=based_on)
    assert f"its latest write is now deltacommit {other.instant} (UPSERT), by another writer" in str(err.value)
    assert "nothing was written" in str(err.value) and err.value.hint.startswith("run again")
    assert (4, "US", 4, "four-4") in hudi_rows(path)


def _async_compactor(spark, table, path, slices, done):
    """A compaction of `slices` scheduled and executed by a compactor that does not take pipe's
    lock (Java's async compaction), staged at a point of pipe's write."""
    from runtime.table import compaction as C
    from runtime.table.timeline import COMPACTION, REQUESTED, Instant

    def run():
        other = Table.open(spark, str(path))
        other._owner = table._owner  # it ignores pipe's lock, which the writer holds
        timeline = other.timeline()
        inst = Instant(timeline.new_instant_time(), COMPACTION, REQUESTED)
        other.storage.write_atomic(f".hoodie/{inst.file_name()}", avro.to_bytes(avro.COMPACTION_PLAN, C.plan(slices)))
        done.append(other._execute_compaction(timeline, inst, slices))
    return run


def test_a_compaction_of_other_file_groups_during_a_write_is_no_conflict_and_of_its_own_is_named(spark, orders):
    from runtime.table import services
    from runtime.table.errors import TableError

    table, path, _ = orders
    groups = {s.partition.rpartition("=")[2]: s for s in table.view().latest_slices()}
    done: list[str] = []
    services.HOOKS["after_files"] = _async_compactor(spark, table, path, [groups["EU"]], done)
    try:  # the write updates US rows only; EU's group is compacted meanwhile
        w = table.write(spark.createDataFrame([(2, "US", 3, "two-3"), (4, "US", 3, "four-3")], SCHEMA), "upsert")
    finally:
        services.HOOKS.clear()
    assert done and done[0] > w.instant and not table.timeline().pending()
    expected = sorted([r for r in EXPECTED if r[0] not in (2, 4)] + [(2, "US", 3, "two-3"), (4, "US", 3, "four-3")])
    assert pipe_rows(table) == hudi_rows(path) == expected

    groups = {s.partition.rpartition("=")[2]: s for s in table.view().latest_slices()}
    services.HOOKS["after_files"] = _async_compactor(spark, table, path, [groups["US"]], done)
    try:  # now the US group the write appends to is compacted meanwhile
        with pytest.raises(TableError) as err:
            table.write(spark.createDataFrame([(6, "US", 4, "six-4")], SCHEMA), "upsert")
    finally:
        services.HOOKS.clear()
    message = str(err.value)
    assert f"file group {groups['US'].file_id} in partition 'region=US'" in message and f"changed by compaction {done[1]}" in message
    assert "nothing was committed" in message and "Run compactions and cleans between runs" in err.value.hint
    assert not table.timeline().pending()  # the failed write was rolled back
    assert pipe_rows(table) == hudi_rows(path) == expected
