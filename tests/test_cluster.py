"""pipe on a real Spark standalone cluster (a Master and two Workers of 1 core, started by the
`spark_cluster` fixture), whose executors' Python has pyspark[sql] and pipe's task dependencies
but not pipe: pipe ships its own code, checks the executors' Python before writing, and reports
a failure inside an executor in one line. Each `pipe` command runs as a user runs it: a
subprocess with its own Spark driver (client mode)."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cluster import env as cluster_env
from tests.test_example_project import NEW_ORDERS, _pipe, _results

pytestmark = pytest.mark.cluster

TABLES = ("orders", "customers", "customer_revenue")
# what differs between two writers of the same rows: when and into which file they were written
_RUN_COLUMNS = {"_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_file_name"}


def _targets(cluster, python: Path) -> str:
    conf = {
        "spark.pyspark.python": str(python),
        "spark.executor.memory": "1g",
        "spark.cores.max": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": "4",
    }
    lines = ["targets:", "  cluster:", "    spark:", f'      master: "{cluster.master_url}"', "      conf:"]
    lines += [f'        {k}: "{v}"' for k, v in conf.items()]
    lines += ["  local2:", "    spark:", '      master: "local[2]"', "      conf:", '        spark.sql.shuffle.partitions: "4"']
    return "\n".join(lines) + "\n"


def _shop(home: Path, cluster, python: Path = cluster_env.FULL.python) -> Path:
    """The example project of `pipe init`, with a target `cluster` (the test cluster, executors
    running `python`) and a target `local2` (local[2])."""
    home.mkdir(parents=True, exist_ok=True)
    _pipe(home, "init", "shop")
    project = home / "shop"
    path = project / "pipe_project.yml"
    text = path.read_text()
    assert "\ntargets:\n" in text
    path.write_text(text.replace("\ntargets:\n", "\n" + _targets(cluster, python), 1))
    return project


def _hudi_table(uri: Path) -> set[tuple]:
    """Every row of a table as hudi-rs reads it, without the columns that say when it was written."""
    from hudi import HudiTableBuilder

    rows: set[tuple] = set()
    for batch in HudiTableBuilder.from_base_uri(str(uri)).build().read():
        d = batch.to_pydict()
        cols = sorted(c for c in d if c not in _RUN_COLUMNS)
        rows |= set(zip(*[d[c] for c in cols]))
    return rows


def _two_runs(project: Path, target: str) -> list[subprocess.CompletedProcess]:
    first = _pipe(project, "run", "--target", target)
    (project / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
    second = _pipe(project, "run", "--target", target)
    return [first, second]


def _completed_commits(table: Path) -> list[str]:
    return sorted(p.name for p in (table / ".hoodie").glob("*.commit") if p.is_file())


@pytest.fixture(scope="module")
def shop_on_both(spark_cluster, tmp_path_factory):
    """The example project run twice on the cluster and twice on local[2]; then, on the cluster
    project, a third run with a damaged file among the new input."""
    home = tmp_path_factory.mktemp("cluster-shop")
    on_cluster = _shop(home / "cluster", spark_cluster)
    on_local = _shop(home / "local", spark_cluster)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the local runs beside the cluster's: less waiting
        local = pool.submit(_two_runs, on_local, "local2")
        cluster_runs = _two_runs(on_cluster, "cluster")
        local_runs = local.result()
    cluster_results = _results(on_cluster)
    commits_before = _completed_commits(on_cluster / "lake/orders")
    rows_before = _hudi_table(on_cluster / "lake/orders")
    (on_cluster / "data/orders/orders-0004.json.gz").write_bytes(gzip.compress(b'{"order_id": 9}\n')[:12])  # cut short
    damaged = _pipe(on_cluster, "run", "--target", "cluster", check=False)
    return dict(cluster=on_cluster, local=on_local, cluster_runs=cluster_runs, local_runs=local_runs,
                cluster_results=cluster_results, commits_before=commits_before, rows_before=rows_before, damaged=damaged)


def test_the_executors_python_does_not_have_pipe(spark_cluster):
    """The premise of every test here: whatever of pipe runs on the executors, pipe shipped."""
    done = subprocess.run([str(cluster_env.FULL.python), "-c", "import runtime"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd="/")
    assert done.returncode != 0 and "No module named 'runtime'" in done.stderr


def test_the_example_project_on_a_cluster_equals_it_on_local(shop_on_both):
    for proc in shop_on_both["cluster_runs"]:
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        # the tasks ran in the executors' own Python (which has no pipe), with pipe's code shipped
        assert f"executors' Python: {cluster_env.FULL.python} (Python 3." in proc.stderr, proc.stderr
        assert "pipe's code shipped as pipe-" in proc.stderr
    results = shop_on_both["cluster_results"]
    assert results["table.orders"]["state"] == "success"
    assert (results["table.orders"]["inserts"], results["table.orders"]["updates"], results["table.orders"]["deletes"]) == (1, 1, 2)
    for table in TABLES:
        on_cluster = _hudi_table(shop_on_both["cluster"] / "lake" / table)
        on_local = _hudi_table(shop_on_both["local"] / "lake" / table)
        assert on_cluster and on_cluster == on_local, table
        assert len(_completed_commits(shop_on_both["cluster"] / "lake" / table)) == len(_completed_commits(shop_on_both["local"] / "lake" / table))


def test_a_damaged_file_read_on_an_executor_is_one_line_naming_table_and_file(shop_on_both):
    proc = shop_on_both["damaged"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "\tat org.apache." not in text and "Lost task" not in text, text
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error in")]
    assert errors == ["error in table.orders: source raw_orders: cannot read the json files "
                      "(data/orders/orders-0004.json.gz: EOFError: Compressed file ended before the end-of-stream marker was reached)"], proc.stderr
    assert "tables/orders.sql" not in text  # not the SQL's fault
    # nothing written: the same commits and rows as before the run
    orders = shop_on_both["cluster"] / "lake/orders"
    assert _completed_commits(orders) == shop_on_both["commits_before"]
    assert _hudi_table(orders) == shop_on_both["rows_before"]


def test_executors_whose_python_lacks_a_package_are_refused_before_anything_is_written(spark_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPE_CACHE_DIR", str(cluster_env.HOME / "pipe-cache"))  # the packed environment, built once
    project = _shop(tmp_path, spark_cluster, python=cluster_env.NO_FASTAVRO.python)
    proc = _pipe(project, "run", "--target", "cluster", check=False)
    assert proc.returncode == 1
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error in")]
    assert errors == [f"error in table.customers, table.orders: the executors' Python cannot run pipe's tasks: "
                      f"{cluster_env.NO_FASTAVRO.python} (Python 3.{os.sys.version_info[1]}.{os.sys.version_info[2]} on "
                      f"{os.uname().nodename}) lacks fastavro (pipe's tasks need fastavro>=1.9)"], proc.stderr
    assert "hint: give the executors a Python that has them" in proc.stderr and "spark.archives" in proc.stderr
    assert not (project / "lake").exists() or not any((project / "lake").iterdir())
    assert _results(project)["table.customer_revenue"]["state"] == "skipped"

    # the fix is one setting in the target: the environment `pipe pack-env` packs, shipped by Spark
    packed = _pipe(project, "pack-env")
    settings = dict(re.findall(r'^  (spark\.[\w.]+): "(.+)"$', packed.stdout, re.M))
    assert settings["spark.pyspark.python"] == "./pipe_env/bin/python" and settings["spark.archives"].endswith(".tar.gz#pipe_env")
    config = project / "pipe_project.yml"
    config.write_text(config.read_text().replace(f'"{cluster_env.NO_FASTAVRO.python}"', f'"{settings["spark.pyspark.python"]}"')
                      .replace('        spark.cores.max:', f'        spark.archives: "{settings["spark.archives"]}"\n        spark.cores.max:'))
    fixed = _pipe(project, "run", "--target", "cluster")
    assert "executors' Python: ./pipe_env/bin/python (Python 3." in fixed.stderr, fixed.stderr
    assert {s: r["state"] for s, r in _results(project).items() if s.startswith("table.")} == {
        "table.orders": "success", "table.customers": "success", "table.customer_revenue": "success"}
