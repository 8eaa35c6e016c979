"""`operation: bootstrap`: an existing Parquet dataset (written by Spark, partitioned or not)
becomes a pipe table, read back with pipe's reader and with hudi-rs; the partition selector;
what later runs do; and the errors a user meets, with file:line and no traceback."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.test_run import assert_clean, assert_rows, commits, pipe, project, run_ok, steps, timeline

ROWS = [(i, ["eu", "us", "apac"][i % 3], f"c{i}", i * 10) for i in range(1, 31)]


def legacy_dataset(spark, root, partitioned: bool = True):
    df = spark.createDataFrame([r for r in reversed(ROWS)], "id long, region string, name string, amount long")
    out = root / "data/legacy"
    writer = df.repartition(2).write.mode("overwrite")
    (writer.partitionBy("region") if partitioned else writer).parquet(str(out))
    return out


def tables_yml(totals: bool = True, **bootstrap) -> str:
    settings = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {"path": "data/legacy", **bootstrap}.items())
    text = f"""
        tables:
          legacy:
            operation: bootstrap
            key: [id]
            partition_by: [region]
            bulk_insert_sort_mode: GLOBAL_SORT
            bootstrap: {{{settings}}}
        """
    return text.rstrip(" ") + ("          legacy_totals:\n            key: [region]\n" if totals else "")


TOTALS_SQL = "select region, sum(amount) as amount from {{ ref('legacy') }} group by region\n"
COLS = ["id", "region", "name", "amount"]


def test_bootstrap_a_partitioned_dataset_with_a_partition_selector(spark, tmp_path, capsys):
    root = project(tmp_path, {"tables/legacy.yml": tables_yml(partition_regex="region=(eu|us)"), "tables/legacy_totals.sql": TOTALS_SQL})
    legacy_dataset(spark, root)
    code, out, err = pipe(capsys, root, "run", "--dry-run")
    assert code == 0, err
    assert "bootstrap of 4 Parquet file(s)" in steps(root)["table.legacy"]["message"]
    assert "2 partition(s)" in steps(root)["table.legacy"]["message"]
    assert "1 partition(s) left out by partition_regex" in steps(root)["table.legacy"]["message"]

    run_ok(capsys, root)
    picked = [r for r in ROWS if r[1] in ("eu", "us")]
    assert_rows(spark, root, "legacy", COLS, picked)
    assert_rows(spark, root, "legacy_totals", ["region", "amount"],
                [(g, sum(r[3] for r in picked if r[1] == g)) for g in ("eu", "us")])
    step = steps(root)["table.legacy"]
    assert step["operation"] == "bootstrap" and step["inserts"] == len(picked)
    [commit] = commits(timeline(capsys, root, "legacy"))
    assert commit["operation"] == "BOOTSTRAP" and commit["action"] == "commit"
    hoodie = root / "lake/legacy/.hoodie"
    meta = json.loads((hoodie / f"{commit['instant']}.commit").read_text())
    assert meta["extraMetadata"]["pipe.bootstrap.partitions"] == "2"
    assert sorted(meta["partitionToWriteStats"]) == ["region=eu", "region=us"]
    # GLOBAL_SORT, as bulk_insert: each file holds its keys in order
    for f in (root / "lake/legacy").rglob("*.parquet"):
        keys = pq.read_table(f, columns=["_hoodie_record_key"]).column(0).to_pylist()
        assert keys == sorted(keys) and keys
    assert (root / "data/legacy/region=apac").is_dir()  # the dataset is left as it was

    # bootstrapped once: the next run writes nothing
    run_ok(capsys, root)
    assert steps(root)["table.legacy"]["state"] == "no_input"
    assert "bootstrapped already" in steps(root)["table.legacy"]["message"]
    assert "--full-refresh" in steps(root)["table.legacy"]["message"]

    # all partitions now, rebuilt with --full-refresh: one replacecommit
    (root / "tables/legacy.yml").write_text(tables_yml(), encoding="utf-8")  # (with legacy_totals)
    run_ok(capsys, root, "--select", "legacy", "--full-refresh")
    assert_rows(spark, root, "legacy", COLS, ROWS)
    assert [c["action"] for c in commits(timeline(capsys, root, "legacy"))] == ["commit", "replacecommit"]


def test_bootstrap_a_dataset_without_partitions(spark, tmp_path, capsys):
    root = project(tmp_path, {"tables/legacy.yml": """
        tables:
          legacy:
            operation: bootstrap
            bootstrap: {path: data/legacy}
        """})
    legacy_dataset(spark, root, partitioned=False)
    (root / "data/legacy/_SUCCESS").write_text("")
    run_ok(capsys, root)
    assert_rows(spark, root, "legacy", COLS, ROWS)
    assert [p.parent.name for p in (root / "lake/legacy").glob("*.parquet")]  # files at the table's top


def test_bootstrap_errors_say_where_and_what_to_do(spark, tmp_path, capsys):
    root = project(tmp_path, {"tables/legacy.yml": tables_yml(totals=False, partition_regex="region=emea")})
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert_clean(out, err)
    assert "tables/legacy.yml:2: table legacy" in err and "holds no Parquet files" in err
    assert not (root / "lake/legacy").exists()

    legacy_dataset(spark, root)
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert "partition_regex 'region=emea' matches none of the 3 partitions" in err and "region=apac" in err
    assert not (root / "lake/legacy/.hoodie").exists() or not commits(timeline(capsys, root, "legacy"))

    (root / "tables/legacy.yml").write_text(tables_yml(totals=False).replace("key: [id]", "key: [order_id]"), encoding="utf-8")
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert "names column(s) order_id" in err and "its columns: id, name, amount, region" in err

    (root / "tables/legacy.yml").write_text(tables_yml(totals=False, mode="metadata_only"), encoding="utf-8")
    code, out, err = pipe(capsys, root, "compile")
    assert code == 2
    assert "tables/legacy.yml:8" in err and "metadata_only bootstrap is not supported" in err and "full_record" in err
