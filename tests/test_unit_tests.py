"""Unit tests (tests/unit/*.yml, `unit_tests:` in tables/*.yml) as a user meets them: rows given
for a table's inputs and for the table before the run, run through pipe's real write path on a
throwaway table (precombine, delete_when, expectations and quarantine, partition moves,
merge-on-read, a Python model), compared with the table after the write, a failure shown as a
row diff, and every mistake reported at compile time at its file:line."""

from __future__ import annotations

import json

import pytest

from tests.conftest import compile_errors
from tests.test_run import assert_clean, pipe, project, run_results, write_jsonl

SOURCES = """
    sources:
      raw_orders:
        kind: files
        path: data/orders
        format: json
        schema: "order_id BIGINT, line INT, customer STRING, country STRING, amount DECIMAL(12,2), updated_ms BIGINT, placed_at TIMESTAMP, op STRING"
      raw_customers:
        kind: files
        path: data/customers
        format: json
        schema: "customer STRING, tier STRING"
    """

TABLES = """
    tables:
      customers:
        key: [customer]
      orders:
        type: {table_type}
        key: [order_id, line]
        precombine: updated_ms
        partition_by: [country]
        index: global                      # a key that moves country moves partition
        delete_when: "op = 'D'"
        expect:
          known_customer: {{expression: "customer is not null", action: quarantine}}
    """

ORDERS_SQL = """
    select o.order_id, o.line, o.customer, o.country, o.amount, o.updated_ms, o.placed_at, o.op,
           coalesce(c.tier, 'none') as tier
    from {{ source('raw_orders') }} o left join {{ ref('customers') }} c on c.customer = o.customer
    """

# Before: three order lines. Given: a newer version of (1,1) that moves it from FR to DE, a stale
# version of (1,2) (older updated_ms: ignored), a delete of (2,1), a new line with quotes and
# accents, a row without customer (quarantined), and two versions of one new key in one batch.
UNIT = """
    unit_tests:
      - name: orders_merge_the_latest_versions
        model: orders
        description: the latest version of each line wins; deletes and moves apply
        given:
          - input: this
            rows:
              - {order_id: 1, line: 1, customer: Zoë, country: FR, amount: 10.50, updated_ms: 1700000000000, placed_at: 2024-01-02 10:00:00, op: U, tier: gold}
              - {order_id: 1, line: 2, customer: Zoë, country: FR, amount: 3.00, updated_ms: 1700000000000, placed_at: 2024-01-02 10:00:00, op: U, tier: gold}
              - {order_id: 2, line: 1, customer: "O'Brien", country: IE, amount: 99.99, updated_ms: 1700000000000, placed_at: 2024-01-03 09:30:00, op: U, tier: none}
          - input: source('raw_orders')
            rows:
              - {order_id: 1, line: 1, customer: Zoë, country: DE, amount: 12.00, updated_ms: 1700000500000, placed_at: 2024-01-02 10:00:00, op: U}
              - {order_id: 1, line: 2, customer: Zoë, country: FR, amount: 0.01, updated_ms: 1600000000000, placed_at: 2024-01-02 10:00:00, op: U}
              - {order_id: 2, line: 1, customer: "O'Brien", country: IE, amount: 99.99, updated_ms: 1700000600000, placed_at: 2024-01-03 09:30:00, op: D}
              - {order_id: 3, line: 1, customer: 'Łukasz "Luke"', country: PL, amount: 5.25, updated_ms: 1700000700000, placed_at: 2024-01-04 00:00:00, op: U}
              - {order_id: 4, line: 1, customer: null, country: PL, amount: 1.00, updated_ms: 1700000700000, placed_at: 2024-01-04 00:00:00, op: U}
              - {order_id: 5, line: 1, customer: Zoë, country: FR, amount: 7.00, updated_ms: 1700000800000, placed_at: 2024-01-05 00:00:00, op: U}
              - {order_id: 5, line: 1, customer: Zoë, country: FR, amount: 8.00, updated_ms: 1700000900000, placed_at: 2024-01-05 00:00:00, op: U}
          - input: ref('customers')
            format: csv
            fixture: customers
        expect:
          rows:
            - {order_id: 1, line: 1, country: DE, amount: 12.00, tier: gold}
            - {order_id: 1, line: 2, country: FR, amount: 3.00, tier: gold}
            - {order_id: 3, line: 1, country: PL, amount: 5.25, tier: none}
            - {order_id: 5, line: 1, country: FR, amount: 8.00, tier: gold}
    """

