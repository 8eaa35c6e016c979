"""dbt-style selection over the step graph (`pipe ls --select ... --exclude ...`)."""

from __future__ import annotations

import pytest

from compiler.api import compile_project
from compiler.errors import ProjectError
from compiler.graph import select


@pytest.fixture
def graph(project):
    # raw -> a -> b -> c ; a -> d ; e (alone, from raw2) ; s_t reads table b incrementally -> f
    root = project({
        "sources/s.yml": """
            sources:
              raw:  {kind: files, path: data/a, format: json, tags: [landing]}
              raw2: {kind: files, path: data/b, format: csv}
              s_t:  {kind: table, table: b}
        """,
        "tables/core/a.yml": "tables:\n  a: {key: [id], tags: [core, nightly]}\n",
        "tables/core/a.sql": "select * from {{ source('raw') }}",
        "tables/core/b.yml": "tables:\n  b: {tags: [core], type: merge_on_read}\n",
        "tables/core/b.sql": "select * from {{ ref('a') }}",
        "tables/marts/c.sql": "select * from {{ ref('b') }}",
        "tables/marts/d.sql": "select * from {{ ref('a') }}",
        "tables/e.sql": "select * from {{ source('raw2') }}",
        "tables/f.sql": "select * from {{ source('s_t') }}",
    })
    return compile_project(root).graph


def sel(graph, *select_args, exclude=()):
    return select(graph, list(select_args), list(exclude))


def test_no_selection_means_every_step_in_topological_order(graph):
    ids = sel(graph)
    assert set(ids) == set(graph.nodes)
    for upstream, downstream in graph.edges:
        assert ids.index(upstream) < ids.index(downstream)


def test_name_selects_tables_and_sources_and_full_ids(graph):
    assert sel(graph, "b") == ["table.b"]
    assert sel(graph, "raw") == ["source.raw"]
    assert sel(graph, "source.raw2") == ["source.raw2"]
    assert sel(graph, "raw*") == ["source.raw", "source.raw2"]


def test_graph_operators(graph):
    assert sel(graph, "+b") == ["source.raw", "table.a", "table.b"]
    assert sel(graph, "b+") == ["table.b", "source.s_t", "table.c", "table.f"]
    assert sel(graph, "+b+") == ["source.raw", "table.a", "table.b", "source.s_t", "table.c", "table.f"]
    assert sel(graph, "a+1") == ["table.a", "table.b", "table.d"]
    assert sel(graph, "1+b") == ["table.a", "table.b"]
    assert sel(graph, "@d") == ["source.raw", "table.a", "table.d"]


def test_methods(graph):
    assert sel(graph, "tag:core") == ["table.a", "table.b"]
    assert sel(graph, "tag:landing") == ["source.raw"]
    assert sel(graph, "path:tables/marts") == ["table.c", "table.d"]
    assert sel(graph, "path:tables/core/a.yml") == ["table.a"]
    assert sel(graph, "path:tables/core/a.sql") == ["table.a"]
    assert sel(graph, "path:tables/*/c.sql") == ["table.c"]
    assert sel(graph, "source:*") == ["source.raw", "source.raw2", "source.s_t"]
    assert sel(graph, "table:e") == ["table.e"]
    assert sel(graph, "config.type:merge_on_read") == ["table.b"]
    assert sel(graph, "config.format:csv") == ["source.raw2"]
    assert sel(graph, "config.clean.retain:10", exclude=["config.type:copy_on_write"]) == ["table.b"]
    assert sel(graph, "config.max_file_size:120MB,tag:nightly") == ["table.a"]


def test_union_intersection_and_exclude(graph):
    assert sel(graph, "c e") == ["table.c", "table.e"]
    assert sel(graph, "c", "e") == ["table.c", "table.e"]
    assert sel(graph, "tag:core,tag:nightly") == ["table.a"]
    assert sel(graph, "+c", exclude=["source:*"]) == ["table.a", "table.b", "table.c"]
    assert sel(graph, exclude=["tag:core+"]) == ["source.raw", "source.raw2", "table.e"]


