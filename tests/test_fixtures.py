"""Interoperability with tables Hudi itself wrote (../shared/fixtures/hudi): pipe's reader sees
exactly what the independent reader (hudi-rs) saw, and a table pipe then writes into still reads
correctly with hudi-rs."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import shutil
import zipfile

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableError
from tests.conftest import REPO

FIXTURES = REPO.parent / "shared" / "fixtures" / "hudi"
COW = sorted(p.stem for p in FIXTURES.glob("cow_*.zip"))
MOR = sorted(p.stem for p in FIXTURES.glob("mor_*.zip"))
META = ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path", "_hoodie_file_name")


def test_fixtures_are_present():
    assert len(COW) == 7, f"expected the 7 copy-on-write fixtures in {FIXTURES}"
    assert len(MOR) == 9, f"expected the 9 merge-on-read fixtures in {FIXTURES}"


def unpack(name: str, dest) -> tuple[str, dict]:
    expected = json.loads((FIXTURES / "expected" / f"{name}.json").read_text())
    with zipfile.ZipFile(FIXTURES / f"{name}.zip") as z:
        for member in z.namelist():
            if "__MACOSX" in member or member.endswith(".DS_Store"):
                continue
            z.extract(member, dest)
    return str(dest / expected["table_dir_in_zip"]), expected


def plain(value):
    """Values as the expected JSON writes them."""
    if isinstance(value, (bytes, bytearray)):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc).isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
            return [[k, plain(v)] for k, v in value]  # a map
        return [plain(v) for v in value]
    return value


def rows_of(data, drop_meta: bool = False) -> list[dict]:
    """Sorted plain rows of an Arrow table, or of the expected JSON's row list."""
    rows = [{k: plain(v) for k, v in r.items()} for r in (data.to_pylist() if isinstance(data, pa.Table) else data)]
    if drop_meta:
        rows = [{k: v for k, v in r.items() if k not in META} for r in rows]
    key = lambda r: (r.get("_hoodie_partition_path") or "", r.get("_hoodie_record_key") or "", r.get("id") or 0)  # noqa: E731
    return sorted(rows, key=key)


def ours(df) -> pa.Table:
    return df.toArrow()


def theirs(path, options=None) -> pa.Table:
    table = hudi.HudiTableBuilder.from_base_uri(path).build()
    batches = table.read(options) if options is not None else table.read()
    return pa.Table.from_batches(batches) if batches else pa.table({})


@pytest.mark.parametrize("name", COW + MOR)
def test_pipe_reads_hudi_written_tables_like_hudi_rs(spark, tmp_path, name):
    path, expected = unpack(name, tmp_path)
    table = Table.open(spark, path)
    no_meta = "no_metafields" in name
    timeline = table.timeline()
    assert [[i.time, i.action] for i in timeline.completed()] == expected["completed_instants"]

    snapshot = rows_of(ours(table.read()), drop_meta=no_meta)
    assert snapshot == rows_of(expected["snapshot"], drop_meta=no_meta)
    if expected["completed_instants"]:
        first = expected["completed_instants"][0][0]
        as_of = rows_of(ours(table.read(as_of=first)), drop_meta=no_meta)
        assert as_of == rows_of(expected["time_travel_as_of_first_instant"], drop_meta=no_meta)
        incremental = rows_of(ours(table.read(since=first)), drop_meta=no_meta)
        assert incremental == rows_of(expected["incremental_after_first_instant"], drop_meta=no_meta)


