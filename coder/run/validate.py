"""What `coder validate` and MCP's `task_validate` check: the taskfile itself, then, inside a
repository, what `coder run` checks there before it starts (`runs.preflight`: the policy on
every command and the test command, with the effective config), so a taskfile that validates
can start. Outside a repository nothing can start, and the file alone is checked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coder import config as config_mod
from coder import taskfile, yamldoc
from coder.errors import DocumentError, EnvironmentProblem, InvalidInput
from coder.run import runs
from coder.yamldoc import Problem


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
    """`runs.preflight`'s refusals, each at its step. Run refuses at the first; asking it one
    step at a time reports them all."""
    cfg = config_mod.load(cwd)
    root = cfg.project_root
    if root is None:
        return []
    policy = runs.policy_for(task, cfg)
    problems: list[Problem] = []
    for i, step in enumerate(task.steps):
        try:
            runs.preflight(replace(task, steps=(step,)), policy, root, cfg)
        except (
            EnvironmentProblem
        ):  # no sandbox here, say: `coder doctor`'s business, not the file's
            return problems
        except InvalidInput as exc:
            where = ["graph", i, "cmd"] if "cmd" in task.source["graph"][i] else ["graph", i]
            line, col = doc.position(where)
            message = exc.message.removeprefix(f"step {step.id}: ")
            if exc.hint:
                message += f" ({exc.hint})"
            problems.append(
                Problem(
                    doc.name,
                    line,
                    col,
                    f"{taskfile.field_path(where)} (step {step.id}): {message}",
                    taskfile.json_path(where),
                )
            )
    return problems
