"""CDC-enabled tables (issue 41, part 3): pipe writes into a table Java made with
`hoodie.table.cdc.enabled=true` and writes the `.cdc` files its supplemental-logging mode
declares (docs/hudi-cdc-format.md), so that Java's CDC query (`incremental.format=cdc`)
returns, for each of pipe's commits, exactly the inserts, updates and deletes it made, with
their images; and Java writes on after pipe."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from runtime.table import Table
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from tests.java_hudi.client import hudi_rs

SCHEMA = "id long, name string, price double, ts long, region string"
REGIONS = ("eu", "us")
CDC_READ = {"hoodie.datasource.query.incremental.format": "cdc"}


def row(i: int, r: int) -> tuple:
    return (i, f"Zoë \"{r}\" d'or {i}", i + r / 100, 1_700_000_000_000 + r * 1000 + i, REGIONS[i % 2])


def arrow(rows) -> pa.Table:
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows], "price": [r[2] for r in rows],
                     "ts": pa.array([r[3] for r in rows], pa.int64()), "region": [r[4] for r in rows]})


def java_options(version: int, table_type: str, mode: str, operation: str) -> dict:
    return {"hoodie.table.name": "ledger", "hoodie.datasource.write.operation": operation,
            "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
            "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
            "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
            "hoodie.write.table.version": str(version), "hoodie.table.cdc.enabled": "true",
            "hoodie.table.cdc.supplemental.logging.mode": mode}


def image(text) -> tuple | None:
    """A CDC image as Java returns it (a JSON string, SQL NULL or the string "null"), as the
    data row it holds (meta fields left out)."""
    if text is None or text == "null":
        return None
    d = json.loads(text)
    return (d["id"], d["name"], round(d["price"], 6), d["ts"], d["region"])


def java_changes(java, path, begin: str, end: str) -> list[tuple]:
    got = java.read(path, query="incremental", begin=begin, end=end, **CDC_READ).to_pylist()
    return sorted((r["op"], image(r["before"]), image(r["after"])) for r in got)


def expected(model: dict, batch, delete: bool = False) -> list[tuple]:
    """The changes `batch` makes to `model` (id -> row), which it then applies."""
    out = []
    for r in batch:
        r = (*r[:2], round(r[2], 6), *r[3:])
        old = model.get(r[0])
        if delete:
            if old is not None:
                out.append(("d", old, None))
                del model[r[0]]
        else:
            out.append(("u" if old is not None else "i", old, r))
            model[r[0]] = r
    return sorted(out, key=lambda c: (c[0], c[1] or (), c[2] or ()))


# (table version, type, supplemental-logging mode, who creates the table: Java, or pipe from a
# TableConfig with the mode, as a project's `cdc_logging:` asks; pipe's index: global, its
# default, or partition)
CASES = [(6, COPY_ON_WRITE, "DATA_BEFORE_AFTER", "java", "global"), (9, COPY_ON_WRITE, "OP_KEY_ONLY", "java", "global"),
         (6, MERGE_ON_READ, "DATA_BEFORE", "java", "global"), (9, MERGE_ON_READ, "DATA_BEFORE_AFTER", "java", "global"),
         (6, COPY_ON_WRITE, "DATA_BEFORE", "pipe", "global"), (9, MERGE_ON_READ, "OP_KEY_ONLY", "pipe", "global"),
         (9, MERGE_ON_READ, "DATA_BEFORE", "java", "partition")]


@pytest.mark.java_hudi
@pytest.mark.parametrize("version,table_type,mode,creator,index", CASES, ids=[f"v{v}-{t.lower()}-{m.lower()}-{c}-{i}" for v, t, m, c, i in CASES])
def test_javas_cdc_query_reads_the_changes_of_pipes_commits_on_its_cdc_table(spark, tmp_path, request, monkeypatch, version, table_type, mode,
                                                                            creator, index):
    from runtime.table import writer

    by_partition = []  # the writes partition tasks decided and wrote (and their .cdc files)
    real = writer._upsert_by_partition
    monkeypatch.setattr(writer, "_upsert_by_partition", lambda *a, **k: by_partition.append(1) or real(*a, **k))
    java = request.getfixturevalue("java_hudi_015" if version == 6 else "java_hudi_11")
    path = tmp_path / "ledger"
    model: dict = {}
    first = [row(i, 0) for i in range(600)]
    df = lambda rows: spark.createDataFrame(rows, SCHEMA)  # noqa: E731
    if creator == "java":
        java.write(path, arrow(first), java_options(version, table_type, mode, "insert"), mode="overwrite")
    else:
        from runtime.table import TableConfig

        Table.create(spark, str(path), TableConfig(name="ledger", table_type=table_type, record_key_fields=("id",), partition_fields=("region",),
                                                   precombine_field="ts", create_version=version, cdc_mode=mode)).write(df(first), "insert")
        props = (path / ".hoodie/hoodie.properties").read_text()
        assert "hoodie.table.cdc.enabled=true" in props and f"hoodie.table.cdc.supplemental.logging.mode={mode}" in props
    expected(model, first)
    rounds = [
        ("upsert", [row(i, 1) for i in range(0, 900, 3)]),  # updates of every file group, and new keys
        ("delete", [row(i, 2) for i in range(1, 900, 7)]),  # deletes (a few keys that are not stored)
        ("upsert", [row(i, 3) for i in range(2, 1200, 5)]),
    ]
    for operation, batch in rounds:
        before = Table.open(spark, str(path)).timeline().latest_completed().time
        Table.open(spark, str(path)).write(df(batch), operation, index=index)
        timeline = Table.open(spark, str(path)).timeline()
        mine = timeline.latest_completed().time
        want = expected(model, batch, delete=operation == "delete")
        got = java_changes(java, path, before, mine)
        assert len(got) == len(want), f"{operation}: Java's CDC query has {len(got)} changes, {len(want)} were made"
        assert got == sorted(want, key=lambda c: (c[0], c[1] or (), c[2] or ())), operation
        stats = [s for s in timeline.commit_metadata(timeline.latest_completed()).write_stats]
        if table_type == COPY_ON_WRITE:  # every rewritten base file has its .cdc, named in cdcStats
            rewritten = [s for s in stats if s.prev_commit != "null"]
            assert rewritten and all(s.cdc_stats for s in rewritten)
        for s in stats:  # (merge-on-read: a small file taking inserts is rewritten, with its .cdc)
            for cdc, size in (s.cdc_stats or {}).items():
                assert cdc.endswith(".cdc") and (path / cdc).is_file(), f"{operation}: {cdc} is named in the commit but was not kept"
                assert (path / cdc).stat().st_size == size
    # the batches' keys stay in their partitions: partition tasks decided every write, with
    # either index (the global one asks the files' bloom filters first)
    assert len(by_partition) == len(rounds)
    rows = sorted(model.values())
    assert sorted((r["id"], r["name"]) for r in Table.open(spark, str(path)).read().collect()) == [(r[0], r[1]) for r in rows]
    rs = hudi_rs(path)
    assert sorted(zip(rs.column("id").to_pylist(), rs.column("name").to_pylist())) == [(r[0], r[1]) for r in rows]
    # Java writes on after pipe: its own commit's changes are read as well
    before = Table.open(spark, str(path)).timeline().latest_completed().time
    last = [row(i, 4) for i in range(4, 1300, 11)]
    java.write(path, arrow(last), java_options(version, table_type, mode, "upsert"))
    want = expected(model, last)
    if table_type == COPY_ON_WRITE:  # (Java's own merge-on-read commits append to the slice's log file, whose
        # earlier blocks its CDC reader of 0.15 then counts as this commit's changes too)
        assert java_changes(java, path, before, Table.open(spark, str(path)).timeline().latest_completed().time) == want
    java_rows = java.read(path)
    got, want_rows = sorted(zip(java_rows.column("id").to_pylist(), java_rows.column("name").to_pylist())), sorted((r[0], r[1]) for r in model.values())
    # (each key once: a key pipe deleted in a log and wrote again went back to its group, where Java's
    # index finds it, so Java's upsert did not write it into two groups)
    assert got == want_rows, (sorted(set(got) - set(want_rows))[:10], sorted(set(want_rows) - set(got))[:10], len(got), len(want_rows))


def test_a_projects_cdc_logging_creates_the_table_with_its_log_and_is_checked_at_compile_time(spark, tmp_path, capsys):
    """`cdc_logging:` in a table's YAML: the table is created with Hudi's CDC log in that mode, and
    every later run's rewritten base files get their `.cdc` files (named in cdcStats); another
    mode for the existing table is refused, naming both; a bucket index with it is a compile
    error at its line."""
    from tests.conftest import compile_errors
    from tests.test_run import pipe, project, run_ok, write_jsonl

    table_yml = "tables:\n  ledger:\n    key: [id]\n    precombine: ts\n    partition_by: [region]\n    cdc_logging: {mode}\n"
    root = project(tmp_path, {
        "sources/s.yml": "sources:\n  raw: {kind: files, path: data, format: json, schema: \"id BIGINT, name STRING, price DOUBLE, ts BIGINT, region STRING\"}\n",
        "tables/ledger.yml": table_yml.format(mode="data_before_after"),
        "tables/ledger.sql": "select * from {{ source('raw') }}\n",
    })
    for r, ids in enumerate((range(400), range(0, 600, 4), range(1, 700, 9))):
        write_jsonl(root / f"data/ledger-{r}.json", [dict(zip(("id", "name", "price", "ts", "region"), row(i, r))) for i in ids])
        run_ok(capsys, root)
    path = root / "lake/ledger"
    props = (path / ".hoodie/hoodie.properties").read_text()
    assert "hoodie.table.cdc.enabled=true" in props and "hoodie.table.cdc.supplemental.logging.mode=DATA_BEFORE_AFTER" in props
    timeline = Table.open(spark, str(path)).timeline()
    for instant in [i for i in timeline.completed() if i.action == "commit"][1:]:
        rewritten = [s for s in timeline.commit_metadata(instant).write_stats if s.prev_commit != "null"]
        assert rewritten and all(s.cdc_stats and (path / next(iter(s.cdc_stats))).is_file() for s in rewritten), instant.time
    (root / "tables/ledger.yml").write_text(table_yml.format(mode="op_key_only"))
    write_jsonl(root / "data/ledger-9.json", [dict(zip(("id", "name", "price", "ts", "region"), row(5, 9)))])
    code, out, err = pipe(capsys, root, "run")
    assert code != 0 and "change data capture log (cdc_logging) is data_before_after in the table but op_key_only now" in out + err, out + err
    (root / "tables/ledger.yml").write_text(table_yml.format(mode="data_before") + "    index: bucket\n    buckets: 4\n")
    errors = [str(e) for e in compile_errors(root)]
    assert any("ledger.yml:6" in e and "cdc_logging cannot go with index: bucket" in e for e in errors), errors
