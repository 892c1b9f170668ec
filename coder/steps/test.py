"""`test` steps: run the project's test command and parse what it reports."""

from __future__ import annotations

from coder import testing
from coder.steps import StepContext, StepOutcome
from coder.steps.shell import describe_failure, run_in_step


def command_for(ctx: StepContext) -> str:
    step = ctx.step
    return testing.test_command(root=ctx.workdir, framework=step.framework, cmd=step.cmd,
                                args=step.args, configured=ctx.config.get("test_command"))


def run(ctx: StepContext) -> StepOutcome:
    cmd = command_for(ctx)
    result = run_in_step(ctx, cmd)
    if result.cancelled:
        return StepOutcome(False, "interrupted while running the tests", cancelled=True)
    report = testing.parse_output(result.stdout + "\n" + result.stderr,
                                  ctx.step.framework or testing.framework_of(cmd),
                                  exit_code=result.exit_code)
    failed = (report.failed or 0) + (report.errors or 0) if report.found else None
    tests = {"passed": report.passed, "failed": failed, "skipped": report.skipped,
             "exit_code": result.exit_code}
    if result.ok and report.found and not (report.passed or report.failed or report.errors):
        return StepOutcome(False, f"no tests ran (`{cmd}`); a test step needs tests to prove "
                           "anything", tests=tests)
    if result.ok:
        return StepOutcome(True, summary=f"tests green: {report.summary()}", tests=tests)
    error = (f"tests failed: {report.summary()} (`{cmd}` exited with {result.exit_code})"
             if not result.timed_out else describe_failure(result))
    return StepOutcome(False, error, tests=tests,
                       details={"failures": list(report.failures)})
