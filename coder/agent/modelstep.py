"""A model step's attempt (`analyze`, `edit`, `doc`, `custom`, and a test or lint step's fix
cycles): the tools it may call, its first message, the conversation with the model, and the
model's `step_complete` claim checked against the real changes.

What every step shares is decided once per run by the session (coder.agent.session): the
models and the config they are read from, the tool registry and the prefix, each model's tool
protocol, code_search's embedder. An attempt adds only its own: which model this attempt uses,
its tools, its message, its bounds. The run engine hands each attempt in as a `StepAttempt`
(coder.run.steps.StepContext is one) and turns the `LoopResult` into the step's outcome
(coder.run.steps.model).
"""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from coder.agent import events as ev
from coder.agent import prompts
from coder.agent.fallback import model_at
from coder.agent.loop import AgentLoop, Limits, LoopResult
from coder.agent.prefix import step_focus
from coder.agent.session import AgentSession, EventSink, tool_format, tools_as_text
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_private
from coder.git import workdir
from coder.models import bounds
from coder.policy.paths import naming
from coder.taskfile import Step, Task, graph, is_repo_relative
from coder.taskfile.kinds import KINDS, ModelRole
from coder.tools.base import ToolContext
from coder.tools.registry import TERMINAL_TOOL, doc_write_filter, tools_for_kind

if TYPE_CHECKING:
    from coder.config import Config
    from coder.models.provider import Arguments, Message
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.taskfile.policies import Policies
    from coder.tools.proposal import Proposal, Verdict
    from coder.tools.registry import Registry

EXTERNAL_SEPARATOR = "__"  # external MCP tools are <server>__<tool> (coder.mcp.client)


class StepLog(EventSink, Protocol):
    """Where an attempt reports (coder.run.eventlog.EventLog)."""

    def bind(self, **fields: Any) -> StepLog: ...

    def live(self, event: object) -> None: ...

    def log(self, level: ev.Level, event: str, **fields: Any) -> None: ...


class StepApprover(Protocol):
    """Per-edit approvals for one attempt (coder.run.approvals.StepApprovals): asked before
    each edit and command; what the user refused goes into the step's reasons."""

    refusals: list[str]

    def __call__(self, proposal: Proposal) -> Verdict: ...


class EditApprovals(Protocol):
    """Per-edit approvals for a whole run (coder.run.approvals.EditApprovals)."""

    def for_step(self, step_id: str, log: EventSink) -> StepApprover: ...


class RunRules(Protocol):
    """The run's resolved settings an attempt goes by (coder.run.settings.RunSettings)."""

    @property
    def config(self) -> Config: ...
    @property
    def policies(self) -> Policies: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def max_turns(self) -> int: ...
    @property
    def max_step_tokens(self) -> int | None: ...
    @property
    def model_timeout(self) -> int: ...


class StepAttempt(Protocol):
    """One attempt of a step, as the run engine gives it (coder.run.steps.StepContext)."""

    @property
    def task(self) -> Task: ...
    @property
    def step(self) -> Step: ...
    @property
    def workdir(self) -> Path: ...
    @property
    def attempt(self) -> int: ...
    @property
    def settings(self) -> RunRules: ...
    @property
    def artifacts(self) -> Path: ...
    @property
    def cancel(self) -> threading.Event: ...
    @property
    def log(self) -> StepLog: ...
    @property
    def redactor(self) -> Redactor: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def agent(self) -> AgentSession | None: ...
    @property
    def previous_error(self) -> str | None: ...
    @property
    def approve_edit(self) -> EditApprovals | None: ...
    @property
    def notes(self) -> tuple[str, ...]: ...
    @property
    def asker(self) -> str: ...

    def artifact(self, suffix: str) -> Path: ...


def attempt(ctx: StepAttempt, session: AgentSession) -> LoopResult:
    """One attempt of a model step: the step's tools and first message, the conversation
    until an accepted step_complete or a bound; a read-only kind's findings kept as its notes
    for the steps after it (`notes_for`)."""
    allowed = allowed_tools(
        ctx.step, tools_for_kind(ctx.step.kind, session.registry), session.registry.names()
    )
    if ctx.step.tools is not None and allowed == [TERMINAL_TOOL]:
        ctx.log.warning(
            "run.warning",
            message=f"step {ctx.step.id}: its tools list "
            f"({', '.join(ctx.step.tools)}) matches no available tool",
        )
    kind = KINDS[ctx.step.kind]
    assert kind.model is not None, f"{kind.name} steps have no model"
    first = first_message(ctx, session, allowed)
    result = converse(ctx, role=kind.model, allowed=allowed, first_message=first)
    if result.ok and kind.read_only:
        write_private(
            notes_path(ctx.artifacts, ctx.step.id), ctx.redactor.redact(result.summary) + "\n"
        )
    return result