CUSTOMERS_CSV = 'customer,tier\nZoë,gold\n"O\'Brien, Ltd",silver\n'


def _files(table_type: str = "copy_on_write", unit: str = UNIT) -> dict[str, str]:
    return {"sources/raw.yml": SOURCES, "tables/t.yml": TABLES.format(table_type=table_type), "tables/orders.sql": ORDERS_SQL,
            "tables/customers.sql": "select * from {{ source('raw_customers') }}\n", "tests/unit/orders.yml": unit,
            "tests/fixtures/customers.csv": CUSTOMERS_CSV}


def _unit_results(root):
    return {s["id"]: s for s in run_results(root)["steps"] if s["kind"] == "unit"}


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_unit_test_checks_the_table_after_pipes_write_not_the_select(spark, tmp_path, capsys, table_type):
    root = project(tmp_path, _files(table_type))
    code, out, err = pipe(capsys, root, "test", "--unit")
    assert code == 0, out + err
    assert_clean(out, err)
    r = _unit_results(root)["unit.orders_merge_the_latest_versions"]
    assert r["state"] == "success" and r["message"] == "orders after the write holds the 4 expected rows", r
    assert not (root / "lake").exists()  # no table of the lake was read or written
    assert not list((root / "target/unit").iterdir())  # the throwaway table is gone
    # the tenth run is the first one again
    for _ in range(2 if table_type == "copy_on_write" else 0):
        assert pipe(capsys, root, "test", "--unit")[0] == 0


def test_a_failing_unit_test_prints_a_row_diff_and_exits_1(spark, tmp_path, capsys):
    wrong = UNIT.replace("{order_id: 5, line: 1, country: FR, amount: 8.00, tier: gold}",
                         "{order_id: 5, line: 1, country: FR, amount: 7.00, tier: gold}")  # what dbt's "what would be merged" sees first
    root = project(tmp_path, _files(unit=wrong))
    code, out, err = pipe(capsys, root, "test", "--unit")
    assert code == 1, out + err
    assert_clean(out, err)
    text = out + err
    assert "orders after the write differs from expect: 1 expected row missing (-), 1 row not expected (+)" in text
    assert '- {"order_id": 5, "line": 1, "country": "FR", "amount": "7.00", "tier": "gold"}' in text
    assert '+ {"order_id": 5, "line": 1, "country": "FR", "amount": "8.00", "tier": "gold"}' in text
    r = _unit_results(root)["unit.orders_merge_the_latest_versions"]
    assert r["state"] == "error" and r["failures"] == 2


def test_build_runs_the_unit_tests_first_and_a_failing_one_stops_the_tables_write(spark, tmp_path, capsys):
    wrong = UNIT.replace("{order_id: 3, line: 1, country: PL, amount: 5.25, tier: none}", "{order_id: 3, line: 1, country: PL, amount: 5.25, tier: bronze}")
    root = project(tmp_path, _files(unit=wrong))
    write_jsonl(root / "data/customers/c.json", [{"customer": "Zoë", "tier": "gold"}])
    write_jsonl(root / "data/orders/o.json", [{"order_id": 1, "line": 1, "customer": "Zoë", "country": "FR", "amount": "1.00",
                                               "updated_ms": 1, "placed_at": "2024-01-01T00:00:00Z", "op": "U"}])
    code, out, err = pipe(capsys, root, "build")
    assert code == 1, out + err
    steps = {s["id"]: s for s in run_results(root)["steps"]}
    assert steps["unit.orders_merge_the_latest_versions"]["state"] == "error"
    assert steps["table.orders"]["state"] == "skipped" and "orders_merge_the_latest_versions" in steps["table.orders"]["message"]
    assert steps["table.customers"]["state"] == "success"  # not what the unit test tests
    assert not (root / "lake/orders").exists()
    # fixed: the build runs the test, then writes the table
    (root / "tests/unit/orders.yml").write_text(UNIT, encoding="utf-8")
    code, out, err = pipe(capsys, root, "build")
    assert code == 0, out + err
    steps = {s["id"]: s for s in run_results(root)["steps"]}
    assert steps["unit.orders_merge_the_latest_versions"]["state"] == "success" and steps["table.orders"]["state"] == "success"
    # `pipe run` never runs unit tests; selecting the table brings its unit tests to build and test
    code, out, err = pipe(capsys, root, "ls", "--select", "orders", "--output", "json")
    assert "unit.orders_merge_the_latest_versions" in out


