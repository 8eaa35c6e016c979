"""The fast path for simple templates must give exactly what Jinja gives: same plan bytes,
same errors at the same places."""

from __future__ import annotations

import shutil

import pytest

from compiler.api import compile_project
from compiler.errors import ProjectError
from compiler.render import Renderer
from compiler.simple_template import SimpleTemplate
from tests.conftest import TEMPLATE

CORPUS = {
    "a": "select * from {{ source('raw') }} where amount >= {{ var('min_amount') }}",
    "b": "select {{money('amount')}} as amount,\n  '{{ target.name }}' as t, {{ var('absent', -1.5) }} as d\nfrom {{ ref(\"a\") }}",
    "c": "select {{ var('flag', true) }} as f, {{ var('n', none) }} as n, '{{ project_name }}' as p from {{ ref('b') }} -- }} {",
    "d": "select '{{ env_var('SECRET') }}' as s, '{{ env_var('R', 'eu') }}' as r from {{ this }}",
    "e": "select {{ money(expression='x') }} as m from {{ ref('a') }}\n\n",
    "f": "select 1 as x {{ '{{' }} literal",
    "g": "select {{ var('list_var') }} as l, {{ 1 + 2 }} as three",
}


def _project(tmp_path, extra=None):
    files = {
        "pipe_project.yml": "name: demo\nvars: {min_amount: 3, list_var: [1, 2]}\n",
        "sources/s.yml": "sources:\n  raw: {kind: files, path: data, format: json}\n",
        "macros/m.sql": "{% macro money(expression) %}round({{ expression }}, 2){% endmacro %}",
    }
    files.update({f"tables/{k}.sql": v for k, v in CORPUS.items()})
    files.update(extra or {})
    root = tmp_path / "p"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _both(root, monkeypatch, **kwargs):
    fast = compile_project(root, **kwargs)
    monkeypatch.setattr(Renderer, "fast_path", False)
    slow = compile_project(root, **kwargs)
    monkeypatch.setattr(Renderer, "fast_path", True)
    return fast, slow


def test_corpus_renders_identically_on_both_paths(tmp_path, monkeypatch):
    root = _project(tmp_path)
    # the corpus renders odd SQL on purpose (Python's None, unclosed braces): not checked as SQL
    fast, slow = _both(root, monkeypatch, check_sql=False)
    assert fast.plan.to_json() == slow.plan.to_json()
    # and the simple ones really took the fast path
    simple = {k for k, v in CORPUS.items() if SimpleTemplate.parse(k, v) is not None}
    assert simple == {"a", "b", "c", "d", "e"}


def test_example_project_renders_identically_on_both_paths(tmp_path, monkeypatch):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    fast, slow = _both(tmp_path / "shop", monkeypatch)
    assert fast.plan.to_json() == slow.plan.to_json()


@pytest.mark.parametrize(
    "sql",
    [
        "select 1\nfrom x\njoin {{ ref('nope') }}",
        "select 1\n\n{{ var('undefined_var') }}",
        "select 1\n\n{{ source('a') }}",
        "select 1\n\n{{ no_such_function('x') }}",
        "select 1\n\n{{ env_var('1bad') }}",
        "select 1\n{{ money() }}",
        "select 1\n\n{{ ref('z') }",
    ],
)
def test_errors_are_the_same_on_both_paths(tmp_path, monkeypatch, sql):
    root = _project(tmp_path, {"tables/z.sql": sql})
    with pytest.raises(ProjectError) as fast:
        compile_project(root)
    monkeypatch.setattr(Renderer, "fast_path", False)
    with pytest.raises(ProjectError) as slow:
        compile_project(root)
    as_text = lambda e: [str(d) for d in e.value.diagnostics]  # noqa: E731
    assert as_text(fast) == as_text(slow)
    assert any(d.location.file in ("tables/z.sql", "macros/m.sql") and d.location.line for d in fast.value.diagnostics)
