"""The metadata table kept in step (issue 41, part 2): its files partition lists exactly the
data table's committed files after every write and service, on versions 6 and 9, copy-on-write
and merge-on-read; a crash between the metadata deltacommit and the data commit shows readers
the table as before; Java's readers with hoodie.metadata.enable=true list files from it (a
planted file only a storage listing sees proves they do), Java writes on, and pipe keeps it in
step after Java, dropping the partitions it does not keep."""

from __future__ import annotations

import decimal
import os
import shutil
import sys
import textwrap
import uuid

import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table import hfile
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ, read_properties
from runtime.table.metadata_table import METADATA_TABLE, MetadataTable, _committed_files, init_instant
from runtime.table.timeline import CLEAN, archived_instants
from tests.java_hudi.client import hudi_rs

SCHEMA = "id long, region string, ts long, amount decimal(12,2), v string"
REGIONS = ("eu", "us", "apac", "latam")
JAVA_META = {"hoodie.metadata.enable": "true", "hoodie.enable.data.skipping": "true"}


@pytest.fixture(autouse=True)
def short_metadata_retention(monkeypatch):
    """The metadata table's clean keeps its last 4 commits here, not Java's 20, so that the
    ledger's twenty-odd commits see it clean (the rule is the same at any number)."""
    from runtime.table import metadata_table

    monkeypatch.setattr(metadata_table, "CLEAN_RETAIN", 4)


def config(version: int, table_type: str) -> TableConfig:
    return TableConfig(name="ledger", table_type=table_type, record_key_fields=("id",), partition_fields=("region",),
                       precombine_field="ts", create_version=version, metadata_table=True)


def batch(ids, r: int):
    return [(i, REGIONS[i % 4], 1_700_000_000_000 + r * 1000 + i, decimal.Decimal(f"{i}.{r:02d}"), f"Zoë \"{r}\" d'or {i}") for i in ids]


class Model:
    def __init__(self):
        self.rows: dict[int, tuple] = {}

    def upsert(self, rows):
        for r in rows:
            self.rows[r[0]] = (r[1], r[4])

    def sorted(self):
        return sorted((k, *v) for k, v in self.rows.items())


def in_step(table: Table) -> MetadataTable:
    """The files partition as a reader that trusts it sees it equals the committed files."""
    version = table.config.table_version
    mdt = MetadataTable(table.storage, version)
    assert "files" in read_properties(table.storage)["hoodie.table.metadata.partitions"].split(",")
    state = mdt.state(mdt.timeline(), table.timeline())
    listed = {p: fs for p, fs in _committed_files(table.storage, table.timeline()).items() if fs}
    assert {p: fs for p, fs in state.files.items() if fs} == listed
    assert set(listed) <= state.partitions
    assert mdt.timeline().pending() == []
    return mdt


def cleaned_and_archived(table: Table, path) -> list[str]:
    """The metadata table's own services ran: a clean instant, its first slice gone, instants
    archived (none of them still active, all before its latest slice). Returns its base files."""
    version = table.config.table_version
    mdt = MetadataTable(table.storage, version)
    timeline = mdt.timeline()
    assert timeline.completed((CLEAN,)), "the metadata table was never cleaned"
    archived = {i.time for i in archived_instants(mdt.storage, 2 if version >= 8 else 1)}
    assert archived, "its timeline was never archived"
    assert not archived & {i.time for i in timeline.instants} and max(archived) < mdt.slice_start(timeline)
    bases = sorted(p.name for p in (path / METADATA_TABLE / "files").glob("files-0000-0_*.hfile"))
    assert bases and not any(b.endswith("_" + init_instant(version) + ".hfile") for b in bases), f"the first slice was not cleaned: {bases}"
    return bases


def pipe_rows(table):
    return sorted((r["id"], r["region"], r["v"]) for r in table.read().collect())


def rs_rows(path):
    got = hudi_rs(path)
    return sorted(zip(got.column("id").to_pylist(), got.column("region").to_pylist(), got.column("v").to_pylist()))


