"""Which Hudi tables pipe opens: the table versions and timeline layouts it reads and writes (6
with layout 1, 8 and 9 with layout 2; versions 4 and 5 read only), and the Java features it neither reads nor writes,
refused with a message before anything is read or written."""

from __future__ import annotations

import json
import os
import re

import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import PROPERTIES, read_properties, update_properties
from runtime.table.errors import TableError
from runtime.table.timeline import CommitMetadata, archived_instants

CONFIG = TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
SCHEMA = "id long, region string, ts long, v string"


def built(spark, tmp_path):
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), CONFIG)
    table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_000, "a"), (2, "us", 1_700_000_000_000, "b")], SCHEMA), "upsert")
    return table, path


def files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "pipe.lock")


def upgrade_to_v8(path):
    """What Hudi 1.x's SixToEightUpgradeHandler leaves (audit exp4 B): instants moved to
    .hoodie/timeline/ (completed ones named <requested>_<completed>.<action>), version 8,
    layout 2."""
    hoodie = path / ".hoodie"
    (hoodie / "timeline" / "history").mkdir(parents=True)
    for f in os.listdir(hoodie):
        m = re.match(r"^(\d{17})\.(commit|deltacommit)$", f)
        if m:  # its JSON metadata as Avro, as the upgrade rewrites it
            meta = CommitMetadata.from_json(json.loads((hoodie / f).read_text()))
            (hoodie / "timeline" / f"{m.group(1)}_{int(m.group(1)) + 5}.{m.group(2)}").write_bytes(meta.to_bytes(2))
            os.remove(hoodie / f)
        elif re.match(r"^\d{17}\.", f):
            os.rename(hoodie / f, hoodie / "timeline" / f)
    text = (hoodie / "hoodie.properties").read_text()
    text = text.replace("hoodie.table.version=6", "hoodie.table.version=8").replace("hoodie.timeline.layout.version=1", "hoodie.timeline.layout.version=2")
    (hoodie / "hoodie.properties").write_text(text + "hoodie.table.initial.version=6\nhoodie.timeline.path=timeline\n")


def hudi_rs_rows(path, cols=("id", "v")):
    import hudi
    import pyarrow as pa

    got = pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(str(path)).build().read())
    return sorted(zip(*(got.column(c).to_pylist() for c in cols)))


def instant_files(path):
    """The instant files of .hoodie/ (layout 1) and .hoodie/timeline/ (layout 2), by folder."""
    return ([f for f in os.listdir(path / ".hoodie") if re.match(r"^\d{17}", f)],
            sorted(f for f in os.listdir(path / ".hoodie" / "timeline") if re.match(r"^\d{17}", f)))


def test_a_table_hudi_1x_upgraded_to_version_8_is_read_and_written_on(spark, tmp_path):
    """A copy-on-write table Hudi 1.x upgraded to version 8 (its timeline moved to
    .hoodie/timeline/, completed instants named with their completion time) reads as before the
    upgrade, also incrementally by completion time; pipe then writes on at version 8 (a Table
    opened before the upgrade too): its instants go to .hoodie/timeline/, completed as
    `T_C.commit` with Avro metadata, and so does a clean's; hudi-rs reads each version. (Java
    1.1's own tables: test_java_interop.py.)"""
    from runtime.table import avro

    table, path = built(spark, tmp_path)  # opened before the upgrade, as a long-running process would have
    upgrade_to_v8(path)
    opened = Table.open(spark, str(path))
    assert opened.timeline().layout == 2 and len(opened.timeline().completed()) == 1
    assert sorted((r["id"], r["v"]) for r in opened.read().collect()) == [(1, "a"), (2, "b")]
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a"), (2, "b")]  # the open Table re-reads hoodie.properties
    # an incremental read takes completion times: the upgrade named the commit's file with one
    done = opened.timeline().completed()[0]
    assert done.completion and done.completion > done.time
    assert sorted((r["id"], r["v"]) for r in table.read(since=done.time).collect()) == [(1, "a"), (2, "b")]
    assert table.read(since=done.completion).count() == 0
    expected = {1: "a", 2: "b"}
    for n in range(1, 4):
        batch = [(1, "eu", 1_700_000_000_000 + n, f"a{n}"), (10 + n, "us", 1_700_000_000_000, f"new{n}")]
        result = table.write(spark.createDataFrame(batch, SCHEMA), "upsert")
        expected.update({r[0]: r[3] for r in batch})
        top, moved = instant_files(path)
        assert top == [], top  # nothing on the version 6 timeline
        assert [f for f in moved if f.startswith(result.instant)] == sorted(
            [f"{result.instant}.commit.requested", f"{result.instant}.inflight",
             f"{result.instant}_{opened.timeline().find(result.instant).completion}.commit"])
        meta = (path / ".hoodie" / "timeline" / [f for f in moved if f.startswith(result.instant + "_")][0]).read_bytes()
        assert meta[:4] == b"Obj\x01" and avro.from_bytes(meta)["operationType"] == "UPSERT"
        assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == sorted(expected.items())
        assert hudi_rs_rows(path) == sorted(expected.items())
    assert read_properties(opened.storage)["hoodie.table.version"] == "8"
    timeline = Table.open(spark, str(path)).timeline()
    assert [i.completed_at for i in timeline.instants] == sorted(i.completed_at for i in timeline.instants)
    assert all(i.time < i.completion for i in timeline.completed())
    last = timeline.completed()[-1]
    since = timeline.completed()[-2].completion
    assert sorted((r["id"], r["v"]) for r in table.read(since=since).collect()) == [(1, "a3"), (13, "new3")]
    cleaned = table.clean(retain=1)
    assert cleaned.instant and cleaned.files_deleted > 0
    assert any(f.startswith(cleaned.instant + "_") and f.endswith(".clean") for f in instant_files(path)[1])
    assert hudi_rs_rows(path) == sorted(expected.items()) and last.time == Table.open(spark, str(path)).timeline().latest_completed().time


