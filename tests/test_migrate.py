"""`pipe migrate` (issue 41, part 4): a table's Hudi version changed in place, between 6 (Hudi
0.14/0.15) and 8, 9 (Hudi 1.0/1.1), as Java's UpgradeDowngrade does, proven by Java of each
version reading and writing the table after it, with hudi-rs and pipe reading the same rows;
and a migration killed at each of its steps, which leaves the old or the new version (Java
reads it), finished by running it again."""

from __future__ import annotations

import decimal
import os
import sys
import textwrap

import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig, TableError
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ, read_properties
from runtime.table.history import instant_rows
from runtime.table.timeline import ARCHIVED, HOODIE, TIMELINE_V2, parse_instant_file
from tests.java_hudi.client import hudi_rs

SCHEMA = "id long, region string, ts long, amount decimal(12,2), v string"
REGIONS = ("eu", "us", "sa")
JAVA_META = {"hoodie.metadata.enable": "true", "hoodie.enable.data.skipping": "true"}


def batch(ids, r: int):
    return [(i, REGIONS[i % 3], 1_700_000_000_000 + r * 1000 + i, decimal.Decimal(f"{i}.{r:02d}"), f"Zoë \"{r}\" d'or {i}") for i in ids]


def arrow(rows) -> pa.Table:
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "region": [r[1] for r in rows],
                     "ts": pa.array([r[2] for r in rows], pa.int64()), "amount": pa.array([r[3] for r in rows], pa.decimal128(12, 2)),
                     "v": [r[4] for r in rows]})


def java_upsert(version: int, table_type: str) -> dict:
    """Java's DataFrame writer options for an upsert (its defaults otherwise: the metadata table on)."""
    return {"hoodie.table.name": "ledger", "hoodie.datasource.write.operation": "upsert",
            "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
            "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
            "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
            "hoodie.write.table.version": str(version), "hoodie.write.auto.upgrade": "false"}


class Model:
    def __init__(self):
        self.rows: dict[int, tuple] = {}

    def upsert(self, rows):
        for r in rows:
            if r[0] not in self.rows or self.rows[r[0]][2] <= r[2]:
                self.rows[r[0]] = r

    def delete(self, ids):
        for i in ids:
            self.rows.pop(i, None)

    def sorted(self):
        return sorted((r[0], r[1], r[4]) for r in self.rows.values())


def rows_of(t) -> list[tuple]:
    if isinstance(t, pa.Table):
        return sorted(zip(t.column("id").to_pylist(), t.column("region").to_pylist(), t.column("v").to_pylist()))
    return sorted((r["id"], r["region"], r["v"]) for r in t.collect())


def readers_agree(spark, java, path, model: Model, as_of: str | None = None, then: Model | None = None) -> None:
    """pipe, hudi-rs and Java (the metadata table on, data skipping) read the model; as of
    `as_of`, pipe and Java read `then`."""
    assert rows_of(Table.open(spark, str(path)).read()) == model.sorted()
    assert rows_of(hudi_rs(path)) == model.sorted()
    assert rows_of(java.read(path, **JAVA_META)) == model.sorted()
    if as_of is not None:
        assert rows_of(Table.open(spark, str(path)).read(as_of=as_of)) == then.sorted()
        assert rows_of(java.read(path, as_of=as_of)) == then.sorted()


def version_of(path) -> int:
    return int((path / ".hoodie/hoodie.properties").read_text(encoding="latin-1").split("hoodie.table.version=")[1].split("\n")[0])


