"""The schedule: in-degree counters over the DAG, and what a skip means for the steps after."""

from __future__ import annotations

from typing import Any

from coder import taskfile
from coder.run.schedule import Schedule


def task(*steps: dict[str, Any]) -> taskfile.Task:
    return taskfile.from_dict({"id": "t", "title": "t", "graph": list(steps)})


def shell(sid: str, *deps: str, explicit: bool = True) -> dict[str, Any]:
    step: dict[str, Any] = {"id": sid, "kind": "shell", "cmd": "true"}
    if explicit:
        step["depends_on"] = list(deps)
    return step


def fresh(t: taskfile.Task) -> Schedule:
    return Schedule(t, {s.id: "pending" for s in t.steps})


def test_ready_steps_come_in_topological_then_file_order() -> None:
    t = task(shell("a"), shell("b", "a"), shell("c", "a"), shell("d", "b", "c"))
    s = fresh(t)
    assert s.take(5) == ["a"]
    assert s.take(5) == []  # nothing else until a is resolved
    assert s.resolve("a", "success") == []
    assert s.take(1) == ["b"] and s.take(5) == ["c"]
    s.resolve("b", "success")
    assert s.take(5) == []  # d still waits for c
    s.resolve("c", "success")
    assert s.take(5) == ["d"]


def test_an_explicit_requirement_skipped_skips_its_dependents_transitively() -> None:
    t = task(shell("a"), shell("b", "a"), shell("c", "b"), shell("d", "a"), shell("e", "c", "d"))
    s = fresh(t)
    s.take(1)
    s.resolve("a", "success")
    assert s.take(5) == ["b", "d"]
    assert s.resolve("b", "skipped") == [("c", "b"), ("e", "c")]  # e: while d still runs
    assert s.resolve("d", "success") == []
    assert s.take(5) == []


def test_the_implicit_sequence_goes_on_after_a_skipped_step() -> None:
    t = task(*(shell(f"s{i}", explicit=False) for i in range(1, 5)))
    assert t.sequential
    s = fresh(t)
    assert s.take(5) == ["s1"]
    s.resolve("s1", "success")
    assert s.take(5) == ["s2"]
    assert s.resolve("s2", "skipped") == []
    assert s.take(5) == ["s3"]


def test_a_resumed_run_starts_after_its_done_and_skipped_steps() -> None:
    t = task(shell("a"), shell("b", "a"), shell("c", "b"), shell("d", "a"))
    s = Schedule(t, {"a": "success", "b": "skipped", "c": "pending", "d": "pending"})
    assert s.blocked == [("c", "b")]
    assert s.take(5) == ["d"]
    assert s.take(5) == []


def test_each_step_is_queued_once_in_a_long_chain() -> None:
    n = 2000
    t = task(*(shell(f"s{i}", *([f"s{i - 1}"] if i else [])) for i in range(n)))
    s = Schedule(t, {f"s{i}": "success" if i < n // 2 else "pending" for i in range(n)})
    taken = []
    while batch := s.take(3):
        taken += batch
        for sid in batch:
            s.resolve(sid, "success")
    assert taken == [f"s{i}" for i in range(n // 2, n)]
