"""`pipe diff`: each classification rule on a small project compiled twice, downstream impact,
retention warnings, the three output formats and the exit codes. No Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.api import compile_project
from compiler.diff import diff_plans
from pipe.cli import main
from tests.conftest import write_project

BASE = {
    "sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            schema: "id BIGINT, v STRING, ts BIGINT, region STRING"
            max_files_per_run: 10
          changes:
            kind: table
            table: t
        """,
    "tables/t.yml": """
        tables:
          t:
            description: the main table
            key: [id]
            precombine: ts
            partition_by: [region]
            schema: "id BIGINT, v STRING, ts BIGINT, region STRING"
            tags: [core]
        """,
    "tables/t.sql": "select id, v, ts, region from {{ source('raw') }} where id > 0\n",
    "tables/down.sql": "select id, v from {{ ref('t') }}\n",
    "tables/log.sql": "select id, v from {{ source('changes') }}\n",
    "tables/other.sql": "select 1 as one\n",
}


def diff_after(tmp_path: Path, edits: dict[str, str | None]):
    base = compile_project(write_project(tmp_path / "base", BASE)).plan
    files = {**BASE, **{k: v for k, v in edits.items() if v is not None}}
    for k, v in edits.items():
        if v is None:
            files.pop(k)
    head = compile_project(write_project(tmp_path / "head", files)).plan
    return diff_plans(base, head)


def step(diff, sid):
    return next(s for s in diff.steps if s.id == sid)


def with_table_yml(**changes) -> str:
    lines = {"description": "the main table", "key": "[id]", "precombine": "ts", "partition_by": "[region]",
             "schema": '"id BIGINT, v STRING, ts BIGINT, region STRING"', "tags": "[core]"}
    lines.update(changes)
    body = "".join(f"    {k}: {v}\n" for k, v in lines.items() if v is not None)
    return "tables:\n  t:\n" + body


def test_no_change_is_no_change(tmp_path):
    d = diff_after(tmp_path, {})
    assert not d.has_changes and d.worst() is None
    assert {s.status for s in d.steps} == {"unchanged"}


@pytest.mark.parametrize("edit, field, cls", [
    ({"key": "[id, region]"}, "key", "rewrite"),
    ({"partition_by": "[v]"}, "partition_by", "rewrite"),
    ({"precombine": "id"}, "precombine", "rewrite"),
    ({"type": "merge_on_read"}, "type", "rewrite"),
    ({"hive_style_partitioning": "false"}, "hive_style_partitioning", "rewrite"),
    ({"cdc_logging": "data_before_after"}, "cdc_logging", "rewrite"),
    ({"cdc_logging": "DATA_BEFORE"}, "cdc_logging", "rewrite"),  # Hudi's spelling: the same mode
    ({"operation": "insert_overwrite_table"}, "operation", "destructive"),
    ({"delete_when": "\"v = 'gone'\""}, "delete_when", "destructive"),
    ({"operation": "insert"}, "operation", "breaking"),
    ({"index": "partition"}, "index", "breaking"),
    ({"index": "record"}, "index", "non-breaking"),  # still unique across the table: a record index only changes the lookup
    ({"schema": '"id BIGINT, ts BIGINT, region STRING"'}, "schema", "breaking"),
    ({"schema": '"id BIGINT, v INT, ts BIGINT, region STRING"'}, "schema", "breaking"),
    ({"schema": '"id BIGINT, v STRING, ts BIGINT, region STRING, extra STRING"'}, "schema", "non-breaking"),
    ({"max_file_size": "256MB"}, "max_file_size", "non-breaking"),
    ({"clean": "{policy: keep_latest_commits, retain: 15}"}, "clean", "non-breaking"),
    ({"description": "renamed"}, "description", "metadata-only"),
    ({"tags": "[core, new]"}, "tags", "metadata-only"),
])
def test_each_table_setting_gets_its_class(tmp_path, edit, field, cls):
    d = diff_after(tmp_path, {"tables/t.yml": with_table_yml(**edit)})
    t = step(d, "table.t")
    assert t.status == "modified" and t.cls == cls, [c.to_dict() for c in t.changes]
    assert field in [c.field for c in t.changes]
    assert (t.command == "pipe run --select t --full-refresh") == (cls == "rewrite")


