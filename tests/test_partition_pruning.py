"""Partition pruning of the views pipe run and pipe test read (runtime/steps/views.view_filters,
runtime/table/partition_pruning.py): a model or test whose WHERE compares a table's partition
columns with literals reads only the partitions that can hold such rows, and gets exactly the
rows an unpruned read gives. Checked on the conditions taken and refused, on partition paths of
every style, and over rounds of upserts, deletes and keys moving partition on a merge-on-read
table and a copy-on-write one, with accents, quotes and null partition values."""

from __future__ import annotations

import random
import re
from decimal import Decimal

from pyspark.sql import types as T

from runtime.steps.views import view_filters
from runtime.table import Table, TableConfig
from runtime.table.partition_pruning import partition_filter
from tests.test_run import assert_clean, pipe, project, run_results, write_jsonl


def test_conditions_are_taken_from_the_one_select_that_reads_a_view_and_only_when_that_is_safe():
    taken = view_filters(["select a from t where dt = '2024-01-01' and (part in (1, -2)) and 3 < x and y between 1 and 5 "
                          "and z is null and w = DATE '2024-02-03'"], ["T"])
    assert taken == {"t": (("dt", "=", (("string", "2024-01-01"),)), ("part", "in", (("number", "1"), ("number", "-2"))),
                           ("x", ">", (("number", "3"),)), ("y", "between", (("number", "1"), ("number", "5"))),
                           ("z", "is null", ()), ("w", "=", (("date", "2024-02-03"),)))}
    # qualified by the alias in a join, whichever side (the condition is false for a null-extended row)
    assert view_filters(["select * from u left join t as e on e.k = u.k where e.day >= '2026-12-03' and u.x = 1 and k = 2"],
                        ["t", "u"]) == {"t": (("day", ">=", (("string", "2026-12-03"),)),), "u": (("x", "=", (("number", "1"),)),)}
    # IS NULL holds for an outer join's null-extended rows: not taken beside an outer join (either
    # side), taken beside an inner one
    for join in ("left join", "right outer join", "full join"):
        assert view_filters([f"select * from u {join} t as e on e.k = u.k where e.day is null and u.x is null"], ["t", "u"]) == {}, join
    assert view_filters(["select * from u join t on t.k = u.k where t.day is null"], ["t", "u"]) == {"t": (("day", "is null", ()),)}
    # in a subquery: that SELECT's conditions, not the outer one's
    assert view_filters(["select * from (select * from t where p = 1) s where p = 2"], ["t"]) == {"t": (("p", "=", (("number", "1"),)),)}
    refused = [
        "select a from t where p = 1 or a = 2",  # not a conjunct
        "select a from t where not (p = 1)",
        "select a from t where p <> 1",
        "select a from t where p = q",  # no literal
        "select a from t where p in (select 1)",
        "select * from t join u on t.k = u.k where p = 1",  # unqualified beside another relation
        "select a from t where p = 1 union all select a from t where p = 2",  # read twice
        "select * from t a join t b on a.k = b.k where a.p = 1",
        "with t as (select 1 as p) select p from t where p = 1",  # a CTE shadows the view
        "select a from t tablesample (10 percent) where p = 1",  # sampled before the filter
        "select a from t as x(a, p) where p = 1",  # columns renamed
        "select a from db.t where p = 1",  # another relation
        "select a from t where p = 1 ((",  # does not parse
        "select a from t where abs(p) = 1",
        "select a from t where p = 'Zoë''s'",  # Spark reads two literals, concatenated
    ]
    for sql in refused:
        assert view_filters([sql], ["t"]) == {}, sql
    # a backslash or a double quote anywhere: strings and dates are not taken (the session may
    # read them otherwise), numbers are
    assert view_filters([r"select a from t where p = 'a\nb' and q = 1"], ["t"]) == {"t": (("q", "=", (("number", "1"),)),)}
    assert view_filters(['select a from t where p = "EU" and d = DATE \'2024-01-01\''], ["t"]) == {}


def _config(fields, hive_style=True, url_encode=True, keygen=None) -> TableConfig:
    return TableConfig(name="t", record_key_fields=("id",), partition_fields=tuple(fields), hive_style=hive_style,
                       url_encode=url_encode, key_generator_class=keygen)


STRUCT = T.StructType([T.StructField("id", T.LongType()), T.StructField("day", T.DateType()), T.StructField("shard", T.IntegerType()),
                       T.StructField("region", T.StringType()), T.StructField("at", T.TimestampType())])


