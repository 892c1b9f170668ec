"""`shell` steps: run `cmd` through the sandbox in the step's working directory."""

from __future__ import annotations

from coder import taskfile
from coder.crashpoints import crash_during
from coder.files.durable import write_private
from coder.policy import sandbox
from coder.policy.paths import resolve_in_root
from coder.run.steps import StepContext, StepOutcome


def run(ctx: StepContext) -> StepOutcome:
    step = ctx.step
    assert step.cmd is not None
    result = run_in_step(ctx, step.cmd)
    if result.cancelled:
        return StepOutcome(False, "interrupted while running the command", cancelled=True)
    if result.ok:
        return StepOutcome(True, summary=f"exit 0 in {result.duration_s:.1f}s")
    return StepOutcome(False, describe_failure(result))


def run_in_step(
    ctx: StepContext, cmd: str, *, results_var: str | None = None
) -> sandbox.CommandResult:
    """Run a command for a step: policy-checked, in its cwd, with its timeout and env; the
    (redacted) output is kept as an artifact. `results_var`: see `sandbox.run_command`."""
    step = ctx.step
    cwd = resolve_in_root(ctx.workdir, step.cwd or ".", write=False, policy=ctx.settings.policy)
    timeout = step.timeout_s or ctx.settings.command_timeout
    timer = crash_during("during_command", step.id)
    try:
        result = sandbox.run_command(
            cmd,
            cwd=cwd,
            policy=ctx.settings.policy,
            timeout=timeout,
            env=dict(step.env),
            cancel=ctx.cancel,
            root=ctx.workdir,
            owner=ctx.owner,
            results_var=results_var,
        )
    finally:
        if timer:
            timer.cancel()
    log = ctx.artifact(".log")
    write_private(
        log,
        ctx.redactor.redact(
            f"$ {cmd}\n# exit {result.exit_code}  {result.duration_s:.2f}s  {result.note}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n"
        ),
    )
    ctx.log.info(
        "command.finished",
        cmd=cmd,
        exit_code=result.exit_code,
        duration_s=round(result.duration_s, 3),
        timed_out=result.timed_out,
        log=str(log),
    )
    return result


def describe_failure(result: sandbox.CommandResult) -> str:
    cmd = taskfile.short_command(result.cmd)
    if result.timed_out:
        return f"`{cmd}` {result.note or 'timed out'}"
    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
    detail = ("; output ends: " + " | ".join(tail)) if tail else ""
    why = f"; {result.refused_write}" if result.refused_write else ""
    return f"`{cmd}` exited with {result.exit_code}{detail}{why}"