def old_layout_left(path, layout: int) -> list[str]:
    """Files of timeline layout `layout` in the table: none once a migration away from it finished."""
    if layout == 2:
        folder = path / TIMELINE_V2
        return sorted(str(p) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
    return sorted(n for d in (HOODIE, ARCHIVED) if (path / d).exists() for n in os.listdir(path / d) if parse_instant_file(n))


@pytest.mark.java_hudi
def test_a_merge_on_read_table_migrated_from_6_to_9_and_back_is_read_and_written_by_java_of_each_version(
        spark, tmp_path, java_hudi_015, java_hudi_11):
    """Version 6, merge-on-read, with a metadata table, archived instants and log files: up to 9
    (compacted first, the timeline in layout 2, the history in the LSM tree), Java 1.1 reads it
    now and as of an instant before, and writes on; back down to 6, Java 0.15 reads and writes
    on. pipe writes after each of them."""
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", table_type=MERGE_ON_READ, record_key_fields=("id",),
                                                       partition_fields=("region",), precombine_field="ts", metadata_table=True))
    model = Model()
    df = lambda rows: spark.createDataFrame(rows, SCHEMA)  # noqa: E731
    first = batch(range(3000), 0)
    table.write(df(first), "bulk_insert")
    model.upsert(first)
    for r in range(1, 9):
        rows = batch(range(r * 300, r * 300 + 900, 2), r)
        table.write(df(rows), "upsert", compact_after=4)
        model.upsert(rows)
    table.clean("keep_latest_commits", 3)
    assert table.archive(min_instants=4, max_instants=6), "nothing was archived: the history's conversion goes untested"
    gone = list(range(5, 3000, 11))
    table.write(df(batch(gone, 9)), "delete")
    model.delete(gone)
    rows = batch(range(1, 2000, 7), 10)
    table.write(df(rows), "upsert")  # log files in the latest slices: the migration compacts them first
    model.upsert(rows)
    pinned, then = Table.open(spark, str(path)).timeline().latest_completed().time, Model()
    then.rows = dict(model.rows)
    assert any(s.has_logs for s in Table.open(spark, str(path)).view().latest_slices())

    dry = Table.open(spark, str(path)).migrate(9, dry_run=True)
    assert version_of(path) == 6 and dry.compact_groups > 0 and dry.archived > 0 and dry.metadata_table
    m = Table.open(spark, str(path)).migrate(9)
    assert version_of(path) == 9 and m.archived == dry.archived and m.compact_groups == dry.compact_groups
    assert old_layout_left(path, 1) == []
    props = read_properties(Table.open(spark, str(path)).storage)
    assert props["hoodie.table.ordering.fields"] == "ts" and "hoodie.table.precombine.field" not in props
    assert props["hoodie.table.metadata.partitions"] == "files" and props["hoodie.table.initial.version"] == "6"
    timeline = Table.open(spark, str(path)).timeline()
    assert timeline.layout == 2 and all(i.completion for i in timeline.completed())
    assert timeline.commit_metadata(timeline.latest_completed()).extra["pipe.migrated"] == "6 -> 9"
    assert instant_rows(Table.open(spark, str(path)))[-1]["detail"] == "migrated from version 6 to 9"  # as `pipe timeline` shows it
    readers_agree(spark, java_hudi_11, path, model, pinned, then)

    rows = batch(range(0, 4000, 9), 20)  # Java 1.1 writes on (its defaults: the metadata table kept)
    java_hudi_11.write(path, arrow(rows), java_upsert(9, MERGE_ON_READ))
    model.upsert(rows)
    rows = batch(range(3, 4200, 13), 21)
    Table.open(spark, str(path)).write(df(rows), "upsert")
    model.upsert(rows)
    readers_agree(spark, java_hudi_11, path, model)

    m = Table.open(spark, str(path)).migrate(6)
    assert version_of(path) == 6 and m.mtimes_kept and old_layout_left(path, 2) == []
    assert (path / ".hoodie/metadata/.hoodie/hoodie.properties").exists()
    readers_agree(spark, java_hudi_015, path, model, pinned, then)
    rows = batch(range(2, 4400, 17), 30)  # Java 0.15 writes on
    java_hudi_015.write(path, arrow(rows), java_upsert(6, MERGE_ON_READ))
    model.upsert(rows)
    rows = batch(range(4, 4600, 19), 31)
    Table.open(spark, str(path)).write(df(rows), "upsert")
    model.upsert(rows)
    readers_agree(spark, java_hudi_015, path, model)


CHILD = textwrap.dedent("""
    import sys
    from runtime.spark.session import get_spark
    from runtime.table import Table
    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    Table.open(spark, sys.argv[1]).migrate(int(sys.argv[2]))
    print("MIGRATED")
""")


