"""A task's success criteria, checked against a tree of files: `required_files`, the tests
(the task's test step's command, else the configured one, else the detected one) and, with
`require_no_lint_errors`, the linter on the lines the run added or changed. Used at the end of
a run and by `merge --if-green` on the exact tree that would land."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from coder.checks import lintreport, testreport
from coder.errors import CoderError, EnvironmentProblem, InvalidInput, PolicyViolation
from coder.git import branches, commits, diffs, repository
from coder.policy import sandbox
from coder.taskfile.kinds import KINDS, TESTS

if TYPE_CHECKING:
    from coder.checks.lintreport import Finding
    from coder.config import Config
    from coder.policy.commands import Policy
    from coder.policy.sandbox import CommandResult
    from coder.run.context import RunContext
    from coder.taskfile import Task


def run_problems(run: RunContext) -> list[str]:
    """The task's `success` criteria, checked against a finished run's worktree (`problems`);
    a test command that cannot be found is a problem."""
    task, worktree, cfg = run.task, run.worktree, run.settings.config
    tests = None
    if task.success.get("require_green_tests"):
        try:
            tests = test_command(task, worktree, cfg)
        except EnvironmentProblem:
            raise
        except CoderError as exc:
            return [*missing_files(task, worktree), f"require_green_tests: {exc.message}"]
    return problems(
        task,
        worktree,
        cfg,
        run.settings.policy,
        tests=tests,
        label="require_green_tests: ",
        tested=lambda _, result: run.log.info("success.tests", exit_code=result.exit_code),
        base=lambda: run.manifest.base_commit,
        cancel=run.stop,
        owner=run.owner,
    )


def problems(
    task: Task,
    worktree: Path,
    cfg: Config,
    policy: Policy,
    *,
    tests: str | None,
    label: str = "",
    base: Callable[[], str],
    tested: Callable[[str, CommandResult], None] | None = None,
    cancel: threading.Event | None = None,
    owner: str | None = None,
) -> list[str]:
    """The one success check, against `worktree`: the required files, the `tests` command
    (None: not run; its problem is prefixed by `label`, and `tested` sees its result), then
    with `require_no_lint_errors` the linter on what changed since the commit `base()` (asked
    only then). The problems; none when the task is green."""
    found = missing_files(task, worktree)
    if tests is not None:
        problem, result = run_tests(tests, worktree, policy, cancel=cancel, owner=owner)
        if tested is not None:
            tested(tests, result)
        if problem:
            found.append(label + problem)
    if task.success.get("require_no_lint_errors"):
        found += lint_problems(worktree, base(), policy, cfg, cancel=cancel, owner=owner)
    return found


def missing_files(task: Task, worktree: Path) -> list[str]:
    return [
        f"required file {path} is missing"
        for path in task.success.get("required_files", [])
        if not (worktree / path).is_file()
    ]


def test_command(task: Task, worktree: Path, cfg: Config) -> str:
    """The command that proves the task green (InvalidInput when there is none)."""
    step = next((s for s in task.steps if KINDS[s.kind].command is TESTS), None)
    return testreport.test_command(
        root=worktree,
        configured=cfg.test_command,
        framework=step.framework if step else None,
        cmd=step.cmd if step else None,
        args=step.args if step else (),
    )


def run_tests(
    cmd: str,
    worktree: Path,
    policy: Policy,
    *,
    cancel: threading.Event | None = None,
    owner: str | None = None,
) -> tuple[str | None, CommandResult]:
    """Run the tests; the problem (None when green) and the command's result."""
    result = sandbox.run_command(
        cmd, cwd=worktree, policy=policy, cancel=cancel, root=worktree, owner=owner
    )
    if result.timed_out:
        return f"`{cmd}` timed out", result
    if not result.ok:
        return f"`{cmd}` exited with {result.exit_code}", result
    return None, result


def lint_findings(
    worktree: Path,
    base: str,
    policy: Policy,
    lint_command: str | None,
    *,
    cancel: threading.Event | None = None,
    owner: str | None = None,
) -> tuple[list[Finding], list[str]]:
    """The linter's findings (`lint_command`'s, else the project's linters') on the lines
    `worktree` adds or changes since the commit `base` (so what the project had before never
    counts), and why a linter could not say (refused by the policy, crashed, timed out)."""
    findings: list[Finding] = []
    notes: list[str] = []
    for path, lines in sorted(diffs.added_lines(worktree, base).items()):
        for linter in lintreport.linters_for(worktree, path, lint_command):
            try:
                result = sandbox.run_command(
                    linter.command_for(path),
                    cwd=worktree,
                    policy=policy,
                    cancel=cancel,
                    root=worktree,
                    owner=owner,
                )
            except PolicyViolation as exc:
                notes.append(f"{linter.name} was not run on {path}: {exc.message}")
                continue
            output = result.stdout + "\n" + result.stderr
            if result.timed_out:
                notes.append(f"{linter.name} timed out on {path}")
            elif unread := lintreport.unread_failure(linter, path, result.exit_code, output):
                notes.append(unread)
            found = lintreport.parse_output(output, linter, path)
            findings += [f for f in found if f.line in lines]
    return findings, notes


def lint_problems(
    worktree: Path,
    base: str,
    policy: Policy,
    cfg: Config,
    *,
    cancel: threading.Event | None = None,
    owner: str | None = None,
) -> list[str]:
    """`success.require_no_lint_errors`: a problem per new finding (the first few) and per
    linter that could not run; none when the run added no finding."""
    try:
        lintreport.lint_commands(worktree, cfg.lint_command)
    except InvalidInput as exc:
        return [f"require_no_lint_errors: {exc.message} (set lint_command in coder.config.json)"]
    findings, notes = lint_findings(
        worktree, base, policy, cfg.lint_command, cancel=cancel, owner=owner
    )
    problems = [f"require_no_lint_errors: {note}" for note in notes]
    if findings:
        shown = "; ".join(str(f) for f in findings[:5])
        more = f"; and {len(findings) - 5} more" if len(findings) > 5 else ""
        problems.append(
            f"require_no_lint_errors: {len(findings)} new lint finding"
            f"{'s' if len(findings) > 1 else ''}: {shown}{more}"
        )
    return problems


def fork_point(worktree: Path, base_branch: str) -> str:
    """Where the work in `worktree` left `base_branch` (their merge base; the branch's tip
    when the worktree holds a merge of it)."""
    repo = repository.open_repo(worktree)
    tip = branches.resolve_commit(repo, f"refs/heads/{base_branch}")
    return commits.merge_base_with_head(repo, tip)
