"""Jinja in SQL: ref, source, var, env_var, is_incremental, this, target, macros."""

from __future__ import annotations

import json

import pytest

from compiler.api import compile_project
from compiler.render import resolve_env_placeholders
from tests.conftest import compile_errors

SOURCES = """
sources:
  raw_orders:
    kind: files
    path: data/orders
    format: json
"""


def _sql(root, name="t"):
    return compile_project(root).plan.step(f"table.{name}").sql


def test_ref_and_source_render_as_view_names_and_become_dependencies(project):
    root = project({
        "sources/s.yml": SOURCES,
        "tables/orders.sql": "select * from {{ source('raw_orders') }}",
        "tables/t.sql": "select * from {{ ref('orders') }} o",
    })
    plan = compile_project(root).plan
    assert plan.step("table.orders").sql == "select * from `raw_orders`\n"
    assert plan.step("table.t").sql == "select * from `orders` o\n"
    assert plan.step("table.t").depends_on == ("table.orders",)
    assert plan.step("table.orders").depends_on == ("source.raw_orders",)
    assert plan.step_ids == ["source.raw_orders", "table.orders", "table.t"]


def test_var_uses_project_then_target_then_cli_values(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            targets:
              dev: {}
              prod:
                vars: {min_amount: 5}
            vars: {min_amount: 1, region: EU}
        """,
        "tables/t.sql": "select {{ var('min_amount') }} as m, '{{ var('region') }}' as r, {{ var('absent', 42) }} as d",
    })
    assert _sql(root) == "select 1 as m, 'EU' as r, 42 as d\n"
    assert compile_project(root, target="prod").plan.step("table.t").sql == "select 5 as m, 'EU' as r, 42 as d\n"
    plan = compile_project(root, target="prod", cli_vars={"min_amount": 9}).plan
    assert plan.step("table.t").sql == "select 9 as m, 'EU' as r, 42 as d\n"
    assert plan.vars == {"min_amount": 9, "region": "EU"}


def test_env_var_value_never_reaches_the_plan(project, monkeypatch):
    monkeypatch.setenv("SHOP_SECRET_TOKEN", "s3cr3t-value")
    root = project({
        "pipe_project.yml": """
            name: shop
            targets:
              dev:
                lake: "s3://{{ env_var('SHOP_BUCKET', 'dev-bucket') }}/lake"
        """,
        "tables/t.sql": "select '{{ env_var('SHOP_SECRET_TOKEN') }}' as token, '{{ env_var('REGION', 'eu-west-1') }}' as region",
    })
    result = compile_project(root)
    text = result.plan.to_json()
    assert "s3cr3t-value" not in text
    step = result.plan.step("table.t")
    assert step.sql == "select '${env:SHOP_SECRET_TOKEN}' as token, '${env:REGION:-eu-west-1}' as region\n"
    assert step.env_vars == {"REGION": "eu-west-1", "SHOP_SECRET_TOKEN": None}
    assert result.plan.target.lake == "s3://${env:SHOP_BUCKET:-dev-bucket}/lake"
    # the runtime resolves placeholders from its own environment
    resolved = resolve_env_placeholders(step.sql, {"SHOP_SECRET_TOKEN": "abc"})
    assert resolved == "select 'abc' as token, 'eu-west-1' as region\n"
    with pytest.raises(KeyError, match="SHOP_SECRET_TOKEN"):
        resolve_env_placeholders(step.sql, {})


def test_env_var_default_with_braces_round_trips(project):
    root = project({"tables/t.sql": "select '{{ env_var('X', 'a}b\\\\c') }}' as v"})
    sql = _sql(root)
    assert resolve_env_placeholders(sql, {}) == "select 'a}b\\c' as v\n"


def test_env_var_cannot_steer_template_logic(project):
    root = project({"tables/t.sql": "select 1\n{% if env_var('MODE') == 'prod' %}where 1=0{% endif %}"})
    [d] = compile_errors(root)
    assert str(d.location) == "tables/t.sql:2"
    assert "env_var() values can be written into SQL as they are, but not compared" in d.message


def test_env_var_cannot_be_changed_by_filters(project):
    root = project({"tables/t.sql": "select 1\n-- {{ env_var('MODE') | upper }}"})
    [d] = compile_errors(root)
    assert str(d.location) == "tables/t.sql:2"
    assert "not compared, tested or changed by filters" in d.message


def test_env_var_may_be_joined_with_text(project):
    root = project({"tables/t.sql": "select '{{ env_var('BUCKET') ~ '/x' }}' as p"})
    assert _sql(root) == "select '${env:BUCKET}/x' as p\n"


def test_target_lake_in_sql_is_rendered_and_target_env_vars_are_listed(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            targets:
              dev:
                lake: "s3://{{ env_var('LAKE_BUCKET', 'b') }}/x"
                spark:
                  master: "{{ env_var('SPARK_MASTER', 'local[2]') }}"
                  conf: {spark.hadoop.fs.s3a.secret.key: "{{ env_var('S3_SECRET') }}"}
        """,
        "tables/t.sql": "select '{{ target.lake }}' as lake",
    })
    plan = compile_project(root).plan
    assert plan.step("table.t").sql == "select 's3://${env:LAKE_BUCKET:-b}/x' as lake\n"
    assert plan.target.spark_master == "${env:SPARK_MASTER:-local[2]}"
    assert plan.target.spark_conf == {"spark.hadoop.fs.s3a.secret.key": "${env:S3_SECRET}"}
    assert plan.target.env_vars == {"LAKE_BUCKET": "b", "S3_SECRET": None, "SPARK_MASTER": "local[2]"}


