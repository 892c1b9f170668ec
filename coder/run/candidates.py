"""Best of N: a step tried several ways at once, the evidence picking the one that lands.

An edit, doc or custom step with `candidates: N` (or every such step, with `coder run
--candidates N`) runs each attempt as a round of N candidates at once, in threads as a level's
steps run: each in a scratch worktree of its own (`ID--STEP--cK`), detached at the same start
tip, with its own seed (`seed + K - 1`: the config's `seed`, else one drawn for the round;
coder.models.sampling), through the executor's one attempt pipeline (act, verify, commit on no
branch). Then, in this order:

    keep     each candidate's commit gets a branch, `<run branch>--STEP--aA-cK` (attempt A:
             a retry's or a resume's round keeps the earlier rounds' too), for a person to
             look at; `coder clean` removes them with the run
    judge    coder.run.judge ranks the candidates by their evidence
    record   each candidate, its seed, its verdict and the winner's reason go into the step's
             record (`coder show -t`, `coder report`)
    land     the winner is cherry-picked onto the run's branch by compare-and-swap, as a
             level's step lands, with `Coder-Candidate` and `Coder-Judged` trailers: the step's
             one commit

Each candidate is held to the step's budgets on its own (one over them fails alone); the run's
budget counts every candidate's tokens. No candidate passing is the attempt's failure: the
step's retries run another round. While someone is asked (`--approvals per-step` or
`per-edit`), the candidates run one after another: one question at a time. A crash leaves the
candidates' commits on no branch of the run (only the winner's lands, and only by the
compare-and-swap), so `coder resume` finds the step not done and runs it again.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from coder.errors import EnvironmentProblem
from coder.git import branches, commits, diffs
from coder.models import sampling
from coder.run import asked_judge
from coder.run.judge import Evidence, Verdict, judge
from coder.run.places import Scratch
from coder.run.steps import StepOutcome
from coder.taskfile.kinds import KINDS

if TYPE_CHECKING:
    from pathlib import Path

    from coder.git.repository import Repo
    from coder.git.staging import Change
    from coder.models.provider import Usage
    from coder.run.context import RunContext
    from coder.run.eventlog import EventLog
    from coder.run.places import Message, Place
    from coder.run.records import CandidateRecord
    from coder.taskfile import Step, Task

MAX = 8  # the schema's maximum: worktrees and server slots are not free
TRAILER_CANDIDATE = "Coder-Candidate"
TRAILER_JUDGED = "Coder-Judged"

# One attempt of the executor's pipeline in a place: (outcome, commit, changes).
Attempt = Callable[["Place"], tuple[StepOutcome, str | None, tuple["Change", ...]]]


def takes_candidates(step: Step) -> bool:
    return "candidates" in KINDS[step.kind].fields


def with_candidates(task: Task, count: int | None) -> Task:
    """`task` with `count` candidates for every step that takes them (`coder run
    --candidates N`); the run's copy of the task keeps it for `coder resume`."""
    if count is None:
        return task
    steps = tuple(replace(s, candidates=count) if takes_candidates(s) else s for s in task.steps)
    return replace(task, steps=steps)


def chosen_kept(new: Task, run: Task) -> Task:
    """The taskfile's `new` version with the run's candidates where a step of it sets none: a
    run started with `--candidates N` keeps them when it resumes from its taskfile."""
    declared = {
        raw.get("id") or f"s{i}"
        for i, raw in enumerate(new.source.get("graph") or [], 1)
        if isinstance(raw, dict) and "candidates" in raw
    }
    ran = {s.id: s.candidates for s in run.steps}
    steps = tuple(
        s
        if s.id in declared or s.id not in ran or not takes_candidates(s)
        else replace(s, candidates=ran[s.id])
        for s in new.steps
    )
    return replace(new, steps=steps)


_KEPT = re.compile(r"a[0-9]+-c[0-9]+")  # what follows `<run branch>--STEP--` (branch_of)


def branch_of(run_branch: str, step_id: str, attempt: int, number: int) -> str:
    """Where candidate `number` of a step's attempt is kept."""
    return f"{run_branch}--{step_id}--a{attempt}-c{number}"


