"""`pipe savepoint`, `pipe restore`, `pipe rollback`, `pipe clean` and `pipe timeline --all` on a
project, as a user runs them: rows read back with pipe's reader and hudi-rs, the timeline as
`pipe timeline` prints it, and the next `pipe run` reading the input again from the checkpoints
the restored commit holds."""

from __future__ import annotations

import json

from tests.test_run import assert_clean, assert_rows, commits, pipe, project, run_ok, steps, timeline, write_jsonl

FILES = {
    "sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, status STRING, ts BIGINT"
        """,
    "tables/orders.yml": """
        tables:
          orders:
            key: [order_id]
            precombine: ts
            clean: {retain: 1}
            archive: {min_instants: 2, max_instants: 4}
        """,
    "tables/orders.sql": "select order_id, status, ts from {{ source('raw') }}\n",
}
COLS = ["order_id", "status", "ts"]


def add_batch(root, n: int) -> None:
    write_jsonl(root / f"data/orders/o-{n}.json", [{"order_id": 1, "status": f"v{n}", "ts": n}, {"order_id": 10 + n, "status": "new", "ts": n}])


def rows_after(n: int) -> list[tuple]:
    return [(1, f"v{n}", n)] + [(10 + i, "new", i) for i in range(1, n + 1)]


def test_savepoint_restore_and_run_again(spark, tmp_path, capsys):
    root = project(tmp_path, FILES)
    for n in (1, 2):
        add_batch(root, n)
        run_ok(capsys, root)
    kept = commits(timeline(capsys, root, "orders"))[-1]["instant"]
    code, out, err = pipe(capsys, root, "savepoint", "orders", "--comment", "before the backfill")
    assert code == 0, err
    assert f"savepointed orders at {kept}" in out and f"pipe restore orders {kept}" in out

    for n in (3, 4, 5):
        add_batch(root, n)
        run_ok(capsys, root)
    assert_rows(spark, root, "orders", COLS, rows_after(5))
    code, out, err = pipe(capsys, root, "clean", "orders")
    assert code == 0, err
    assert f"kept: the files of savepoint {kept}" in out

    # archiving stopped at the savepoint; the commit after it is cleaned (retain 1), so it cannot
    # be restored; the hint names the table
    later = [c["instant"] for c in commits(timeline(capsys, root, "orders")) if c["instant"] > kept]
    assert commits(timeline(capsys, root, "orders"))[0]["instant"] == kept and len(later) == 3
    code, out, err = pipe(capsys, root, "restore", "orders", later[0])
    assert code == 1 and "have been cleaned" in err and "pipe savepoint orders INSTANT" in err
    assert_clean(out, err)

    code, out, err = pipe(capsys, root, "restore", "orders", kept)
    assert code == 0, err
    assert f"restored orders to {kept}: undid 3 write(s) ({', '.join(later[::-1])})" in out
    assert_rows(spark, root, "orders", COLS, rows_after(2))
    instants = timeline(capsys, root, "orders")
    assert commits(instants)[-1]["instant"] == kept
    restore = [i for i in instants if i["action"] == "restore"]
    assert len(restore) == 1 and restore[0]["detail"] == f"undid 3 write(s): {', '.join(later[::-1])}"
    assert [i["detail"] for i in instants if i["action"] == "savepoint"] == ["keeps 1 file(s): before the backfill"]

    # the restored commit holds the checkpoint of its time: the next run reads batches 3-5 again
    run_ok(capsys, root)
    assert steps(root)["table.orders"]["rows_read"] == 6
    assert_rows(spark, root, "orders", COLS, rows_after(5))

    code, out, err = pipe(capsys, root, "timeline", "orders")
    assert code == 0
    lines = out.splitlines()
    assert any(kept in line and "savepoint" in line and "keeps 1 file(s): before the backfill" in line for line in lines), out
    assert any("restore" in line and f"undid 3 write(s): {later[-1]}" in line for line in lines), out


def test_rollback_the_latest_run_and_read_its_input_again(spark, tmp_path, capsys):
    root = project(tmp_path, FILES)
    for n in (1, 2):
        add_batch(root, n)
        run_ok(capsys, root)
    writes = [c["instant"] for c in commits(timeline(capsys, root, "orders"))]

    code, out, err = pipe(capsys, root, "rollback", "orders", writes[0])
    assert code == 1 and f"is not the latest write ({writes[1]} is)" in err and "pipe restore orders INSTANT" in err
    code, out, err = pipe(capsys, root, "rollback", "orders", "yesterday")
    assert code == 2 and "is not an instant time" in err
    code, out, err = pipe(capsys, root, "rollback", "ordres", writes[1])
    assert code == 2 and "no table named 'ordres'" in err
    assert_clean(out, err)

    code, out, err = pipe(capsys, root, "rollback", "orders", writes[1])
    assert code == 0, err
    assert f"rolled back orders {writes[1]}" in out and f"the table is as of {writes[0]}" in out
    assert_rows(spark, root, "orders", COLS, rows_after(1))
    rollbacks = [i for i in timeline(capsys, root, "orders") if i["action"] == "rollback"]
    assert [r["detail"] for r in rollbacks] == [f"undid {writes[1]}"]

    run_ok(capsys, root)  # batch 2 is read again
    assert steps(root)["table.orders"]["rows_read"] == 2
    assert_rows(spark, root, "orders", COLS, rows_after(2))


def test_timeline_all_lists_archived_instants(spark, tmp_path, capsys):
    root = project(tmp_path, FILES)
    for n in (1, 2, 3, 4):
        add_batch(root, n)
        run_ok(capsys, root)
    active = timeline(capsys, root, "orders")
    code, out, err = pipe(capsys, root, "timeline", "orders", "--all", "--output", "json")
    assert code == 0, err
    every = [json.loads(line) for line in out.splitlines()]
    archived = [i for i in every if i["timeline"] == "archived"]
    assert archived and len(every) == len(archived) + len(active)
    assert all(a["instant"] < active[0]["instant"] for a in archived)
    assert len([i for i in every if i["action"] == "commit" and i["state"] == "completed"]) == 4
    code, out, err = pipe(capsys, root, "timeline", "orders", "--all")
    assert "completed (archived)" in out
    assert_rows(spark, root, "orders", COLS, rows_after(4))
