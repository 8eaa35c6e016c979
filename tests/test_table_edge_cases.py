"""Edge cases found in review: each once broke a table or its rows."""

from __future__ import annotations

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig, WriteError

SCHEMA = "id long, p string, ts long, v string"


def hudi_rows(path, cols=("id", "v")):
    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return sorted(tuple(r[c] for c in cols) for r in pa.Table.from_batches(batches).to_pylist()) if batches else []


def ours(table, cols=("id", "v")):
    return sorted(tuple(r[c] for c in cols) for r in table.read().collect())


def test_schema_and_incremental_reads_survive_archiving(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    first = table.write(spark.createDataFrame([(1, "a", 1, "x")], SCHEMA), "upsert").instant
    empty = spark.createDataFrame([], SCHEMA)
    for _ in range(4):  # empty commits push the one with files off the active timeline
        table.write(empty, "upsert", archive_min=1, archive_max=2)
    assert first not in {i.time for i in table.timeline().instants}
    assert [f.name for f in table.schema().fields] == ["id", "p", "ts", "v"]
    assert ours(table) == [(1, "x")] == hudi_rows(path)
    # an incremental read from before the archived commit still returns its rows
    assert sorted(r["id"] for r in table.read(since="19700101000000000").collect()) == [1]
    table.write(spark.createDataFrame([(1, "a", 2, "y")], SCHEMA), "upsert")
    assert ours(table) == [(1, "y")] == hudi_rows(path)


def test_plain_partition_value_starting_with_a_dot(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), hive_style=False))
    table.write(spark.createDataFrame([(1, ".net", 1, "x")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, ".net", 2, "y")], SCHEMA), "upsert")
    assert ours(table) == [(1, "y")] == hudi_rows(path)


def test_bulk_insert_skips_rows_marked_deleted(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    df = spark.createDataFrame([(1, "a", 1, "x", False), (2, "a", 1, "gone", True)], SCHEMA + ", _hoodie_is_deleted boolean")
    table.write(df, "bulk_insert")
    assert ours(table) == [(1, "x")] == hudi_rows(path)


def test_a_null_precombine_value_never_overwrites_a_stored_row(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "a", 5, "stored")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "a", None, "late")], SCHEMA), "upsert")
    assert ours(table) == [(1, "stored")] == hudi_rows(path)


def test_a_widening_spark_cannot_read_back_is_refused(spark, tmp_path):
    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    table.write(spark.createDataFrame([(1, "a", 1, "x")], SCHEMA), "upsert")
    before = [i.time for i in table.timeline().completed()]
    with pytest.raises(WriteError, match="column 'ts' is bigint in the table but double"):
        table.write(spark.createDataFrame([(2, "a", 1.5, "y")], "id long, p string, ts double, v string"), "upsert")
    assert [i.time for i in table.timeline().completed()] == before
    assert table.timeline().pending() == []


def test_a_write_based_on_an_older_state_of_the_table_is_refused(spark, tmp_path):
    """Two runs that read the same checkpoints: the second to commit is refused, nothing written."""
    from runtime.table import TableError

    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    with pytest.raises(TableError, match="changed since this write read its input at no commit yet"):
        pass_through = table.write(spark.createDataFrame([(1, "a", 1, "x")], SCHEMA), "upsert", expect_latest=None)
        table.write(spark.createDataFrame([(2, "a", 1, "y")], SCHEMA), "insert", expect_latest=None)
    assert ours(table) == [(1, "x")] == hudi_rows(path)
    instants = [i.time for i in table.timeline().instants]
    assert instants == [pass_through.instant], "the refused write left no instant behind"
    ok = table.write(spark.createDataFrame([(2, "a", 1, "y")], SCHEMA), "insert", expect_latest=pass_through.instant)
    assert ok.inserts == 1 and ours(table) == [(1, "x"), (2, "y")] == hudi_rows(path)


