"""Data tests as a user meets them: declared in tables/*.yml, sources/*.yml and tests/*.sql,
checked at compile time with file:line, shown by `pipe ls` and `pipe diff`, and run by
`pipe test` and `pipe build` in-process on the shared SparkSession. The rows are the kind users
have: two-field keys, epoch-millis bigints, decimals, timestamps, text with quotes and accents,
and a few thousand of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler import compile_project
from compiler.diff import diff_plans
from tests.conftest import compile_errors
from tests.test_run import PROJECT_YML, assert_clean, hudi_rows, pipe, project, run_results, write_jsonl

LINES = """
    sources:
      raw_lines:
        kind: files
        path: data/lines
        format: json
        schema: "order_id BIGINT, line INT, sku STRING, customer STRING, country STRING, amount DECIMAL(12,2), placed_ms BIGINT, placed_at TIMESTAMP, note STRING"
        columns:
          - name: order_id
            tests: [not_null]
      raw_customers:
        kind: files
        path: data/customers
        format: json
        schema: "customer STRING, country STRING"
    """

TABLES = """
    tables:
      lines:
        key: [order_id, line]
        precombine: placed_ms
        partition_by: [country]
        index: partition
        columns:
          - name: customer
            tests:
              - not_null
              - relationships:
                  to: source('raw_customers')
                  field: customer
          - name: country
            tests:
              - accepted_values:
                  values: [FR, DE, "C'TE"]
          - name: amount
            tests:
              - expression:
                  expression: "amount >= 0"
                  warn_if: "> 0"
                  error_if: "> 5"
        tests:
          - unique:
              columns: [order_id, line]
          - expression:
              name: placed_in_2026
              expression: "placed_at >= timestamp'2026-01-01 00:00:00'"
              where: "note is not null"
              severity: warn
      per_customer:
        key: [customer]
        columns:
          - name: customer
            data_tests: [unique]
    """

LINES_SQL = """
    select order_id, line, sku, customer, amount, placed_ms, placed_at, note, upper(country) as country
    from {{ source('raw_lines') }}
    """

PER_CUSTOMER_SQL = """
    select customer, sum(amount) as amount, count(*) as lines from {{ ref('lines') }} group by customer
    """

SINGULAR = """
    -- every order's lines are numbered from 1 with no gap
    {{ config(severity='warn') }}
    select order_id, count(*) as lines, max(line) as last_line
    from {{ ref('lines') }}
    group by order_id
    having max(line) <> count(*)
    """

CUSTOMERS = [{"customer": "Zoë O'Brien", "country": "FR"}, {"customer": "Jürgen", "country": "DE"},
             {"customer": "ACME \"Ltd\"", "country": "C'TE"}]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _line(order: int, line: int, customer: str, amount: str = "19.99", note: str | None = "ok", ms: int | None = None) -> dict:
    ms = BASE_MS + order * 60_000 + line if ms is None else ms
    country = next((c["country"] for c in CUSTOMERS if c["customer"] == customer), "xx")
    return {"order_id": 10_000_000_000 + order, "line": line, "sku": f"SKU-{order % 97:03d}", "customer": customer, "country": country,
            "amount": amount, "placed_ms": ms, "placed_at": _iso(ms), "note": note}


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _shop(tmp_path: Path) -> Path:
    root = project(tmp_path, {"sources/raw.yml": LINES, "tables/t.yml": TABLES, "tables/lines.sql": LINES_SQL,
                              "tables/per_customer.sql": PER_CUSTOMER_SQL, "tests/lines_are_numbered.sql": SINGULAR})
    write_jsonl(root / "data/customers/c1.json", CUSTOMERS)
    rows = [_line(o, n, CUSTOMERS[o % 3]["customer"]) for o in range(1, 1001) for n in (1, 2)]
    write_jsonl(root / "data/lines/l1.json", rows)
    return root


def _tests(root: Path) -> dict[str, dict]:
    return {s["name"]: s for s in run_results(root)["steps"] if s["kind"] == "test"}


# --- compile time --------------------------------------------------------------------------------


def test_tests_are_steps_of_the_plan_named_as_dbt_names_them(tmp_path, capsys):
    root = _shop(tmp_path)
    plan = compile_project(root).plan
    tests = {s.name: s for s in plan.steps if s.kind == "test"}
    assert sorted(tests) == ["accepted_values_lines_country", "expression_lines_amount", "lines_are_numbered", "not_null_lines_customer",
                             "not_null_raw_lines_order_id", "placed_in_2026", "relationships_lines_customer", "unique_lines_order_id_line",
                             "unique_per_customer_customer"]
    assert tests["relationships_lines_customer"].depends_on == ("source.raw_customers", "table.lines")
    assert tests["lines_are_numbered"].sql_file == "tests/lines_are_numbered.sql"
    assert tests["lines_are_numbered"].config["severity"] == "warn"
    assert (tests["placed_in_2026"].file, tests["placed_in_2026"].line) == ("tables/t.yml", 27)
    assert "'C\\'TE'" in tests["accepted_values_lines_country"].sql
    # `pipe ls --select lines` brings the table's tests along; `test:` selects tests by name
    code, out, err = pipe(capsys, root, "ls", "--select", "test:unique_*")
    assert (code, out.split()) == (0, ["test.unique_lines_order_id_line", "test.unique_per_customer_customer"]), err
    code, out, _ = pipe(capsys, root, "ls", "--select", "lines", "--exclude", "per_customer")
    assert "test.lines_are_numbered" in out.split() and "test.unique_per_customer_customer" not in out.split()
    code, out, _ = pipe(capsys, root, "compile")
    assert code == 0 and "2 sources, 2 tables (2 commit), 9 tests" in out


def test_a_change_to_tests_is_metadata_only_and_leaves_the_tables_fingerprints(tmp_path):
    root = _shop(tmp_path)
    before = compile_project(root).plan
    text = (root / "tables/t.yml").read_text().replace('values: [FR, DE, "C\'TE"]', "values: [FR, DE]").replace("data_tests: [unique]", "data_tests: []")
    (root / "tables/t.yml").write_text(text)
    (root / "tests/lines_are_numbered.sql").unlink()
    after = compile_project(root).plan
    assert {s.id: s.fingerprint for s in before.steps if s.kind != "test"} == {s.id: s.fingerprint for s in after.steps if s.kind != "test"}
    diff = diff_plans(before, after)
    changed = {s.id: (s.status, s.cls) for s in diff.changed}
    assert changed == {"test.accepted_values_lines_country": ("modified", "metadata-only"),
                       "test.unique_per_customer_customer": ("removed", "metadata-only"),
                       "test.lines_are_numbered": ("removed", "metadata-only")}
    assert diff.worst() == "metadata-only"


def _errors(root: Path) -> list[tuple[str, str]]:
    return [(str(d.location), d.message) for d in compile_errors(root)]


def test_mistakes_in_tests_are_reported_at_their_line_with_a_hint(tmp_path):
    root = project(tmp_path, {
        "sources/raw.yml": LINES,
        "sources/queue.yml": """
            sources:
              queue:
                kind: s3_events
                queue_url: https://sqs.us-east-1.amazonaws.com/1/q
                tests:
                  - not_null: {column: x}
            """,
        "tables/t.yml": """
            tables:
              lines:
                key: [order_id, line]
                schema: "order_id BIGINT, line INT, customer STRING"
                columns:
                  - name: order_id
                    tests: [uniq]
                  - name: customr
                    tests: [not_null]
                  - name: customer
                    tests:
                      - relationships: {to: ref('customer'), field: customer}
                      - relationships: {to: source('raw_customers'), field: cust}
                      - accepted_values: {values: [a], severity: fatal, warn_if: 10}
                tests:
                  - expression: {expression: "line > 0", name: x}
                  - expression: {expression: "line < 99", name: x}
                  - not_null
            """,
        "tables/lines.sql": "select order_id, line, customer from {{ source('raw_lines') }}\n",
        "tables/q.sql": "select * from {{ source('queue') }}\n",
        "tests/empty.sql": "{{ config(severity='warn') }} select 1 as x\n",
        "tests/bad_config.sql": "{{ config(severity='loud') }} select * from {{ ref('lines') }}\n",
    })
    errors = _errors(root)
    assert errors == [
        ("sources/queue.yml:6:9", "test 'not_null' on source 'queue': a source of kind s3_events cannot be read again by a test"),
        ("tables/t.yml:7:17", "unknown test 'uniq' on table 'lines'"),
        ("tables/t.yml:9:17", "test 'not_null' on table 'lines' names column 'customr', which it does not have"),
        ("tables/t.yml:12:33", "test 'relationships' on table 'lines': 'to' names \"ref('customer')\", which is no table of the project"),
        ("tables/t.yml:13:13", "test 'relationships' on table 'lines': source 'raw_customers' has no column 'cust'"),
        ("tables/t.yml:14:54", "unknown severity 'fatal' of test 'accepted_values' on table 'lines'"),
        ("tables/t.yml:14:70", "'warn_if' of test 'accepted_values' on table 'lines' is 10; it compares the number of failing rows (or the value of fail_calc) with a number"),
        ("tables/t.yml:17:9", "test name 'x' is taken (by the test at tables/t.yml:16:9)"),
        ("tables/t.yml:18:9", "test 'not_null' in the `tests:` of table 'lines' needs `column:`"),
        ("tests/bad_config.sql:1", "config() of test tests/bad_config.sql: unknown severity 'loud'"),
        ("tests/empty.sql:1:1", "test 'empty' reads no table or source"),
    ]
    hints = {d.message: d.hint for d in compile_errors(root)}
    assert "did you mean 'unique'?" in hints["unknown test 'uniq' on table 'lines'"]
    assert "did you mean 'customer'?" in hints["test 'not_null' on table 'lines' names column 'customr', which it does not have"]


# --- running ---------------------------------------------------------------------------------------


def test_build_runs_tables_then_their_tests_and_a_failed_test_stops_the_readers(spark, tmp_path, capsys):
    root = _shop(tmp_path)
    # not built yet: the tests say what to do
    code, out, err = pipe(capsys, root, "test", "--select", "lines")
    assert code == 1 and "test not_null_lines_customer reads table lines, which has not been built yet" in err
    assert "pipe run --select +lines" in err
    assert_clean(out, err)

    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    assert_clean(out, err)
    results = run_results(root)
    assert results["args"]["command"] == "build" and results["success"] is True
    tests = _tests(root)
    assert {n: t["state"] for n, t in tests.items()} == {n: "success" for n in tests}
    assert tests["unique_per_customer_customer"]["message"].startswith("passed: customer is the record key of upsert table per_customer")
    assert tests["unique_lines_order_id_line"]["message"] == "passed (whole table)"  # index: partition: a key is unique per partition only
    assert tests["not_null_raw_lines_order_id"]["message"] == "passed (all of the source)"
    assert "9 tests passed" in out

    # round 2: orphans, negative amounts, an unknown country and a gap in line numbers
    bad = [_line(2001, 1, "nobody", amount="-1.00"), _line(2001, 3, "Zoë O'Brien", amount="-2.50"),
           *[_line(2002 + i, 1, "Jürgen", amount=f"-{i}.01", note=None) for i in range(5)], _line(2010, 1, "Zoë O'Brien", ms=BASE_MS - 5)]
    write_jsonl(root / "data/lines/l2.json", bad)
    code, out, err = pipe(capsys, root, "build")
    assert code == 1
    assert_clean(out, err)
    tests = _tests(root)
    states = {n: (t["state"], t["failures"]) for n, t in tests.items()}
    assert states["relationships_lines_customer"] == ("error", 1)
    assert states["accepted_values_lines_country"] == ("error", 1)  # 'nobody' has country XX
    assert states["expression_lines_amount"] == ("error", 7)  # error_if > 5
    assert states["placed_in_2026"] == ("warn", 1)  # severity warn; the rows without a note are left out by `where`
    assert states["lines_are_numbered"] == ("warn", 1)
    assert states["not_null_lines_customer"] == ("success", 0)
    new_commit = next(s for s in run_results(root)["steps"] if s["id"] == "table.lines")["instant"]
    assert tests["relationships_lines_customer"]["message"] == f"1 failing row (the rows written by {new_commit})"
    assert tests["relationships_lines_customer"]["samples"] == [
        {"order_id": 10_000_002_001, "line": 1, "sku": "SKU-061", "customer": "nobody", "amount": "-1.00", "placed_ms": BASE_MS + 2001 * 60_000 + 1,
         "placed_at": "2026-01-02 09:21:00.001000", "note": "ok", "country": "XX"}]
    assert len(tests["expression_lines_amount"]["samples"]) == 5
    per_customer = next(s for s in run_results(root)["steps"] if s["id"] == "table.per_customer")
    assert per_customer["state"] == "skipped"
    assert per_customer["message"].startswith("skipped: test ") and "of lines failed" in per_customer["message"]
    assert "error in test.expression_lines_amount: 7 failing rows (the rows written by" in err and "error_if > 5" in err
    assert "customer='nobody'" in err  # the failing row is shown

    # `pipe test` reads the whole table; the same failures, and exit 1
    code, out, err = pipe(capsys, root, "test", "--select", "test:relationships_* test:unique_*")
    assert code == 1, out + err
    tests = _tests(root)
    assert sorted(tests) == ["relationships_lines_customer", "unique_lines_order_id_line", "unique_per_customer_customer"]
    assert tests["relationships_lines_customer"]["message"] == "1 failing row (whole table)"
    assert tests["unique_per_customer_customer"]["message"] == "passed (whole table)"  # `pipe test` always checks
    assert run_results(root)["args"]["command"] == "test"
    # a warn-only selection exits 0
    code, out, err = pipe(capsys, root, "test", "--select", "test:lines_are_numbered")
    assert code == 0 and "1 test warned" in out, out + err


def test_a_test_whose_sql_fails_names_its_file_and_no_traceback(spark, tmp_path, capsys):
    root = _shop(tmp_path)
    (root / "tests/lines_are_numbered.sql").write_text("select order_id, missing_column from {{ ref('lines') }}\n")
    code, out, err = pipe(capsys, root, "run", "--select", "lines")
    assert code == 0, out + err
    code, out, err = pipe(capsys, root, "test", "--select", "test:lines_are_numbered")
    assert code == 1
    assert_clean(out, err)
    assert "error in test.lines_are_numbered: tests/lines_are_numbered.sql: test lines_are_numbered cannot run: [UNRESOLVED_COLUMN" in err
    results = json.loads((root / "target/run_results.json").read_text())
    assert results["steps"][0]["state"] == "error"


# --- expectations ------------------------------------------------------------------------------------

EXPECT = """\
    expect:
      known_country: {expression: "country in ('FR', 'DE', 'C\\\\'TE')", action: quarantine}
      positive_amount: {expression: "amount > 0", action: drop}
      has_note: "note is not null"
      sane_time: {expression: "placed_ms between 1000000000000 and 4102444800000", action: fail}