PY_MODEL = '''
from pyspark.sql import functions as F
from pipe.model import ref, source


def model(orders=source("raw_orders"), customers=ref("customers")):
    return orders.join(customers, "customer", "left").withColumn("tier", F.coalesce("tier", F.lit("none")))
'''


def test_a_python_model_is_unit_tested_the_same_way(spark, tmp_path, capsys):
    files = _files()
    del files["tables/orders.sql"]
    files["tables/orders.py"] = PY_MODEL
    # inline CSV this time, and the test beside the table in tables/*.yml
    files["tables/t.yml"] += "\n" + UNIT.replace("""            format: csv
            fixture: customers""", """            format: csv
            rows: |
              customer,tier
              Zoë,gold""")
    del files["tests/unit/orders.yml"]
    # a second test: no customers at all, their columns named by column_types (no rows to infer them from)
    files["tables/t.yml"] += """
      - name: orders_without_customers
        model: orders
        given:
          - input: source('raw_orders')
            rows:
              - {order_id: 7, line: 1, customer: Zoë, country: FR, amount: 1.50, updated_ms: 1, placed_at: 2024-01-02 10:00:00, op: U}
          - input: ref('customers')
            rows: []
            column_types: {customer: STRING, tier: STRING}
        expect:
          rows:
            - {order_id: 7, tier: none}
"""
    root = project(tmp_path, files)
    code, out, err = pipe(capsys, root, "test", "--unit", "--select", "unit:orders_*")
    assert code == 0, out + err
    assert {k: v["state"] for k, v in _unit_results(root).items()} == {
        "unit.orders_merge_the_latest_versions": "success", "unit.orders_without_customers": "success"}
    # a model that fails on the given rows: said at its line, as the unit test's failure
    (root / "tables/orders.py").write_text(PY_MODEL.replace("    return orders.join", "    raise KeyError('tier')\n    return orders.join"),
                                           encoding="utf-8")
    code, out, err = pipe(capsys, root, "test", "--unit", "--select", "unit:orders_without_customers")
    assert code == 1, out + err
    assert_clean(out, err)
    assert "unit test orders_without_customers: orders failed on the given rows: tables/orders.py:7: table orders: model() failed: KeyError: 'tier'" in err


