"""Hudi log files: every block in the merge-on-read fixtures (written by Hudi itself) parses,
decodes to the rows and keys the independent reader saw, and encodes back to the same bytes;
blocks pipe builds decode back to what went in; damaged files are refused with the offset."""

from __future__ import annotations

import json
import zipfile

import pyarrow as pa
import pytest

from runtime.table import logfile as L
from tests.conftest import REPO

FIXTURES = REPO.parent / "shared" / "fixtures" / "hudi"


def fixture_logs(name: str) -> dict[str, bytes]:
    """File name -> bytes of every log file in a fixture, without the archive's macOS debris."""
    with zipfile.ZipFile(FIXTURES / f"{name}.zip") as z:
        return {m.rsplit("/", 1)[-1]: z.read(m) for m in z.namelist()
                if "__MACOSX" not in m and L.parse_name(m.rsplit("/", 1)[-1]) is not None}


def expected(name: str) -> dict:
    return json.loads((FIXTURES / "expected" / f"{name}.json").read_text())


MOR = sorted(p.stem for p in FIXTURES.glob("mor_*.zip"))
# the empty table and the one written without meta fields hold base files only
WITH_LOGS = [n for n in MOR if n not in ("mor_parquet_v6_empty", "mor_parquet_v6_simplekeygen_hivestyle_no_metafields")]


def test_the_fixtures_with_log_files():
    assert len(MOR) == 9, f"expected the 9 merge-on-read fixtures in {FIXTURES}"
    assert [n for n in MOR if fixture_logs(n)] == WITH_LOGS


@pytest.mark.parametrize("name", WITH_LOGS)
def test_fixture_log_files_parse_and_encode_back_to_the_same_bytes(name):
    assert fixture_logs(name)
    for file_name, data in fixture_logs(name).items():
        blocks = L.read_blocks(data, file_name)
        assert blocks, file_name
        assert b"".join(L.encode_block(b) for b in blocks) == data, file_name
        for b in blocks:
            assert b.instant.isdigit() and len(b.instant) == 17


def test_avro_data_block_holds_the_update_hudi_rs_shows():
    (data,) = fixture_logs("mor_avro_v6_trips_8i1u").values()
    (block,) = L.read_blocks(data)
    assert block.type == L.AVRO_DATA
    (row,) = L.data_rows(block)
    second = expected("mor_avro_v6_trips_8i1u")["completed_instants"][1][0]
    assert block.instant == second == row["_hoodie_commit_time"]
    seen = {r["_hoodie_record_key"]: r for r in expected("mor_avro_v6_trips_8i1u")["snapshot"]}
    merged = seen[row["_hoodie_record_key"]]
    assert merged["_hoodie_commit_time"] == second
    assert {k: row[k] for k in ("rider", "driver", "fare", "ts")} == {k: merged[k] for k in ("rider", "driver", "fare", "ts")}


def test_delete_block_names_the_keys_hudi_rs_no_longer_shows():
    (data,) = fixture_logs("mor_avro_v6_trips_8i3d").values()
    (block,) = L.read_blocks(data)
    assert block.type == L.DELETE
    deleted = L.deleted_keys(block)
    assert [(p, v) for _, p, v in deleted] == [("city=san_francisco", 0)] * 3  # Spark SQL DELETE: ordering value 0
    before = {r["_hoodie_record_key"] for r in expected("mor_avro_v6_trips_8i3d")["time_travel_as_of_first_instant"]}
    after = {r["_hoodie_record_key"] for r in expected("mor_avro_v6_trips_8i3d")["snapshot"]}
    assert {k for k, _, _ in deleted} == before - after


def test_delete_records_keep_the_avro_type_of_their_ordering_value():
    (data,) = fixture_logs("mor_avro_v6_trips_8i3d").values()
    (block,) = L.read_blocks(data)
    # the union branch says `long`, the type of the table's ordering field ts (deleted_keys only gives 0)
    assert {d.ordering for d in L.delete_records(block)} == {L.OrderingValue("long", 0)}
    typed = L.typed_delete_block("20260101000000001", [("a", "p", L.OrderingValue("long", 0)), ("b", "p", None)])
    assert [d.ordering for d in L.delete_records(L.read_blocks(L.encode_block(typed))[0])] == [L.OrderingValue("long", 0), None]
    assert L.deleted_keys(typed) == [("a", "p", 0), ("b", "p", None)]


def test_rollback_block_targets_the_failed_delta_commit():
    logs = fixture_logs("mor_parquet_v6_nonpartitioned_rollback")
    by_version = {L.parse_name(n).version: L.read_blocks(d) for n, d in logs.items()}
    (failed,), (rollback,), (later,) = by_version[1], by_version[2], by_version[3]
    assert failed.type == later.type == L.PARQUET_DATA
    assert rollback.is_rollback and rollback.header[L.TARGET_INSTANT_TIME] == failed.instant
    completed = [t for t, _ in expected("mor_parquet_v6_nonpartitioned_rollback")["completed_instants"]]
    assert failed.instant not in completed and later.instant in completed


