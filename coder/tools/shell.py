"""Command tools: `shell_run` (custom steps only) and `tests_run`, both through the sandbox
(`coder.policy.sandbox.run_command`: allowlist, no network, scrubbed environment, timeout,
process-group kill, capped output). A refused command is an error result whose hint is the
policy's own explanation; nothing runs.

The model gets the tails of the output (where errors and summaries are), with the cap stated,
and for tests only the counts and the failing sections, not the whole log.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, Required, TypedDict

from coder.checks import testresults
from coder.checks.testreport import framework_of, test_command
from coder.errors import PolicyViolation
from coder.policy.commands import check_command
from coder.policy.env import scrub_env
from coder.policy.sandbox import CommandResult, run_command
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.proposal import Proposal
from coder.tools.worktree import resolve

TAIL_CHARS = 8000  # per stream shown to the model


class ShellArgs(TypedDict, total=False):
    cmd: Required[str]
    cwd: str
    timeout: int


class TestsArgs(TypedDict, total=False):
    args: str


def _tail(text: str, cap: int = TAIL_CHARS) -> tuple[str, bool]:
    if len(text) <= cap:
        return text, False
    cut = text[-cap:]
    newline = cut.find("\n")
    return (cut[newline + 1 :] if 0 <= newline < 200 else cut), True


def _stream(label: str, text: str) -> str:
    body, cut = _tail(text.rstrip("\n"))
    if not body:
        return f"{label}: (empty)"
    note = f" (last {len(body)} of {len(text)} chars)" if cut else ""
    return f"{label}{note}:\n{body}"


def _limit(ctx: ToolContext, requested: Any) -> int:
    """The model may ask for less time than configured, never more."""
    cap = ctx.command_timeout or ctx.policy.command_timeout
    if isinstance(requested, int) and requested > 0:
        return min(requested, cap)
    return cap


def _run(
    ctx: ToolContext,
    cmd: str,
    cwd_arg: str | None,
    timeout: int,
    results_var: str | None = None,
) -> CommandResult:
    cwd = ctx.root
    if cwd_arg:
        cwd, rel = resolve(ctx, cwd_arg, write=False)
        if not cwd.is_dir():
            raise PolicyViolation(
                f"cwd {rel} is not a directory",
                hint="cwd is a directory relative to the repository root",
            )
    extra: dict[str, Any] = {"owner": ctx.owner} if ctx.owner is not None else {}
    return run_command(
        cmd,
        cwd=cwd,
        policy=ctx.policy,
        timeout=timeout,
        cancel=ctx.cancel,
        root=ctx.root,
        results_var=results_var,
        **extra,
    )


def _status_line(result: CommandResult) -> str:
    if result.timed_out:
        status = "timed out"
    elif result.cancelled:
        status = "cancelled"
    else:
        status = f"exit code {result.exit_code}"
    notes = [n for n in (result.note, result.refused_write) if n]
    return f"{status} ({result.duration_s:.1f}s)" + "".join(f"; {n}" for n in notes)


def _refused(exc: PolicyViolation) -> ToolResult:
    return ToolResult.error(
        "command refused by policy; nothing was run",
        hint=f"{exc.message}. The policy is fixed for this run: commands have no network, and "
        "only allowed programs (python, pytest, git, grep, sed, ls, ...) can be used",
    )


def shell_run(ctx: ToolContext, args: ShellArgs) -> ToolResult:
    cmd = args["cmd"]
    if not cmd.strip():
        return ToolResult.error("cmd is empty", hint="give a shell command line")
    try:
        result = _run(ctx, cmd, args.get("cwd"), _limit(ctx, args.get("timeout")))
    except PolicyViolation as exc:
        if str(exc.message).startswith("command refused"):
            return _refused(exc)
        raise
    text = "\n".join(
        [_status_line(result), _stream("stdout", result.stdout), _stream("stderr", result.stderr)]
    )
    data = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "duration_s": round(result.duration_s, 3),
    }
    if result.timed_out:
        return ToolResult.error(
            text,
            hint="the command was killed; run something shorter or pass a larger timeout",
            data=data,
        )
    return ToolResult(True, text, data=data)


def tests_run(ctx: ToolContext, args: TestsArgs) -> ToolResult:
    try:
        extra = shlex.split(args.get("args") or "")
    except ValueError as exc:
        return ToolResult.error(
            f"cannot split args: {exc}",
            hint="args is a command-line fragment such as `-k name tests/x.py`",
        )
    cmd = test_command(root=ctx.root, configured=ctx.config.test_command, args=extra)
    # the structured results that leave the output as it is (pytest, unittest: a results
    # file); the model reads the output when no failing section is found
    plan = testresults.structured(cmd)
    plan = plan if plan is not None and plan.results_file else None
    try:
        result = _run(
            ctx,
            plan.command if plan else cmd,
            None,
            _limit(ctx, None),
            testresults.RESULTS_VAR if plan else None,
        )
    except PolicyViolation as exc:
        if str(exc.message).startswith("command refused"):
            return _refused(exc)
        raise
    output = result.stdout + ("\n" if result.stdout and result.stderr else "") + result.stderr
    report = testresults.read_result(plan, result, framework_of(cmd))
    data = {
        "cmd": cmd,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        **{k: getattr(report, k) for k in ("passed", "failed", "skipped", "errors")},
    }
    data["green"] = result.ok and not report.failed and not report.errors
    if data["green"]:
        return ToolResult(True, f"tests passed: {report.summary()} ({cmd})", data=data)
    head = f"tests failed: {report.summary()} ({cmd}; {_status_line(result)})"
    sections = "\n\n".join(report.failures) or _stream("output", output)
    return ToolResult(True, f"{head}\n\n{sections}", data=data)


def _decision(ctx: ToolContext, cmd: str, cwd_arg: str | None, timeout: int) -> str:
    """The policy's decision on `cmd` as `run_command` will take it (PolicyViolation: refused)."""
    cwd = resolve(ctx, cwd_arg, write=False)[0] if cwd_arg else ctx.root
    policy = ctx.policy
    check_command(
        cmd, policy, root=ctx.root, cwd=cwd, path=scrub_env(policy.env_passthrough).get("PATH")
    )
    where = "in the sandbox" if policy.sandbox else "WITHOUT the sandbox (--no-sandbox)"
    network = "on" if policy.allow_network else "off"
    return f"allowed: runs {where}, network {network}, killed after {timeout}s"


