"""Deletes that stay deleted (`tombstone_days`): a late event older than its key's delete does
not bring the key back, so incremental runs and a full refresh over the same input agree."""

from __future__ import annotations

import pytest

from pipe.cli import main
from runtime.table import Table, TableConfig
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from runtime.table.tombstones import FOLDER
from tests.test_run import assert_rows, pipe_rows, project, steps, write_jsonl

SCHEMA = "id bigint, p string, ts bigint, v string, _hoodie_is_deleted boolean"


def _table(spark, path, table_type):
    return Table.create(spark, path, TableConfig(name="t", table_type=table_type, record_key_fields=("id",),
                                                 partition_fields=("p",), precombine_field="ts"))


def _ids(table):
    return sorted((r["id"], r["v"]) for r in table.read(meta=False).collect())


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_late_update_older_than_the_delete_does_not_resurrect_the_key(spark, tmp_path, table_type):
    write = lambda t, rows, **kw: t.write(spark.createDataFrame(rows, SCHEMA), "upsert", **kw)  # noqa: E731
    for days, expected in ((30, [(2, "kept")]), (None, [(1, "late"), (2, "kept")])):
        table = _table(spark, str(tmp_path / f"t{days}"), table_type)
        write(table, [(1, "a", 1_700_000_000_000, "first", False), (2, "a", 1_700_000_000_000, "kept", False)], tombstone_days=days)
        write(table, [(1, "a", 1_700_000_010_000, None, True)], tombstone_days=days)  # deleted at ts ...010
        # later batches: an older update of the deleted key (...005), and a delete of a key
        # that arrives before that key's (older) insert
        write(table, [(1, "a", 1_700_000_005_000, "late", False), (3, "b", 1_700_000_020_000, None, True)], tombstone_days=days)
        write(table, [(3, "b", 1_700_000_015_000, "older insert", False)], tombstone_days=days)
        if days is None:  # Hudi's own behaviour: the delete is forgotten
            expected = expected + [(3, "older insert")]
            if table_type == MERGE_ON_READ:  # until a compaction folds it, the delete block's ordering value beats the
                # older update, which goes to the key's own group (where Java's index finds it), as in Java's tables
                expected = [e for e in expected if e != (1, "late")]
        assert _ids(table) == expected, f"tombstone_days={days}"
    # a newer event than the delete brings the key back
    write(table, [(1, "a", 1_700_000_030_000, "newer", False)], tombstone_days=30)
    assert (1, "newer") in _ids(table)


def test_tombstones_of_a_restored_write_no_longer_count(spark, tmp_path):
    path = str(tmp_path / "t")
    table = _table(spark, path, COPY_ON_WRITE)
    write = lambda rows: table.write(spark.createDataFrame(rows, SCHEMA), "upsert", tombstone_days=30)  # noqa: E731
    first = write([(1, "a", 100, "first", False)]).instant
    write([(1, "a", 200, None, True)])
    assert [f.path for f in table.storage.list_files(FOLDER)]
    table.restore(first)  # the delete is undone, and its tombstone with it
    write([(1, "a", 150, "after restore", False)])
    assert _ids(table) == [(1, "after restore")]
    assert len(table.storage.list_files(FOLDER)) == 0  # the restored write's tombstone file is gone


FILES = {
    "sources/cdc.yml": """
        sources:
          customer_events:
            kind: files
            path: data/customers
            format: json
            schema: "customer_id BIGINT, name STRING, op STRING, changed_at BIGINT"
        """,
    "tables/customers.yml": """
        tables:
          customers:
            key: [customer_id]
            precombine: changed_at          # epoch millis of the change
            delete_when: "op = 'd'"
            tombstone_days: 30
            type: merge_on_read
        """,
    "tables/customers.sql": "select customer_id, name, op, changed_at from {{ source('customer_events') }}\n",
}

T0 = 1_714_000_000_000
BATCHES = [
    [{"customer_id": 1, "name": "Ada", "op": "c", "changed_at": T0}, {"customer_id": 2, "name": "Bo", "op": "c", "changed_at": T0},
     {"customer_id": 4, "name": "Cy", "op": "c", "changed_at": T0}],
    [{"customer_id": 1, "name": None, "op": "d", "changed_at": T0 + 10_000},
     {"customer_id": 3, "name": None, "op": "d", "changed_at": T0 + 10_000}],  # a delete before its insert
    # late events, older than the deletes
    [{"customer_id": 1, "name": "Ada (late)", "op": "u", "changed_at": T0 + 5_000},
     {"customer_id": 3, "name": "Di", "op": "c", "changed_at": T0 + 1_000},
     {"customer_id": 4, "name": "Cy 2", "op": "u", "changed_at": T0 + 7_000}],
]


def test_incremental_runs_and_a_full_refresh_agree_on_out_of_order_deletes(spark, tmp_path):
    root = project(tmp_path, FILES)
    for i, batch in enumerate(BATCHES):
        write_jsonl(root / f"data/customers/batch-{i}.json", batch, mtime=1_700_000_000 + 60 * i)
        assert main(["run", "--project-dir", str(root)]) == 0, steps(root)
    incremental = pipe_rows(spark, root, "customers", ["customer_id", "name"])
    assert incremental == [(2, "Bo"), (4, "Cy 2")]
    assert main(["run", "--project-dir", str(root), "--full-refresh"]) == 0, steps(root)
    assert_rows(spark, root, "customers", ["customer_id", "name"], incremental)


def test_tombstone_days_needs_a_precombine_column(tmp_path):
    root = project(tmp_path, {**FILES, "tables/customers.yml": FILES["tables/customers.yml"].replace(
        "            precombine: changed_at          # epoch millis of the change\n", "")})
    from tests.conftest import compile_errors

    errors = compile_errors(root)
    assert any("tombstone_days" in e.message and "precombine" in e.message and "tables/customers.yml:" in str(e) for e in errors), errors


def test_a_rolled_back_first_write_leaves_no_tombstone(spark, tmp_path):
    table = _table(spark, str(tmp_path / "t"), COPY_ON_WRITE)
    first = table.write(spark.createDataFrame([(1, "a", 100, "x", False), (9, "a", 500, None, True)], SCHEMA), "upsert",
                        tombstone_days=30).instant
    table.rollback(first)  # the table is as before its first write: nothing was ever deleted
    assert table.storage.list_files(FOLDER) == []
    table.write(spark.createDataFrame([(9, "a", 100, "fixed input", False)], SCHEMA), "upsert", tombstone_days=30)
    assert _ids(table) == [(9, "fixed input")]


def test_a_full_refresh_starts_the_tombstones_afresh(spark, tmp_path):
    """A bad delete (far-future ordering value) removed from the input is undone by rebuilding."""
    table = _table(spark, str(tmp_path / "t"), COPY_ON_WRITE)
    write = lambda rows, op="upsert": table.write(spark.createDataFrame(rows, SCHEMA), op, tombstone_days=30,  # noqa: E731
                                                  combine_before_insert=op != "upsert")
    write([(1, "a", 100, "x", False)])
    write([(1, "a", 4_102_444_800_000, None, True)])  # a delete stamped 2100
    write([(1, "a", 200, "back", False)])
    assert _ids(table) == []
    write([(1, "a", 100, "x", False), (1, "a", 200, "back", False)], "insert_overwrite_table")  # the input without the bad delete
    write([(1, "a", 300, "later", False)])
    assert _ids(table) == [(1, "later")]
