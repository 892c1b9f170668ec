"""`coder validate` and `coder show`: what a taskfile says and how the run will see it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from coder.cli.common import PathType, cwd, emit_json, json_option, run_option
from coder.display import escaped
from coder.errors import EXIT_USAGE

if TYPE_CHECKING:
    from pathlib import Path

taskfile_option = click.option(
    "-f", "--file", "path", required=True, type=PathType(dir_okay=True), help="The taskfile (YAML)."
)


@click.command(epilog="\b\nExample:\n  coder validate -f tasks/hello-shell.yaml")
@taskfile_option
@json_option
def validate(path: Path, as_json: bool) -> None:
    """Check a taskfile; report every problem at once.

    Each problem is printed as FILE:LINE:COL: message. Commands are checked against the
    policy as `coder run` checks them (with this directory's config), so a taskfile that
    validates can start.

    Exits 0 when the taskfile is valid, 2 when it is not.
    """
    from coder.services import validate as validation
    from coder.taskfile import graph

    problems, task = validation.check(path, cwd=cwd())
    if as_json:
        result: dict[str, object] = {
            "file": str(path),
            "valid": not problems,
            "problems": [p.as_dict() for p in problems],
        }
        if task:
            result.update(id=task.id, steps=len(task.steps))
        emit_json(result)
    elif problems:
        for problem in problems:
            click.echo(str(problem))
        click.echo(f"{path}: {len(problems)} problem{'s' * (len(problems) != 1)}", err=True)
    else:
        assert task is not None
        levels = graph.levels(graph.build(task.deps()))
        steps, count = len(task.steps), len(levels)
        click.echo(
            f"{path}: valid ({steps} step{'s' * (steps != 1)} in {count} level{'s' * (count != 1)})"
        )
    if problems:
        raise SystemExit(EXIT_USAGE)


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
        from coder.cli.history_cmd import show_run

        show_run(task_id, as_json)
        return

    assert path is not None  # click: -f or -t is required (checked above)
    from coder import config as config_mod
    from coder import taskfile
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
        from coder.services import history

        view = history.open_run(cwd(), task_id)
        state = view.state
        nodes, title = (
            diagram.nodes_of_run(view.manifest.task, state.to_dict()["steps"]),
            state.title,
        )
        header = f"{title}\n  run {task_id}: {state.status} on {state.branch}\n"
    else:
        from coder import taskfile

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
    from coder.run.manifest import parse_task
    from coder.run.secrets import stored_task, view_redactor_at

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
