"""Validation: one small broken project per rule, each checked for its message, the exact
file:line(:col) it is reported at and, where it helps, the hint."""

from __future__ import annotations

import pytest

from compiler.api import compile_project
from tests.conftest import TEMPLATE, compile_errors, write_project

RAW = """
sources:
  raw:
    kind: files
    path: data/raw
    format: json
"""

SELECT_RAW = "select * from {{ source('raw') }}\n"


def listing(diags):
    return "\n".join(str(d) for d in diags)


def one(diags, text):
    """The one diagnostic whose message contains `text`."""
    found = [d for d in diags if text in d.message]
    assert len(found) == 1, f"expected exactly one diagnostic containing {text!r}, got:\n{listing(diags)}"
    return found[0]


def check(diags, text, where, hint=None):
    """Asserts one diagnostic containing `text` at `where` (file:line[:col]) with `hint` in it."""
    d = one(diags, text)
    assert str(d.location) == where, str(d)
    assert d.severity == "error"
    if hint is not None:
        assert d.hint is not None and hint in d.hint, str(d)
    return d


def table(name, body, sql=SELECT_RAW):
    """Files for table `name`: tables/<name>.yml holding `body` (indented 4) and its SQL."""
    files = {f"tables/{name}.yml": f"tables:\n  {name}:\n" + "".join(f"    {line}\n" for line in body.strip("\n").split("\n"))}
    if sql is not None:
        files[f"tables/{name}.sql"] = sql
    return files


# --- positive ----------------------------------------------------------------------------------


def test_project_template_compiles_without_errors_or_warnings():
    result = compile_project(TEMPLATE)
    assert result.warnings == ()
    assert [i for i in result.plan.step_ids if not i.startswith("test.")] == [
        "source.raw_customers", "source.raw_orders", "table.customers", "table.orders", "table.customer_revenue", "table.regions",
        "unit.orders_keep_the_latest_version",
    ]
    assert compile_project(TEMPLATE, target="prod").plan.target.name == "prod"


def test_sql_only_table_compiles_with_default_settings(project):
    root = project({"sources/s.yml": RAW, "tables/x.sql": SELECT_RAW})
    step = compile_project(root).plan.step("table.x")
    assert step.config["operation"] == "insert"
    assert step.config["type"] == "copy_on_write"
    assert step.config["key"] == []
    assert step.sql_file == "tables/x.sql"
    assert step.depends_on == ("source.raw",)


def test_table_with_key_defaults_to_upsert(project):
    root = project({"sources/s.yml": RAW, **table("t", "key: [id]")})
    assert compile_project(root).plan.step("table.t").config["operation"] == "upsert"


# --- unknown keys ------------------------------------------------------------------------------


