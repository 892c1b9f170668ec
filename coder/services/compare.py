"""`coder compare -t A -t B`: two runs side by side (a fork and its parent, say), so the better
one can be merged and the other cleaned: per step the outcome, tries, tokens and time of each,
the totals, and the diff from A's branch to B's (a stat, or the whole patch).

`coder compare -t A --step S`: the candidates of a step tried several ways at once
(coder.run.candidates) side by side: each one's verdict, diff size, tokens and failing tests,
and what its kept commit changed from the round's start (a stat, or the whole patch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coder.display import escaped
from coder.errors import InvalidInput
from coder.git import branches, diffs
from coder.run.judge import summary
from coder.run.opened import OpenRun, open_run
from coder.run.records import DONE, CandidateRecord, StepRecord
from coder.run.secrets import view_redactor
from coder.services import history


@dataclass(frozen=True)
class Side:
    """One run's part of a row (None fields: the run has no such step)."""

    status: str | None
    attempts: int | None
    tokens: int | None
    duration_s: float | None
    commit: str | None


@dataclass(frozen=True)
class Row:
    step: str
    a: Side
    b: Side


@dataclass(frozen=True)
class Totals:
    task_id: str
    status: str
    branch: str
    tip: str | None
    parent: str | None
    done: int
    steps: int
    tokens: int
    duration_s: float
    model: str | None


@dataclass(frozen=True)
class Comparison:
    a: Totals
    b: Totals
    rows: tuple[Row, ...]
    diff: str  # from A's branch to B's: a stat, or the patch with `patch`
    identical: bool  # the two branches hold the same files

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rows"] = [asdict(r) for r in self.rows]
        return data


def compare_runs(cwd: Path, first: str, second: str, *, patch: bool = False) -> Comparison:
    if first == second:
        raise InvalidInput(f"both sides are run {first}", hint="name two runs: -t A -t B")
    views = open_run(cwd, first), open_run(cwd, second)
    repo = views[0].repo
    tips = [branches.branch_tip(repo, v.manifest.branch) for v in views]
    order = list(views[0].state.steps)
    order += [s for s in views[1].state.steps if s not in order]
    steps = views[0].state.steps, views[1].state.steps
    rows = tuple(Row(s, _side(steps[0].get(s)), _side(steps[1].get(s))) for s in order)
    text, identical = "", False
    if tips[0] and tips[1]:
        identical = diffs.changed_files_between(repo, tips[0], tips[1]) == []

        redactor = view_redactor(views[0].root, [v.manifest.worktree for v in views])
        if patch:
            text = diffs.diff_patch(repo, tips[0], tips[1])
        else:
            text = diffs.diff_stat(
                repo, tips[0], tips[1], shown=lambda n: history.shown_name(n, redactor)
            )
        text = escaped(redactor.redact(text), lines=True)
    return Comparison(_totals(views[0], tips[0]), _totals(views[1], tips[1]), rows, text, identical)


@dataclass(frozen=True)
class Tried:
    """One candidate of a step's last round, and what its commit changed (empty: it left no
    commit, or its kept branch and commit are gone)."""

    number: int
    verdict: str
    seed: int | None
    diff_lines: int | None
    tokens: int | None
    failing_tests: int | None
    branch: str | None
    commit: str | None
    error: str | None
    diff: str


@dataclass(frozen=True)
class Round:
    task_id: str
    step: str
    summary: str  # "2 of 4 candidates passed; candidate 3 won: ..."
    candidates: tuple[Tried, ...]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["candidates"] = [asdict(c) for c in self.candidates]
        return data


def compare_candidates(cwd: Path, task: str, step: str, *, patch: bool = False) -> Round:
    """The candidates of `step` of run `task`, side by side."""
    view = open_run(cwd, task)
    record = view.state.steps.get(step)
    if record is None:
        known = ", ".join(view.state.steps) or "none"
        raise InvalidInput(f"run {task} has no step '{step}' (its steps: {known})")
    if not record.candidates:
        raise InvalidInput(
            f"step '{step}' of run {task} was not tried several ways",
            hint="set `candidates: N` on the step, or run with `--candidates N`",
        )
    redactor = view_redactor(view.root, [view.manifest.worktree])

    def changed(c: CandidateRecord) -> str:
        commit = c.get("commit")
        if not commit or commit not in view.repo:
            return ""
        parent = branches.resolve_commit(view.repo, f"{commit}^")  # the round's start
        text = (
            diffs.diff_patch(view.repo, parent, commit)
            if patch
            else diffs.diff_stat(
                view.repo, parent, commit, shown=lambda n: history.shown_name(n, redactor)
            )
        )
        return escaped(redactor.redact(text), lines=True)

    tried = tuple(
        Tried(
            number=c["number"],
            verdict=c["verdict"],
            seed=c.get("seed"),
            diff_lines=c.get("diff_lines"),
            tokens=c.get("tokens"),
            failing_tests=c.get("failing_tests"),
            branch=c.get("branch"),
            commit=c.get("commit"),
            error=redactor.redact(c.get("error") or "") or None,
            diff=changed(c),
        )
        for c in record.candidates
    )
    return Round(view.state.task_id, step, redactor.redact(summary(record.candidates)), tried)


def _side(record: StepRecord | None) -> Side:
    if record is None:
        return Side(None, None, None, None, None)
    return Side(
        record.status,
        record.attempts,
        record.tokens if record.usage else None,
        record.duration_s,
        record.commit,
    )


def _totals(view: OpenRun, tip: str | None) -> Totals:
    state, manifest = view.state, view.manifest
    records = state.steps.values()
    return Totals(
        task_id=manifest.task_id,
        status=state.status,
        branch=manifest.branch,
        tip=tip,
        parent=manifest.parent,
        done=sum(1 for r in records if r.status in DONE),
        steps=len(state.steps),
        tokens=sum(r.tokens for r in records),
        duration_s=round(sum(r.duration_s or 0.0 for r in records), 3),
        model=view.task.model,
    )