def test_a_project_table_that_is_a_hudi_1x_table_is_compared_and_left_as_it_is(spark, tmp_path):
    """A step whose table turns out to be Hudi 1.x's with another precombine field is refused as
    created differently, like any table, and nothing of it changes; no lock file is left in it."""
    _, path = built(spark, tmp_path)
    upgrade_to_v8(path)
    before = files(path)
    other = TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",), precombine_field="v")
    with pytest.raises(TableError, match="was created differently: precombine field is ts in the table but v now"):
        Table.create(spark, str(path), other)
    assert Table.open(spark, str(path)).tidy() == []
    assert files(path) == before


def test_a_merge_on_read_table_hudi_1x_upgraded_to_version_8_is_written_and_compacted(spark, tmp_path):
    """pipe's merge-on-read writes into a table Hudi 1.x upgraded to version 8 name each log
    file with the deltacommit that wrote it (version 1), beside the version 6 logs named with
    their slice's base instant; its reads put each log in its slice by completion time, and a
    compaction merges both kinds, completing as `T_C.commit`; hudi-rs reads every step alike."""
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), TableConfig(name="orders", table_type="MERGE_ON_READ", record_key_fields=("id",),
                                                       partition_fields=("region",), precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_000, "a"), (2, "eu", 1_700_000_000_000, "b")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_001, "a2")], SCHEMA), "upsert")  # into a log file
    upgrade_to_v8(path)
    opened = Table.open(spark, str(path))
    assert [s.has_logs for s in opened.view().latest_slices()] == [True]
    assert sorted((r["id"], r["v"]) for r in opened.read().collect()) == [(1, "a2"), (2, "b")]
    first = table.write(spark.createDataFrame([(2, "eu", 1_700_000_000_002, "b2")], SCHEMA), "upsert")
    second = table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_000, "stale"), (2, "eu", 1_700_000_000_003, "b3")], SCHEMA), "upsert")
    logs = sorted(p.name for p in (path / "region=eu").glob(".*.log.*"))
    assert len(logs) == 3 and all(any(f"_{t}.log.1_" in n for n in logs) for t in (first.instant, second.instant)), logs
    expected = [(1, "a2"), (2, "b3")]  # the stale ordering value loses
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == expected
    assert hudi_rs_rows(path) == expected
    compacted = Table.open(spark, str(path)).compact()
    assert compacted and list((path / ".hoodie" / "timeline").glob(f"{compacted}_*.commit"))
    slices = Table.open(spark, str(path)).view().latest_slices()
    assert [(s.base_instant, s.has_logs) for s in slices] == [(compacted, False)]
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == expected
    assert hudi_rs_rows(path) == expected
    # a clean takes the old slice whole: its base file and every log in it, the 1.x-named ones too
    cleaned = Table.open(spark, str(path)).clean(policy="keep_latest_file_versions", retain=1)
    assert cleaned.files_deleted == 4
    assert [p.name for p in (path / "region=eu").iterdir() if not p.name.startswith(".hoodie")] == [
        next(p.name for p in (path / "region=eu").glob(f"*_{compacted}.parquet"))]
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == expected
    assert hudi_rs_rows(path) == expected


