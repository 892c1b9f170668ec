"""`coder status`: the runs in this repository, one line each.

Its own module, apart from `coder run`'s: the first thing a new user types should cost little
more than importing click (bench/startup.py): with no runs yet it loads none of the run engine,
and with runs only what reads them (coder.services.listing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import emit_json, fitted, json_option, no_runs_yet, runs_dir

if TYPE_CHECKING:
    from coder.services.listing import StatusRow


@click.command(epilog="\b\nExamples:\n  coder status\n  coder status --json")
@json_option
def status(as_json: bool) -> None:
    """List the runs in this repository."""
    if no_runs_yet():  # the first thing a new user types: answered without loading the state
        _show_status([], as_json)
        return
    from coder.services import listing

    _show_status(listing.rows(runs_dir()), as_json)


def _show_status(rows: list[StatusRow], as_json: bool) -> None:
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("No runs yet. Start one with `coder run --autonomous -f TASKFILE`.")
        return
    click.echo(status_table(rows))


def status_table(rows: list[StatusRow]) -> str:
    """`coder status`'s table: newest first (the last made first, by coder's count; a run
    made before there was one after them, the last updated first), a header, each column
    as wide as its widest; a fork right under its parent, indented (coder.services.fork)."""
    from coder.display import escaped
    from coder.run.manifest import made_order

    def newest(row: StatusRow) -> tuple[bool, int, str]:
        return made_order(row.get("seq"), row.get("updated_at") or "")

    rows = sorted(rows, key=newest, reverse=True)
    table = [("ID", "STATUS", "STEPS", "UPDATED (UTC)", "TITLE")] + [
        (
            "  " * depth + row["id"],
            shown_status(row),
            row.get("progress", ""),
            (row.get("updated_at") or "")[:16].replace("T", " "),
            escaped(row.get("title") or row.get("error") or ""),
        )
        for depth, row in under_parents(rows)
    ]
    return fitted(table).rstrip()


def shown_status(row: StatusRow) -> str:
    """A row's STATUS cell: the status, and what became of the run since (merged, pushed),
    or what to do (a runner that is gone)."""
    if row.get("runner_gone"):
        return "interrupted (runner gone; coder resume)"
    if row.get("merged"):
        return "merged"
    status = row["status"]
    if status == "success" and row.get("skipped"):  # done, but not every step did its work
        status = f"success ({row['skipped']} skipped)"
    return f"{status}, pushed" if row.get("pushed") else status


def under_parents(rows: list[StatusRow]) -> list[tuple[int, StatusRow]]:
    """`rows` in their order, each fork moved right under its parent: (depth, row)."""
    ids = {row["id"] for row in rows}
    forks: dict[str, list[StatusRow]] = {}
    for row in rows:
        parent = row.get("parent")
        if parent in ids and parent != row["id"]:
            forks.setdefault(str(parent), []).append(row)
    placed: list[tuple[int, StatusRow]] = []
    seen: set[str] = set()

    def place(row: StatusRow, depth: int) -> None:
        if row["id"] in seen:  # a parent loop written by hand: each row once
            return
        seen.add(row["id"])
        placed.append((depth, row))
        for child in forks.get(row["id"], []):
            place(child, depth + 1)

    for row in rows:
        if row.get("parent") not in ids:
            place(row, 0)
    for row in rows:  # what a loop left unplaced
        place(row, 0)
    return placed
