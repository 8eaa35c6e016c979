"""Tables with a metadata table pipe cannot keep in step (here: a files partition whose base
file is no HFile; tests/test_metadata_table_kept.py has the ones it keeps): readers leave it
alone; every change (write or service) first retires it exactly as Hudi's writer does with
hoodie.metadata.enable=false, crash-safely, and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib

import hudi
import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import MERGE_ON_READ, read_properties, update_properties

CONFIG = TableConfig(name="orders", table_type=MERGE_ON_READ, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
SCHEMA = "id long, region string, ts long, v string"
MDT_PROPS = "hoodie.table.metadata.partitions", "hoodie.table.metadata.partitions.inflight"


def java_table_with_metadata(spark, tmp_path):
    """A merge-on-read table with two deltacommits (one with a log file), then what a Java
    writer with default settings adds: .hoodie/metadata (its own Hudi table: a files
    partition of HFile-based log files) and the partitions in hoodie.properties, written
    through HoodieTableConfig.update."""
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    first = table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_000, "a"), (2, "us", 1_700_000_000_000, "b")], SCHEMA), "upsert")
    second = table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_001, "a2")], SCHEMA), "upsert")
    mdt = path / ".hoodie/metadata"
    (mdt / ".hoodie").mkdir(parents=True)
    (mdt / ".hoodie/hoodie.properties").write_text(
        "hoodie.table.name=orders_metadata\nhoodie.table.type=MERGE_ON_READ\nhoodie.table.version=6\n"
        "hoodie.timeline.layout.version=1\nhoodie.table.keygenerator.class=org.apache.hudi.metadata.HoodieTableMetadataKeyGenerator\n"
        f"hoodie.table.checksum={zlib.crc32(b'default.orders_metadata')}\nhoodie.database.name=default\n")
    (mdt / ".hoodie" / f"{second.instant}.deltacommit").write_text("{}")
    (mdt / "files").mkdir()
    (mdt / "files/.hoodie_partition_metadata").write_text("#partition metadata\ncommitTime=00000000000000010\npartitionDepth=1\n")
    (mdt / "files/.files-0000-0_00000000000000010.log.1_0-0-0").write_bytes(b"#HUDI#")
    (mdt / "files/files-0000-0_0-0-0_00000000000000010.hfile").write_bytes(b"not an HFile")  # what pipe cannot read
    update_properties(table.storage, {MDT_PROPS[0]: "files", MDT_PROPS[1]: ""})
    return path, [first.instant, second.instant]


def rows(table):
    return sorted((r["id"], r["v"]) for r in table.read().collect())


def hudi_rows(path):
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    return sorted((r["id"], r["v"]) for b in t.read() for r in b.to_pylist())


def assert_retired(path):
    props = read_properties(Table.open(None, str(path)).storage)
    assert not set(MDT_PROPS) & set(props)
    assert props["hoodie.table.checksum"] == str(zlib.crc32(b"default.orders"))
    assert not (path / ".hoodie/metadata").exists()
    assert not (path / ".hoodie/hoodie.properties.backup").exists()


def test_readers_leave_the_metadata_table_alone(spark, tmp_path):
    path, _ = java_table_with_metadata(spark, tmp_path)
    table = Table.open(spark, str(path))
    assert rows(table) == [(1, "a2"), (2, "b")]
    assert sorted((r["id"], r["v"]) for b in table.read_batches()[1] for r in b.to_pylist()) == [(1, "a2"), (2, "b")]  # pipe show
    assert read_properties(table.storage)[MDT_PROPS[0]] == "files" and (path / ".hoodie/metadata/files").is_dir()
    assert table.retired is None


CHANGES = {
    "write": lambda spark, t, instants: t.write(spark.createDataFrame([(3, "eu", 1_700_000_000_000, "c")], SCHEMA), "upsert"),
    "compact": lambda spark, t, instants: t.compact(),
    "clean": lambda spark, t, instants: t.clean(retain=1),
    "rollback": lambda spark, t, instants: t.rollback(instants[-1]),
    "archive": lambda spark, t, instants: t.archive(),  # (savepoint: the crash tests below)
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_retires_the_metadata_table_first_as_hudi_does(spark, tmp_path, change):
    path, instants = java_table_with_metadata(spark, tmp_path)
    table = Table.open(spark, str(path))
    result = CHANGES[change](spark, table, instants)
    assert_retired(path)
    assert table.retired.startswith("retired the metadata table of orders (partitions: files)")
    assert "hoodie.metadata.enable=false" in table.retired
    if change == "write":
        assert result.retired == table.retired
    expected = {"write": [(1, "a2"), (2, "b"), (3, "c")], "rollback": [(1, "a"), (2, "b")]}.get(change, [(1, "a2"), (2, "b")])
    assert rows(Table.open(spark, str(path))) == expected
    assert hudi_rows(path) == expected


CHILD = textwrap.dedent("""
    import sys
    from runtime.table import Table
    Table.open(None, sys.argv[1]).savepoint()
    print("DONE")