def test_cdc_logging_removed_is_non_breaking_changed_is_a_rewrite_and_unset_it_is_not_in_the_plan(tmp_path):
    base = compile_project(write_project(tmp_path / "base", {**BASE, "tables/t.yml": with_table_yml(cdc_logging="data_before")})).plan
    for mode, cls in ((None, "non-breaking"), ("op_key_only", "rewrite")):
        head = compile_project(write_project(tmp_path / f"head-{mode}", {**BASE, "tables/t.yml": with_table_yml(cdc_logging=mode)})).plan
        t = step(diff_plans(base, head), "table.t")
        assert t.cls == cls and [c.field for c in t.changes] == ["cdc_logging"], [c.to_dict() for c in t.changes]
    # unset, the key is not in the step's config: plans made before it existed keep their fingerprints
    assert "cdc_logging" not in compile_project(write_project(tmp_path / "plain", BASE)).plan.step("table.t").config


def test_sql_change_is_non_breaking_with_a_unified_diff_and_marks_downstream(tmp_path):
    d = diff_after(tmp_path, {"tables/t.sql": "select id, v, ts, region from {{ source('raw') }} where id > 10\n"})
    t = step(d, "table.t")
    assert (t.status, t.cls) == ("modified", "non-breaking")
    assert "-select id, v, ts, region from `raw` where id > 0" in t.sql_diff
    assert "+select id, v, ts, region from `raw` where id > 10" in t.sql_diff
    assert t.sql_diff.startswith("--- a/tables/t.sql\n+++ b/tables/t.sql\n")
    # down reads t by ref(); log reads it through the `changes` table source
    for sid in ("table.down", "source.changes", "table.log"):
        assert step(d, sid).status == "indirect" and "table.t" in step(d, sid).upstream_changes
    assert step(d, "table.other").status == "unchanged"
    assert d.counts() == {"added": 0, "removed": 0, "modified": 1, "indirect": 3, "unchanged": 2}


def test_sql_change_without_declared_columns_says_columns_cannot_be_checked(tmp_path):
    d = diff_after(tmp_path, {"tables/down.sql": "select id from {{ ref('t') }}\n"})
    [c] = step(d, "table.down").changes
    assert c.field == "sql" and "no declared `schema`" in c.why


def test_added_and_removed_steps(tmp_path):
    d = diff_after(tmp_path, {"tables/other.sql": None, "tables/new.sql": "select 2 as two\n"})
    assert step(d, "table.new").status == "added" and step(d, "table.new").cls is None
    removed = step(d, "table.other")
    assert (removed.status, removed.cls) == ("removed", "destructive")
    assert d.worst() == "destructive"


def test_source_settings(tmp_path):
    src = BASE["sources/s.yml"]
    d = diff_after(tmp_path, {"sources/s.yml": src.replace("max_files_per_run: 10", "max_files_per_run: 20")})
    raw = step(d, "source.raw")
    assert (raw.cls, [c.field for c in raw.changes]) == ("non-breaking", ["max_files_per_run"])
    assert step(d, "table.t").status == "indirect"
    d = diff_after(tmp_path / "2", {"sources/s.yml": src.replace("path: data/raw", "path: data/raw2")})
    assert step(d, "source.raw").cls == "breaking"