def lifecycle(spark, path, version, table_type, check):
    """A ledger through every operation and service, `check(table, model)` after each."""
    table = Table.create(spark, str(path), config(version, table_type))
    model = Model()
    df = lambda rows: spark.createDataFrame(rows, SCHEMA)  # noqa: E731
    opts = dict(clean_retain=2, archive_min=6, archive_max=8, compact_after=3 if table_type == MERGE_ON_READ else None)
    first = batch(range(600), 0)
    table.write(df(first), "bulk_insert", **opts)
    model.upsert(first)
    check(table, model)
    for r in range(1, 7):  # updates, new keys and a key updated twice in a batch's input
        rows = batch(range(r * 40, r * 40 + 300, 3), r) + batch([r * 40], r + 1)
        table.write(df(rows), "upsert", **opts)
        model.upsert(batch(range(r * 40, r * 40 + 300, 3), r))
        model.upsert(batch([r * 40], r + 1))
        check(table, model)
    gone = list(range(5, 600, 11))
    table.write(df(batch(gone, 9)), "delete", **opts)
    for i in gone:
        model.rows.pop(i, None)
    check(table, model)
    apac = [(i, "apac", 1_700_000_900_000, decimal.Decimal("1.00"), f"apac {i}") for i in range(10_000, 10_030)]
    table.write(df(apac), "insert_overwrite", **opts)
    model.rows = {k: v for k, v in model.rows.items() if v[0] != "apac"}
    model.upsert(apac)
    check(table, model)
    saved = table.savepoint()
    snapshot = dict(model.rows)
    for r in (10, 11):
        rows = batch(range(0, 600, 7), r)
        latest = table.write(df(rows), "upsert", **opts).instant
        model.upsert(rows)
        check(table, model)
    table.rollback(latest)
    model.upsert(batch(range(0, 600, 7), 10))  # round 11 undone: round 10's values again
    check(table, model)
    table.restore(saved)
    model.rows = snapshot
    check(table, model)
    table.delete_savepoint(saved)
    if table_type == MERGE_ON_READ:
        table.compact()
        check(table, model)
    table.clean(policy="keep_latest_file_versions", retain=1)
    check(table, model)
    return table, model


# each (version, table type) once across this test and the Java one below (the other diagonal)
@pytest.mark.parametrize("version,table_type", [(6, COPY_ON_WRITE), (9, MERGE_ON_READ)])
def test_the_files_partition_lists_exactly_the_committed_files_after_every_operation_and_service(spark, tmp_path, version, table_type):
    path = tmp_path / "ledger"

    def check(table, model):
        in_step(table)
        assert pipe_rows(table) == model.sorted()
        assert rs_rows(path) == model.sorted()  # hudi-rs lists version 8+ tables from the files partition

    table, _ = lifecycle(spark, path, version, table_type, check)
    mdt = MetadataTable(table.storage, version)
    instants = {i.time for i in mdt.timeline().instants}
    writes = {i.time for i in table.timeline().completed()}  # every active write has its metadata deltacommit
    assert writes <= instants
    bases = cleaned_and_archived(table, path)
    h = hfile.read((path / METADATA_TABLE / "files" / bases[-1]).read_bytes())
    assert {k.decode() for k, _ in h.cells} >= {"__all_partitions__", "region=eu", "region=us"}
    assert "bloomFilter" in h.meta and h.file_info["schema"].startswith(b'{"type":"record","name":"HoodieMetadataRecord"')


CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    table = Table.open(spark, sys.argv[1])
    df = spark.createDataFrame([(1, "us", 5, 1.5, "crashed"), (9999, "eu", 5, 2.5, "crashed-new")],
                               "id long, region string, ts long, amount double, v string")
    table.write(df.selectExpr("id", "region", "ts", "cast(amount as decimal(12,2)) amount", "v"), "upsert")
    print("WROTE")
