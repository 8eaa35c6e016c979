"""Generic tests of a project's own (tests/generic/*.sql, written as dbt writes them), and the
settings every test takes beside severity and thresholds: `store_failures` (the failing rows in
table `<test>__failures`, replaced on each run), `limit` and `fail_calc`. As a user meets them:
declared in YAML, checked at compile time with file:line, shown in the plan and by `pipe diff`,
run by `pipe build` and `pipe test` on the shared SparkSession, the failures read back with
`pipe show` and hudi-rs. Rows have two-field keys, decimals, nulls, quotes and accents."""

from __future__ import annotations

import json
from pathlib import Path

from compiler import compile_project
from compiler.diff import diff_plans
from tests.conftest import compile_errors
from tests.test_run import assert_clean, hudi_rows, pipe, project, run_results, write_jsonl

SOURCES = """
    sources:
      raw_lines:
        kind: files
        path: data/lines
        format: json
        schema: "order_id BIGINT, line INT, customer STRING, amount DECIMAL(12,2), qty INT, placed_ms BIGINT, note STRING"
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
        columns:
          - name: amount
            tests:
              - at_least: {low: 0, store_failures: true}
          - name: qty
            tests:
              - between:
                  low: 1
                  high: 50
                  where: "note is not null"
                  name: qty_in_range
                  config: {store_failures: true, limit: 3}
          - name: customer
            tests:
              - exists_in: {to: source('raw_customers'), field: customer}
        tests:
          - same_moment:
              combination: [customer, placed_ms]
              fail_calc: "sum(n_records)"
              warn_if: "> 10"
              store_failures: true
    """

# one file, several tests, a helper macro, dbt's whitespace control and a config() default
RANGES = """\
{% macro outside(column, low, high) -%}
{{ column }} < {{ low }}{% if high is not none %} or {{ column }} > {{ high }}{% endif %}
{%- endmacro %}

{% test between(model, column_name, low, high=none) %}
select * from {{ model }} m
where {{ outside('m.' ~ column_name, low, high) }}
{% endtest %}

{% test at_least(model, column_name, low) %}
select * from {{ model }} where {{ column_name }} < {{ low }}
{% endtest %}

{%- test same_moment(model, combination) -%}
{{ config(severity='warn') }}
select {{ combination | join(', ') }}, count(*) as n_records
from {{ model }}
group by {{ combination | join(', ') }}
having count(*) > 1
{%- endtest %}
"""

EXISTS_IN = """\
{% test exists_in(model, column_name, to, field) %}
select * from {{ model }} as child
where child.{{ column_name }} is not null
  and not exists (select 1 from {{ to }} as parent where parent.{{ field }} = child.{{ column_name }})
{% endtest %}
"""

SINGULAR = """\
{{ config(severity='warn', store_failures=true) }}
select order_id, sum(amount) as amount from {{ ref('lines') }} group by order_id having sum(amount) > 900
"""

CUSTOMERS = [{"customer": "Zoë O'Brien", "country": "FR"}, {"customer": "Jürgen", "country": "DE"},
             {"customer": 'ACME "Ltd"', "country": "C'TE"}]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MOMENT = BASE_MS + 15 * 10**8  # after round 1's lines, before round 2's


def _line(order: int, line: int, round_: int = 0, **changes) -> dict:
    """A line of round `round_` (a later round's version of a line wins: placed_ms is the precombine)."""
    row = {"order_id": 10_000_000_000 + order, "line": line, "customer": CUSTOMERS[order % 3]["customer"],
           "amount": f"{order % 400}.{order % 100:02d}", "qty": order % 40 + 1, "placed_ms": BASE_MS + round_ * 10**9 + order * 60_000 + line,
           "note": None if order % 9 == 0 else "ok"}
    return {**row, **changes}


def _shop(tmp_path: Path) -> Path:
    root = project(tmp_path, {"sources/raw.yml": SOURCES, "tables/t.yml": TABLES,
                              "tables/lines.sql": "select * from {{ source('raw_lines') }}\n",
                              "tests/generic/ranges.sql": RANGES, "tests/generic/exists_in.sql": EXISTS_IN,
                              "tests/big_orders.sql": SINGULAR})
    write_jsonl(root / "data/customers/c1.json", CUSTOMERS)
    write_jsonl(root / "data/lines/l1.json", [_line(o, n) for o in range(1, 1001) for n in (1, 2)])
    return root


def _tests(root: Path) -> dict[str, dict]:
    return {s["name"]: s for s in run_results(root)["steps"] if s["kind"] == "test"}


def _shown(capsys, root: Path, table: str) -> list[dict]:
    code, out, err = pipe(capsys, root, "show", table, "--output", "json", "--limit", "100")
    assert code == 0, out + err
    return [json.loads(line) for line in out.splitlines()]


