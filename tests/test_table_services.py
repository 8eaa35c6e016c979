"""Clean, archive and rollback: what they leave on disk and on the timeline, and that both
readers still see the right rows afterwards."""

from __future__ import annotations

import hudi
import pytest
import pyarrow as pa

from runtime.table import Table, TableConfig
from runtime.table import avro
from runtime.table.errors import TableError
from runtime.table.services import archived_instants
from runtime.table.timeline import new_instant_time

CONFIG = TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",))


def hudi_rows(path, **opts):
    t = hudi.HudiTableBuilder.from_base_uri(path).build()
    options = hudi.HudiReadOptions()
    if "as_of" in opts:
        options = options.with_as_of_timestamp(opts["as_of"])
    batches = t.read(options)
    return sorted((r["id"], r["v"]) for r in pa.Table.from_batches(batches).to_pylist()) if batches else []


def write(spark, table, v, **kw):
    return table.write(spark.createDataFrame([(1, "a", v), (2, "b", v)], "id long, p string, v long"), "upsert", **kw)


def test_clean_keeps_the_versions_the_retained_commits_need(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    instants = [write(spark, table, v, clean_retain=2).instant for v in range(4)]
    versions = sorted(p.name.rsplit("_", 1)[1][: -len(".parquet")] for p in (tmp_path / "t/p=a").glob("*.parquet"))
    # versions of commits 2, 3, 4 stay (commit 2's is the newest older than the earliest retained, 3)
    assert versions == instants[1:]
    cleans = sorted((tmp_path / "t/.hoodie").glob("*.clean"))
    assert len(cleans) == 1  # after the 4th commit: commit 1's versions are the first no retained commit needs
    meta = avro.from_bytes(cleans[-1].read_bytes())
    assert meta["policy"] == "KEEP_LATEST_COMMITS" and meta["earliestCommitToRetain"] == instants[2]
    assert meta["totalFilesDeleted"] == 2 and set(meta["partitionMetadata"]) == {"p=a", "p=b"}
    plan = avro.from_bytes((tmp_path / "t/.hoodie" / (cleans[-1].name + ".requested")).read_bytes())
    assert plan["earliestInstantToRetain"]["timestamp"] == instants[2]
    assert hudi_rows(path) == [(1, 3), (2, 3)]
    assert hudi_rows(path, as_of=instants[2]) == [(1, 2), (2, 2)]
    assert sorted((r["id"], r["v"]) for r in table.read(as_of=instants[2]).collect()) == [(1, 2), (2, 2)]
    # commit 1's version was cleaned: reading it is refused (as Java refuses), not an empty result
    for read in (table.read, table.read_batches):
        with pytest.raises(TableError, match=f"as of {instants[0]} cannot be read: the clean at .* kept only the versions from {instants[2]} on"):
            read(as_of=instants[0])


def test_keep_latest_file_versions(spark, tmp_path):
    table = Table.create(spark, str(tmp_path / "t"), CONFIG)
    instants = [write(spark, table, v, clean_policy="keep_latest_file_versions", clean_retain=1).instant for v in range(3)]
    assert len(list((tmp_path / "t/p=a").glob("*.parquet"))) == 1
    assert hudi_rows(str(tmp_path / "t")) == [(1, 2), (2, 2)]
    # this policy names no earliest commit to retain: the missing files say the version is gone
    with pytest.raises(TableError, match=f"as of {instants[0]} cannot be read: the cleaner removed 2 of the files"):
        table.read(as_of=instants[0])


def test_archive_keeps_the_active_timeline_small_and_the_table_readable(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    instants = [write(spark, table, v, clean_inline=False, archive_min=2, archive_max=4).instant for v in range(6)]
    active = table.timeline().instants
    assert len(active) <= 4
    assert active[-1].time == instants[-1]
    archived = [i.time for i in archived_instants(table.storage)]
    assert archived and set(archived) | {i.time for i in active} == set(instants)
    assert hudi_rows(path) == [(1, 5), (2, 5)]
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, 5), (2, 5)]


def test_rollback_leaves_an_avro_rollback_instant(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, CONFIG)
    write(spark, table, 1)
    # a writer that died: its instant files and one data file
    dead = new_instant_time(table.timeline().last_time())
    hoodie = tmp_path / "t/.hoodie"
    (hoodie / f"{dead}.commit.requested").write_bytes(b"")
    (hoodie / f"{dead}.inflight").write_bytes(b"{}")
    stray = tmp_path / "t/p=a" / f"0a0a0a0a-0000-0000-0000-000000000000-0_0-1-0_{dead}.parquet"
    stray.write_bytes(b"not really parquet")
    # and the file a task of it was still writing when it died, under its hidden temporary name
    partial = tmp_path / "t/p=a" / f".0b0b0b0b-0000-0000-0000-000000000000-0_1-1-0_{dead}.parquet.0f3e2a.tmp"
    partial.write_bytes(b"PAR1 half")
    assert hudi_rows(path) == [(1, 1), (2, 1)]  # pending: ignored by readers
    write(spark, table, 2)
    assert not stray.exists() and not partial.exists() and not (hoodie / f"{dead}.inflight").exists()
    [rb] = list(hoodie.glob("*.rollback"))
    meta = avro.from_bytes(rb.read_bytes())
    assert meta["commitsRollback"] == [dead] and meta["totalFilesDeleted"] == 2
    assert meta["instantsRollback"] == [{"commitTime": dead, "action": "commit"}]
    assert avro.from_bytes((hoodie / (rb.name + ".requested")).read_bytes())["instantToRollback"]["commitTime"] == dead
    assert hudi_rows(path) == [(1, 2), (2, 2)]


@pytest.mark.parametrize("version", [6, 9])
def test_time_travel_to_archived_commits_whose_files_were_cleaned_is_refused(spark, tmp_path, version):
    """A keep_latest_file_versions clean names no earliest commit to retain, and the commits
    that last wrote a file group may be archived: time travel to them is refused (the archived
    write stats show the files they read are gone), never a read of the surviving groups only."""
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",), create_version=version))
    schema = "id long, p string, v long"
    opts = dict(clean_inline=False, archive_min=3, archive_max=5)
    instants = [table.write(spark.createDataFrame([(i, "a", 0) for i in range(5)], schema), "upsert", **opts).instant,
                table.write(spark.createDataFrame([(i, "b", 0) for i in range(5, 10)], schema), "upsert", **opts).instant]
    for v in range(1, 7):  # only partition a changes after the second commit
        instants.append(table.write(spark.createDataFrame([(i, "a", v) for i in range(5)], schema), "upsert", **opts).instant)
    archived = {i.time for i in archived_instants(table.storage, 2 if version >= 8 else 1)}
    assert {instants[0], instants[1]} <= archived
    table.clean(policy="keep_latest_file_versions", retain=1)
    for old in instants[:2]:
        for read in (table.read, table.read_batches):
            with pytest.raises(TableError, match=f"as of {old} cannot be read: the cleaner removed 1 of the files"):
                read(as_of=old)
    latest = sorted((r["id"], r["v"]) for r in table.read(as_of=instants[-1]).collect())
    assert latest == [(i, 6) for i in range(5)] + [(i, 0) for i in range(5, 10)]
