"""`coder demo`: see coder do its job in a minute, with no model installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import PathType, emit_json, json_option
from coder.cli.summary import summary_table
from coder.cli.views import progress_for
from coder.services import demo as demo_mod

if TYPE_CHECKING:
    from pathlib import Path


@click.command(
    epilog="\b\nExamples:\n  coder demo\n  coder demo --keep ./calc-demo\n"
    "  coder demo --live          # the same task with your own model"
)
@click.option(
    "--keep",
    type=PathType(file_okay=False),
    help="Create the demo repository here (default: a temporary directory).",
)
@click.option(
    "--live",
    is_flag=True,
    help="Use the configured model (Ollama or OpenAI-compatible) instead of the recorded replies.",
)
@json_option
def demo(keep: Path | None, live: bool, as_json: bool) -> None:
    """Run a sample task end to end: analyze, edit, a failing test, the fix, docs, merge.

    Offline by default: a recorded model transcript is replayed, the tools, tests and git
    work happen for real in a fresh repository.
    """
    progress = progress_for(silent=as_json)
    if not as_json:
        mode = "your model" if live else "a recorded model (no model server needed)"
        click.echo(
            f"coder demo: a sample calculator project, a task to add multiply, and {mode}.\n",
            err=True,
        )
    try:
        result = demo_mod.run(
            target=keep,
            live=live,
            console=progress,
            loop_events=progress.loop_event,
            notify=None if as_json else lambda line: click.echo(f"  {line}", err=True),
        )
    finally:
        progress.close()
    state, manifest, task_id = result.run.state, result.run.manifest, result.run.task_id
    if as_json:
        emit_json(
            {
                "repo": str(result.repo),
                "task_id": task_id,
                "status": result.run.status,
                "branch": manifest.branch,
                "commits": result.commits,
                "merge": result.merge.to_dict() if result.merge else None,
            }
        )
    else:
        click.echo(summary_table(manifest.task, state))
        click.echo(f"\nStep commits on {manifest.branch}:")
        for line in result.commits:
            click.echo(f"  {line}")
        if result.merge and result.merge.commit:
            click.echo(
                f"\nSquash-merged into main as {result.merge.commit[:8]} "
                f"(tag {result.merge.tag}), tests green on the merged tree:"
            )
            click.echo("\n".join(f"  {line}" for line in result.stat.rstrip().splitlines()))
        click.echo(f"\nThe demo repository is {result.repo}. Look around:")
        click.echo(f"  cd {result.repo}")
        for command in (
            f"coder show -t {task_id}",
            f"coder diff -t {task_id} --step s3",
            f"coder logs -t {task_id}",
            "git log --oneline --graph --all",
        ):
            click.echo(f"  {command}")
    if result.run.status != "success" or not (result.merge and result.merge.commit):
        raise SystemExit(1)
