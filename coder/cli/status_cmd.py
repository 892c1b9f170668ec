"""`coder status`: the runs in this repository, one line each.

Its own module, apart from `coder run`'s: the first thing a new user types should cost little
more than importing click (bench/startup.py), and with no runs yet it imports nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import emit_json, fitted, json_option, no_runs_yet, runs_dir

if TYPE_CHECKING:
    from pathlib import Path
    from typing import TypedDict

    from coder.errors import CorruptState
    from coder.run.records import PushRecord

    class StatusRow(TypedDict, total=False):
        """A run as `coder status` lists it (`--json`: the same keys)."""

        id: str
        title: str
        status: str
        progress: str
        skipped: int
        branch: str
        updated_at: str
        seq: int | None  # its place in the order runs were made (coder.run.manifest)
        error: str | None
        parent: str | None  # a fork's parent run
        runner_gone: bool  # the state says running, but no runner holds the run
        merged: str | None  # the commit `coder merge` landed on the base branch
        pushed: str | None  # the remote branch `coder push` last pushed to


@click.command(epilog="\b\nExamples:\n  coder status\n  coder status --json")
@json_option
def status(as_json: bool) -> None:
    """List the runs in this repository."""
    if no_runs_yet():  # the first thing a new user types: answered without loading the state
        _show_status([], as_json)
        return
    from coder.errors import CorruptState
    from coder.run import manifest as manifests
    from coder.run.lock import read_lock_owner
    from coder.run.records import DONE
    from coder.run.state import StateStore

    coder_dir = runs_dir()
    rows: list[StatusRow] = []
    states = {item.task_id: item for item in StateStore(coder_dir).load_all()}
    for task_id in manifests.run_ids(coder_dir):  # a run: a manifest or a checkpoint
        item = states.get(task_id) or _from_manifest(coder_dir, task_id)
        if isinstance(item, CorruptState):
            rows.append({"id": item.task_id, "status": "corrupt", "error": item.message})
            continue
        if isinstance(item, dict):
            rows.append(item)
            continue
        done = sum(1 for r in item.steps.values() if r.status in DONE)
        skipped = sum(1 for r in item.steps.values() if r.status == "skipped")
        running = read_lock_owner(coder_dir, item.task_id) is not None
        gone = item.status == "running" and not running  # the state says so; nobody runs it
        rows.append(
            {
                "id": item.task_id,
                "title": item.title,
                "status": "running" if running else item.status,
                "progress": f"{done}/{len(item.steps)}",
                "skipped": skipped,
                "branch": item.branch,
                "updated_at": item.updated_at,
                "seq": item.seq,
                "error": item.error,
                "parent": item.parent,
                "runner_gone": gone,
                "merged": item.merge.get("commit") if item.merge else None,
                "pushed": _remote_branch(item.pushed) if item.pushed else None,
            }
        )
    _show_status(rows, as_json)


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


def _remote_branch(pushed: PushRecord) -> str:
    """`origin/agent/x`, as git names a remote-tracking branch."""
    return f"{pushed['remote']}/{pushed['ref'].removeprefix('refs/heads/')}"


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


def _from_manifest(coder_dir: Path, task_id: str) -> StatusRow | CorruptState:
    """`status`'s row of a run with a manifest and no checkpoint: its runner was killed
    before writing the first one (during its checkout), or the file was deleted."""
    from coder.errors import CorruptState
    from coder.run.lock import read_lock_owner
    from coder.run.manifest import read_manifest

    try:
        manifest = read_manifest(coder_dir, task_id)
    except CorruptState as exc:
        return exc
    running = read_lock_owner(coder_dir, task_id) is not None
    return {
        "id": task_id,
        "title": manifest.doc["title"],
        "status": "running" if running else "interrupted (no state; coder resume)",
        "progress": f"0/{len(manifest.step_ids)}",
        "skipped": 0,
        "branch": manifest.branch,
        "updated_at": manifest.created_at,
        "seq": manifest.seq,
        "error": None,
        "parent": manifest.parent,
    }
