"""`coder plan`: a spec or a prompt becomes a taskfile (optionally run at once)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import click

from coder.cli.common import PathType, cwd, emit_json, json_option
from coder.cli.run_cmd import _finish, _progress
from coder.cli.views import activity_for
from coder.display import counted
from coder.errors import EXIT_FAILED, PlanFailed
from coder.mcp.attach import attach_configured
from coder.plan import planner
from coder.plan.output import shown
from coder.plan.spec import read_spec
from coder.run.drive import RunOptions
from coder.run.start import start_run

if TYPE_CHECKING:
    from pathlib import Path

PLAN_EPILOG = """\b
Examples:
  coder plan "add a /health endpoint with tests"
  coder plan spec.md                  (an existing file is read as the spec)
  coder plan -f spec.md --dry-run     (print the plan, write nothing)
  coder plan -f spec.md --run         (plan, then run it autonomously)

\b
Exit codes: 0 planned (or, with --run, the run succeeded), 1 no valid plan after
plan_attempts tries (the last draft is kept as tasks/ID.draft.yaml) or the run failed,
2 bad input (empty, missing or too large spec), 3 model server unreachable or model missing.
"""


@click.command(epilog=PLAN_EPILOG)
@click.argument("prompt", required=False, metavar="[SPEC_OR_PROMPT]")
@click.option(
    "-f", "--file", "spec_file", type=PathType(), help="Read the spec from FILE (Markdown or text)."
)
@click.option(
    "--out",
    type=PathType(dir_okay=False),
    help="Write the taskfile here (default: tasks/ID.yaml at the repository root).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --out file.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option(
    "--run",
    "run_after",
    is_flag=True,
    help="Run the plan right away, as `coder run --autonomous -f FILE` does.",
)
@click.option(
    "--model",
    help="The model to use (overrides config and CODER_MODEL).",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="No live status line: plain lines (as in a pipe)."
)
@json_option
def plan(
    prompt: str | None,
    spec_file: Path | None,
    out: Path | None,
    force: bool,
    dry_run: bool,
    run_after: bool,
    model: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Turn a spec or a prompt into a validated taskfile in tasks/.

    The model answers with JSON constrained by the taskfile schema; each draft is checked as
    `coder validate` does (plus allowed commands and paths inside the repository) and sent
    back with its problems until it is valid, up to `plan_attempts` times.
    """
    if run_after and dry_run:
        raise click.UsageError("--run and --dry-run cannot be combined")
    here = cwd()
    spec = read_spec(prompt, spec_file, here)
    options = planner.PlanOptions(model=model, out=out, dry_run=dry_run, force=force)
    activity = activity_for(silent=as_json, quiet=quiet)
    try:
        result = planner.plan(
            spec, cwd=here, options=options, notify=activity.note, watch=watcher(activity)
        )
    except PlanFailed as exc:
        activity.close()
        _failed(exc, as_json)
    finally:
        activity.close()
    if run_after:
        assert result.path is not None
        _run(result, model, as_json)
    elif as_json:
        emit_json(_as_dict(result, here))
    elif dry_run:
        click.echo(result.text, nl=False)
        click.echo(_summary(result, here), err=True)
    else:
        assert result.path is not None
        click.echo(_summary(result, here))
        click.echo(f"Next: coder run --autonomous -f {shown(result.path, here)}")


def watcher(activity: Any) -> Any:
    """The drafts' progress on the status line; the problems a draft goes back with, listed."""

    def watch(event: planner.PlanEvent) -> None:
        draft = f"draft {event.attempt} of {event.attempts}"
        if isinstance(event, planner.Drafting):
            activity.status(f"{draft}: waiting for the model", restart=True)
        elif isinstance(event, planner.DraftStreaming):
            rate = event.tokens / event.elapsed_s if event.elapsed_s > 0 else 0.0
            activity.status(f"{draft}: {event.tokens:,} tokens · {rate:.1f} tok/s")
        elif event.attempt < event.attempts:  # rejected, sent back (the last: see _failed)
            for problem in event.problems:
                activity.note(f"  {problem}")

    return watch


def _summary(result: Any, cwd: Path) -> str:
    where = shown(result.path, cwd) if result.path else "(dry run: not written)"
    usage = result.usage
    return (
        f"Planned {where}: {result.title} ({counted(len(result.document['graph']), 'step')}, "
        f"{counted(result.attempts, 'attempt')}, "
        f"{usage.prompt_tokens} prompt + {usage.eval_tokens} generated tokens)"
    )


def _as_dict(result: Any, cwd: Path) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "title": result.title,
        "path": shown(result.path, cwd) if result.path else None,
        "written": result.path is not None,
        "attempts": result.attempts,
        "model": result.model,
        "usage": result.usage.as_dict(),
        "steps": [
            {k: s.get(k) for k in ("id", "kind", "goal", "depends_on")}
            for s in result.document["graph"]
        ],
        "taskfile": result.text,
    }


def _failed(exc: Any, as_json: bool) -> NoReturn:
    """Every remaining problem (as `coder validate` prints them), then the error line."""
    if as_json:
        emit_json(
            {
                "error": exc.message,
                "hint": exc.hint,
                "exit_code": exc.exit_code,
                "problems": [p.as_dict() for p in exc.problems],
                "draft": str(exc.draft) if exc.draft else None,
                "attempts": exc.attempts,
            }
        )
        raise SystemExit(EXIT_FAILED)
    for problem in exc.problems:
        click.echo(str(problem), err=True)
    raise exc


def _run(result: Any, model: str | None, as_json: bool) -> None:
    """`coder run --autonomous -f PATH`, with the run command's progress and summary."""
    click.echo(_summary(result, cwd()), err=as_json)  # stdout stays one JSON document
    click.echo(f"Running it: coder run --autonomous -f {shown(result.path, cwd())}", err=True)
    progress = _progress(as_json)
    try:
        run = start_run(
            result.path,
            cwd=cwd(),
            console=progress,
            options=RunOptions(
                model=model,
                attach_tools=attach_configured,
                live=progress.loop_event,
                approvals="none",  # --autonomous, whatever the plan's policies.approvals says
            ),
        )
    finally:
        progress.close()
    _finish(run, as_json)
