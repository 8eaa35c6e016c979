"""The replacing operations (insert_overwrite, insert_overwrite_table, delete_partition): rows
both readers return afterwards and as of before, the replacecommit on the timeline as Hudi
writes it, upserts on top, crash rollback, cleaning and archiving of replaced file groups."""

from __future__ import annotations

import decimal
import io
import json
import os
import sys
import textwrap
import zipfile
from pathlib import Path

import fastavro
import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig, TableError
from runtime.table import avro
from runtime.table.services import archived_instants

pytestmark = pytest.mark.spark

FIXTURE = Path("/work/shared/fixtures/hudi/cow_v6_simplekeygen_nonhivestyle_overwritetable.zip")
SCHEMA = "id long, p string, ts long, v string"
OLD = [(1, "a", 1, "x"), (2, "a", 1, "y"), (3, "b", 1, "z")]


# --- helpers -----------------------------------------------------------------------------------


def make(spark, tmp_path: Path, partitioned: bool) -> tuple[Table, Path]:
    path = tmp_path / "t"
    config = TableConfig("t", record_key_fields=("id",), partition_fields=("p",) if partitioned else (), precombine_field="ts")
    return Table.create(spark, str(path), config), path


def df(spark, rows, schema=SCHEMA):
    return spark.createDataFrame(rows, schema)


def pipe_rows(table: Table, as_of=None) -> list[tuple]:
    return sorted((r["id"], r["v"]) for r in table.read(as_of=as_of).collect())


def hudi_rows(path: Path, as_of=None) -> list[tuple]:
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    opts = hudi.HudiReadOptions()
    if as_of is not None:
        opts = opts.with_as_of_timestamp(as_of)
    batches = t.read(opts)
    return sorted((r["id"], r["v"]) for r in pa.Table.from_batches(batches).to_pylist()) if batches else []


def assert_rows(table: Table, path: Path, expected: list[tuple], as_of=None) -> None:
    assert pipe_rows(table, as_of) == expected, "pipe's reader"
    assert hudi_rows(path, as_of) == expected, "hudi-rs"


def groups(table: Table) -> dict[str, list[str]]:
    """Live file groups: partition -> sorted file ids."""
    out: dict[str, list[str]] = {}
    for s in table.view().latest_slices():
        out.setdefault(s.partition, []).append(s.file_id)
    return {p: sorted(ids) for p, ids in out.items()}


def instant_json(path: Path, name: str) -> dict:
    return json.loads((path / ".hoodie" / name).read_text())


def canonical(schema: dict) -> str:
    return fastavro.schema.to_parsing_canonical_form(schema)


def fixture_requested() -> bytes:
    with zipfile.ZipFile(FIXTURE) as z:
        [name] = [n for n in z.namelist() if n.endswith(".replacecommit.requested") and "__MACOSX" not in n]
        return z.read(name)


# --- every operation, partitioned and not ----------------------------------------------------------

# operation -> (input rows, options, rows after: partitioned, rows after: non-partitioned)
CASES = {
    # max_file_size=1: one row per new file group, so the input spreads over several groups
    "insert_overwrite": ([(1, "a", 2, "x2"), (4, "a", 2, "n")], {"max_file_size": 1},
                         [(1, "x2"), (3, "z"), (4, "n")], [(1, "x2"), (4, "n")]),
    "insert_overwrite_table": ([(1, "a", 2, "x2"), (4, "b", 2, "n")], {},
                               [(1, "x2"), (4, "n")], [(1, "x2"), (4, "n")]),
    "delete_partition": (None, {"partitions_to_delete": ["p=a*"]}, [(3, "z")], []),
}