def first_message(ctx: StepAttempt, session: AgentSession, allowed: list[str]) -> str:
    """The step's first message: its goal and changes, its tools, the findings of the
    analyze steps before it, why its previous attempt failed, the code it is about."""
    s = ctx.step
    return prompts.step_message(
        step={"id": s.id, "kind": s.kind, "goal": s.goal, "changes": list(s.changes)},
        tools=allowed,
        notes=notes_for(ctx),
        attempt=ctx.attempt,
        previous_error=ctx.previous_error,
        focus=step_focus(
            ctx.workdir,
            s.goal or "",
            [c["path"] for c in s.changes],
            redactor=ctx.redactor,
            cache_dir=cache_dir(ctx),
        ),
        kind_tools=session.kind_tools.get(s.kind),
    )


def fix_cycle(ctx: StepAttempt, cycle: int, **failing: Any) -> LoopResult:
    """Fix cycle `cycle` of a test or lint step (coder.run.steps.fix): the model shown only
    what fails (`failing`: prompts.fix_message's words), with the edit kind's tools."""
    session = ctx.agent
    assert session is not None, "fix cycles run only with a session"
    allowed = tools_for_kind("edit", session.registry)
    s = ctx.step
    message = prompts.fix_message(
        step={"id": s.id, "kind": s.kind, "goal": s.goal},
        cycle=cycle,
        max_cycles=s.max_cycles,
        tools=allowed,
        kind_tools=session.kind_tools.get(s.kind),
        **failing,
    )
    return converse(
        ctx,
        role="edit",
        allowed=allowed,
        first_message=message,
        transcript=f".fix{cycle}.transcript.json",
        cycle=cycle,
    )


def allowed_tools(step: Step, kind_tools: list[str], names: list[str]) -> list[str]:
    """The tools a step may call, in registry order: its kind's tools (for `custom`, every
    tool, external MCP ones included), narrowed by the step's `tools:` list (names or globs
    such as `github__*`), which is also the only way other kinds get external tools.
    step_complete is always allowed. The run's tool list itself never changes (prefix)."""
    if step.tools is None:
        return kind_tools
    listed = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in step.tools)}
    usable = set(kind_tools) | {n for n in names if EXTERNAL_SEPARATOR in n}
    return [n for n in names if n == TERMINAL_TOOL or (n in listed and n in usable)]


def converse(
    ctx: StepAttempt,
    *,
    role: ModelRole,
    allowed: list[str],
    first_message: str,
    transcript: str = ".transcript.json",
    cycle: int | None = None,
) -> LoopResult:
    """One conversation with the model for this step: the run's prefix, then `first_message`,
    then tool calls until an accepted step_complete or a bound. The (redacted) transcript is
    kept as an artifact. The loop's events go to the event log and the live view, with the
    fix `cycle` (of a test step) attached."""
    session = ctx.agent
    assert session is not None, "model steps run only with a session"
    approvals = ctx.approve_edit.for_step(ctx.step.id, ctx.log) if ctx.approve_edit else None
    tool_ctx = tool_context(ctx, session, role, approvals)
    if ctx.notes:  # the user's guidance closes the first message (one user turn: templates
        # that want user and assistant to alternate accept it; the prefix stays as it is)
        notes = prompts.notes_message([ctx.redactor.redact(n) for n in ctx.notes])
        first_message = f"{first_message}\n\n{notes}"
    log = ctx.log.bind(fix_cycle=cycle) if cycle is not None else ctx.log
    model, escalation = model_at(ctx.task, ctx.step, ctx.attempt)
    tools, choice = tool_format(session, model)
    log.info("model.protocol", protocol=choice.protocol, reason=choice.reason)
    messages: list[Message] = [
        {"role": "system", "content": tools.system(session.system)},
        {"role": "user", "content": first_message},
    ]

    def run_tool(name: str, arguments: Arguments) -> str:
        result = session.registry.call(name, arguments, tool_ctx)
        ctx.log.info("tool.called", tool=name, ok=result.ok, arguments=json.dumps(arguments)[:300])
        return result.as_text()

    if escalation and cycle in (None, 1):
        log.warning("model.escalated", model=model, reason=escalation)
    provider = session.models.for_step(ctx.asker, model)
    limits = limits_for(ctx, session)
    loop = AgentLoop(
        provider,
        tools=session.tools,
        allowed=allowed,
        run_tool=run_tool,
        verify=lambda claim: verify_claim(
            ctx, tool_ctx, claim, role=role, registry=session.registry
        ),
        limits=limits,
        cancel=ctx.cancel,
        on_event=lambda event: report(log, event, learn=(session, ctx.step.id, model)),
        tool_format=tools,
    )
    try:  # the step's model requests end with its time or the run's stop (models.bounds)
        with bounds.within(time.monotonic() + limits.max_seconds, ctx.cancel):
            session.primed()  # the first request finds the warm prefix in the server's cache
            result = loop.run(messages)
    finally:
        provider.close()
        write_private(ctx.artifact(transcript), ctx.redactor.redact(json.dumps(messages, indent=1)))
    if escalation and cycle in (None, 1):
        result.notes.insert(0, escalation)
    if approvals is not None:  # the step's reasons say what the user refused, and why
        result.notes.extend(approvals.refusals)
    return result