def test_unknown_key_in_project_file(project):
    root = project({"pipe_project.yml": """
        name: shop
        lake: lake
        defualt_target: dev
    """})
    diags = compile_errors(root)
    check(diags, "unknown key 'defualt_target' in pipe_project.yml", "pipe_project.yml:3:1", "did you mean 'default_target'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_key_in_target(project):
    root = project({"pipe_project.yml": """
        name: shop
        targets:
          dev:
            lak: lake/dev
    """})
    diags = compile_errors(root)
    check(diags, "unknown key 'lak' in target 'dev'", "pipe_project.yml:4:5", "did you mean 'lake'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_key_in_spark_section(project):
    root = project({"pipe_project.yml": """
        name: shop
        targets:
          dev:
            spark:
              mastr: local[2]
    """})
    diags = compile_errors(root)
    check(diags, "unknown key 'mastr' in 'spark' of target 'dev'", "pipe_project.yml:5:7", "did you mean 'master'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_key_without_close_match_lists_known_keys(project):
    root = project({"pipe_project.yml": """
        name: shop
        owner: data-team
    """})
    d = check(compile_errors(root), "unknown key 'owner' in pipe_project.yml", "pipe_project.yml:2:1")
    assert d.hint == "known keys: default_target, lake, name, targets, vars"


def test_unknown_key_in_source(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            fromat: json
    """})
    diags = compile_errors(root)
    check(diags, "unknown key 'fromat' in source 'raw'", "sources/s.yml:5:5", "did you mean 'format'?")
    check(diags, "source 'raw' is missing required key 'format'", "sources/s.yml:2:3")
    assert len(diags) == 2, listing(diags)


def test_unknown_key_in_table(project):
    root = project({"sources/s.yml": RAW, **table("orders", """
key: [id]
precombin: updated_at
""")})
    diags = compile_errors(root)
    check(diags, "unknown key 'precombin' in table 'orders'", "tables/orders.yml:4:5", "did you mean 'precombine'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_keys_in_nested_table_sections(project):
    root = project({"sources/s.yml": RAW, **table("t", """
type: merge_on_read
clean:
  retian: 5
archive:
  max_instant: 40
compaction:
  inlne: false
""")})
    diags = compile_errors(root)
    check(diags, "unknown key 'retian' in 'clean' of table 't'", "tables/t.yml:5:7", "did you mean 'retain'?")
    check(diags, "unknown key 'max_instant' in 'archive' of table 't'", "tables/t.yml:7:7", "did you mean 'max_instants'?")
    check(diags, "unknown key 'inlne' in 'compaction' of table 't'", "tables/t.yml:9:7", "did you mean 'inline'?")
    assert len(diags) == 3, listing(diags)


def test_unknown_key_in_bootstrap_section(project):
    root = project(table("b", """
operation: bootstrap
bootstrap:
  pth: data/old
""", sql=None))
    diags = compile_errors(root)
    check(diags, "unknown key 'pth' in 'bootstrap' of table 'b'", "tables/b.yml:5:7", "did you mean 'path'?")
    check(diags, "'bootstrap' of table 'b' is missing required key 'path'", "tables/b.yml:4:5")
    assert len(diags) == 2, listing(diags)


def test_unknown_top_level_key_in_sources_file(project):
    root = project({"sources/s.yml": """
        source:
          raw:
            kind: files
    """})
    diags = compile_errors(root)
    check(diags, "unknown top-level key 'source'", "sources/s.yml:1:1", "did you mean 'sources'?")
    assert len(diags) == 1, listing(diags)


def test_tables_key_in_sources_file_points_to_tables_folder(project):
    root = project({"sources/s.yml": RAW + "tables:\n  t: {}\n"})
    diags = compile_errors(root)
    check(diags, "unknown top-level key 'tables'", "sources/s.yml:6:1", "tables are declared in tables/*.yml")
    assert len(diags) == 1, listing(diags)


def test_unknown_top_level_key_in_tables_file(project):
    root = project({
        "tables/t.yml": """
            tables:
              t:
                key: [id]
            models:
              u: {}
        """,
        "tables/t.sql": "select 1 as id",
    })
    diags = compile_errors(root)
    d = check(diags, "unknown top-level key 'models'", "tables/t.yml:4:1")
    assert d.hint == "the only top-level key here is 'tables:'"
    assert len(diags) == 1, listing(diags)


def test_sources_key_in_tables_file_points_to_sources_folder(project):
    root = project({"tables/t.yml": RAW, "tables/t.sql": "select 1 as id"})
    diags = compile_errors(root)
    check(diags, "unknown top-level key 'sources'", "tables/t.yml:1:1", "sources are declared in sources/*.yml")


def test_key_of_another_source_kind_names_that_kind(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            queue_url: https://sqs.us-east-1.amazonaws.com/123456789012/events
            metadata_table: s3_meta
    """})
    diags = compile_errors(root)
    d = check(diags, "unknown key 'queue_url' in source 'raw'", "sources/s.yml:6:5")
    assert d.hint == "'queue_url' is a setting of kind: s3_events, not of kind: files"
    d = check(diags, "unknown key 'metadata_table' in source 'raw'", "sources/s.yml:7:5")
    assert d.hint == "'metadata_table' is a setting of kind: s3_incremental, not of kind: files"
    assert len(diags) == 2, listing(diags)


def test_exact_key_of_another_kind_beats_a_fuzzy_match(project):
    # max_messages_per_run is an s3_events setting; it is not a typo of max_files_per_run
    root = project({"sources/s.yml": RAW + "    max_messages_per_run: 100\n"})
    d = check(compile_errors(root), "unknown key 'max_messages_per_run' in source 'raw'", "sources/s.yml:6:5")
    assert d.hint == "'max_messages_per_run' is a setting of kind: s3_events, not of kind: files"


# --- wrong types, ranges, sizes ----------------------------------------------------------------


def test_wrong_types_in_table_settings(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
precombine: [ts, seq]
hive_style_partitioning: 1
clean:
  retain: "5"
  inline: 3
archive: 40
tags: true
""")})
    diags = compile_errors(root)
    check(diags, "'precombine' in table 't' must be a string, not a list", "tables/t.yml:4:17")
    check(diags, "'hive_style_partitioning' in table 't' must be true or false, not an integer", "tables/t.yml:5:30")
    check(diags, "'retain' in 'clean' of table 't' must be an integer, not a string", "tables/t.yml:7:15")
    check(diags, "'inline' in 'clean' of table 't' must be true or false, not an integer", "tables/t.yml:8:15")
    check(diags, "'archive' of table 't' must be a mapping of settings, not an integer", "tables/t.yml:9:14")
    check(diags, "'tags' in table 't' must be a string or a list of strings, not a boolean", "tables/t.yml:10:11")
    assert len(diags) == 6, listing(diags)


def test_boolean_where_integer_expected(project):
    root = project({"sources/s.yml": RAW, **table("t", """
clean:
  retain: true
""")})
    diags = compile_errors(root)
    d = check(diags, "'retain' in 'clean' of table 't' must be an integer, not a boolean", "tables/t.yml:4:15")
    assert d.hint.startswith("Commits (or file versions) kept")
    assert len(diags) == 1, listing(diags)


def test_list_where_string_expected_and_mapping_expected_in_project_file(project):
    root = project({"pipe_project.yml": """
        name: shop
        lake: [a, b]
        targets:
          dev:
            spark:
              conf: [spark.x]
        vars: 3
    """})
    diags = compile_errors(root)
    check(diags, "'lake' in pipe_project.yml must be a string, not a list", "pipe_project.yml:2:7")
    check(diags, "'conf' in 'spark' of target 'dev' must be a mapping, not a list", "pipe_project.yml:6:13")
    check(diags, "'vars' in pipe_project.yml must be a mapping, not an integer", "pipe_project.yml:7:7")
    assert len(diags) == 3, listing(diags)


def test_target_that_is_not_a_mapping(project):
    root = project({"pipe_project.yml": """
        name: shop
        targets:
          dev: local
    """})
    diags = compile_errors(root)
    check(diags, "target 'dev' must be a mapping of settings, not a string", "pipe_project.yml:3:8")
    assert len(diags) == 1, listing(diags)


def test_project_file_that_is_not_a_mapping(project):
    root = project({"pipe_project.yml": "- shop\n"})
    check(compile_errors(root), "pipe_project.yml must be a mapping of settings, not a list", "pipe_project.yml:1:1")


def test_targets_that_are_a_list(project):
    root = project({"pipe_project.yml": "name: shop\ntargets: [dev, prod]\n"})
    diags = compile_errors(root)
    check(diags, "'targets' in pipe_project.yml must be a mapping, not a list", "pipe_project.yml:2:10")
    assert len(diags) == 1, listing(diags)


def test_source_kind_that_is_a_list(project):
    root = project({"sources/s.yml": RAW.replace("kind: files", "kind: [files]")})
    check(compile_errors(root), "'kind' in source 'raw' must be a string, not a list", "sources/s.yml:3:11")


def test_s3_events_integers_out_of_range(project):
    root = project({"sources/s.yml": """
        sources:
          ev:
            kind: s3_events
            queue_url: https://sqs.us-east-1.amazonaws.com/123456789012/events
            long_poll_wait_s: 21
            visibility_timeout_s: 50000
            max_messages_per_batch: 11
            max_receive_count: 0
    """})
    diags = compile_errors(root)
    check(diags, "'long_poll_wait_s' in source 'ev' is 21; it must be between 0 and 20", "sources/s.yml:5:23")
    check(diags, "'visibility_timeout_s' in source 'ev' is 50000; it must be between 0 and 43200", "sources/s.yml:6:27")
    d = check(diags, "'max_messages_per_batch' in source 'ev' is 11; it must be between 1 and 10", "sources/s.yml:7:29")
    assert "at most 10" in d.hint
    check(diags, "'max_receive_count' in source 'ev' is 0; it must be at least 1", "sources/s.yml:8:24")
    assert len(diags) == 4, listing(diags)


def test_s3_events_integers_at_their_bounds_are_accepted(project):
    root = project({"sources/s.yml": """
        sources:
          ev:
            kind: s3_events
            queue_url: https://sqs.us-east-1.amazonaws.com/123456789012/events
            long_poll_wait_s: 0
            visibility_timeout_s: 43200
            max_messages_per_batch: 10
    """})
    config = compile_project(root).plan.step("source.ev").config
    assert (config["long_poll_wait_s"], config["visibility_timeout_s"], config["max_messages_per_batch"]) == (0, 43200, 10)


def test_files_source_integer_minimum(project):
    root = project({"sources/s.yml": RAW + "    max_files_per_run: 0\n"})
    check(compile_errors(root), "'max_files_per_run' in source 'raw' is 0; it must be at least 1", "sources/s.yml:6:24")


def test_bad_size_strings(project):
    root = project({
        "sources/s.yml": RAW + "    max_bytes_per_run: lots\n",
        **table("t", """
max_file_size: 120XB
small_file_limit: -5
"""),
    })
    diags = compile_errors(root)
    check(diags, "'max_bytes_per_run' in source 'raw' must be a size such as 120MB or a number of bytes, not a string", "sources/s.yml:6:24")
    check(diags, "'max_file_size' in table 't' must be a size such as 120MB or a number of bytes, not a string", "tables/t.yml:3:20")
    check(diags, "'small_file_limit' in table 't' must be a size", "tables/t.yml:4:23")
    assert len(diags) == 3, listing(diags)


def test_size_strings_are_parsed_as_binary_units(project):
    root = project({"sources/s.yml": RAW, **table("t", """
max_file_size: 1GB
small_file_limit: 10mb
""")})
    config = compile_project(root).plan.step("table.t").config
    assert config["max_file_size"] == 1024**3
    assert config["small_file_limit"] == 10 * 1024**2


# --- missing required keys ---------------------------------------------------------------------


def test_project_name_is_required(project):
    root = project({"pipe_project.yml": "lake: lake\n"})
    diags = compile_errors(root)
    d = check(diags, "pipe_project.yml is missing required key 'name'", "pipe_project.yml:1:1")
    assert d.hint.startswith("add `name:`")
    assert len(diags) == 1, listing(diags)


def test_invalid_project_name(project):
    root = project({"pipe_project.yml": "name: my-shop\n"})
    check(compile_errors(root), "invalid project name 'my-shop'", "pipe_project.yml:1:7", "letters, digits and _")


def test_source_kind_is_required(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            path: data/raw
            format: json
    """})
    diags = compile_errors(root)
    check(diags, "source 'raw' is missing required key 'kind'", "sources/s.yml:2:3", "add `kind:`")
    assert len(diags) == 1, listing(diags)


def test_files_source_requires_path_and_format(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            kind: files
    """})
    diags = compile_errors(root)
    check(diags, "source 'raw' is missing required key 'path'", "sources/s.yml:2:3", "add `path:`")
    check(diags, "source 'raw' is missing required key 'format'", "sources/s.yml:2:3", "add `format:`")
    assert len(diags) == 2, listing(diags)


def test_table_source_requires_table(project):
    root = project({"sources/s.yml": """
        sources:
          changes:
            kind: table
    """})
    diags = compile_errors(root)
    check(diags, "source 'changes' is missing required key 'table'", "sources/s.yml:2:3", "add `table:`")
    assert len(diags) == 1, listing(diags)


def test_s3_events_source_requires_queue_url(project):
    root = project({"sources/s.yml": """
        sources:
          ev:
            kind: s3_events
            region: eu-west-1
    """})
    diags = compile_errors(root)
    check(diags, "source 'ev' is missing required key 'queue_url'", "sources/s.yml:2:3", "add `queue_url:`")
    assert len(diags) == 1, listing(diags)


def test_s3_events_queue_url_must_be_a_url(project):
    root = project({"sources/s.yml": """
        sources:
          ev:
            kind: s3_events
            queue_url: my-queue
    """})
    check(compile_errors(root), "queue_url of source 'ev' is not a URL: 'my-queue'", "sources/s.yml:4:16", "https://sqs.")


def test_table_source_reading_a_missing_table(project):
    root = project({
        "sources/s.yml": RAW + """
  changes:
    kind: table
    table: ordrs
  more:
    kind: table
    table: raw
""",
        "tables/orders.sql": SELECT_RAW,
    })
    diags = compile_errors(root)
    check(diags, "source 'changes' reads table 'ordrs', which does not exist", "sources/s.yml:9:12", "did you mean 'orders'?")
    check(diags, "source 'more' reads table 'raw', which does not exist", "sources/s.yml:12:12", "'raw' is a source")
    assert len(diags) == 2, listing(diags)


# --- unknown choices ---------------------------------------------------------------------------


def test_unknown_operation_lists_the_choices(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
operation: upsrt
""")})
    diags = compile_errors(root)
    d = check(diags, "unknown value 'upsrt' for 'operation' in table 't'", "tables/t.yml:4:16")
    assert d.hint == (
        "did you mean 'upsert'? choose one of: upsert, insert, bulk_insert, delete, insert_overwrite, "
        "insert_overwrite_table, delete_partition, bootstrap"
    )
    assert len(diags) == 1, listing(diags)


