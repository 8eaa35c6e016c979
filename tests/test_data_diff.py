"""`pipe diff --data BASE:HEAD`: one project with two targets (two lakes) built by real `pipe run`s,
then dev changed (updates of decimals, timestamps, nulls and accented text, deletes, inserts,
partition moves) and compared with prod: exact counts on 100,000 rows with a composite key,
mismatches per column, samples, a partition-scoped table, a keyless one, tables on one side only,
the inputs check (a deferred dev run reads prod's inputs), the three outputs and the gates."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipe.cli import main
from tests.conftest import write_project

pytestmark = pytest.mark.spark

ROWS = 100_000
INSERTS = 100

# The session fixture runs local[2] with 4 shuffle partitions; the targets ask for the same, so
# that `getOrCreate` in the CLI returns the shared session.
PROJECT = """
    name: dd
    default_target: dev
    targets:
      prod:
        lake: lake_prod
        spark: {master: "local[2]", conf: {spark.sql.shuffle.partitions: 4}}
      dev:
        lake: lake_dev
        spark: {master: "local[2]", conf: {spark.sql.shuffle.partitions: 4}}
    """

FILES = {
    "pipe_project.yml": PROJECT,
    "sources/s.yml": """
        sources:
          orders_src:
            kind: files
            path: "data/{{ target.name }}/orders"
            format: parquet
            schema: "order_id BIGINT, line INT, region STRING, amount DECIMAL(12,2), updated_at TIMESTAMP, note STRING, op STRING"
          customers_src:
            kind: files
            path: data/customers
            format: parquet
            schema: "customer_id BIGINT, name STRING"
        """,
    "tables/orders.yml": """
        tables:
          orders:
            key: [order_id, line]
            precombine: updated_at
            partition_by: [region]
            delete_when: "op = 'D'"
        """,
    "tables/orders.sql": "select * from {{ source('orders_src') }}\n",
    # keys unique per partition: matched by key and partition, a move is a removed and an added row
    "tables/orders_by_region.yml": """
        tables:
          orders_by_region:
            key: [order_id, line]
            partition_by: [region]
            index: partition
            operation: insert_overwrite_table
        """,
    "tables/orders_by_region.sql": "select order_id, line, region, amount from {{ ref('orders') }}\n",
    # no record key: compared as whole rows
    "tables/revenue.yml": "tables:\n  revenue:\n    operation: insert_overwrite_table\n",
    "tables/revenue.sql": "select region, sum(amount) as amount, count(*) as n from {{ ref('orders') }} group by region\n",
    # built in dev with --defer prod: it reads prod's orders, as prod's own build did
    "tables/region_counts.yml": "tables:\n  region_counts:\n    key: [region]\n    operation: insert_overwrite_table\n",
    "tables/region_counts.sql": "select region, count(*) as n from {{ ref('orders') }} group by region\n",
    # the same input files in both targets; dev's definition has one more column
    "tables/customers.yml": "tables:\n  customers:\n    key: [customer_id]\n",
    "tables/customers.sql": ("select customer_id, name{% if target.name == 'dev' %}, upper(name) as name_upper{% endif %} "
                             "from {{ source('customers_src') }}\n"),
    "tables/dev_only.sql": "select customer_id from {{ ref('customers') }}\n",
    "tables/unbuilt.sql": "select customer_id from {{ ref('customers') }}\n",
}

# prod's rows: row i is order i div 4, line i % 4
BASE_SQL = """
select cast(id div 4 as bigint) as order_id, cast(id % 4 as int) as line,
  element_at(array('EU', 'US', 'APAC', 'LATAM', 'MEA'), cast(id % 5 as int) + 1) as region,
  cast(id * 0.37 as decimal(12,2)) as amount,
  timestamp_micros(1767225600000000 + id * 1000003) as updated_at,
  case when id % 97 = 0 then null else concat('O''Brien "é" #', id) end as note,
  'U' as op