# --- compile time ----------------------------------------------------------------------------------


def test_a_generic_test_of_the_project_is_rendered_per_use_into_the_plan(tmp_path, capsys):
    root = _shop(tmp_path)
    plan = compile_project(root).plan
    tests = {s.name: s for s in plan.steps if s.kind == "test"}
    # tests/generic/*.sql are templates, never singular tests of their own
    assert sorted(tests) == ["at_least_lines_amount", "big_orders", "exists_in_lines_customer", "qty_in_range", "same_moment_lines"]
    qty = tests["qty_in_range"]
    assert qty.sql == "select * from (select * from `lines` where note is not null) m\nwhere m.qty < 1 or m.qty > 50\n"
    assert qty.config == {"test": "between", "severity": "error", "warn_if": "!= 0", "error_if": "!= 0", "model": "lines",
                          "model_kind": "table", "columns": ["qty"], "where": "note is not null", "template": "tests/generic/ranges.sql",
                          "args": {"low": 1, "high": 50}, "store_failures": True, "limit": 3}
    assert (qty.file, qty.line) == ("tables/t.yml", 11)
    assert tests["at_least_lines_amount"].sql == "select * from `lines` where amount < 0\n"
    # an argument `source('x')` is that relation, and the test reads it
    assert tests["exists_in_lines_customer"].depends_on == ("source.raw_customers", "table.lines")
    assert "not exists (select 1 from `raw_customers` as parent where parent.customer = child.customer)" in tests["exists_in_lines_customer"].sql
    same = tests["same_moment_lines"]
    assert same.config["severity"] == "warn"  # the template's config() default
    assert same.config["fail_calc"] == "sum(n_records)" and same.config["warn_if"] == "> 10"
    assert same.sql.startswith("select customer, placed_ms, count(*) as n_records\nfrom `lines`\ngroup by customer, placed_ms")
    assert tests["big_orders"].config["store_failures"] is True
    code, out, err = pipe(capsys, root, "ls", "--select", "test:*")
    assert code == 0 and out.split() == [f"test.{n}" for n in sorted(tests)], out + err


def test_a_change_to_the_template_changes_the_fingerprints_of_its_uses_only(tmp_path, capsys):
    root = _shop(tmp_path)
    before = compile_project(root).plan
    template = root / "tests/generic/ranges.sql"
    template.write_text(template.read_text().replace("{{ column_name }} < {{ low }}", "coalesce({{ column_name }}, -1) < {{ low }}"))
    after = compile_project(root).plan
    diff = diff_plans(before, after)
    assert {s.id: (s.status, s.cls) for s in diff.changed} == {"test.at_least_lines_amount": ("modified", "metadata-only")}
    assert diff.worst() == "metadata-only"
    # as `pipe diff` shows it, against the plan of the first compile
    (root / "base.json").write_text(json.dumps(before.to_dict()))
    code, out, err = pipe(capsys, root, "diff", str(root / "base.json"), "--fail-on", "rewrite")
    assert code == 0, out + err  # a test never rebuilds a table
    assert "~ test.at_least_lines_amount  modified metadata-only" in out and "test.qty_in_range" not in out
    assert "-select * from `lines` where amount < 0\n" in out and "+select * from `lines` where coalesce(amount, -1) < 0\n" in out


def _errors(root: Path) -> list[tuple[str, str]]:
    return [(str(d.location), d.message) for d in compile_errors(root)]