def test_unknown_table_type_lists_the_choices(project):
    root = project({"sources/s.yml": RAW, **table("t", "type: mor")})
    diags = compile_errors(root)
    d = check(diags, "unknown value 'mor' for 'type' in table 't'", "tables/t.yml:3:11")
    assert d.hint.endswith("choose one of: copy_on_write, merge_on_read")
    assert len(diags) == 1, listing(diags)


def test_unknown_source_kind_lists_the_choices(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            kind: file
            path: data/raw
            format: json
    """})
    diags = compile_errors(root)
    d = check(diags, "unknown source kind 'file' in source 'raw'", "sources/s.yml:3:11")
    assert d.hint == "did you mean 'files'? choose one of: files, s3_events, s3_incremental, table, hudi, kafka, jdbc"
    assert len(diags) == 1, listing(diags)


def test_unknown_format_lists_the_choices(project):
    root = project({"sources/s.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: jsonl
    """})
    diags = compile_errors(root)
    d = check(diags, "unknown value 'jsonl' for 'format' in source 'raw'", "sources/s.yml:5:13")
    assert d.hint == "did you mean 'json'? choose one of: json, csv, parquet"
    assert len(diags) == 1, listing(diags)


def test_format_and_sort_mode_choices_ignore_case(project):
    root = project({
        "sources/s.yml": RAW.replace("format: json", "format: JSON"),
        **table("t", """
operation: bulk_insert
bulk_insert_sort_mode: global_sort
"""),
    })
    plan = compile_project(root).plan
    assert plan.step("source.raw").config["format"] == "json"
    assert plan.step("table.t").config["bulk_insert_sort_mode"] == "GLOBAL_SORT"


# --- ref() and source() ------------------------------------------------------------------------