""")


def crashed_write(warm_python, table: Table, path, point: str) -> str:
    """An upsert (a key updated, a key added) in a process that dies hard at fault `point`;
    returns its instant, left in flight on the data table."""
    env = {**os.environ, "PIPE_FAULT": point}
    proc = warm_python.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77 and "WROTE" not in proc.stdout, proc.stderr[-2000:]
    pending = table.timeline().pending()
    assert len(pending) == 1, pending
    return pending[0].time


@pytest.mark.parametrize("version", [6, 9])
def test_a_crash_after_the_metadata_deltacommit_shows_the_table_as_before_and_the_next_write_rolls_it_back(spark, warm_python, tmp_path, version):
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), config(version, MERGE_ON_READ))
    model = Model()
    rows = batch(range(200), 0)
    table.write(spark.createDataFrame(rows, SCHEMA), "upsert")
    model.upsert(rows)
    before = in_step(table).timeline().instants
    dead = crashed_write(warm_python, table, path, "after_metadata_table")
    mdt = MetadataTable(table.storage, version)
    assert [i.time for i in mdt.timeline().completed(("deltacommit",))][-1] == dead  # the metadata table has its deltacommit
    state = mdt.state(mdt.timeline(), table.timeline())  # and a reader that trusts it takes it for in flight
    assert state.files == _committed_files(table.storage, table.timeline())
    assert rs_rows(path) == model.sorted() and pipe_rows(table) == model.sorted()
    more = batch(range(150, 260), 1)
    table.write(spark.createDataFrame(more, SCHEMA), "upsert")
    model.upsert(more)
    mdt = in_step(table)
    assert dead not in {i.time for i in mdt.timeline().instants} and not list((path / METADATA_TABLE).rglob(f"*{dead}*"))
    assert [i.time for i in before] == [i.time for i in mdt.timeline().instants][:len(before)]
    assert rs_rows(path) == model.sorted() and pipe_rows(table) == model.sorted()


def plant_a_file_only_a_listing_sees(path, table) -> str:
    """A copy of a live base file under a new file id and the latest write's instant: a reader
    that lists storage reads its rows twice; one that trusts the metadata table does not."""
    latest = table.timeline().latest_completed().time
    live = next(p for p in sorted((path / "region=eu").glob("*.parquet")))
    planted = path / "region=eu" / f"{uuid.uuid4()}-0_0-0-0_{latest}.parquet"
    shutil.copy(live, planted)
    return str(planted)


def java_upsert(version: int, table_type: str) -> dict:
    """Java's DataFrame writer options for an upsert into the ledger (its defaults otherwise:
    the metadata table on; 1.1 adds its column and partition stats)."""
    return {"hoodie.table.name": "ledger", "hoodie.datasource.write.operation": "upsert",
            "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
            "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
            "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
            "hoodie.write.table.version": str(version)}


def arrow(rows) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "region": [r[1] for r in rows], "ts": [r[2] for r in rows],
                     "amount": pa.array([r[3] for r in rows], pa.decimal128(12, 2)), "v": [r[4] for r in rows]})


def java_rows(java, path, **opts):
    """Java's snapshot read with the metadata table on and data skipping (`opts` on top)."""
    got = java.read(path, **{**JAVA_META, **opts})
    return sorted(zip(got.column("id").to_pylist(), got.column("region").to_pylist(), got.column("v").to_pylist()))


