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


def test_nothing_matches_gives_empty(graph):
    assert sel(graph, "nope") == []


def test_unknown_method_is_a_clear_error(graph):
    with pytest.raises(ProjectError) as info:
        sel(graph, "colour:red")
    [d] = info.value.diagnostics
    assert "unknown selector method 'colour'" in d.message
    assert "tag" in d.hint