def _touch(path, size: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_version_8_logs_belong_to_the_slice_their_deltacommit_completed_in(tmp_path):
    """Hudi 1.x names a log file with the deltacommit that wrote it, and Java's file-system view
    puts it in the slice with the greatest base instant at or before that deltacommit's
    completion time (docs/hudi-1x-format.md, 4): a deltacommit that started before a compaction
    was planned but completed after it belongs to the compaction's slice (the compaction does
    not fold it in), one that completed before it to the slice the compaction folds; a group
    with no base file keeps its first log's slice; a pending deltacommit's log is not read."""
    from runtime.storage import StorageSpec, open_storage
    from runtime.table import avro, compaction
    from runtime.table.layout import BaseFile, FileSlice, FileSystemView
    from runtime.table.timeline import Timeline

    t = lambda n: f"2026010100{n:07d}"  # noqa: E731 - 17-digit instant times, in order
    tl = tmp_path / ".hoodie" / "timeline"
    (tmp_path / ".hoodie" / "hoodie.properties").parent.mkdir(parents=True)
    for name in (f"{t(10)}_{t(11)}.deltacommit", f"{t(20)}_{t(45)}.deltacommit",  # 20 started before the compaction, completed after
                 f"{t(30)}_{t(31)}.deltacommit", f"{t(40)}.compaction.requested", f"{t(50)}_{t(51)}.deltacommit",
                 f"{t(60)}.deltacommit.inflight"):
        _touch(tl / name)
    p = tmp_path / "eu"
    _touch(p / f"g1-0_0-1-1_{t(10)}.parquet", 10)
    first = FileSlice("eu", "g1-0", BaseFile("eu", f"g1-0_0-1-1_{t(10)}.parquet", 10))
    (tl / f"{t(40)}.compaction.requested").write_bytes(avro.to_bytes(avro.COMPACTION_PLAN, compaction.plan([first])))
    _touch(p / f"g1-0_0-1-1_{t(40)}.parquet", 10)  # the compaction's output, written before it completes
    for n in (20, 30, 50, 60):
        _touch(p / f".g1-0_{t(n)}.log.1_0-1-1", 10)
    for n in (30, 50):
        _touch(p / f".g2-0_{t(n)}.log.1_0-1-1", 10)  # a log-only group
    storage = open_storage(StorageSpec(str(tmp_path)))
    timeline = Timeline.load(storage, 2)
    view = FileSystemView.load(storage, timeline)
    of = {lf.name: b for lf, b in view.log_slices.items()}
    assert of == {f".g1-0_{t(20)}.log.1_0-1-1": t(40), f".g1-0_{t(30)}.log.1_0-1-1": t(10), f".g1-0_{t(50)}.log.1_0-1-1": t(40),
                  f".g2-0_{t(30)}.log.1_0-1-1": t(30), f".g2-0_{t(50)}.log.1_0-1-1": t(30)}
    slices = {s.file_id: s for s in view.latest_slices()}
    g1, g2 = slices["g1-0"], slices["g2-0"]
    assert g1.base_file is None or g1.base_file.instant == t(10)  # the compaction's base file is not committed yet
    assert [lf.base_instant for lf in g1.log_files] == [t(20), t(30), t(50)]  # both slices merged, in deltacommit order
    assert g2.base_file is None and [lf.base_instant for lf in g2.log_files] == [t(30), t(50)]


def test_a_version_6_properties_file_beside_a_moved_timeline_is_refused(spark, tmp_path):
    _, path = built(spark, tmp_path)
    upgrade_to_v8(path)
    text = (path / ".hoodie/hoodie.properties").read_text()
    (path / ".hoodie/hoodie.properties").write_text(
        text.replace("hoodie.table.version=8", "hoodie.table.version=6").replace("hoodie.timeline.layout.version=2", "hoodie.timeline.layout.version=1")
        .replace("hoodie.timeline.path=timeline\n", ""))
    with pytest.raises(TableError, match=r"table version 6, its timeline in \.hoodie/timeline/"):
        Table.open(spark, str(path))


def test_a_table_hudi_1x_downgraded_to_version_6_is_read_and_written(spark, tmp_path):
    """Hudi 1.1's `downgrade_table(to_version => 'SIX')` moves the instants back to .hoodie/ but
    leaves `hoodie.timeline.path=timeline` and an empty .hoodie/timeline/history/ behind; Java
    reads a version 6 table's timeline from .hoodie/ whatever the property says, and so does pipe
    (it refused such tables before; checked with real Java in test_java_interop)."""
    table, path = built(spark, tmp_path)
    (path / ".hoodie" / "timeline" / "history").mkdir(parents=True)
    update_properties(table.storage, {"hoodie.timeline.path": "timeline", "hoodie.table.initial.version": "6"})
    table = Table.open(spark, str(path))
    table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_001, "a2")], SCHEMA), "upsert")
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a2"), (2, "b")]