def test_ref_to_missing_table_points_at_the_sql_line(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/a.sql": """
            select *
            from
              {{ ref('missing') }}
        """,
    })
    diags = compile_errors(root)
    d = check(diags, "ref('missing'): no table named 'missing'", "tables/a.sql:3")
    assert d.location.file == "tables/a.sql" and d.location.line == 3 and d.location.col is None
    assert d.hint == "declare it in tables/*.yml or add tables/<name>.sql"
    assert len(diags) == 1, listing(diags)


def test_ref_with_a_typo_suggests_the_table(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/orders.sql": SELECT_RAW,
        "tables/a.sql": "select *\nfrom\n  {{ ref('order') }}\n",
    })
    check(compile_errors(root), "ref('order'): no table named 'order'", "tables/a.sql:3", "did you mean 'orders'?")


def test_ref_to_a_source_says_use_source(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom\n  {{ ref('raw') }}\n"})
    d = check(compile_errors(root), "ref('raw'): no table named 'raw'", "tables/a.sql:3")
    assert d.hint == "'raw' is a source: use source('raw')"


def test_source_to_missing_source(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom\n  {{ source('nope') }}\n"})
    d = check(compile_errors(root), "source('nope'): no source named 'nope'", "tables/a.sql:3")
    assert d.hint == "declare it in sources/*.yml"


def test_source_naming_a_table_says_use_ref(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/b.sql": SELECT_RAW,
        "tables/a.sql": "select *\nfrom\n  {{ source('b') }}\n",
    })
    d = check(compile_errors(root), "source('b'): no source named 'b'", "tables/a.sql:3")
    assert d.hint == "'b' is a table: use ref('b')"


def test_table_referring_to_itself(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom\n  {{ ref('a') }}\n"})
    diags = compile_errors(root)
    check(diags, "table 'a' refers to itself with ref('a')", "tables/a.sql:3", "{{ this }}")
    assert len(diags) == 1, listing(diags)


def test_ref_in_the_full_refresh_branch_is_checked_too(project):
    # the template is rendered twice when it asks is_incremental(); a missing table in the
    # branch taken only on a full refresh must still be reported
    root = project({
        "sources/s.yml": RAW,
        "tables/a.sql": """
            select * from {{ source('raw') }}
            {% if not is_incremental() %}
            union all select * from {{ ref('missing') }}
            {% endif %}
        """,
    })
    check(compile_errors(root), "ref('missing'): no table named 'missing'", "tables/a.sql:3")


def test_var_in_the_full_refresh_branch_is_checked_too(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/a.sql": """
            select * from {{ source('raw') }}
            {% if not is_incremental() %}
            where amount >= {{ var('min_amount') }}
            {% endif %}
        """,
    })
    check(compile_errors(root), "var('min_amount') is not defined", "tables/a.sql:3")


def test_ref_with_wrong_arguments(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom\n  {{ ref('a', 'b') }}\n"})
    check(compile_errors(root), "ref() takes one table name", "tables/a.sql:3")


# --- var() -------------------------------------------------------------------------------------


def test_undefined_var_points_at_the_sql_line(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": """
        select *
        from {{ source('raw') }}
        where amount >= {{ var('min_amount') }}
    """})
    diags = compile_errors(root)
    d = check(diags, "var('min_amount') is not defined", "tables/a.sql:3")
    assert "--vars '{min_amount: ...}'" in d.hint
    assert len(diags) == 1, listing(diags)


def test_undefined_var_suggests_a_close_name(project):
    root = project({
        "pipe_project.yml": "name: shop\nvars:\n  min_amount: 0\n",
        "sources/s.yml": RAW,
        "tables/a.sql": "select *\nfrom {{ source('raw') }}\nwhere amount >= {{ var('min_amont') }}\n",
    })
    d = check(compile_errors(root), "var('min_amont') is not defined", "tables/a.sql:3")
    assert d.hint.startswith("did you mean 'min_amount'?")


def test_var_with_default_compiles(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom {{ source('raw') }}\nwhere amount >= {{ var('min_amount', 7) }}\n"})
    assert compile_project(root).plan.step("table.a").sql.endswith("where amount >= 7\n")


def test_cli_vars_override_project_and_target_vars(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            targets:
              dev: {}
              prod:
                vars: {min_amount: 1}
            vars:
              min_amount: 0
        """,
        "sources/s.yml": RAW,
        "tables/a.sql": "select *\nfrom {{ source('raw') }}\nwhere amount >= {{ var('min_amount') }}\n",
    })
    assert compile_project(root).plan.step("table.a").sql.endswith(">= 0\n")
    assert compile_project(root, target="prod").plan.step("table.a").sql.endswith(">= 1\n")
    assert compile_project(root, target="prod", cli_vars={"min_amount": 5}).plan.step("table.a").sql.endswith(">= 5\n")


def test_cli_vars_define_a_missing_var(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": "select *\nfrom {{ source('raw') }}\nwhere amount >= {{ var('min_amount') }}\n"})
    compile_errors(root)
    assert compile_project(root, cli_vars={"min_amount": 3}).plan.step("table.a").sql.endswith(">= 3\n")


# --- duplicates --------------------------------------------------------------------------------


def test_same_table_in_two_yaml_files(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/a.yml": "tables:\n  orders:\n    key: [id]\n",
        "tables/b.yml": "tables:\n  orders:\n    key: [id]\n",
        "tables/orders.sql": SELECT_RAW,
    })
    diags = compile_errors(root)
    d = check(diags, "table 'orders' is declared twice (first at tables/a.yml:2:3)", "tables/b.yml:2:3")
    assert d.hint == "table names are unique across all files in tables/"
    assert len(diags) == 1, listing(diags)


def test_same_source_in_two_files(project):
    root = project({"sources/a.yml": RAW, "sources/b.yml": RAW})
    diags = compile_errors(root)
    check(diags, "source 'raw' is declared twice (first at sources/a.yml:2:3)", "sources/b.yml:2:3", "unique across all files in sources/")
    assert len(diags) == 1, listing(diags)


def test_source_and_table_with_one_name(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/t.yml": "tables:\n  raw:\n    key: [id]\n",
        "tables/raw.sql": "select 1 as id\n",
    })
    diags = compile_errors(root)
    check(diags, "'raw' is both a table and a source (source declared at sources/s.yml:2:3)", "tables/t.yml:2:3", "namespace of SQL names")
    assert len(diags) == 1, listing(diags)


def test_sql_only_table_with_the_name_of_a_source(project):
    root = project({"sources/s.yml": RAW, "tables/raw.sql": "select 1 as id\n"})
    check(compile_errors(root), "'raw' is both a table and a source", "tables/raw.sql:1:1")


def test_sql_file_away_from_its_yaml(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/core/t.yml": "tables:\n  t:\n    key: [id]\n",
        "tables/core/t.sql": SELECT_RAW,
        "tables/t.sql": SELECT_RAW,
    })
    diags = compile_errors(root)
    check(diags, "table 't' has a SQL file here but is declared at tables/core/t.yml:2:3", "tables/t.sql:1:1", "move the SQL to tables/core/t.sql")
    assert len(diags) == 1, listing(diags)