def test_mistakes_in_generic_tests_are_reported_at_their_line_with_a_hint(tmp_path, capsys):
    root = project(tmp_path, {
        "sources/raw.yml": SOURCES,
        "tables/t.yml": """
            tables:
              lines:
                key: [order_id, line]
                schema: "order_id BIGINT, line INT, customer STRING, amount DECIMAL(12,2), qty INT"
                columns:
                  - name: amount
                    tests:
                      - at_lest: {low: 0}
                      - at_least: {lo: 0}
                      - at_least
                      - exploding: {n: 1}
                      - broken_sql
                      - at_least: {low: 0, limit: -2, fail_calc: "sum(n) +"}
                  - name: qty
                    tests: [whole_table]
                tests:
                  - whole_table: {store_failures: yes please}
                  - at_least: {column: amount, low: 1, name: checked, store_failures: true}
              checked__failures:
                key: [order_id]
                schema: "order_id BIGINT"
            """,
        "tables/lines.sql": "select * from {{ source('raw_lines') }}\n",
        "tables/checked__failures.sql": "select order_id from {{ ref('lines') }}\n",
        "tests/generic/checks.sql": """\
{% test at_least(model, column_name, low) %}
select * from {{ model }} where {{ column_name }} < {{ low }}
{% endtest %}

{% test exploding(model, column_name, n) %}
select * from {{ model }}
where {{ column_name }} > {{ nothing_by_this_name }}
{% endtest %}

{% test broken_sql(model, column_name) %}
select * from {{ model }} where ({{ column_name }} > 0
{% endtest %}

{% test whole_table(model) %}
select count(*) as n from {{ model }} having count(*) = 0
{% endtest %}
""",
        "tests/generic/unique.sql": "{% test unique(model, column_name) %}\nselect 1\n{% endtest %}\n",
        "tests/generic/more.sql": "-- another at_least\n{% test at_least(model, column_name, low) %}\nselect 1\n{% endtest %}\n",
        "tests/generic/notes.sql": "select 1 as not_a_test\n",
    })
    errors = _errors(root)
    assert errors == [
        ("tables/t.yml:8:13", "unknown test 'at_lest' on table 'lines'"),
        ("tables/t.yml:9:23", "test 'at_least' on table 'lines' needs 'low'"),
        ("tables/t.yml:9:24", "unknown argument 'lo' of test 'at_least' on table 'lines'"),
        ("tables/t.yml:10:13", "test 'at_least' on table 'lines' needs 'low'"),
        ("tables/t.yml:12:13", "test 'broken_sql' on table 'lines': the SQL rendered from tests/generic/checks.sql does not parse: "
                               "SQL syntax error near '0': Expecting ) (line 1 of the rendered SQL)"),
        ("tables/t.yml:13:39", "'limit' of test 'at_least' on table 'lines' is -2; it is the most failing rows counted and stored, a positive whole number"),
        ("tables/t.yml:13:54", "'fail_calc' of test 'at_least' on table 'lines' is 'sum(n) +'; it does not parse as a SQL expression "
                               "(SQL syntax error at its end: incomplete expression)"),
        ("tables/t.yml:15:17", "test 'whole_table' on table 'lines' names column 'qty', but tests/generic/checks.sql:14 declares "
                               "whole_table(model) without column_name"),
        ("tables/t.yml:17:39", "'store_failures' of test 'whole_table' on table 'lines' is 'yes please'; it is true or false"),
        ("tables/t.yml:19:3", "table name 'checked__failures' is taken by the failures table of test 'checked' (store_failures, tables/t.yml:18:9)"),
        ("tests/generic/checks.sql:7", "undefined name in template: 'nothing_by_this_name' is undefined"),
        ("tests/generic/more.sql:2", "generic test 'at_least' is defined twice (first at tests/generic/checks.sql:1)"),
        ("tests/generic/notes.sql:1", "tests/generic/notes.sql defines no generic test"),
        ("tests/generic/unique.sql:1", "generic test 'unique' has the name of pipe's built-in test 'unique'"),
    ]
    hints = {d.message: d.hint for d in compile_errors(root)}
    assert hints["unknown test 'at_lest' on table 'lines'"].startswith("did you mean 'at_least'? tests: unique, not_null")
    assert "your own: at_least, broken_sql, exploding, whole_table" in hints["unknown test 'at_lest' on table 'lines'"]
    assert hints["unknown argument 'lo' of test 'at_least' on table 'lines'"].startswith(
        "did you mean 'low'? tests/generic/checks.sql:1 declares at_least(model, column_name, low)")
    assert hints["undefined name in template: 'nothing_by_this_name' is undefined"].endswith(
        "rendering test 'exploding' for table 'lines' (tables/t.yml:11:13)")
    # the command says so, with the hint, no traceback, and a non-zero exit code
    code, out, err = pipe(capsys, root, "compile")
    assert code != 0
    assert_clean(out, err)
    assert "tests/generic/checks.sql:7: error: undefined name in template" in out + err


# --- running ---------------------------------------------------------------------------------------