def tool_context(
    ctx: StepAttempt, session: AgentSession, role: ModelRole, approvals: StepApprover | None
) -> ToolContext:
    """Where and under which rules the attempt's tool calls run: its worktree, the run's
    policy with the step's named protected paths writable, the run's settings."""
    return ToolContext(
        root=ctx.workdir,
        policy=naming(ctx.settings.policy, ctx.step.changes),
        redactor=ctx.redactor,
        cancel=ctx.cancel,
        config=ctx.settings.config,
        policies=ctx.settings.policies,
        write_filter=doc_write_filter if role == "docs" else None,
        command_timeout=ctx.step.timeout_s,
        owner=ctx.owner,
        stop_on_environment=True,
        code=session.code,
        approve=approvals,
    )


def report(
    log: StepLog,
    event: ev.LoopEvent,
    learn: tuple[AgentSession, str, str | None] | None = None,
) -> None:
    """Every loop event to the live view; to the event log, what is worth keeping (a line
    per model turn, nudge, warning, retry, endpoint or protocol switch; never per token: each
    event says, `logged()`). `learn`: the session, step id and model whose protocol switch
    the session remembers."""
    log.live(event)
    if isinstance(event, ev.ProtocolSwitched) and learn is not None:
        session, step_id, model = learn  # for the model's next steps
        tools_as_text(session, model, f"{event.reason} (step {step_id})")
    line = event.logged()
    if line is not None:
        log.log(line.level, line.event, **line.fields)


def verify_claim(
    ctx: StepAttempt,
    tool_ctx: ToolContext,
    claim: Arguments,
    *,
    role: ModelRole,
    registry: Registry,
) -> str | None:
    """Why the model's step_complete claim does not hold, or None when it does. `role` is the
    one the model plays (coder.taskfile.kinds; a test step's fix cycle edits); `registry`,
    the session's, runs the tests after an edit."""
    changed = workdir.changed_paths(ctx.workdir)
    summary = str(claim.get("summary") or "").strip()
    if not summary:
        return "give a summary of what you did (and, for an analyze step, what you found)"
    if role == "read":
        return (
            f"a read-only step must not change files (changed: {', '.join(changed)})"
            if changed
            else None
        )
    claimed = [
        str(p).strip().lstrip("./") if str(p).startswith("./") else str(p).strip()
        for p in claim.get("files_changed") or []
    ]
    bogus = [p for p in claimed if not is_repo_relative(p) or p not in changed]
    if bogus:
        return (
            f"files_changed lists {', '.join(bogus)}, which did not change (changed files: "
            f"{', '.join(changed) or 'none'}); make the change or correct the list"
        )
    if not changed and role in ("edit", "docs") and not claim.get("no_change_reason"):
        return (
            "no file was changed; make the edit with fs_edit/fs_write, or, if no change is "
            "needed, call step_complete again with no_change_reason saying why"
        )
    if changed and role == "edit" and ctx.settings.policies.run_tests_after_each_edit:
        return _tests_after_edit(ctx.log, tool_ctx, registry)
    return None


def _tests_after_edit(log: StepLog, tool_ctx: ToolContext, registry: Registry) -> str | None:
    # coder's own check, not the model's command: never put to the user (per-edit approvals)
    result = registry.call("tests_run", {}, replace(tool_ctx, approve=None))
    if "green" not in result.data:  # the tests could not run (no test command): say so, go on
        log.warning("tests.skipped", reason=result.as_text())
        return None
    log.info("tests.after_edit", green=result.data["green"])
    if result.data["green"]:
        return None
    return (
        f"the tests fail after your change:\n{result.content}\nFix them, then call "
        "step_complete again."
    )


def limits_for(ctx: StepAttempt, session: AgentSession) -> Limits:
    """The step's budgets: its own timeout, else the run's settings (coder.run.settings)."""
    settings, cfg = ctx.settings, ctx.settings.config
    return Limits(
        max_turns=settings.max_turns,
        max_seconds=float(ctx.step.timeout_s or settings.model_timeout),
        max_tokens=settings.max_step_tokens,
        max_prose_chars=cfg.max_prose_chars,
        context_tokens=session.facts.num_ctx,
        summaries=bool(cfg.fold_summaries),
    )


def cache_dir(ctx: StepAttempt) -> Path:
    """.coder/cache (artifacts are .coder/artifacts/<task id>/)."""
    return ctx.artifacts.parent.parent / "cache"


def notes_path(artifacts: Path, step_id: str) -> Path:
    make_private_dirs(artifacts)
    return artifacts / f"{step_id}.notes.md"


def notes_for(ctx: StepAttempt) -> dict[str, str]:
    """Findings of the analyze steps this step depends on (directly or not), in file order."""
    ancestors = graph.ancestors(graph.build(ctx.task.deps()), ctx.step.id)
    notes = {}
    for s in ctx.task.steps:
        if s.id not in ancestors or not KINDS[s.kind].read_only:
            continue
        try:  # coder's own file, but never read through a link or blocked on a fifo
            raw = nofollow.read_bytes(ctx.artifacts / f"{s.id}.notes.md")
        except OSError:
            continue
        notes[s.id] = raw.decode("utf-8", errors="replace").strip()
    return notes
