"""A merge-on-read read of some columns only (Table.read(columns=...), and the views of pipe
run and pipe test, which keep the columns their SQL names: runtime/steps/views.py): the merge of
base and log files reads and merges only those columns and the ones it merges by, and gives
exactly the rows a full read gives, projected; hudi-rs agrees. Checked over rounds of updates
(some older than what is stored: the base row must win), deletes and inserts, for snapshots,
time travel and incremental reads, with decimals, timestamps, nulls, quotes and accents."""

from __future__ import annotations

import datetime as dt
import random
import re
from decimal import Decimal

import hudi
import pyarrow as pa
import pytest

from runtime.steps.views import expression_names, names_used
from runtime.table import Table, TableConfig, TableError
from runtime.table.config import MERGE_ON_READ
from tests.test_run import assert_clean, pipe, project, run_results, write_jsonl

SCHEMA = "id long, region string, ts long, amount decimal(12,2), note string, at timestamp, qty int"
COLUMNS = ["id", "region", "ts", "amount", "note", "at", "qty"]
NOTES = ["plain", "Zoë O'Brien", 'say "hi"', None, "naïve café, ünïcode", ""]


def _row(rng: random.Random, key: tuple[int, str], ts: int) -> tuple:
    i, region = key
    amount = None if rng.random() < 0.1 else Decimal(rng.randrange(-10_000_00, 10_000_00)) / 100
    at = dt.datetime(2026, 1, 1) + dt.timedelta(milliseconds=ts)
    return (i, region, ts, amount, rng.choice(NOTES), at, None if rng.random() < 0.1 else rng.randrange(1000))


def _projected(df_rows, columns: list[str]) -> list[tuple]:
    return sorted((tuple(r[c] for c in columns) for r in df_rows), key=repr)


def _hudi(path, columns: list[str], since: str | None = None) -> list[tuple]:
    t = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    if since is None:
        batches = t.read()
    else:
        batches = t.read(hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental).with_start_timestamp(since))
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    out = []
    for r in rows:
        values = []
        for c in columns:
            v = r[c]
            if c == "at" and v is not None:  # hudi-rs gives the timestamp in UTC with a zone
                v = v.replace(tzinfo=None) if v.tzinfo is None else v.astimezone(dt.timezone.utc).replace(tzinfo=None)
            values.append(v)
        out.append(tuple(values))
    return sorted(out, key=repr)


SUBSETS = [["amount"], ["note", "at"], ["qty", "region"], ["ts"], ["id"], []]


def test_pruned_reads_of_a_merge_on_read_table_are_the_full_reads_projected_round_after_round(spark, tmp_path):
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    rng = random.Random(42)
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", table_type=MERGE_ON_READ, record_key_fields=("id", "region"),
                                                       partition_fields=("region",), precombine_field="ts"))
    stored: dict[tuple[int, str], int] = {}
    next_id = 0
    instants = []
    for round_ in range(8):
        batch = []
        for key in rng.sample(sorted(stored), k=min(len(stored), 400)):  # updates; a fifth older than stored
            ts = stored[key] + (rng.randrange(1, 1000) if rng.random() < 0.8 else -rng.randrange(1, 1000))
            batch.append(_row(rng, key, ts))
        for _ in range(300 if round_ else 2000):
            key = (next_id, rng.choice(["EU", "US", "APAC"]))
            next_id += 1
            batch.append(_row(rng, key, 1_000_000 + round_))
        # no small-file filling: inserts go to new file groups, updates to log files
        instants.append(table.write(spark.createDataFrame(batch, SCHEMA), "upsert", small_file_limit=0).instant)
        for r in batch:
            stored[(r[0], r[1])] = max(stored.get((r[0], r[1]), r[2]), r[2])
        if round_ % 3 == 2:  # deletes by key
            gone = rng.sample(sorted(stored), k=50)
            table.write(spark.createDataFrame([_row(rng, k, stored[k] + 5) for k in gone], SCHEMA), "delete")
            for k in gone:
                del stored[k]
            instants.append(table.timeline().latest_completed().time)
        if round_:
            assert any(s.has_logs for s in table.view().latest_slices()), "some slices must have log files"

        full = table.read(meta=False).collect()
        assert len(full) == len(stored), f"round {round_}"
        for columns in SUBSETS:
            pruned = table.read(meta=False, columns=columns)
            assert pruned.columns == columns
            got = pruned.collect()
            assert _projected(got, columns) == _projected(full, columns), f"round {round_}, columns {columns}"
            if columns:
                assert _projected(got, columns) == _hudi(path, columns), f"round {round_}, hudi-rs, columns {columns}"
        # with the meta columns, time travel, and an incremental read
        with_meta = table.read(columns=["amount"]).collect()
        assert _projected(with_meta, ["_hoodie_record_key", "_hoodie_commit_time", "amount"]) == \
            _projected(table.read().collect(), ["_hoodie_record_key", "_hoodie_commit_time", "amount"])
        if round_ >= 2:
            then = instants[-3]
            assert _projected(table.read(as_of=then, meta=False, columns=["note", "qty"]).collect(), ["note", "qty"]) == \
                _projected(table.read(as_of=then, meta=False).collect(), ["note", "qty"]), f"as of {then}"
            since = instants[-2]
            inc = table.read(since=since, meta=False, columns=["amount", "at"]).collect()
            assert _projected(inc, ["amount", "at"]) == _projected(table.read(since=since, meta=False).collect(), ["amount", "at"])
            assert _projected(inc, ["amount", "at"]) == _hudi(path, ["amount", "at"], since=since), f"incremental since {since}"