def test_duplicate_key_in_one_yaml_mapping(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
operation: upsert
key: [other]
""")})
    diags = compile_errors(root)
    check(diags, "duplicate key 'key' (first written at line 3)", "tables/t.yml:5:5", "remove or rename one of them")
    assert len(diags) == 1, listing(diags)


def test_duplicate_table_name_in_one_file(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/t.yml": "tables:\n  t:\n    key: [id]\n  t:\n    key: [other]\n",
        "tables/t.sql": SELECT_RAW,
    })
    check(compile_errors(root), "duplicate key 't' (first written at line 2)", "tables/t.yml:4:3")


def test_item_listed_twice(project):
    root = project({"sources/s.yml": RAW, **table("t", "key: [id, name, id]")})
    check(compile_errors(root), "'id' is listed twice in 'key' in table 't'", "tables/t.yml:3:21")


# --- cycles ------------------------------------------------------------------------------------


def test_two_table_cycle(project):
    root = project({
        "tables/a.sql": "select *\nfrom\n  {{ ref('b') }}\n",
        "tables/b.sql": "select *\n\n  from {{ ref('a') }}\n",
    })
    diags = compile_errors(root)
    d = check(diags, "dependency cycle: table.a -> table.b -> table.a", "tables/a.sql:3")
    assert "table.a -> table.b at tables/b.sql:3" in d.hint
    assert "table.b -> table.a at tables/a.sql:3" in d.hint
    assert len(diags) == 1, listing(diags)


def test_three_table_cycle(project):
    root = project({
        "tables/a.sql": "select *\nfrom\n  {{ ref('c') }}\n",
        "tables/b.sql": "select *\nfrom\n  {{ ref('a') }}\n",
        "tables/c.sql": "select *\nfrom\n  {{ ref('b') }}\n",
    })
    diags = compile_errors(root)
    d = check(diags, "dependency cycle: table.a -> table.b -> table.c -> table.a", "tables/a.sql:3")
    assert d.hint == (
        "break one link (table.a -> table.b at tables/b.sql:3; table.b -> table.c at tables/c.sql:3; "
        "table.c -> table.a at tables/a.sql:3)"
    )
    assert len(diags) == 1, listing(diags)


def test_cycle_through_a_table_source(project):
    root = project({
        "sources/s.yml": "sources:\n  changes:\n    kind: table\n    table: t\n",
        "tables/t.sql": "select *\nfrom\n  {{ source('changes') }}\n",
    })
    diags = compile_errors(root)
    d = one(diags, "dependency cycle: source.changes -> table.t -> source.changes")
    assert "table.t -> source.changes at sources/s.yml:4:12" in d.hint
    assert "source.changes -> table.t at tables/t.sql:3" in d.hint
    assert len(diags) == 1, listing(diags)


# --- settings that must fit the operation ------------------------------------------------------


def test_upsert_without_key(project):
    root = project({"sources/s.yml": RAW, **table("t", "operation: upsert")})
    diags = compile_errors(root)
    check(diags, "table 't' uses operation 'upsert', which needs a record key", "tables/t.yml:3:16", "add `key: [column]`")
    assert len(diags) == 1, listing(diags)


def test_delete_without_key(project):
    root = project({"sources/s.yml": RAW, **table("t", "operation: delete")})
    diags = compile_errors(root)
    check(diags, "table 't' uses operation 'delete', which needs a record key", "tables/t.yml:3:16")
    assert len(diags) == 1, listing(diags)


def test_delete_partition_without_partition_by(project):
    root = project(table("t", """
operation: delete_partition
partitions_to_delete: [region=EU]
""", sql=None))
    diags = compile_errors(root)
    check(diags, "table 't' uses delete_partition but has no partition_by", "tables/t.yml:3:16", "add `partition_by: [column]`")
    assert len(diags) == 1, listing(diags)


def test_delete_partition_without_partitions_or_sql(project):
    root = project(table("t", """
operation: delete_partition
partition_by: [region]
""", sql=None))
    diags = compile_errors(root)
    check(diags, "table 't' uses delete_partition but names no partitions", "tables/t.yml:3:16", "partitions_to_delete")
    assert len(diags) == 1, listing(diags)


def test_delete_partition_with_partitions_compiles(project):
    root = project(table("t", """
operation: delete_partition
partition_by: [region]
partitions_to_delete: [region=EU, "dt=2024-*"]
""", sql=None))
    assert compile_project(root).plan.step("table.t").config["partitions_to_delete"] == ["region=EU", "dt=2024-*"]


def test_delete_partition_with_sql_naming_the_partitions_compiles(project):
    root = project({"sources/s.yml": RAW, **table("t", """
operation: delete_partition
partition_by: [region]
""", sql="select distinct region from {{ source('raw') }}\n")})
    assert compile_project(root).plan.step("table.t").sql == "select distinct region from `raw`\n"


def test_partitions_to_delete_must_be_relative_paths(project):
    root = project(table("t", """
operation: delete_partition
partition_by: [region]
partitions_to_delete: [region=EU, /region=US]
""", sql=None))
    check(compile_errors(root), "'/region=US' is not a partition path (table 't')", "tables/t.yml:5:39")


def test_precombine_without_key(project):
    root = project({"sources/s.yml": RAW, **table("t", "precombine: updated_at")})
    diags = compile_errors(root)
    check(diags, "table 't' sets precombine but has no key", "tables/t.yml:3:17", "add `key:` or remove precombine")
    assert len(diags) == 1, listing(diags)


def test_precombine_on_replacing_operation_is_a_warning(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
precombine: updated_at
operation: insert_overwrite
""")})
    warnings = compile_project(root).warnings
    assert len(warnings) == 1
    assert warnings[0].severity == "warning"
    assert "precombine has no effect on table 't'" in warnings[0].message
    assert str(warnings[0].location) == "tables/t.yml:4:17"


def test_insert_duplicates_on_upsert(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
insert_duplicates: drop
""")})
    diags = compile_errors(root)
    check(diags, "insert_duplicates applies to insert and bulk_insert, not to upsert (table 't')", "tables/t.yml:4:24")
    assert len(diags) == 1, listing(diags)


def test_insert_duplicates_needs_a_key(project):
    root = project({"sources/s.yml": RAW, **table("t", "insert_duplicates: fail")})
    check(compile_errors(root), "insert_duplicates: fail needs a key to find duplicates (table 't')", "tables/t.yml:3:24")


def test_combine_before_insert_on_upsert(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
combine_before_insert: true
""")})
    diags = compile_errors(root)
    check(diags, "combine_before_insert applies to insert, bulk_insert and bootstrap, not to upsert (table 't')", "tables/t.yml:4:28")
    assert len(diags) == 1, listing(diags)


def test_bulk_insert_sort_mode_on_insert(project):
    root = project({"sources/s.yml": RAW, **table("t", """
operation: insert
bulk_insert_sort_mode: PARTITION_SORT
""")})
    diags = compile_errors(root)
    check(diags, "bulk_insert_sort_mode applies to bulk_insert and bootstrap, not to insert (table 't')", "tables/t.yml:4:28", "operation: bulk_insert")
    assert len(diags) == 1, listing(diags)