def kept_branches(repo: Repo, run_branch: str, step_ids: Sequence[str]) -> list[str]:
    """The candidate branches of a run's steps (what `coder clean` removes with the run)."""
    prefixes = [f"{run_branch}--{sid}--" for sid in step_ids]
    return sorted(
        name
        for name in repo.branches.local
        if any(name.startswith(p) and _KEPT.fullmatch(name[len(p) :]) for p in prefixes)
    )


def worktree_names(task_id: str, step_ids: Sequence[str]) -> list[str]:
    """The candidates' scratch worktrees a run may have left (a crash mid-round)."""
    return [f"{task_id}--{sid}--c{k}" for sid in step_ids for k in range(1, MAX + 1)]


@dataclass(frozen=True)
class Tried:
    """What one candidate left."""

    number: int
    seed: int
    outcome: StepOutcome
    commit: str | None = None
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True)
class Round:
    """A round's result, as the executor's pipeline goes on with it."""

    outcome: StepOutcome
    commit: str | None  # the winner's, on no branch of the run yet
    changes: tuple[Change, ...]
    records: list[CandidateRecord]
    usage: Usage | None = None  # what asking the judge cost (`judge: model`)

    def log(self, log: EventLog, step_id: str, attempt: int) -> None:
        """The round's line in the event log: how many passed, who won and why."""
        won = next((r for r in self.records if r["verdict"] == "won"), None)
        log.info(
            "step.judged",
            step_id=step_id,
            attempt=attempt,
            candidates=len(self.records),
            passed=sum(r["verdict"] != "failed" for r in self.records),
            winner=won["number"] if won else 0,
            reason=(won or {}).get("why") or self.outcome.error or "",
        )


class Candidates:
    """Where a step tried several ways works: nowhere itself (each candidate in a scratch
    worktree of its own); the winner lands as a level's step does, by compare-and-swap on the
    branch's tip, with the trailers of how it won."""

    candidate: int | None = None

    def __init__(
        self,
        run: RunContext,
        repo: Repo,
        start: Callable[[], str],
        tip: Callable[[], str],
        message: Message,
    ) -> None:
        self.run, self.repo, self.begin, self.tip, self.message = run, repo, start, tip, message
        self.workdir: Path = run.worktree
        self.trailers: tuple[str, ...] = ()  # the winner's, set by `run_round`

    def start(self) -> str:
        return self.begin()

    def head(self, tip: str) -> tuple[str, str]:
        return self.run.branch, tip

    def commit(self, *args: object) -> str | None:
        raise AssertionError("a round's candidates commit in their own worktrees")

    def land(self, commit: str | None, tip: str) -> tuple[str | None, str]:
        current = self.tip()
        if commit is None:
            return None, current
        landed = commits.cherry_pick(
            self.run.worktree,
            commit,
            branch=self.run.branch,
            expected_tip=current,
            trailers=self.trailers,
        )
        return landed, current

    def run_round(self, step: Step, tip: str, attempt: int, act: Attempt) -> Round:
        """N candidates at once from `tip` (one at a time while someone is asked), kept,
        judged; the winner's commit not landed yet. An environment problem of any candidate
        is the round's (raised once all are done)."""
        base = self.run.settings.config.seed
        base = secrets.randbelow(2**31) if base is None else base
        places = [
            Scratch(self.run, self.repo, step, tip, self.tip, self.message, candidate=k)
            for k in range(1, step.candidates + 1)
        ]
        try:
            asks = self.run.approve is not None or self.run.approve_edit is not None
            with ThreadPoolExecutor(max_workers=1 if asks else len(places)) as pool:
                futures = [
                    pool.submit(_try, place, base + k, act) for k, place in enumerate(places)
                ]
                tried = [f.result() for f in futures]
            for t in tried:
                if t.outcome.errored:
                    raise EnvironmentProblem(t.outcome.error or "environment problem")
            kept = self._keep(step, attempt, tried)
        finally:
            for place in places:
                place.remove()
        return self._judged(step, tried, kept)

    def _keep(self, step: Step, attempt: int, tried: list[Tried]) -> dict[int, str]:
        """A branch at each candidate's commit, before its worktree (whose HEAD reaches the
        commit) goes: candidate number -> branch."""
        kept = {}
        for t in tried:
            if t.commit is not None:
                name = branch_of(self.run.branch, step.id, attempt, t.number)
                branches.point_branch(self.repo, name, t.commit)
                kept[t.number] = name
        return kept

    def _judged(self, step: Step, tried: list[Tried], kept: dict[int, str]) -> Round:
        patches = {t.number: diffs.changes_patch(self.repo, t.changes) for t in tried if t.changes}
        evidence = {t.number: _evidence(t, patches.get(t.number, "")) for t in tried}
        verdict, usage = judge(list(evidence.values())), None
        if step.judge == "model":
            verdict, usage = self._asked(step, verdict, evidence, patches)
        winner = verdict.winner
        records = [_record(t, evidence[t.number], kept.get(t.number), winner) for t in tried]
        if winner is None:
            return Round(_none_passed(tried, verdict.why), None, (), records)
        records[winner.number - 1]["why"] = verdict.why or None
        won = tried[winner.number - 1]
        passed = sum(e.passed for e in evidence.values())
        judged = f"{passed} of {len(tried)} passed" + (f"; {verdict.why}" if verdict.why else "")
        self.trailers = (
            f"{TRAILER_CANDIDATE}: {won.number} of {len(tried)} (seed {won.seed})",
            f"{TRAILER_JUDGED}: {judged}",
        )
        return Round(won.outcome, won.commit, won.changes, records, usage)

    def _asked(
        self, step: Step, verdict: Verdict, evidence: dict[int, Evidence], patches: dict[int, str]
    ) -> tuple[Verdict, Usage | None]:
        """`judge: model`: the model's choice among the candidates that passed (when more
        than one did), else the evidence's, saying why the model's was not taken."""
        passed = {n: patches.get(n, "") for n, e in evidence.items() if e.passed}
        if len(passed) < 2:
            return verdict, None
        choice = asked_judge.ask(self.run, step, passed)
        if choice.number is None:
            return replace(
                verdict, why=f"{choice.why}; by the evidence: {verdict.why}"
            ), choice.usage
        return Verdict(evidence[choice.number], f"the model chose it: {choice.why}"), choice.usage