def test_named_columns_prune_merge_on_read_tables_only_and_unknown_columns_are_refused(spark, tmp_path):
    config = dict(record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    rows = [(i, "EU", 1, Decimal("1.50"), "x", dt.datetime(2026, 1, 1), i) for i in range(20)]
    mor = Table.create(spark, str(tmp_path / "mor"), TableConfig(name="mor", table_type=MERGE_ON_READ, **config))
    cow = Table.create(spark, str(tmp_path / "cow"), TableConfig(name="cow", **config))
    for t in (mor, cow):
        t.write(spark.createDataFrame(rows, SCHEMA), "upsert")
        t.write(spark.createDataFrame(rows[:5], SCHEMA), "upsert")
    named = frozenset({"amount", "qty", "t", "sum"})  # names a query uses: columns and others
    assert mor.read(meta=False, named=named).columns == ["amount", "qty"]
    # the merge's Python tasks hand Spark only those columns, not the key and ordering field
    # they merge by: Spark cannot prune a Python task's output
    plan = mor.read(meta=False, named=named)._jdf.queryExecution().executedPlan().toString()
    handed = re.search(r"MapInArrow [^\n]*?, \[([^\]]*)\]", plan)
    assert handed and [c.split("#")[0] for c in handed.group(1).split(", ")] == ["amount", "qty"], plan
    assert cow.read(meta=False, named=named).columns == COLUMNS  # Spark prunes base files by itself
    assert mor.read(meta=False, named=None).columns == COLUMNS
    assert mor.read(meta=False, named=named, read_optimized=True).columns == COLUMNS
    assert mor.read(meta=False, columns=["AMOUNT"]).columns == ["amount"]  # as Spark: names are case-insensitive
    with pytest.raises(TableError, match=r"table mor has no column 'amout' \(its columns: id, region, ts, amount"):
        mor.read(columns=["amout"])


def test_names_used_are_every_identifier_or_none_when_the_sql_may_read_unnamed_columns():
    assert names_used(["select o.id, sum(amount) as total from orders o where o.Part = 3 group by o.id"]) == \
        frozenset({"o", "id", "amount", "total", "orders", "part"})
    assert names_used(["select count(*) from t"]) == frozenset({"t"})
    assert names_used(["select payload.amount from t"]) >= {"payload", "amount"}  # a struct's field or a table's column
    assert names_used(["select a from t where exists (select 1 from u where u.k = t.k)"]) >= {"a", "k"}
    for sql in ["select * from t", "select t.* from t", "select struct(*) from t", "select a from x natural join y",
                "select ((( from t", "show tables"]:
        assert names_used([sql]) is None, sql
    assert expression_names(["amount > 0", "note is not null"]) == frozenset({"amount", "note"})


PROJECT = {
    "sources/raw.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            schema: "id BIGINT, region STRING, ts BIGINT, amount DECIMAL(12,2), note STRING, qty INT"
        """,
    "tables/ledger.yml": """
        tables:
          ledger:
            type: merge_on_read
            key: [id]
            precombine: ts
            partition_by: [region]
            small_file_limit: 0
        """,
    "tables/ledger.sql": "select * from {{ source('raw') }}",
    "tables/totals.sql": "select region, sum(amount) as total, count(*) as n from {{ ref('ledger') }} group by region",
    # a column named only in a string: the pruned view lacks it, so the SQL runs on the full view
    "tables/notes.sql": "select id, IDENTIFIER('note') as remark from {{ ref('ledger') }}",
    "tests/totals_positive.sql": "select region from {{ ref('ledger') }} group by region having sum(qty) < 0",
}


def test_pipe_run_reads_only_the_columns_a_model_names_from_a_merge_on_read_table(spark, tmp_path, capsys):
    root = project(tmp_path, PROJECT)
    rng = random.Random(7)
    model: dict[int, dict] = {}
    for round_ in range(4):
        rows = []
        for i in rng.sample(sorted(model), k=min(len(model), 30)) + list(range(round_ * 100, round_ * 100 + 100)):
            old = model.get(i)
            rows.append({"id": i, "region": old["region"] if old else rng.choice(["EU", "US"]), "ts": round_ * 10 + 1,
                         "amount": f"{rng.randrange(0, 100000) / 100:.2f}", "note": rng.choice(NOTES), "qty": rng.randrange(50)})
        for r in rows:
            model[r["id"]] = r
        write_jsonl(root / f"data/raw/round-{round_}.json", rows)
        code, out, err = pipe(capsys, root, "build")
        assert code == 0, f"round {round_}:\n{out}\n{err}"
        assert_clean(out, err)
        steps = {r["id"]: r for r in run_results(root)["steps"]}
        assert run_results(root)["success"] is True
        # the merge read only the columns each model names; the model naming one in a string only read them all
        assert re.fullmatch(r"ledger at \d{17} \(columns region, amount\)", steps["table.totals"]["read"]), steps["table.totals"]
        assert re.fullmatch(r"ledger at \d{17}", steps["table.notes"]["read"]), steps["table.notes"]
        totals = {r["region"]: (r["total"], r["n"]) for r in Table.open(spark, str(root / "lake/totals")).read(meta=False).collect()}
        expected: dict[str, list] = {}
        for r in model.values():
            e = expected.setdefault(r["region"], [Decimal("0"), 0])
            e[0] += Decimal(r["amount"])
            e[1] += 1
        assert totals == {k: (v[0], v[1]) for k, v in expected.items()}, f"round {round_}"
        notes = {r["id"]: r["remark"] for r in Table.open(spark, str(root / "lake/notes")).read(meta=False).collect()}
        assert notes == {i: r["note"] for i, r in model.items()}, f"round {round_}"
    assert any(s.has_logs for s in Table.open(spark, str(root / "lake/ledger")).view().latest_slices())
