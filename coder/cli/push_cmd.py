"""`coder push`: a run's branch on a remote for review, its report as the pull request's
body, and the page that opens the pull request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import PathType, cwd, emit_json, json_option, run_option
from coder.errors import InvalidInput
from coder.services.push import push_run

if TYPE_CHECKING:
    from pathlib import Path

PUSH_EPILOG = """\b
Only a branch coder pushed is replaced, and only where coder left it (git's
--force-with-lease): when someone else pushed to it, push refuses and changes nothing.
Credentials come from git's own credential helpers and ssh agent; coder never reads them.

\b
Exit codes: 0 pushed (or already there), 2 unknown run or no such remote (the remotes
there are are named), 3 the remote branch moved, the push failed, or the run is running.

\b
Examples:
  coder push -t T-1 -o pr.md
  gh pr create --head agent/T-1-... --body-file pr.md
  coder push -t T-1 --remote fork > pr.md
"""


@click.command(epilog=PUSH_EPILOG)
@run_option()
@click.option("--remote", help="The remote (default: the base branch's, else origin).")
@click.option(
    "-o",
    "--output",
    type=PathType(dir_okay=False),
    help="Write the pull request's body (the run's report) to FILE, not stdout.",
)
@json_option
def push(task_id: str, remote: str | None, output: Path | None, as_json: bool) -> None:
    """Push a run's branch for review; print the PR body and the compare URL."""
    result = push_run(cwd(), task_id, remote=remote)
    if output is not None:
        _write(output, result.body)
    if as_json:
        data = result.to_dict()
        if output is not None:
            data["body"] = str(output)
        emit_json(data)
        return
    # the body is stdout's (`coder push -t ID > pr.md`) unless -o took it; the rest is stderr's
    err = output is None
    if err:
        click.echo(result.body, nl=False)
    branch = result.ref.removeprefix("refs/heads/")
    done = "already there" if result.outcome == "up_to_date" else "pushed"
    lines = [
        f"Run {task_id}: {branch} {done} at {result.commit[:12]} on {result.remote} ({result.url})."
    ]
    if output is not None:
        lines.append(f"  pull request body: {output}")
    if result.compare_url:
        lines.append(f"  open the pull request: {result.compare_url}")
    else:
        lines.append(
            "  no pull request page: the remote's host is not one coder knows "
            "(GitHub, GitLab, Gitea/Forgejo, Bitbucket)"
        )
    lines += [f"  warning: {warning}" for warning in result.warnings]
    click.echo("\n".join(lines), err=err)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