@pytest.mark.parametrize("partitioned", [True, False], ids=["partitioned", "nonpartitioned"])
@pytest.mark.parametrize("operation", list(CASES))
def test_replacing_operation(spark, tmp_path, operation, partitioned):
    rows, options, want_part, want_flat = CASES[operation]
    expected = want_part if partitioned else want_flat
    table, path = make(spark, tmp_path, partitioned)
    first = table.write(df(spark, OLD), "upsert")
    before = groups(table)
    if operation == "delete_partition" and not partitioned:
        options = {"partitions_to_delete": ["*"]}  # the one partition, ""
    files_before = sorted(p.name for p in path.rglob("*.parquet"))

    result = table.write(df(spark, rows) if rows else None, operation, **options)

    # (a), (b) rows of both readers
    assert_rows(table, path, expected)
    # (c) a completed replacecommit naming exactly the replaced groups
    want_replaced = {p: ids for p, ids in before.items() if not partitioned or operation == "insert_overwrite_table" or p == "p=a"}
    assert result.action == "replacecommit" and result.operation == operation
    assert result.replaced_file_groups == sum(len(ids) for ids in want_replaced.values())
    done = instant_json(path, f"{result.instant}.replacecommit")
    assert done["operationType"] == operation.upper()
    assert done["partitionToReplaceFileIds"] == want_replaced
    assert "schema" in done["extraMetadata"]
    stats = [s for lst in done["partitionToWriteStats"].values() for s in lst]
    assert sum(s["numInserts"] for s in stats) == result.inserts == (len(rows) if rows else 0)
    assert len(stats) == result.files
    assert not {s["fileId"] for s in stats} & {f for ids in before.values() for f in ids}, "new rows go to new file groups"
    if operation == "insert_overwrite":
        assert len(stats) == 2  # max_file_size=1: a group per row
    if operation == "delete_partition":
        assert stats == [] and sorted(p.name for p in path.rglob("*.parquet")) == files_before
    assert [i.time for i in table.timeline().completed()] == [first.instant, result.instant]
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build().get_timeline()
    assert [i.timestamp for i in t.get_completed_replacecommits()] == [result.instant]
    assert t.get_completed_clustering_commits() == []
    # (d) time travel to the previous instant
    assert_rows(table, path, [(1, "x"), (2, "y"), (3, "z")], as_of=first.instant)

    # (e) an upsert on top updates keys in their (new or old) file groups, no duplicates
    after = table.write(df(spark, [(3, "b", 5, "z5"), (4, "a", 5, "n5")]), "upsert")
    expected = sorted({**dict(expected), 3: "z5", 4: "n5"}.items())
    assert after.action == "commit"
    assert_rows(table, path, expected)

    # (g) once the replacecommit is older than every retained commit, cleaning deletes the
    # replaced groups' files; both readers still return the right rows
    for ts in (6, 7):
        table.write(df(spark, [(3, "b", ts, f"z{ts}")]), "upsert", clean_retain=2)
    expected = sorted({**dict(expected), 3: "z7"}.items())
    for fid in (f for ids in want_replaced.values() for f in ids):
        assert list(path.rglob(f"{fid}_*.parquet")) == [], f"replaced group {fid} was cleaned"
    assert list((path / ".hoodie").glob("*.clean"))
    assert_rows(table, path, expected)


# --- the timeline files, as Hudi writes them ---------------------------------------------------


def test_replacecommit_files_match_hudis(spark, tmp_path):
    table, path = make(spark, tmp_path, True)
    table.write(df(spark, OLD), "upsert")
    result = table.write(df(spark, [(9, "c", 1, "q")]), "insert_overwrite_table")
    hoodie = path / ".hoodie"
    # requested: Avro HoodieRequestedReplaceMetadata, every field null, like the fixture's
    ours = fastavro.reader(io.BytesIO((hoodie / f"{result.instant}.replacecommit.requested").read_bytes()))
    theirs = fastavro.reader(io.BytesIO(fixture_requested()))
    assert canonical(ours.writer_schema) == canonical(theirs.writer_schema)
    assert list(ours) == list(theirs) == [avro.EMPTY_REPLACE_REQUEST]
    # inflight: commit metadata JSON with the operation and no replaced ids yet
    inflight = instant_json(path, f"{result.instant}.replacecommit.inflight")
    assert inflight["operationType"] == "INSERT_OVERWRITE_TABLE" and "partitionToReplaceFileIds" not in inflight
    # completed: the fixture's keys, in the fixture's order
    with zipfile.ZipFile(FIXTURE) as z:
        [name] = [n for n in z.namelist() if n.endswith(".replacecommit") and "__MACOSX" not in n]
        fixture = json.loads(z.read(name))
    assert list(instant_json(path, f"{result.instant}.replacecommit")) == list(fixture)
    assert not (hoodie / f"{result.instant}.commit").exists() and not (hoodie / f"{result.instant}.inflight").exists()


# --- full refresh: dedupe by key with the precombine, then replace the whole table ------------


