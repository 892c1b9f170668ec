"""The model side of a run: the session every model step shares, how it is opened (models
checked on their servers, warmed up, the prefix built and primed), and which model each
attempt of a step uses."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from coder.config import Config
    from coder.git.repository import Repo
    from coder.models.provider import ModelFacts, Models, ToolSchema
    from coder.redact import Redactor
    from coder.taskfile import Step, Task, TaskDoc
    from coder.tools.registry import Registry

FALLBACK_AFTER = 2  # failed attempts with a step's model before its fallback_model takes over


@dataclass
class AgentSession:
    """What every model step of a run shares: the models, the tool registry and the
    byte-stable prefix (system prompt and tool definitions, fixed for the whole run)."""

    models: Models
    registry: Registry
    system: str
    tools: list[ToolSchema]
    facts: ModelFacts
    priming: threading.Thread | None = None  # the warm prefix being sent (warm_prefix)


class EventSink(Protocol):
    """Where an attacher reports (coder.run.events.EventLog is one)."""

    def info(self, event: str, **fields: Any) -> None: ...

    def warning(self, event: str, **fields: Any) -> None: ...


class Closable(Protocol):
    def close(self) -> None: ...


class ToolAttacher(Protocol):
    """Extra tools for the model, handed in by the layer above (the CLI passes the external
    MCP servers'): called once before the first step, while the tools can still join the
    prefix; what it returns is closed when the run ends."""

    def __call__(
        self,
        agent: AgentSession,
        cfg: Config,
        *,
        cwd: Path,
        log: EventSink,
        redactor: Redactor | None = None,
    ) -> Closable | None: ...


def open_agent(
    task: Task,
    cfg: Config,
    repo: Repo,
    base_commit: str,
    *,
    stored: TaskDoc,
    redactor: Redactor,
    replay: Path | None = None,
    record: Path | None = None,
    done: Collection[str] = (),
    attempts: Mapping[str, int] | None = None,
) -> AgentSession | None:
    """The model side of a run with model steps still to run (`done`: the ids of those that
    will not run again; `attempts`: how many each step already made): the provider and the
    prefix every request starts with (built from `stored`, the task as the manifest keeps
    it). Every model those steps can still reach must be on its server first (each server is
    asked what it serves, loading nothing); then only the models they start with are warmed
    up (loaded), so a missing host or model fails before anything is created and Ollama does
    not load a model no step uses. Every request to a model passes `redactor`
    (coder.models.redacting). `replay` answers from a recording (asking no server);
    `record` writes the replies there."""
    pending = [s for s in task.steps if s.uses_model and s.id not in done]
    if not pending:
        return None
    from coder.models.factory import open_models
    from coder.models.served import require_served

    made = attempts or {}
    if replay is None:  # a replay asks no server
        require_served(cfg, model_uses(task, pending, made))
    models = open_models(cfg, redactor=redactor, model=task.model, replay=replay, record=record)
    first = list(
        dict.fromkeys(next_model(task, s, made.get(s.id, 0)) or models.model for s in pending)
    )
    try:
        facts = warm_up(models, first)
    except BaseException:
        models.close()
        raise
    session = _session(models, facts, cfg, repo, base_commit, stored, redactor)
    if cfg.warm_prefix and replay is None:
        # While the worktree is checked out, the servers take in the shared prefix.
        session.priming = threading.Thread(
            target=models.prime,
            args=([{"role": "system", "content": session.system}], session.tools, first[0]),
            name="warm-prefix",
            daemon=True,
        )
        session.priming.start()
    return session


def _session(
    models: Models,
    facts: ModelFacts,
    cfg: Config,
    repo: Repo,
    base_commit: str,
    stored: TaskDoc,
    redactor: Redactor,
) -> AgentSession:
    """The session over warmed-up `models`: the tool registry and the prefix built for the
    smallest context among them."""
    from coder import project
    from coder.agent import prefix
    from coder.git import repository
    from coder.tools.registry import default_registry

    registry = default_registry()
    built = prefix.build(
        repo,
        base_commit,
        stored,
        cfg,
        num_ctx=facts.num_ctx,
        cache_dir=project.coder_dir(repository.repo_root(repo)) / "cache",
        redactor=redactor,
    )
    return AgentSession(models, registry, built.system, registry.definitions(), facts)


def warm_up(models: Models, names: Sequence[str]) -> ModelFacts:
    """Warm up each of `names` (the models the pending steps start with), the first last so
    a server that holds one model at a time keeps the one needed first. The facts are the
    first's, with the smallest context of them all (every step shares the prefix built to
    it)."""

    warmed = {name: models.warm_up(name) for name in reversed(names)}
    facts = warmed[names[0]]
    sizes = [f.num_ctx for f in warmed.values() if f.num_ctx]
    if sizes and facts.num_ctx and min(sizes) < facts.num_ctx:
        facts = replace(facts, num_ctx=min(sizes))
    return facts


def model_uses(
    task: Task, steps: Sequence[Step], attempts: Mapping[str, int] | None = None
) -> dict[str, dict[str, list[str]]]:
    """model name -> {"model" | "fallback_model": ids of the steps that can use it so}: each
    step's own model, else the task's, and its fallback_model, else the task's, where the
    step can still reach it (`reaches_fallback`: its retries allow a third attempt, counting
    the `attempts` it already made) -- what `model_at` picks from."""
    uses: dict[str, dict[str, list[str]]] = {}
    for step in steps:
        if not step.uses_model:
            continue
        made = (attempts or {}).get(step.id, 0)
        model = step.model or task.model
        fallback = step.fallback_model or task.fallback_model
        if not reaches_fallback(task, step, made):
            fallback = None
        for role, name in (("model", model), ("fallback_model", fallback)):
            if name:
                uses.setdefault(name, {}).setdefault(role, []).append(step.id)
    return uses


def model_at(task: Task, step: Step, attempt: int) -> tuple[str | None, str | None]:
    """The model attempt number `attempt` (from 1, counted over the run's life) of the step
    uses (None: the run's) and, when the attempt escalates to `fallback_model` (the step's,
    else the task's), why."""
    fallback = step.fallback_model or task.fallback_model
    if fallback and attempt > FALLBACK_AFTER:
        first = step.model or task.model
        return fallback, (
            f"attempt {attempt} uses fallback_model {fallback} after {FALLBACK_AFTER} "
            f"failed attempts with {first}"
        )
    return step.model, None


def next_model(task: Task, step: Step, attempts: int = 0) -> str | None:
    """The model the step's next attempt uses, after the `attempts` it already made: its
    own, else the task's (its fallback once those attempts reached it)."""
    return model_at(task, step, attempts + 1)[0] or task.model


def reaches_fallback(task: Task, step: Step, attempts: int = 0) -> bool:
    """Whether the step, after the `attempts` it already made, can still get to its
    `fallback_model`: its retries allow an attempt past the FALLBACK_AFTER ones (with
    `retries` under 2, a fresh step never does)."""
    fallback = step.fallback_model or task.fallback_model
    return bool(fallback) and attempts + task.retries(step) + 1 > FALLBACK_AFTER