def test_a_table_source_checkpoint_removed_by_a_restore_is_lost_not_skipped(spark, tmp_path):
    """The consumer read up to c2; c2 is then taken off the timeline (as a restore does) and the
    upstream is written again: the changes since c2 cannot be told, so the source says so."""
    from runtime.sources import SourceError
    from runtime.sources import table as table_source

    path = str(tmp_path / "up")
    up = Table.create(spark, path, TableConfig(name="up", record_key_fields=("id",), partition_fields=("p",)))
    up.write(spark.createDataFrame([(1, "a", 1, "x")], SCHEMA), "upsert")
    c2 = up.write(spark.createDataFrame([(2, "a", 1, "y")], SCHEMA), "upsert").instant
    assert table_source.pending("s", {}, Table.open(None, path), "down", c2).is_empty
    for f in (tmp_path / "up" / ".hoodie").iterdir():
        if f.name.startswith(c2):
            f.unlink()
    up.write(spark.createDataFrame([(3, "a", 1, "z")], SCHEMA), "upsert")
    with pytest.raises(SourceError, match=f"no longer has instant {c2} \\(rolled back or restored, then written again\\)"):
        table_source.pending("s", {}, Table.open(None, path), "down", c2)
    full = table_source.pending("s", {"on_checkpoint_lost": "full_read"}, Table.open(None, path), "down", c2)
    assert full.since is None and "checkpoint lost" in full.describe()


def test_partition_paths_of_every_plain_type_match_hudis_encoding(spark):
    """Integer, decimal, date and boolean partition values skip the URL-encoding expressions
    (their text has nothing to escape); strings are still encoded. Every path matches the
    encoding Hudi's key generator applies (layout.partition_path)."""
    import datetime as dt
    import decimal

    from runtime.table.layout import partition_path
    from runtime.table.writer import PART, WriteOptions, prepare

    schema = "id long, i int, b bigint, d decimal(10,2), day date, flag boolean, s string"
    rows = [(1, -3, 2**40, decimal.Decimal("-1.50"), dt.date(2024, 2, 29), True, "a/b:c=d"),
            (2, None, 0, None, None, False, ""), (3, 7, -1, decimal.Decimal("0.00"), dt.date(1, 1, 1), None, "plain"),
            (4, 1, 1, decimal.Decimal("1.00"), dt.date(2000, 1, 1), True, "tab\there\x7f%")]
    fields = ("i", "b", "d", "day", "flag", "s")
    config = TableConfig(name="t", record_key_fields=("id",), partition_fields=fields)
    got = {r["id"]: r[PART] for r in prepare(spark.createDataFrame(rows, schema), config, WriteOptions()).collect()}
    spark_text = {r["id"]: r for r in spark.createDataFrame(rows, schema).selectExpr("id", *[f"cast({f} as string) as {f}" for f in fields]).collect()}
    assert got == {i: partition_path({f: spark_text[i][f] for f in fields}, fields, hive_style=True) for i in got}
    assert got[1] == "i=-3/b=1099511627776/d=-1.50/day=2024-02-29/flag=true/s=a%2Fb%3Ac%3Dd"
    assert got[2] == "i=__HIVE_DEFAULT_PARTITION__/b=0/d=__HIVE_DEFAULT_PARTITION__/day=__HIVE_DEFAULT_PARTITION__/flag=false/s=__HIVE_DEFAULT_PARTITION__"
    assert got[4].endswith("/s=tab%09here%7F%25")  # control characters too, as Hudi escapes them