def test_partitions_to_delete_on_another_operation(project):
    root = project({"sources/s.yml": RAW, **table("t", """
operation: insert_overwrite
partition_by: [region]
partitions_to_delete: [region=EU]
""")})
    diags = compile_errors(root)
    check(diags, "partitions_to_delete applies to delete_partition, not to insert_overwrite (table 't')", "tables/t.yml:5:27")
    assert len(diags) == 1, listing(diags)


def test_delete_when_needs_upsert(project):
    root = project({"sources/s.yml": RAW, **table("t", """
operation: insert
delete_when: "status = 'cancelled'"
""")})
    diags = compile_errors(root)
    check(diags, "delete_when needs operation upsert, but table 't' uses insert", "tables/t.yml:4:18", "operation: upsert")
    assert len(diags) == 1, listing(diags)


def test_partition_index_needs_partition_by(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
index: partition
""")})
    diags = compile_errors(root)
    check(diags, "index: partition needs partition_by (table 't')", "tables/t.yml:4:12")
    assert len(diags) == 1, listing(diags)


def test_compaction_on_copy_on_write(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
compaction: {max_delta_commits: 3}
""")})
    diags = compile_errors(root)
    check(diags, "compaction applies to merge_on_read tables; table 't' is copy_on_write", "tables/t.yml:4:17", "type: merge_on_read")
    assert len(diags) == 1, listing(diags)


def test_compaction_on_merge_on_read_compiles(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
type: merge_on_read
compaction: {max_delta_commits: 3}
""")})
    assert compile_project(root).plan.step("table.t").config["compaction"] == {"inline": True, "max_delta_commits": 3}


def test_bootstrap_without_bootstrap_section(project):
    root = project(table("t", "operation: bootstrap", sql=None))
    diags = compile_errors(root)
    check(diags, "table 't' uses operation bootstrap but has no bootstrap settings", "tables/t.yml:3:16", "bootstrap: {path:")
    assert len(diags) == 1, listing(diags)


def test_bootstrap_with_a_sql_file(project):
    root = project(table("t", """
operation: bootstrap
bootstrap: {path: data/old}
""", sql="select 1 as id\n"))
    diags = compile_errors(root)
    check(diags, "table 't' is bootstrapped from bootstrap.path, so tables/t.sql is not used", "tables/t.yml:3:16", "remove tables/t.sql")
    assert len(diags) == 1, listing(diags)


def test_bootstrap_settings_with_another_operation(project):
    root = project({"sources/s.yml": RAW, **table("t", """
operation: insert
bootstrap: {path: data/old}
""")})
    diags = compile_errors(root)
    check(diags, "table 't' has bootstrap settings but operation 'insert'", "tables/t.yml:4:16", "operation: bootstrap")
    assert len(diags) == 1, listing(diags)


def test_bootstrap_compiles_without_sql(project):
    root = project(table("t", """
operation: bootstrap
bootstrap: {path: data/old, partition_regex: "day=.*"}
""", sql=None))
    config = compile_project(root).plan.step("table.t").config
    assert config["bootstrap"] == {"path": "data/old", "mode": "full_record", "partition_regex": "day=.*"}


def test_metadata_only_bootstrap_is_refused(project):
    root = project(table("t", """
operation: bootstrap
bootstrap: {path: data/old, mode: metadata_only}
""", sql=None))
    diags = compile_errors(root)
    check(diags, "table 't': metadata_only bootstrap is not supported", "tables/t.yml:4:39", "mode: full_record")
    assert len(diags) == 1, listing(diags)


def test_bootstrap_partition_regex_must_compile(project):
    root = project(table("t", """
operation: bootstrap
bootstrap:
  path: data/old
  partition_regex: "region=(EU"
""", sql=None))
    check(compile_errors(root), "bootstrap.partition_regex of table 't' is not a valid regular expression", "tables/t.yml:6:24")


def test_table_without_sql_file(project):
    root = project(table("t", "key: [id]", sql=None))
    diags = compile_errors(root)
    check(diags, "table 't' has no SQL: tables/t.sql does not exist", "tables/t.yml:2:3", "create tables/t.sql")
    assert len(diags) == 1, listing(diags)


def test_small_file_limit_above_max_file_size(project):
    root = project({"sources/s.yml": RAW, **table("t", """
max_file_size: 64MB
small_file_limit: 100MB
""")})
    check(compile_errors(root), "small_file_limit is larger than max_file_size (table 't')", "tables/t.yml:4:23")


# --- archive and clean -------------------------------------------------------------------------


def test_archive_min_instants_must_be_below_max(project):
    root = project({"sources/s.yml": RAW, **table("t", """
archive:
  min_instants: 30
  max_instants: 30
""")})
    diags = compile_errors(root)
    check(diags, "archive.min_instants (30) must be below archive.max_instants (30) (table 't')", "tables/t.yml:4:21")
    assert len(diags) == 1, listing(diags)


def test_archive_min_instants_must_be_above_clean_retain(project):
    root = project({"sources/s.yml": RAW, **table("t", """
clean:
  retain: 12
archive:
  min_instants: 12
""")})
    diags = compile_errors(root)
    check(diags, "archive.min_instants (12) must be above clean.retain (12) (table 't')", "tables/t.yml:6:21", "raise min_instants or lower retain")
    assert len(diags) == 1, listing(diags)


def test_clean_retain_above_default_archive_points_at_retain(project):
    # archive is not written: the setting the user wrote, clean.retain, is where to look
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
clean:
  retain: 25
""")})
    diags = compile_errors(root)
    check(diags, "archive.min_instants (20) must be above clean.retain (25) (table 't')", "tables/t.yml:5:15")
    assert len(diags) == 1, listing(diags)


def test_clean_retain_is_free_with_file_version_policy(project):
    root = project({"sources/s.yml": RAW, **table("t", """
clean:
  policy: keep_latest_file_versions
  retain: 25
""")})
    assert compile_project(root).plan.step("table.t").config["clean"]["retain"] == 25


# --- declared columns --------------------------------------------------------------------------


def test_columns_missing_from_ddl_schema(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
precombine: updated
partition_by: [regon]
schema: "id BIGINT, updated_at TIMESTAMP, region STRING"
""")})
    diags = compile_errors(root)
    check(diags, "precombine column 'updated' of table 't' is not in its declared schema", "tables/t.yml:4:17", "did you mean 'updated_at'?")
    check(diags, "partition_by column 'regon' of table 't' is not in its declared schema", "tables/t.yml:5:20", "did you mean 'region'?")
    assert len(diags) == 2, listing(diags)


def test_key_missing_from_mapping_schema(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [order_id, id]
schema:
  order_id: BIGINT
  ts: TIMESTAMP
""")})
    diags = compile_errors(root)
    d = check(diags, "key column 'id' of table 't' is not in its declared schema", "tables/t.yml:3:21")
    assert d.hint == "declared columns: order_id, ts"
    assert len(diags) == 1, listing(diags)


