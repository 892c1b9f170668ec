"""Where a step works, and how its commit reaches the run's branch.

A step running alone works in the run's worktree (`InPlace`): its commit moves the branch by
compare-and-swap from the tip its attempt started at. A step running beside others of its level
works in a scratch worktree detached at the level's tip (`Scratch`): its commit is made on no
branch and cherry-picked onto the branch, by compare-and-swap, once the level is done. The
executor (coder.run.executor) runs both through the same pipeline; only the place differs. A
step run on another machine (`Elsewhere`, coder.fleet) works nowhere here: its commit, made
there, lands as a scratch commit does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from coder.git import commits, worktrees
from coder.run.commitmsg import CommitParts

if TYPE_CHECKING:
    from coder.git.repository import Repo
    from coder.run.context import RunContext
    from coder.run.steps import StepOutcome
    from coder.run.steps.verify import Verification
    from coder.taskfile import Step

# What a step's attempt commits with (coder.run.commitmsg.commit_parts, bound to the run).
Message = Callable[["Step", int, "StepOutcome"], CommitParts]


class Place(Protocol):
    """Where a step works, and how its commit reaches the branch."""

    workdir: Path
    candidate: int | None  # which try of a step tried several ways (coder.run.candidates)

    def start(self) -> str:
        """The commit an attempt starts from."""

    def head(self, tip: str) -> tuple[str, str]:
        """What the worktree's HEAD is when an attempt starts from `tip` (the branch, or
        "(no branch)", and the commit), as `git stash` names it (the git guard)."""

    def commit(
        self, step: Step, attempt: int, outcome: StepOutcome, seen: Verification
    ) -> str | None:
        """Commit the attempt's changes, as verify staged them (`seen.staged`, in the
        repository it opened: `seen.repo`); None when it changed nothing."""

    def land(self, commit: str | None, tip: str) -> tuple[str | None, str]:
        """Put the commit on the branch: (the commit now on it, the commit before it)."""


class InPlace:
    """A step running alone: it works in the run's worktree, and its commit moves the branch
    from the tip the attempt started at (compare-and-swap: BranchMoved if it moved)."""

    candidate: int | None = None

    def __init__(self, run: RunContext, tip: Callable[[], str], message: Message) -> None:
        self.run, self.tip, self.message = run, tip, message
        self.workdir = run.worktree

    def start(self) -> str:
        return self.tip()

    def head(self, tip: str) -> tuple[str, str]:
        return self.run.branch, tip

    def commit(
        self, step: Step, attempt: int, outcome: StepOutcome, seen: Verification
    ) -> str | None:
        staged = seen.staged
        return commits.commit_step(
            self.workdir,
            **self.message(step, attempt, outcome),
            branch=self.run.branch,
            expected_tip=staged.base,
            staged=staged,
            repo=seen.repo,
        )

    def land(self, commit: str | None, tip: str) -> tuple[str | None, str]:
        return commit, tip  # the commit moved the branch already


class Scratch:
    """A step running beside others of its level: it works in a scratch worktree (detached at
    the level's tip); its commit is cherry-picked onto the branch once the level is done. A
    `candidate` of a step tried several ways works in one of its own (`ID--STEP--cK`)."""

    def __init__(
        self,
        run: RunContext,
        repo: Repo,
        step: Step,
        start: str,
        tip: Callable[[], str],
        message: Message,
        candidate: int | None = None,
    ) -> None:
        self.run, self.repo, self.tip, self.message = run, repo, tip, message
        self.begin, self.candidate = start, candidate
        self.name = f"{run.task.id}--{step.id}" + (f"--c{candidate}" if candidate else "")
        self.path = run.coder_dir / "worktrees" / self.name
        self.workdir = worktrees.add_scratch_worktree(
            repo, name=self.name, path=self.path, commit=start
        )

    def start(self) -> str:
        return self.begin

    def head(self, tip: str) -> tuple[str, str]:
        return "(no branch)", tip

    def commit(
        self, step: Step, attempt: int, outcome: StepOutcome, seen: Verification
    ) -> str | None:
        staged = seen.staged
        return commits.commit_detached(
            self.workdir,
            **self.message(step, attempt, outcome),
            parent=staged.base,
            staged=staged,
            repo=seen.repo,
        )

    def land(self, commit: str | None, tip: str) -> tuple[str | None, str]:
        return pick(self.run, commit, self.tip())

    def remove(self) -> None:
        worktrees.remove_worktree(self.repo, self.name, self.path)


class Elsewhere:
    """A step run on another machine (coder.fleet): nothing of it works here (its `workdir`
    is never made); its commit, fetched into the run's repository, lands as a scratch
    commit does."""

    candidate: int | None = None

    def __init__(self, run: RunContext, step: Step, start: str, tip: Callable[[], str]) -> None:
        self.run, self.begin, self.tip = run, start, tip
        self.workdir = run.coder_dir / "worktrees" / f"{run.task.id}--{step.id}--elsewhere"

    def start(self) -> str:
        return self.begin

    def head(self, tip: str) -> tuple[str, str]:
        return "(no branch)", tip

    def commit(
        self, step: Step, attempt: int, outcome: StepOutcome, seen: Verification
    ) -> str | None:
        raise AssertionError("a step run elsewhere commits there")

    def land(self, commit: str | None, tip: str) -> tuple[str | None, str]:
        return pick(self.run, commit, self.tip())


def pick(run: RunContext, commit: str | None, current: str) -> tuple[str | None, str]:
    """A commit made off the branch cherry-picked onto it at `current` (compare-and-swap)."""
    if commit is None:
        return None, current
    landed = commits.cherry_pick(run.worktree, commit, branch=run.branch, expected_tip=current)
    return landed, current
