"""`coder run --dry-run`: what a run of a taskfile would do, and whether it would start, with
nothing done. It reads the taskfile, the configuration and the repository; it writes nothing
(no `.coder/`, no branch, no worktree) and asks no model.

Each command gets the verdict a real run's preflight gives before it creates anything
(`coder.run.preflight.refusals`, which asks `coder.policy.commands.check_command`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from coder import config as config_mod
from coder import project, taskfile
from coder.errors import CoderError
from coder.git import branches, repository
from coder.models import protocol
from coder.models.factory import model_config, provider_of
from coder.policy.sandbox import require_sandbox
from coder.run.candidates import with_candidates
from coder.run.drive import RunOptions
from coder.run.manifest import run_exists
from coder.run.preflight import command_of, policy_for, refusals
from coder.taskfile import graph
from coder.taskfile.kinds import KINDS, TESTS


@dataclass(frozen=True)
class CommandCheck:
    step_id: str  # "success" for the success criteria's test command
    cmd: str
    allowed: bool
    reason: str = ""  # why the policy refuses it

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step_id,
            "cmd": self.cmd,
            "decision": "allowed" if self.allowed else "refused",
            "reason": self.reason or None,
        }


class ModelPlan(TypedDict):
    """The model a run would use and where it answers from."""

    name: str
    provider: str
    host: str | None  # the endpoints; None with a replay
    replay: str | None
    num_ctx: int | None
    num_ctx_source: str
    max_num_ctx: int | None  # Ollama's cap on the model's own context, when that is used
    tool_protocol: str  # native | text | auto (decided when the run starts)
    tool_protocol_reason: str


@dataclass(frozen=True)
class DryRun:
    task: taskfile.Task  # with base and model resolved as the run would
    levels: list[list[str]]
    branch_exists: bool
    worktree: Path
    commands: list[CommandCheck]
    model: ModelPlan | None  # None: no step asks a model
    network: bool
    sandbox: bool  # commands run in the kernel sandbox
    problems: list[str] = field(default_factory=list)  # each would stop the run from starting

    @property
    def would_start(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task.id,
            "title": self.task.title,
            "branch": self.task.branch,
            "base": self.task.base,
            "worktree": str(self.worktree),
            "levels": self.levels,
            "steps": [
                {
                    "id": s.id,
                    "kind": s.kind,
                    "goal": s.goal,
                    "depends_on": list(s.depends_on),
                    "candidates": s.candidates,
                    **dict(zip(("model", "fallback_model"), step_models(self.task, s))),
                }
                for s in self.task.steps
            ],
            "commands": [c.as_dict() for c in self.commands],
            "model": self.model,
            "network": self.network,
            "sandbox": self.sandbox,
            "would_start": self.would_start,
            "problems": self.problems,
        }


def step_models(task: taskfile.Task, step: taskfile.Step) -> tuple[str | None, str | None]:
    """The model a step uses and its fallback_model (its own, else the task's); (None, None)
    for a step that asks no model."""
    if not step.uses_model:
        return None, None
    return step.model or task.model, step.fallback_model or task.fallback_model


def dry_run(path: Path, *, cwd: Path, options: RunOptions) -> DryRun:
    """Check everything `coder run` checks before it creates anything, and describe the run."""
    task = with_candidates(taskfile.load(path), options.candidates)
    cfg = config_mod.load(cwd, flags={"model": options.model, "sandbox": options.sandbox})
    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    policy = policy_for(task, cfg)
    problems: list[str] = []
    try:
        require_sandbox(policy)
    except CoderError as exc:
        problems.append(exc.message)
    base = task.base or branches.current_branch(repo)
    if not branches.branch_tip(repo, base):
        problems.append(f"base branch {base!r} does not exist")
    task = task.resolved(base=base, model=str(cfg.model))
    coder_dir = project.coder_dir(root)
    if run_exists(coder_dir, task.id):
        problems.append(f"a run of task {task.id} already exists (coder resume -t {task.id})")
    branch_exists = branches.branch_tip(repo, task.branch) is not None
    if branch_exists:
        problems.append(f"branch {task.branch} already exists")
    commands = _judge_commands(task, root, policy, cfg, problems)
    return DryRun(
        task=task,
        levels=graph.levels(graph.build(task.deps())),
        branch_exists=branch_exists,
        worktree=coder_dir / "worktrees" / task.id,
        commands=commands,
        model=_model(task, cfg, options) if any(s.uses_model for s in task.steps) else None,
        network=bool(policy.allow_network),
        sandbox=bool(policy.sandbox),
        problems=problems,
    )


def _judge_commands(
    task: taskfile.Task, root: Path, policy: Any, cfg: config_mod.Config, problems: list[str]
) -> list[CommandCheck]:
    """Each step's command with the run's own preflight verdict (`coder.run.preflight`), and
    the success criteria's test command when no test step names one; a step without a
    command it can run goes to `problems`."""
    steps = list(task.steps)
    tests = [k.name for k in KINDS.values() if k.command is TESTS]  # the kind that runs them
    if task.success.get("require_green_tests") and not any(s.kind in tests for s in steps):
        steps.append(taskfile.Step(id="success", kind=tests[0], goal="the success criteria"))
    refused = {r.step_id: r for r in refusals(steps, root=root, policy=policy, config=cfg)}
    checks = []
    for step in steps:
        refusal = refused.get(step.id)
        if refusal is not None and not refusal.refused:  # no command to run at all
            problems.append(str(refusal))
            continue
        cmd = command_of(step, root, cfg)
        if cmd is not None:
            checks.append(
                CommandCheck(step.id, cmd, refusal is None, refusal.message if refusal else "")
            )
        if refusal is not None:
            problems.append(str(refusal))
    return checks


def _model(task: taskfile.Task, cfg: config_mod.Config, options: RunOptions) -> ModelPlan:
    """The model, where it answers from (the configured server, or a named model's own), and
    the context window the run will send (`num_ctx`): the configured one, else the model's
    own (for Ollama capped by `max_num_ctx`), which only the server knows (a dry run asks no
    server; `coder doctor` does)."""
    place, name = model_config(cfg, str(task.model or cfg.model))
    num_ctx = place.num_ctx
    provider = provider_of(place)
    remembered = protocol.Remembered(protocol.cache_path(cfg.project_root), write=False)
    tools = protocol.known(place, name, remembered)  # a dry run asks no server
    return {
        "name": name,
        "provider": provider.name,
        "host": None if options.replay else ", ".join(provider.endpoints(place)),
        "replay": str(options.replay) if options.replay else None,
        "num_ctx": num_ctx,
        "num_ctx_source": place.sources["num_ctx"] if num_ctx else "the model's own",
        "max_num_ctx": None if num_ctx or not provider.caps_context else int(place.max_num_ctx),
        "tool_protocol": tools.protocol if tools else "auto",
        "tool_protocol_reason": tools.reason
        if tools
        else "decided when the run starts, from what the server says about the model "
        "(`coder doctor` shows it)",
    }
