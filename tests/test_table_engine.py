"""The Hudi-format table engine as a user checks it: rows, instants and files after each write,
read back both by pipe's own reader and by the independent reader hudi-rs (PyPI `hudi`)."""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path

import hudi
import pyarrow.parquet as pq
import pytest

from runtime.table import Table, TableConfig, TableError, WriteError

pytestmark = pytest.mark.spark

INSTANT = re.compile(r"^\d{17}$")


# --- helpers -----------------------------------------------------------------------------------


def make_table(spark, tmp_path: Path, name: str, **config) -> tuple[Table, Path]:
    path = tmp_path / name
    return Table.create(spark, str(path), TableConfig(name, **config)), path


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _project(rows, columns) -> list[dict]:
    out = []
    for r in rows:
        missing = [c for c in columns if c not in r]
        assert not missing, f"columns {missing} are missing from row {r}"
        out.append({c: r[c] for c in columns})
    return _sorted(out)


def hudi_table(path: Path):
    return hudi.HudiTableBuilder.from_base_uri(str(path)).build()  # fresh: it pins the timeline


def pipe_rows(table: Table, columns, as_of=None, since=None, until=None) -> list[dict]:
    df = table.read(as_of=as_of, since=since, until=until)
    return _project([r.asDict() for r in df.collect()], columns)


def hudi_rows(path: Path, columns, as_of=None, since=None, until=None) -> list[dict]:
    t = hudi_table(path)
    if since is not None or until is not None:
        opts = hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental)
        if since is not None:
            opts = opts.with_start_timestamp(since)
        if until is not None:
            opts = opts.with_end_timestamp(until)
        batches = t.read(opts)
    elif as_of is not None:
        batches = t.read(hudi.HudiReadOptions().with_as_of_timestamp(as_of))
    else:
        batches = t.read()
    return _project([row for b in batches for row in b.to_pylist()], columns)


def assert_rows(table: Table, path: Path, expected: list[dict], columns=None, **read) -> None:
    """Both readers return exactly `expected` (compared on `columns`, default: expected's keys)."""
    if columns is None:
        assert expected, "give the columns when no rows are expected"
        columns = list(expected[0])
    want = _project(expected, columns)
    assert pipe_rows(table, columns, **read) == want, "pipe's reader"
    assert hudi_rows(path, columns, **read) == want, "hudi-rs"


def rows_of(ddl_columns: str, tuples) -> list[dict]:
    names = [c.strip().split()[0] for c in ddl_columns.split(",")]
    return [dict(zip(names, t)) for t in tuples]


def completed(path: Path) -> list[str]:
    return sorted(n[: -len(".commit")] for n in os.listdir(path / ".hoodie") if re.fullmatch(r"\d{17}\.commit", n))


def pending(path: Path) -> list[str]:
    times = {n.split(".")[0] for n in os.listdir(path / ".hoodie") if re.fullmatch(r"\d{17}\.(inflight|commit\.requested)", n)}
    return sorted(times - set(completed(path)))


def hudi_completed(path: Path) -> list[str]:
    return sorted(i.timestamp for i in hudi_table(path).get_timeline().get_completed_commits())


def commit_json(path: Path, instant: str) -> dict:
    commit = path / ".hoodie" / f"{instant}.commit"
    return json.loads((commit if commit.exists() else commit.with_suffix(".deltacommit")).read_text())


def write_stats(path: Path, instant: str) -> list[dict]:
    return [s for lst in commit_json(path, instant)["partitionToWriteStats"].values() for s in lst]


def slices(path: Path) -> dict[tuple[str, str], object]:
    """hudi-rs's latest file slices: (partition, file id) -> slice."""
    return {(s.partition_path, s.file_id): s for s in hudi_table(path).get_file_slices()}


def parquet_files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*.parquet") if ".hoodie" not in p.parts)


def properties(path: Path) -> dict[str, str]:
    props = {}
    for line in (path / ".hoodie" / "hoodie.properties").read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            props[k] = v
    return props


def partition_metadata(folder: Path) -> dict[str, str]:
    text = (folder / ".hoodie_partition_metadata").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


# --- 1. upsert and the precombine field -------------------------------------------------------

PRE = "id long, region string, ts long, v string"


