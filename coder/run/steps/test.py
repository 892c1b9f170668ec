"""`test` steps: run the project's test command and parse what it reports. With
`on_fail: {strategy: fix_and_retry, max_cycles: N}` and a model, a red run starts fix cycles:
the failing sections go to the model, it edits, the tests rerun; the fix becomes this step's
commit."""

from __future__ import annotations

import hashlib
import re

from coder import testreport
from coder.git import ops as gitops
from coder.models.provider import Usage
from coder.run.steps import StepContext, StepOutcome
from coder.run.steps.shell import describe_failure, run_in_step


def command_for(ctx: StepContext) -> str:
    step = ctx.step
    return testreport.test_command(
        root=ctx.workdir,
        framework=step.framework,
        cmd=step.cmd,
        args=step.args,
        configured=ctx.config.get("test_command"),
    )


def run(ctx: StepContext) -> StepOutcome:
    cmd = command_for(ctx)
    outcome, report = _run_tests(ctx, cmd)
    if outcome.ok or outcome.cancelled or ctx.step.strategy != "fix_and_retry" or report is None:
        return outcome
    if ctx.agent is None:
        return outcome
    return _fix_cycles(ctx, cmd, outcome, report)


def _run_tests(ctx: StepContext, cmd: str) -> tuple[StepOutcome, testreport.TestReport | None]:
    result = run_in_step(ctx, cmd)
    if result.cancelled:
        return StepOutcome(False, "interrupted while running the tests", cancelled=True), None
    if result.timed_out:
        return StepOutcome(False, describe_failure(result)), None
    report = testreport.parse_output(
        result.stdout + "\n" + result.stderr,
        ctx.step.framework or testreport.framework_of(cmd),
        exit_code=result.exit_code,
    )
    failed = (report.failed or 0) + (report.errors or 0) if report.found else None
    tests = {
        "passed": report.passed,
        "failed": failed,
        "skipped": report.skipped,
        "exit_code": result.exit_code,
    }
    if result.ok and report.found and not (report.passed or report.failed or report.errors):
        return StepOutcome(
            False, f"no tests ran (`{cmd}`); a test step needs tests to prove anything", tests=tests
        ), report
    if result.ok:
        return StepOutcome(True, summary=f"tests green: {report.summary()}", tests=tests), report
    error = f"tests failed: {report.summary()} (`{cmd}` exited with {result.exit_code})"
    return StepOutcome(
        False, error, tests=tests, details={"failures": list(report.failures)}
    ), report


def _fix_cycles(
    ctx: StepContext, cmd: str, outcome: StepOutcome, report: testreport.TestReport
) -> StepOutcome:
    from coder.agent import prompts
    from coder.run.steps.model import converse
    from coder.tools.registry import tools_for_kind

    allowed = tools_for_kind("edit")
    usage = Usage()
    notes: tuple[str, ...] = ()
    previous_names: set[str] = set()
    previous_diff = _worktree_digest(ctx)
    max_cycles = ctx.step.max_cycles
    for cycle in range(1, max_cycles + 1):
        failures = report.failures or (outcome.error or "",)
        message = prompts.fix_message(
            step={"id": ctx.step.id, "goal": ctx.step.goal},
            command=cmd,
            failures=failures,
            summary=report.summary(),
            cycle=cycle,
            max_cycles=max_cycles,
            tools=allowed,
            same_as_before=_failing_names(failures) == previous_names,
        )
        ctx.log.info("fix.cycle", cycle=cycle, failing=report.summary())
        result = converse(
            ctx,
            role="edit",
            allowed=allowed,
            first_message=message,
            transcript=f".fix{cycle}.transcript.json",
            cycle=cycle,
        )
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
                f"fix cycle {cycle} changed nothing; stopping early ({report.summary()})",
                tests=outcome.tests,
                usage=usage,
                notes=notes,
            )
        previous_diff, previous_names = digest, _failing_names(failures)
        outcome, new_report = _run_tests(ctx, cmd)
        if outcome.ok or outcome.cancelled or new_report is None:
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
        report = new_report
    return StepOutcome(
        False,
        f"tests still failing after {max_cycles} fix cycles: {report.summary()}",
        tests=outcome.tests,
        usage=usage,
        notes=notes,
    )


def _failing_names(failures: tuple[str, ...]) -> set[str]:
    """The tests that fail (their names, not their messages, which change with every try)."""
    return {name for text in failures for name in re.findall(r"\btest\w*", text)}


def _worktree_digest(ctx: StepContext) -> str:
    """What the worktree's changes look like now (to notice a cycle that changed nothing)."""
    repo = gitops.open_repo(ctx.workdir)
    text = gitops.diff_patch(repo, "HEAD", worktree=ctx.workdir)
    return hashlib.sha256(text.encode()).hexdigest()
