"""target/plan.json: deterministic bytes, a versioned schema, fingerprints and timeline actions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from compiler.api import compile_project
from compiler.plan import SCHEMA_VERSION, Plan, PlanError
from tests.conftest import TEMPLATE

STEP_KEYS = {"id", "kind", "name", "depends_on", "config", "file", "line", "description", "tags", "env_vars", "fingerprint"}
WRITE_KEYS = STEP_KEYS | {"sql", "sql_full_refresh", "sql_file", "action"}


def _compile_in_subprocess(folder, env_extra):
    env = {**os.environ, **env_extra}
    subprocess.run([sys.executable, "-m", "pipe", "compile"], cwd=folder, env=env, check=True, capture_output=True)
    return (folder / "target" / "plan.json").read_bytes()


def test_plan_is_byte_identical_across_folders_and_environments(tmp_path):
    one = tmp_path / "first" / "shop"
    two = tmp_path / "somewhere" / "else" / "entirely" / "shop"
    shutil.copytree(TEMPLATE, one, ignore=shutil.ignore_patterns("target", "lake"))
    shutil.copytree(TEMPLATE, two, ignore=shutil.ignore_patterns("target", "lake"))
    a = _compile_in_subprocess(one, {"PYTHONHASHSEED": "1", "TZ": "UTC", "LANG": "C"})
    b = _compile_in_subprocess(two, {"PYTHONHASHSEED": "987", "TZ": "Asia/Tokyo", "LANG": "de_DE.UTF-8"})
    assert a == b
    # and again in the same folder
    assert _compile_in_subprocess(one, {"PYTHONHASHSEED": "5"}) == a
    text = a.decode()
    assert str(tmp_path) not in text and "first" not in text and "entirely" not in text


def test_plan_schema(tmp_path):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    plan = compile_project(tmp_path / "shop").plan
    data = json.loads(plan.to_json())
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert set(data) == {"schema_version", "project", "target", "vars", "steps"}
    assert data["project"] == "shop"
    assert data["target"] == {"name": "dev", "lake": "lake", "spark": {"master": "local[*]", "conf": {}}, "env_vars": []}
    kinds = {}
    for step in data["steps"]:
        kinds[step["id"]] = step["kind"]
        assert set(step) == {"write": WRITE_KEYS, "test": STEP_KEYS | {"sql", "sql_file"}}.get(step["kind"], STEP_KEYS)
        assert len(step["fingerprint"]) == 64 and int(step["fingerprint"], 16) >= 0
        assert not os.path.isabs(step["file"])
    assert {i: k for i, k in kinds.items() if k != "test"} == {
        "source.raw_orders": "ingest", "source.raw_customers": "ingest",
        "table.orders": "write", "table.customers": "write", "table.customer_revenue": "write",
        "table.regions": "write", "unit.orders_keep_the_latest_version": "unit",  # a seed; a unit test
    }
    # the example's data tests: one step each, after the tables they read
    relationship = next(s for s in data["steps"] if s["id"] == "test.relationships_orders_customer_id")
    assert relationship["depends_on"] == ["table.customers", "table.orders"]
    assert relationship["config"] == {"test": "relationships", "model": "orders", "model_kind": "table", "columns": ["customer_id"],
                                      "to": "customers", "to_kind": "table", "field": "customer_id", "severity": "error",
                                      "warn_if": "!= 0", "error_if": "!= 0"}
    assert relationship["file"] == "tables/orders.yml" and "not exists" in relationship["sql"]
    singular = next(s for s in data["steps"] if s["id"] == "test.revenue_adds_up")
    assert singular["sql_file"] == "tests/revenue_adds_up.sql" and singular["depends_on"] == ["table.customer_revenue", "table.orders"]
    assert sum(1 for k in kinds.values() if k == "test") == 13
    orders = next(s for s in data["steps"] if s["id"] == "table.orders")
    assert orders["action"] == "commit"
    assert orders["config"]["key"] == ["order_id"]
    assert orders["config"]["partition_by"] == ["region"]
    assert orders["config"]["precombine"] == "updated_at"
    assert orders["config"]["delete_when"] == "status = 'cancelled'"
    assert orders["config"]["max_file_size"] == 120 * 1024 * 1024
    assert orders["depends_on"] == ["source.raw_orders"]
    assert orders["file"] == "tables/orders.yml" and orders["line"] == 2
    revenue = next(s for s in data["steps"] if s["id"] == "table.customer_revenue")
    assert revenue["action"] == "replacecommit"
    assert revenue["depends_on"] == ["table.customers", "table.orders"]


def test_plan_round_trips_and_rejects_other_versions(tmp_path):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    plan = compile_project(tmp_path / "shop").plan
    again = Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert list(again.graph().edges) == list(compile_project(tmp_path / "shop").graph.edges)
    newer = json.loads(plan.to_json())
    newer["schema_version"] = 99
    with pytest.raises(PlanError, match="schema version 99.*pipe compile"):
        Plan.from_json(json.dumps(newer))
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_json("{")


@pytest.mark.parametrize(
    "operation, table_type, action",
    [
        ("upsert", "copy_on_write", "commit"),
        ("insert", "copy_on_write", "commit"),
        ("bulk_insert", "copy_on_write", "commit"),
        ("delete", "copy_on_write", "commit"),
        ("upsert", "merge_on_read", "deltacommit"),
        ("bulk_insert", "merge_on_read", "deltacommit"),
        ("delete", "merge_on_read", "deltacommit"),
        ("insert_overwrite", "copy_on_write", "replacecommit"),
        ("insert_overwrite_table", "merge_on_read", "replacecommit"),
        ("delete_partition", "copy_on_write", "replacecommit"),
        ("bootstrap", "copy_on_write", "commit"),
        ("bootstrap", "merge_on_read", "deltacommit"),
    ],
)
def test_each_write_step_records_its_timeline_action(project, operation, table_type, action):
    extra = {
        "delete_partition": "    partition_by: [region]\n    partitions_to_delete: [EU]\n",
        "bootstrap": "    bootstrap: {path: data/existing}\n",
    }.get(operation, "")
    files = {"tables/t.yml": f"tables:\n  t:\n    key: [id]\n    type: {table_type}\n    operation: {operation}\n{extra}"}
    if operation not in ("bootstrap", "delete_partition"):
        files["tables/t.sql"] = "select 1 as id"
    step = compile_project(project(files)).plan.step("table.t")
    assert step.action == action


def test_fingerprint_follows_behaviour_not_descriptions(project, tmp_path):
    root = project({"tables/t.yml": "tables:\n  t:\n    description: first\n", "tables/t.sql": "select 1 as id"})
    base = compile_project(root).plan.step("table.t").fingerprint
    (root / "tables/t.yml").write_text("tables:\n  t:\n    description: changed\n    tags: [x]\n")
    assert compile_project(root).plan.step("table.t").fingerprint == base
    (root / "tables/t.sql").write_text("select 2 as id")
    changed_sql = compile_project(root).plan.step("table.t").fingerprint
    assert changed_sql != base
    (root / "tables/t.yml").write_text("tables:\n  t:\n    partition_by: [id]\n")
    assert compile_project(root).plan.step("table.t").fingerprint not in (base, changed_sql)


def test_a_targets_shared_paths_are_in_its_plan_only_when_set(project):
    files = {"tables/t.sql": "select 1 as id"}
    plain = compile_project(project({"pipe_project.yml": "name: p\n", **files})).plan
    assert "shared_paths" not in plain.to_dict()["target"]  # plans of projects without it stay as they were
    shared = compile_project(project({"pipe_project.yml": "name: p\ntargets:\n  dev:\n    shared_paths: /mnt/nfs/shop\n"
                                                          "    spark: {master: 'spark://m:7077'}\n", **files})).plan
    assert shared.to_dict()["target"]["shared_paths"] == ["/mnt/nfs/shop"]
    assert Plan.from_json(shared.to_json()).target.shared_paths == ("/mnt/nfs/shop",)


def test_the_plans_order_is_networkxs_lexicographical_topological_sort():
    """The compile orders steps with the standard library (compiler.graph.topological_order),
    without importing networkx: on random graphs of every density its order is networkx's."""
    import graphlib
    import random

    import networkx as nx

    from compiler.graph import topological_order

    rng = random.Random(20261125)
    for case in range(300):
        n = rng.randint(1, 60)
        names = [f"{rng.choice(['source', 'table', 'test'])}.{rng.choice('abcxyz')}{i}" for i in range(n)]
        rng.shuffle(names)
        density = rng.choice([0.0, 0.05, 0.2, 0.6])
        rank = {name: i for i, name in enumerate(rng.sample(names, n))}  # edges go up this rank: a DAG
        edges = [(u, v) for u in names for v in names if rank[u] < rank[v] and rng.random() < density]
        graph = nx.DiGraph()
        graph.add_nodes_from(names)
        graph.add_edges_from(edges)
        assert topological_order(names, edges) == list(nx.lexicographical_topological_sort(graph)), case
        if edges:
            u, v = rng.choice(edges)
            with pytest.raises(graphlib.CycleError):
                topological_order(names, edges + [(v, u)])