def test_a_selector_matching_nothing_is_an_error_with_did_you_mean(graph):
    cases = [
        (("nope",), (), "--select 'nope' matches no step", None),
        (("bb",), (), "--select 'bb' matches no step", "did you mean 'b'?"),
        (("+tag:cor",), (), "--select '+tag:cor' matches no step", "did you mean 'core'?"),
        (("path:tables/core/a.yaml",), (), "matches no step", "did you mean 'tables/core/a.yml'?"),
        (("table:raw",), (), "--select 'table:raw' matches no step", None),
        (("config.typ:merge_on_read",), (), "matches no step", "did you mean 'config.type'?"),
        (("config.type:merge_on_rd",), (), "matches no step", "did you mean 'merge_on_read'?"),
        (("a",), ("tag:nightl",), "--exclude 'tag:nightl' matches no step", "did you mean 'nightly'?"),
        (("table.e",), ("table.ee",), "--exclude 'table.ee' matches no step", "did you mean 'table.e'?"),
    ]
    for select_args, exclude, message, hint in cases:
        with pytest.raises(ProjectError) as info:
            sel(graph, *select_args, exclude=list(exclude))
        [d] = info.value.diagnostics
        assert d.message == message or message in d.message, (select_args, d)
        assert str(d.location) == "<command line>"
        if hint:
            assert d.hint == hint, (select_args, d)


def test_an_empty_intersection_or_everything_excluded_is_an_error(graph):
    with pytest.raises(ProjectError) as info:
        sel(graph, "c,e")
    assert "no step matches all of 'c', 'e'" in info.value.diagnostics[0].message
    with pytest.raises(ProjectError) as info:
        sel(graph, "tag:core", exclude=["a b"])
    assert "every step that --select 'tag:core' matches is excluded" in info.value.diagnostics[0].message


def test_unknown_method_is_a_clear_error(graph):
    with pytest.raises(ProjectError) as info:
        sel(graph, "colour:red")
    [d] = info.value.diagnostics
    assert "unknown selector method 'colour'" in d.message
    assert "tag" in d.hint


# --- on the command line -------------------------------------------------------------------------


def _pipe(capsys, *args):
    from pipe.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def shop(tmp_path):
    import shutil

    from tests.conftest import TEMPLATE

    shutil.copytree(TEMPLATE, tmp_path / "shop", ignore=shutil.ignore_patterns("lake", "target"))
    return str(tmp_path / "shop")


def test_several_selectors_after_one_flag_like_dbt(shop, capsys):
    code, out, err = _pipe(capsys, "--project-dir", shop, "ls", "--select", "orders", "customers", "--exclude", "test:* unit:*", "--output", "json")
    assert code == 0, err
    assert [line.split('"id": "')[1].split('"')[0] for line in out.splitlines()] == ["table.customers", "table.orders"]
    # a table brings its tests along, and excluding one takes its tests away (dbt's eager selection)
    code, out, _ = _pipe(capsys, "--project-dir", shop, "ls", "-s", "+customer_revenue", "--exclude", "source:*", "orders")
    assert (code, out.split()) == (0, ["table.customers", "table.customer_revenue", "test.expression_customers_email",
                                       "test.not_null_customers_customer_id", "test.unique_customers_customer_id"])
    # the same words as one quoted argument, and as repeated flags
    assert _pipe(capsys, "--project-dir", shop, "ls", "--select", "orders customers", "--exclude", "test:* unit:*")[1] == \
        _pipe(capsys, "--project-dir", shop, "ls", "--select", "orders", "--select", "customers", "--exclude", "test:* unit:*")[1] == \
        "table.customers\ntable.orders\n"


def test_run_takes_several_selectors_and_refuses_one_matching_nothing(shop, capsys):
    code, out, err = _pipe(capsys, "--project-dir", shop, "run", "--dry-run", "--select", "orders", "customers", "--threads", "1")
    assert code == 0, err
    assert "orders" in out and "customers" in out and "customer_revenue" not in out
    code, out, err = _pipe(capsys, "--project-dir", shop, "run", "--select", "order")
    assert code == 2 and out == ""
    assert "<command line>: error: --select 'order' matches no step" in err and "did you mean 'orders'?" in err
    code, _, err = _pipe(capsys, "--project-dir", shop, "ls", "--exclude", "tag:reportin")
    assert code == 2 and "--exclude 'tag:reportin' matches no step" in err and "did you mean 'reporting'?" in err
