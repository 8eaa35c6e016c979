"""A team's daily loop (docs/dev-loop.md), as a developer meets it: a project with two targets and
two lakes, production built by its own checkout (its own target/ folder, as on a CI runner), a
developer's checkout building one table with `--defer prod` against production's tables pinned at
an instant, production moving on meanwhile, `pipe retry` after a failure, and the state and result
selectors against a reference run. Rows are checked against a model computed here from the input
files, read back with hudi-rs."""

from __future__ import annotations

import json
import os
import shutil
import time
from decimal import Decimal
from pathlib import Path

import hudi
import pytest

from pipe.cli import main
from runtime.table.table import Table
from tests.conftest import write_project

pytestmark = pytest.mark.spark

NAMES = ["Zoë Ødegaard", "O'Brien & Sons", 'say "hi"', "Ĳsbrand", "plain", "東京商事"]
BASE_MS = 1_733_400_000_000

PROJECT = {
    "pipe_project.yml": """
        name: loop
        default_target: dev
        targets:
          dev:
            lake: {dev_lake}
            spark: {{master: "local[2]", conf: {{spark.sql.shuffle.partitions: 4}}}}
          prod:
            lake: {prod_lake}
            spark: {{master: "local[2]", conf: {{spark.sql.shuffle.partitions: 4}}}}
        """,
    "sources/raw.yml": """
        sources:
          raw_orders:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, line INT, customer STRING, amount DECIMAL(12,2), ts_ms BIGINT, note STRING"
          orders_feed:
            kind: table
            table: orders
        """,
    "tables/orders.yml": """
        tables:
          orders:
            key: [order_id, line]
            precombine: ts_ms
          customer_totals:
            key: [customer]
          order_log:
            key: [order_id, line]
            precombine: ts_ms
          top_customers:
            key: [customer]
        """,
    "tables/orders.sql": "select order_id, line, customer, amount, ts_ms, note from {{ source('raw_orders') }}\n",
    "tables/customer_totals.sql": """
        select customer, count(*) as lines, sum(amount) as total, max(ts_ms) as last_ts
        from {{ ref('orders') }}
        group by customer
        """,
    "tables/order_log.sql": "select order_id, line, customer, amount, ts_ms, note from {{ source('orders_feed') }}\n",
    "tables/top_customers.sql": "select customer, total from {{ ref('customer_totals') }} where total > 100000\n",
}


def _round(n: int) -> list[dict]:
    """Round 1: 1,200 orders of 2 lines; later rounds update 400 of them (a later ts_ms, another
    amount, sometimes another customer) and add 300 new ones."""
    ids = range(1, 1201) if n == 1 else [*range(n * 37, n * 37 + 400), *range(1000 * n + 1, 1000 * n + 301)]
    rows = []
    for i in ids:
        for line in (1, 2):
            cents = (i * 7919 + line * 104729 + n * 31) % 1_000_000
            rows.append({"order_id": i, "line": line, "customer": NAMES[(i + n) % len(NAMES)], "amount": f"{cents // 100}.{cents % 100:02d}",
                         "ts_ms": BASE_MS + n * 1_000_000 + i, "note": None if i % 7 == 0 else f"r{n} «{i}»"})
    return rows