"""


def test_expectations_warn_drop_quarantine_and_fail_before_the_commit(spark, tmp_path, capsys):
    root = _shop(tmp_path)
    text = (root / "tables/t.yml").read_text().replace("    index: partition\n", "    index: partition\n    delete_when: \"note = 'cancel'\"\n" + EXPECT, 1)
    (root / "tables/t.yml").write_text(text)
    plan = compile_project(root).plan
    assert [e["name"] for e in plan.step("table.lines").config["expect"]] == ["known_country", "positive_amount", "has_note", "sane_time"]
    assert "expect" not in plan.step("table.per_customer").config  # tables without expectations keep their fingerprints

    bad = [_line(3001, 1, "nobody"), _line(3002, 1, "Jürgen", amount="-4.00"), _line(3003, 1, "Jürgen", note=None),
           _line(3004, 1, "nobody", amount="-1.00", note=None),
           # a delete (delete_when) is not checked: it deletes stored line (5, 1) whatever it holds
           {**_line(5, 1, CUSTOMERS[2]["customer"], amount="-9.00", note="cancel"), "placed_ms": BASE_MS + 10**9}]
    write_jsonl(root / "data/lines/l2.json", bad)
    code, out, err = pipe(capsys, root, "run", "--select", "lines")
    assert code == 0, out + err
    assert_clean(out, err)
    step = next(s for s in run_results(root)["steps"] if s["id"] == "table.lines")
    assert step["expectations"] == {"rows": 2005, "known_country": {"action": "quarantine", "failed": 2},
                                    "positive_amount": {"action": "drop", "failed": 2}, "has_note": {"action": "warn", "failed": 2},
                                    "sane_time": {"action": "fail", "failed": 0}}
    assert step["inserts"] == 2000  # 2000 good lines, less line (5, 1) deleted in the batch, + 3003 without a note; 3004 is quarantined
    assert "expectations: known_country quarantined 2, positive_amount dropped 2, has_note warned 2; quarantine commit " in step["message"]
    stored = {(r["order_id"] - 10_000_000_000, r["line"]) for r in spark.read.format("parquet").load(str(root / "lake/lines")).collect()}
    lines = {order for order, _ in stored}
    assert {3001, 3002, 3004} & lines == set() and 3003 in lines
    assert (5, 1) not in stored and (5, 2) in stored and len(stored) == 2000  # the delete was applied, not dropped
    quarantine = spark.read.format("parquet").load(str(root / "lake/lines__quarantine")).collect()
    assert sorted((r["order_id"] - 10_000_000_000, tuple(r["_pipe_failed_expectations"])) for r in quarantine) == [
        (3001, ("known_country",)), (3004, ("known_country", "positive_amount", "has_note"))]
    # the quarantine commit carries the table's checkpoints; pipe timeline shows the counts
    code, out, err = pipe(capsys, root, "timeline", "lines", "--output", "json")
    latest = [json.loads(line) for line in out.splitlines()][-1]
    assert latest["expectations"]["positive_amount"] == {"action": "drop", "failed": 2}
    code, out, err = pipe(capsys, root, "timeline", "lines__quarantine", "--output", "json")
    q = [json.loads(line) for line in out.splitlines()]
    assert len(q) == 1 and q[0]["checkpoints"] == latest["checkpoints"]

    # fail: nothing is committed, the checkpoint stays, and the same input is read again next run
    write_jsonl(root / "data/lines/l3.json", [_line(3005, 1, "Jürgen", ms=99)])
    code, out, err = pipe(capsys, root, "run", "--select", "lines")
    assert code == 1
    assert_clean(out, err)
    assert "table lines: expectation sane_time (placed_ms between 1000000000000 and 4102444800000) failed for 1 of 1 rows, e.g. order_id=10000003005" in err
    assert "nothing was committed, and the sources' checkpoints stay where they were" in err
    code, out, err = pipe(capsys, root, "timeline", "lines", "--output", "json")
    assert [json.loads(line) for line in out.splitlines()][-1] == latest
    code, out, err = pipe(capsys, root, "run", "--select", "lines", "--dry-run")
    assert "1 new file" in out


QUARANTINE_ROUNDS = {
    "sources/s.yml": """
        sources:
          raw_orders:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, line INT, customer STRING, region STRING, amount DECIMAL(12,2), updated_ms BIGINT"
        """,
    "tables/orders.sql": "select * from {{ source('raw_orders') }}\n",
}


def _quarantine_tables(table_type: str) -> str:
    return f"""
        tables:
          orders:
            type: {table_type}
            key: [order_id, line]
            precombine: updated_ms
            partition_by: [region]
            expect:
              has_customer: {{expression: "customer is not null", action: quarantine}}
              positive_amount: {{expression: "amount > 0", action: quarantine}}
        """


def quarantine_round(round_: int, good: dict, quarantined: set) -> list[dict]:
    """Round `round_` of input for QUARANTINE_ROUNDS: two new orders, two updates of the last
    round's (accents and quotes), a null customer and a negative amount to quarantine. Adds
    what the table and its quarantine table should hold after it to `good` and `quarantined`."""
    base_ms = 1_767_225_600_000  # 2026-01-01
    rows = []
    for i in range(4):
        order = 9_000_000_000 + 2 * (round_ if i < 2 or round_ == 0 else round_ - 1) + i % 2
        row = {"order_id": order, "line": i % 2 + 1, "customer": f"Zoë O'Brien {round_}", "region": ["EU", "US"][i % 2],
               "amount": f"{round_ * 10 + i}.25", "updated_ms": base_ms + round_ * 3_600_000 + i}
        rows.append(row)
        good[(order, row["line"])] = (row["customer"], row["region"], row["updated_ms"])
    bad = [{"order_id": 8_000_000_000 + round_, "line": 1, "customer": None, "region": "EU", "amount": "5.00",
            "updated_ms": base_ms + round_},
           {"order_id": 8_100_000_000 + round_, "line": 2, "customer": "Ann", "region": "APAC", "amount": "-1.50",
            "updated_ms": base_ms + round_}]
    quarantined |= {(b["order_id"], b["line"], b["customer"], ("has_customer",) if b["customer"] is None else ("positive_amount",))
                    for b in bad}
    return rows + bad


def assert_quarantine_round(root: Path, round_: int, good: dict, quarantined: set) -> None:
    stored = hudi_rows(root, "orders", ["order_id", "line", "customer", "region", "updated_ms"])
    assert sorted(stored) == sorted((o, l, *v) for (o, l), v in good.items()), f"round {round_}"
    in_quarantine = hudi_rows(root, "orders__quarantine", ["order_id", "line", "customer", "_pipe_failed_expectations"])
    assert sorted((o, l, c, tuple(f)) for o, l, c, f in in_quarantine) == sorted(quarantined), f"round {round_}"


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_quarantine_keeps_working_round_after_round(spark, tmp_path, capsys, table_type):
    """Every round quarantines rows (a null customer, a negative amount); after each run the
    quarantine table holds every row quarantined so far and the table every good one, latest
    version by updated_ms (read by hudi-rs)."""
    root = project(tmp_path, {**QUARANTINE_ROUNDS, "tables/orders.yml": _quarantine_tables(table_type)})
    good: dict[tuple[int, int], tuple] = {}
    quarantined: set[tuple] = set()
    for round_ in range(6):
        write_jsonl(root / f"data/orders/round-{round_}.json", quarantine_round(round_, good, quarantined))
        code, out, err = pipe(capsys, root, "run")
        assert code == 0, f"round {round_}:\n{out}\n{err}"
        assert_clean(out, err)
        assert "has_customer quarantined 1, positive_amount quarantined 1; quarantine commit" in out
        assert_quarantine_round(root, round_, good, quarantined)


def test_a_build_with_nothing_new_reuses_the_tests_that_passed_at_the_same_commits(spark, tmp_path, capsys):
    root = _shop(tmp_path)
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    first = next(s for s in run_results(root)["steps"] if s["id"] == "table.lines")["instant"]
    on_lines = ["accepted_values_lines_country", "expression_lines_amount", "lines_are_numbered", "not_null_lines_customer",
                "placed_in_2026", "unique_lines_order_id_line"]

    # nothing new: the tests of table lines passed at its latest commit and are not run again
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    assert_clean(out, err)
    tests = _tests(root)
    for name in on_lines:
        assert tests[name]["state"] == "success" and tests[name]["message"] == (
            f"passed at lines at {first} (reused: no commit since it was checked, and the test is the same)"), name
    assert f"passed at lines at {first} (reused" in out
    # a test that reads a source is always run (files change without a commit)
    assert tests["relationships_lines_customer"]["message"] == "passed (whole table)"
    assert tests["not_null_raw_lines_order_id"]["message"] == "passed (all of the source)"

    # a test whose definition changed is run again; the others are still reused
    yml = root / "tables/t.yml"
    yml.write_text(yml.read_text().replace("""values: [FR, DE, "C'TE"]""", """values: [FR, DE, "C'TE", ES]"""))
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    tests = _tests(root)
    assert tests["accepted_values_lines_country"]["message"] == "passed (whole table)"
    assert tests["not_null_lines_customer"]["message"].startswith(f"passed at lines at {first} (reused")

    # new rows: checked alone, and the pass holds at the new commit for the next build
    write_jsonl(root / "data/lines/l2.json", [_line(3001, 1, "Jürgen", amount="12.50"), _line(3001, 2, "Zoë O'Brien", amount="0.99")])
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    second = next(s for s in run_results(root)["steps"] if s["id"] == "table.lines")["instant"]
    assert second != first and _tests(root)["not_null_lines_customer"]["message"] == f"passed (the rows written by {second})"
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    assert _tests(root)["not_null_lines_customer"]["message"].startswith(f"passed at lines at {second} (reused")

    # a failed test is never reused as passed: with nothing new, it checks the whole table again and fails again
    write_jsonl(root / "data/lines/l3.json", [_line(3002, 1, "Jürgen", amount="-7.25")] * 1 + [
        _line(3003 + i, 1, "Jürgen", amount=f"-{i}.10") for i in range(6)])
    code, out, err = pipe(capsys, root, "build")
    assert code == 1 and _tests(root)["expression_lines_amount"]["state"] == "error"
    code, out, err = pipe(capsys, root, "build")
    assert code == 1
    failed = _tests(root)["expression_lines_amount"]
    assert failed["state"] == "error" and failed["message"].startswith("7 failing rows (whole table)"), failed
    assert _tests(root)["not_null_lines_customer"]["message"].startswith("passed at lines at ")

    # `pipe test` checks whole tables, always
    code, out, err = pipe(capsys, root, "test", "--select", "test:not_null_lines_customer")
    assert code == 0 and _tests(root)["not_null_lines_customer"]["message"] == "passed (whole table)"

    # a damaged or forged memory is ignored: every test runs
    (root / "target/test_results.json").write_text('{"format": 1, "signature": "00", "tests": {}}')
    code, out, err = pipe(capsys, root, "test", "--select", "test:not_null_lines_customer")
    code, out, err = pipe(capsys, root, "build", "--select", "test:not_null_lines_customer")
    assert code == 0 and _tests(root)["not_null_lines_customer"]["message"].startswith("passed at lines at ")
    (root / "target/test_results.json").write_text("{damaged")
    code, out, err = pipe(capsys, root, "build", "--select", "test:not_null_lines_customer")
    assert code == 0 and _tests(root)["not_null_lines_customer"]["message"] == "passed (whole table)"
