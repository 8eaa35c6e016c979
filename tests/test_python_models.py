"""Python models (`tables/<name>.py`) as a user meets them: compiled from their text without
running them, run on the shared SparkSession through the same write path as SQL tables
(upsert with precombine, incremental inputs round after round, `this`), their edits seen by
`pipe diff`, and their mistakes reported at the file's line without a traceback."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from compiler import compile_project
from compiler.diff import diff_plans
from tests.conftest import compile_errors
from tests.test_run import assert_clean, commits, assert_rows, pipe, project, run_ok, steps, write_jsonl

SOURCES = """
    sources:
      raw_orders:
        kind: files
        path: data/orders
        format: json
        schema: "order_id BIGINT, line INT, customer STRING, amount DECIMAL(12,2), updated_ms BIGINT, note STRING"
      raw_customers:
        kind: files
        path: data/customers
        format: json
        schema: "customer STRING, country STRING"
    """

ORDERS_YML = """
    tables:
      customers:
        key: [customer]
      orders:
        key: [order_id, line]
        precombine: updated_ms
        partition_by: [country]
    """

# a join, a UDF (which the executors get by value), and a filter on the incremental input
ORDERS_PY = '''
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from pipe.model import ref, source


def _initial(name):
    return None if name is None else name[:1].upper()


initial = F.udf(_initial, StringType())


def model(orders=source("raw_orders"), customers=ref("customers"), spark=None):
    joined = orders.join(customers, "customer", "left")
    return (joined
            .withColumn("country", F.coalesce(F.col("country"), F.lit("??")))
            .withColumn("initial", initial(F.col("customer")))
            .where(F.col("amount").isNotNull()))
'''

TOTALS_PY = '''
from pyspark.sql import functions as F
from pipe.model import ref


def model(orders=ref("orders"), this=None):
    totals = orders.where(F.col("customer").isNotNull()).groupBy("customer").agg(F.sum("amount").alias("amount"), F.count("*").alias("lines"))
    if this is not None:  # a full rebuild each time; `this` is what the table held before
        totals = totals.withColumn("was", F.lit(this.count()))
    else:
        totals = totals.withColumn("was", F.lit(-1).cast("bigint"))
    return totals
'''

TOTALS_YML = """
    tables:
      totals:
        key: [customer]
        operation: insert_overwrite_table
    """

CUSTOMERS = [{"customer": "Zoë", "country": "FR"}, {"customer": "O'Brien", "country": "IE"}, {"customer": "Łukasz", "country": "PL"}]


def _files():
    return {"sources/raw.yml": SOURCES, "tables/orders.yml": ORDERS_YML, "tables/orders.py": ORDERS_PY,
            "tables/customers.sql": "select customer, country from {{ source('raw_customers') }}",
            "tables/totals.yml": TOTALS_YML, "tables/totals.py": TOTALS_PY}


def _orders(round_: int, n: int = 1500) -> list[dict]:
    """Round `round_`: new order ids, plus updates of the previous round's first 100 (later
    updated_ms wins) and one stale update (older updated_ms, ignored)."""
    base = 1_700_000_000_000 + round_ * 3_600_000
    rows = [{"order_id": round_ * 100_000 + i, "line": i % 3, "customer": [c["customer"] for c in CUSTOMERS][i % 3] if i % 7 else None,
             "amount": f"{(i * 37) % 1000}.{i % 100:02d}", "updated_ms": base + i, "note": 'says "hi", ça va' if i % 11 == 0 else None}
            for i in range(n)]
    if round_ > 1:
        rows += [{"order_id": (round_ - 1) * 100_000 + i, "line": i % 3, "customer": "Zoë", "amount": "1.00",
                  "updated_ms": base + 10 * n + i, "note": "updated"} for i in range(100)]
        rows.append({"order_id": (round_ - 1) * 100_000 + 500, "line": 500 % 3, "customer": "Zoë", "amount": "999.99",
                     "updated_ms": 1, "note": "stale"})
    return rows


def _expected(all_rounds: list[list[dict]]) -> dict[tuple, dict]:
    countries = {c["customer"]: c["country"] for c in CUSTOMERS}
    latest: dict[tuple, dict] = {}
    for rows in all_rounds:
        for r in rows:
            k = (r["order_id"], r["line"])
            if k not in latest or r["updated_ms"] >= latest[k]["updated_ms"]:
                latest[k] = r
    return {k: {**r, "country": countries.get(r["customer"], "??")} for k, r in latest.items()}


def test_a_python_model_upserts_round_after_round_and_feeds_a_python_rebuild(spark, tmp_path, capsys):
    root = project(tmp_path, _files())
    write_jsonl(root / "data/customers/c.json", CUSTOMERS)
    rounds = []
    for round_ in range(1, 4):
        rows = _orders(round_)
        rounds.append(rows)
        write_jsonl(root / f"data/orders/o{round_}.json", rows, mtime=1_700_000_000 + round_ * 100)
        out, err = run_ok(capsys, root)
        s = steps(root)
        assert s["table.orders"]["state"] == "success" and s["table.totals"]["state"] == "success", out
        expected = _expected(rounds)
        assert_rows(spark, root, "orders", ["order_id", "line", "customer", "amount", "country", "note", "initial"],
                    [(k[0], k[1], r["customer"], Decimal(r["amount"]), r["country"], r["note"],
                      None if r["customer"] is None else r["customer"][0].upper()) for k, r in expected.items()])
        totals: dict = {}
        for r in expected.values():
            if r["customer"] is None:
                continue
            t = totals.setdefault(r["customer"], [Decimal(0), 0])
            t[0] += Decimal(r["amount"])
            t[1] += 1
        was = -1 if round_ == 1 else len(CUSTOMERS)
        assert_rows(spark, root, "totals", ["customer", "amount", "lines", "was"],
                    [(c, a, n, was) for c, (a, n) in totals.items()])
    # the second and third rounds read only the new file (the source's checkpoint, as for SQL)
    raw = s["table.orders"]["inputs"]["raw_orders"]
    assert (raw["new"], raw["rows"]) == (1, len(rounds[-1])), raw
    # nothing new: nothing written
    out, _ = run_ok(capsys, root)
    assert steps(root)["table.orders"]["state"] == "no_input", out


def test_compile_reads_the_model_without_running_it_and_diff_sees_an_edit(tmp_path):
    marker = tmp_path / "ran"
    files = _files()
    files["tables/orders.py"] = ORDERS_PY + f"\nopen({str(marker)!r}, 'w').write('ran')\n"
    root = project(tmp_path, files)
    base = compile_project(root).plan
    assert not marker.exists()  # compile parsed the file; it never ran it
    step = base.step("table.orders")
    assert step.depends_on == ("source.raw_orders", "table.customers") and step.sql_file == "tables/orders.py"
    assert base.step("table.totals").depends_on == ("table.orders",)
    assert step.python["inputs"] == {"orders": "raw_orders", "customers": "customers"} and step.python["extras"] == ["spark"]
    (root / "tables/orders.py").write_text(files["tables/orders.py"].replace('F.lit("??")', 'F.lit("--")'), encoding="utf-8")
    head = compile_project(root).plan
    assert head.step("table.orders").fingerprint != step.fingerprint
    assert head.step("table.totals").fingerprint == base.step("table.totals").fingerprint
    diff = diff_plans(base, head)
    changed = [d for d in diff.steps if d.id == "table.orders"][0]
    assert changed.sql_diff is not None and '-            .withColumn("country", F.coalesce(F.col("country"), F.lit("??")))' in changed.sql_diff
    assert "b/tables/orders.py" in changed.sql_diff


def test_mistakes_in_a_model_are_reported_at_their_line(tmp_path):
    cases = {
        "def model(orders=ref('orderz')):\n    return orders\n": ("tables/m.py:1:18", "ref(\"orderz\"): no table named 'orderz'", "did you mean"),
        "def model(orders=source('orders')):\n    return orders\n": ("tables/m.py:1:18", "no source named 'orders'", "use ref(\"orders\")"),
        "x = 1\n\ndef modle(orders=ref('orders')):\n    return orders\n": ("tables/m.py:1", "defines no top-level `def model(...)`", None),
        "def model(orders=ref('orders'), extra=3):\n    return orders\n": ("tables/m.py:1:33", "parameter 'extra' of model() is not an input", None),
        "name = 'orders'\ndef model(orders=ref(name)):\n    return orders\n": ("tables/m.py:2:18", "takes one name written as a string", None),
        "def model(orders=ref('orders'):\n    return orders\n": ("tables/m.py:1", "Python syntax error", None),
        "def model(*inputs):\n    return inputs[0]\n": ("tables/m.py:1:12", "cannot take *args", None),
    }
    for i, (text, (where, message, hint)) in enumerate(cases.items()):
        root = project(tmp_path, {**_files(), "tables/m.py": text}, name=f"p{i}")
        diags = [d for d in compile_errors(root) if d.location.file == "tables/m.py"]
        assert diags, text
        d = diags[0]
        assert str(d.location).startswith(where) and message in d.message, (text, str(d.location), d.message)
        if hint:
            assert hint in (d.hint or ""), (text, d.hint)
    both = project(tmp_path, {**_files(), "tables/orders.sql": "select 1 as order_id"}, name="both")
    assert any("has both tables/orders.sql and tables/orders.py" in d.message for d in compile_errors(both))


def _line_of(text: str, said: str) -> int:
    """The line of `text` the error `said` should name: the line that raises, or uses the bad
    column, or fails in the UDF."""
    lines = text.splitlines()
    for marker in ("raise ValueError", '"amout"', "encode('ascii')"):
        for n, line in enumerate(lines, 1):
            if marker in line:
                return n
    return 1


def test_a_failing_model_names_its_line_and_writes_nothing(spark, tmp_path, capsys):
    files = _files()
    root = project(tmp_path, files)
    write_jsonl(root / "data/customers/c.json", CUSTOMERS)
    write_jsonl(root / "data/orders/o1.json", _orders(1, 50), mtime=1_700_000_100)
    run_ok(capsys, root)
    cases = [
        # an error of Python, while building the DataFrame
        (ORDERS_PY.replace("    joined = orders.join", "    raise ValueError('no orders today')\n    joined = orders.join"),
         "tables/orders.py:LINE: table orders: model() failed: ValueError: no orders today"),
        # Spark's analysis error (a column the input lacks) at the line that asked for it
        (ORDERS_PY.replace('.where(F.col("amount").isNotNull())', '.where(F.col("amout").isNotNull())'),
         "tables/orders.py:LINE: table orders: model() failed:"),
        # not a DataFrame
        ("def model(orders=source('raw_orders')):\n    return orders.toPandas()\n",
         "tables/orders.py:1: table orders: model() returned DataFrame, not a Spark DataFrame"),
        # the UDF fails on an executor, at write time
        (ORDERS_PY.replace("return None if name is None else name[:1].upper()", "return name.encode('ascii').decode()"),
         "tables/orders.py:LINE: table.orders: a function of the Python model failed in a Spark task: "),
    ]
    for i, (text, said) in enumerate(cases):
        said = said.replace("LINE", str(_line_of(text, said)))
        (root / "tables/orders.py").write_text(text, encoding="utf-8")
        write_jsonl(root / f"data/orders/bad{i}.json", _orders(2 + i, 20), mtime=1_700_000_200 + i)
        code, out, err = pipe(capsys, root, "run", "--select", "orders")
        assert code == 1, out + err
        assert said in out + err, out + err
        assert_clean(out, err)
    # nothing was written by the failed runs: one commit only
    code, out, err = pipe(capsys, root, "timeline", "orders", "--output", "json")
    assert len(commits([json.loads(line) for line in out.splitlines()])) == 1, out  # (the UDF's failed write was rolled back)
    # --debug shows the traceback, with the model's own line
    (root / "tables/orders.py").write_text(cases[0][0], encoding="utf-8")
    code, out, err = pipe(capsys, root, "--debug", "run", "--select", "orders")
    assert code == 1 and "Traceback" in out + err and "raise ValueError('no orders today')" in out + err


def test_the_docs_page_of_a_python_model_shows_its_code_and_inputs(tmp_path, capsys):
    import html

    root = project(tmp_path, _files())
    code, out, err = pipe(capsys, root, "docs", "generate", "--no-lake")
    assert code == 0, out + err
    import re

    page = html.unescape(re.sub(r"<[^>]+>", "", (root / "target/docs/nodes/table.orders.html").read_text(encoding="utf-8")))
    assert "Python model (tables/orders.py; inputs: orders = raw_orders, customers = customers)" in page
    assert 'def model(orders=source("raw_orders"), customers=ref("customers"), spark=None):' in page
    assert re.search(r"declared intables/orders.yml:\d+, tables/orders.py\n", page)  # its YAML, then its code