from range({start}, {end})
"""

# dev's second batch: the rows of these sets of i changed (each rule below), deletes and new keys
RULES = {"amount": 500, "note": 700, "null": 800, "move": 900, "delete": 1000, "ts": 1100, "same": 1200}
OFFSET = {"amount": 7, "note": 11, "null": 3, "move": 5, "delete": 1, "ts": 9, "same": 2}
CHANGES_SQL = """
with c as (
  select *, id % 500 = 7 as a, id % 700 = 11 as nt, id % 800 = 3 as nul, id % 900 = 5 as m, id % 1000 = 1 as d,
         id % 1100 = 9 as t, id % 1200 = 2 as same
  from (select *, order_id * 4 + line as id from ({base}))
)
select order_id, line,
  case when m then case region when 'EU' then 'US' else 'EU' end else region end as region,
  cast(case when a then amount + 0.01 else amount end as decimal(12,2)) as amount,
  case when a or nt or nul or m or t or d then updated_at + interval 1 microsecond else updated_at end as updated_at,
  case when nul then null when nt then coalesce(replace(note, 'é', 'e\u0301'), 'now set') else note end as note,
  case when d then 'D' else 'U' end as op
from c where a or nt or nul or m or d or t or same
union all
{inserts}
"""


def _in(rule: str, i: int) -> bool:
    return i % RULES[rule] == OFFSET[rule]


def _note(i: int) -> str | None:
    return None if i % 97 == 0 else f'O\'Brien "é" #{i}'


def _dev_note(i: int) -> str | None:
    if _in("null", i):
        return None
    if _in("note", i):
        return _note(i).replace("é", "e\u0301") if _note(i) is not None else "now set"
    return _note(i)


def _amount(i: int, plus: int = 0) -> str:
    cents = i * 37 + plus
    return f"{cents // 100}.{cents % 100:02d}"


REGIONS = ("EU", "US", "APAC", "LATAM", "MEA")
DELETED = {i for i in range(ROWS) if _in("delete", i)}
UPDATED = {i for i in range(ROWS) if any(_in(r, i) for r in ("amount", "note", "null", "move", "ts"))} - DELETED
MOVED = {i for i in UPDATED if _in("move", i)}
ADDED = set(range(ROWS, ROWS + INSERTS))


def pipe(root: Path, *args: str) -> int:
    return main([*args, "--project-dir", str(root)])


def run(root: Path, *args: str) -> None:
    code = pipe(root, "run", *args)
    assert code == 0, f"pipe run {' '.join(args)} exited {code}"


def _parquet(spark, sql: str, folder: Path, name: str) -> None:
    tmp = folder.parent / f".{name}.tmp"
    spark.sql(sql).coalesce(1).write.mode("overwrite").parquet(str(tmp))
    folder.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(sorted(tmp.glob("*.parquet"))):
        os.replace(f, folder / f"{name}-{n}.parquet")
    shutil.rmtree(tmp)


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """The project, built in prod and dev alike, then dev's orders changed by a second batch
    (and what reads them rebuilt), and region_counts built in dev with --defer prod."""
    root = write_project(tmp_path_factory.mktemp("data-diff") / "dd", FILES)
    base = BASE_SQL.format(start=0, end=ROWS)
    _parquet(spark, base, root / "data/prod/orders", "orders")
    shutil.copytree(root / "data/prod/orders", root / "data/dev/orders")
    _parquet(spark, "select id as customer_id, concat('Zoë ', id) as name from range(1000)", root / "data/customers", "customers")
    run(root, "--target", "prod", "--exclude", "dev_only", "unbuilt")
    run(root, "--target", "dev", "--exclude", "unbuilt", "region_counts")
    changes = CHANGES_SQL.format(base=base, inserts=BASE_SQL.format(start=ROWS, end=ROWS + INSERTS))
    _parquet(spark, changes, root / "data/dev/orders", "changes")
    run(root, "--target", "dev", "--select", "orders", "orders_by_region", "revenue")
    run(root, "--target", "dev", "--select", "region_counts", "--defer", "prod")
    return root


def diff(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = pipe(root, "diff", "--data", "prod:dev", *args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


@pytest.fixture(scope="module")
def everything(built):
    """`pipe diff --data prod:dev --format json` of every table, read once for the module."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = pipe(built, "diff", "--data", "prod:dev", "--format", "json")
    assert code == 0, buf.getvalue()
    doc = json.loads(buf.getvalue())
    return doc, {t["table"]: t for t in doc["tables"]}


