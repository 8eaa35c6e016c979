"""A rebuild that creates a table anew (its key changed) costs its incremental consumers their
checkpoints: `pipe diff` and `pipe run --full-refresh` warn and name them, and the consumer's
next run says the upstream was rebuilt (not "archived"). A restore is named as a restore."""

from __future__ import annotations

import json
import shutil

from tests.test_run import assert_clean, commits, pipe, project, run_ok, steps, timeline, write_jsonl

FILES = {
    "sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            schema: "id BIGINT, v STRING"
          up_changes:
            kind: table
            table: up
        """,
    "tables/t.yml": """
        tables:
          up:
            key: [id]
          down:
            key: [id]
        """,
    "tables/up.sql": "select id, v from {{ source('raw') }}\n",
    "tables/down.sql": "select id, v from {{ source('up_changes') }}\n",
}


def test_a_rebuild_that_recreates_an_upstream_is_announced_and_named(spark, tmp_path, capsys):
    root = project(tmp_path, FILES)
    write_jsonl(root / "data/raw/r-1.json", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    run_ok(capsys, root)
    read_up_to = commits(timeline(capsys, root, "down"))[-1]["checkpoints"]["up_changes"]
    assert pipe(capsys, root, "compile")[0] == 0
    shutil.copy(root / "target/plan.json", tmp_path / "base.json")

    yml = root / "tables/t.yml"
    yml.write_text(yml.read_text().replace("up:\n    key: [id]", "up:\n    key: [id, v]"))
    assert pipe(capsys, root, "compile")[0] == 0
    code, out, err = pipe(capsys, root, "diff", str(tmp_path / "base.json"), str(root / "target/plan.json"))
    assert code == 1, err
    assert ("warning source.up_changes: the record key of table up changes, so `pipe run --full-refresh` creates it anew "
            "and its instants start over: table down reads it incrementally through source up_changes and loses its checkpoint; "
            "its next run then stops with a lost checkpoint") in out, out
    code, out, err = pipe(capsys, root, "diff", str(tmp_path / "base.json"), str(root / "target/plan.json"), "--format", "json")
    assert any(w["step"] == "source.up_changes" and "loses its checkpoint" in w["message"] for w in json.loads(out)["warnings"])

    out, err = run_ok(capsys, root, "--select", "up", "--full-refresh")
    assert (f"warning: --full-refresh creates table up anew (record key is ['id'] in the table but ['id', 'v'] now): down has "
            f"read it up to {read_up_to} through source up_changes, a checkpoint the new table will not have; its next run then "
            "stops with a lost checkpoint") in " ".join(err.split()), err
    rebuilt_at = commits(timeline(capsys, root, "up"))[0]["instant"]

    code, out, err = pipe(capsys, root, "run", "--select", "down")
    assert code == 1
    assert_clean(out, err)
    message = steps(root)["table.down"]["message"]
    assert f"table up was rebuilt: it was created anew at {rebuilt_at}" in message and f"after instant {read_up_to}" in message
    assert "archived" not in message

    # rebuilt together, the consumer reads the new table whole: no warning
    out, err = run_ok(capsys, root, "--select", "up+", "--full-refresh")
    assert "warning" not in err


def test_a_restore_below_the_checkpoint_is_named_as_a_restore(spark, tmp_path, capsys):
    root = project(tmp_path, FILES)
    write_jsonl(root / "data/raw/r-1.json", [{"id": 1, "v": "a"}])
    run_ok(capsys, root)
    first = commits(timeline(capsys, root, "up"))[-1]["instant"]
    write_jsonl(root / "data/raw/r-2.json", [{"id": 2, "v": "b"}])
    run_ok(capsys, root)
    second = commits(timeline(capsys, root, "up"))[-1]["instant"]
    code, out, err = pipe(capsys, root, "restore", "up", first)
    assert code == 0, err
    restore = [i["instant"] for i in timeline(capsys, root, "up") if i["action"] == "restore"][-1]
    write_jsonl(root / "data/raw/r-3.json", [{"id": 3, "v": "c"}])
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    message = steps(root)["table.down"]["message"]
    assert f"table up was restored to an earlier commit (restore instant {restore}), which undid instant {second}" in message


def test_a_checkpoint_archived_by_another_tool_is_named_as_archived(spark, tmp_path):
    """The consumer read up to the first commit; the upstream is then archived past it (as a
    cleaner outside the project would): the source says the commits were archived."""
    import pytest

    from runtime.sources import SourceError
    from runtime.sources import table as table_source
    from runtime.table import Table, TableConfig

    path = str(tmp_path / "up")
    up = Table.create(spark, path, TableConfig(name="up", record_key_fields=("id",)))
    first = up.write(spark.createDataFrame([(1, "a")], "id long, v string"), "upsert", clean_inline=False).instant
    for i in range(2, 6):
        up.write(spark.createDataFrame([(i, "a")], "id long, v string"), "upsert", clean_inline=False)
    archived = up.archive(min_instants=2, max_instants=3)
    assert first in archived
    with pytest.raises(SourceError, match=f"the commits of table up after instant {first} have been archived"):
        table_source.pending("s", {}, Table.open(None, path), "down", first)
