"""`test` steps: run the project's test command and parse what it reports. With
`on_fail: {strategy: fix_and_retry, max_cycles: N}` and a model, a red run starts fix cycles:
the failing sections go to the model, it edits, the tests rerun; the fix becomes this step's
commit."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from coder.checks import testreport, testresults
from coder.errors import CoderError
from coder.policy import sandbox
from coder.run.steps import StepContext, StepOutcome
from coder.run.steps.fix import Failing, fix_cycles
from coder.run.steps.shell import describe_failure, run_in_step
from coder.taskfile.kinds import test_command

if TYPE_CHECKING:
    from pathlib import Path

    from coder.policy.commands import Policy
    from coder.run.records import TestCounts


def run(ctx: StepContext) -> StepOutcome:
    cmd = test_command(ctx.step, ctx.workdir, ctx.settings.config)
    outcome, report = _run_tests(ctx, cmd)
    if outcome.ok or outcome.cancelled or ctx.step.strategy != "fix_and_retry" or report is None:
        return outcome
    if ctx.agent is None:
        return outcome

    def rerun() -> tuple[StepOutcome, Failing | None]:
        again, new_report = _run_tests(ctx, cmd)
        return again, None if new_report is None else _failing(again, new_report)

    return fix_cycles(
        ctx,
        command=cmd,
        rerun=rerun,
        outcome=outcome,
        failing=_failing(outcome, report),
    )


def _run_tests(ctx: StepContext, cmd: str) -> tuple[StepOutcome, testreport.TestReport | None]:
    plan = testresults.structured(
        cmd, nightly=lambda: rust_nightly(ctx.workdir, ctx.settings.policy)
    )
    result = run_in_step(
        ctx,
        plan.command if plan else cmd,
        results_var=testresults.RESULTS_VAR if plan and plan.results_file else None,
    )
    if plan is not None and testresults.refused(
        plan, result.exit_code, result.results, result.stderr
    ):
        plan, result = None, run_in_step(ctx, cmd)  # the runner took no structured flags
    if result.cancelled:
        return StepOutcome(False, "interrupted while running the tests", cancelled=True), None
    if result.timed_out:
        return StepOutcome(False, describe_failure(result)), None
    report = testresults.read_result(
        plan, result, ctx.step.framework or testreport.framework_of(cmd)
    )
    failed = (report.failed or 0) + (report.errors or 0) if report.found else None
    tests: TestCounts = {
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
        summary = f"tests green (exit 0): {report.summary()}"  # counts beside the verdict
        return StepOutcome(True, summary=summary, tests=tests), report
    error = f"tests failed: {report.summary()} (`{cmd}` exited with {result.exit_code})"
    return StepOutcome(
        False, error, tests=tests, details={"failures": list(report.failures)}
    ), report


def rust_nightly(root: Path, policy: Policy) -> bool:
    """Whether the Rust compiler the tests of `root` would use is a nightly one (`rustc -V`,
    run as the tests are: in `root`, where a `rust-toolchain` file may choose it)."""
    try:
        result = sandbox.run_command("rustc -V", cwd=root, policy=policy, timeout=30, root=root)
    except CoderError:  # not allowed by the policy, no sandbox: the text it is
        return False
    return result.ok and testresults.rustc_nightly(result.stdout)


def _failing(outcome: StepOutcome, report: testreport.TestReport) -> Failing:
    failures = report.failures or (outcome.error or "",)
    return Failing(report.summary(), failures, _failing_names(failures))


def _failing_names(failures: tuple[str, ...]) -> frozenset[str]:
    """The tests that fail (their names, not their messages, which change with every try)."""
    return frozenset(name for text in failures for name in re.findall(r"\btest\w*", text))