@pytest.mark.parametrize("hive_style", [True, False])
def test_bulk_tasks_compute_keys_and_partition_paths_as_spark_does(spark, hive_style):
    """bulk_insert tasks compute the record key and partition path from the data columns
    (files.Derived) when their types allow: the text must be what prepare's Spark expressions
    give, for every value (negative, null, empty, characters to escape, year 1)."""
    import datetime as dt

    from runtime.table.writer import KEY, PART, WriteOptions, _derived, prepare

    schema = "id long, i int, day date, flag boolean, s string, t tinyint"
    rows = [(-1, -3, dt.date(2024, 2, 29), True, 'a/b:c=d%"#\'*?\\{[]^', -128), (2, None, None, None, "", None),
            (2**62, 7, dt.date(1, 1, 1), False, "plain text", 127), (None, 0, dt.date(9999, 12, 31), None, None, 0),
            (5, 1, dt.date(2000, 1, 1), True, "tab\there\x00nul\x1f\x7f%", 1)]
    df = spark.createDataFrame(rows, schema)
    config = TableConfig(name="t", record_key_fields=("id",), partition_fields=("i", "day", "flag", "s", "t"), hive_style=hive_style)
    derived = _derived(config, df.schema)
    assert derived.key_field == "id" and derived.partition_fields == config.partition_fields and derived.encoded_fields == {"s"}
    expected = [(r[KEY], r[PART]) for r in prepare(df, config, WriteOptions()).collect()]
    assert derived_pairs(derived, df) == sorted(expected, key=repr)
    assert expected[0][1].endswith("a%2Fb%3Ac%3Dd%25%22%23%27%2A%3F%5C%7B%5B%5D%5E" + ("/t=-128" if hive_style else "/-128"))


def derived_pairs(derived, df) -> list[tuple]:
    """(record key, partition path) of every row, as a bulk task computes them, sorted."""
    from runtime.table.writer import KEY

    batch = derived.with_key(df.toArrow().combine_chunks().to_batches()[0])
    return sorted(((key, path) for path, piece in derived.split(batch) for key in piece.column(KEY).to_pylist()), key=repr)


def test_the_schema_follows_a_widened_column_in_one_table_object(spark, tmp_path):
    """Table.schema keeps the Spark schemas it read, by Parquet schema: a widened column
    (tinyint, then int, then bigint: one Avro type "int" for the first two) is read again."""
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",)))
    table.write(spark.createDataFrame([(1, 5)], "id long, n tinyint"), "upsert")
    assert table.schema()["n"].dataType.simpleString() == "tinyint"
    table.write(spark.createDataFrame([(2, 300)], "id long, n int"), "upsert")
    assert table.schema()["n"].dataType.simpleString() == "int"
    table.write(spark.createDataFrame([(3, 2**40)], "id long, n bigint"), "upsert")
    assert table.schema()["n"].dataType.simpleString() == "bigint"
    assert ours(table, ("id", "n")) == hudi_rows(path, ("id", "n")) == [(1, 5), (2, 300), (3, 2**40)]


def test_bulk_tasks_write_a_date_past_year_9999_as_spark_does(spark):
    """Spark writes a date after 9999-12-31 with a sign (+10000-01-01), pyarrow without: a
    bulk_insert task's partition path must be the one prepare gives, or an upsert of the same
    key later lands in another partition."""
    from runtime.table.writer import KEY, PART, WriteOptions, _derived, prepare

    df = spark.sql("SELECT id, date_add(DATE'9999-12-31', CAST(id AS INT)) AS day FROM range(-1, 3)")
    config = TableConfig(name="t", record_key_fields=("id",), partition_fields=("day",))
    derived = _derived(config, df.schema)
    assert derived.partition_fields == ("day",)
    expected = [(r[KEY], r[PART]) for r in prepare(df, config, WriteOptions()).select(KEY, PART).collect()]
    assert derived_pairs(derived, df) == sorted(expected, key=repr)
    assert expected[-1] == ("2", "day=+10000-01-02")