def test_a_partition_is_kept_exactly_when_its_values_can_meet_the_conditions():
    keeps = partition_filter(_config(["day", "shard"]), STRUCT, (("day", "between", (("date", "2026-12-02"), ("string", "2026-12-03"))),
                                                                  ("shard", "in", (("number", "-1"), ("number", "3")))))
    assert keeps("day=2026-12-02/shard=3") and keeps("day=2026-12-03/shard=-1")
    assert not keeps("day=2026-12-01/shard=3") and not keeps("day=2026-12-02/shard=2") and not keeps("day=2026-12-04/shard=-1")
    assert not keeps("day=__HIVE_DEFAULT_PARTITION__/shard=3")  # a null day is never between two dates
    assert keeps("2026-12-01/3") and keeps("day=2026-12-01") and keeps("shard=3/day=2026-12-01")  # unparsed: kept
    assert keeps("day=20261202/shard=3")  # a text that is not yyyy-mm-dd: kept
    nulls = partition_filter(_config(["shard"], hive_style=False), STRUCT, (("shard", "is null", ()),))
    assert nulls("__HIVE_DEFAULT_PARTITION__") and not nulls("3")
    # strings: URL-encoded paths are decoded; the default partition may hold ''
    region = partition_filter(_config(["region"]), STRUCT, (("region", "in", (("string", "Zoë's a/b"), ("string", ""))),))
    assert region("region=Zoë%27s a%2Fb") and not region("region=Zoe%27s a%2Fb") and region("region=__HIVE_DEFAULT_PARTITION__")
    plain = partition_filter(_config(["region"], hive_style=False, url_encode=False), STRUCT, (("region", "<", (("string", "M"),)),))
    assert plain("EU") and not plain("US") and plain("a/b")  # 'a/b' unencoded is two segments: kept
    # nothing prunes: a literal Spark would cast, a type without a plain text, a column that is no
    # partition field, a key generator pipe does not reproduce
    for fields, conditions, keygen in [(["shard"], (("shard", "=", (("string", "3"),)),), None),
                                       (["shard"], (("shard", "=", (("number", "3.0"),)),), None),
                                       (["region"], (("region", "=", (("number", "3"),)),), None),
                                       (["at"], (("at", "=", (("string", "2026-01-01"),)),), None),
                                       (["region"], (("id", "=", (("number", "3"),)),), None),
                                       (["day"], (("day", "=", (("string", "2026-12-02"),)),), "org.apache.hudi.keygen.TimestampBasedKeyGenerator")]:
        assert partition_filter(_config(fields, keygen=keygen), STRUCT, conditions) is None, (fields, conditions)