def test_mistakes_in_unit_tests_are_reported_at_their_line(tmp_path):
    unit = """
unit_tests:
  - name: t1
    model: ordrs
    given: []
    expect: {rows: []}
  - name: t2
    model: orders
    given:
      - input: source('raw_orders')
        rows:
          - {order_id: 1, amout: 3}
          - {order_id: x1}
      - input: source('raw_customers')
        rows: []
    expect:
      rows:
        - {order_id: 1, totl: 3}
  - name: t3
    model: orders
    given:
      - input: ref('customers')
        format: csv
        rows: |
          customer,tier
          a,b,c
    expect: {rows: []}
  - name: t4
    model: orders
    givn: []
  - name: t5
    model: orders
    given:
      - input: this
        rows:
          - {line: 1, customer: a}
      - input: source('raw_orders')
        rows: []
      - input: ref('customers')
        rows: []
    expect: {rows: []}
  - name: t6
    model: orders
    given:
      - input: this
        rows:
          - {order_id: 1, line: 1, updated_ms: 1, country: FR, tierr: gold}
      - input: source('raw_orders')
        rows: []
      - input: ref('customers')
        rows:
          - {customer: a, tierr: gold}
    expect: {rows: []}
"""
    root = project(tmp_path, {**_files(unit=unit)})
    diags = [(str(d.location), d.message, d.hint) for d in compile_errors(root) if d.location.file == "tests/unit/orders.yml"]
    said = "\n".join(f"{loc}: {m} ({h})" for loc, m, h in diags)
    assert "tests/unit/orders.yml:3:12: unit test 't1': model 'ordrs' is not a table of the project" in said, said
    assert "did you mean 'orders'" in said.lower()
    assert "tests/unit/orders.yml:11:13: source('raw_orders') in unit test 't2': 'amout' is not a column of it (did you mean 'amount'?" in said, said
    assert "tests/unit/orders.yml:12:13: source('raw_orders') in unit test 't2': order_id = 'x1' does not fit its type bigint: not an integer" in said
    assert "unit test 't2': orders does not read source('raw_customers')" in said
    assert "unit test 't2' gives no rows for ref('customers'), which orders reads" in said
    assert "unit test 't2': expect names column 'totl', which orders does not have" in said
    assert "tests/unit/orders.yml:25: ref('customers') in unit test 't3': 3 values for 2 columns (customer, tier)" in said
    assert "tests/unit/orders.yml:29:5: unknown key 'givn' in a unit test (did you mean 'given'?)" in said
    assert "this in unit test 't5': no column 'order_id', which the table's key names" in said
    assert "this in unit test 't5': no column 'updated_ms', which the table's precombine names" in said
    assert "ref('customers') in unit test 't5': no rows and no columns" in said
    assert "unit test 't6': this gives column 'tierr', which orders does not have (did you mean 'tier'?)" in said
    assert "unit test 't6': ref('customers') gives column 'tierr', which customers does not have (did you mean 'tier'?)" in said
    # and the command says it without a traceback, exit 2
    from pipe.cli import main

    assert main(["compile", "--project-dir", str(root)]) == 2


def test_record_writes_a_unit_test_from_the_lake_that_passes_and_catches_a_later_change(spark, tmp_path, capsys):
    import yaml

    files = _files()
    del files["tests/unit/orders.yml"]
    files["tables/t.yml"] = files["tables/t.yml"].replace("        delete_when:", '        schema: "order_id BIGINT, line INT, customer STRING, '
                                                          'country STRING, amount DECIMAL(12,2), updated_ms BIGINT, placed_at TIMESTAMP, op STRING, '
                                                          'tier STRING"\n        delete_when:')
    root = project(tmp_path, files)
    write_jsonl(root / "data/customers/c.json", [{"customer": "Zoë", "tier": "gold"}, {"customer": "O'Brien", "tier": "silver"}])
    orders = [{"order_id": i, "line": 1 + i % 2, "customer": ["Zoë", "O'Brien", "Ann"][i % 3], "country": ["FR", "IE", "PL"][i % 3],
               "amount": f"{i}.{i % 100:02d}", "updated_ms": 1_700_000_000_000 + i, "placed_at": "2024-01-02T10:00:00Z", "op": "U"}
              for i in range(1, 300)]
    write_jsonl(root / "data/orders/o.json", orders)
    code, out, err = pipe(capsys, root, "run")
    assert code == 0, out + err
    code, out, err = pipe(capsys, root, "test", "--record", "orders", "--rows", "6", "--this")
    assert code == 0, out + err
    assert "recorded unit test orders_recorded in tests/unit/orders_recorded.yml" in out
    doc = yaml.safe_load((root / "tests/unit/orders_recorded.yml").read_text(encoding="utf-8"))
    test = doc["unit_tests"][0]
    inputs = {g["input"]: g for g in test["given"]}
    assert set(inputs) == {"source('raw_orders')", "ref('customers')", "this"}
    assert len(inputs["source('raw_orders')"]["rows"]) == 6 and "column_types" not in inputs["source('raw_orders')"]  # declared schema
    assert inputs["ref('customers')"]["column_types"] == {"customer": "string", "tier": "string"}
    assert [r["order_id"] for r in inputs["this"]["rows"]] == [1, 2, 3, 4, 5, 6] and "column_types" not in inputs["this"]
    assert inputs["this"]["rows"][0]["placed_at"] == "2024-01-02 10:00:00"  # as written, in the session's zone
    assert inputs["this"]["rows"][0]["amount"] == "1.01"  # a decimal kept exact, as text
    assert {r["order_id"] for r in test["expect"]["rows"]} == {1, 2, 3, 4, 5, 6}
    code, out, err = pipe(capsys, root, "test", "--unit", "--select", "unit:orders_recorded")
    assert code == 0, out + err
    # a change to the table's SQL that changes its rows fails the recorded test
    (root / "tables/orders.sql").write_text(ORDERS_SQL.replace("o.amount,", "o.amount * 2 as amount,"), encoding="utf-8")
    code, out, err = pipe(capsys, root, "test", "--unit")
    assert code == 1 and "orders after the write differs from expect: 6 expected rows missing (-), 6 rows not expected (+)" in out + err
    # recording twice under one name is refused
    code, out, err = pipe(capsys, root, "test", "--record", "orders")
    assert code == 2 and "tests/unit/orders_recorded.yml exists already" in err