def test_timestamps_written_under_another_session_time_zone_read_back_with_hudi_rs(spark, tmp_path):
    """Spark hands timestamps to the write tasks tagged with its session time zone; every
    file tags them UTC (as Hudi's writers do) whatever the session's zone was, and both
    readers see the same instants."""
    import datetime as dt

    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    before = spark.conf.get("spark.sql.session.timeZone")
    at = dt.datetime(2024, 7, 1, 12, 30, tzinfo=dt.timezone.utc)
    table.write(spark.createDataFrame([(2, "b", at, "y")], "id long, p string, ts timestamp, v string"), "upsert")  # in UTC
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        table.write(spark.createDataFrame([(1, "a", at, "x")], "id long, p string, ts timestamp, v string"), "upsert")
        table.write(spark.createDataFrame([(1, "a", at + dt.timedelta(hours=1), "x2")], "id long, p string, ts timestamp, v string"), "upsert")
        batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
        got = sorted((r["id"], r["ts"], r["v"]) for r in pa.Table.from_batches(batches).to_pylist())
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert got == [(1, at + dt.timedelta(hours=1), "x2"), (2, at, "y")]
    assert sorted((r["id"], r["ts"].replace(tzinfo=dt.timezone.utc)) for r in table.read().collect()) == [(1, at + dt.timedelta(hours=1)), (2, at)]
    import pathlib

    import pyarrow.parquet as pq

    files = list(pathlib.Path(path).rglob("*.parquet"))
    assert len(files) == 3 and {str(pq.read_schema(f).field("ts").type) for f in files} == {"timestamp[us, tz=UTC]"}


def test_constant_meta_columns_are_dictionary_pages_that_read_as_plain_strings(spark, tmp_path):
    """Base files get their constant meta columns from one-entry dictionaries. Readers must
    still see plain strings (the footer's ARROW:schema) with every row's values, in a bulk
    file and in a file that carries stored rows over (commit times of two instants)."""
    import base64
    import pathlib

    import pyarrow.parquet as pq

    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    first = table.write(spark.createDataFrame([(i, "a", 1, f"v{i}") for i in range(50)], SCHEMA), "bulk_insert").instant
    second = table.write(spark.createDataFrame([(7, "a", 2, "new")], SCHEMA), "upsert").instant
    files = list(pathlib.Path(path).rglob("*.parquet"))
    rewritten = [f for f in files if f.name.endswith(f"_{second}.parquet")]
    assert len(rewritten) == 1 and all(f.name.endswith(f"_{first}.parquet") for f in files if f not in rewritten)
    for f in files:
        parquet = pq.ParquetFile(f)
        stored = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(parquet.metadata.metadata[b"ARROW:schema"])))
        assert stored == parquet.schema_arrow and stored.field("id").type == pa.int64()
        assert {stored.field(c).type for c in ("_hoodie_file_name", "_hoodie_commit_time", "_hoodie_partition_path")} == {pa.string()}
        rows = parquet.read(columns=["_hoodie_file_name", "_hoodie_partition_path", "_hoodie_commit_time"]).to_pydict()
        assert set(rows["_hoodie_file_name"]) == {f.name} and set(rows["_hoodie_partition_path"]) == {"p=a"}
        chunk = parquet.metadata.row_group(0).column(parquet.schema_arrow.get_field_index("_hoodie_file_name"))
        assert chunk.has_dictionary_page
    carried = pq.read_table(rewritten[0]).to_pydict()
    assert sorted(set(carried["_hoodie_commit_time"])) == [first, second]
    assert hudi_rows(path) == ours(table) and len(hudi_rows(path)) == 50 and (7, "new") in hudi_rows(path)


def test_small_arrow_batches_are_joined_and_large_ones_pass_through_uncopied():
    from runtime.table.files import _coalesced

    small = pa.RecordBatch.from_pydict({"x": list(range(1000))})  # 8,000 bytes
    joined = list(_coalesced(iter([small] * 5), 20_000))
    assert [b.num_rows for b in joined] == [2000, 2000, 1000]
    large = [pa.RecordBatch.from_pydict({"x": list(range(n))}) for n in (2000, 2400, 100)]  # 16,000, 19,200, 800 bytes
    out = list(_coalesced(iter(large), 20_000))
    assert out[0] is large[0] and [b.num_rows for b in out] == [2000, 2500]


