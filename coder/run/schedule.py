"""Which steps may start next: in-degree counters over the task DAG.

A step becomes ready when every step before it in the graph is resolved (done or skipped).
What a skipped step means for the steps after it depends on how the order was written:

    explicit `depends_on`   "requires": a step whose requirement was skipped is skipped too
    implicit file order     (no step declares depends_on) an order only: the next step runs

Each step is pushed and popped once and each edge counted down once, so a whole run costs
O(steps + edges) here, whatever its size. Ties go to the step first in topological order
(file order among independent steps), as `graph.order` gives it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from coder.run.records import DONE as RESOLVED
from coder.taskfile import Task, graph


class Schedule:
    def __init__(self, task: Task, statuses: Mapping[str, str]) -> None:
        """`statuses`: each step's status at the start (a resumed run has some done)."""
        dag = graph.build(task.deps())
        self.rank = {sid: i for i, sid in enumerate(graph.order(dag))}
        self.requires = not task.sequential
        self.after: dict[str, list[str]] = {sid: [] for sid in self.rank}
        self.waiting: dict[str, int] = {}
        for step in task.steps:
            for dep in step.depends_on:
                self.after[dep].append(step.id)
            self.waiting[step.id] = len(step.depends_on)
        self.status = dict(statuses)
        self._ready: list[tuple[int, str]] = []
        self.blocked: list[tuple[str, str]] = []  # (step, the skipped step it requires)
        resolved: list[str] = []
        for sid in [s for s in self.rank if self.waiting[s] == 0]:  # before any counts down
            self._arrive(sid, resolved)
        self._release(resolved)

    def take(self, n: int) -> list[str]:
        """Up to `n` ready steps, first in topological order first."""
        return [heapq.heappop(self._ready)[1] for _ in range(min(n, len(self._ready)))]

    def resolve(self, step_id: str, status: str) -> list[tuple[str, str]]:
        """`step_id` ended `success` or `skipped`: count its followers down. Returns the steps
        this skipped because they require it (directly or not), each with the step they
        required, in the order found; the caller records them as skipped."""
        assert status in RESOLVED, status
        self.status[step_id] = status
        self.blocked = []
        self._release([step_id])
        return self.blocked

    def _release(self, resolved: list[str]) -> None:
        """Count down the followers of resolved steps; a follower whose count reaches zero is
        queued, or (already resolved, as on resume, or skipped for a requirement) passes the
        release on. A worklist, not recursion: a resumed chain can be 10,000 steps long."""
        while resolved:
            sid = resolved.pop()
            skipped = self.status[sid] == "skipped"
            for nxt in self.after[sid]:
                if skipped and self.requires and self.status.get(nxt, "pending") == "pending":
                    self.status[nxt] = "skipped"
                    self.blocked.append((nxt, sid))
                self.waiting[nxt] -= 1
                if self.waiting[nxt] == 0:
                    self._arrive(nxt, resolved)

    def _arrive(self, sid: str, resolved: list[str]) -> None:
        """Every step before `sid` is resolved: queue it, or pass on what it already is."""
        status = self.status.get(sid, "pending")
        if status in RESOLVED:
            resolved.append(sid)
        elif status == "pending":
            heapq.heappush(self._ready, (self.rank[sid], sid))
