"""`coder report`: a run as Markdown for a pull request, or as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import PathType, cwd, run_option
from coder.errors import InvalidInput
from coder.services import history
from coder.services import report as report_service

if TYPE_CHECKING:
    from pathlib import Path


@click.command(
    epilog="\b\nExamples:\n  coder report -t T-1 -o pr.md\n"
    "  gh pr create --body-file pr.md --head agent/T-1-...\n  coder report -t T-1 --format json"
)
@run_option()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["md", "json"]),
    default="md",
    show_default=True,
    help="Markdown (reads well on GitHub and GitLab) or JSON.",
)
@click.option("-o", "--output", type=PathType(dir_okay=False), help="Write to FILE, not stdout.")
def report(task_id: str, fmt: str, output: Path | None) -> None:
    """What a reviewer needs to judge a run.

    The task and its spec, the DAG with statuses (Mermaid), per step the goal, outcome,
    commit, files changed, tests before and after, fix cycles and why, tokens, time and cache
    reuse; the whole diff's stat; how to merge or revert. Redacted like the logs.
    """
    view = history.open_run(cwd(), task_id)
    text = report_service.render(report_service.build(view), history.redactor_of(view), fmt)
    if output is None:
        click.echo(text, nl=False)
        return

    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"Wrote the report of run {task_id} to {output}", err=True)
