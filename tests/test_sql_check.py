"""`pipe compile` checks the SQL of every table without Spark (compiler/sqlcheck.py): syntax
errors at the .sql file's own line and column, unknown columns where the inputs' columns are
known, key / partition_by / precombine columns the SQL does not select at their YAML line; and
valid Spark SQL is never refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compiler.api import compile_project
from tests.conftest import REPO, compile_errors

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
    "named_args_and_try": "select try_cast(amount as int) as i, coalesce(status, 'x') as s, `order_id` as `id with space` from {{ source('raw_orders') }}",
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_spark_sql_compiles(project, name):
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
    from runtime.executor import _spark_message

    spark.range(3).createOrReplaceTempView("three")
    for sql, where in [("select id\nfrom three\nwhere id >", "line 3, pos 10"), ("select id,\n  idd\nfrom three", "line 2, pos 2")]:
        with pytest.raises(Exception) as err:
            spark.sql(sql)
        message = _spark_message(err.value)
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
