"""The layering the code keeps: no import circles in the Spark plumbing (runtime/spark/, which
imports only downwards in the order its __init__ lists) nor in the command line (pipe/), and
the errors a run raises at the bottom (runtime/errors.py), not in the steps above the layers that
raise them. Imports inside functions count as much as those at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from tests.conftest import REPO

PACKAGES = ("runtime", "pipe", "compiler")
# runtime/spark, bottom first (its __init__'s docstring says what each is)
SPARK_LAYERS = ("info", "settings", "java", "class_archive", "cluster", "server", "connect", "session", "api")


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _exists(name: str) -> bool:
    base = REPO / name.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def import_graph() -> nx.DiGraph:
    """Module -> each module of pipe's it imports (`from a.b import c` counts as a.b.c when c is a
    module, else as a.b)."""
    graph = nx.DiGraph()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            here = _module(path)
            graph.add_node(here)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        target = full if _exists(full) else node.module
                        if target.split(".")[0] in PACKAGES:
                            graph.add_edge(here, target)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in PACKAGES:
                            graph.add_edge(here, alias.name)
    return graph


def _cycles(graph: nx.DiGraph, prefix: str) -> list[list[str]]:
    return list(nx.simple_cycles(graph.subgraph(n for n in graph if n.startswith(prefix))))


def test_the_spark_plumbing_imports_only_downwards():
    graph = import_graph()
    spark = {n for n in graph if n.startswith("runtime.spark.")}
    assert spark == {f"runtime.spark.{m}" for m in SPARK_LAYERS}, "a module of runtime/spark is missing from SPARK_LAYERS (and its __init__'s list)"
    upwards = [(a, b) for a, b in graph.edges if a in spark and b in spark
               and SPARK_LAYERS.index(b.rsplit(".", 1)[1]) >= SPARK_LAYERS.index(a.rsplit(".", 1)[1])]
    assert upwards == []
    # nor through the rest of runtime and back
    assert [c for c in _cycles(graph, "runtime") if any(m in spark for m in c)] == []


def test_the_command_line_has_no_import_circle():
    assert _cycles(import_graph(), "pipe") == []


def test_the_errors_of_a_run_live_below_the_layers_that_raise_them():
    graph = import_graph()
    below = set(nx.descendants(graph, "runtime.errors"))
    assert below <= {"compiler.errors", "runtime.task_errors", "runtime.table.errors"}
    steps_users = sorted({a for a, b in graph.edges if b.startswith("runtime.steps") and not a.startswith(("runtime.steps", "pipe."))})
    # the executor runs the steps; a data diff reads the checkpoints the steps keep (runtime.steps.context.stored)
    assert steps_users == ["runtime.data_diff", "runtime.executor"]
