"""`coder run --dry-run`: the plan and every check a run makes before it starts, shown
(coder.services.dryrun works it out); nothing is run, nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from coder.cli.common import cwd, emit_json
from coder.display import escaped
from coder.errors import EXIT_OK, EXIT_USAGE
from coder.run.secrets import view_redactor_at
from coder.services.dryrun import dry_run, step_models
from coder.taskfile import shown_command


def show_dry_run(path: Path, options: Any, as_json: bool) -> None:
    """`run --dry-run`: the plan and every check a run makes before it starts; exit 0 when it
    would start, 2 when it would be refused (the problems say why)."""
    plan = dry_run(path, cwd=cwd(), options=options)
    redactor = view_redactor_at(cwd())  # the taskfile's literal secrets, as `show -f`
    if as_json:
        emit_json(redactor.redact_obj(plan.as_dict()))
    else:
        click.echo(escaped(redactor.redact(render_dry_run(plan)), lines=True))
    raise SystemExit(EXIT_OK if plan.would_start else EXIT_USAGE)


def render_dry_run(plan: Any) -> str:
    task = plan.task
    steps = {s.id: s for s in task.steps}
    width = max(len(s.id) for s in task.steps)
    lines = [
        f"Dry run of {task.id}: {task.title} (nothing is run, nothing is written)",
        f"  branch    {task.branch} (from {task.base})",
        f"  worktree  {plan.worktree}",
    ]
    model = plan.model
    if model is None:
        lines.append("  model     none (no step asks a model)")
    else:
        where = f"replayed from {model['replay']}" if model["replay"] else f"at {model['host']}"
        if model["num_ctx"]:
            window = f"{model['num_ctx']} tokens (num_ctx from {model['num_ctx_source']})"
        elif model["max_num_ctx"]:
            window = (
                f"the model's own, capped at {model['max_num_ctx']} tokens (max_num_ctx); "
                "`coder doctor` reads it from Ollama"
            )
        else:
            window = "the server's (`coder doctor` reads it)"
        lines.append(f"  model     {model['name']} {where}")
        lines.append(f"  context   {window}")
        lines.append(f"  tools     {model['tool_protocol']}: {model['tool_protocol_reason']}")
        if task.fallback_model:
            lines.append(f"  fallback  {task.fallback_model} (from a step's third attempt)")
    lines.append(f"  network   {'on' if plan.network else 'off'} for commands")
    lines.append(
        "  sandbox   "
        + (
            "on: commands run in the kernel sandbox"
            if plan.sandbox
            else "off: commands run unconfined"
        )
    )
    lines.append("")
    for number, level in enumerate(plan.levels, 1):
        lines.append(f"level {number}" + ("  (may run in parallel)" if len(level) > 1 else ""))
        for sid in level:
            step = steps[sid]
            needs = f"  <- {', '.join(step.depends_on)}" if step.depends_on else ""
            own = ", ".join(
                f"{field} {name}"
                for field, name in zip(("model", "fallback_model"), step_models(task, step))
                if name and name != getattr(task, field)
            )
            if step.candidates > 1:  # the taskfile's, or `--candidates N`
                own = ", ".join(filter(None, (own, f"best of {step.candidates} candidates")))
            own = f"  [{own}]" if own else ""
            lines.append(f"  {sid:<{width}}  {step.kind:<7}  {step.goal}{needs}{own}")
    if plan.commands:
        lines += ["", "commands (the policy's decision):"]
        labels = [check.step_id for check in plan.commands]
        pad = max(len(label) for label in labels)
        for label, check in zip(labels, plan.commands):
            verdict = "allowed" if check.allowed else "REFUSED"
            lines.append(f"  {label:<{pad}}  {verdict}  {shown_command(check.cmd)}")
            if not check.allowed:
                lines.append(f"  {'':<{pad}}  {'':<7}  {check.reason}")
    lines.append("")
    if plan.would_start:
        lines.append("The run would start. Nothing was changed.")
    else:
        lines.append("The run would be refused. Nothing was changed:")
        lines += [f"  {problem}" for problem in plan.problems]
    return "\n".join(lines)