def test_merge_on_read_snapshot_merges_log_files(spark, tmp_path):
    """The rows each log file changes: an Avro update replaces its key's base row, a delete
    block removes its keys, a rolled-back update stays hidden."""
    path, _ = unpack("mor_avro_v6_trips_8i1u", tmp_path / "u")
    (updated,) = [r for r in rows_of(ours(Table.open(spark, path).read())) if r["_hoodie_commit_time"] == "20250331030645735"]
    assert updated["_hoodie_file_name"] == "d0304c53-6fd2-4b7a-a9d6-5ff632f79224-0"  # a log row names its file id

    path, expected = unpack("mor_avro_v6_trips_8i3d", tmp_path / "d")
    table = Table.open(spark, path)
    keys = {r["_hoodie_record_key"] for r in rows_of(ours(table.read()))}
    before = {r["_hoodie_record_key"] for r in rows_of(expected["time_travel_as_of_first_instant"])}
    assert len(before - keys) == 3 and keys < before

    path, _ = unpack("mor_parquet_v6_nonpartitioned_rollback", tmp_path / "r")
    commit_times = {r["id"]: r["_hoodie_commit_time"] for r in rows_of(ours(Table.open(spark, path).read()))}
    assert "20250126040826878" not in commit_times.values()  # the rolled-back deltacommit
    assert commit_times == {1: "20250126040823628", 2: "20250126060846931", 3: "20250126040823628"}


def test_read_optimized_reads_base_files_only(spark, tmp_path):
    path, expected = unpack("mor_parquet_v6_simplekeygen_nonhivestyle", tmp_path)
    table = Table.open(spark, path)
    base_rows = rows_of(ours(table.read(read_optimized=True)))
    # the base files as the first deltacommit wrote them, plus the second one's new base file
    first = expected["completed_instants"][0][0]
    assert base_rows == rows_of(expected["time_travel_as_of_first_instant"] + [r for r in expected["snapshot"] if r["id"] == 4])
    assert [r["_hoodie_commit_time"] for r in base_rows if r["id"] == 1] == [first]
    assert base_rows != rows_of(expected["snapshot"])


WRITABLE = ["cow_v6_complexkeygen_hivestyle", "cow_v6_nonpartitioned", "cow_v6_simplekeygen_nonhivestyle", "cow_v6_simplekeygen_nonhivestyle_overwritetable"]


@pytest.mark.parametrize("name", WRITABLE)
def test_upsert_into_hudi_written_table_reads_right_with_hudi_rs(spark, tmp_path, name):
    from pyspark.sql import functions as F

    path, expected = unpack(name, tmp_path)
    table = Table.open(spark, path)
    before = table.read(meta=False)
    first_id = sorted(r["id"] for r in before.select("id").collect())[0]
    # change one row (with a larger precombine value) and add one new row
    changed = before.where(F.col("id") == first_id).withColumn("intField", F.lit(777)).withColumn("longField", F.col("longField") + 1)
    added = before.where(F.col("id") == first_id).withColumn("id", F.lit(1000)).withColumn("name", F.lit("New"))
    result = table.write(changed.unionByName(added), "upsert")
    assert result.updates == 1 and result.inserts == 1

    rows = rows_of(theirs(path))
    by_id = {r["id"]: r for r in rows}
    assert by_id[first_id]["intField"] == 777
    assert by_id[1000]["name"] == "New"
    assert len(rows) == len(expected["snapshot"]) + 1
    assert len({(r["_hoodie_record_key"]) for r in rows}) == len(rows)
    # everything else is as Hudi left it
    untouched = [r for r in rows_of(expected["snapshot"]) if r["id"] != first_id]
    ours_untouched = [{k: v for k, v in by_id[r["id"]].items() if k not in ("_hoodie_file_name", "_hoodie_commit_seqno", "_hoodie_commit_time")} for r in untouched]
    assert ours_untouched == [{k: v for k, v in r.items() if k not in ("_hoodie_file_name", "_hoodie_commit_seqno", "_hoodie_commit_time")} for r in untouched]
    assert rows_of(ours(table.read())) == rows


@pytest.mark.parametrize("name", ["cow_v6_timebasedkeygen_nonhivestyle", "cow_v6_simplekeygen_hivestyle_no_metafields"])
def test_writing_into_tables_pipe_cannot_key_is_refused_cleanly(spark, tmp_path, name):
    path, _ = unpack(name, tmp_path)
    table = Table.open(spark, path)
    before = sorted(p.name for p in (tmp_path / "x").parent.rglob("*") if p.is_file())
    with pytest.raises(TableError, match="cannot write"):
        table.write(table.read(meta=False).limit(1), "upsert")
    after = sorted(p.name for p in (tmp_path / "x").parent.rglob("*") if p.is_file())
    assert before == after
