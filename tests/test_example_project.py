"""The example project end to end, as the README runs it: `pipe init`, `pipe run`, new input,
`pipe run` again. Each command runs as a user runs it (a subprocess with its own Spark); the
tables are then read with pipe's reader and with hudi-rs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

NEW_ORDERS = [
    # a late, stale version of order 1 (older than the stored "shipped" one): ignored
    {"order_id": 1, "customer_id": 101, "amount": 99.0, "status": "placed", "region": "eu", "updated_at": "2024-03-01T10:00:00Z"},
    {"order_id": 3, "customer_id": 101, "amount": 12.0, "status": "cancelled", "region": "eu", "updated_at": "2024-03-03T08:00:00Z"},
    {"order_id": 5, "customer_id": 104, "amount": 7.75, "status": "placed", "region": "us", "updated_at": "2024-03-03T09:00:00Z"},
    {"order_id": 8, "customer_id": 104, "amount": 30.0, "status": "placed", "region": "us", "updated_at": "2024-03-03T10:00:00Z"},
    # the only APAC order is cancelled: partition region=APAC is left without rows
    {"order_id": 4, "customer_id": 103, "amount": 240.0, "status": "cancelled", "region": "apac", "updated_at": "2024-03-03T11:00:00Z"},
]


def _pipe(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PIPE_FAULT", None)
    proc = subprocess.run([sys.executable, "-m", "pipe", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"pipe {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _results(project: Path) -> dict[str, dict]:
    data = json.loads((project / "target/run_results.json").read_text())
    return {s["id"]: s for s in data["steps"]}


def _rows(spark, uri: str, columns: list[str]) -> set[tuple]:
    from runtime.table.table import Table

    return {tuple(r[c] for c in columns) for r in Table.open(spark, uri).read(meta=False).collect()}


def _hudi_rows(uri: str, columns: list[str]) -> set[tuple]:
    from hudi import HudiTableBuilder

    batches = HudiTableBuilder.from_base_uri(uri).build().read()
    out = set()
    for b in batches:
        d = b.to_pydict()
        out |= set(zip(*[d[c] for c in columns]))
    return out


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """The example project after `pipe init` and two runs; the outputs of each step."""
    home = tmp_path_factory.mktemp("example")
    _pipe(home, "init", "shop")
    project = home / "shop"
    first = _pipe(project, "run")
    first_results = _results(project)
    show = _pipe(project, "show", "orders")
    (project / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
    second = _pipe(project, "run")
    second_results = _results(project)
    third = _pipe(project, "build")  # no new input: the tables write nothing; their tests run on the whole tables
    third_results = _results(project)
    timeline = [json.loads(l) for l in _pipe(project, "timeline", "orders", "--output", "json").stdout.splitlines()]
    return dict(project=project, first=first, first_results=first_results, show=show, second=second,
                second_results=second_results, third=third, third_results=third_results, timeline=timeline)


def test_first_run_builds_every_table(shop):
    r = shop["first_results"]
    assert {k: v["state"] for k, v in r.items()} == {
        "source.raw_orders": "success", "source.raw_customers": "success",
        "table.orders": "success", "table.customers": "success", "table.customer_revenue": "success",
        "table.regions": "success"}  # the seed seeds/regions.csv, loaded by `pipe run` too
    assert r["table.regions"]["message"].startswith("first load: 3 rows, replacecommit ")
    assert r["table.orders"]["rows_read"] == 12 and r["table.orders"]["inserts"] == 6
    # the expectation drops the order without a customer (order 9 of orders-0002.json)
    assert r["table.orders"]["expectations"] == {"rows": 12, "has_customer": {"action": "drop", "failed": 1}}
    assert "expectations: has_customer dropped 1" in r["table.orders"]["message"]
    assert r["table.customers"]["rows_read"] == 5
    assert "Traceback" not in shop["first"].stderr
    # `pipe show orders` prints the rows a user expects
    assert "shipped" in shop["show"].stdout and "6 rows of orders" in shop["show"].stdout


def test_second_run_reads_only_the_new_file(shop):
    r = shop["second_results"]
    assert r["table.orders"]["state"] == "success"
    assert r["table.orders"]["rows_read"] == len(NEW_ORDERS)
    assert r["table.orders"]["inputs"]["raw_orders"]["new"] == 1
    # stale order 1 dropped; orders 3 and 4 deleted; order 5 updated; order 8 inserted
    assert (r["table.orders"]["inserts"], r["table.orders"]["updates"], r["table.orders"]["deletes"]) == (1, 1, 2)
    assert r["table.customers"]["state"] == "no_input"
    assert r["table.customer_revenue"]["state"] == "success"  # its upstream orders has a new commit


def test_a_run_without_new_input_writes_nothing(shop):
    assert {v["state"] for k, v in shop["third_results"].items() if k.startswith("table.")} == {"no_input"}
    # `pipe build` ran the example's thirteen data tests on the whole tables and its unit test: all pass
    tests = {k: v for k, v in shop["third_results"].items() if k.startswith("test.")}
    assert len(tests) == 13 and {v["state"] for v in tests.values()} == {"success"}, tests
    assert tests["test.relationships_orders_customer_id"]["message"] == "passed (whole table)"
    assert shop["third_results"]["unit.orders_keep_the_latest_version"]["state"] == "success"
    assert "14 tests passed" in shop["third"].stdout
    commits = [i for i in shop["timeline"] if i["action"] == "commit" and i["state"] == "completed"]
    assert len(commits) == 2  # two runs with input, one commit each; the third wrote nothing
    checkpoint = json.loads(commits[-1]["checkpoints"]["raw_orders"])
    newest = shop["project"] / "data/orders/orders-0003.json"
    assert checkpoint["mtime_ms"] == int(newest.stat().st_mtime * 1000)
    assert "orders-0003.json" in checkpoint["files"]


EXPECTED_ORDERS = {
    (1, 101, 25.5, "shipped", "EU"), (5, 104, 7.75, "placed", "US"),
    (6, 102, 61.0, "placed", "US"), (7, 105, 18.4, "placed", "EU"), (8, 104, 30.0, "placed", "US"),
}
EXPECTED_REVENUE = {(101, 1, 25.5), (102, 1, 61.0), (103, 0, 0.0), (104, 2, 37.75), (105, 1, 18.4)}


def test_tables_hold_exactly_the_expected_rows(shop, spark):
    lake = shop["project"] / "lake"
    cols = ["order_id", "customer_id", "amount", "status", "region"]
    assert _rows(spark, str(lake / "orders"), cols) == EXPECTED_ORDERS
    assert _hudi_rows(str(lake / "orders"), cols) == EXPECTED_ORDERS
    rev = ["customer_id", "orders", "revenue"]
    assert _rows(spark, str(lake / "customer_revenue"), rev) == EXPECTED_REVENUE
    assert _hudi_rows(str(lake / "customer_revenue"), rev) == EXPECTED_REVENUE
    emails = {r[1] for r in _hudi_rows(str(lake / "customers"), ["customer_id", "email"])}
    assert "ada@example.com" in emails and len(emails) == 5