def _write_round(root: Path, n: int) -> None:
    path = root / f"data/orders/round-{n}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # amounts as JSON numbers with their exact digits (a DECIMAL(12,2) column)
    lines = [json.dumps({**r, "amount": "@"}).replace('"@"', r["amount"]) for r in _round(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _orders_after(n: int) -> dict[tuple, dict]:
    model: dict[tuple, dict] = {}
    for k in range(1, n + 1):
        for r in _round(k):
            key = (r["order_id"], r["line"])
            if key not in model or r["ts_ms"] >= model[key]["ts_ms"]:
                model[key] = r
    return model


def _totals_after(n: int) -> list[tuple]:
    out: dict[str, list] = {}
    for r in _orders_after(n).values():
        t = out.setdefault(r["customer"], [0, Decimal(0), 0])
        t[0] += 1
        t[1] += Decimal(r["amount"])
        t[2] = max(t[2], r["ts_ms"])
    return sorted((c, lines, total, last) for c, (lines, total, last) in out.items())


def _hudi(lake: Path, table: str, columns: list[str]) -> list[tuple]:
    t = hudi.HudiTableBuilder.from_base_uri(str(lake / table)).build()
    out = []
    for batch in t.read():
        d = batch.to_pydict()
        out.extend(zip(*[d[c] for c in columns]))
    return sorted(out)


def _pipe(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--project-dir", str(root)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err, captured.out + captured.err
    return code, captured.out, captured.err


def _ok(capsys, root: Path, *args: str) -> str:
    code, out, err = _pipe(capsys, root, *args)
    assert code == 0, f"pipe {' '.join(args)} exited {code}\n{out}\n{err}"
    return out + err


def _results(root: Path) -> dict:
    return json.loads((root / "target/run_results.json").read_text())


def _last_commit_extra(lake: Path, table: str) -> dict[str, str]:
    t = Table.open(None, str(lake / table))
    tl = t.timeline()
    return tl.commit_metadata(tl.latest_completed()).extra


def _record(lake: Path) -> dict:
    return json.loads((lake / ".pipe-last-success.json").read_text())


@pytest.fixture
def checkouts(tmp_path):
    """Production's checkout and a developer's: the same project files, each its own target/."""
    lakes = {"dev_lake": str(tmp_path / "devlake"), "prod_lake": str(tmp_path / "prodlake")}
    files = {k: v.format(**lakes) if k == "pipe_project.yml" else v for k, v in PROJECT.items()}
    return write_project(tmp_path / "prod-checkout", files), write_project(tmp_path / "dev-checkout", files), tmp_path


def test_defer_reads_prod_pinned_and_a_rerun_or_retry_reads_the_same_rows(spark, checkouts, capsys):
    prod, dev, tmp = checkouts
    prod_lake, dev_lake = tmp / "prodlake", tmp / "devlake"
    totals = ["customer", "lines", "total", "last_ts"]
    order_cols = ["order_id", "line", "customer", "amount", "ts_ms", "note"]

    for n in (1, 2):
        _write_round(prod, n)
        _ok(capsys, prod, "run", "--target", "prod", "-q")
    run2 = _record(prod_lake)
    assert run2["target"] == "prod" and set(run2["written"]) == {"orders", "customer_totals", "order_log", "top_customers"}

    # a developer builds the two downstream tables against prod, which it does not copy
    out = _ok(capsys, dev, "run", "--defer", "prod", "--select", "customer_totals", "order_log")
    pinned = run2["written"]["orders"]
    assert f"deferring to prod: orders at {pinned} (prod's latest successful run" in out
    assert not (dev_lake / "orders").exists()
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(2)
    model2 = sorted(tuple(r[c] if c != "amount" else Decimal(r[c]) for c in order_cols) for r in _orders_after(2).values())
    assert _hudi(dev_lake, "order_log", order_cols) == model2
    results = _results(dev)
    assert results["defer"]["target"] == "prod" and results["defer"]["tables"] == {"orders": {"instant": pinned, "cut": pinned}}
    step = {s["id"]: s for s in results["steps"]}["table.customer_totals"]
    assert step["inputs"]["orders"] == {"instant": pinned, "checkpoint": pinned, "deferred": "prod"}
    assert "orders of prod at " + pinned in step["read"]
    extra = _last_commit_extra(dev_lake, "customer_totals")
    assert extra["pipe.checkpoint.orders"] == pinned and extra["pipe.deferred.orders"] == "prod"
    assert _last_commit_extra(dev_lake, "order_log")["pipe.deferred.orders_feed"] == "prod"

    # prod moves on: a successful run 3, then a run 4 that commits orders and fails after it
    _write_round(prod, 3)
    _ok(capsys, prod, "run", "--target", "prod", "-q")
    run3 = _record(prod_lake)
    (prod / "tables/customer_totals.sql").write_text("select customer, cast(customer as bigint) as lines, sum(amount) as total, "
                                                     "max(ts_ms) as last_ts from {{ ref('orders') }} group by customer\n")
    _write_round(prod, 4)
    code, _, _ = _pipe(capsys, prod, "run", "--target", "prod", "-q")
    assert code == 1 and _record(prod_lake) == run3  # a failed run is no pin

    # the same command again reads prod's latest successful run (3), not the commit of the failed run 4
    out = _ok(capsys, dev, "run", "--defer", "prod", "--select", "customer_totals", "order_log")
    assert f"orders at {run3['written']['orders']}" in out
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(3)
    model3 = sorted(tuple(r[c] if c != "amount" else Decimal(r[c]) for c in order_cols) for r in _orders_after(3).values())
    assert _hudi(dev_lake, "order_log", order_cols) == model3  # read incrementally from pin 2 to pin 3
    # pinned at run 2's end, a rerun reads run 2's rows again
    out = _ok(capsys, dev, "run", "--defer", "prod", "--defer-as-of", run2["finished"], "--select", "customer_totals")
    assert f"orders at {pinned}" in out and "each table's latest commit by" in out
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(2)
    # `latest` takes the failed run's commit of orders too
    out = _ok(capsys, dev, "run", "--defer", "prod", "--defer-as-of", "latest", "--select", "customer_totals")
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(4)

    # a dev change fails at run time in the middle of the DAG; fixed, `pipe retry` runs it and what
    # it skipped, with the failed run's pins, although prod moved on in between
    good_sql = (dev / "tables/customer_totals.sql").read_text()
    (dev / "tables/customer_totals.sql").write_text((prod / "tables/customer_totals.sql").read_text())
    code, out, err = _pipe(capsys, dev, "run", "--defer", "prod", "--defer-as-of", run3["finished"], "--select", "customer_totals+", "order_log")
    assert code == 1 and "CAST_INVALID_INPUT" in out + err
    failed = {s["id"]: s["state"] for s in _results(dev)["steps"]}
    assert failed == {"table.customer_totals": "error", "table.top_customers": "skipped",
                      "table.order_log": "no_input"}  # order_log read up to run 3 before
    (prod / "tables/customer_totals.sql").write_text(good_sql)
    _ok(capsys, prod, "run", "--target", "prod", "-q")  # prod's run 5 succeeds
    assert _record(prod_lake)["finished"] > run3["finished"]
    (dev / "tables/customer_totals.sql").write_text(good_sql)
    out = _ok(capsys, dev, "retry")
    assert f"orders at {run3['written']['orders']}" in out
    retried = _results(dev)
    assert [(s["id"], s["state"]) for s in retried["steps"]] == [("table.customer_totals", "success"), ("table.top_customers", "success")]
    assert retried["args"]["retry_of"]
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(3)
    assert _hudi(dev_lake, "top_customers", ["customer", "total"]) == [(c, t) for c, _, t, _ in _totals_after(3) if t > 100000]
    assert "nothing to retry" in _ok(capsys, dev, "retry")

    # building orders in dev too: customer_totals now reads dev's orders, and is rebuilt from them
    shutil.copytree(prod / "data", dev / "data")
    (dev / "data/orders/round-4.json").unlink()
    (dev / "data/orders/round-3.json").unlink()
    out = _ok(capsys, dev, "run", "--select", "orders", "customer_totals")
    assert "rebuilt (its input orders from target dev's lake, before from prod)" in out
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(2)
    assert "pipe.deferred.orders" not in _last_commit_extra(dev_lake, "customer_totals")


def test_defer_mistakes_are_refused_before_anything_runs(spark, checkouts, capsys):
    prod, dev, tmp = checkouts
    for args, text, exit_code in [
        (("--defer", "stage"), "unknown target 'stage'", 2),
        (("--defer", "dev"), "--defer dev names the target this run builds", 2),
        (("--defer-as-of", "latest"), "--defer-as-of pins what --defer reads; it needs --defer TARGET", 2),
        (("--defer", "prod", "--defer-as-of", "yesterday"), "--defer-as-of 'yesterday' is neither an instant time nor a date", 2),
        (("--defer", "prod"), "table orders is read by this run but not built, and there is no table orders in prod's lake", 1),
    ]:
        code, out, err = _pipe(capsys, dev, "run", "--select", "customer_totals", *args)
        assert code == exit_code and text in out + err, (args, out, err)
    assert not (tmp / "devlake").exists()
    _write_round(prod, 1)
    _ok(capsys, prod, "run", "--target", "prod", "--select", "orders", "-q")
    code, out, err = _pipe(capsys, dev, "run", "--select", "customer_totals", "--defer", "prod", "--defer-as-of", "2001-01-01")
    assert code == 1 and "table orders has no completed commit by 2001-01-01 23:59:59 UTC in prod's lake" in out + err
    assert not (tmp / "devlake" / "customer_totals").exists()


def test_state_and_result_selectors_against_a_reference_run(checkouts, capsys):
    _, dev, tmp = checkouts
    _ok(capsys, dev, "compile")
    reference = tmp / "reference"
    reference.mkdir()
    shutil.copy(dev / "target/plan.json", reference / "plan.json")

    def ls(*selectors: str) -> list[str]:
        code, out, err = _pipe(capsys, dev, "ls", "--state", str(reference), "--select", *selectors)
        assert code == 0, err
        return out.split()

    assert ls("state:modified") == [] and ls("state:new") == []
    (dev / "tables/customer_totals.sql").write_text("select customer, count(*) as lines, sum(amount) as total, max(ts_ms) as last_ts, "
                                                    "min(ts_ms) as first_ts from {{ ref('orders') }} group by customer\n")
    yml = dev / "tables/orders.yml"
    yml.write_text(yml.read_text().replace("  order_log:\n", "  order_log:\n    clean: {retain: 5}\n"))
    src = dev / "sources/raw.yml"
    src.write_text(src.read_text().replace("note STRING", "note STRING, channel STRING"))
    (dev / "tables/returns.sql").write_text("select order_id, line from {{ ref('orders') }} where amount < 0\n")
    (dev / "tables/returns.yml").write_text("tables:\n  returns:\n    key: [order_id, line]\n    columns:\n      - name: order_id\n"
                                            "        tests: [not_null]\n")
    assert ls("state:new") == ["table.returns", "test.not_null_returns_order_id"]
    assert ls("state:modified.body") == ["table.customer_totals", "table.returns", "test.not_null_returns_order_id"]
    assert ls("state:modified.configs") == ["table.order_log", "table.returns", "test.not_null_returns_order_id"]
    assert ls("state:modified.contract") == ["source.raw_orders", "table.returns", "test.not_null_returns_order_id"]
    assert ls("state:modified.tests") == ["table.returns", "test.not_null_returns_order_id"]
    assert ls("state:modified+") == ["source.raw_orders", "table.orders", "source.orders_feed", "table.customer_totals",
                                     "table.order_log", "table.returns", "table.top_customers", "test.not_null_returns_order_id"]
    assert ls("state:modified,table:orders") == []  # an empty intersection is an answer, not a mistake
    assert ls("state:modified.configs", "state:modified.body") == ["table.customer_totals", "table.order_log", "table.returns",
                                                                   "test.not_null_returns_order_id"]

    # result: selectors read the reference's run_results.json
    (reference / "run_results.json").write_text(json.dumps({"steps": [
        {"id": "table.orders", "kind": "write", "state": "success"},
        {"id": "table.customer_totals", "kind": "write", "state": "error"},
        {"id": "table.order_log", "kind": "write", "state": "skipped"},
        {"id": "test.not_null_returns_order_id", "kind": "test", "state": "error", "failures": 3},
        {"id": "test.gone", "kind": "test", "state": "error", "failures": 1}]}))
    assert ls("result:error") == ["table.customer_totals"]  # a test that found failing rows is `fail`, not `error`
    assert ls("result:fail") == ["test.not_null_returns_order_id"]  # a step gone from the project is not selected
    assert ls("result:error+", "result:skipped") == ["table.customer_totals", "table.order_log", "table.top_customers"]
    assert ls("result:warn") == []

    for args, text in [
        (("--select", "state:modified"), "'state:modified' compares with a reference run: it needs --state DIR"),
        (("--state", str(reference), "--select", "state:changed"), "unknown state selector 'state:changed'"),
        (("--state", str(reference), "--select", "result:failed"), "unknown result 'failed' in 'result:failed'"),
        (("--state", str(tmp / "nowhere"), "--select", "state:new"), "no such folder"),
    ]:
        code, out, err = _pipe(capsys, dev, "ls", *args)
        assert code == 2 and text in out + err, (args, out, err)
    code, out, err = _pipe(capsys, dev, "retry")
    assert code == 2 and "no run to retry" in out + err


def test_empty_and_sample_builds_consume_nothing_and_the_next_real_run_rebuilds(spark, checkouts, capsys):
    prod, dev, tmp = checkouts
    prod_lake, dev_lake = tmp / "prodlake", tmp / "devlake"
    totals = ["customer", "lines", "total", "last_ts"]
    _write_round(prod, 1)
    _ok(capsys, prod, "run", "--target", "prod", "-q")

    # --empty: the SQL runs on the real upstream schemas, new tables are created with no rows
    out = _ok(capsys, dev, "run", "--defer", "prod", "--empty", "--select", "customer_totals", "order_log")
    assert out.count("created with no rows (--empty)") == 2
    assert _hudi(dev_lake, "customer_totals", totals) == [] and _hudi(dev_lake, "order_log", ["order_id"]) == []
    commits = len(Table.open(None, str(dev_lake / "customer_totals")).timeline().completed())
    out = _ok(capsys, dev, "run", "--defer", "prod", "--empty", "--select", "customer_totals")
    assert "checked with no rows: its SQL runs and its 4 columns fit the stored table; nothing written" in out
    assert len(Table.open(None, str(dev_lake / "customer_totals")).timeline().completed()) == commits
    assert not (dev_lake / ".pipe-last-success.json").exists()  # a dev run that built no real table is no pin
    # a SQL change whose column no longer fits is caught without a row
    sql = dev / "tables/customer_totals.sql"
    good = sql.read_text()
    sql.write_text(good.replace("count(*) as lines", "cast(count(*) as string) as lines"))
    code, out, err = _pipe(capsys, dev, "run", "--defer", "prod", "--empty", "--select", "customer_totals")
    assert code == 1 and "column 'lines' is bigint in the table but string in the input" in out + err
    sql.write_text(good)

    # --sample 'N rows': each input gives N rows; the commit consumes nothing
    out = _ok(capsys, dev, "run", "--defer", "prod", "--sample", "7 rows", "--select", "customer_totals", "order_log")
    assert out.count("built from a sample (7 rows)") == 2
    assert sum(r[1] for r in _hudi(dev_lake, "customer_totals", totals)) == 7
    assert len(_hudi(dev_lake, "order_log", ["order_id"])) == 7
    extra = _last_commit_extra(dev_lake, "order_log")
    assert extra["pipe.sample"] == "7 rows" and not any(k.startswith("pipe.checkpoint.") for k in extra)
    _ok(capsys, dev, "run", "--defer", "prod", "--sample", "3 rows per partition", "--select", "customer_totals")
    assert sum(r[1] for r in _hudi(dev_lake, "customer_totals", totals)) == 3  # orders has one partition

    # the next real run rebuilds each sampled table from all of its input
    out = _ok(capsys, dev, "run", "--defer", "prod", "--select", "customer_totals", "order_log")
    assert out.count("rebuilt (its last build was a --sample") == 2
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(1)
    assert len(_hudi(dev_lake, "order_log", ["order_id"])) == len(_orders_after(1))

    # --sample 'N days' on a files source: only the files that arrived since
    _write_round(dev, 1)
    _write_round(dev, 2)
    old = time.time() - 5 * 86400
    os.utime(dev / "data/orders/round-1.json", (old, old))
    out = _ok(capsys, dev, "run", "--sample", "2 days", "--select", "orders")
    assert "built from a sample (2 days)" in out
    assert len(_hudi(dev_lake, "orders", ["order_id"])) == len(_round(2))
    code, out, err = _pipe(capsys, dev, "run", "--sample", "2 weeks")
    assert code == 2 and "--sample '2 weeks' is not a sample" in out + err


def test_defer_on_hudi_1x_pins_the_printed_instant_and_refuses_a_version_the_cleaner_removed(spark, checkouts, capsys):
    prod, dev, tmp = checkouts
    prod_lake, dev_lake = tmp / "prodlake", tmp / "devlake"
    totals = ["customer", "lines", "total", "last_ts"]
    for root in (prod, dev):  # orders: Hudi 1.x (timeline layout 2: pins by completion time), one version kept
        yml = root / "tables/orders.yml"
        yml.write_text(yml.read_text().replace("    precombine: ts_ms\n  customer_totals:",
                                               "    precombine: ts_ms\n    table_version: 9\n    clean: {retain: 1}\n  customer_totals:"))
    finished = []
    for n in (1, 2, 3):
        _write_round(prod, n)
        _ok(capsys, prod, "run", "--target", "prod", "-q", "--select", "orders")
        finished.append(_record(prod_lake))
    assert Table.open(None, str(prod_lake / "orders")).config.table_version == 9
    latest = finished[-1]["written"]["orders"]
    out = _ok(capsys, dev, "run", "--defer", "prod", "--select", "customer_totals")
    assert f"orders at {latest}" in out
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(3)
    # the instant printed, given back, pins the very same commit (not the one completed before it)
    out = _ok(capsys, dev, "run", "--defer", "prod", "--defer-as-of", latest, "--select", "customer_totals")
    assert f"orders at {latest}" in out and "no new input" in out
    # run 1's version of orders: its files were cleaned (retain 1), so it is refused, not read short
    code, out, err = _pipe(capsys, dev, "run", "--defer", "prod", "--defer-as-of", finished[0]["finished"], "--select", "customer_totals")
    assert code == 1 and "--defer prod: table orders as of " in out + err and "cannot be read" in out + err, out + err
    assert _hudi(dev_lake, "customer_totals", totals) == _totals_after(3)