def test_failing_rows_are_stored_replaced_on_each_run_and_emptied_when_the_test_passes(spark, tmp_path, capsys):
    root = _shop(tmp_path)
    bad = [_line(1, 1, 1, amount="-1.50"), _line(2, 1, 1, amount="-0.01"), _line(3, 2, 1, amount="-99.99", note=None),
           *[_line(10 + i, 1, 1, qty=0) for i in range(5)],  # 5 rows out of range; limit 3
           _line(27, 1, 1, qty=99, note=None),  # out of range, but left out by `where`
           _line(30, 2, 1, customer="nobody"),
           *[_line(100 + i, 1, 1, customer="Zoë O'Brien", placed_ms=MOMENT) for i in range(12)],  # 12 lines at one moment
           _line(500, 1, 1, amount="999.99"), _line(500, 2, 1, amount="0.50")]
    write_jsonl(root / "data/lines/l2.json", bad)
    code, out, err = pipe(capsys, root, "build")
    assert code == 1, out + err  # at_least_lines_amount and exists_in fail (severity error)
    assert_clean(out, err)
    tests = _tests(root)
    states = {n: (t["state"], t["failures"], t.get("failures_table")) for n, t in tests.items()}
    assert states == {
        "at_least_lines_amount": ("error", 3, "at_least_lines_amount__failures"),
        "qty_in_range": ("error", 3, "qty_in_range__failures"),
        "exists_in_lines_customer": ("error", 1, None),
        "same_moment_lines": ("warn", 12, "same_moment_lines__failures"),
        "big_orders": ("warn", 1, "big_orders__failures"),
    }
    assert tests["qty_in_range"]["message"] == "3 failing rows (limit 3) (whole table); failing rows in table qty_in_range__failures"
    assert tests["same_moment_lines"]["message"] == ("1 failing row, fail_calc sum(n_records) = 12 (whole table); warn_if > 10; "
                                                     "severity warn; failing rows in table same_moment_lines__failures")
    assert "error in test.at_least_lines_amount: 3 failing rows (whole table); failing rows in table at_least_lines_amount__failures" in err
    assert "customer='nobody'" in err  # the sample of a failed test is still shown

    amounts = hudi_rows(root, "at_least_lines_amount__failures", ["order_id", "line", "customer", "amount", "note"])
    assert [(o - 10_000_000_000, n, c, str(a), note) for o, n, c, a, note in amounts] == [
        (1, 1, "Jürgen", "-1.50", "ok"), (2, 1, 'ACME "Ltd"', "-0.01", "ok"), (3, 2, "Zoë O'Brien", "-99.99", None)]
    qty = hudi_rows(root, "qty_in_range__failures", ["order_id", "line", "qty"])
    assert len(qty) == 3 and {(o - 10_000_000_000, n, q) for o, n, q in qty} <= {(10 + i, 1, 0) for i in range(5)}
    shown = _shown(capsys, root, "same_moment_lines__failures")
    assert [(r["customer"], r["placed_ms"], r["n_records"]) for r in shown] == [("Zoë O'Brien", MOMENT, 12)]
    assert [(r["order_id"], str(r["amount"])) for r in _shown(capsys, root, "big_orders__failures")] == [(10_000_000_500, "1000.49")]

    # round 2: the amounts and the customer are fixed, other lines are out of range, the moment shared by fewer lines
    fixed = [_line(1, 1, 2), _line(2, 1, 2), _line(3, 2, 2, note=None), *[_line(10 + i, 1, 2) for i in range(5)],
             _line(15, 2, 2, qty=51), _line(16, 2, 2, qty=-3), _line(30, 2, 2),
             *[_line(100 + i, 1, 2) for i in range(6)], _line(500, 1, 2)]
    write_jsonl(root / "data/lines/l3.json", fixed)
    code, out, err = pipe(capsys, root, "build")
    assert code == 1, out + err  # qty_in_range still fails
    assert_clean(out, err)
    tests = _tests(root)
    assert {n: (t["state"], t["failures"]) for n, t in tests.items()} == {
        "at_least_lines_amount": ("success", 0), "qty_in_range": ("error", 2), "exists_in_lines_customer": ("success", 0),
        "same_moment_lines": ("success", 6), "big_orders": ("success", 0)}
    # a passing test's table is emptied: the failures of round 1 never linger
    assert hudi_rows(root, "at_least_lines_amount__failures", ["order_id"]) == []
    assert _shown(capsys, root, "big_orders__failures") == []
    assert tests["at_least_lines_amount"]["failures_table"] == "at_least_lines_amount__failures"
    assert tests["at_least_lines_amount"]["message"] == "passed (whole table)"
    # a failing one holds this run's rows only
    assert hudi_rows(root, "qty_in_range__failures", ["order_id", "line", "qty"]) == [(10_000_000_015, 2, 51), (10_000_000_016, 2, -3)]
    # within its thresholds, a test still stores what it found
    assert tests["same_moment_lines"]["message"] == ("passed (whole table); 1 failing row, fail_calc sum(n_records) = 6 within the thresholds; "
                                                     "failing rows in table same_moment_lines__failures")
    assert [r["n_records"] for r in _shown(capsys, root, "same_moment_lines__failures")] == [6]
    code, out, err = pipe(capsys, root, "timeline", "qty_in_range__failures", "--output", "json")
    assert code == 0 and [json.loads(line)["action"] for line in out.splitlines()] == ["replacecommit", "replacecommit"], out + err

    # `pipe test` replaces them too; with the range widened, the test passes and its table is empty
    yml = root / "tables/t.yml"
    yml.write_text(yml.read_text().replace("low: 1\n", "low: -5\n").replace("high: 50\n", "high: 60\n"))
    code, out, err = pipe(capsys, root, "test", "--select", "test:qty_in_range")
    assert code == 0, out + err
    assert _tests(root)["qty_in_range"]["message"] == "passed (whole table)"
    assert hudi_rows(root, "qty_in_range__failures", ["order_id"]) == []
