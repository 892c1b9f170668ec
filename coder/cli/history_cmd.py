"""`coder diff`, `logs` and `clean`: a run's changes and log, and removing it (`coder show -t`,
a run's progress, is in show_cmd.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from coder.cli.common import complete_steps, cwd, emit_json, json_option, resolve_run, run_option
from coder.cli.pager import page
from coder.display import escaped, quoted_name
from coder.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from coder.run import eventlog
from coder.run.lock import read_lock_owner
from coder.services import history

if TYPE_CHECKING:
    from coder.run.eventlog import Event
    from coder.services.clean import CleanedAll


@click.command(epilog="\b\nExamples:\n  coder diff -t T-1 --stat\n  coder diff -t T-1 --step s2")
@run_option()
@click.option("--step", help="Only this step's commit.", shell_complete=complete_steps)
@click.option("--stat", is_flag=True, help="Files changed and line counts instead of the patch.")
def diff(task_id: str, step: str | None, stat: bool) -> None:
    """Show a run's accumulated diff (base..branch) or one step's diff."""
    page(history.diff(history.open_run(cwd(), task_id), step=step, stat=stat), diff=not stat)


@click.command(epilog="\b\nExamples:\n  coder logs -t T-1\n  coder logs -t T-1 --follow --json")
@run_option()
@click.option(
    "--follow", "-F", is_flag=True, help="Keep printing new events while the run goes on."
)
@json_option
def logs(task_id: str, follow: bool, as_json: bool) -> None:
    """Print a run's structured event log."""
    view = history.open_run(cwd(), task_id)
    if follow:
        grace_until: float | None = None

        def finished() -> bool:  # stop a moment after the runner lets go of its lock
            nonlocal grace_until
            if read_lock_owner(view.coder_dir, task_id) is not None:
                grace_until = None
                return False
            grace_until = grace_until or time.monotonic() + 0.5
            return time.monotonic() > grace_until

        stream = eventlog.follow_events(view.coder_dir, task_id, stop=finished)
    else:
        stream = eventlog.read_events(view.coder_dir, task_id)
    import json

    if as_json or follow:
        for event in stream:
            click.echo(json.dumps(event) if as_json else format_event(event))
        return

    page("".join(format_event(event) + "\n" for event in stream))


def _clean_all(result: CleanedAll, as_json: bool) -> None:
    if as_json:
        emit_json(result)  # `refused` says why; the exit code says that some were
        if result["refused"]:
            click.get_current_context().exit(EXIT_ENVIRONMENT)
        return
    for done in result["cleaned"]:
        dropped = f" and branch {done['branch']}" if done["branch_deleted"] else ""
        kept = f"; kept branch {done['branch']}" if done["branch"] and not dropped else ""
        click.echo(f"Removed run {done['task_id']}{dropped}{kept}.")
    if not result["cleaned"] and not result["refused"]:
        click.echo("Nothing to clean.")
    if result["refused"]:
        first = result["refused"][0]
        names = ", ".join(r["task_id"] for r in result["refused"])
        raise EnvironmentProblem(
            f"{len(result['refused'])} run(s) not cleaned ({names}); {first['task_id']}: "
            f"{first['error']}",
            hint=first["hint"],
        )


def format_event(event: Event) -> str:
    """One line per event, its control characters (a file name's, a command's) escaped."""
    skip = {"timestamp", "level", "event", "task_id", "step_id", "logger"}
    rest = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip and v not in ("", None))
    stamp = str(event.get("timestamp", ""))[11:19]
    return escaped(
        f"{stamp} {event.get('level', ''):<7} {event.get('step_id', ''):<10} "
        f"{event.get('event', '')} {rest}".rstrip()
    )


@click.command(
    epilog="\b\nExamples:\n  coder clean -t T-1 --delete-branch\n  coder clean --merged\n"
    "  coder clean --all --delete-branch"
)
@run_option(only=False, required=False)
@click.option("--all", "every", is_flag=True, help="Every run of the project.")
@click.option("--merged", is_flag=True, help="Every run that was merged.")
@click.option("--keep-branch", is_flag=True, help="Keep the branch even if the run was merged.")
@click.option("--delete-branch", is_flag=True, help="Delete the branch even if it was not merged.")
@click.option(
    "--force", is_flag=True, help="Discard uncommitted changes in the run's worktree too."
)
@json_option
def clean(
    task_id: str | None,
    every: bool,
    merged: bool,
    keep_branch: bool,
    delete_branch: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Remove a run: worktree, state, artifacts, logs.

    The branch goes too when the run was merged (unless --keep-branch) or with --delete-branch.
    A worktree with uncommitted changes is refused (the files are listed) unless --force.
    Commands a killed runner left running are ended first. A clean that was cut short is
    finished by the next one; with nothing left to remove, it says so and exits 0. --all and
    --merged clean every run (every merged one), also runs whose files under .coder/ were
    deleted by hand but whose agent/ branch holds their commits; only branches of coder's runs
    are ever deleted.
    """
    from coder.services import clean as cleaning

    options = {"keep_branch": keep_branch, "delete_branch": delete_branch, "force": force}
    if every or merged:
        if task_id is not None or (every and merged):
            raise click.UsageError("pass one of -t ID, --last, --all or --merged")
        _clean_all(cleaning.clean_all(cwd(), merged_only=merged, **options), as_json)
        return
    if task_id is None:
        task_id = resolve_run(None, only=False)  # says which options name a run
    result = cleaning.clean(cwd(), task_id, **options)
    if as_json:
        emit_json(result)
        return
    if result["nothing"]:
        known = ", ".join(result["runs"][:10]) or "none"
        click.echo(f"Nothing to clean: no run {task_id} (runs here: {known}).")
        if result["branch"]:
            click.echo(
                f"Kept branch {result['branch']}, which holds commits of the run (delete it "
                "with --delete-branch)."
            )
        return
    if result["ended"]:
        pids = ", ".join(map(str, result["ended"][:10]))
        click.echo(f"Ended {len(result['ended'])} leftover command process(es) (pids {pids}).")
    if result["discarded"]:
        names = ", ".join(quoted_name(n) for n in result["discarded"])
        click.echo(f"Discarded uncommitted changes: {names}.")
    click.echo(f"Removed run {task_id}.")
    if result["branch_deleted"]:
        click.echo(f"Deleted branch {result['branch']}.")
    elif result["branch"] is None:  # gone already, or its manifest and state unreadable
        click.echo("No branch of the run found (see `git branch`).")
    else:
        click.echo(f"Kept branch {result['branch']} (delete it with --delete-branch).")
