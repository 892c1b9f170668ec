"""Model steps (`analyze`, `edit`, `doc`, `custom`): the agent loop with the step's tools, ending
only when the model's `step_complete` claim holds against the real changes."""

from __future__ import annotations

import fnmatch
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.agent import events as ev
from coder.agent import prompts
from coder.agent.loop import AgentLoop, Limits, LoopResult
from coder.agent.prefix import step_focus
from coder.agent.session import model_at, tool_format, tools_as_text
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_private
from coder.git import workdir
from coder.models import bounds
from coder.policy.paths import naming
from coder.run.steps import StepContext, StepOutcome
from coder.taskfile import Step, is_repo_relative
from coder.taskfile.kinds import KINDS, ModelRole
from coder.tools.registry import TERMINAL_TOOL

EXTERNAL_SEPARATOR = "__"  # external MCP tools are <server>__<tool> (coder.mcp.client)

if TYPE_CHECKING:
    from coder.models.provider import Arguments, Message
    from coder.run.eventlog import EventLog
    from coder.tools.base import ToolContext


def run(ctx: StepContext) -> StepOutcome:
    from coder.tools.registry import tools_for_kind

    if ctx.agent is None:
        return StepOutcome(False, f"{ctx.step.kind} steps need a model; none is configured")
    allowed = allowed_tools(
        ctx.step, tools_for_kind(ctx.step.kind, ctx.agent.registry), ctx.agent.registry.names()
    )
    if ctx.step.tools is not None and allowed == [TERMINAL_TOOL]:
        ctx.log.warning(
            "run.warning",
            message=f"step {ctx.step.id}: its tools list "
            f"({', '.join(ctx.step.tools)}) matches no available tool",
        )
    first = prompts.step_message(
        step=_step_view(ctx),
        tools=allowed,
        notes=notes_for(ctx),
        attempt=ctx.attempt,
        previous_error=ctx.previous_error,
        focus=step_focus(
            ctx.workdir,
            ctx.step.goal or "",
            [c["path"] for c in ctx.step.changes],
            redactor=ctx.redactor,
            cache_dir=cache_dir(ctx),
        ),
        kind_tools=ctx.agent.kind_tools.get(ctx.step.kind),
    )
    kind = KINDS[ctx.step.kind]
    assert kind.model is not None, f"{kind.name} steps have no model"
    result = converse(ctx, role=kind.model, allowed=allowed, first_message=first)
    usage, notes = result.usage, tuple(result.notes)
    protocol = result.protocol
    if not result.ok:
        cancelled = result.error == "interrupted"
        return StepOutcome(
            False, result.error, cancelled=cancelled, usage=usage, notes=notes, protocol=protocol
        )
    if kind.read_only:
        write_private(
            notes_path(ctx.artifacts, ctx.step.id), ctx.redactor.redact(result.summary) + "\n"
        )
    return StepOutcome(True, summary=result.summary, usage=usage, notes=notes, protocol=protocol)


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
    ctx: StepContext,
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
    from coder.tools.base import ToolContext
    from coder.tools.codeindex import code_settings
    from coder.tools.registry import doc_write_filter

    session = ctx.agent
    assert session is not None, "model steps run only with a session"
    tool_ctx = ToolContext(
        root=ctx.workdir,
        # the step's named protected paths are writable
        policy=naming(ctx.settings.policy, ctx.step.changes),
        redactor=ctx.redactor,
        cancel=ctx.cancel,
        config=ctx.settings.config,
        policies=ctx.settings.policies,
        write_filter=doc_write_filter if role == "docs" else None,
        command_timeout=ctx.step.timeout_s,
        owner=ctx.owner,
        stop_on_environment=True,
        **code_settings(ctx.settings.config, cache_dir(ctx), ctx.redactor),
    )
    approvals = ctx.approve_edit.for_step(ctx.step.id, ctx.log) if ctx.approve_edit else None
    tool_ctx.approve = approvals
    if ctx.notes:  # the user's guidance closes the first message (one user turn: templates
        # that want user and assistant to alternate accept it; the prefix stays as it is)
        notes = prompts.notes_message([ctx.redactor.redact(n) for n in ctx.notes])
        first_message = f"{first_message}\n\n{notes}"
    log = ctx.log.bind(fix_cycle=cycle) if cycle is not None else ctx.log
    model, escalation = model_for(ctx)
    tools, choice = tool_format(session, ctx.settings.config, model)
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
    provider = session.models.for_step(ctx.step.id, model)
    limits = limits_for(ctx)
    loop = AgentLoop(
        provider,
        tools=session.tools,
        allowed=allowed,
        run_tool=run_tool,
        verify=lambda claim: verify_claim(ctx, tool_ctx, claim, role=role),
        limits=limits,
        cancel=ctx.cancel,
        on_event=lambda event: report(log, event, learn=(ctx, model)),
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


def model_for(ctx: StepContext) -> tuple[str | None, str | None]:
    """The model for this attempt of the step (None: the run's) and, when the attempt
    escalates to `fallback_model` (the step's, else the task's), why."""
    return model_at(ctx.task, ctx.step, ctx.attempt)


def report(
    log: EventLog, event: ev.LoopEvent, learn: tuple[StepContext, str | None] | None = None
) -> None:
    """Every loop event to the live view; to the event log, what is worth keeping (a line
    per model turn, nudge, warning, retry, endpoint or protocol switch; never per token: each
    event says, `logged()`). `learn`: the step and model whose protocol switch the session
    remembers."""
    log.live(event)
    if isinstance(event, ev.ProtocolSwitched):
        ctx, model = learn or (None, None)
        if ctx is not None and ctx.agent is not None:  # for the model's next steps
            tools_as_text(
                ctx.agent, ctx.settings.config, model, f"{event.reason} (step {ctx.step.id})"
            )
    line = event.logged()
    if line is not None:
        log.log(line.level, line.event, **line.fields)


def verify_claim(
    ctx: StepContext, tool_ctx: ToolContext, claim: Arguments, *, role: ModelRole
) -> str | None:
    """Why the model's step_complete claim does not hold, or None when it does. `role` is the
    one the model plays (coder.taskfile.kinds; a test step's fix cycle edits)."""
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
        return _tests_after_edit(ctx, tool_ctx)
    return None


def _tests_after_edit(ctx: StepContext, tool_ctx: ToolContext) -> str | None:
    from dataclasses import replace

    from coder.tools.registry import default_registry

    # coder's own check, not the model's command: never put to the user (per-edit approvals)
    result = default_registry().call("tests_run", {}, replace(tool_ctx, approve=None))
    if "green" not in result.data:  # the tests could not run (no test command): say so, go on
        ctx.log.warning("tests.skipped", reason=result.as_text())
        return None
    ctx.log.info("tests.after_edit", green=result.data["green"])
    if result.data["green"]:
        return None
    return (
        f"the tests fail after your change:\n{result.content}\nFix them, then call "
        "step_complete again."
    )


def limits_for(ctx: StepContext) -> Limits:
    """The step's budgets: its own timeout, else the run's settings (coder.run.settings)."""
    settings, cfg = ctx.settings, ctx.settings.config
    num_ctx = ctx.agent.facts.num_ctx if ctx.agent is not None else None
    return Limits(
        max_turns=settings.max_turns,
        max_seconds=float(ctx.step.timeout_s or settings.model_timeout),
        max_tokens=settings.max_step_tokens,
        max_prose_chars=cfg.max_prose_chars,
        context_tokens=num_ctx,
        summaries=bool(cfg.fold_summaries),
    )


def cache_dir(ctx: StepContext) -> Path:
    """.coder/cache (artifacts are .coder/artifacts/<task id>/)."""
    return ctx.artifacts.parent.parent / "cache"


def notes_path(artifacts: Path, step_id: str) -> Path:
    make_private_dirs(artifacts)
    return artifacts / f"{step_id}.notes.md"


def notes_for(ctx: StepContext) -> dict[str, str]:
    """Findings of the analyze steps this step depends on (directly or not), in file order."""
    from coder.taskfile import graph

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


def _step_view(ctx: StepContext) -> dict[str, Any]:
    s = ctx.step
    return {"id": s.id, "kind": s.kind, "goal": s.goal, "changes": list(s.changes)}