@pytest.mark.java_hudi
@pytest.mark.parametrize("version,table_type", [(6, MERGE_ON_READ), (9, COPY_ON_WRITE)])
def test_java_lists_pipes_tables_from_the_metadata_table_writes_on_and_pipe_keeps_it_in_step_after_java(
        spark, tmp_path, request, version, table_type):
    java = request.getfixturevalue("java_hudi_015" if version == 6 else "java_hudi_11")
    path = tmp_path / "ledger"
    table, model = lifecycle(spark, path, version, table_type, lambda t, m: in_step(t))
    cleaned_and_archived(table, path)  # Java reads a metadata table pipe cleaned and archived, and writes on it
    assert java_rows(java, path) == model.sorted()
    planted = plant_a_file_only_a_listing_sees(path, table)
    listing = java_rows(java, path, **{"hoodie.metadata.enable": "false"})
    assert len(listing) > len(model.rows), "the planted file is not seen by a listing: the probe proves nothing"
    assert java_rows(java, path) == model.sorted(), "Java did not list the files from pipe's metadata table"
    os.remove(planted)
    # Java writes on with its defaults (metadata table on; 1.1 adds its column and partition stats)
    rows = batch(range(0, 700, 5), 20)
    java.write(path, arrow(rows), java_upsert(version, table_type))
    model.upsert(rows)
    table = Table.open(spark, str(path))
    assert pipe_rows(table) == model.sorted() == java_rows(java, path)
    # pipe writes on after Java: the files partition stays, in step; what pipe does not keep is dropped
    rows = batch(range(3, 800, 4), 21)
    result = table.write(spark.createDataFrame(rows, SCHEMA), "upsert", compact_after=1 if table_type == MERGE_ON_READ else None)
    model.upsert(rows)
    partitions = read_properties(table.storage)["hoodie.table.metadata.partitions"]
    assert partitions == "files", partitions
    if version == 9:
        assert result.retired and "column_stats" in result.retired
    in_step(table)
    assert java_rows(java, path) == rs_rows(path) == model.sorted()
    plant_a_file_only_a_listing_sees(path, table)
    assert java_rows(java, path) == model.sorted()


@pytest.mark.java_hudi
@pytest.mark.parametrize("version,table_type,point", [(6, MERGE_ON_READ, "metadata_table_before_commit"),
                                                      (9, COPY_ON_WRITE, "after_metadata_table")])
def test_after_a_kill_9_java_reads_the_table_as_before_through_the_metadata_table_and_takes_over(
        spark, warm_python, tmp_path, request, version, table_type, point):
    """pipe killed with its metadata deltacommit in flight (its log block written; v6) or
    complete (v9) and the data instant in flight: Java, trusting the metadata table, reads the
    table as before; its next write rolls the dead instant back on both tables; Java, pipe and
    hudi-rs then agree, and pipe writes on with the files partition in step."""
    java = request.getfixturevalue("java_hudi_015" if version == 6 else "java_hudi_11")
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), config(version, table_type))
    model = Model()
    for r, (op, rows) in enumerate((("bulk_insert", batch(range(400), 0)), ("upsert", batch(range(0, 500, 3), 1)))):
        table.write(spark.createDataFrame(rows, SCHEMA), op)
        model.upsert(rows)
    in_step(table)
    dead = crashed_write(warm_python, table, path, point)
    mdt = MetadataTable(table.storage, version)
    written = {p.name for p in path.rglob(f"*{dead}*") if ".hoodie" not in p.parts}
    assert written, "the dead write left no data file: the crash proves nothing"
    assert java_rows(java, path) == model.sorted()
    rows = batch(range(1, 650, 4), 30)
    java.write(path, arrow(rows), java_upsert(version, table_type))  # rolls the dead instant back first
    model.upsert(rows)
    table = Table.open(spark, str(path))
    assert dead not in {i.time for i in table.timeline().instants if i.action != "rollback"}
    assert dead not in {i.time for i in mdt.timeline().instants}
    assert not {p.name for p in path.rglob(f"*{dead}*") if ".hoodie" not in p.parts}, "Java left the dead write's files"
    assert java_rows(java, path) == pipe_rows(table) == rs_rows(path) == model.sorted()
    rows = batch(range(2, 700, 6), 31)
    table.write(spark.createDataFrame(rows, SCHEMA), "upsert")
    model.upsert(rows)
    in_step(table)
    assert java_rows(java, path) == pipe_rows(table) == rs_rows(path) == model.sorted()