def test_rows_are_matched_by_composite_key_and_every_kind_of_change_counts_exactly(everything):
    doc, tables = everything
    assert doc["data_diff_schema_version"] == 1 and (doc["base"], doc["head"]) == ("prod", "dev")
    orders = tables["orders"]
    # matched by the key's columns (what _hoodie_record_key is made of), typed
    assert orders["status"] == "compared" and orders["join_on"] == ["order_id", "line"]
    assert orders["rows"] == {"base": ROWS, "head": ROWS - len(DELETED) + INSERTS, "added": INSERTS, "removed": len(DELETED),
                              "changed": len(UPDATED), "unchanged": ROWS - len(DELETED) - len(UPDATED), "moved": len(MOVED)}
    mismatches = {c["name"]: c["mismatches"] for c in orders["columns"]}
    assert mismatches == {
        "order_id": 0, "line": 0, "op": 0,
        "region": len(MOVED),
        "amount": sum(1 for i in UPDATED if _in("amount", i)),  # decimals: one cent
        "updated_at": len(UPDATED),  # timestamps: one microsecond
        # nulls both ways (a null made null again is no change), quotes, and é written as e + U+0301
        "note": sum(1 for i in UPDATED if _dev_note(i) != _note(i)),
    }
    amount = next(c for c in orders["columns"] if c["name"] == "amount")
    assert amount["rate"] == pytest.approx(amount["mismatches"] / (ROWS - len(DELETED)))
    assert amount["base_type"] == amount["head_type"] == "decimal(12,2)"
    # column lineage: the downstream columns computed from it
    assert amount["reaches"] == ["orders_by_region.amount", "revenue.amount"]
    assert next(c for c in orders["columns"] if c["name"] == "note")["reaches"] == []
    assert orders["added_columns"] == orders["dropped_columns"] == []


