"""`kind: table` sources with `changes: true`: the upstream's change feed, deletes and moves
included, and an incremental daily aggregate built on it that stays equal to a full
recomputation through upserts, deletes, moves and late updates."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
from decimal import Decimal

import pytest

from pipe.cli import main
from tests.test_run import assert_rows, pipe_rows, project, steps, write_jsonl

FILES = {
    "sources/shop.yml": """
        sources:
          raw_orders:
            kind: files
            path: data/orders
            format: json
            schema: "order_id BIGINT, customer_id BIGINT, amount DECIMAL(10,2), status STRING, order_date DATE, updated_at TIMESTAMP"
          order_changes:
            kind: table
            table: orders
            changes: true
        """,
    "tables/orders.yml": """
        tables:
          orders:
            key: [order_id]
            precombine: updated_at
            partition_by: [order_date]
            delete_when: "status = 'cancelled'"
        """,
    "tables/orders.sql": "select * from {{ source('raw_orders') }}\n",
    # the days the changes touch (before- and after-images), recomputed from the orders
    "tables/daily.yml": """
        tables:
          daily:
            key: [order_date]
            delete_when: "orders = 0"
        """,
    "tables/daily.sql": """
        with touched as (select distinct order_date from {{ source('order_changes') }})
        select t.order_date, count(o.order_id) as orders, coalesce(sum(o.amount), 0) as revenue
        from touched t left join {{ ref('orders') }} o on o.order_date = t.order_date
        group by t.order_date
        """,
    # every change row, appended
    "tables/order_log.yml": """
        tables:
          order_log:
            operation: insert
        """,
    "tables/order_log.sql": "select order_id, order_date, amount, _change_type from {{ source('order_changes') }}\n",
}


def _order(order_id, day, amount, hour, status="placed"):
    return {"order_id": order_id, "customer_id": 100 + order_id % 7, "amount": amount, "status": status,
            "order_date": f"2024-03-{day:02d}", "updated_at": f"2024-03-{day:02d}T{hour:02d}:00:00Z"}


ROUNDS = [
    # 1. the first orders, over three days
    [_order(1, 1, 10.5, 8), _order(2, 1, 20.25, 9), _order(3, 2, 30.0, 8), _order(4, 2, 40.0, 9), _order(5, 3, 55.55, 8),
     _order(6, 1, 1.0, 10)],
    # 2. upserts: an amount changes, a new day appears
    [_order(1, 1, 12.5, 11), _order(7, 4, 70.0, 8)],
    # 3. deletes: the only order of day 4, and one of day 1
    [_order(7, 4, 70.0, 12, "cancelled"), _order(6, 1, 1.0, 12, "cancelled")],
    # 4. moves: order 2 from day 1 to day 2; order 5, the only one of day 3, to day 5
    [{**_order(2, 2, 20.25, 13)}, {**_order(5, 5, 55.55, 13)}],
    # 5. a late, stale update (ignored), a new order on an emptied day, a cancel and a move
    [{**_order(3, 2, 999.0, 1)}, _order(8, 3, 8.0, 14), _order(4, 2, 40.0, 15, "cancelled"), {**_order(1, 6, 12.5, 15)}],
]


def _recomputed(spark, root) -> list[tuple]:
    rows = pipe_rows(spark, root, "orders", ["order_date", "amount"])
    days: dict = {}
    for day, amount in rows:
        n, total = days.get(day, (0, Decimal(0)))
        days[day] = (n + 1, total + amount)
    return sorted((day, n, total) for day, (n, total) in days.items())


# `pipe migrate orders` between rounds (after the round of that index): the consumers' checkpoints
# change form (an instant time on version 6, `<instant>_<completion>` on 8 and 9) and hold
MIGRATIONS = {1: 9, 2: 6, 3: 8}


def _migrate(root, to: int) -> str:
    """`pipe migrate orders --to N`, first with --dry-run (which changes nothing); the output."""
    props = root / "lake/orders/.hoodie/hoodie.properties"
    before = props.read_bytes()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["migrate", "orders", "--to", str(to), "--dry-run", "--project-dir", str(root)]) == 0
        assert props.read_bytes() == before, "--dry-run changed hoodie.properties"
        assert main(["migrate", "orders", "--to", str(to), "--project-dir", str(root)]) == 0
    return out.getvalue()


@pytest.fixture(scope="module", params=[6, 9, "migrated"], ids=["version6", "version9", "migrated"])
def rounds(request, spark, tmp_path_factory):
    """The project after each of the five rounds: (daily rows, recomputed daily rows, log rows);
    the orders table at version 6, at version 9 (Hudi 1.x: the feed's window and checkpoints
    are completion times), and migrated between them after rounds 2, 3 and 4 (MIGRATIONS)."""
    files = dict(FILES)
    if request.param == 9:
        files["tables/orders.yml"] = FILES["tables/orders.yml"].replace("key: [order_id]", f"key: [order_id]\n            table_version: {request.param}")
    root = project(tmp_path_factory.mktemp("cdc"), files)
    out = []
    version = 6 if request.param == "migrated" else request.param
    for i, rows in enumerate(ROUNDS):
        write_jsonl(root / f"data/orders/round-{i}.json", rows, mtime=1_700_000_000 + 60 * i)
        assert main(["run", "--project-dir", str(root)]) == 0, steps(root)
        assert f"hoodie.table.version={version}" in (root / "lake/orders/.hoodie/hoodie.properties").read_text()
        if request.param == "migrated" and i in MIGRATIONS:
            said = _migrate(root, MIGRATIONS[i])
            assert f"orders: version {version} -> {MIGRATIONS[i]} would" in said, said
            assert f"migrated orders from version {version} to {MIGRATIONS[i]} (commit " in said, said
            version = MIGRATIONS[i]
        out.append((pipe_rows(spark, root, "daily", ["order_date", "orders", "revenue"]), _recomputed(spark, root),
                    pipe_rows(spark, root, "order_log", ["order_id", "order_date", "amount", "_change_type"]), steps(root)))
    return root, out


def test_an_incremental_daily_aggregate_equals_a_full_recomputation_after_every_round(rounds):
    _, out = rounds
    for i, (daily, recomputed, _, _) in enumerate(out):
        assert daily == recomputed, f"round {i + 1}"
    # the emptied days (1: cancelled and moved away; 4: cancelled) are gone, the new ones there
    days = {d for d, *_ in out[-1][0]}
    assert days == {dt.date(2024, 3, d) for d in (2, 3, 5, 6)}


def test_the_change_feed_names_deletes_and_both_sides_of_a_move(rounds):
    _, out = rounds
    d = lambda day: dt.date(2024, 3, day)  # noqa: E731
    first, second, third, fourth = (out[i][2] for i in range(4))
    assert {r[3] for r in first} == {"insert"}
    new = lambda now, before: sorted(set(now) - set(before))  # noqa: E731
    assert new(second, first) == [(1, d(1), Decimal("10.50"), "update_preimage"), (1, d(1), Decimal("12.50"), "update_postimage"),
                                  (7, d(4), Decimal("70.00"), "insert")]
    # a delete carries the deleted row (before-image)
    assert new(third, second) == [(6, d(1), Decimal("1.00"), "delete"), (7, d(4), Decimal("70.00"), "delete")]
    # a row that moved partition: deleted from its old day, inserted into its new one
    assert new(fourth, third) == [(2, d(1), Decimal("20.25"), "delete"), (2, d(2), Decimal("20.25"), "insert"),
                                  (5, d(3), Decimal("55.55"), "delete"), (5, d(5), Decimal("55.55"), "insert")]
    assert {r[3] for r in out[-1][2]} == {"insert", "update_preimage", "update_postimage", "delete"}


def test_change_feed_tables_read_back_with_hudi_rs(rounds, spark):
    root, out = rounds
    daily = out[-1][0]
    assert_rows(spark, root, "daily", ["order_date", "orders", "revenue"], daily)
    # the stale update of round 5 was dropped by orders, so no change reached the feed for it
    assert out[-1][3]["table.daily"]["state"] == "success"


# --- the engine's change feed (Table.read_changes) -----------------------------------------------

ENGINE_SCHEMA = "id bigint, p string, small tinyint, v string"


def _changes(table, since):
    return sorted((r["id"], r["v"], r["_change_type"]) for r in table.read_changes(since).collect())


def test_keys_stored_twice_make_no_phantom_changes(spark, tmp_path):
    from runtime.table import Table, TableConfig

    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    c1 = table.write(spark.createDataFrame([(1, "a", 1, "one"), (1, "a", 1, "one again")], ENGINE_SCHEMA), "insert").instant
    table.write(spark.createDataFrame([(2, "a", 1, "two")], ENGINE_SCHEMA), "insert")  # into the same small file group
    assert _changes(table, c1) == [(2, "two", "insert")]


def test_a_first_commit_without_rows_takes_a_tinyint_column_next(spark, tmp_path):
    from runtime.table import Table, TableConfig

    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    c1 = table.write(spark.createDataFrame([], ENGINE_SCHEMA), "upsert").instant
    table.write(spark.createDataFrame([(1, "a", 7, "x")], ENGINE_SCHEMA), "upsert")
    assert dict(table.read(meta=False).dtypes)["small"] == "tinyint"
    assert _changes(table, c1) == [(1, "x", "insert")]


def test_the_feed_reads_across_a_changed_column_type(spark, tmp_path):
    from runtime.table import Table, TableConfig

    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    c1 = table.write(spark.createDataFrame([(1, "a", 1, "10"), (2, "a", 1, "x")], ENGINE_SCHEMA), "upsert").instant
    retyped = spark.createDataFrame([(1, "a", 1, 11)], "id bigint, p string, small tinyint, v bigint")
    table.write(retyped, "insert_overwrite_table")
    rows = sorted((r["id"], r["v"], r["_change_type"]) for r in table.read_changes(c1).collect())
    # the before-images are cast to the new type (a value that does not convert is null)
    assert rows == [(1, 10, "update_preimage"), (1, 11, "update_postimage"), (2, None, "delete")]


def test_a_feed_whose_before_images_were_cleaned_is_a_lost_checkpoint(spark, tmp_path):
    import pytest as _pytest

    from runtime.sources import SourceError
    from runtime.sources import table as table_source
    from runtime.table import Table, TableConfig

    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("p",)))
    c1 = table.write(spark.createDataFrame([(1, "a", 1, "x")], ENGINE_SCHEMA), "upsert").instant
    for v in ("y", "z"):  # each rewrites the one file group; cleaning keeps only the latest version
        table.write(spark.createDataFrame([(1, "a", 1, v)], ENGINE_SCHEMA), "upsert", clean_retain=1)
    with _pytest.raises(SourceError, match="cleaned"):
        table_source.pending("feed", {"changes": True}, Table.open(spark, table.storage.spec.uri), "down", c1)
    # the plain incremental read (after-images only) needs no older file versions
    assert not table_source.pending("feed", {}, Table.open(spark, table.storage.spec.uri), "down", c1).is_empty
