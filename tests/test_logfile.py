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


def test_the_fixtures_delete_block_is_javas_int_wrapper_zero():
    (data,) = fixture_logs("mor_avro_v6_trips_8i3d").values()
    (block,) = L.read_blocks(data)
    # the bytes after each partition path are `04 00`: union branch 2, Java's IntWrapper, value 0
    assert block.content.count(b"city=san_francisco\x04\x00") == 3
    assert {d.ordering for d in L.delete_records(block)} == {L.OrderingValue("int", 0)} == {L.NATURAL_ORDER}
    # and pipe writes a delete without an ordering value exactly so
    ours = L.delete_block("20260101000000001", [("k", "city=san_francisco", None)])
    assert ours.content.endswith(b"city=san_francisco\x04\x00\x00")


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
    deletes = L.delete_block("20260101000000001", [("a", "p=1", L.OrderingValue("long", 1_700_000_000_000)),
                                                    ("b", "p=1", None), ("c", "", L.OrderingValue("string", "x"))])
    rollback = L.rollback_block("20260101000000002", "20260101000000001")
    data = b"".join(L.encode_block(b) for b in (parquet, deletes, rollback))
    p, d, r = L.read_blocks(data)
    assert L.data_rows(p).equals(table) and p.header[L.SCHEMA] == schema
    assert L.deleted_keys(d) == [("a", "p=1", 1_700_000_000_000), ("b", "p=1", 0), ("c", "", "x")]
    assert r.is_rollback and r.header[L.TARGET_INSTANT_TIME] == "20260101000000001"


def test_torn_and_corrupt_blocks_are_skipped_as_javas_reader_skips_them():
    a, b, c = (L.encode_block(L.rollback_block(f"2026010100000000{i}", "20260101000000000")) for i in (1, 2, 3))
    kinds = lambda data: [blk.type if blk.type == L.CORRUPT else blk.instant[-1] for blk in L.read_blocks(data, "x.log")]  # noqa: E731
    # a torn append (a writer died mid-block), then a later writer's block: both sound blocks are read
    assert kinds(a + b[:40] + c) == ["1", L.CORRUPT, "3"]
    # a truncated last block
    assert kinds(a + b + c[:-5]) == ["1", "2", L.CORRUPT]
    assert kinds(a + c[:10]) == ["1", L.CORRUPT]
    # a block whose trailing length disagrees with its leading one
    assert kinds(a + b[:-8] + (999).to_bytes(8, "big") + c) == ["1", L.CORRUPT, "3"]
    # stray bytes (no magic) after a block: Java finds no magic after it, so that block and the
    # bytes up to the next magic are one corrupt block
    assert kinds(a + b"\0" * 20 + c) == [L.CORRUPT, "3"]
    # fewer than 6 bytes after the last block end the file (Java's hasNext meets the end)
    assert kinds(a + b"\0" * 5) == ["1"]
    with pytest.raises(L.LogFormatError, match=r"x.log: no block magic at byte 0"):
        L.read_blocks(b"\0" * 8 + a, "x.log")  # not a log file


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


# --- delete blocks on Java's wire schema ----------------------------------------------------------

# hudi-common/src/main/avro/HoodieDeleteRecordList.avsc of Hudi 0.14/0.15/1.0 (the wrappers are
# defined in HoodieMetadata.avsc), written out here independently of logfile.py's copy.
_W = "org.apache.hudi.avro.model."
JAVA_WRAPPERS = [("BooleanWrapper", "boolean"), ("IntWrapper", "int"), ("LongWrapper", "long"), ("FloatWrapper", "float"),
                 ("DoubleWrapper", "double"), ("BytesWrapper", "bytes"), ("StringWrapper", "string"), ("DateWrapper", "int"),
                 ("DecimalWrapper", {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 15}),
                 ("TimeMicrosWrapper", {"type": "long", "logicalType": "time-micros"}), ("TimestampMicrosWrapper", "long")]
JAVA_DELETE_RECORD_LIST = {
    "type": "record", "name": "HoodieDeleteRecordList", "namespace": "org.apache.hudi.avro.model",
    "fields": [{"name": "deleteRecordList", "type": {"type": "array", "items": {
        "type": "record", "name": "HoodieDeleteRecord", "fields": [
            {"name": "recordKey", "type": ["null", "string"], "default": None},
            {"name": "partitionPath", "type": ["null", "string"], "default": None},
            {"name": "orderingVal", "default": None, "type": ["null"] + [
                {"type": "record", "name": n, "fields": [{"name": "value", "type": t}]} for n, t in JAVA_WRAPPERS]}]}}}],
}