def test_a_version_5_table_is_read_but_not_written(spark, tmp_path):
    """Hudi 0.12/0.13 (version 5) write the same files and timeline as version 6 (0.14's
    FiveToSixUpgradeHandler only drops compaction plans from .aux), so pipe reads them; it
    writes only version 6 and leaves the upgrade to Hudi."""
    _, path = built(spark, tmp_path)
    update_properties(Table.open(spark, str(path)).storage, {"hoodie.table.version": "5"})
    table = Table.open(spark, str(path))
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a"), (2, "b")]
    before = files(path)
    with pytest.raises(TableError, match="version 5, which pipe reads but does not write.*Hudi 0.14 or 0.15"):
        table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_001, "a2")], SCHEMA), "upsert")
    with pytest.raises(TableError, match="version 5"):
        table.savepoint()
    assert files(path) == before


# --- Java features pipe neither reads nor writes ---------------------------------------------------

UNREADABLE = [
    ({"hoodie.bootstrap.base.path": "s3a://lake/raw/orders"}, None, "metadata-only bootstrap of s3a://lake/raw/orders"),
    ({"hoodie.table.base.file.format": "ORC"}, None, "base files are ORC"),
    ({"hoodie.table.base.file.format": "HFILE"}, None, "base files are HFILE"),
    ({"hoodie.datasource.write.drop.partition.columns": "true"}, None, "drop.partition.columns=true"),
    ({}, ".hoodie/.schema/20250101000000000.schemacommit", "schema-on-read"),
]


@pytest.mark.parametrize("props,leftover,why", UNREADABLE, ids=["bootstrap", "orc", "hfile", "drop_partition_columns", "schema_on_read"])
def test_java_features_that_change_what_the_files_mean_are_refused_before_any_read(tmp_path, props, leftover, why):
    path = tmp_path / "orders"
    table = Table.create(None, str(path), CONFIG)
    if props:
        update_properties(table.storage, props)
    if leftover:
        (path / leftover).write_text("{}")
    with pytest.raises(TableError) as info:
        Table.open(None, str(path))
    assert "table orders" in str(info.value) and why in str(info.value)
    with pytest.raises(TableError, match=re.escape(why)):  # an already open Table refuses every change too
        table.archive()


UNWRITABLE = [
    ({"hoodie.table.cdc.enabled": "true", "hoodie.table.cdc.supplemental.logging.mode": "KEYS_AND_MORE"}, None, "a mode pipe does not know"),
    ({}, ".hoodie/.bucket_index/consistent_hashing_metadata/00000000000000.hashing_meta", "hoodie.index.bucket.engine=CONSISTENT_HASHING"),
    ({"hoodie.index.type": "BUCKET"}, None, "hoodie.index.bucket.engine=SIMPLE"),
]


@pytest.mark.parametrize("props,leftover,why", UNWRITABLE, ids=["cdc", "consistent_hashing", "bucket"])
def test_java_features_pipe_does_not_write_are_read_but_refused_for_changes(spark, tmp_path, props, leftover, why):
    table, path = built(spark, tmp_path)
    if props:
        update_properties(table.storage, props)
    if leftover:
        (path / leftover).parent.mkdir(parents=True)
        (path / leftover).write_text("{}")
    table = Table.open(spark, str(path))
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a"), (2, "b")]
    before = files(path)
    with pytest.raises(TableError) as info:
        table.write(spark.createDataFrame([(3, "eu", 1_700_000_000_000, "c")], SCHEMA), "upsert")
    assert "pipe cannot write into table orders" in str(info.value) and why in str(info.value)
    with pytest.raises(TableError, match=re.escape(why)):
        table.clean(retain=1)
    assert files(path) == before
    assert read_properties(table.storage)["hoodie.table.name"] == "orders" and (path / PROPERTIES).exists()