def test_full_refresh_dedupes_with_the_precombine_and_may_change_the_schema(spark, tmp_path):
    table, path = make(spark, tmp_path, True)
    table.write(df(spark, [(1, "a", 1, "x", "e"), (2, "b", 1, "y", "e")], SCHEMA + ", extra string"), "upsert")
    old = table.timeline().latest_completed().time
    rows = [
        (1, "a", 1, 10, False), (1, "a", 5, 50, False), (1, "a", 3, 30, False),  # ts 5 wins
        (2, "b", 1, 20, False),
        (5, "b", 2, 0, True), (5, "b", 1, 51, False),  # its winning row deletes it: absent
        (6, "c", 1, 60, False), (6, "c", 2, 0, True), (6, "c", 2, 61, False),  # tie: the later row wins
    ]
    # v changes type (string -> long) and `extra` goes: a full refresh may do both
    new = df(spark, rows, "id long, p string, ts long, v long, _hoodie_is_deleted boolean")
    result = table.write(new, "insert_overwrite_table", combine_before_insert=True)
    assert result.inserts == 3 and result.replaced_file_groups == 2
    assert pipe_rows(table) == hudi_rows(path) == [(1, 50), (2, 20), (6, 61)]
    assert [f.name for f in table.schema()] == ["id", "p", "ts", "v"]
    assert table.read().schema["v"].dataType.simpleString() == "bigint"
    # time travel reads the old rows with the old schema
    assert pipe_rows(table, as_of=old) == [(1, "x"), (2, "y")]
    assert sorted(r["extra"] for r in table.read(as_of=old).collect()) == ["e", "e"]


def test_time_travel_to_a_write_without_files_after_archival_reads_the_schema_of_its_time(spark, tmp_path):
    """The schema of a time travel read comes from the newest base file as of the instant read.
    For an instant that wrote no file (a delete_partition) whose earlier commits are archived,
    pipe took the newest live base file of the table instead: after a full refresh that turned a
    double into a decimal, reads of the past came back as rounded decimals (found by Java Hudi's
    time travel, tests/test_java_interop.py::build_cow_services)."""
    table, path = make(spark, tmp_path, True)
    schema = "id long, p string, ts long, price double"
    for n in range(4):
        table.write(df(spark, [(1, "a", n, 1 / 3 + n), (2, "b", n, 2 / 3 + n)], schema), "upsert")
    deleted = table.write(None, "delete_partition", partitions_to_delete=("p=b",)).instant
    table.write(df(spark, [(1, "a", 9, 1.25)], schema), "upsert")
    assert table.archive(min_instants=2, max_instants=3)
    table.write(df(spark, [(1, "a", 10, decimal.Decimal("1.250"))], "id long, p string, ts long, price decimal(12,3)"), "insert_overwrite_table")
    past = table.read(as_of=deleted)
    assert past.schema["price"].dataType.simpleString() == "double"
    assert [(r["id"], r["price"]) for r in past.collect()] == [(1, 1 / 3 + 3)]


def test_insert_overwrite_keeps_duplicates_without_combine(spark, tmp_path):
    table, path = make(spark, tmp_path, True)
    table.write(df(spark, OLD), "upsert")
    table.write(df(spark, [(7, "a", 1, "p"), (7, "a", 2, "q")]), "insert_overwrite")
    assert_rows(table, path, [(3, "z"), (7, "p"), (7, "q")])  # no index, no precombine


# --- delete_partition patterns -------------------------------------------------------------------


def test_delete_partition_with_a_wildcard_and_with_patterns_matching_nothing(spark, tmp_path):
    table, path = make(spark, tmp_path, True)
    table.write(df(spark, [(1, "2024-01", 1, "jan"), (2, "2024-02", 1, "feb"), (3, "2023-12", 1, "dec")]), "upsert")
    before = groups(table)
    timeline = [i.time for i in table.timeline().instants]

    for patterns in (["p=2025-*"], ["p=2024-01", "2024-02"], []):
        with pytest.raises(TableError) as info:
            table.write(None, "delete_partition", partitions_to_delete=patterns)
        assert "'p=2023-12', 'p=2024-01', 'p=2024-02'" in str(info.value)  # the partitions, listed
    assert [i.time for i in table.timeline().instants] == timeline, "a refused delete_partition leaves no instant"
    with pytest.raises(TableError, match="applies to operation delete_partition"):
        table.write(df(spark, OLD), "insert_overwrite", partitions_to_delete=["p=*"])

    result = table.write(None, "delete_partition", partitions_to_delete=["p=2024-*"])
    done = instant_json(path, f"{result.instant}.replacecommit")
    assert done["operationType"] == "DELETE_PARTITION" and done["partitionToWriteStats"] == {}
    assert done["partitionToReplaceFileIds"] == {p: before[p] for p in ("p=2024-01", "p=2024-02")}
    assert_rows(table, path, [(3, "dec")])
    # the deleted partition takes new rows again
    table.write(df(spark, [(4, "2024-01", 1, "jan2")]), "upsert")
    assert_rows(table, path, [(3, "dec"), (4, "jan2")])