def test_unit_tests_in_pipe_diff_are_metadata_only_and_a_seed_is_not_unit_tested(tmp_path):
    from compiler import compile_project
    from compiler.diff import diff_plans

    root = project(tmp_path, _files())
    base = compile_project(root).plan
    (root / "tests/unit/orders.yml").write_text(UNIT.replace("amount: 12.00, tier: gold}", "amount: 12.50, tier: gold}"), encoding="utf-8")
    head = compile_project(root).plan
    changed = {d.id: d for d in diff_plans(base, head).steps if d.status != "unchanged"}
    assert set(changed) == {"unit.orders_merge_the_latest_versions"}
    d = changed["unit.orders_merge_the_latest_versions"]
    assert d.cls == "metadata-only" and [c.field for c in d.changes] == ["expected"]
    (root / "tests/unit/orders.yml").unlink()
    gone = {d.id: d for d in diff_plans(base, compile_project(root).plan).steps if d.status == "removed"}
    assert gone["unit.orders_merge_the_latest_versions"].cls == "metadata-only"
    # a seed has no query to test
    (root / "seeds").mkdir()
    (root / "seeds/tiers.csv").write_text("tier,rank\ngold,1\n", encoding="utf-8")
    (root / "tests/unit/tiers.yml").write_text("unit_tests:\n  - name: t\n    model: tiers\n    given: []\n    expect: {rows: []}\n", encoding="utf-8")
    diags = [f"{d.location}: {d.message}" for d in compile_errors(root)]
    assert any(m.startswith("tests/unit/tiers.yml:3:12: unit test 't': tiers is a seed") for m in diags), diags


def test_insert_duplicates_drop_is_what_a_unit_test_of_an_insert_table_sees(spark, tmp_path, capsys):
    """An insert table that drops keys already stored: a key given in `this` keeps its stored
    row, a new key is inserted; a SELECT-only check (dbt's) would expect both incoming rows."""
    root = project(tmp_path, {
        "sources/raw.yml": """
            sources:
              raw_events:
                kind: files
                path: data/events
                format: json
                schema: "event_id BIGINT, kind STRING, at_ms BIGINT"
            """,
        "tables/events.yml": """
            tables:
              events:
                key: [event_id]
                operation: insert
                insert_duplicates: drop
            """,
        "tables/events.sql": "select event_id, upper(kind) as kind, at_ms from {{ source('raw_events') }}\n",
        "tests/unit/events.yml": """
            unit_tests:
              - name: stored_keys_are_not_inserted_again
                model: events
                given:
                  - input: this
                    rows:
                      - {event_id: 1, kind: OPENED, at_ms: 1700000000000}
                  - input: source('raw_events')
                    rows:
                      - {event_id: 1, kind: closed, at_ms: 1700000999000}
                      - {event_id: 2, kind: opened, at_ms: 1700000001000}
                expect:
                  rows:
                    - {event_id: 1, kind: OPENED, at_ms: 1700000000000}
                    - {event_id: 2, kind: OPENED, at_ms: 1700000001000}
            """,
    })
    code, out, err = pipe(capsys, root, "test", "--unit")
    assert code == 0, out + err
    assert _unit_results(root)["unit.stored_keys_are_not_inserted_again"]["state"] == "success"
