"""`coder validate`: what is wrong with a taskfile, every problem at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import PathType, cwd, emit_json, json_option
from coder.errors import EXIT_USAGE
from coder.services import validate as validation
from coder.taskfile import graph

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