def test_blocks_pipe_builds_decode_to_what_went_in():
    table = pa.table({"_hoodie_commit_time": ["20260101000000000"] * 2, "_hoodie_record_key": ["a", "b"], "v": [1, 2]})
    schema = json.dumps({"type": "record", "name": "t_record", "fields": [{"name": "v", "type": ["null", "long"]}]})
    parquet = L.parquet_block("20260101000000000", schema, table)
    deletes = L.delete_block("20260101000000001", [("a", "p=1", 5), ("b", "p=1", None), ("c", "", "x")])
    rollback = L.rollback_block("20260101000000002", "20260101000000001")
    data = b"".join(L.encode_block(b) for b in (parquet, deletes, rollback))
    p, d, r = L.read_blocks(data)
    assert L.data_rows(p).equals(table) and p.header[L.SCHEMA] == schema
    assert L.deleted_keys(d) == [("a", "p=1", 5), ("b", "p=1", None), ("c", "", "x")]
    assert r.is_rollback and r.header[L.TARGET_INSTANT_TIME] == "20260101000000001"


def test_damaged_log_files_are_refused_with_the_offset():
    block = L.encode_block(L.rollback_block("20260101000000002", "20260101000000001"))
    with pytest.raises(L.LogFormatError, match=r"x.log: no block magic at byte 105"):
        L.read_blocks(block + b"\0" * 8, "x.log")  # a file ending in junk
    with pytest.raises(L.LogFormatError, match="at byte 0"):
        L.read_blocks(block[:-3], "x.log")
    damaged = block[:-8] + (999).to_bytes(8, "big")
    with pytest.raises(L.LogFormatError, match="lengths disagree"):
        L.read_blocks(damaged, "x.log")


def test_log_file_names():
    name = ".d0304c53-6fd2-4b7a-a9d6-5ff632f79224-0_20250331030642808.log.1_0-26-85"
    parsed = L.parse_name(name)
    assert (parsed.file_id, parsed.base_instant, parsed.version, parsed.token) == (
        "d0304c53-6fd2-4b7a-a9d6-5ff632f79224-0", "20250331030642808", 1, "0-26-85")
    assert parsed.name == name
    assert L.parse_name("d0304c53-0_0-13-60_20250618054711154.parquet") is None


def test_reading_a_merge_on_read_table_applies_its_log_files(spark, tmp_path):
    from runtime.table import Table

    with zipfile.ZipFile(FIXTURES / "mor_avro_v6_trips_8i3d.zip") as z:
        z.extractall(tmp_path)
    table = Table.open(spark, str(tmp_path / expected("mor_avro_v6_trips_8i3d")["table_dir_in_zip"]))
    (data,) = fixture_logs("mor_avro_v6_trips_8i3d").values()
    (block,) = L.read_blocks(data)
    deleted = {k for k, _, _ in L.deleted_keys(block)}
    keys = [r["_hoodie_record_key"] for r in table.read().select("_hoodie_record_key").collect()]
    assert len(keys) == 5 and not deleted & set(keys)
    assert deleted <= {r["_hoodie_record_key"] for r in table.read(read_optimized=True).select("_hoodie_record_key").collect()}


def test_a_log_file_is_attributed_to_one_instant_only_when_all_its_blocks_are_that_instants_data(tmp_path):
    from runtime.storage import StorageSpec, open_storage
    from runtime.table.logfile import (
        DELETE, PARQUET_DATA, SCHEMA, block_headers, delete_block, encode_block, parquet_block, rollback_block, written_by,
    )

    storage = open_storage(StorageSpec(str(tmp_path)))
    table = pa.table({"_hoodie_record_key": ["1"], "v": ["x" * 10]})
    long_schema = "{" + "x" * 20_000 + "}"  # a header longer than the first ranged read
    files = {
        "ours": [parquet_block("20250101000000001", long_schema, table), delete_block("20250101000000001", [("2", "", None)])],
        "appended": [parquet_block("20250101000000001", "{}", table), parquet_block("20250101000000002", "{}", table)],
        "rollback": [rollback_block("20250101000000003", "20250101000000002")],
    }
    for name, blocks in files.items():
        (tmp_path / name).write_bytes(b"".join(encode_block(b) for b in blocks))
    size = lambda name: (tmp_path / name).stat().st_size  # noqa: E731
    assert [kind for kind, _ in block_headers(storage, "ours", size("ours"))] == [PARQUET_DATA, DELETE]
    assert block_headers(storage, "ours", size("ours"))[0][1][SCHEMA] == long_schema
    assert written_by(storage, "ours", size("ours")) == "20250101000000001"
    assert written_by(storage, "appended", size("appended")) is None
    assert written_by(storage, "rollback", size("rollback")) is None
