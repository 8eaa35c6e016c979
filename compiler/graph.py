"""The dependency graph of steps and dbt-style selection over it.

Nodes are step ids: `source.<name>` (ingest) and `table.<name>` (write). An edge u -> v means v
reads what u produces: a table's SQL calls ref()/source(), a `kind: table` source reads a table,
an `s3_incremental` source reads its metadata table."""

from __future__ import annotations

import fnmatch
import graphlib
import heapq
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from compiler.errors import Collector, Diagnostic, Location, ProjectError, did_you_mean
from compiler.schema import parse_size

if TYPE_CHECKING:
    import networkx as nx

# networkx is imported by the functions that use it, not here: importing it takes about 0.2 s
# (its __init__ loads every algorithm), and a compile without a cycle only needs the ids, Edge
# and topological_order of this module.


def source_id(name: str) -> str:
    return f"source.{name}"


def table_id(name: str) -> str:
    return f"table.{name}"


def test_id(name: str) -> str:
    return f"test.{name}"


@dataclass(frozen=True)
class Edge:
    upstream: str
    downstream: str
    location: Location  # where the dependency is written (the ref() call, the `table:` key)


def build_graph(nodes: Mapping[str, Mapping], edges: Iterable[Edge]) -> nx.DiGraph:
    """`nodes` maps step id to its attributes (kind, name, tags, files, config)."""
    import networkx as nx

    graph = nx.DiGraph()
    for step_id in sorted(nodes):
        graph.add_node(step_id, **nodes[step_id])
    for edge in sorted(edges, key=lambda e: (e.upstream, e.downstream)):
        if not graph.has_edge(edge.upstream, edge.downstream):
            graph.add_edge(edge.upstream, edge.downstream, location=edge.location)
    return graph


def check_cycles(graph: nx.DiGraph, errors: Collector) -> None:
    """Reports every cycle (one per strongly connected component), with the path around it
    and where each link is written."""
    import networkx as nx

    for component in sorted((sorted(c) for c in nx.strongly_connected_components(graph)), key=lambda c: c[0]):
        if len(component) == 1 and not graph.has_edge(component[0], component[0]):
            continue
        cycle = nx.find_cycle(graph.subgraph(component), source=component[0])
        path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
        links = "; ".join(f"{u} -> {v} at {graph.edges[u, v]['location']}" for u, v in cycle)
        first = graph.edges[cycle[-1][0], cycle[-1][1]]["location"]
        errors.error(first, f"dependency cycle: {path}", f"break one link ({links})")


def generations(graph: nx.DiGraph) -> list[list[str]]:
    import networkx as nx

    return [sorted(g) for g in nx.topological_generations(graph)]


