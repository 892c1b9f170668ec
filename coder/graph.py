"""The task DAG (networkx): build it, find cycles, order it, walk it.

An edge `dep -> step` means "dep runs before step". Orders are deterministic: ties are broken
by the step's position in the taskfile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeAlias

import networkx as nx

Graph: TypeAlias = (
    "nx.DiGraph[str]"  # nodes: step ids (str), with a `position` attribute (file order)
)


def build(deps: Mapping[str, Sequence[str]]) -> Graph:
    """`deps` maps each step id (in file order) to the ids it depends on; unknown ids are
    ignored here (the taskfile checks report them)."""
    g: Graph = nx.DiGraph()
    for position, step in enumerate(deps):
        g.add_node(step, position=position)
    for step, needs in deps.items():
        for dep in needs:
            if dep in deps:
                g.add_edge(dep, step)
    return g


def cycles(g: Graph) -> list[list[str]]:
    """One cycle per strongly connected component, each as a closed path [a, b, a]."""
    found = []
    for component in nx.strongly_connected_components(g):
        sub = g.subgraph(component)
        if len(component) == 1 and not sub.has_edge(*component, *component):
            continue
        start = min(component, key=lambda n: g.nodes[n]["position"])
        edges = nx.find_cycle(sub, source=start)
        path = [u for u, _ in edges]
        found.append(path + [path[0]])
    return sorted(found, key=lambda p: g.nodes[p[0]]["position"])


def order(g: Graph) -> list[str]:
    """Topological order, file order among independent steps."""
    return list(nx.lexicographical_topological_sort(g, key=lambda n: g.nodes[n]["position"]))


def levels(g: Graph) -> list[list[str]]:
    """Parallel levels: every step of a level only needs steps of earlier levels."""
    return [
        sorted(gen, key=lambda n: g.nodes[n]["position"]) for gen in nx.topological_generations(g)
    ]


def descendants(g: Graph, steps: Iterable[str]) -> set[str]:
    """Every step that needs one of `steps`, directly or not."""
    out: set[str] = set()
    for step in steps:
        out |= nx.descendants(g, step)
    return out


def ancestors(g: Graph, step: str) -> set[str]:
    """Every step that `step` needs, directly or not."""
    return set(nx.ancestors(g, step))
