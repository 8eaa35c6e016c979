"""The replacing operations declared in `tables/*.yml` and run by `pipe run`: insert_overwrite
(the partitions the input has rows for), insert_overwrite_table (the whole table, every run)
and delete_partition (partitions named in the YAML with wildcards, or by the rows of the SQL),
each a replacecommit read back with pipe's reader and hudi-rs."""

from __future__ import annotations

import json

from tests.test_run import assert_clean, assert_rows, commits, pipe, project, run_ok, steps, timeline, write_jsonl

SOURCES = """
    sources:
      readings:
        kind: files
        path: data/readings
        format: json
        schema: "day STRING, sensor STRING, value BIGINT"
      purges:
        kind: files
        path: data/purges
        format: json
        schema: "day STRING"
    """
COLS = ["day", "sensor", "value"]


def replaced_groups(root, table: str, instant: str) -> dict:
    meta = json.loads((root / f"lake/{table}/.hoodie/{instant}.replacecommit").read_text())
    return {p: len(ids) for p, ids in meta["partitionToReplaceFileIds"].items()}


def test_insert_overwrite_replaces_the_partitions_of_each_run(spark, tmp_path, capsys):
    root = project(tmp_path, {
        "sources/s.yml": SOURCES,
        "tables/daily.yml": """
            tables:
              daily:
                operation: insert_overwrite
                partition_by: [day]
              latest_only:
                operation: insert_overwrite_table
            """,
        "tables/daily.sql": "select day, sensor, value from {{ source('readings') }}\n",
        "tables/latest_only.sql": "select day, sensor, value from {{ source('readings') }}\n",
    })
    (root / "data/purges").mkdir(parents=True)
    first = [("d1", "a", 1), ("d1", "b", 2), ("d2", "a", 3)]
    write_jsonl(root / "data/readings/r-1.json", [dict(zip(COLS, r)) for r in first])
    run_ok(capsys, root)
    assert_rows(spark, root, "daily", COLS, first)

    # a late correction of d2 and a new day: d1 stays, d2 is replaced, d3 is added
    second = [("d2", "a", 30), ("d2", "c", 31), ("d3", "a", 4)]
    write_jsonl(root / "data/readings/r-2.json", [dict(zip(COLS, r)) for r in second])
    run_ok(capsys, root)
    assert_rows(spark, root, "daily", COLS, first[:2] + second)
    last = commits(timeline(capsys, root, "daily"))[-1]
    assert last["action"] == "replacecommit" and last["operation"] == "INSERT_OVERWRITE"
    assert replaced_groups(root, "daily", last["instant"]) == {"day=d2": 1}
    # insert_overwrite_table: the table is the latest run's rows
    assert_rows(spark, root, "latest_only", COLS, second)
    assert commits(timeline(capsys, root, "latest_only"))[-1]["operation"] == "INSERT_OVERWRITE_TABLE"

    # delete_partition with patterns in the YAML: the table changes its operation and runs once
    (root / "tables/daily.sql").unlink()
    (root / "tables/daily.yml").write_text("""
tables:
  daily:
    operation: delete_partition
    partition_by: [day]
    partitions_to_delete: ["day=d[23]"]
  latest_only:
    operation: insert_overwrite_table
""", encoding="utf-8")
    run_ok(capsys, root, "--select", "daily")
    assert steps(root)["table.daily"]["state"] == "success"
    assert_rows(spark, root, "daily", COLS, first[:2])
    last = commits(timeline(capsys, root, "daily"))[-1]
    assert last["operation"] == "DELETE_PARTITION" and replaced_groups(root, "daily", last["instant"]) == {"day=d2": 1, "day=d3": 1}
    run_ok(capsys, root, "--select", "daily")
    assert steps(root)["table.daily"]["state"] == "no_input"  # ran once for its new definition

    # a pattern that matches nothing stops the step and lists the partitions
    (root / "tables/daily.yml").write_text((root / "tables/daily.yml").read_text().replace("day=d[23]", "day=d9"), encoding="utf-8")
    code, out, err = pipe(capsys, root, "run", "--select", "daily")
    assert code == 1
    assert_clean(out, err)
    assert "'day=d9' match no partition" in err and "'day=d1'" in err
    assert_rows(spark, root, "daily", COLS, first[:2])


def test_delete_partition_named_by_the_rows_of_the_sql(spark, tmp_path, capsys):
    root = project(tmp_path, {
        "sources/s.yml": SOURCES,
        "tables/daily.yml": "tables:\n  daily:\n    operation: insert_overwrite\n    partition_by: [day]\n",
        "tables/daily.sql": "select day, sensor, value from {{ source('readings') }}\n",
    })
    (root / "data/purges").mkdir(parents=True)
    rows = [("d1", "a", 1), ("d2", "a", 2), ("d3", "a", 3)]
    write_jsonl(root / "data/readings/r-1.json", [dict(zip(COLS, r)) for r in rows])
    run_ok(capsys, root)

    # purge requests arrive as files; each run deletes the days they name
    (root / "tables/daily.yml").write_text("tables:\n  daily:\n    operation: delete_partition\n    partition_by: [day]\n", encoding="utf-8")
    (root / "tables/daily.sql").write_text("select day from {{ source('purges') }}\n", encoding="utf-8")
    write_jsonl(root / "data/purges/p-1.json", [{"day": "d1"}, {"day": "d3"}, {"day": "d1"}])
    run_ok(capsys, root, "--select", "daily")
    assert_rows(spark, root, "daily", COLS, [("d2", "a", 2)])
    last = commits(timeline(capsys, root, "daily"))[-1]
    assert replaced_groups(root, "daily", last["instant"]) == {"day=d1": 1, "day=d3": 1}
    assert "purges" in last["checkpoints"]
    run_ok(capsys, root, "--select", "daily")
    assert steps(root)["table.daily"]["state"] == "no_input"