def test_key_written_as_a_bare_string_is_located_at_its_value(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: id
schema: "order_id BIGINT"
""")})
    check(compile_errors(root), "key column 'id' of table 't' is not in its declared schema", "tables/t.yml:3:10")


def test_meta_column_as_key(project):
    root = project({"sources/s.yml": RAW, **table("t", "key: [_hoodie_record_key]")})
    diags = compile_errors(root)
    check(diags, "'_hoodie_record_key' in key of table 't' is a Hudi meta column", "tables/t.yml:3:11", "use a column of your data")
    assert len(diags) == 1, listing(diags)


def test_unknown_type_in_ddl_schema(project):
    root = project({"sources/s.yml": RAW, **table("t", 'schema: "id BIGINT, name STRNG"')})
    diags = compile_errors(root)
    check(diags, "'schema' in table 't': unknown type 'STRNG'", "tables/t.yml:3:13", "did you mean 'string'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_type_in_mapping_schema(project):
    root = project({"sources/s.yml": RAW, **table("t", """
schema:
  id: BIGINT
  amount: doubel
""")})
    diags = compile_errors(root)
    check(diags, "column 'amount' in 'schema' in table 't': unknown type 'doubel'", "tables/t.yml:5:15", "did you mean 'double'?")
    assert len(diags) == 1, listing(diags)


@pytest.mark.parametrize("ddl, message, hint", [
    ("id BIGINT, amount DECIMAL(40,2)", "DECIMAL(40,2): precision 40 is out of range (1 to 38, Spark's maximum)", "DECIMAL(38,2)"),
    ("id BIGINT, amount decimal(0)", "DECIMAL(0): precision 0 is out of range", None),
    ("id BIGINT, amount DECIMAL(5,7)", "DECIMAL(5,7): scale 7 is larger than precision 5", None),
    ("id BIGINT, amount DECIMAL(10,2,1)", "DECIMAL(10,2,1) has 3 numbers", "DECIMAL(precision,scale)"),
    ("id BIGINT, name VARCHAR", "VARCHAR needs a length, e.g. VARCHAR(255)", "or STRING"),
    ("id BIGINT, code char, name STRING", "CHAR needs a length", "or STRING"),
    ("id BIGINT, name VARCHAR(10,2)", "VARCHAR(10,2) takes one number, the length", None),
])
def test_types_spark_refuses_are_refused_where_written(project, ddl, message, hint):
    root = project({"sources/s.yml": RAW, **table("t", f'schema: "{ddl}"')})
    diags = compile_errors(root)
    check(diags, message, "tables/t.yml:3:13", hint)
    assert len(diags) == 1, listing(diags)


def test_types_spark_refuses_in_a_mapping_schema_name_their_column(project):
    root = project({"sources/s.yml": RAW + "    schema:\n      id: BIGINT\n      fee: DECIMAL(39,0)\n      note: varchar\n"})
    diags = compile_errors(root)
    check(diags, "column 'fee' in 'schema' in source 'raw': DECIMAL(39,0): precision 39 is out of range", "sources/s.yml:8:12")
    check(diags, "column 'note' in 'schema' in source 'raw': VARCHAR needs a length", "sources/s.yml:9:13")


def test_largest_decimal_and_sized_varchar_are_accepted(project):
    root = project({"sources/s.yml": RAW, **table("t", 'schema: "id BIGINT, amount DECIMAL(38,18), small DECIMAL(5), name VARCHAR(255), code CHAR(3), n DECIMAL"')})
    step = compile_project(root).plan.step("table.t")
    assert [c["type"] for c in step.config["schema"]] == ["bigint", "decimal(38,18)", "decimal(5)", "varchar(255)", "char(3)", "decimal(10,0)"]


def test_unknown_type_in_source_schema(project):
    root = project({"sources/s.yml": RAW + '    schema: "id BIGINT, at TIMESTAMPZ"\n'})
    check(compile_errors(root), "'schema' in source 'raw': unknown type 'TIMESTAMPZ'", "sources/s.yml:6:13", "did you mean 'timestamp'?")


def test_column_declared_twice_in_schema(project):
    root = project({"sources/s.yml": RAW, **table("t", 'schema: "id BIGINT, ID STRING"')})
    check(compile_errors(root), "column 'ID' is declared twice", "tables/t.yml:3:13")


# --- names, YAML and Jinja syntax ---------------------------------------------------------------


def test_invalid_table_name(project):
    root = project({"sources/s.yml": RAW, "tables/t.yml": "tables:\n  1bad:\n    key: [id]\n"})
    diags = compile_errors(root)
    check(diags, "invalid table name '1bad'", "tables/t.yml:2:3", "letters, digits and _")
    assert len(diags) == 1, listing(diags)


def test_invalid_sql_only_table_name(project):
    root = project({"tables/my-table.sql": "select 1 as id\n"})
    check(compile_errors(root), "invalid table name 'my-table'", "tables/my-table.sql:1:1")


def test_invalid_source_name(project):
    root = project({"sources/s.yml": RAW.replace("raw:", "raw-orders:")})
    check(compile_errors(root), "invalid source name 'raw-orders'", "sources/s.yml:2:3")


def test_yaml_syntax_error_has_line_and_column(project):
    root = project({
        "tables/t.yml": "tables:\n  t:\n    key: id\n    operation: upsert: now\n",
        "tables/t.sql": "select 1 as id\n",
    })
    diags = compile_errors(root)
    d = check(diags, "YAML syntax error: mapping values are not allowed", "tables/t.yml:4:22", "indentation")
    assert (d.location.file, d.location.line, d.location.col) == ("tables/t.yml", 4, 22)
    assert len(diags) == 1, listing(diags)


def test_yaml_syntax_error_in_project_file_is_the_only_error(project):
    # the name is there; a file that cannot be parsed must not also be reported as lacking it
    root = project({"pipe_project.yml": "name: shop\nlake: [lake\n"})
    diags = compile_errors(root)
    one(diags, "YAML syntax error")
    assert len(diags) == 1, listing(diags)


def test_jinja_syntax_error_points_at_the_sql_line(project):
    root = project({"sources/s.yml": RAW, "tables/a.sql": """
        select *
        from {{ source('raw') }}
        where {% endif %}
    """})
    diags = compile_errors(root)
    check(diags, "template syntax error:", "tables/a.sql:3", "{{ }} and {% %}")
    assert len(diags) == 1, listing(diags)


def test_undefined_jinja_name_points_at_the_sql_line(project):
    root = project({
        "sources/s.yml": RAW,
        "tables/b.sql": SELECT_RAW,
        "tables/a.sql": "select *\nfrom\n  {{ refs('b') }}\n",
    })
    diags = compile_errors(root)
    check(diags, "undefined name in template: 'refs' is undefined", "tables/a.sql:3", "did you mean 'ref'?")
    assert len(diags) == 1, listing(diags)


def test_jinja_syntax_error_in_a_macro_file(project):
    root = project({
        "macros/m.sql": "{% macro cents(x) %}\n  ({{ x }} * 100\n{% endmacro %}\n{% macro bad( %}{% endmacro %}\n",
        "tables/a.sql": "select 1 as id\n",
    })
    check(compile_errors(root), "template syntax error:", "macros/m.sql:4")


# --- targets and lake --------------------------------------------------------------------------


def test_unknown_target_from_the_command_line(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            targets:
              dev: {}
              staging: {}
              prod: {}
        """,
        "tables/a.sql": "select 1 as id\n",
    })
    diags = compile_errors(root, target="stage")
    d = check(diags, "unknown target 'stage'", "<command line>", "did you mean 'staging'?")
    assert d.location.line is None
    assert len(diags) == 1, listing(diags)