""")


def crash(path, point):
    env = {**os.environ, "PIPE_FAULT": point}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 77, proc.stdout + proc.stderr[-2000:]


def test_a_crash_while_hoodie_properties_is_rewritten_leaves_its_backup_for_readers(spark, tmp_path):
    path, _ = java_table_with_metadata(spark, tmp_path)
    crash(path, "properties_after_backup")
    # Java's HoodieTableConfig.fetchConfigs reads the backup when the file is missing; so does pipe
    assert not (path / ".hoodie/hoodie.properties").exists() and (path / ".hoodie/hoodie.properties.backup").exists()
    assert Table.exists(str(path))
    table = Table.open(spark, str(path))
    assert rows(table) == [(1, "a2"), (2, "b")]
    # the next change recovers the file from the backup (HoodieTableConfig.recoverIfNeeded), then retires
    table.savepoint()
    assert_retired(path)
    assert hudi_rows(path) == [(1, "a2"), (2, "b")]


def test_a_crash_after_the_properties_were_cleared_leaves_an_unused_folder_the_next_change_deletes(spark, tmp_path):
    path, _ = java_table_with_metadata(spark, tmp_path)
    crash(path, "metadata_table_after_properties")
    props = read_properties(Table.open(None, str(path)).storage)
    assert not set(MDT_PROPS) & set(props) and (path / ".hoodie/metadata/files").is_dir()
    # nothing trusts the folder any more: Java and hudi-rs go by the properties
    assert hudi_rows(path) == [(1, "a2"), (2, "b")]
    table = Table.open(spark, str(path))
    table.savepoint()
    assert_retired(path)
    assert "left by an interrupted retirement" in table.retired


def test_pipe_run_and_service_commands_say_they_retired_it(spark, tmp_path, capsys):
    from tests.test_run import pipe, project, run_ok, steps
    from tests.test_services_cli import FILES, add_batch

    root = project(tmp_path, FILES)
    add_batch(root, 1)
    run_ok(capsys, root)
    lake = Table.open(None, str(root / "lake/orders"))

    def java_adds_its_metadata_table():
        (root / "lake/orders/.hoodie/metadata/files").mkdir(parents=True)
        (root / "lake/orders/.hoodie/metadata/files/.files-0000-0_00000000000000010.log.1_0-0-0").write_bytes(b"#HUDI#")
        (root / "lake/orders/.hoodie/metadata/files/files-0000-0_0-0-0_00000000000000010.hfile").write_bytes(b"not an HFile")
        (root / "lake/orders/.hoodie/metadata/.hoodie").mkdir(exist_ok=True)
        (root / "lake/orders/.hoodie/metadata/.hoodie/hoodie.properties").write_text("hoodie.table.version=6\n")
        update_properties(lake.storage, {MDT_PROPS[0]: "files"})

    java_adds_its_metadata_table()
    code, out, err = pipe(capsys, root, "savepoint", "orders")
    assert code == 0, err
    assert "retired the metadata table of orders (partitions: files)" in out
    java_adds_its_metadata_table()
    add_batch(root, 2)
    run_ok(capsys, root)
    assert "first retired the metadata table of orders" in steps(root)["table.orders"]["message"]
    assert not (root / "lake/orders/.hoodie/metadata").exists()