def _preview(
    ctx: ToolContext,
    tool: str,
    cmd: str,
    args: Mapping[str, object],
    cwd: str | None = None,
    timeout: int | None = None,
) -> Proposal | ToolResult:
    try:
        decision = _decision(ctx, cmd, cwd, _limit(ctx, timeout))
    except PolicyViolation as exc:
        if str(exc.message).startswith("command refused"):
            return _refused(exc)  # nothing would run: nothing to ask
        raise
    return Proposal(tool, command=cmd, decision=decision, arguments=args)


def preview_shell(ctx: ToolContext, args: ShellArgs) -> Proposal | ToolResult:
    if not args["cmd"].strip():
        return ToolResult.error("cmd is empty", hint="give a shell command line")
    return _preview(ctx, "shell_run", args["cmd"], args, args.get("cwd"), args.get("timeout"))


def preview_tests(ctx: ToolContext, args: TestsArgs) -> Proposal | ToolResult:
    try:
        extra = shlex.split(args.get("args") or "")
    except ValueError:
        return tests_run(ctx, args)  # the handler's own error, before anything runs
    cmd = test_command(root=ctx.root, configured=ctx.config.test_command, args=extra)
    return _preview(ctx, "tests_run", cmd, {})


SHELL_RUN = Tool(
    name="shell_run",
    description=(
        "Run a bash command in the repository (no network; only allowed programs; "
        "cd does not persist between calls). Returns the exit code and the last "
        f"{TAIL_CHARS} characters of stdout and stderr."
    ),
    parameters=params(
        {
            "cmd": prop(
                "string",
                "The command line, e.g. `ls -la src` or `python -m pytest -q tests/test_x.py`.",
            ),
            "cwd": prop(
                "string",
                "Directory to run in, relative to the repository root (default: the root).",
            ),
            "timeout": prop(
                "integer",
                "Seconds before the command is killed (default and maximum: "
                "the configured command timeout).",
            ),
        },
        required=["cmd"],
    ),
    handler=shell_run,
    read_only=False,
    preview=preview_shell,
)
TESTS_RUN = Tool(
    name="tests_run",
    description=(
        "Run the project's tests (the configured or detected test command). Returns the "
        "counts, plus only the failing tests' output when something fails."
    ),
    parameters=params(
        {
            "args": prop(
                "string",
                "Extra arguments for the test command, e.g. `tests/test_x.py` or "
                "`-k name` (optional).",
            ),
        }
    ),
    handler=tests_run,
    read_only=False,
    preview=preview_tests,
)