DAYS = ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04", "2026-12-05"]
REGIONS = ["EU", "Zoë's", 'say "hi"', "naïve café", None]
PROJECT = {
    "sources/raw.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            schema: "id BIGINT, day STRING, shard INT, region STRING, ts BIGINT, amount DECIMAL(12,2), gone BOOLEAN"
        """,
    "tables/events.yml": """
        tables:
          events:
            type: merge_on_read
            key: [id]
            precombine: ts
            partition_by: [day, shard]
            delete_when: gone
            small_file_limit: 0
          orders:
            key: [id]
            precombine: ts
            partition_by: [region]
            delete_when: gone
          one_day: {operation: insert_overwrite_table}
          late: {operation: insert_overwrite_table}
          cafe: {operation: insert_overwrite_table}
          unmatched: {operation: insert_overwrite_table}
        """,
    "tables/events.sql": "select id, day, shard, ts, amount, gone from {{ source('raw') }}",
    "tables/orders.sql": "select id, region, ts, amount, gone from {{ source('raw') }}",
    "tables/one_day.sql": """
        select day, shard, count(*) as n, sum(amount) as total from {{ ref('events') }}
        where day = '2026-12-02' and shard in (1, 3) group by day, shard
        """,
    "tables/late.sql": """
        select o.id, o.region, e.day from {{ ref('orders') }} o left join {{ ref('events') }} e on e.id = o.id
        where e.day >= '2026-12-04'
        """,
    "tables/cafe.sql": "select id, amount from {{ ref('orders') }} where region = 'naïve café'",
    # an anti-join: pruning the events to a null day's partition would leave every order unmatched
    "tables/unmatched.sql": """
        select o.id from {{ ref('orders') }} o left join {{ ref('events') }} e on e.id = o.id where e.day is null
        """,
    "tests/no_negative_day.sql": "select id from {{ ref('events') }} where day = '2026-12-01' and amount < -1000000",
}


def test_models_read_only_the_partitions_their_conditions_meet_and_get_the_rows_a_full_read_gives(spark, tmp_path, capsys):
    root = project(tmp_path, PROJECT)
    rng = random.Random(11)
    model: dict[int, dict] = {}
    logs: list[bool] = []
    for round_ in range(5):
        rows = []
        for i in sorted(rng.sample(sorted(model), k=min(len(model), 60))) + list(range(round_ * 150, round_ * 150 + 150)):
            old = model.get(i)
            moved = old is not None and rng.random() < 0.3  # the key moves to another day, shard and region
            rows.append({"id": i, "day": rng.choice(DAYS) if moved or not old else old["day"],
                         "shard": rng.randrange(4) if moved or not old else old["shard"],
                         "region": rng.choice(REGIONS) if moved or not old else old["region"], "ts": round_ * 10 + 1,
                         "amount": f"{rng.randrange(-100000, 100000) / 100:.2f}", "gone": old is not None and rng.random() < 0.1})
        for r in rows:
            if r["gone"]:
                model.pop(r["id"], None)
            else:
                model[r["id"]] = r
        write_jsonl(root / f"data/raw/round-{round_}.json", rows)
        code, out, err = pipe(capsys, root, "build")
        assert code == 0, f"round {round_}:\n{out}\n{err}"
        assert_clean(out, err)
        results = run_results(root)
        assert results["success"] is True
        steps = {r["id"]: r for r in results["steps"]}
        events = {s.partition for s in Table.open(spark, str(root / "lake/events")).view().latest_slices()}
        orders = {s.partition for s in Table.open(spark, str(root / "lake/orders")).view().latest_slices()}
        day_shard = [(m.group(1), int(m.group(2))) for m in (re.fullmatch(r"day=(.*)/shard=(-?\d+)", p) for p in events)]
        one_day_parts = sum(1 for d, s in day_shard if d == "2026-12-02" and s in (1, 3))
        late_parts = sum(1 for d, _ in day_shard if d >= "2026-12-04")
        assert 0 < one_day_parts < len(events) and 0 < late_parts < len(events)
        said = steps["table.one_day"]["read"]
        assert re.fullmatch(rf"events at \d{{17}} \(columns day, shard, amount, {one_day_parts} of {len(events)} partitions\)", said), said
        said = steps["table.late"]["read"]
        assert re.search(rf"(^| \+ )events at \d{{17}} \(columns id, day, {late_parts} of {len(events)} partitions\)( \+ |$)", said), said
        assert re.search(r"(^| \+ )orders at \d{17}( \+ |$)", said), said
        said = steps["table.unmatched"]["read"]
        assert re.search(r"(^| \+ )events at \d{17}( \(columns id, day\))?( \+ |$)", said), said  # every partition read
        said = steps["table.cafe"]["read"]
        assert re.fullmatch(rf"orders at \d{{17}} \(1 of {len(orders)} partitions\)", said), said

        def read(name, *columns):
            return sorted((tuple(r[c] for c in columns) for r in Table.open(spark, str(root / "lake" / name)).read(meta=False).collect()),
                          key=repr)

        expected_days: dict[tuple, list] = {}
        for r in model.values():
            if r["day"] == "2026-12-02" and r["shard"] in (1, 3):
                e = expected_days.setdefault((r["day"], r["shard"]), [0, Decimal(0)])
                e[0] += 1
                e[1] += Decimal(r["amount"])
        assert read("one_day", "day", "shard", "n", "total") == sorted(((d, s, n, t) for (d, s), (n, t) in expected_days.items()), key=repr)
        assert read("late", "id", "region", "day") == sorted(((i, r["region"], r["day"]) for i, r in model.items() if r["day"] >= "2026-12-04"),
                                                             key=repr)
        assert read("cafe", "id", "amount") == sorted(((i, Decimal(r["amount"])) for i, r in model.items() if r["region"] == "naïve café"),
                                                      key=repr)
        assert read("unmatched", "id") == []  # every order has its event (both tables take every raw row)
        logs.append(any(s.has_logs for s in Table.open(spark, str(root / "lake/events")).view().latest_slices()))
    assert any(logs), "the pruned reads merged log files in some round"