@pytest.mark.java_hudi
def test_a_migration_killed_at_each_step_leaves_the_old_or_the_new_version_and_running_it_again_finishes(
        spark, warm_python, tmp_path, java_hudi_015, java_hudi_11):
    """kill -9 after the new timeline is written (the old version stays: Java 0.15 reads it) and
    after hoodie.properties changed (the new version: Java 1.1 reads it, the old layout's files
    still there); `migrate` again finishes, and a crash going down is the same."""
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", table_type=COPY_ON_WRITE, record_key_fields=("id",),
                                                       partition_fields=("region",), precombine_field="ts"))
    model = Model()
    for r in range(4):
        rows = batch(range(r * 200, r * 200 + 600), r)
        table.write(spark.createDataFrame(rows, SCHEMA), "upsert")
        model.upsert(rows)

    def killed(to: int, point: str) -> None:
        env = {**os.environ, "PIPE_FAULT": point}
        proc = warm_python.run([sys.executable, "-c", CHILD, str(path), str(to)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 77 and "MIGRATED" not in proc.stdout, proc.stderr[-2000:]

    killed(9, "migrate_after_timeline")
    assert version_of(path) == 6 and old_layout_left(path, 2), "the new timeline was not written before the kill"
    assert rows_of(java_hudi_015.read(path)) == model.sorted() == rows_of(hudi_rs(path))
    killed(9, "migrate_after_properties")  # the unused files of the first try are written anew
    assert version_of(path) == 9 and old_layout_left(path, 1), "the old timeline is already gone: the kill proves nothing"
    assert rows_of(java_hudi_11.read(path)) == model.sorted() == rows_of(hudi_rs(path))
    done = Table.open(spark, str(path)).migrate(9)  # again: the interrupted migration's old files go
    assert done.from_version == 9 and done.finished and old_layout_left(path, 1) == []
    rows = batch(range(0, 900, 4), 10)
    Table.open(spark, str(path)).write(spark.createDataFrame(rows, SCHEMA), "upsert")
    model.upsert(rows)
    assert rows_of(java_hudi_11.read(path)) == model.sorted()

    killed(6, "migrate_after_properties")
    assert version_of(path) == 6 and old_layout_left(path, 2)
    assert rows_of(java_hudi_015.read(path)) == model.sorted() == rows_of(hudi_rs(path))
    Table.open(spark, str(path)).migrate(6)
    assert old_layout_left(path, 2) == []
    rows = batch(range(1, 900, 5), 11)
    java_hudi_015.write(path, arrow(rows), java_upsert(6, COPY_ON_WRITE))
    model.upsert(rows)
    assert rows_of(Table.open(spark, str(path)).read()) == model.sorted()


def test_a_migration_pipe_cannot_do_is_refused_and_changes_nothing(spark, tmp_path):
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", record_key_fields=("id",), partition_fields=("region",)))
    table.write(spark.createDataFrame(batch(range(10), 0), SCHEMA), "upsert")
    before = (path / ".hoodie/hoodie.properties").read_bytes()
    with pytest.raises(TableError, match="to version 6, 8 or 9, not 7"):
        Table.open(spark, str(path)).migrate(7)
    props = (path / ".hoodie/hoodie.properties").read_text(encoding="latin-1")
    (path / ".hoodie/hoodie.properties").write_text(props.replace("DefaultHoodieRecordPayload", "PartialUpdateAvroPayload")
                                                    .replace("OverwriteWithLatestAvroPayload", "PartialUpdateAvroPayload"), encoding="latin-1")
    with pytest.raises(TableError, match="payload class org.apache.hudi.common.model.PartialUpdateAvroPayload"):
        Table.open(spark, str(path)).migrate(9)
    assert version_of(path) == 6 and old_layout_left(path, 2) == []
    (path / ".hoodie/hoodie.properties").write_bytes(before)
    # a pending instant pipe does not finish: a clustering Java planned
    from runtime.table import avro

    plan = avro.to_bytes(avro.REQUESTED_REPLACE_METADATA, {**avro.EMPTY_REPLACE_REQUEST, "operationType": "CLUSTER"})
    (path / ".hoodie/20300101000000000.replacecommit.requested").write_bytes(plan)
    with pytest.raises(TableError, match="pending instants pipe does not finish"):
        Table.open(spark, str(path)).migrate(9)
    assert (path / ".hoodie/hoodie.properties").read_bytes() == before and old_layout_left(path, 2) == []
    assert (path / ".hoodie/20300101000000000.replacecommit.requested").exists()


@pytest.mark.java_hudi
def test_the_instants_java_archived_are_in_the_history_after_an_upgrade(spark, tmp_path, java_hudi_015, java_hudi_11):
    """Java 0.15's archive logs (.hoodie/archived/.commits_.archive.N) become rows of the LSM
    history, as Java's 7 -> 8 upgrade converts them: every commit Java made is on the upgraded
    table's timeline, active or archived, and Java 1.1 reads and writes on."""
    from runtime.table import lsm_timeline

    path = tmp_path / "ledger"
    model = Model()
    archiving = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "3", "hoodie.cleaner.commits.retained": "1",
                 "hoodie.metadata.enable": "false"}
    for r in range(6):
        rows = batch(range(r * 50, r * 50 + 200), r)
        java_hudi_015.write(path, arrow(rows), {**java_upsert(6, COPY_ON_WRITE), **archiving})
        model.upsert(rows)
    logs = [n for n in os.listdir(path / ARCHIVED) if n.startswith(".commits_.archive.")]
    assert logs, "Java archived nothing: the conversion goes untested"
    commits = {n.split(".")[0] for n in os.listdir(path / ".hoodie") if n.endswith(".commit")}
    m = Table.open(spark, str(path)).migrate(9)
    assert m.archived > 0 and not m.kept, m.lines()
    table = Table.open(spark, str(path))
    history = {i.time: i for i in lsm_timeline.archived_instants(table.storage)}
    written = {i.time for i in table.timeline().completed(("commit",))} | {t for t, i in history.items() if i.action == "commit"}
    assert commits <= written and len(written) >= 7, (sorted(commits), sorted(written))  # 6 of Java's, and the migration's
    assert all(i.completion and i.completion >= i.time for i in history.values())
    assert rows_of(java_hudi_11.read(path)) == model.sorted() == rows_of(hudi_rs(path))
    rows = batch(range(7, 400, 3), 10)
    java_hudi_11.write(path, arrow(rows), {**java_upsert(9, COPY_ON_WRITE), "hoodie.metadata.enable": "false"})
    model.upsert(rows)
    assert rows_of(Table.open(spark, str(path)).read()) == model.sorted()
