"""`coder show`: a taskfile's DAG (-f) or a run's progress (-t), as text, JSON or a picture.

Its own module, apart from `coder validate`'s and from `diff`/`logs`/`clean`'s, so that each
loads only what it shows (bench/startup.py times `coder show -t`): what `-f` and `--graph` need
beyond a run's view is imported when they run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from coder import config as config_mod
from coder import taskfile
from coder.cli.common import PathType, cwd, emit_json, json_option, run_option
from coder.cli.summary import run_usage, summary_table, usage_line
from coder.display import escaped
from coder.run import judge
from coder.run.manifest import parse_task
from coder.run.notes import shown
from coder.run.secrets import stored_task, view_redactor_at
from coder.services import history

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from coder.run.records import RunState


@click.command(
    epilog="\b\nExamples:\n  coder show -f tasks/hello-shell.yaml --graph\n"
    "  coder show -t T-1 --json\n  coder show -t T-1 --format mermaid > dag.mmd"
)
@click.option("-f", "--file", "path", type=PathType(), help="A taskfile: show its DAG.")
@run_option(only=False, required=False)
@click.option("--graph", is_flag=True, help="Draw the DAG by levels (a run's statuses coloured).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "mermaid", "dot"]),
    default="text",
    show_default=True,
    help="The DAG as Mermaid or Graphviz DOT (implies --graph).",
)
@json_option
def show(path: Path | None, task_id: str | None, graph: bool, fmt: str, as_json: bool) -> None:
    """Show a taskfile's DAG (-f) or a run's progress (-t)."""
    if (path is None) == (task_id is None):
        raise click.UsageError("pass exactly one of -f FILE (a taskfile) or -t ID (a run)")
    if as_json and (graph or fmt != "text"):
        raise click.UsageError("--json and --graph/--format are alternatives: pass one")
    if graph or fmt != "text":
        draw_graph(path, task_id, fmt)
        return
    if task_id is not None:
        show_run(task_id, as_json)
        return

    assert path is not None  # click: -f or -t is required (checked above)
    from coder.taskfile import graph as dag_mod

    task = taskfile.load(path)
    named = task.source.get("id") or task.id == taskfile.id_from_name(path)
    id_note = "" if task.source.get("id") else " (the file's name)"
    id_note = id_note if named else " (generated; fixed when the run starts)"
    id_generated, model_given = not named, task.model is not None
    task = shown_task(task)
    cfg = config_mod.load()
    dag = dag_mod.build(task.deps())
    order, levels = dag_mod.order(dag), dag_mod.levels(dag)
    model = task.model or cfg.model
    model_note = "" if model_given else f" (from {cfg.sources['model']})"
    base = task.base or "the current branch"
    if as_json:
        emit_json(
            {
                "id": task.id,
                "id_generated": id_generated,
                "title": task.title,
                "branch": task.branch,
                "base": task.base,
                "model": model,
                "order": order,
                "levels": levels,
                "steps": [
                    {
                        "id": s.id,
                        "kind": s.kind,
                        "goal": s.goal,
                        "depends_on": list(s.depends_on),
                        "level": _level_of(s.id, levels),
                    }
                    for s in task.steps
                ],
            }
        )
        return
    click.echo(escaped(task.title))
    click.echo(f"  id      {task.id}{id_note}")
    click.echo(f"  branch  {task.branch}  (from {base})")
    click.echo(f"  model   {model}{model_note}")
    click.echo(f"  order   {' -> '.join(order)}")
    click.echo("")
    steps = {s.id: s for s in task.steps}
    width = max(len(s.id) for s in task.steps)
    for number, level in enumerate(levels, 1):
        click.echo(f"level {number}" + ("  (may run in parallel)" if len(level) > 1 else ""))
        for sid in level:
            s = steps[sid]
            needs = f"  <- {', '.join(s.depends_on)}" if s.depends_on else ""
            click.echo(f"  {sid:<{width}}  {s.kind:<7}  {escaped(_one_line(s.goal))}{needs}")


def draw_graph(path: Path | None, task_id: str | None, fmt: str) -> None:
    """`show --graph` / `--format`: the taskfile's or the run's DAG as a picture."""
    from coder.taskfile import diagram

    if task_id is not None:
        view = history.open_run(cwd(), task_id)
        state = view.state
        nodes, title = (
            diagram.nodes_of_run(view.manifest.task, state.to_dict()["steps"]),
            view.manifest.task.title,
        )
        header = f"{title}\n  run {task_id}: {state.status} on {view.manifest.branch}\n"
    else:
        assert path is not None
        task = shown_task(taskfile.load(path))
        nodes, title, header = diagram.nodes_of_task(task), task.title, f"{task.title}\n"
    if fmt == "mermaid":
        click.echo(diagram.mermaid(nodes), nl=False)
    elif fmt == "dot":
        click.echo(diagram.dot(nodes, title=title), nl=False)
    else:
        import shutil

        width = shutil.get_terminal_size((100, 24)).columns
        click.echo(escaped(header, lines=True))
        click.echo(diagram.text(nodes, width=width, style=status_style), nl=False)


def shown_task(task: Any) -> Any:
    """A taskfile as `show` shows it: as a run stores it, the literal secrets it holds redacted
    (coder.run.secrets.stored_task, with what this repository and process know)."""
    return parse_task(stored_task(task.to_dict(), view_redactor_at(cwd())))


def status_style(status: str, text: str) -> str:
    """A status's colour (click strips it when stdout is not a terminal)."""
    from coder.cli.progress import COLOURS

    colour = COLOURS.get(status)
    return click.style(text, fg=colour) if colour else click.style(text, dim=True)


