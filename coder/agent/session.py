"""The model side of a run: the session every model step shares and how it is opened (models
checked on their servers, warmed up, the prefix built and primed). What can be decided once per
run is decided here, not by each step: the config the models are read from, code_search's
embedder, each model's tool protocol. Which model each attempt of a step uses is fallback.py's."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from coder import project
from coder.agent import prefix
from coder.agent.fallback import model_uses, next_model
from coder.agent.texttools import format_for
from coder.git import repository
from coder.models import bounds, protocol
from coder.models.factory import model_config, open_models
from coder.models.served import require_served
from coder.taskfile import graph
from coder.tools.codeindex import code_settings
from coder.tools.registry import default_registry

if TYPE_CHECKING:
    from coder.agent.texttools import ToolFormat
    from coder.config import Config
    from coder.git.repository import Repo
    from coder.models.protocol import Choice
    from coder.models.provider import Message, ModelFacts, Models, ToolSchema
    from coder.redact import Redactor
    from coder.taskfile import Step, Task, TaskDoc
    from coder.tools.base import CodeSearch
    from coder.tools.registry import Registry


@dataclass
class AgentSession:
    """What every model step of a run shares: the models, the tool registry and the
    byte-stable prefix (system prompt and tool definitions, fixed for the whole run), and
    what the run's config decides for every step (its models' places, code_search's
    embedder)."""

    models: Models
    registry: Registry
    system: str
    tools: list[ToolSchema]
    facts: ModelFacts
    config: Config
    code: CodeSearch  # code_search's cache and embedder, opened once for every step
    # kind -> the tools the prefix lists for it (prefix.model_kinds): a step's first message
    # names its tools only where they differ
    kind_tools: Mapping[str, list[str]] = field(default_factory=dict)
    priming: threading.Thread | None = None  # the warm prefix being sent (warm_prefix)
    priming_stop: threading.Event = field(default_factory=threading.Event)
    warm_model: str | None = None  # the model the warm prefix goes to (None: none is sent)
    width: int = 1  # the most model steps in one level: the slots the warm prefix goes to
    # model name -> its tool protocol (coder.models.protocol), decided once per run
    protocols: dict[str, Choice] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prime(self) -> None:
        """Start sending the warm prefix to `warm_model`, as it will see it: call once the
        tools are final (external ones join the prefix first). Once per run; see `primed`."""
        model = self.warm_model
        if self.priming is not None or model is None:
            return
        fmt = tool_format(self, model)[0]
        prefix: list[Message] = [{"role": "system", "content": fmt.system(self.system)}]

        def send() -> None:  # within a bound of its own: `stop_priming` ends it
            with bounds.within(cancel=self.priming_stop):
                tools = fmt.request_tools(self.tools) or []
                self.models.prime(prefix, tools, model, self.width)

        self.priming = threading.Thread(target=send, name="warm-prefix", daemon=True)
        self.priming.start()

    def primed(self) -> None:
        """Wait for the warm prefix, if it is being sent: called right before a step's first
        request, so the prefix is taken in while the run does its other work (the worktree,
        the steps before the first model step, the step's focus search) and the first
        request finds it in the server's cache. The step's bound (coder.models.bounds) ends
        the wait, and the prefix with it: a server that does not take it in within the step's
        time will not answer the step either."""
        if self.priming is None:
            return
        bound = bounds.current()
        if bound is None:
            self.priming.join()
        elif not bound.join(self.priming):
            self.stop_priming()

    def stop_priming(self) -> None:
        """End the warm prefix if it is still being sent (its connection is shut down), and
        wait until it has: before the models close."""
        self.priming_stop.set()
        if self.priming is not None:
            self.priming.join()


class EventSink(Protocol):
    """Where an attacher reports (coder.run.eventlog.EventLog is one)."""

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

    made = attempts or {}
    if replay is None:  # a replay asks no server
        require_served(cfg, model_uses(task, pending, made))
    models = open_models(cfg, redactor=redactor, model=task.model, replay=replay, record=record)
    first = list(
        dict.fromkeys(next_model(task, s, made.get(s.id, 0)) or models.model for s in pending)
    )
    try:
        facts, warmed = warm_up(models, first)
    except BaseException:
        models.close()
        raise
    session = _session(models, facts, cfg, repo, base_commit, stored, redactor, task.steps)
    for name in first:  # known before the first step: the prefix primed is the model's own
        tool_format(session, name, warmed[name])
    if cfg.warm_prefix and replay is None:
        session.warm_model = first[0]
        session.width = widest_level(task, pending)
        if not cfg.mcp_servers:  # else once their tools joined it (coder.run.drive)
            # While the run prepares, the servers take in the shared prefix (`primed`).
            session.prime()
    return session


def widest_level(task: Task, steps: Sequence[Step]) -> int:
    """The most of `steps` in one level of the task's DAG: the most that can run at once."""
    wanted = {s.id for s in steps}
    levels = graph.levels(graph.build(task.deps()))
    return max((sum(s in wanted for s in level) for level in levels), default=1) or 1


def _session(
    models: Models,
    facts: ModelFacts,
    cfg: Config,
    repo: Repo,
    base_commit: str,
    stored: TaskDoc,
    redactor: Redactor,
    steps: Sequence[Step],
) -> AgentSession:
    """The session over warmed-up `models`: the tool registry and the prefix built for the
    smallest context among them, saying what each kind of the task's `steps` may do."""
    registry = default_registry()
    kind_tools = prefix.model_kinds(steps, registry)
    cache = project.coder_dir(repository.repo_root(repo)) / "cache"
    built = prefix.build(
        repo,
        base_commit,
        stored,
        cfg,
        num_ctx=facts.num_ctx,
        cache_dir=cache,
        redactor=redactor,
        kinds=kind_tools,
    )
    return AgentSession(
        models,
        registry,
        built.system,
        registry.definitions(),
        facts,
        config=cfg,
        code=code_settings(cfg, cache, redactor),
        kind_tools=kind_tools,
    )


def warm_up(models: Models, names: Sequence[str]) -> tuple[ModelFacts, dict[str, ModelFacts]]:
    """Warm up each of `names` (the models the pending steps start with), the first last so
    a server that holds one model at a time keeps the one needed first. The facts are the
    first's, with the smallest context of them all (every step shares the prefix built to
    it), and each model's own."""

    warmed = {name: models.warm_up(name) for name in reversed(names)}
    facts = warmed[names[0]]
    sizes = [f.num_ctx for f in warmed.values() if f.num_ctx]
    if sizes and facts.num_ctx and min(sizes) < facts.num_ctx:
        facts = replace(facts, num_ctx=min(sizes))
    return facts, warmed


def tool_format(
    session: AgentSession, model: str | None, facts: ModelFacts | None = None
) -> tuple[ToolFormat, Choice]:
    """How `model` (None: the run's) is given its tools, and why: decided at its first use
    in the run (coder.models.protocol; `facts` from its warm-up, else it is warmed up now
    when the decision needs them), the format over the session's tools as they are now."""
    name = model or session.models.model
    with session.lock:
        choice = session.protocols.get(name)
        if choice is None:
            place, served = model_config(session.config, name)
            remembered = protocol.Remembered(protocol.cache_path(session.config.project_root))
            if facts is None and place.tool_protocol == "auto":
                facts = session.models.warm_up(name)
            choice = protocol.decide(place, served, facts or session.facts, remembered)
            session.protocols[name] = choice
    return format_for(choice, session.tools), choice


def tools_as_text(session: AgentSession, model: str | None, reason: str) -> Choice:
    """`model` answered in prose naming a tool under an unproven native choice: it uses text
    tools from now on (remembered for its server)."""
    name = model or session.models.model
    place, served = model_config(session.config, name)
    remembered = protocol.Remembered(protocol.cache_path(session.config.project_root))
    choice = protocol.learned(place, served, reason, remembered)
    with session.lock:
        session.protocols[name] = choice
    return choice