def test_is_incremental_renders_both_ways(project):
    root = project({
        "sources/s.yml": SOURCES,
        "tables/t.yml": "tables:\n  t:\n    key: [id]\n",
        "tables/t.sql": """
            select * from {{ source('raw_orders') }}
            {% if is_incremental() %}
            where updated_at > (select max(updated_at) from {{ this }})
            {% endif %}
        """,
    })
    step = compile_project(root).plan.step("table.t")
    assert "where updated_at > (select max(updated_at) from `t`)" in step.sql
    assert step.sql_full_refresh == "select * from `raw_orders`\n"


def test_template_without_is_incremental_has_one_rendering(project):
    root = project({"tables/t.sql": "select 1 as x"})
    assert compile_project(root).plan.step("table.t").sql_full_refresh is None


def test_macros_can_call_macros_from_other_files_and_use_var(project):
    root = project({
        "pipe_project.yml": "name: shop\nvars: {digits: 3}\n",
        "macros/a.sql": "{% macro money(col) %}round({{ col }}, {{ digits() }}){% endmacro %}",
        "macros/b.sql": "{% macro digits() %}{{ var('digits') }}{% endmacro %}",
        "tables/t.sql": "select {{ money('amount') }} as amount",
    })
    assert _sql(root) == "select round(amount, 3) as amount\n"


def test_target_is_available_in_templates(project):
    root = project({
        "pipe_project.yml": "name: shop\ntargets:\n  dev: {}\n  prod: {lake: s3://b/x}\n",
        "tables/t.sql": "select '{{ target.name }}' as t{% if target.name == 'prod' %} limit 0{% endif %}",
    })
    assert _sql(root) == "select 'dev' as t\n"
    assert compile_project(root, target="prod").plan.step("table.t").sql == "select 'prod' as t limit 0\n"


def test_this_renders_as_the_tables_relation_and_gives_its_name(project):
    root = project({
        "sources/s.yml": SOURCES,
        "tables/daily_totals.sql": "-- table {{ this.name }} ({{ this.identifier }})\n"
                                   "select '{{ this.name }}' as written_by, * from {{ source('raw_orders') }}\n"
                                   "{% if is_incremental() %}where id not in (select id from {{ this }}){% endif %}\n",
    })
    step = compile_project(root).plan.step("table.daily_totals")
    assert step.sql.startswith("-- table daily_totals (daily_totals)\nselect 'daily_totals' as written_by")
    assert "from `daily_totals`)" in step.sql and "_This" not in step.sql + step.sql_full_refresh


def test_an_attribute_this_does_not_have_is_an_error_naming_this(project):
    root = project({"sources/s.yml": SOURCES, "tables/t.sql": "select 1 as a\n-- {{ this.schema }}\n"})
    diags = compile_errors(root)
    assert [str(d.location) for d in diags] == ["tables/t.sql:2"]
    assert diags[0].message == "undefined name in template: `this` has no attribute 'schema'"
    assert "name" in diags[0].hint and "identifier" in diags[0].hint and "_This" not in diags[0].message


def test_sandbox_blocks_python_internals(project):
    root = project({"tables/t.sql": "select 1\n-- {{ ''.__class__.__mro__[1].__subclasses__() }}"})
    [d] = compile_errors(root)
    assert d.location.file == "tables/t.sql" and d.location.line == 2
    assert "unsafe" in d.message or "template error" in d.message


def test_undefined_name_in_macro_points_at_macro_file(project):
    root = project({
        "macros/m.sql": "{% macro broken() %}\n{{ no_such_thing }}\n{% endmacro %}",
        "tables/t.sql": "select 1\n{{ broken() }}",
    })
    [d] = compile_errors(root)
    assert str(d.location) == "macros/m.sql:2"
    assert "'no_such_thing' is undefined" in d.message


def test_macro_defined_twice_is_an_error(project):
    root = project({
        "macros/a.sql": "{% macro m() %}1{% endmacro %}",
        "macros/b.sql": "{# second #}\n{% macro m() %}2{% endmacro %}",
        "tables/t.sql": "select {{ m() }} as one",
    })
    [d] = compile_errors(root)
    assert str(d.location) == "macros/b.sql:2"
    assert "macro 'm' is defined twice (first at macros/a.sql:1)" in d.message


def test_settings_may_use_var_and_env_var(project):
    root = project({
        "pipe_project.yml": "name: shop\nvars: {landing: data/in}\n",
        "sources/s.yml": """
            sources:
              q:
                kind: s3_events
                queue_url: "{{ env_var('ORDERS_QUEUE_URL') }}"
              f:
                kind: files
                path: "{{ var('landing') }}/orders"
                format: json
        """,
    })
    plan = compile_project(root).plan
    assert plan.step("source.q").config["queue_url"] == "${env:ORDERS_QUEUE_URL}"
    assert plan.step("source.q").env_vars == {"ORDERS_QUEUE_URL": None}
    assert plan.step("source.f").config["path"] == "data/in/orders"


def test_ref_in_a_setting_is_refused_with_its_position(project):
    root = project({
        "sources/s.yml": """
            sources:
              f:
                kind: files
                path: "{{ ref('x') }}"
                format: json
        """,
    })
    [d] = compile_errors(root)
    assert str(d.location) == "sources/s.yml:4:11"
    assert "can only be used in a table's SQL" in d.message


def test_plan_json_holds_the_rendered_sql(project):
    root = project({"tables/t.sql": "select {{ 1 + 2 }} as three"})
    data = json.loads(compile_project(root).plan.to_json())
    assert data["steps"][0]["sql"] == "select 3 as three\n"