def _evidence(t: Tried, patch: str) -> Evidence:
    return Evidence(
        number=t.number,
        passed=t.outcome.ok,
        failing_tests=t.outcome.tests["failed"] if t.outcome.tests else None,
        diff_lines=sum(
            1
            for line in patch.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ),
        tokens=_tokens(t.outcome),
    )


def _try(place: Scratch, seed: int, act: Attempt) -> Tried:
    """One candidate, with its own seed for every model request it makes."""
    assert place.candidate is not None
    with sampling.seeded(seed):
        try:
            outcome, commit, changes = act(place)
        except EnvironmentProblem as exc:
            outcome, commit, changes = StepOutcome(False, exc.stopped_with, errored=True), None, ()
    return Tried(place.candidate, seed, outcome, commit, changes)


def _tokens(outcome: StepOutcome) -> int:
    usage = outcome.usage
    return usage.prompt_tokens + usage.eval_tokens if usage else 0


def _record(t: Tried, e: Evidence, branch: str | None, winner: Evidence | None) -> CandidateRecord:
    won = winner is not None and winner.number == t.number
    return {
        "number": t.number,
        "seed": t.seed,
        "verdict": "won" if won else "passed" if e.passed else "failed",
        "error": t.outcome.error,
        "commit": t.commit,
        "branch": branch,
        "failing_tests": e.failing_tests,
        "diff_lines": e.diff_lines,
        "tokens": e.tokens,
        "why": None,
    }


def _none_passed(tried: list[Tried], why: str) -> StepOutcome:
    """The round's failure: each candidate's reason (a stop: the round was interrupted)."""
    cancelled = next((t.outcome for t in tried if t.outcome.cancelled), None)
    if cancelled is not None:
        return cancelled
    reasons = "; ".join(f"candidate {t.number}: {t.outcome.error or 'failed'}" for t in tried)
    return StepOutcome(False, f"{why} ({reasons})", tests=tried[0].outcome.tests)