def topological_order(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    """Step ids in the plan's deterministic order: topological, and alphabetical among steps
    that are ready together (the order of networkx's lexicographical_topological_sort). Raises
    graphlib.CycleError when the edges make a cycle.

    Built on the standard library's graphlib rather than networkx: a compile orders its steps
    without importing networkx (about 0.2 s), which only the commands that select need."""
    sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for node in nodes:
        sorter.add(node)
    for upstream, downstream in edges:
        sorter.add(downstream, upstream)
    sorter.prepare()
    ready = list(sorter.get_ready())
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        sorter.done(node)
        for nxt in sorter.get_ready():
            heapq.heappush(ready, nxt)
    return order


def ordered(graph: nx.DiGraph, ids: Iterable[str] | None = None) -> list[str]:
    """The graph's step ids (or those of `ids`) in the plan's order (`topological_order`)."""
    order = topological_order(graph.nodes, graph.edges)
    if ids is None:
        return order
    keep = set(ids)
    return [i for i in order if i in keep]


# --- selection ------------------------------------------------------------------------------

_ATOM = re.compile(r"^(?P<at>@)?(?:(?P<up>\d*)\+)?(?P<body>[^+@]+?)(?:\+(?P<down>\d*))?$")
METHODS = ("name", "tag", "path", "source", "table", "test", "unit", "seed", "resource_type", "config", "state", "result")
# resource_type:VALUE (dbt's): what a step is; a seed is a table step whose rows are a CSV (compiler/seeds.py)
RESOURCE_TYPES = ("seed", "table", "model", "source", "test", "unit_test")
# state:/result: compare with a reference run (compiler/state.py): (method, value) -> step ids
StateMatcher = Callable[[str, str], set]
_KINDS = {"source": "ingest", "table": "write", "test": "test", "unit": "unit"}
_ABSENT = object()


class SelectionError(ProjectError):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__([Diagnostic(Location("<command line>"), message, hint)])


def select(graph: nx.DiGraph, select: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
           state: StateMatcher | None = None) -> list[str]:
    """Step ids chosen by dbt-style selectors, in topological order.

    Each argument may hold several selectors separated by spaces (union); a selector may join
    atoms with commas (intersection). An atom is `[@][N+]method:value[+N]`, where method is
    name (the default; also a full step id), tag, path, source, table, test, unit, seed,
    resource_type (seed, table, model, source, test, unit_test), config.KEY, or
    state and result (against the reference `state` of --state DIR). Nothing selected means
    everything.

    A selector that matches no step is a mistake (a typo would otherwise run or list nothing,
    or exclude nothing, without a word): SelectionError names it, with a did-you-mean. So is a
    selection whose result is empty although each of its selectors matched."""
    chosen = _with_tests(graph, _union(graph, select, "--select", state)) if _has_any(select) else set(graph.nodes)
    if _has_any(exclude):
        chosen -= _with_tests(graph, _union(graph, exclude, "--exclude", state))
    if not chosen and graph.nodes and not _compares(select):
        what = " ".join(a for a in (select or ()) if a.strip())
        raise SelectionError(
            f"no step is left: every step that --select {what!r} matches is excluded by --exclude" if _has_any(select)
            else "no step is left: --exclude leaves out every step",
            "check the --exclude selectors (`pipe ls --select ...` shows what each one matches)")
    return ordered(graph, chosen)


def _with_tests(graph: nx.DiGraph, chosen: set[str]) -> set[str]:
    """Selecting (or excluding) a table or source selects (or excludes) the tests that read it,
    as dbt's eager indirect selection does: `--select orders` brings orders' tests along."""
    tests = {t for n in chosen for t in graph.successors(n) if graph.nodes[t]["kind"] == "test"}
    # a unit test depends on no step: it comes with the table it tests (config `model`)
    units = {u for u, a in graph.nodes(data=True) if a["kind"] == "unit" and f"table.{a['config'].get('model')}" in chosen}
    return chosen | tests | units


def _has_any(args: Iterable[str] | None) -> bool:
    return any(a.strip() for a in (args or ()))


def _union(graph: nx.DiGraph, args: Iterable[str], flag: str, state: StateMatcher | None = None) -> set[str]:
    out: set[str] = set()
    for arg in args:
        for selector in arg.split():
            parts = [p for p in selector.split(",") if p]
            sets = []
            for p in parts:
                found = _atom(graph, p, state)
                if not found and _method_of(p) in ("state", "result"):
                    sets.append(found)  # nothing modified, nothing failed: an empty answer, not a typo
                    continue
                if not found:
                    raise SelectionError(f"{flag} '{p}' matches no step", _no_match_hint(graph, p))
                sets.append(found)
            both = set.intersection(*sets) if sets else set()
            if sets and not both and not any(_method_of(p) in ("state", "result") for p in parts):
                raise SelectionError(f"{flag} '{selector}' matches no step: no step matches all of " + ", ".join(f"'{p}'" for p in parts),
                                     "a comma means AND; separate selectors with spaces for OR (`--select a b`)")
            out |= both
    return out


def _no_match_hint(graph: nx.DiGraph, text: str) -> str:
    """A did-you-mean for an atom that matched nothing, from the values its method can match."""
    m = _ATOM.match(text)
    body = m.group("body") if m else text
    method, _, value = body.partition(":") if ":" in body else ("name", "", body)
    nodes = graph.nodes
    if method.startswith("config."):
        key = method[len("config."):].split(".")[0]
        keys = {k for n in nodes for k in (nodes[n].get("config") or {})}
        if key not in keys:
            near = did_you_mean(key, keys)
            return near.replace("'", "'config.", 1) if near else f"no step has a setting '{key}'"
        values = {str(v).lower() for n in nodes for v in _as_list((nodes[n].get("config") or {}).get(key))}
        return did_you_mean(value.lower(), values) or f"values of {key} in this project: " + ", ".join(sorted(values)[:12])
    if method == "tag":
        tags = {t for n in nodes for t in nodes[n]["tags"]}
        return did_you_mean(value, tags) or ("tags in this project: " + ", ".join(sorted(tags)) if tags else "no step has a tag")
    if method == "path":
        files = {f for n in nodes for f in nodes[n]["files"]}
        return did_you_mean(value, files) or "paths are relative to the project folder, e.g. tables/orders.yml or tables/"
    names = {nodes[n]["name"] for n in nodes if method not in _KINDS or nodes[n]["kind"] == _KINDS[method]}
    if method == "name" and "." in value:
        names |= set(nodes)
    return did_you_mean(value, names) or ("steps: " + ", ".join(sorted(names)[:12]) + (", ..." if len(names) > 12 else "") if names else "the project has no steps")


def _compares(args: Iterable[str] | None) -> bool:
    """Whether a selection compares with a reference run: an empty result is then an answer."""
    return any(_method_of(p) in ("state", "result") for a in (args or ()) for sel in a.split() for p in sel.split(","))


def _method_of(text: str) -> str:
    m = _ATOM.match(text)
    body = m.group("body") if m else text
    return body.partition(":")[0] if ":" in body else "name"


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _atom(graph: nx.DiGraph, text: str, state: StateMatcher | None = None) -> set[str]:
    import networkx as nx

    m = _ATOM.match(text)
    if not m:
        raise SelectionError(f"cannot read selector '{text}'", "use name, +name, name+, +name+, @name, tag:x, path:tables/x.yml or config.KEY:value")
    base = _match(graph, m.group("body"), state)
    result = set(base)
    if m.group("up") is not None:
        result |= _within(graph, base, m.group("up"), upstream=True)
    if m.group("down") is not None or m.group("at"):
        down = _within(graph, base, m.group("down") or "", upstream=False)
        result |= down
        if m.group("at"):
            for node in down | base:
                result |= nx.ancestors(graph, node)
    return result


def _resource_type(attributes: Mapping) -> str:
    """seed, model (a table step that is not a seed), source or test."""
    kind = attributes["kind"]
    if kind == "write":
        return "seed" if (attributes.get("config") or {}).get("seed") else "model"
    return {"ingest": "source", "unit": "unit_test"}.get(kind, kind)


def _within(graph: nx.DiGraph, start: set[str], depth: str, upstream: bool) -> set[str]:
    import networkx as nx

    limit = int(depth) if depth else None
    g = graph.reverse(copy=False) if upstream else graph
    found: set[str] = set()
    for node in start:
        reach = nx.single_source_shortest_path_length(g, node, cutoff=limit)
        found |= {n for n, d in reach.items() if d > 0}
    return found


def _match(graph: nx.DiGraph, body: str, state: StateMatcher | None = None) -> set[str]:
    method, _, value = body.partition(":") if ":" in body else ("name", "", body)
    key = None
    if method.startswith("config."):
        method, key = "config", method[len("config."):]
    if method not in METHODS:
        raise SelectionError(f"unknown selector method '{method}' in '{body}'", "methods: " + ", ".join(METHODS))
    nodes = graph.nodes
    if method in ("state", "result"):
        if state is None:
            raise SelectionError(f"'{body}' compares with a reference run: it needs --state DIR",
                                 "give the folder of the reference run's plan.json and run_results.json, e.g. `--state prod-target/` "
                                 "(production's target/, kept by CI)" if method == "state" else
                                 "`--state target/` selects on the results of this project's last run")
        return {n for n in state(method, value) if n in nodes}
    if method == "name":
        if value in nodes:
            return {value}
        return {n for n in nodes if fnmatch.fnmatchcase(nodes[n]["name"], value)}
    if method in _KINDS:
        return {n for n in nodes if nodes[n]["kind"] == _KINDS[method] and fnmatch.fnmatchcase(nodes[n]["name"], value)}
    if method == "seed":
        return {n for n in nodes if _resource_type(nodes[n]) == "seed" and fnmatch.fnmatchcase(nodes[n]["name"], value)}
    if method == "resource_type":
        if value not in RESOURCE_TYPES:
            raise SelectionError(f"unknown resource type '{value}' in '{body}'", (did_you_mean(value, RESOURCE_TYPES) or "")
                                 + " resource types: " + ", ".join(RESOURCE_TYPES) + " (model: a table that is not a seed)")
        if value == "table":  # every table step, seeds included, as table:NAME
            return {n for n in nodes if nodes[n]["kind"] == "write"}
        return {n for n in nodes if _resource_type(nodes[n]) == value}
    if method == "tag":
        return {n for n in nodes if any(fnmatch.fnmatchcase(t, value) for t in nodes[n]["tags"])}
    if method == "path":
        probe = value.rstrip("/")
        return {
            n for n in nodes
            if any(f == probe or f.startswith(probe + "/") or fnmatch.fnmatchcase(f, value) for f in nodes[n]["files"])
        }
    # config.KEY:value
    out = set()
    for n in nodes:
        have = nodes[n].get("config") or {}
        for part in key.split("."):  # config.clean.policy:keep_latest_commits
            have = have.get(part, _ABSENT) if isinstance(have, dict) else _ABSENT
        if have is _ABSENT:
            continue
        values = have if isinstance(have, list) else [have]
        size = parse_size(value)  # config.max_file_size:120MB compares bytes
        if any(str(v).lower() == value.lower() or (type(v) is int and v == size) for v in values):
            out.add(n)
    return out
