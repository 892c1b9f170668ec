"""A draft checked exactly like `coder validate` (schema, ids, dependencies, cycles), plus
what a runnable plan needs: commands the policy allows, paths inside the repository,
`changes` that match the files that exist."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder import taskfile, yamldoc
from coder.errors import DocumentError, PolicyViolation, Problem
from coder.plan.overview import ProjectContext
from coder.policy.paths import resolve_in_root
from coder.run.preflight import refusals
from coder.schemas import validator

if TYPE_CHECKING:
    from coder.policy.commands import Policy


def check_draft(
    text: str, name: str, ctx: ProjectContext, policy: Policy, cfg: config_mod.Config
) -> tuple[list[Problem], taskfile.Task | None]:
    """`coder validate`'s checks, then the planner's own, all problems at once."""
    try:
        doc = yamldoc.parse(text, name)
    except DocumentError as exc:
        return exc.problems, None
    problems, task = taskfile.check_document(doc)
    if isinstance(doc.data, dict):
        problems = sorted(
            problems + plan_problems(doc, ctx, policy, cfg), key=lambda p: (p.line, p.col)
        )
    return problems, (task if not problems else None)


def plan_problems(
    doc: yamldoc.Document, ctx: ProjectContext, policy: Policy, cfg: config_mod.Config
) -> list[Problem]:
    """What makes a schema-valid plan unrunnable: refused commands, paths that leave the
    repository (also through symlinks), `changes` that do not match the files, a missing base.
    Defensive about shapes: the schema check reports those."""
    problems: list[Problem] = []

    def report(path: list[Any], message: str) -> None:
        line, col = doc.position(path)
        problems.append(Problem(doc.name, line, col, message, taskfile.json_path(path)))

    data = doc.data
    base = data.get("base")
    if isinstance(base, str) and base not in ctx.branches:
        known = ", ".join(sorted(b for b in ctx.branches if not b.startswith("agent/"))[:10])
        report(
            ["base"],
            f"base: branch {base!r} does not exist (leave base out to use the "
            f"current branch; local branches: {known or 'none'})",
        )
    graph = data.get("graph")
    steps = (
        [(i, s) for i, s in enumerate(graph) if isinstance(s, dict)]
        if isinstance(graph, list)
        else []
    )
    created = {
        _clean(c["path"])
        for _, s in steps
        for c in _items(s.get("changes"))
        if isinstance(c.get("path"), str) and c.get("mode") == "create"
    }
    for i, step in steps:
        where = f" (step {step['id']})" if isinstance(step.get("id"), str) else ""
        for path, message in _command_problems(i, step, ctx, policy, cfg):
            report(path, f"{taskfile.field_path(path)}{where}: {message}")
        for path, message in _path_problems(i, step, ctx, policy, created):
            report(path, f"{taskfile.field_path(path)}{where}: {message}")
    return problems


def _command_problems(
    i: int, step: dict[str, Any], ctx: ProjectContext, policy: Policy, cfg: config_mod.Config
) -> list[tuple[list[Any], str]]:
    """Run's preflight (coder.run.preflight) on one step that is itself schema-valid."""
    if not validator("step").is_valid(step):
        return []  # the schema check reports it
    sid = step.get("id") or f"s{i + 1}"
    found = refusals([taskfile.build_step(step, sid)], root=ctx.root, policy=policy, config=cfg)
    return [
        (
            ["graph", i, "cmd"] if r.field else ["graph", i],
            f"{r.message}; plan only with the allowed programs, offline"
            if r.refused
            else "no test command is known for this project (none configured or detected): "
            "give the step a `cmd`, or leave the test step out",
        )
        for r in found
    ]


def _path_problems(
    i: int, step: dict[str, Any], ctx: ProjectContext, policy: Policy, created: set[str]
) -> list[tuple[list[Any], str]]:
    found: list[tuple[list[Any], str]] = []
    files = set(ctx.files)

    def escapes(rel: str, *, write: bool) -> str | None:
        if not taskfile.is_repo_relative(rel):
            return None  # taskfile's own check reports it
        try:
            resolve_in_root(ctx.root, rel, write=write, policy=policy)
        except PolicyViolation as exc:
            return exc.message
        return None

    for j, change in enumerate(_items(step.get("changes"))):
        rel, mode = change.get("path"), change.get("mode", "patch")
        if not isinstance(rel, str):
            continue
        where: list[Any] = ["graph", i, "changes", j, "path"]
        clean = _clean(rel)
        if (refused := escapes(rel, write=True)) is not None:
            found.append((where, refused))
        elif (
            mode in ("patch", "delete")
            and clean not in files
            and clean not in created
            and taskfile.is_repo_relative(rel)
        ):
            found.append(
                (
                    where,
                    f"{rel!r} does not exist in the repository, so it cannot be "
                    f"{'patched' if mode == 'patch' else 'deleted'} (use mode create for a "
                    "new file, or a path from <files>)",
                )
            )
        elif mode == "create" and clean in files:
            found.append((where, f"{rel!r} already exists (use mode patch to change it)"))
    others: list[tuple[list[Any], Any]] = [(["graph", i, "cwd"], step.get("cwd"))]
    others += [
        (["graph", i, "assert", j, "path"], a.get("path"))
        for j, a in enumerate(_items(step.get("assert")))
    ]
    for where, rel in others:
        if isinstance(rel, str) and (refused := escapes(rel, write=False)) is not None:
            found.append((where, refused))
    return found


def _items(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _clean(rel: str) -> str:
    return PurePosixPath(rel.replace("\\", "/")).as_posix().removeprefix("./")
