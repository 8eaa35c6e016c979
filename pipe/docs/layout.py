"""The lineage graph's layout, computed when the site is generated so the browser only draws:
layers left to right (a node's layer is the longest path to it from a node with no upstream),
and within each layer an order that keeps edges from crossing, found by a few barycenter sweeps
(each node moves to the mean height of its neighbours in the layers before, then after)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

SWEEPS = 4  # down, up, down, up: more rarely removes more crossings on pipelines


@dataclass(frozen=True)
class Position:
    layer: int
    row: float  # height within the layer, centred on 0 (rows are 1 apart)


def layered_layout(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> dict[str, Position]:
    """Positions of `nodes`, given in topological order (as the plan's steps are), of the
    acyclic graph `edges` (upstream, downstream); edges to nodes not listed are ignored."""
    order = list(nodes)
    known = set(order)
    ups: dict[str, list[str]] = {n: [] for n in order}
    downs: dict[str, list[str]] = {n: [] for n in order}
    for a, b in edges:
        if a in known and b in known:
            ups[b].append(a)
            downs[a].append(b)
    layer: dict[str, int] = {}
    for n in order:  # upstream first: its layer is known
        layer[n] = 1 + max((layer[u] for u in ups[n]), default=-1)
    layers: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in order:
        layers[layer[n]].append(n)
    row = _rows(layers)
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        for nodes_ in (layers[1:] if down else layers[-2::-1]):
            neighbours = ups if down else downs
            centre = {n: (sum(row[m] for m in neighbours[n]) / len(neighbours[n]) if neighbours[n] else row[n]) for n in nodes_}
            nodes_.sort(key=lambda n: (centre[n], row[n]))  # stable: ties keep their order
            row.update(_rows([nodes_]))
    return {n: Position(layer[n], row[n]) for n in order}


def _rows(layers: list[list[str]]) -> dict[str, float]:
    """Each node's height: its index in its layer, the layer centred on 0."""
    return {n: i - (len(nodes) - 1) / 2 for nodes in layers for i, n in enumerate(nodes)}

