"""What `coder validate` and MCP's `task_validate` check: the taskfile itself, then, inside a
repository, what `coder run` checks there before it starts (`preflight.refusals`: the policy on
every command and the test command, with the effective config), so a taskfile that validates
can start. Outside a repository nothing can start, and the file alone is checked, with the
variables its steps' `env:` may not set (no repository makes those right). (Whether this
machine has a sandbox is `coder doctor`'s question, not the file's.)"""

from __future__ import annotations

from pathlib import Path

from coder import config as config_mod
from coder import taskfile, yamldoc
from coder.errors import DocumentError, Problem
from coder.run.preflight import env_refusals, policy_for, refusals


def check(
    path: Path, *, cwd: Path, name: str | None = None
) -> tuple[list[Problem], taskfile.Task | None]:
    """Every problem at once (FILE:LINE:COL), and the task when there are none."""
    name = name or str(path)
    try:
        doc = yamldoc.load(path, name)
    except DocumentError as exc:
        return exc.problems, None
    problems, task = taskfile.check_document(doc)
    if task is None:
        return problems, None
    problems = preflight_problems(doc, task, cwd)
    return problems, None if problems else task


def preflight_problems(doc: yamldoc.Document, task: taskfile.Task, cwd: Path) -> list[Problem]:
    """Run's preflight refusals (`coder.run.preflight.refusals`), each at its step."""
    cfg = config_mod.load(cwd)
    if cfg.project_root is None:  # a step's env is the file's own business
        found = env_refusals(task.steps)
    else:
        found = refusals(
            task.steps, root=cfg.project_root, policy=policy_for(task, cfg), config=cfg
        )
    index = {step.id: i for i, step in enumerate(task.steps)}
    problems = []
    for refusal in found:
        where: list[str | int] = ["graph", index[refusal.step_id]]
        if refusal.field:
            where.append(refusal.field)
        if refusal.key:
            where.append(refusal.key)
        line, col = doc.position(where, key=refusal.key is not None)
        message = refusal.message + (f" ({refusal.hint})" if refusal.hint else "")
        problems.append(
            Problem(
                doc.name,
                line,
                col,
                f"{taskfile.field_path(where)} (step {refusal.step_id}): {message}",
                taskfile.json_path(where),
            )
        )
    return problems