@pytest.mark.parametrize("manifest, why", [
    ('{"files": [{"fileName": "../../../etc/passwd", "fileLen": 1}]}', "names '../../../etc/passwd', which is not a file of the archived timeline"),
    ('{"files": [{"fileName": "20260101000000001_20260101000000002_0.parquet", "fileLen": 1}]}', "is missing, though the archived timeline's manifest lists it"),
    ("not json", "is not a manifest of Hudi 1.x's archived timeline"),
])
def test_an_archived_timeline_of_version_8_another_writer_damaged_is_reported_not_followed(spark, tmp_path, manifest, why):
    """The LSM history's manifest is another writer's file: it names only Parquet files of the
    history folder, or reading it fails with what is wrong; a read of the table does not need
    it unless a log's deltacommit is archived, and `pipe doctor` says what it found."""
    import json
    import subprocess
    import sys

    from runtime.table.lsm_timeline import HistoryError, archived_instants

    table, path = built(spark, tmp_path)
    upgrade_to_v8(path)
    history = path / ".hoodie" / "timeline" / "history"
    (history / "manifest_1").write_text(manifest)
    (history / "_version_").write_text("1")
    with pytest.raises(HistoryError, match=re.escape(why)):
        archived_instants(Table.open(spark, str(path)).storage)
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == [(1, "a"), (2, "b")]
    done = subprocess.run([sys.executable, "-m", "pipe", "doctor", str(path), "--output", "json"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    found = json.loads(done.stdout)["tables"][0]
    assert why in found["history_error"] and any("archived timeline cannot be read" in n for n in found["notes"]), found


def test_a_completed_instant_named_without_its_completion_time_completes_when_its_file_was_written(spark, tmp_path):
    """Java's "legacy" completed name in timeline layout 2 (`T.commit`, no `_C`) is completed, at
    its file's modification time, as Java's InstantGeneratorV2 takes it: read, and read
    incrementally from before and after that time."""
    _, path = built(spark, tmp_path)
    upgrade_to_v8(path)
    timeline_dir = path / ".hoodie" / "timeline"
    done = next(timeline_dir.glob("*_*.commit"))
    legacy = timeline_dir / (done.name.split("_")[0] + ".commit")
    done.rename(legacy)
    os.utime(legacy, (1_900_000_000, 1_900_000_000))  # 2030-03-17 17:46:40 UTC (the table's timeline is UTC)
    table = Table.open(spark, str(path))
    commit = table.timeline().completed()[0]
    assert commit.completion == "20300317174640000"
    assert sorted((r["id"], r["v"]) for r in table.read().collect()) == [(1, "a"), (2, "b")]
    assert table.read(since="20300317174639999").count() == 2 and table.read(since=commit.completion).count() == 0


def test_pipe_timeline_shows_when_the_instants_of_a_hudi_1x_table_completed(spark, tmp_path, capsys):
    """Incremental reads of a 1.x table go by completion time: `pipe timeline` shows it, in a
    `completed` column and in its JSON rows."""
    import json

    from pipe.cli import main
    from tests.conftest import write_project

    lake = tmp_path / "lake"
    table = Table.create(spark, str(lake / "orders"), CONFIG)
    table.write(spark.createDataFrame([(1, "eu", 1_700_000_000_000, "a")], SCHEMA), "upsert")
    upgrade_to_v8(lake / "orders")
    root = write_project(tmp_path / "p", {"pipe_project.yml": f"name: p\nlake: {lake}\n",
                                           "tables/orders.yml": "tables:\n  orders:\n    key: [id]\n    precombine: ts\n    partition_by: [region]\n",
                                           "tables/orders.sql": "select 1 as id, 'eu' as region, 1 as ts, 'a' as v\n"})
    done = Table.open(spark, str(lake / "orders")).timeline().completed()[0]
    assert main(["timeline", "orders", "--output", "json", "--project-dir", str(root)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["instant"], r["completed"]) for r in rows if r["state"] == "completed"] == [(done.time, done.completion)]
    assert main(["timeline", "orders", "--project-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "completed" in out.splitlines()[0] and done.completion in out


# --- every operation and service on a table pipe creates at version 9 -----------------------------

LEDGER = ("account string, entry int, day string, at_ms bigint, amount decimal(18,2), booked timestamp, memo string")
LEDGER_COLS = ["account", "entry", "day", "at_ms", "amount", "booked", "memo"]
DAYS = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]


def ledger_row(i: int, version: int, day: str | None = None) -> tuple:
    import datetime as dt
    import decimal

    return (f"acct-{i % 97:03d} «{'é' if i % 2 else 'o'}»", i, day or DAYS[i % 3], 1_764_000_000_000 + version * 1000 + i,
            decimal.Decimal(f"{(i * 37) % 100000}.{i % 100:02d}") * (-1 if i % 5 == 0 else 1),
            dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i * 13 + version),
            None if i % 7 == 0 else f"v{version} 'quoted' \"{i}\"")


def _key(r):
    return (r[0], r[1])


def _norm(r) -> tuple:
    """A ledger row as every reader's values compare: timestamps as naive UTC."""
    import datetime as dt

    return tuple(v.astimezone(dt.timezone.utc).replace(tzinfo=None) if isinstance(v, dt.datetime) and v.tzinfo else v for v in r)


def _sorted(rows) -> list[tuple]:
    return sorted((_norm(r) for r in rows), key=_key)


def pipe_ledger(table) -> list[tuple]:
    return _sorted(tuple(r) for r in table.read(meta=False).select(*LEDGER_COLS).collect())


def rs_ledger(path) -> list[tuple]:
    import hudi
    import pyarrow as pa

    batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()
    got = pa.Table.from_batches(batches).select(LEDGER_COLS).to_pylist() if batches else []
    return _sorted(tuple(r[c] for c in LEDGER_COLS) for r in got)


def build_v9_ledger(spark, path, table_type: str, version: int = 9, check=None, upserts: int = 10):
    """A ledger table pipe creates at `version` (two-field key, partitions by day, epoch-millis
    ordering, decimals, timestamps, accents, quotes and nulls) and lives through every write
    operation and service: bulk_insert, `upserts` rounds of upserts (inline compaction every three
    deltacommits on merge-on-read), a delete, an insert, insert_overwrite of a day,
    delete_partition, a clean, a savepoint, a rollback and a restore; archiving keeps four to
    six instants active, the older ones going to the LSM history. `check(table, model, what,
    snapshots)` is called after each step with the rows every reader must see. Returns (table,
    model, snapshots: instant -> rows as of it)."""
    config = TableConfig(name="ledger", table_type=table_type, record_key_fields=("account", "entry"), partition_fields=("day",),
                         precombine_field="at_ms", create_version=version)
    table = Table.create(spark, str(path), config)
    model: dict[tuple, tuple] = {}
    snapshots: dict[str, list[tuple]] = {}

    def step(rows, operation, **options):
        result = table.write(spark.createDataFrame(rows, LEDGER) if rows else None, operation, compact_after=3, clean_retain=20,
                             archive_min=4, archive_max=6, **options)
        snapshots[result.instant] = _sorted(model.values())
        if check:
            check(table, model, f"{operation} {result.instant}", snapshots)
        return result

    def apply(rows):
        model.update({_key(r): r for r in rows})

    first = [ledger_row(i, 1) for i in range(1500)]
    apply(first)
    step(first, "bulk_insert")
    for n in range(2, 2 + upserts):
        batch = [ledger_row(i, n) for i in range(n, 1500, 9 + n)] + [ledger_row(i, n) for i in range(1500 + 40 * n, 1540 + 40 * n)]
        batch += [ledger_row(i, 0) for i in range(n + 1, 1500, 97)]  # stale versions (lower at_ms): stored rows win
        apply([r for r in batch if r[3] >= model.get(_key(r), r)[3]])
        step(batch, "upsert")
    gone = [model[k] for k in sorted(model)[::13]]
    for r in gone:
        model.pop(_key(r))
    step(gone, "delete")
    fresh = [ledger_row(i, 12) for i in range(3000, 3100)]
    apply(fresh)
    step(fresh, "insert")
    day = [ledger_row(i, 13, DAYS[1]) for i in range(4000, 4050)]
    model = {k: v for k, v in model.items() if v[2] != DAYS[1]}
    apply(day)
    step(day, "insert_overwrite")
    saved = table.savepoint()
    saved_rows = list(model.values())
    model = {k: v for k, v in model.items() if v[2] != DAYS[2]}
    step(None, "delete_partition", partitions_to_delete=[f"day={DAYS[2]}"])
    late = [ledger_row(i, 15) for i in range(5000, 5020)]
    before_late = dict(model)
    apply(late)
    rolled = step(late, "upsert").instant
    table.rollback(rolled)
    model = before_late
    snapshots.pop(rolled)
    if check:
        check(table, model, f"rollback of {rolled}", snapshots)
    assert table.clean(retain=1).instant, "nothing cleaned"
    if check:
        check(table, model, "clean", snapshots)
    table.restore(saved)
    model = {_key(r): r for r in saved_rows}
    snapshots = {t: v for t, v in snapshots.items() if t <= saved}
    if check:
        check(table, model, f"restore to {saved}", snapshots)
    return table, model, snapshots


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_every_operation_and_service_works_on_a_table_pipe_creates_at_version_9(spark, tmp_path, table_type):
    """A table pipe creates at version 9 lives through every write operation and service; after
    each step pipe's reads and hudi-rs's equal the model, every instant of the timeline is in
    .hoodie/timeline/ and every completed one is named `T_C.action` with C after T and after
    every earlier completion; time travel to each surviving write returns its rows."""
    path = tmp_path / "ledger"

    def check(table, model, what, snapshots):
        expected = _sorted(model.values())
        opened = Table.open(spark, str(path))
        assert pipe_ledger(opened) == expected, what
        assert rs_ledger(path) == expected, f"hudi-rs after {what}"
        for instant in sorted(snapshots)[-3:-1]:  # time travel to the writes before the latest
            try:
                got = _sorted(tuple(r) for r in opened.read(as_of=instant, meta=False).select(*LEDGER_COLS).collect())
            except TableError as exc:  # cleaned
                assert "kept only the versions from" in str(exc) or "cleaner removed" in str(exc), exc
                continue
            assert got == snapshots[instant], f"as of {instant} after {what}"

    table, model, snapshots = build_v9_ledger(spark, path, table_type, check=check)
    props = read_properties(table.storage)
    assert (props["hoodie.table.version"], props["hoodie.timeline.layout.version"], props["hoodie.table.ordering.fields"]) == ("9", "2", "at_ms")
    assert [f for f in os.listdir(path / ".hoodie") if re.match(r"^\d{17}", f)] == []
    archived = archived_instants(table.storage, 2)
    assert len(archived) >= 8 and all(i.completion > i.time for i in archived), archived
    assert {"commit", "clean"} & {i.action for i in archived}
    timeline = Table.open(spark, str(path)).timeline()
    assert not {i.time for i in archived} & {i.time for i in timeline.instants}
    assert max(i.completion for i in archived) < min(i.completed_at for i in timeline.instants if i.is_completed)
    done = [i for i in timeline.instants if i.is_completed]
    assert all(i.completion > i.time and not i.legacy for i in done)
    actions = {i.action for i in done + archived}
    assert {"commit", "replacecommit", "rollback", "clean", "restore", "savepoint"} <= actions, actions
    if table_type == "MERGE_ON_READ":
        assert "deltacommit" in actions and (timeline.compactions or "commit" in {i.action for i in archived}), "no compaction ran"
    by_completion = sorted(done, key=lambda i: i.completed_at)
    assert [i.time for i in by_completion if i.action != "savepoint"] == [i.time for i in sorted(done) if i.action != "savepoint"]
    reopened, travelled = Table.open(spark, str(path)), 0
    for instant, rows in snapshots.items():
        try:
            got = _sorted(tuple(r) for r in reopened.read(as_of=instant, meta=False).select(*LEDGER_COLS).collect())
        except TableError as exc:  # the clean kept the versions of the latest commit only
            assert "cleaner removed" in str(exc) or "kept only the versions from" in str(exc), exc
            continue
        assert got == rows, f"as of {instant}"
        travelled += 1
    assert travelled >= 1, travelled


def test_the_change_feed_of_a_version_9_table_goes_by_completion_time(spark, tmp_path):
    """read_changes of a version 9 table takes completion times: when write A (in eu) completes
    after the later write B (in us), as an overlapping writer's does, the feed up to B's
    completion has B's change and not A's, and the feed from B's completion has A's: the
    checkpoint at B never skips A."""
    path = tmp_path / "orders"
    table = Table.create(spark, str(path), TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",),
                                                       precombine_field="ts", create_version=9))
    table.write(spark.createDataFrame([(1, "eu", 1, "a"), (2, "us", 1, "b"), (3, "us", 1, "c")], SCHEMA), "upsert")
    a = table.write(spark.createDataFrame([(1, "eu", 2, "a2")], SCHEMA), "upsert")
    b = table.write(spark.createDataFrame([(2, "us", 2, "b2")], SCHEMA), "delete")
    timeline = table.timeline()
    first, done_a, done_b = (timeline.find(t).completion for t in (timeline.completed()[0].time, a.instant, b.instant))
    late = str(int(done_b) + 1)
    folder = path / ".hoodie" / "timeline"
    (folder / f"{a.instant}_{done_a}.commit").rename(folder / f"{a.instant}_{late}.commit")  # A now completes after B

    def feed(since, until=None):
        got = Table.open(spark, str(path)).read_changes(since, until).select("id", "v", "_change_type").collect()
        return sorted(tuple(r) for r in got)

    assert feed(first, done_b) == [(2, "b", "delete")]
    assert feed(done_b) == [(1, "a", "update_preimage"), (1, "a2", "update_postimage")]
    assert feed(first) == [(1, "a", "update_preimage"), (1, "a2", "update_postimage"), (2, "b", "delete")]
    assert feed(None, done_b) == [(1, "a", "insert"), (3, "c", "insert")]  # the table as it stood when B completed


def test_archiving_a_version_9_table_writes_the_lsm_history_and_a_crash_in_it_loses_or_doubles_nothing(spark, tmp_path):
    """Archiving a version 9 table moves its oldest instants into the LSM history
    (`.hoodie/timeline/history/`: a level-0 Parquet file per archiving, `manifest_N`,
    `_version_`), as Java 1.x's archiver does. A writer that dies after the history file and
    manifest are written but before the active files go leaves instants both archived and
    active: readers see each once, and the next archiving deletes their active files without
    archiving them twice. Rows written by archived commits stay readable (pipe, hudi-rs), and
    an incremental read from an archived commit's completion time has the rows of the commits
    that completed after it."""
    from runtime.table import services

    path = tmp_path / "orders"
    table = Table.create(spark, str(path), TableConfig(name="orders", record_key_fields=("id",), partition_fields=("region",),
                                                       precombine_field="ts", create_version=9))
    model = {}
    completions = []

    def write(n):
        rows = [(i, "eu" if i % 2 else "us", n, f"v{n}-{i}") for i in range(n * 3, n * 3 + 6)] if n else [(1000 + i, "old", 0, "old") for i in range(5)]
        model.update({r[0]: r[3] for r in rows})
        result = table.write(spark.createDataFrame(rows, SCHEMA), "upsert", archive_min=3, archive_max=5)
        completions.append(Table.open(spark, str(path)).timeline().find(result.instant).completion)
        return result

    for n in range(6):
        write(n)
    history = path / ".hoodie" / "timeline" / "history"
    assert sorted(f.name for f in history.iterdir() if not f.name.endswith(".parquet")) == ["_version_", "manifest_1"]
    first = archived_instants(table.storage, 2)
    assert [i.completion for i in first] == completions[:3] and all(i.action == "commit" for i in first)

    def crash():
        raise RuntimeError("killed")

    services.HOOKS["archive_after_history"] = crash
    try:
        result = write(6)
        for n in (7, 8):
            result = write(n)
    finally:
        services.HOOKS.pop("archive_after_history")
    assert "killed" in (result.service_error or "")
    both = {i.time for i in archived_instants(table.storage, 2)} & {i.time for i in Table.open(spark, str(path)).timeline().instants}
    assert both, "the crash left no instant both archived and active"
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == sorted(model.items())
    write(9)
    archived = archived_instants(table.storage, 2)
    active = Table.open(spark, str(path)).timeline().instants
    assert not {i.time for i in archived} & {i.time for i in active}
    assert [i.completion for i in archived] == completions[:len(archived)] and len(archived) >= 6, "an instant archived twice or lost"
    assert (history / "_version_").read_text().strip() == str(len([f for f in history.iterdir() if f.name.startswith("manifest_")]))
    assert sorted((r["id"], r["v"]) for r in Table.open(spark, str(path)).read().collect()) == sorted(model.items())
    assert hudi_rs_rows(path) == sorted(model.items())
    since = completions[1]  # archived: the commits that completed after it, archived ones included
    after = {r[0]: r[3] for n in range(2, 10) for r in [(i, "", n, f"v{n}-{i}") for i in range(n * 3, n * 3 + 6)]}
    got = {r["id"]: r["v"] for r in Table.open(spark, str(path)).read(since=since).collect()}
    assert got == after