def java_view(block: L.Block) -> list[tuple]:
    """(key, wrapper record, value) of each delete, decoded as Java's HoodieDeleteBlock does."""
    import io
    import struct

    import fastavro

    version, size = struct.unpack_from(">ii", block.content, 0)
    assert version == 3 and len(block.content) == 8 + size
    schema = fastavro.parse_schema(JAVA_DELETE_RECORD_LIST, named_schemas={})
    body = io.BytesIO(block.content[8:])
    record = fastavro.schemaless_reader(body, schema, None, return_record_name=True)
    assert body.read() == b""  # every byte consumed: the stream stayed aligned
    return [(r["recordKey"], r["orderingVal"][0].rsplit(".", 1)[-1], r["orderingVal"][1]["value"]) for r in record["deleteRecordList"]]


def test_pipes_deletes_are_wrapped_as_java_wraps_each_precombine_type():
    import datetime as dt
    from decimal import Decimal

    columns = {  # a precombine column of each type -> the wrapper and value Java's Spark writer gives it
        "bigint epoch millis": (pa.array([1_700_000_000_000], pa.int64()), "LongWrapper", 1_700_000_000_000),
        "int version": (pa.array([7], pa.int32()), "IntWrapper", 7),
        "timestamp": (pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)], pa.timestamp("us", tz="UTC")),
                      "LongWrapper", 1_704_067_200_000_000),  # epoch micros: Hudi's default, non-"consistent" logical timestamps
        "double": (pa.array([2.5]), "DoubleWrapper", 2.5),
        "float": (pa.array([1.5], pa.float32()), "FloatWrapper", 1.5),
        "string": (pa.array(["2024-01-01 10:00"]), "StringWrapper", "2024-01-01 10:00"),
        "date": (pa.array([dt.date(2024, 1, 1)]), "DateWrapper", 19723),
        "decimal": (pa.array([Decimal("-12.34")], pa.decimal128(10, 2)), "DecimalWrapper", Decimal("-12.340000000000000")),
        "boolean": (pa.array([True]), "BooleanWrapper", True),
        "binary": (pa.array([b"\x00\xff"]), "BytesWrapper", b"\x00\xff"),
    }
    for what, (column, wrapper, value) in columns.items():
        (ordering,) = L.ordering_values(column)
        block = L.delete_block("20260101000000001", [("id:1,region:EU", "region=EU", ordering), ("id:2,region:EU", "region=EU", None)])
        assert java_view(block) == [("id:1,region:EU", wrapper, value), ("id:2,region:EU", "IntWrapper", 0)], what
        assert [d.ordering for d in L.delete_records(block)] == [ordering, L.NATURAL_ORDER], what


def test_a_decimal_is_encoded_as_javas_big_integer_bytes():
    from decimal import Decimal

    # BigInteger.toByteArray of the value at scale 15: minimal two's complement, big-endian
    for value, unscaled in ((Decimal("-0.000000000000128"), -128), (Decimal("0.000000000000128"), 128), (Decimal("1"), 10 ** 15)):
        (ordering,) = L.ordering_values(pa.array([value], pa.decimal128(38, 15)))
        block = L.delete_block("20260101000000001", [("k", "", ordering)])
        expected = unscaled.to_bytes(((unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8) + 1, "big", signed=True)
        assert block.content.endswith(bytes([18]) + bytes([len(expected) * 2]) + expected + b"\x00"), value
    # more than 15 decimals, which Java's tryUpcastDecimal refuses: Java's default value instead
    assert L.ordering_values(pa.array([Decimal("1.0000000000000001")], pa.decimal128(38, 16))) == [L.NATURAL_ORDER]


def test_java_wrapped_deletes_are_decoded_by_their_branch():
    import datetime as dt
    import io
    import struct

    import fastavro

    java = {  # what Java writes (HoodieAvroUtils.wrapValueIntoAvro) -> what pipe reads
        "LongWrapper": (1_700_000_000_002, L.OrderingValue("long", 1_700_000_000_002)),
        "TimestampMicrosWrapper": (1_704_067_200_000_000, L.OrderingValue("timestamp-micros", dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))),
        "DoubleWrapper": (2.5, L.OrderingValue("double", 2.5)),
        "StringWrapper": ("2024-01-01", L.OrderingValue("string", "2024-01-01")),
        "IntWrapper": (0, L.NATURAL_ORDER),
        "DateWrapper": (19723, L.OrderingValue("date", dt.date(2024, 1, 1))),
    }
    schema = fastavro.parse_schema(JAVA_DELETE_RECORD_LIST, named_schemas={})
    for wrapper, (value, expected) in java.items():
        out = io.BytesIO()
        records = [{"recordKey": k, "partitionPath": "city=san_francisco", "orderingVal": (_W + wrapper, {"value": value})} for k in ("k1", "k2")]
        fastavro.schemaless_writer(out, schema, {"deleteRecordList": records})
        block = L.Block(L.DELETE, {L.INSTANT_TIME: "20250101000000000"}, struct.pack(">ii", 3, len(out.getvalue())) + out.getvalue())
        assert [(d.record_key, d.partition_path, d.ordering) for d in L.delete_records(block)] == [
            ("k1", "city=san_francisco", expected), ("k2", "city=san_francisco", expected)], wrapper