def _level_of(step_id: str, levels: list[list[str]]) -> int:
    return next(i for i, level in enumerate(levels, 1) if step_id in level)


def _one_line(text: str, limit: int = 70) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def show_run(task_id: str, as_json: bool) -> None:

    view = history.open_run(cwd(), task_id)
    state = view.state
    redactor = history.redactor_of(view)  # the state is stored redacted; older runs' too
    if as_json:
        # what the run is (its manifest's) and how far it got (its checkpoint's), as one object
        data = {
            **view.manifest.as_dict(),
            "title": view.manifest.doc["title"],
            **state.to_dict(),
            "running_pid": view.running_pid,
            "usage": run_usage(state),
        }
        emit_json(redactor.redact_obj(data))
        return
    status: str = f"running (pid {view.running_pid})" if view.running_pid else state.status
    if status == "running":  # the state says so, but no runner holds the lock
        status = f"interrupted (the runner is gone; continue with `coder resume -t {task_id}`)"

    def echo(line: str) -> None:
        click.echo(escaped(redactor.redact(line)))

    manifest = view.manifest
    echo(f"{manifest.task.title}")
    echo(f"  id        {manifest.task_id}")
    echo(f"  status    {status}" + (f": {state.error}" if state.error else ""))
    note = state.skipped_note()
    if note:
        echo(f"  skipped   {note}")
    echo(f"  branch    {manifest.branch} (from {manifest.base} at {manifest.base_commit[:8]})")
    if manifest.parent and manifest.forked_at:
        at = manifest.forked_at
        echo(f"  fork of   {manifest.parent} at step {at['step']} (its commit {at['commit'][:8]})")
    echo(f"  worktree  {manifest.worktree}")
    if state.merge:
        merge = state.merge
        echo(
            f"  merged    {merge.get('mode')} into {merge.get('base')} as "
            f"{str(merge.get('commit'))[:8]} (tag {merge.get('tag')})"
        )
    usage = usage_line(state)
    if usage:
        echo(f"  model     {usage}")
    click.echo("")
    click.echo(redactor.redact(summary_table(manifest.task, state)))  # each cell escaped there
    reasons = [(sid, reason) for sid, r in state.steps.items() for reason in r.reasons]
    if reasons:
        click.echo("\nwhy steps were rerun, skipped or reconciled:")
        for sid, reason in reasons:
            echo(f"  {sid}: {reason}")
    _show_candidates(state, echo)
    _show_notes(state, echo)


def _show_candidates(state: RunState, echo: Callable[[str], None]) -> None:
    """The candidates of the steps tried several ways (coder.run.candidates), with verdicts."""
    for sid, record in state.steps.items():
        if record.candidates:
            click.echo(f"\n{sid}: {judge.summary(record.candidates)}")
            for candidate in record.candidates:
                echo(f"  {judge.shown(candidate)}")


def _show_notes(state: RunState, echo: Callable[[str], None]) -> None:
    """The guidance notes the user gave the steps (coder.run.notes), oldest first."""

    given = [(sid, note) for sid, r in state.steps.items() for note in r.notes]
    if given:
        click.echo("\nguidance notes:")
        for sid, note in given:
            echo(f"  {sid}: {shown(note)}")