def test_pattern_errors_name_the_unmatched_pattern(spark, tmp_path):
    table, _ = make(spark, tmp_path, True)
    table.write(df(spark, OLD), "upsert")
    with pytest.raises(TableError, match=r"pattern\(s\) 'a' match no partition; its partitions are: 'p=a', 'p=b'"):
        table.write(None, "delete_partition", partitions_to_delete=["p=a", "a"])
    assert groups(table).keys() == {"p=a", "p=b"}


# --- crash and rollback ----------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    table = Table.open(spark, sys.argv[1])
    operation = sys.argv[2]
    if operation == "delete_partition":
        table.write(None, operation, partitions_to_delete=sys.argv[3:])
    else:
        table.write(spark.createDataFrame([(1, "a", 9, "crashed"), (8, "b", 9, "crashed")], "id long, p string, ts long, v string"), operation)
    print("WROTE")
""")


# (insert_overwrite_table is rolled back the same way as insert_overwrite: by its instant's
# files; one crash test per shape, a write with files and one without, keeps the suite short)
@pytest.mark.parametrize("operation,partitioned", [("insert_overwrite", True), ("delete_partition", True)])
def test_a_crashed_replacecommit_is_rolled_back_by_the_next_write(spark, warm_python, tmp_path, operation, partitioned):
    table, path = make(spark, tmp_path, partitioned)
    table.write(df(spark, OLD), "upsert")
    committed = [i.time for i in table.timeline().completed()]
    env = {**os.environ, "PIPE_FAULT": "after_files"}
    proc = warm_python.run([sys.executable, "-c", CHILD, str(path), operation, "p=a"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stderr[-2000:]

    [dead] = table.timeline().pending()
    assert dead.action == "replacecommit"
    assert sorted(n.name for n in (path / ".hoodie").glob(f"{dead.time}.*")) == [f"{dead.time}.replacecommit.inflight", f"{dead.time}.replacecommit.requested"]
    if operation != "delete_partition":
        assert list(path.rglob(f"*_{dead.time}.parquet")), "the crashed writer had written its files"
    assert_rows(table, path, [(1, "x"), (2, "y"), (3, "z")])  # readers see the last completed state

    result = table.write(df(spark, [(5, "b", 1, "w")]), "upsert")
    timeline = table.timeline()
    assert timeline.pending() == []
    assert [i.time for i in timeline.completed()] == committed + [result.instant]
    assert list(path.rglob(f"*{dead.time}*")) == []  # its files and instant files are gone
    [rb] = list((path / ".hoodie").glob("*.rollback"))
    assert avro.from_bytes(rb.read_bytes())["instantsRollback"] == [{"commitTime": dead.time, "action": "replacecommit"}]
    assert_rows(table, path, [(1, "x"), (2, "y"), (3, "z"), (5, "w")])


# --- archiving -------------------------------------------------------------------------------------


def test_a_replacecommit_stays_active_until_its_replaced_files_are_cleaned(spark, tmp_path):
    table, path = make(spark, tmp_path, True)
    table.write(df(spark, OLD), "upsert")
    replace = table.write(df(spark, [(4, "a", 1, "n")]), "insert_overwrite")
    # no cleaning: archiving the replacecommit would bring p=a's replaced rows back
    for ts in (2, 3, 4):
        table.write(df(spark, [(3, "b", ts, f"z{ts}")]), "upsert", clean_inline=False, archive_min=2, archive_max=3)
    archived = [i.time for i in archived_instants(table.storage)]
    assert archived and replace.instant not in archived
    assert replace.instant in [i.time for i in table.timeline().completed()]
    assert_rows(table, path, [(3, "z4"), (4, "n")])
    # once cleaning removed the replaced files, the replacecommit may go
    table.clean(retain=1)
    table.write(df(spark, [(3, "b", 5, "z5")]), "upsert", clean_retain=1, archive_min=2, archive_max=3)
    assert replace.instant in [i.time for i in archived_instants(table.storage)]
    assert_rows(table, path, [(3, "z5"), (4, "n")])