def test_unknown_default_target(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            default_target: prd
            targets:
              dev: {}
              prod: {}
        """,
        "tables/a.sql": "select 1 as id\n",
    })
    diags = compile_errors(root)
    check(diags, "unknown target 'prd'", "pipe_project.yml:2:17", "did you mean 'prod'?")
    assert len(diags) == 1, listing(diags)


def test_unknown_target_without_close_match_lists_targets(project):
    root = project({"pipe_project.yml": "name: shop\ntargets:\n  dev: {}\n  prod: {}\n"})
    d = check(compile_errors(root, target="qa"), "unknown target 'qa'", "<command line>")
    assert d.hint == "targets in this project: dev, prod"


def test_lake_with_unsupported_scheme(project):
    root = project({"pipe_project.yml": "name: shop\nlake: gs://bucket/lake\n"})
    check(compile_errors(root), "lake 'gs://bucket/lake' uses a storage pipe cannot write to", "pipe_project.yml:2:7", "s3://bucket/prefix")


# --- all at once -------------------------------------------------------------------------------


def test_all_errors_are_reported_in_one_go(project):
    root = project({
        "pipe_project.yml": """
            name: shop
            lake: lake
            targts: {}
        """,
        "sources/s.yml": """
            sources:
              raw:
                kind: files
                path: data/raw
                format: jsn
        """,
        "tables/a.yml": """
            tables:
              a:
                operation: upsert
        """,
        "tables/a.sql": """
            select *
            from {{ source('raw') }}
            join {{ ref('missing') }} using (id)
        """,
        "tables/b.sql": """
            select *
            from {{ ref('a') }}
            where amount >= {{ var('min_amount') }}
        """,
    })
    diags = compile_errors(root)
    assert [(str(d.location), d.message) for d in diags] == [
        ("pipe_project.yml:3:1", "unknown key 'targts' in pipe_project.yml"),
        ("sources/s.yml:5:13", "unknown value 'jsn' for 'format' in source 'raw'"),
        ("tables/a.sql:3", "ref('missing'): no table named 'missing'"),
        ("tables/a.yml:3:16", "table 'a' uses operation 'upsert', which needs a record key"),
        ("tables/b.sql:3", "var('min_amount') is not defined"),
    ]
    assert all(d.hint for d in diags)


def test_declared_columns_avro_refuses_are_errors_at_their_line(project):
    root = project({"sources/s.yml": RAW, **table("t", """
key: [id]
schema:
  id: BIGINT
  order-id: BIGINT
  "my col": STRING
""", sql="select 1 as id, 2 as order_id, 'x' as my_col\n")})
    diags = compile_errors(root)
    check(diags, "column 'order-id' of table 't' is not a valid Avro name", "tables/t.yml:6:17", "`order-id` as order_id")
    check(diags, "column 'my col' of table 't' is not a valid Avro name", "tables/t.yml:7:17", "`my col` as my_col")
    root = project({"sources/s.yml": RAW, **table("u", 'key: [id]\nschema: "id BIGINT, `1st` STRING"\n', sql="select 1 as id, 'x' as `1st`\n")})
    check([d for d in compile_errors(root) if "Avro" in d.message], "column '1st' of table 'u'", "tables/u.yml:4:13", "`1st` as _1st")


def test_nothing_in_a_project_is_ignored_without_a_warning_saying_what_to_do(tmp_path):
    """What a migrating dbt team brings (models/, snapshots/, analyses/, dbt_project.yml) and
    files in pipe's folders that pipe does not read each get a warning at their path; notes,
    hidden files and Python's caches do not."""
    from compiler import compile_project

    root = write_project(tmp_path / "p", {
        "pipe_project.yml": "name: p\n",
        "tables/t.sql": "select 1 as id\n",
        "tables/README.md": "notes\n",
        "tables/.hidden.txt": "x\n",
        "tables/__pycache__/t.cpython-311.pyc": "x",
        "tables/lookup.csv": "a,b\n1,2\n",
        "macros/helpers.py": "x = 1\n",
        "sources/raw.sql": "select 1\n",
        "tests/schema.json": "{}\n",
        "snapshots/orders_snapshot.sql": "{% snapshot s %}select 1{% endsnapshot %}\n",
        "analyses/adhoc.sql": "select 1\n",
        "models/m.sql": "select 1\n",
        "dbt_project.yml": "name: p\n",
    })
    warnings = {d.location.file: (d.message, d.hint) for d in compile_project(root).warnings}
    assert set(warnings) == {"tables/lookup.csv", "macros/helpers.py", "sources/raw.sql", "tests/schema.json", "snapshots/",
                             "analyses/", "models/", "dbt_project.yml"}, warnings
    assert warnings["macros/helpers.py"][0] == "pipe does not read macros/helpers.py: Python models live in tables/"
    assert "tables/<name>.py" in warnings["macros/helpers.py"][1]
    assert "seeds/" in warnings["tables/lookup.csv"][1]
    assert warnings["snapshots/"][0] == "pipe does not read snapshots/ (dbt snapshots)" and "timeline" in warnings["snapshots/"][1]
    assert "tables/" in warnings["models/"][1] and "pipe_project.yml" in warnings["dbt_project.yml"][0]
    # the warnings come back with a compile that partial parsing skips (same files), and go with the file
    assert {d.location.file for d in compile_project(root, cache_dir=root / "target").warnings} == set(warnings)
    (root / "macros/helpers.py").unlink()
    assert "macros/helpers.py" not in {d.location.file for d in compile_project(root).warnings}
