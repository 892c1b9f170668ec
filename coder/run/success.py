"""A task's success criteria, checked against a tree of files: `required_files`, and the
tests (the task's test step's command, else the configured one, else the detected one). Used
at the end of a run and by `merge --if-green` on the exact tree that would land."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coder.policy.commands import Policy
    from coder.policy.sandbox import CommandResult
    from coder.taskfile import Task


def missing_files(task: Task, worktree: Path) -> list[str]:
    return [
        f"required file {path} is missing"
        for path in task.success.get("required_files", [])
        if not (worktree / path).is_file()
    ]


def test_command(task: Task, worktree: Path, cfg: Any) -> str:
    """The command that proves the task green (InvalidInput when there is none)."""
    from coder import testreport
    from coder.kinds import KINDS

    step = next((s for s in task.steps if KINDS[s.kind].command == "tests"), None)
    return testreport.test_command(
        root=worktree,
        configured=cfg.get("test_command"),
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
    from coder.policy import sandbox

    result = sandbox.run_command(
        cmd, cwd=worktree, policy=policy, cancel=cancel, root=worktree, owner=owner
    )
    if result.timed_out:
        return f"`{cmd}` timed out", result
    if not result.ok:
        return f"`{cmd}` exited with {result.exit_code}", result
    return None, result