def test_retention_warning_for_an_incremental_consumer(tmp_path):
    d = diff_after(tmp_path, {"tables/t.yml": with_table_yml(clean="{policy: keep_latest_commits, retain: 2}")})
    [w] = d.warnings
    assert w.step == "source.changes" and "keeps only 2 commit(s)" in w.message and "keep at least 3" in w.message
    d = diff_after(tmp_path / "2", {"tables/t.yml": with_table_yml(clean="{policy: keep_latest_file_versions, retain: 3}")})
    assert "cleans by file versions" in d.warnings[0].message
    d = diff_after(tmp_path / "3", {"tables/t.yml": with_table_yml(clean="{policy: keep_latest_commits, retain: 5}")})
    assert "now keeps 5 commits instead of 10" in d.warnings[0].message


# --- the command --------------------------------------------------------------------------------


def _plans(tmp_path: Path, edits: dict[str, str]) -> tuple[Path, Path]:
    out = []
    for name, files in (("a", BASE), ("b", {**BASE, **edits})):
        root = write_project(tmp_path / name, files)
        assert main(["compile", "--project-dir", str(root)]) == 0
        out.append(root / "target" / "plan.json")
    return out[0], out[1]


def test_command_exit_codes_and_formats(tmp_path, capsys):
    a, b = _plans(tmp_path, {"tables/t.yml": with_table_yml(key="[id, region]")})
    capsys.readouterr()
    assert main(["diff", str(a), str(a)]) == 0
    assert "No changes" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "~ table.t  modified rewrite" in out and "after merging: pipe run --select t --full-refresh" in out
    assert "^ table.down  indirect" in out

    assert main(["diff", str(a), str(b), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["diff_schema_version"] == 1 and doc["summary"]["worst_class"] == "rewrite"
    t = next(s for s in doc["steps"] if s["id"] == "table.t")
    assert t["class"] == "rewrite" and t["changes"][0] == {
        "field": "key", "before": ["id"], "after": ["id", "region"], "class": "rewrite", "why": t["changes"][0]["why"]}

    assert main(["diff", str(a), str(b), "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("### pipe diff") and "| `table.t` | modified | **rewrite** |" in md

    assert main(["diff", str(a), str(b), "--fail-on", "rewrite"]) == 1
    assert main(["diff", str(a), str(b), "--fail-on", "destructive"]) == 1  # rewrite is more severe
    capsys.readouterr()
    a2, b2 = _plans(tmp_path / "nb", {"tables/t.yml": with_table_yml(max_file_size="256MB")})
    assert main(["diff", str(a2), str(b2), "--fail-on", "breaking"]) == 0
    assert main(["diff", str(a2), str(b2)]) == 1


def test_command_errors_exit_2_with_a_hint(tmp_path, capsys):
    assert main(["diff", "--project-dir", str(write_project(tmp_path / "p", BASE))]) == 2
    err = capsys.readouterr().err
    assert "give the base" in err and "hint" in err
    assert main(["diff", str(tmp_path / "missing.json"), "--project-dir", str(tmp_path / "p")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["diff", "--base-ref", "HEAD", "--project-dir", str(tmp_path / "p")]) == 2  # not a git repository
    err = capsys.readouterr().err
    assert "not a git repository" in err and "Traceback" not in err


def test_base_ref_compiles_the_committed_project_and_leaves_the_work_tree_alone(tmp_path, capsys):
    import subprocess

    root = write_project(tmp_path / "repo", BASE)
    git = ["git", "-C", str(root), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (root / "tables/t.sql").write_text("select id, v, ts, region from {{ source('raw') }} where id > 5\n")
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    assert main(["diff", "--base-ref", "HEAD", "--project-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "~ table.t  modified non-breaking" in out and "+select id, v, ts, region from `raw` where id > 5" in out
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == status
    assert main(["diff", "--base-ref", "no-such-branch", "--project-dir", str(root)]) == 2
    assert "git knows no commit 'no-such-branch'" in capsys.readouterr().err


def test_metadata_only_changes_touch_nothing_downstream_and_target_changes_count(tmp_path):
    d = diff_after(tmp_path, {"tables/t.yml": with_table_yml(description="new words")})
    assert step(d, "table.t").cls == "metadata-only"
    assert step(d, "table.down").status == "unchanged" and d.counts()["indirect"] == 0
    base = compile_project(write_project(tmp_path / "l1", BASE)).plan
    head = compile_project(write_project(tmp_path / "l2", {**BASE, "pipe_project.yml": "name: shop\nlake: /data/elsewhere\n"})).plan
    d = diff_plans(base, head)
    assert [c.field for c in d.target_changes] == ["lake"] and d.worst() == "rewrite"


def test_indirect_steps_name_the_nearest_changed_step(tmp_path):
    d = diff_after(tmp_path, {"sources/s.yml": BASE["sources/s.yml"].replace("path: data/raw", "path: data/raw2")})
    assert step(d, "table.t").upstream_changes == ["source.raw"]
    assert step(d, "table.down").upstream_changes == ["source.raw"]  # through t, which did not change itself


# --- expectations ------------------------------------------------------------------------------------


def diff_expect(tmp_path: Path, before: str | None, after: str | None):
    """The diff of table t whose `expect:` goes from `before` to `after` (flow YAML, None: unset)."""
    base = compile_project(write_project(tmp_path / "base", {**BASE, "tables/t.yml": with_table_yml(expect=before)})).plan
    head = compile_project(write_project(tmp_path / "head", {**BASE, "tables/t.yml": with_table_yml(expect=after)})).plan
    return step(diff_plans(base, head), "table.t")


def expect(**checks: tuple[str, str]) -> str:
    return "{" + ", ".join(f"{n}: {{expression: \"{e}\", action: {a}}}" for n, (e, a) in checks.items()) + "}"


def test_quarantine_to_drop_keeps_the_tables_rows_and_says_the_quarantine_table_stops_receiving(tmp_path):
    s = diff_expect(tmp_path, expect(has_v=("v is not null", "quarantine"), recent=("ts > 1700000000000", "warn")),
                    expect(has_v=("v is not null", "drop"), recent=("ts > 1700000000000", "warn")))
    assert s.cls == "non-breaking"
    (change,) = [c for c in s.changes if c.field == "expect"]
    assert change.why == ("has_v quarantine -> drop: t keeps the same rows; t__quarantine stops receiving the failing rows "
                          "(the rows it holds stay)")
    back = diff_expect(tmp_path / "back", expect(has_v=("v is not null", "drop")), expect(has_v=("v is not null", "quarantine")))
    assert back.cls == "non-breaking" and "the failing rows now also go to t__quarantine" in back.changes[0].why


@pytest.mark.parametrize("before, after, cls, why", [
    (None, expect(has_v=("v is not null", "quarantine")), "breaking",
     "has_v added: failing rows are left out (written to t__quarantine) from the next run on"),
    (expect(has_v=("v is not null", "warn")), expect(has_v=("v is not null", "drop")), "breaking",
     "has_v warn -> drop: failing rows are left out from the next run on"),
    (expect(has_v=("v is not null", "quarantine")), expect(has_v=("v is not null", "fail")), "breaking",
     "has_v quarantine -> fail: failing rows are refused: the write stops from the next run on"),
    (expect(has_v=("v is not null", "drop")), expect(has_v=("v <> ''", "drop")), "breaking",
     "has_v changed: failing rows are left out from the next run on"),
    (expect(has_v=("v is not null", "fail")), expect(has_v=("v is not null", "drop")), "non-breaking",
     "has_v fail -> drop: failing rows are left out"),
    (expect(has_v=("v is not null", "drop")), expect(has_v=("v is not null", "warn")), "non-breaking",
     "has_v drop -> warn: failing rows are counted and kept"),
    (expect(has_v=("v is not null", "quarantine")), None, "non-breaking", "has_v removed: its failing rows are kept"),
])
def test_each_expectation_change_says_what_it_does_to_the_rows(tmp_path, before, after, cls, why):
    s = diff_expect(tmp_path, before, after)
    assert s.cls == cls
    assert [(c.field, c.cls, c.why) for c in s.changes] == [("expect", cls, why)]
