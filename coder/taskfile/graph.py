"""The task DAG: build it, find cycles, order it, walk it.

An edge `dep -> step` means "dep runs before step". Orders are deterministic: ties are broken
by the step's position in the taskfile. Plain Python over adjacency lists: a taskfile's graph
is small, and importing networkx cost `coder validate` a tenth of its time (bench/startup.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Graph:
    """Step ids in file order (`position`), each with the steps that need it (`after`) and
    those it needs (`before`), both in the order the edges were added."""

    position: dict[str, int] = field(default_factory=dict)
    after: dict[str, list[str]] = field(default_factory=dict)
    before: dict[str, list[str]] = field(default_factory=dict)


def build(deps: Mapping[str, Sequence[str]]) -> Graph:
    """`deps` maps each step id (in file order) to the ids it depends on; unknown ids are
    ignored here (the taskfile checks report them)."""
    g = Graph()
    for position, step in enumerate(deps):
        g.position[step] = position
        g.after[step] = []
        g.before[step] = []
    for step, needs in deps.items():
        for dep in needs:
            if dep in deps and step not in g.after[dep]:
                g.after[dep].append(step)
                g.before[step].append(dep)
    return g


def cycles(g: Graph) -> list[list[str]]:
    """One cycle per strongly connected component, each as a closed path [a, b, a]: the first
    one a depth-first walk from the component's earliest step meets."""
    found = []
    for component in _components(g):
        start = min(component, key=g.position.__getitem__)
        if len(component) == 1 and start not in g.after[start]:
            continue
        found.append(_cycle_from(g, start, component))
    return sorted(found, key=lambda p: g.position[p[0]])


def order(g: Graph) -> list[str]:
    """Topological order, file order among independent steps."""
    waiting = {step: len(needs) for step, needs in g.before.items()}
    ready = [(g.position[s], s) for s, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, step = heapq.heappop(ready)
        out.append(step)
        for nxt in g.after[step]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                heapq.heappush(ready, (g.position[nxt], nxt))
    if len(out) != len(g.position):
        raise ValueError("the graph has a cycle")
    return out


def levels(g: Graph) -> list[list[str]]:
    """Parallel levels: every step of a level only needs steps of earlier levels."""
    waiting = {step: len(needs) for step, needs in g.before.items()}
    level = [s for s, n in waiting.items() if n == 0]
    out = []
    while level:
        out.append(sorted(level, key=g.position.__getitem__))
        following = []
        for step in level:
            for nxt in g.after[step]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    following.append(nxt)
        level = following
    if sum(map(len, out)) != len(g.position):
        raise ValueError("the graph has a cycle")
    return out


def descendants(g: Graph, steps: Iterable[str]) -> set[str]:
    """Every step that needs one of `steps`, directly or not."""
    out: set[str] = set()
    for step in steps:
        out |= _reach(g.after, step)
    return out


def ancestors(g: Graph, step: str) -> set[str]:
    """Every step that `step` needs, directly or not."""
    return _reach(g.before, step)


def _reach(edges: dict[str, list[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(edges[start])
    while todo:
        step = todo.pop()
        if step not in seen:
            seen.add(step)
            todo.extend(edges[step])
    seen.discard(start)  # as networkx: a step is not its own ancestor, even in a cycle
    return seen


def _components(g: Graph) -> list[set[str]]:
    """The strongly connected components (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in g.position:
        if root in index:
            continue
        work = [(root, iter(g.after[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(g.after[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(component)
    return found


def _cycle_from(g: Graph, start: str, component: set[str]) -> list[str]:
    """The first cycle a depth-first walk from `start` meets, edges taken in the order they
    were added, as a closed path."""
    path = [start]
    on_path = {start}
    visited = {start}
    work = [iter(g.after[start])]
    while work:
        for nxt in work[-1]:
            if nxt not in component:
                continue
            if nxt in on_path:
                cycle = path[path.index(nxt) :]
                return [*cycle, nxt]
            if nxt not in visited:
                visited.add(nxt)
                path.append(nxt)
                on_path.add(nxt)
                work.append(iter(g.after[nxt]))
                break
        else:
            work.pop()
            on_path.discard(path.pop())
    raise ValueError(f"no cycle through {start}")
