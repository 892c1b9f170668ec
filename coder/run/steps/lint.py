"""`lint` steps: the project's linter (the step's `cmd`, the config's `lint_command`, or the
detected ones) on the files the run changed since its base; a finding on a line the run added
or changed fails the step (what the project had before never counts). With
`on_fail: {strategy: fix_and_retry, max_cycles: N}` and a model, the findings go to the model in
fix cycles, as failing tests do for a test step."""

from __future__ import annotations

from coder.checks import lintreport
from coder.run import success
from coder.run.steps import StepContext, StepOutcome
from coder.run.steps.fix import Failing, fix_cycles


def run(ctx: StepContext) -> StepOutcome:
    configured = ctx.step.cmd or ctx.settings.config.lint_command
    linters = lintreport.lint_commands(ctx.workdir, configured)  # InvalidInput: none
    base = success.fork_point(ctx.workdir, str(ctx.task.base))
    names = ", ".join(linter.name for linter in linters)

    def check() -> tuple[StepOutcome, Failing | None]:
        findings, notes = success.lint_findings(
            ctx.workdir,
            base,
            ctx.settings.policy,
            configured,
            cancel=ctx.cancel,
            owner=ctx.owner,
        )
        if ctx.cancel.is_set():
            return StepOutcome(False, "interrupted while linting", cancelled=True), None
        if notes:  # a linter that could not run or be read proves nothing clean
            return StepOutcome(False, "lint: " + "; ".join(notes)), None
        if not findings:
            return StepOutcome(True, summary=f"lint clean ({names})"), None
        summary = f"{len(findings)} new finding{'s' * (len(findings) > 1)}"
        shown = [str(f) for f in findings]
        error = f"lint: {summary}: " + "; ".join(shown[:5]) + ("; ..." if len(shown) > 5 else "")
        what = frozenset(f"{f.path} {f.code} {f.message}" for f in findings)  # lines move
        failing = Failing(summary, tuple(shown), what)
        return StepOutcome(False, error, details={"findings": shown}), failing

    outcome, failing = check()
    if failing is None or ctx.step.strategy != "fix_and_retry" or ctx.agent is None:
        return outcome
    return fix_cycles(ctx, command=names, rerun=check, outcome=outcome, failing=failing)
