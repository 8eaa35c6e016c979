"""`pipe compile` checks the SQL of every table without Spark (compiler/sqlcheck.py): syntax
errors at the .sql file's own line and column, unknown columns where the inputs' columns are
known, key / partition_by / precombine columns the SQL does not select at their YAML line; and
valid Spark SQL is never refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compiler.api import compile_project
from tests.conftest import REPO, compile_errors, write_project

ORDERS = """
sources:
  raw_orders:
    kind: files
    path: data/orders
    format: json
    schema: "order_id BIGINT, customer_id BIGINT, amount DOUBLE, status STRING, region STRING, updated_at TIMESTAMP, address STRUCT<city: STRING, zip: STRING>, items ARRAY<STRING>"
  raw_customers:
    kind: files
    path: data/customers
    format: json
    schema: {customer_id: BIGINT, name: STRING, country: STRING}
  free:
    kind: files
    path: data/free
    format: json
"""

MACROS = """
{% macro money(x) -%}
    round(cast({{ x }} as double), 2)
{%- endmacro %}
{% macro two_lines(x) -%}
    {{ x }}
    + 0
{%- endmacro %}
"""


def listing(diags):
    return "\n".join(str(d) for d in diags)


def only(diags, text, where, hint=None):
    assert len(diags) == 1, listing(diags)
    d = diags[0]
    assert text in d.message, str(d)
    assert str(d.location) == where, str(d)
    if hint is not None:
        assert d.hint and hint in d.hint, str(d)
    return d


def files(sql: dict[str, str], yml: dict[str, str] | None = None) -> dict[str, str]:
    out = {"sources/s.yml": ORDERS, "macros/m.sql": MACROS}
    out.update({f"tables/{k}.sql": v for k, v in sql.items()})
    out.update({f"tables/{k}.yml": v for k, v in (yml or {}).items()})
    return out


# --- syntax ------------------------------------------------------------------------------------


def test_syntax_error_points_at_the_sql_line_and_column(project):
    root = project(files({"t": "select order_id,\n       amount\nfrom {{ source('raw_orders') }}\nwhere amount > (1\n"}))
    d = only(compile_errors(root), "SQL syntax error", "tables/t.sql:4:17")
    assert "Expecting )" in d.message


def test_syntax_error_below_jinja_blocks_keeps_the_template_line(project):
    sql = """
{# the orders, incrementally #}
select order_id, amount
from {{ source('raw_orders') }}
{% if is_incremental() %}
where updated_at > (select max(updated_at) from {{ this }})
{% endif %}
group by order_id amount amount
"""
    root = project(files({"t": sql}))
    only(compile_errors(root), "SQL syntax error near 'amount'", "tables/t.sql:7:19")


def test_syntax_error_on_a_line_jinja_changed_shows_the_rendered_line(project):
    root = project(files({"t": "select order_id,\n  {{ money('amount') }} as amount,\nfrom {{ source('raw_orders') }} o o\n"}))
    d = only(compile_errors(root), "SQL syntax error", "tables/t.sql:3:35")
    assert d.hint.endswith("(the line as rendered: from `raw_orders` o o)")


def test_unclosed_string_is_a_syntax_error_at_its_quote(project):
    root = project(files({"t": "select order_id\nfrom {{ source('raw_orders') }}\nwhere status = 'open\n"}))
    only(compile_errors(root), "string is not closed", "tables/t.sql:3:16")


def test_sql_of_only_comments_is_refused(project):
    root = project(files({"t": "-- to do\n"}))
    only(compile_errors(root), "the SQL holds no statement", "tables/t.sql:1")


def test_syntax_error_in_the_full_refresh_branch_only(project):
    sql = """select order_id, amount from {{ source('raw_orders') }}
{% if not is_incremental() %}
where amount >
{% endif %}
"""
    root = project(files({"t": sql}))
    only(compile_errors(root), "SQL syntax error near '>'", "tables/t.sql:3:14")


# --- columns -----------------------------------------------------------------------------------


def test_unknown_column_of_a_declared_source_with_did_you_mean(project):
    root = project(files({"t": "select order_id,\n       ammount\nfrom {{ source('raw_orders') }}\n"}))
    d = only(compile_errors(root), "unknown column 'ammount': not a column of 'raw_orders'", "tables/t.sql:2:8", "did you mean 'amount'?")
    assert d.severity == "error"


def test_unknown_qualified_column_names_the_alias_and_relation(project):
    root = project(files({"t": "select o.order_id, c.nme\nfrom {{ source('raw_orders') }} o\njoin {{ source('raw_customers') }} c using (customer_id)\n"}))
    only(compile_errors(root), "column 'nme' is not a column of 'c' (raw_customers)", "tables/t.sql:1:22", "did you mean 'name'?")


def test_unknown_alias(project):
    root = project(files({"t": "select x.order_id\nfrom {{ source('raw_orders') }} o\n"}))
    only(compile_errors(root), "unknown name 'x' in 'x.order_id'", "tables/t.sql:1:8")


def test_columns_are_inferred_through_a_chain_of_tables(project):
    root = project(files({
        "a": "select order_id, customer_id, {{ money('amount') }} as amount_eur from {{ source('raw_orders') }}",
        "b": "with w as (select * from {{ ref('a') }})\nselect order_id, amount from w\n",
    }))
    only(compile_errors(root), "unknown column 'amount': not a column of 'w'", "tables/b.sql:2:18", "did you mean 'amount_eur'?")


def test_column_in_a_correlated_subquery_and_where_clause(project):
    sql = """select o.order_id
from {{ source('raw_orders') }} o
where exists (select 1 from {{ source('raw_customers') }} c where c.customer_id = o.customer_id and c.countri = 'NL')
"""
    root = project(files({"t": sql}))
    only(compile_errors(root), "column 'countri' is not a column of 'c' (raw_customers)", "tables/t.sql:3:103", "did you mean 'country'?")


def test_key_partition_and_precombine_typos_point_at_the_yaml(project):
    yml = """tables:
  t:
    key: [order_idd]
    precombine: updated
    partition_by: [regon]
"""
    root = project(files({"t": "select order_id, region, updated_at from {{ source('raw_orders') }}"}, {"t": yml}))
    diags = compile_errors(root)
    assert [(str(d.location), d.message, d.hint) for d in diags] == [
        ("tables/t.yml:3:11", "key column 'order_idd' of table 't' is not selected by tables/t.sql", "did you mean 'order_id'?"),
        ("tables/t.yml:4:17", "precombine column 'updated' of table 't' is not selected by tables/t.sql", "did you mean 'updated_at'?"),
        ("tables/t.yml:5:20", "partition_by column 'regon' of table 't' is not selected by tables/t.sql", "did you mean 'region'?"),
    ]


def test_key_check_uses_the_output_of_select_star(project):
    yml = "tables:\n  t:\n    key: [id]\n"
    root = project(files({"t": "select * from {{ source('raw_customers') }}"}, {"t": yml}))
    only(compile_errors(root), "key column 'id' of table 't' is not selected by tables/t.sql", "tables/t.yml:3:11",
         "columns it selects: customer_id, name, country")


def test_several_errors_of_several_tables_in_one_report(project):
    root = project(files({
        "a": "select order_id, amout from {{ source('raw_orders') }}",
        "b": "select order_id from {{ source('raw_orders') }} where",
    }, {"a": "tables:\n  a:\n    key: [order]\n"}))
    diags = compile_errors(root)
    assert [str(d.location) for d in diags] == ["tables/a.sql:1:18", "tables/a.yml:3:11", "tables/b.sql:1:49"], listing(diags)


BAD = {  # name: (SQL, location, message)
    "in_a_cte": ("with a as (select order_id, amout from {{ source('raw_orders') }}) select * from a", "1:29", "unknown column 'amout'"),
    "in_a_window": ("select order_id, row_number() over (partition by regoin order by updated_at) as rn from {{ source('raw_orders') }}", "1:50", "unknown column 'regoin'"),
    "in_group_by": ("select region, count(*) as n from {{ source('raw_orders') }} group by regin", "1:71", "unknown column 'regin'"),
    "in_order_by": ("select order_id from {{ source('raw_orders') }} order by updatd_at", "1:58", "unknown column 'updatd_at'"),
    "through_stars": ("select * from (select * from {{ source('raw_customers') }}) x where x.nam = 'a'", "1:71", "column 'nam' is not a column of 'x'"),
    "in_a_union_branch": ("select order_id from {{ source('raw_orders') }} union all select custmer_id from {{ source('raw_customers') }}", "1:66", "unknown column 'custmer_id'"),
    "in_an_in_subquery": ("select * from {{ source('raw_orders') }} where customer_id in (select customr_id from {{ source('raw_customers') }})", "1:71", "unknown column 'customr_id'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_unknown_columns_anywhere_in_the_query(project, strict, name):
    sql, where, message = BAD[name]
    only(compile_errors(project(files({name: sql}))), message, f"tables/{name}.sql:{where}")


def test_a_union_names_its_columns_after_its_first_branch(project, strict):
    root = project(files({
        "u": "select order_id as id, amount from {{ source('raw_orders') }} union all select customer_id, 0 from {{ source('raw_customers') }}",
        "d": "select id, amount, order_id from {{ ref('u') }}",
    }))
    only(compile_errors(root), "unknown column 'order_id': not a column of 'u'", "tables/d.sql:1:20")


# --- valid Spark SQL is never refused ----------------------------------------------------------

VALID = {
    "star": "select * from {{ source('raw_orders') }}",
    "qualified_star_and_struct": "select o.*, o.address.city, address.zip, o.items[0] as first_item from {{ source('raw_orders') }} o",
    "lateral_view": "select order_id, item from {{ source('raw_orders') }} lateral view explode(items) t as item",
    "lateral_view_outer": "select o.order_id, t.pos, t.item from {{ source('raw_orders') }} o lateral view outer posexplode(o.items) t as pos, item",
    "cte_chain": "with a as (select order_id, amount from {{ source('raw_orders') }}), b as (select order_id, amount * 2 as double_amount from a)\nselect * from b where double_amount > 0",
    "subqueries": "select order_id, (select count(*) from {{ source('raw_customers') }} c where c.customer_id = o.customer_id) as n\nfrom (select * from {{ source('raw_orders') }}) o\nwhere o.customer_id in (select customer_id from {{ source('raw_customers') }})",
    "window": "select order_id, row_number() over (partition by customer_id order by updated_at desc) as rn,\n  sum(amount) over w as running\nfrom {{ source('raw_orders') }}\nwindow w as (partition by region order by updated_at rows between unbounded preceding and current row)",
    "qualify_like_filter": "select * from (select o.*, row_number() over (partition by order_id order by updated_at desc) as rn from {{ source('raw_orders') }} o) where rn = 1",
    "lateral_alias": "select amount * 2 as doubled, doubled + 1 as plus_one from {{ source('raw_orders') }}",
    "group_by_alias_and_all": "select upper(region) as r, count(*) as n from {{ source('raw_orders') }} group by all order by n desc",
    "group_by_ordinal_having": "select region, sum(amount) as total from {{ source('raw_orders') }} group by 1 having total > 10",
    "lambdas": "select transform(items, x -> upper(x)) as up, filter(items, (x, i) -> i > 0) as rest, aggregate(items, 0, (acc, x) -> acc + length(x)) as l from {{ source('raw_orders') }}",
    "macro_and_incremental": "select order_id, {{ money('amount') }} as amount, {{ two_lines('amount') }} as a2\nfrom {{ source('raw_orders') }}\n{% if is_incremental() %}\nwhere updated_at > (select max(updated_at) from {{ this }})\n{% endif %}",
    "set_operations": "select order_id from {{ source('raw_orders') }} union all select customer_id from {{ source('raw_customers') }} except select 1",
    "semi_anti_using_joins": "select * from {{ source('raw_orders') }} o left semi join {{ source('raw_customers') }} c on c.customer_id = o.customer_id\nleft anti join {{ source('raw_customers') }} d on d.customer_id = o.customer_id",
    "unknown_source_columns": "select anything, whatever.field from {{ source('free') }} whatever",
    "table_functions_and_values": "select id, a, b from range(3) join (values (1, 2) as v(a, b)) on true",
    "pivot": "select * from (select region, status, amount from {{ source('raw_orders') }}) pivot (sum(amount) for status in ('open' as o, 'done' as d))",
    "file_metadata": "select order_id, _metadata.file_path as f, input_file_name() as g from {{ source('raw_orders') }}",
    "env_var": "select order_id, '{{ env_var('SHOP_REGION', 'EU') }}' as r from {{ source('raw_orders') }} limit {{ env_var('N', '10') }}",
    "hints_casts_and_literals": "select /*+ BROADCAST(c) */ o.order_id, o.amount::decimal(10,2) as a, date'2024-01-01' as d, interval 1 day as i, x'0A' as b, named_struct('k', o.region) as s\nfrom {{ source('raw_orders') }} o join {{ source('raw_customers') }} c on c.customer_id = o.customer_id",
    "distribute_cluster_sort": "select order_id, region from {{ source('raw_orders') }} distribute by region sort by order_id",
    "case_insensitive_names": "select ORDER_ID, Amount, O.Region from {{ source('raw_orders') }} o",
    "trailing_semicolon_and_comments": "-- leading comment\n/* block */\nselect order_id from {{ source('raw_orders') }}; -- done\n",
    "tablesample_and_limit": "select * from {{ source('raw_orders') }} tablesample (10 percent) limit 5",
    "struct_star": "select address.* from {{ source('raw_orders') }}",
    "inline_table_alias_columns": "select t.x from (select order_id as x from {{ source('raw_orders') }}) as t",
    "self_reference_this": "select order_id from {{ source('raw_orders') }}\n{% if is_incremental() %}where order_id not in (select order_id from {{ this }}){% endif %}",
    'exists_lambda': "select order_id, exists(items, x -> x = 'a') as has_a, forall(items, x -> x <> '') as ok from {{ source('raw_orders') }}",
    'higher_order': "select zip_with(items, items, (x, y) -> concat(x, y)) as z, reduce(items, '', (acc, x) -> concat(acc, x)) as r, map_filter(map('a', 1), (k, v) -> v > 0) as m from {{ source('raw_orders') }}",
    'json_and_maps': "select get_json_object(status, '$.a') as a, from_json(status, 'a INT') as j, map('k', amount)['k'] as mk, items[0] as i0 from {{ source('raw_orders') }}",
    'json_tuple_lateral': "select o.order_id, jt.a, jt.b from {{ source('raw_orders') }} o lateral view json_tuple(o.status, 'a', 'b') jt as a, b",
    'stack_and_inline': "select stack(2, order_id, amount, customer_id, amount) as (k, v) from {{ source('raw_orders') }}",
    'comma_cross_full_joins': "select o.order_id, c.name from {{ source('raw_orders') }} o, {{ source('raw_customers') }} c cross join (select 1 as one) x full outer join {{ source('raw_customers') }} d on d.customer_id = o.customer_id",
    'natural_join': "select * from {{ source('raw_orders') }} natural join {{ source('raw_customers') }}",
    'lateral_subquery': "select o.order_id, x.n from {{ source('raw_orders') }} o, lateral (select o.amount * 2 as n) x",
    'grouping_sets': "select region, status, sum(amount) as total, grouping_id() as g from {{ source('raw_orders') }} group by grouping sets ((region), (status), ())",
    'rollup_cube': "select region, status, count(*) as n from {{ source('raw_orders') }} group by rollup(region, status)",
    'cube': "select region, status, count(*) as n from {{ source('raw_orders') }} group by cube(region, status)",
    'unpivot': "select * from (select order_id, amount, customer_id from {{ source('raw_orders') }}) unpivot (val for col in (amount, customer_id))",
    'aggregate_filter': "select count(*) filter (where amount > 0) as pos, percentile_approx(amount, 0.5) as med, max_by(order_id, updated_at) as last from {{ source('raw_orders') }}",
    'limit_offset_order_all': "select order_id, amount from {{ source('raw_orders') }} order by all limit 10 offset 5",
    'distinct_all_and_rlike': "select distinct order_id from {{ source('raw_orders') }} where status rlike '^o' and status like any ('a%', 'b%') and amount is distinct from 0",
    'case_if_nvl': "select case status when 'a' then 1 else 0 end as c, if(amount > 0, 1, 0) as p, nvl(status, 'x') as s, current_date() as d, current_timestamp as ts, current_date as d2 from {{ source('raw_orders') }}",
    'intervals_and_dates': "select updated_at + interval '1' day as tomorrow, date_add(to_date(updated_at), 1) as d, cast(updated_at as timestamp_ntz) as n, date_trunc('MONTH', updated_at) as m from {{ source('raw_orders') }}",
    'repartition_hint': "select /*+ REPARTITION(4), COALESCE(2) */ * from {{ source('raw_orders') }}",
    'cluster_by': "select order_id, region from {{ source('raw_orders') }} cluster by region",
    'tablesample_bucket': "select * from {{ source('raw_orders') }} tablesample (bucket 1 out of 4)",
    'window_frames': "select order_id, lag(amount, 1) over (partition by customer_id order by updated_at) as prev, sum(amount) over (order by updated_at range between interval 1 day preceding and current row) as s from {{ source('raw_orders') }}",
    'in_subquery_and_scalar': "select * from {{ source('raw_orders') }} where customer_id in (select customer_id from {{ source('raw_customers') }} where country = 'NL') and amount > (select avg(amount) from {{ source('raw_orders') }})",
    'nested_ctes_shadowing': "with raw_orders as (select order_id as id from {{ source('raw_orders') }}) select id from raw_orders",
    'struct_functions': "select struct(order_id, amount).amount as a, named_struct('x', 1).x as x, address.city as city, o.address.zip as zip from {{ source('raw_orders') }} o",
    'quoted_identifiers': "select `order_id`, `o`.`amount` as `the_amount`, o.`status` from {{ source('raw_orders') }} `o`",
    'values_only': "select * from values (1, 'a'), (2, 'b') as t(id, name)",
    'explode_in_select': "select order_id, explode(items) as item from {{ source('raw_orders') }}",
    'posexplode_select': "select posexplode(items) as (pos, item) from {{ source('raw_orders') }}",
    'from_first': "from {{ source('raw_orders') }} select order_id",
    'inline_func': "select inline(array(struct(1, 'a'), struct(2, 'b')))",
    'having_without_group': "select sum(amount) as s from {{ source('raw_orders') }} having s > 0",
    'identifier_clause': "select order_id from identifier('raw_orders')",
    'try_and_nullif': "select try_divide(amount, 0) as d, nullif(status, '') as s, coalesce(address.city, 'x') as c from {{ source('raw_orders') }}",
    'union_by_name': "select order_id, amount from {{ source('raw_orders') }} union all select customer_id as order_id, 0 as amount from {{ source('raw_customers') }}",
    'order_by_alias_in_union': "(select order_id as x from {{ source('raw_orders') }}) union (select customer_id from {{ source('raw_customers') }}) order by x",
    "named_args_and_try": "select try_cast(amount as int) as i, coalesce(status, 'x') as s, `order_id` as `id_copy` from {{ source('raw_orders') }}",
}


@pytest.fixture
def strict(monkeypatch):
    """A failure inside the column analysis fails the test instead of switching the check off."""
    from compiler import sqlcheck

    monkeypatch.setattr(sqlcheck, "RAISE_ANALYSIS_ERRORS", True)


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_spark_sql_compiles(project, strict, name):
    root = project(files({name: VALID[name]}))
    result = compile_project(root)
    assert result.plan.step(f"table.{name}").sql is not None
    assert result.warnings == ()


def test_example_project_infers_every_tables_columns(project, tmp_path):
    # customer_revenue's key is checked against the columns its SQL selects over inferred
    # columns of customers and orders, themselves selected from declared sources
    import shutil

    from tests.conftest import TEMPLATE

    root = tmp_path / "shop"
    shutil.copytree(TEMPLATE, root, ignore=shutil.ignore_patterns("lake", "target"))
    path = root / "tables" / "customer_revenue.sql"
    path.write_text(path.read_text().replace("c.country", "c.county"), encoding="utf-8")
    diags = compile_errors(root)
    assert [str(d.location) for d in diags] == ["tables/customer_revenue.sql:4:7", "tables/customer_revenue.sql:9:35"], listing(diags)
    for d in diags:
        assert d.message == "column 'county' is not a column of 'c' (customers)" and d.hint == "did you mean 'country'?"


# --- the cache ---------------------------------------------------------------------------------


def test_a_second_compile_reuses_the_checks_without_parsing(project):
    root = project(files({"a": "select order_id, amount from {{ source('raw_orders') }}", "b": "select * from {{ ref('a') }}"}))
    compile_project(root, cache_dir=root / "target")
    assert (root / "target" / "sql_check_cache.json").is_file()
    code = ("import sys; from compiler.api import compile_project; r = compile_project(sys.argv[1], cache_dir=sys.argv[1] + '/target'); "
            "print(len(r.plan.steps), 'sqlglot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True, cwd=REPO).stdout.split()
    assert out == ["5", "False"]
    # an edit is checked again, and its error is found; the cached outcome of an error is
    # reported the same way
    (root / "tables" / "b.sql").write_text("select amout from {{ ref('a') }}", encoding="utf-8")
    for _ in range(2):
        only(compile_errors(root, cache_dir=root / "target"), "unknown column 'amout'", "tables/b.sql:1:8", "did you mean 'amount'?")


def test_delete_when_is_checked_against_the_columns_the_sql_selects(project):
    yml = "tables:\n  t:\n    key: [order_id]\n    delete_when: \"stauts = 'cancelled'\"\n"
    root = project(files({"t": "select order_id, status from {{ source('raw_orders') }}"}, {"t": yml}))
    only(compile_errors(root), "delete_when of table 't': unknown column 'stauts': not a column of 't'", "tables/t.yml:4:18", "did you mean 'status'?")
    (root / "tables" / "t.yml").write_text(yml.replace("stauts = 'cancelled'", "status = = 'cancelled'"), encoding="utf-8")
    only(compile_errors(root), "delete_when of table 't': SQL syntax error", "tables/t.yml:4:18")


# --- what only Spark finds keeps Spark's position ---------------------------------------------------


@pytest.mark.spark
def test_spark_errors_keep_sparks_line_and_position(spark):
    from runtime.errors import spark_message

    spark.range(3).createOrReplaceTempView("three")
    for sql, where in [("select id\nfrom three\nwhere id >", "line 3, pos 10"), ("select id,\n  idd\nfrom three", "line 2, pos 2")]:
        with pytest.raises(Exception) as err:
            spark.sql(sql)
        message = spark_message(err.value)
        assert message.endswith(f"(Spark's position: {where})"), message


def test_a_damaged_cache_is_checked_again(project):
    root = project(files({"a": "select order_id, amout from {{ source('raw_orders') }}"}))
    first = compile_errors(root, cache_dir=root / "target")
    cache = root / "target" / "sql_check_cache.json"
    import json

    data = json.loads(cache.read_text())
    for key in data["entries"]:
        data["entries"][key] = [[["x", None, 3, None]], [1, 2]]
    for text in (json.dumps(data), "{not json", "[" * 100000):
        cache.write_text(text)
        assert [str(d) for d in compile_errors(root, cache_dir=root / "target")] == [str(d) for d in first]


@pytest.mark.spark
def test_a_key_typo_only_spark_can_find_is_reported_at_the_yaml(spark, project, capsys):
    # no schema: compile cannot know the columns, so the run finds the typo, and names the YAML
    from pipe.cli import main

    root = project({
        "sources/s.yml": "sources:\n  raw:\n    kind: files\n    path: data/raw\n    format: json\n",
        "tables/t.yml": "tables:\n  t:\n    key: [order_idd]\n",
        "tables/t.sql": "select * from {{ source('raw') }}\n",
        "data/raw/1.json": '{"order_id": 1, "amount": 2.5}\n',
    })
    code = main(["--project-dir", str(root), "run"])
    err = capsys.readouterr().err
    assert code == 1
    assert "tables/t.yml:2: table.t: the input lacks column(s) order_idd" in err, err
    assert "check key, partition_by and precombine in tables/t.yml against the columns tables/t.sql selects" in err, err


# --- column names Avro refuses (Hudi keeps the schema in Avro) --------------------------------------


def test_a_selected_column_avro_refuses_is_an_error_where_the_sql_names_it(project):
    sql = "select order_id,\n       amount as `order-total`,\n       status as `my status`,\n       region as `1st_region`\nfrom {{ source('raw_orders') }}\n"
    diags = compile_errors(project(files({"t": sql})))
    assert [(str(d.location), d.message.split(" of ")[0]) for d in diags] == [
        ("tables/t.sql:2:19", "column 'order-total'"), ("tables/t.sql:3:19", "column 'my status'"), ("tables/t.sql:4:19", "column '1st_region'")]
    assert "not a valid Avro name" in diags[0].message and "`order-total` as order_total" in diags[0].hint
    assert "`1st_region` as _1st_region" in diags[2].hint


def test_a_star_over_a_source_with_an_avro_refused_name_is_an_error_at_the_file(project, tmp_path):
    src = ORDERS.replace("schema: {customer_id: BIGINT, name: STRING, country: STRING}", "schema: {customer_id: BIGINT, \"full name\": STRING}")
    root = project({**files({"t": "select * from {{ source('raw_customers') }}\n"}), "sources/s.yml": src})
    only(compile_errors(root), "column 'full name' of table 't' is not a valid Avro name", "tables/t.sql")
    # renamed in the SELECT, the source's name is fine
    fixed = write_project(tmp_path / "fixed", {**files({"t": "select customer_id, `full name` as full_name from {{ source('raw_customers') }}\n"}),
                                               "sources/s.yml": src})
    assert compile_project(fixed).plan.step("table.t") is not None