def test_a_few_file_groups_go_to_as_many_write_tasks(spark):
    """Write tasks get the rows of the file groups known on the driver in turn (and partition
    tasks the table partitions of the batch). Hashing the file id alone put both groups of a
    one-partition upsert into one of its three tasks in a third of tables, and that task
    rewrote them one after the other."""
    from pyspark.sql import functions as F

    from runtime.table.writer import FILE_ID, _in_turns, _murmur3_int

    values = [0, 1, -1, 7, 123456, 2**31 - 1, -2**31]
    assert [r[0] for r in spark.createDataFrame([(v,) for v in values], "v int").select(F.hash("v")).collect()] == [_murmur3_int(v) for v in values]
    for groups, tasks in ((2, 3), (3, 3), (5, 8), (9, 4)):
        ids = [f"{i:08d}-0000-0000-0000-000000000000-0" for i in range(groups)]
        rows = spark.createDataFrame([(fid, n) for fid in ids for n in range(20)], f"{FILE_ID} string, n int")
        placed = _in_turns(F, rows, FILE_ID, ids, tasks).rdd.mapPartitionsWithIndex(lambda i, it: [(i, r[FILE_ID]) for r in it]).distinct().collect()
        per_task = {}
        for task, fid in placed:
            per_task.setdefault(task, set()).add(fid)
        assert sorted(len(v) for v in per_task.values()) == sorted([groups // tasks + (t < groups % tasks) for t in range(tasks) if groups // tasks + (t < groups % tasks)])
        assert sum(len(v) for v in per_task.values()) == groups  # each group in exactly one task


def test_the_spark_schema_of_a_tables_files_is_remembered_per_spark_setting(spark, tmp_path, monkeypatch):
    """Table.schema asks Spark for the schema of the table's latest file once per Parquet
    schema, Spark version and Parquet reading settings, and keeps its answer in pipe's cache
    folder: a later process reads it back. A setting that changes what Spark reads (binary
    columns as strings) is another entry, never the remembered one."""
    from runtime.table import table as table_module

    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPE_CACHE_DIR", str(cache))
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id", "at"), precombine_field="ms"))
    df = spark.createDataFrame([(7, "2024-03-01 10:00:00", 1709287200123, "12345.67", b"\x00\xff", {"a": [1, 2]})],
                               "id long, at string, ms long, amount string, raw binary, tags map<string,array<int>>")
    df = df.selectExpr("id", "cast(at as timestamp) as at", "ms", "cast(amount as decimal(38,18)) as amount", "raw", "tags")
    table.write(df, "upsert")
    expected = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]

    table_module._FILE_SCHEMAS.clear()  # as a new process
    assert [(f.name, f.dataType.simpleString()) for f in table.schema().fields] == expected
    remembered = list((cache / "spark-schemas").glob("*.json"))
    assert len(remembered) == 1
    table_module._FILE_SCHEMAS.clear()
    assert [(f.name, f.dataType.simpleString()) for f in table.schema().fields] == expected
    assert list((cache / "spark-schemas").glob("*.json")) == remembered  # read back, not asked again

    spark.conf.set("spark.sql.parquet.binaryAsString", "true")
    try:
        table_module._FILE_SCHEMAS.clear()
        assert table.schema()["raw"].dataType.simpleString() == "string"  # Spark's answer for this setting
    finally:
        spark.conf.unset("spark.sql.parquet.binaryAsString")
    assert len(list((cache / "spark-schemas").glob("*.json"))) == 2
    # a damaged entry is asked of Spark again, and written anew
    for f in (cache / "spark-schemas").glob("*.json"):
        f.write_text("{not json")
    table_module._FILE_SCHEMAS.clear()
    assert [(f.name, f.dataType.simpleString()) for f in table.schema().fields] == expected
    assert any(f.read_text().startswith('{"fields"') for f in (cache / "spark-schemas").glob("*.json"))