def test_samples_are_the_rows_of_smallest_keys_with_the_values_of_each_side(everything):
    _, tables = everything
    samples = tables["orders"]["samples"]
    # in the order of the key's values (row i is order i div 4, line i % 4: the order of i)
    assert [(r["order_id"], r["line"]) for r in samples["removed"]] == [(i // 4, i % 4) for i in sorted(DELETED)[:5]]
    assert [(r["order_id"], r["line"]) for r in samples["added"]] == [(i // 4, i % 4) for i in sorted(ADDED)[:5]]
    first = min(ADDED)
    assert samples["added"][0] | {"updated_at": None} == {
        "order_id": first // 4, "line": first % 4, "region": REGIONS[first % 5], "amount": _amount(first), "updated_at": None,
        "note": _note(first), "op": "U"}
    changed = sorted(UPDATED)[:5]
    assert [(r["order_id"], r["line"]) for r in samples["changed"]] == [(i // 4, i % 4) for i in changed]
    for i, row in zip(changed, samples["changed"]):
        want = {"order_id", "line", "updated_at"}
        want |= {"amount"} if _in("amount", i) else set()
        want |= {"region"} if i in MOVED else set()
        want |= {"note"} if _dev_note(i) != _note(i) else set()
        assert set(row) == want, (i, row)
        if "amount" in row:
            assert row["amount"] == {"base": _amount(i), "head": _amount(i, 1)}
        if "note" in row:
            assert row["note"] == {"base": _note(i), "head": _dev_note(i)}
        if "region" in row:
            assert row["region"]["base"] == REGIONS[i % 5] and row["region"]["head"] != row["region"]["base"]


def test_a_partition_scoped_table_counts_a_move_as_removed_and_added(everything):
    _, tables = everything
    t = tables["orders_by_region"]
    assert t["join_on"] == ["order_id", "line", "region"]
    assert t["rows"] == {"base": ROWS, "head": ROWS - len(DELETED) + INSERTS, "added": INSERTS + len(MOVED),
                         "removed": len(DELETED) + len(MOVED), "changed": sum(1 for i in UPDATED - MOVED if _in("amount", i)),
                         "unchanged": ROWS - len(DELETED) - len(MOVED) - sum(1 for i in UPDATED - MOVED if _in("amount", i)),
                         "moved": None}
    assert any("matched by key and partition" in n for n in t["notes"])


def test_a_keyless_table_is_compared_as_whole_rows(everything):
    _, tables = everything
    t = tables["revenue"]
    assert t["join_on"] == [] and t["rows"]["changed"] is None
    # every region's sum and count changed: each old row is removed, each new one added
    assert (t["rows"]["base"], t["rows"]["head"], t["rows"]["added"], t["rows"]["removed"], t["rows"]["unchanged"]) == (5, 5, 5, 5, 0)
    assert sorted(r["region"] for r in t["samples"]["removed"]) == sorted(REGIONS)


def test_tables_on_one_side_a_new_column_and_what_each_side_was_built_from(everything):
    doc, tables = everything
    assert tables["dev_only"]["status"] == "only_in_head" and tables["dev_only"]["rows"]["base"] is None
    assert tables["unbuilt"]["status"] == "in_neither"
    assert doc["summary"] == {"compared": 5, "different": 4, "only_in_base": 0, "only_in_head": 1, "in_neither": 1}
    customers = tables["customers"]
    assert customers["added_columns"] == ["name_upper"] and customers["rows"]["changed"] == 0
    # the same files, read by another definition of the table
    assert customers["inputs"]["same"] is True and customers["inputs"]["same_definition"] is False
    # dev read prod's orders (--defer prod) at the instant prod's own build read them
    counts = tables["region_counts"]
    assert counts["inputs"]["same"] is True and counts["inputs"]["same_definition"] is True
    assert counts["rows"]["changed"] == counts["rows"]["added"] == counts["rows"]["removed"] == 0
    # each built from its own lake's orders
    [read] = tables["revenue"]["inputs"]["changes"]
    assert (read["name"], read["base_from"], read["head_from"]) == ("orders", "prod", "dev")
    assert tables["revenue"]["inputs"]["same"] is False
    [src] = tables["orders"]["inputs"]["changes"]
    assert src["name"] == "orders_src" and src["base_from"] == src["head_from"] == ""


def test_markdown_section_and_a_gate_that_trips(built, capsys):
    code, out, _ = diff(capsys, built, "--select", "orders", "customers", "dev_only", "--format", "markdown",
                        "--fail-on-data", "changed_rows > 0.5%, removed_rows > 1000", "--fail-on-data", "mismatch.amount >= 200")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "### pipe diff --data `prod` → `dev`"
    row = next(l for l in lines if l.startswith("| `orders` |"))
    assert row.startswith(f"| `orders` | 100,000 | 100,000 | 100 | 100 | {len(UPDATED):,} ({len(UPDATED) / ROWS:.2%}) | ")
    assert "`amount` 200 (0.20%) → `orders_by_region.amount`, `revenue.amount`" in row and row.endswith("| differ: orders_src |")
    assert "| `customers` | 1,000 | 1,000 | 0 | 0 | 0 (0.00%) | + `name_upper` (only in dev) | same (other definition) |" in lines
    assert "- `dev_only`: only in dev" in lines
    failed = lines[lines.index("**Data gates failed**") + 2:]
    assert failed[:2] == [f"- orders: changed_rows {len(UPDATED):,} > 0.5% (0.5% of 100,000 base rows = 500.0)",
                          "- orders: mismatch.amount 200 >= 200"]
    assert "<details><summary>Sample rows</summary>" in lines
    # é written as e + U+0301 prints as é does: the sample shows both with escapes
    accent = min(i for i in UPDATED if _in("note", i) and not _in("null", i) and _note(i))
    assert accent in sorted(UPDATED)[:5]
    assert f"| `order_id={accent // 4}, line={accent % 4}` | `note` | 'O\\'Brien \"\\xe9\" #{accent}' | 'O\\'Brien \"e\\u0301\" #{accent}' |" in lines


def test_gates_exit_0_when_nothing_trips_and_name_what_trips_in_text(built, capsys):
    code, out, _ = diff(capsys, built, "--select", "revenue", "region_counts", "customers",
                        "--fail-on-data", "added_rows >= 100", "--fail-on-data", "mismatch.n > 0")
    assert code == 0, out
    assert "= region_counts  5 rows in prod, 5 in dev  no differences" in out
    assert "inputs: built from the same inputs by the same definition" in out
    assert "revenue  5 rows in prod, 5 in dev" in out and "inputs differ: orders at " in out
    assert "gate failed" not in out
    code, out, _ = diff(capsys, built, "--select", "revenue", "--fail-on-data", "removed_rows > 0", "--samples", "0")
    assert code == 1 and "gate failed revenue: removed_rows 5 > 0" in out and "removed (" not in out


@pytest.mark.parametrize("args, said", [
    (["--fail-on-data", "changed_rows >> 1"], "--fail-on-data: cannot read 'changed_rows >> 1'"),
    (["--fail-on-data", "rows_changed > 1"], "--fail-on-data: unknown metric 'rows_changed'"),
    (["--fail-on-data", "mismatch.amuont > 0"], "--fail-on-data: no table compared has a column 'amuont'"),
    (["--select", "unbuilt"], "no selected table is built in prod or in dev (unbuilt)"),
    (["--select", "nope"], "nope"),
    (["--base-ref", "main"], "--data compares two targets' tables; --base-ref belongs to a plan diff"),
])
def test_mistakes_exit_2_with_a_message_and_no_traceback(built, capsys, args, said):
    code, out, err = diff(capsys, built, *args)
    assert code == 2 and out == "", (out, err)
    assert said in err and "Traceback" not in err, err


def test_unknown_targets_and_misplaced_options_exit_2(built, capsys):
    capsys.readouterr()
    for args, said in ((["--data", "prod:stage"], "unknown target 'stage'"), (["--data", "prod"], "--data 'prod' is not BASE:HEAD"),
                       (["--select", "orders"], "--select belongs to a data diff")):
        code = pipe(built, "diff", *args)
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, err


def test_texts_that_print_alike_are_shown_with_escapes():
    from pipe.data_diff_output import _pair

    assert _pair('O\'Brien "é"', 'O\'Brien "e\u0301"') == ("'O\\'Brien \"\\xe9\"'", "'O\\'Brien \"e\\u0301\"'")
    assert _pair("a", None) == ("'a'", "null")


def test_sides_that_differ_in_key_partitioning_and_columns_are_compared_anyway_and_say_so(spark, tmp_path):
    """Two tables written directly: the head keyed by (id, region) where the base is keyed by id,
    partitioned otherwise, a column retyped, one dropped, one added, and a map column."""
    from runtime.data_diff import compare
    from runtime.table import Table, TableConfig

    rows = "select id, element_at(array('EU', 'US'), cast(id % 2 as int) + 1) as region, map('k', id) as tags, "
    base_df = spark.sql(rows + "cast(id as int) as qty, 'x' as legacy from range(6)")
    head_df = spark.sql(rows + "cast(id as bigint) + if(id = 3, 1, 0) as qty, 'y' as fresh from range(6)")
    base = Table.create(spark, str(tmp_path / "base"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("region",)))
    base.write(base_df, "upsert")
    head = Table.create(spark, str(tmp_path / "head"), TableConfig(name="t", record_key_fields=("id", "region")))
    head.write(head_df, "upsert")
    d = compare(spark, "t", Table.open(spark, str(tmp_path / "base")), Table.open(spark, str(tmp_path / "head")), labels=("prod", "dev"))
    # the key texts differ ("3" against "id:3,region:US"): no row matches, and the notes say why
    assert d.join_on == ("_hoodie_record_key",)
    assert (d.base_rows, d.head_rows, d.added_rows, d.removed_rows, d.changed_rows) == (6, 6, 6, 6, 0)
    assert any(n.startswith("the record key differs (prod: [id], dev: [id, region])") for n in d.notes)
    assert any(n.startswith("the partitioning differs (prod: [region], dev: [])") for n in d.notes)
    assert any(n.startswith("column qty is int in prod and bigint in dev: compared by value") for n in d.notes)
    assert d.added_columns == ("fresh",) and d.dropped_columns == ("legacy",)
    assert [r["id"] for r in d.samples["removed"]] == [0, 1, 2, 3, 4]  # by key text: "0" < "1" < ...
    # the same tables matched by their common key column: the map and the retyped column compared
    same = TableConfig(name="t", record_key_fields=("id",))
    Table.create(spark, str(tmp_path / "head2"), same).write(head_df, "upsert")
    d = compare(spark, "t", Table.open(spark, str(tmp_path / "base")), Table.open(spark, str(tmp_path / "head2")))
    assert d.join_on == ("id",)
    assert (d.added_rows, d.removed_rows, d.changed_rows, d.unchanged_rows) == (0, 0, 1, 5)
    assert {c.name: c.mismatches for c in d.columns} == {"id": 0, "region": 0, "tags": 0, "qty": 1}
    assert d.samples["changed"] == ({"id": 3, "qty": {"base": 3, "head": 4}},)
