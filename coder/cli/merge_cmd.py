"""`coder merge`: land a finished run on its base branch (squash by default), tagged coder/ID."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from coder.cli.common import cwd, emit_json, json_option, run_option
from coder.cli.views import activity_for
from coder.services import merge as merge_service
from coder.services import push as push_service

MERGE_EPILOG = """\b
Exit codes: 0 merged (or already merged, or nothing to merge; with --push, pushed too),
1 --if-green found the merge result red, 2 unknown task, a run that did not succeed or no
such remote, 3 the run is running, conflicts, a base that cannot be fast-forwarded,
uncommitted changes or an index.lock in the way, the push refused or failed, 130
interrupted (it says whether anything landed; merge again to finish).

\b
Examples:
  coder merge -t T-20261122-101500-ab12
  coder merge -t T-1 --if-green --mode no-ff --json
"""


@click.command(epilog=MERGE_EPILOG)
@run_option()
@click.option(
    "--if-green",
    is_flag=True,
    help="First run the success criteria (tests, required files) on the exact merge "
    "result in a temporary worktree; land nothing if they fail.",
)
@click.option(
    "--mode",
    type=click.Choice(["squash", "no-ff", "ff-only"]),
    default="squash",
    show_default=True,
    help="squash: one new commit; no-ff: a merge commit; ff-only: move base to the "
    "run's tip if base has not moved.",
)
@click.option(
    "--report",
    is_flag=True,
    help="Put the run's report (per step: outcome, commit, files, tests, fix cycles, tokens) "
    "in the merge commit's body, as plain lines.",
)
@click.option(
    "--push",
    "push_after",
    is_flag=True,
    help="Then push the base branch and the coder/ID tag to the remote, both or neither "
    "(git's own credentials).",
)
@click.option("--remote", help="With --push: the remote (default: the base's, else origin).")
@click.option(
    "-q", "--quiet", is_flag=True, help="No live status line: plain lines (as in a pipe)."
)
@json_option
def merge(
    task_id: str,
    if_green: bool,
    mode: str,
    report: bool,
    push_after: bool,
    remote: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Land a successful run on its base branch and tag it coder/ID.

    If the base branch is checked out, its files follow; your uncommitted edits to other files
    are kept as they are, and edits to files the merge changes make it refuse.
    """
    if push_after:  # a remote that is not there refuses before anything lands
        remote = push_service.merge_remote(cwd(), task_id, remote)
    with merge_activity(silent=as_json, quiet=quiet) as notify:
        result = merge_service.merge_run(
            task_id, cwd=cwd(), mode=mode, if_green=if_green, notify=notify, report=report
        )
    pushed = None
    if push_after and result.commit:
        pushed = push_service.push_merge(cwd(), task_id, remote=remote)
    if as_json:
        emit_json({**result.to_dict(), "pushed": pushed.to_dict() if pushed else None})
        return
    click.echo(describe(result))
    if pushed is not None:
        tag = f" and tag {pushed.tag}" if pushed.tag else ""
        click.echo(f"  pushed {pushed.base} ({pushed.commit[:12]}){tag} to {pushed.remote}")
    elif push_after:
        click.echo("  nothing merged, so nothing pushed")


@contextmanager
def merge_activity(*, silent: bool, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """What a merge tells the user, as lines; on a terminal the latest (the tests that run on
    the merge result, with `--if-green`) stays on a live status line with its elapsed time."""
    activity = activity_for(silent=silent, quiet=quiet)

    def notify(message: str) -> None:
        activity.note(message)
        activity.status(message.strip(), restart=True)

    try:
        yield notify
    finally:
        activity.close()


def describe(result: Any) -> str:
    """A `MergeResult` as a few lines of text (also used by `coder run --merge-on-success`)."""
    commit = (result.commit or "")[:12]
    if result.outcome == "nothing_to_merge":
        lines = [
            (f"Nothing to merge: {result.base} already has every change of run {result.task_id}.")
        ]
    elif result.outcome == "already_merged":
        lines = [
            (
                f"Run {result.task_id} already merged at {commit} ({result.mode} into "
                f"{result.base}, tag {result.tag})."
            )
        ]
        if result.finished:
            lines.append(f"  finished the interrupted merge: {', '.join(result.finished)}")
    else:
        checked = ", checked green" if result.verified else ""
        lines = [
            (
                f"Merged run {result.task_id} into {result.base} ({result.mode}{checked}) "
                f"as {commit}, tagged {result.tag}."
            ),
            f"  {len(result.files)} file(s) changed",
        ]
        lines.append(
            f"  checkout {result.checkout} updated"
            if result.checkout
            else f"  {result.base} is not checked out; only the branch moved"
        )
    lines += [f"  warning: {w}" for w in result.warnings]
    return "\n".join(lines)