def test_upsert_precombine_largest_wins_stale_ignored_ties_go_to_the_later_write(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "pre", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    r1 = table.write(spark.createDataFrame([
        (1, "EU", 1, "a1"), (1, "EU", 3, "a3"), (1, "EU", 2, "a2"),  # largest ts wins in the batch
        (2, "EU", 5, "b"),
        (3, "EU", 7, "c-first"), (3, "EU", 7, "c-second"),  # equal ts in one batch: the later row
        (4, "US", 5, "d"),
    ], PRE), "upsert")
    assert (r1.inserts, r1.updates, r1.deletes) == (4, 0, 0)
    cols = ["id", "region", "ts", "v", "_hoodie_commit_time", "_hoodie_record_key", "_hoodie_partition_path"]
    assert_rows(table, path, [
        {"id": 1, "region": "EU", "ts": 3, "v": "a3", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "1", "_hoodie_partition_path": "region=EU"},
        {"id": 2, "region": "EU", "ts": 5, "v": "b", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "2", "_hoodie_partition_path": "region=EU"},
        {"id": 3, "region": "EU", "ts": 7, "v": "c-second", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "3", "_hoodie_partition_path": "region=EU"},
        {"id": 4, "region": "US", "ts": 5, "v": "d", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "4", "_hoodie_partition_path": "region=US"},
    ], cols)

    r2 = table.write(spark.createDataFrame([
        (1, "EU", 2, "stale"),  # older than the stored ts=3: ignored
        (2, "EU", 5, "b-later"),  # same ts as stored: the later write wins
        (3, "EU", 8, "c-new"),  # newer
        (4, "EU", 1, "d-stale-move"),  # older: must neither update nor move the row
    ], PRE), "upsert")
    assert (r2.inserts, r2.updates, r2.deletes) == (0, 2, 0)
    assert r2.instant > r1.instant
    assert_rows(table, path, [
        {"id": 1, "region": "EU", "ts": 3, "v": "a3", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "1", "_hoodie_partition_path": "region=EU"},
        {"id": 2, "region": "EU", "ts": 5, "v": "b-later", "_hoodie_commit_time": r2.instant, "_hoodie_record_key": "2", "_hoodie_partition_path": "region=EU"},
        {"id": 3, "region": "EU", "ts": 8, "v": "c-new", "_hoodie_commit_time": r2.instant, "_hoodie_record_key": "3", "_hoodie_partition_path": "region=EU"},
        {"id": 4, "region": "US", "ts": 5, "v": "d", "_hoodie_commit_time": r1.instant, "_hoodie_record_key": "4", "_hoodie_partition_path": "region=US"},
    ], cols)
    # meta columns name the commit and the very file each row is in
    latest = {s.base_file_name for s in slices(path).values()}
    for r in hudi_rows(path, ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_file_name"]):
        assert r["_hoodie_file_name"] in latest
        assert r["_hoodie_commit_seqno"].startswith(r["_hoodie_commit_time"] + "_")
    # the US group was not touched: its latest slice is still the first commit's
    us = [s for (p, _), s in slices(path).items() if p == "region=US"]
    assert [s.creation_instant_time for s in us] == [r1.instant]


# --- 2. global and partition index ------------------------------------------------------------

IDX = "id long, region string, v string"


def test_global_index_moves_a_row_whose_partition_changed(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "glob", record_key_fields=("id",), partition_fields=("region",))
    table.write(spark.createDataFrame([(1, "EU", "a"), (2, "EU", "b"), (3, "US", "c")], IDX), "upsert")
    r2 = table.write(spark.createDataFrame([(1, "US", "a-moved")], IDX), "upsert")
    cols = ["id", "region", "v", "_hoodie_partition_path"]
    assert_rows(table, path, [
        {"id": 1, "region": "US", "v": "a-moved", "_hoodie_partition_path": "region=US"},
        {"id": 2, "region": "EU", "v": "b", "_hoodie_partition_path": "region=EU"},
        {"id": 3, "region": "US", "v": "c", "_hoodie_partition_path": "region=US"},
    ], cols)
    # the old partition's latest file no longer holds the key
    eu = [s for (p, _), s in slices(path).items() if p == "region=EU"]
    assert len(eu) == 1 and eu[0].creation_instant_time == r2.instant
    assert pq.read_table(path / eu[0].base_file_relative_path()).column("id").to_pylist() == [2]
    assert {s["partitionPath"] for s in write_stats(path, r2.instant)} == {"region=EU", "region=US"}


def test_partition_index_keeps_one_row_per_key_and_partition(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "pidx", record_key_fields=("id",), partition_fields=("region",))
    table.write(spark.createDataFrame([(1, "EU", "a")], IDX), "upsert", index="partition")
    table.write(spark.createDataFrame([(1, "US", "b")], IDX), "upsert", index="partition")
    cols = ["id", "region", "v", "_hoodie_record_key", "_hoodie_partition_path"]
    assert_rows(table, path, [
        {"id": 1, "region": "EU", "v": "a", "_hoodie_record_key": "1", "_hoodie_partition_path": "region=EU"},
        {"id": 1, "region": "US", "v": "b", "_hoodie_record_key": "1", "_hoodie_partition_path": "region=US"},
    ], cols)
    r3 = table.write(spark.createDataFrame([(1, "EU", "a2")], IDX), "upsert", index="partition")
    assert (r3.inserts, r3.updates) == (0, 1)
    assert_rows(table, path, [
        {"id": 1, "region": "EU", "v": "a2", "_hoodie_record_key": "1", "_hoodie_partition_path": "region=EU"},
        {"id": 1, "region": "US", "v": "b", "_hoodie_record_key": "1", "_hoodie_partition_path": "region=US"},
    ], cols)


# --- 3. insert -----------------------------------------------------------------------------------


def test_insert_duplicates_none_drop_fail_and_combine(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "ins", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    cols = ["id", "region", "ts", "v"]
    r1 = table.write(spark.createDataFrame([(1, "EU", 1, "a"), (1, "EU", 1, "a-dup"), (2, "EU", 1, "b")], PRE), "insert")
    assert r1.inserts == 3
    expected = rows_of(PRE, [(1, "EU", 1, "a"), (1, "EU", 1, "a-dup"), (2, "EU", 1, "b")])
    assert_rows(table, path, expected, cols)

    # default: a key already in the table is inserted again
    table.write(spark.createDataFrame([(2, "EU", 2, "b-again")], PRE), "insert")
    expected += rows_of(PRE, [(2, "EU", 2, "b-again")])
    assert_rows(table, path, expected, cols)

    # drop: keys already stored are skipped, new ones inserted
    r3 = table.write(spark.createDataFrame([(2, "EU", 3, "b-drop"), (3, "EU", 1, "c")], PRE), "insert", insert_duplicates="drop")
    assert r3.inserts == 1
    expected += rows_of(PRE, [(3, "EU", 1, "c")])
    assert_rows(table, path, expected, cols)

    # fail: raises, and commits nothing
    before = completed(path)
    files_before = parquet_files(path)
    with pytest.raises(WriteError):
        table.write(spark.createDataFrame([(3, "EU", 2, "c-fail"), (4, "EU", 1, "d")], PRE), "insert", insert_duplicates="fail")
    assert completed(path) == before
    assert hudi_completed(path) == before
    assert_rows(table, path, expected, cols)
    failed = pending(path)

    # the next write rolls the failed instant back; combine_before_insert keeps the largest ts
    r5 = table.write(spark.createDataFrame([(5, "EU", 1, "e1"), (5, "EU", 3, "e3"), (5, "EU", 2, "e2")], PRE), "insert", combine_before_insert=True)
    assert r5.inserts == 1
    assert completed(path) == before + [r5.instant]
    assert hudi_completed(path) == before + [r5.instant]
    assert pending(path) == []
    assert not [f for f in os.listdir(path / ".hoodie") if any(f.startswith(t) for t in failed)]
    assert not [f for f in parquet_files(path) if any(f.endswith(f"_{t}.parquet") for t in failed)]
    assert set(files_before) <= set(parquet_files(path))
    expected += rows_of(PRE, [(5, "EU", 3, "e3")])
    assert_rows(table, path, expected, cols)


# --- 4. bulk_insert --------------------------------------------------------------------------------


def test_bulk_insert_sort_modes_write_new_file_groups_only(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "bulk", record_key_fields=("id",), partition_fields=("region",))
    expected: list[dict] = []
    next_id = 1
    for mode in ("NONE", "GLOBAL_SORT", "PARTITION_SORT"):
        before = slices(path) if completed(path) else {}
        groups_before = set(before)
        batch = [(i, "EU" if i % 2 else "US", f"{mode}-{i}") for i in range(next_id + 5, next_id - 1, -1)]  # descending keys
        next_id += 6
        r = table.write(spark.createDataFrame(batch, IDX), "bulk_insert", bulk_insert_sort_mode=mode)
        assert (r.inserts, r.updates, r.deletes) == (6, 0, 0), mode
        stats = write_stats(path, r.instant)
        assert stats and all(s["prevCommit"] == "null" for s in stats), mode
        assert not {(s["partitionPath"], s["fileId"]) for s in stats} & groups_before, mode
        assert sum(s["numInserts"] for s in stats) == 6
        assert commit_json(path, r.instant)["operationType"] == "BULK_INSERT"
        if mode != "NONE":
            for s in stats:  # each file is sorted by key
                keys = pq.read_table(path / s["path"]).column("_hoodie_record_key").to_pylist()
                assert keys == sorted(keys), (mode, keys)
        expected += rows_of(IDX, batch)
        # every earlier group is still there, untouched
        now = slices(path)
        assert {k: now[k].base_file_name for k in before} == {k: s.base_file_name for k, s in before.items()}
        assert_rows(table, path, expected, ["id", "region", "v"])


# --- 5. deletes ------------------------------------------------------------------------------------

DEL = "id long, region string, ts long, status string"


def test_deletes_by_key_by_condition_and_is_deleted_column(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "del", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    cols = ["id", "region", "ts", "status"]
    table.write(spark.createDataFrame([(1, "EU", 1, "ok"), (2, "EU", 1, "ok"), (3, "EU", 1, "ok"), (4, "EU", 1, "ok"), (5, "US", 1, "ok"), (6, "US", 1, "ok")], DEL), "upsert")
    us_groups = {k for k in slices(path) if k[0] == "region=US"}
    assert len(us_groups) == 1

    r2 = table.write(spark.createDataFrame([(1,)], "id long"), "delete")
    assert (r2.inserts, r2.updates, r2.deletes) == (0, 0, 1)
    assert commit_json(path, r2.instant)["operationType"] == "DELETE"
    assert_rows(table, path, rows_of(DEL, [(2, "EU", 1, "ok"), (3, "EU", 1, "ok"), (4, "EU", 1, "ok"), (5, "US", 1, "ok"), (6, "US", 1, "ok")]), cols)

    r3 = table.write(spark.createDataFrame([(2, "EU", 2, "cancelled"), (7, "EU", 1, "ok"), (8, "US", 1, "cancelled")], DEL), "upsert",
                     delete_when="status = 'cancelled'")
    assert (r3.inserts, r3.deletes) == (1, 1)
    assert_rows(table, path, rows_of(DEL, [(3, "EU", 1, "ok"), (4, "EU", 1, "ok"), (5, "US", 1, "ok"), (6, "US", 1, "ok"), (7, "EU", 1, "ok")]), cols)

    r4 = table.write(spark.createDataFrame([(5, "US", 2, "ok", True), (6, "US", 2, "ok", True), (3, "EU", 2, "updated", False)],
                                           DEL + ", _hoodie_is_deleted boolean"), "upsert")
    assert (r4.updates, r4.deletes) == (1, 2)
    assert_rows(table, path, rows_of(DEL, [(3, "EU", 2, "updated"), (4, "EU", 1, "ok"), (7, "EU", 1, "ok")]), cols)
    # the US group lost every row: its latest slice holds none
    now = slices(path)
    for key in us_groups:
        if key in now:
            assert now[key].creation_instant_time == r4.instant
            assert pq.read_table(path / now[key].base_file_relative_path()).num_rows == 0
    assert hudi_rows(path, ["id"], as_of=r3.instant) == [{"id": i} for i in (3, 4, 5, 6, 7)]


# --- 6. keys and partition paths -------------------------------------------------------------------

CPX = "a long, b string, p string, v string"


def test_composite_keys_plain_paths_default_partition_and_url_encoding(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "cpx", record_key_fields=("a", "b"), partition_fields=("p",), hive_style=False)
    r1 = table.write(spark.createDataFrame([(1, "x", "EU", "v1"), (2, "y", None, "v2"), (3, "z", "a/b:c", "v3")], CPX), "upsert")
    cols = ["a", "b", "p", "v", "_hoodie_record_key", "_hoodie_partition_path"]
    assert_rows(table, path, [
        {"a": 1, "b": "x", "p": "EU", "v": "v1", "_hoodie_record_key": "a:1,b:x", "_hoodie_partition_path": "EU"},
        {"a": 2, "b": "y", "p": None, "v": "v2", "_hoodie_record_key": "a:2,b:y", "_hoodie_partition_path": "__HIVE_DEFAULT_PARTITION__"},
        {"a": 3, "b": "z", "p": "a/b:c", "v": "v3", "_hoodie_record_key": "a:3,b:z", "_hoodie_partition_path": "a%2Fb%3Ac"},
    ], cols)
    folders = sorted(p.name for p in path.iterdir() if p.name != ".hoodie")
    assert folders == ["EU", "__HIVE_DEFAULT_PARTITION__", "a%2Fb%3Ac"]
    for f in folders:
        meta = partition_metadata(path / f)
        assert meta["commitTime"] == r1.instant and meta["partitionDepth"] == "1"
    props = properties(path)
    assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.ComplexKeyGenerator"
    assert props["hoodie.table.recordkey.fields"] == "a,b"
    assert props["hoodie.datasource.write.hive_style_partitioning"] == "false"
    assert props["hoodie.compaction.payload.class"] == "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"
    assert props["hoodie.record.merge.mode"] == "COMMIT_TIME_ORDERING"
    assert "hoodie.table.precombine.field" not in props

    # the key is both columns: same a, other b is a new row; same a and b updates
    r2 = table.write(spark.createDataFrame([(1, "x", "EU", "v1b"), (1, "y", "EU", "new"), (3, "z", "a/b:c", "v3b")], CPX), "upsert")
    assert (r2.inserts, r2.updates) == (1, 2)
    assert_rows(table, path, [
        {"a": 1, "b": "x", "p": "EU", "v": "v1b", "_hoodie_record_key": "a:1,b:x", "_hoodie_partition_path": "EU"},
        {"a": 1, "b": "y", "p": "EU", "v": "new", "_hoodie_record_key": "a:1,b:y", "_hoodie_partition_path": "EU"},
        {"a": 2, "b": "y", "p": None, "v": "v2", "_hoodie_record_key": "a:2,b:y", "_hoodie_partition_path": "__HIVE_DEFAULT_PARTITION__"},
        {"a": 3, "b": "z", "p": "a/b:c", "v": "v3b", "_hoodie_record_key": "a:3,b:z", "_hoodie_partition_path": "a%2Fb%3Ac"},
    ], cols)
    assert len([k for k in slices(path) if k[0] == "a%2Fb%3Ac"]) == 1


# --- 7. non-partitioned table, time travel and incremental reads -----------------------------------

NP = "id long, v string"


def test_nonpartitioned_time_travel_and_incremental_match_hudi_rs(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "np", record_key_fields=("id",))
    r1 = table.write(spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], NP), "upsert")
    r2 = table.write(spark.createDataFrame([(2, "b2"), (4, "d")], NP), "upsert")
    r3 = table.write(spark.createDataFrame([(3,)], "id long"), "delete")
    i1, i2, i3 = r1.instant, r2.instant, r3.instant
    assert i1 < i2 < i3

    cols = ["id", "v", "_hoodie_commit_time", "_hoodie_partition_path"]
    row = lambda i, v, t: {"id": i, "v": v, "_hoodie_commit_time": t, "_hoodie_partition_path": ""}  # noqa: E731
    assert_rows(table, path, [row(1, "a", i1), row(2, "b2", i2), row(4, "d", i2)], cols)
    assert_rows(table, path, [row(1, "a", i1), row(2, "b", i1), row(3, "c", i1)], cols, as_of=i1)
    assert_rows(table, path, [row(1, "a", i1), row(2, "b2", i2), row(3, "c", i1), row(4, "d", i2)], cols, as_of=i2)
    assert_rows(table, path, [], cols, as_of="20000101000000000")  # before the first commit
    assert_rows(table, path, [row(2, "b2", i2), row(4, "d", i2)], cols, since=i1, until=i2)
    assert_rows(table, path, [row(1, "a", i1), row(2, "b2", i2), row(3, "c", i1), row(4, "d", i2)], cols, since="19700101000000000", until=i2)
    assert_rows(table, path, [], cols, since=i2, until=i3)  # a delete yields no rows

    # files sit in the base folder
    assert all("/" not in f for f in parquet_files(path))
    assert partition_metadata(path)["partitionDepth"] == "0"
    assert {s["partitionPath"] for s in write_stats(path, i1)} == {""}
    assert list(commit_json(path, i1)["partitionToWriteStats"]) == [""]
    props = properties(path)
    assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
    assert props["hoodie.table.partition.fields"] == ""


# --- 8. file sizing ----------------------------------------------------------------------------------


def test_inserts_fill_small_files_unless_small_file_limit_is_zero(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "size", record_key_fields=("id",), partition_fields=("region",))
    r1 = table.write(spark.createDataFrame([(1, "EU", "a"), (2, "EU", "b")], IDX), "insert")
    (first,) = slices(path).values()
    size = (path / first.base_file_relative_path()).stat().st_size
    assert size < 1024 * 1024  # a few rows (and the footer's 431 KB bloom filter, as Java writes it): a small file

    r2 = table.write(spark.createDataFrame([(3, "EU", "c")], IDX), "insert", max_file_size=4 * 1024 * 1024, small_file_limit=2 * 1024 * 1024)
    (second,) = slices(path).values()  # still one file group ...
    assert second.file_id == first.file_id
    assert second.creation_instant_time == r2.instant  # ... with a new base file
    assert second.base_file_name.startswith(first.file_id + "_") and second.base_file_name != first.base_file_name
    (stat,) = write_stats(path, r2.instant)
    assert (stat["fileId"], stat["prevCommit"], stat["numInserts"], stat["numWrites"]) == (first.file_id, r1.instant, 1, 3)
    assert (path / first.base_file_relative_path()).exists()  # the old slice stays for time travel

    r3 = table.write(spark.createDataFrame([(4, "EU", "d")], IDX), "insert", max_file_size=4 * 1024 * 1024, small_file_limit=0)
    now = slices(path)
    assert len(now) == 2
    (new_id,) = {fid for _, fid in now} - {first.file_id}
    assert now[("region=EU", first.file_id)].creation_instant_time == r2.instant
    (stat,) = write_stats(path, r3.instant)
    assert (stat["fileId"], stat["prevCommit"], stat["numInserts"]) == (new_id, "null", 1)
    assert_rows(table, path, rows_of(IDX, [(1, "EU", "a"), (2, "EU", "b"), (3, "EU", "c"), (4, "EU", "d")]))


def _keys_per_file(path: Path) -> dict[str, list[frozenset]]:
    """partition -> the sets of keys its base files hold (file ids aside: new ones are random)."""
    out: dict[str, list[frozenset]] = {}
    for (partition, _), s in slices(path).items():
        keys = pq.read_table(path / s.base_file_relative_path(), columns=["_hoodie_record_key"]).column(0).to_pylist()
        out.setdefault(partition, []).append(frozenset(keys))
    return {p: sorted(v, key=sorted) for p, v in out.items()}


@pytest.mark.parametrize("per_file, buckets", [(100, 12), (25, 48)])
def test_inserts_spread_over_new_file_groups_by_their_sizes(spark, tmp_path, monkeypatch, per_file, buckets):
    """A batch of inserts larger than a file goes to new file groups of max_file_size each, a
    share of the batch by weight to each (writer.plan_buckets), every row to exactly one. Up to
    writer._ROUTE_BRANCHES groups of a partition are chosen by a CASE, more by a lambda: both
    send every key to the same group."""
    from runtime.table import writer

    rows = [(i, "EU" if i % 4 else "US", f"v{i}\u00e9") for i in range(1, 4 * per_file * buckets // 3 + 1)]
    opts = dict(max_file_size=per_file * 64, small_file_limit=0, record_size_estimate=64)
    written = {}
    for branches in (writer._ROUTE_BRANCHES, 0):
        monkeypatch.setattr(writer, "_ROUTE_BRANCHES", branches)
        table, path = make_table(spark, tmp_path, f"spread{branches}", record_key_fields=("id",), partition_fields=("region",))
        result = table.write(spark.createDataFrame(rows, IDX), "insert", **opts)
        assert result.inserts == len(rows)
        assert_rows(table, path, rows_of(IDX, rows))
        written[branches] = _keys_per_file(path)
    eu = written[0]["region=EU"]
    assert len(eu) == buckets  # 3/4 of the rows in EU: `buckets` files of per_file rows
    assert sum(len(k) for k in eu) == len(rows) * 3 // 4 and min(len(k) for k in eu) > per_file // 3
    assert written[writer._ROUTE_BRANCHES] == written[0]



@pytest.mark.parametrize("index", ["global", "partition"])
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_inserts_go_to_the_small_file_the_batch_rewrites_anyway(spark, tmp_path, table_type, index):
    """Of two small files, the one the batch's updates touch takes its inserts, though the other
    is smaller: one group rewritten per round, not two (Hudi's sizing picks the smallest). The
    same with the partition index, whose upserts are decided inside partition tasks
    (runtime/table/partition_upsert.py)."""
    table, path = make_table(spark, tmp_path, f"pref_{table_type.lower()}_{index}", record_key_fields=("id",), partition_fields=("region",),
                             table_type=table_type)
    big = [(i, "EU", f"big {i}") for i in range(1, 201)]
    table.write(spark.createDataFrame(big, IDX), "insert", small_file_limit=0)
    table.write(spark.createDataFrame([(1001, "EU", "small")], IDX), "insert", small_file_limit=0)
    groups = {fid: s for (_, fid), s in slices(path).items()}
    assert len(groups) == 2
    size = {fid: (path / s.base_file_relative_path()).stat().st_size for fid, s in groups.items()}
    with_big = next(fid for fid, s in groups.items() if any(r["id"] == 1 for r in pq.read_table(path / s.base_file_relative_path()).to_pylist()))
    other = (set(groups) - {with_big}).pop()
    assert size[with_big] > size[other]  # Hudi's order would fill the other one first
    expected = {**{i: f"big {i}" for i in range(1, 201)}, 1001: "small"}
    for n in range(1, 11):  # the tenth round as the first
        batch = [(n, "EU", f"round {n} update"), (5000 + n, "EU", f"round {n} insert")]
        result = table.write(spark.createDataFrame(batch, IDX), "upsert", max_file_size=64 * 1024 * 1024, small_file_limit=32 * 1024 * 1024,
                             index=index)
        expected.update({i: v for i, _, v in batch})
        (stat,) = write_stats(path, result.instant)
        assert (stat["fileId"], stat["numInserts"], stat["numUpdateWrites"]) == (with_big, 1, 1), stat
        assert stat["path"].endswith(".parquet")  # rewritten with its inserts, not a log file
        now = slices(path)
        assert {fid for _, fid in now} == {with_big, other}
        assert now[("region=EU", other)].base_file_name == groups[other].base_file_name
    assert_rows(table, path, rows_of(IDX, [(i, "EU", v) for i, v in expected.items()]))


# --- 9. hoodie.properties and partition metadata ----------------------------------------------------


def test_hoodie_properties_and_partition_metadata(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "props_t", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    r = table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b"), (3, None, 1, "c"), (4, "", 1, "d")], PRE), "upsert")
    props = properties(path)
    assert props["hoodie.table.name"] == "props_t"
    assert props["hoodie.database.name"] == "default"
    assert props["hoodie.table.type"] == "COPY_ON_WRITE"
    assert props["hoodie.table.version"] == "6"
    assert props["hoodie.timeline.layout.version"] == "1"
    assert props["hoodie.table.recordkey.fields"] == "id"
    assert props["hoodie.table.partition.fields"] == "region"
    assert props["hoodie.table.precombine.field"] == "ts"
    assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.SimpleKeyGenerator"
    assert props["hoodie.datasource.write.hive_style_partitioning"] == "true"
    assert props["hoodie.datasource.write.drop.partition.columns"] == "false"
    assert props["hoodie.compaction.payload.class"] == "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
    assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
    assert props["hoodie.table.base.file.format"] == "PARQUET"
    assert props["hoodie.table.timeline.timezone"] == "UTC"
    assert props["hoodie.table.checksum"] == str(zlib.crc32(b"default.props_t"))
    parts = ["region=EU", "region=US", "region=__HIVE_DEFAULT_PARTITION__"]
    assert sorted(p.name for p in path.iterdir() if p.name != ".hoodie") == sorted(parts)
    for part in parts:
        meta = partition_metadata(path / part)
        assert meta == {"commitTime": r.instant, "partitionDepth": "1"}
    for d in ("archived", ".temp", ".aux", ".schema"):
        assert (path / ".hoodie" / d).is_dir()
    assert hudi_table(path).table_name == "props_t"
    assert table.read(meta=False).columns == ["id", "region", "ts", "v"]
    opened = Table.open(spark, str(path)).config
    fields = ("name", "table_type", "record_key_fields", "partition_fields", "precombine_field", "hive_style", "url_encode", "key_generator")
    assert {f: getattr(opened, f) for f in fields} == {f: getattr(table.config, f) for f in fields}
    assert_rows(table, path, [
        {"id": 1, "region": "EU", "_hoodie_partition_path": "region=EU"},
        {"id": 2, "region": "US", "_hoodie_partition_path": "region=US"},
        {"id": 3, "region": None, "_hoodie_partition_path": "region=__HIVE_DEFAULT_PARTITION__"},
        {"id": 4, "region": "", "_hoodie_partition_path": "region=__HIVE_DEFAULT_PARTITION__"},
    ])


# --- 10. instants and commit metadata -----------------------------------------------------------------


def test_instants_and_commit_metadata(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "tl", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    results = [
        table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b")], PRE), "upsert", extra_metadata={"pipe.checkpoint.src": "42", "note": "first"}),
        table.write(spark.createDataFrame([(3, "EU", 1, "c")], PRE), "insert"),
        table.write(spark.createDataFrame([(4, "US", 1, "d")], PRE), "bulk_insert"),
        table.write(spark.createDataFrame([(2,)], "id long"), "delete"),
    ]
    instants = [r.instant for r in results]
    assert all(INSTANT.match(i) for i in instants), instants
    assert instants == sorted(set(instants))  # strictly increasing
    assert completed(path) == instants
    assert hudi_completed(path) == instants
    assert pending(path) == []
    assert table.checkpoints() == {}  # the latest commit carried none

    hoodie = path / ".hoodie"
    for r, op in zip(results, ("UPSERT", "INSERT", "BULK_INSERT", "DELETE")):
        assert (hoodie / f"{r.instant}.commit.requested").is_file()
        assert (hoodie / f"{r.instant}.commit.requested").stat().st_size == 0
        json.loads((hoodie / f"{r.instant}.inflight").read_text())
        meta = commit_json(path, r.instant)
        assert meta["operationType"] == op
        assert meta["compacted"] is False
        stats = meta["partitionToWriteStats"]
        assert stats, op
        assert len([s for lst in stats.values() for s in lst]) == r.files
        for part, lst in stats.items():
            for s in lst:
                assert s["partitionPath"] == part
                assert s["path"].startswith(part + "/") and s["path"].endswith(f"_{r.instant}.parquet")
                assert s["path"].split("/")[-1].startswith(s["fileId"] + "_")
                assert (path / s["path"]).stat().st_size == s["fileSizeInBytes"]
                assert pq.read_metadata(path / s["path"]).num_rows == s["numWrites"]
        schema = json.loads(meta["extraMetadata"]["schema"])
        assert schema["type"] == "record" and schema["name"] == "tl_record" and schema["namespace"] == "hoodie.tl"
        assert [(f["name"], f["type"], f["default"]) for f in schema["fields"]] == [
            ("id", ["null", "long"], None), ("region", ["null", "string"], None), ("ts", ["null", "long"], None), ("v", ["null", "string"], None)]
    first = commit_json(path, instants[0])["extraMetadata"]
    assert first["pipe.checkpoint.src"] == "42" and first["note"] == "first"
    assert "note" not in commit_json(path, instants[1])["extraMetadata"]
    assert_rows(table, path, rows_of(PRE, [(1, "EU", 1, "a"), (3, "EU", 1, "c"), (4, "US", 1, "d")]))


def test_extra_metadata_cannot_replace_the_table_schema(spark, tmp_path):
    """`schema` in extraMetadata is the table's Avro schema, which hudi-rs reads: a caller's
    extra_metadata must not overwrite it (rejected, or kept out of the way)."""
    table, path = make_table(spark, tmp_path, "xm", record_key_fields=("id",))
    df = spark.createDataFrame([(1, "a")], NP)
    try:
        r = table.write(df, "upsert", extra_metadata={"schema": "not an avro schema", "note": "x"})
    except (WriteError, TableError):
        assert completed(path) == []
        assert_rows(table, path, [], ["id", "v"])
    else:
        extra = commit_json(path, r.instant)["extraMetadata"]
        assert extra["note"] == "x"
        assert extra["schema"] != "not an avro schema", "the caller's extra_metadata replaced the table's Avro schema"
        schema = json.loads(extra["schema"])
        assert schema["name"] == "xm_record" and [f["name"] for f in schema["fields"]] == ["id", "v"]
        assert_rows(table, path, [{"id": 1, "v": "a"}])


# --- 11. schema changes ---------------------------------------------------------------------------------


def test_schema_new_nullable_column_and_rejected_type_change(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "evo", record_key_fields=("id",), partition_fields=("region",))
    table.write(spark.createDataFrame([(1, "EU", 10), (2, "US", 20)], "id long, region string, n long"), "upsert")
    # only the US group is rewritten: the EU file keeps the old schema
    r2 = table.write(spark.createDataFrame([(3, "US", 30, "new")], "id long, region string, n long, note string"), "upsert")
    cols = ["id", "region", "n", "note"]
    expected = [{"id": 1, "region": "EU", "n": 10, "note": None}, {"id": 2, "region": "US", "n": 20, "note": None},
                {"id": 3, "region": "US", "n": 30, "note": "new"}]
    assert_rows(table, path, expected, cols)
    assert [f["name"] for f in json.loads(commit_json(path, r2.instant)["extraMetadata"]["schema"])["fields"]] == ["id", "region", "n", "note"]

    before = completed(path)
    files_before = parquet_files(path)
    with pytest.raises(WriteError, match="n"):
        table.write(spark.createDataFrame([(4, "EU", "forty", None)], "id long, region string, n string, note string"), "upsert")
    assert completed(path) == before
    assert hudi_completed(path) == before
    assert parquet_files(path) == files_before
    assert_rows(table, path, expected, cols)


def test_schema_a_write_without_a_stored_column_writes_nulls_for_it(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "omit", record_key_fields=("id",), partition_fields=("region",))
    table.write(spark.createDataFrame([(1, "EU", "x", 10)], "id long, region string, v string, n long"), "upsert")
    r2 = table.write(spark.createDataFrame([(2, "EU"), (3, "US")], "id long, region string"), "bulk_insert")
    assert r2.inserts == 2
    assert [f["name"] for f in json.loads(commit_json(path, r2.instant)["extraMetadata"]["schema"])["fields"]] == ["id", "region", "v", "n"]
    assert_rows(table, path, [{"id": 1, "region": "EU", "v": "x", "n": 10}, {"id": 2, "region": "EU", "v": None, "n": None},
                              {"id": 3, "region": "US", "v": None, "n": None}])
