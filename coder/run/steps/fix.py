"""Fix cycles (`on_fail: {strategy: fix_and_retry, max_cycles: N}`): a check that failed goes
to the model with only its failures, the model edits, the check runs again, up to N times; the
fix becomes the step's commit. A cycle that changes nothing ends the cycles early. Test steps
(failing tests) and lint steps (new findings) both use it, in their kind's words
(`coder.taskfile.kinds.Kind.fix`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coder.agent.modelstep import fix_cycle
from coder.git import diffs, repository
from coder.models.provider import Usage
from coder.run.steps import StepContext, StepOutcome
from coder.taskfile.kinds import KINDS

if TYPE_CHECKING:
    from coder.agent.loop import LoopResult


@dataclass(frozen=True)
class Failing:
    """What a failed check tells the model."""

    summary: str  # "1 failed, 2 passed"; "2 new findings"
    failures: tuple[str, ...]  # the sections shown to the model
    names: frozenset[str]  # what fails (to notice a fix that did not change it)


# Runs the check again: its outcome, and what fails when it failed in a way a model can fix.
Check = Callable[[], tuple[StepOutcome, Failing | None]]


def fix_cycles(
    ctx: StepContext,
    *,
    command: str,
    rerun: Check,
    outcome: StepOutcome,
    failing: Failing,
) -> StepOutcome:
    words = KINDS[ctx.step.kind].fix
    assert words is not None, f"kind {ctx.step.kind} has no fix cycles"
    usage = Usage()
    notes: tuple[str, ...] = ()
    previous_names: frozenset[str] = frozenset()
    previous_diff = _worktree_digest(ctx)
    max_cycles = ctx.step.max_cycles
    for cycle in range(1, max_cycles + 1):
        same = failing.names == previous_names
        result = _ask(ctx, cycle, failing, same, command=command)
        usage += result.usage
        notes += tuple(result.notes)
        if not result.ok:
            return StepOutcome(
                False,
                f"fix cycle {cycle}: {result.error}",
                tests=outcome.tests,
                cancelled=result.error == "interrupted",
                usage=usage,
                notes=notes,
            )
        digest = _worktree_digest(ctx)
        if digest == previous_diff:
            return StepOutcome(
                False,
                f"fix cycle {cycle} changed nothing; stopping early ({failing.summary})",
                tests=outcome.tests,
                usage=usage,
                notes=notes,
            )
        previous_diff, previous_names = digest, failing.names
        outcome, still = rerun()
        if outcome.ok or outcome.cancelled or still is None:
            return _settled(outcome, cycle, usage, notes)
        failing = still
    return StepOutcome(
        False,
        f"{words.check} still failing after {max_cycles} fix cycles: {failing.summary}",
        tests=outcome.tests,
        usage=usage,
        notes=notes,
    )


def _ask(
    ctx: StepContext,
    cycle: int,
    failing: Failing,
    same_as_before: bool,
    *,
    command: str,
) -> LoopResult:
    """Fix cycle `cycle`: the model shown only what fails, in the words of the step's kind
    (`coder.taskfile.kinds.Kind.fix`), with the edit kind's tools (coder.agent.modelstep)."""
    ctx.log.info("fix.cycle", cycle=cycle, failing=failing.summary, kind=ctx.step.kind)
    return fix_cycle(
        ctx,
        cycle,
        command=command,
        failures=failing.failures,
        summary=failing.summary,
        same_as_before=same_as_before,
    )


def _settled(outcome: StepOutcome, cycle: int, usage: Usage, notes: tuple[str, ...]) -> StepOutcome:
    """The step's outcome once the check's rerun after cycle `cycle` passed, was cancelled
    or failed in a way no model can fix."""
    summary = (
        f"{outcome.summary} after {cycle} fix cycle{'s' * (cycle > 1)}"
        if outcome.ok
        else outcome.summary
    )
    return StepOutcome(
        outcome.ok,
        outcome.error,
        summary=summary,
        tests=outcome.tests,
        cancelled=outcome.cancelled,
        usage=usage,
        notes=notes,
    )


def _worktree_digest(ctx: StepContext) -> str:
    """What the worktree's changes look like now (to notice a cycle that changed nothing)."""
    repo = repository.open_repo(ctx.workdir)
    text = diffs.diff_patch(repo, "HEAD", worktree=ctx.workdir)
    return hashlib.sha256(text.encode()).hexdigest()
