"""`coder status`: the runs of a repository, one row each (the CLI sorts and draws them).

A row is read from the run's manifest (what the run is) and its checkpoint (how far it got;
none: a runner killed before its first checkpoint); a file that cannot be read is a row of
its own, never an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from coder.errors import CorruptState, UnknownTask
from coder.run import manifest as manifests
from coder.run.lock import read_lock_owner
from coder.run.records import DONE
from coder.run.state import StateStore

if TYPE_CHECKING:
    from pathlib import Path

    from coder.run.records import PushRecord, RunState


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


def rows(coder_dir: Path) -> list[StatusRow]:
    """Every run under `coder_dir` (a manifest or a checkpoint), in the order runs are found."""
    found: list[StatusRow] = []
    states = {item.task_id: item for item in StateStore(coder_dir).load_all()}
    for task_id in manifests.run_ids(coder_dir):  # a run: a manifest or a checkpoint
        item = states.get(task_id)
        try:
            if isinstance(item, CorruptState):
                raise item
            # Its few listed fields, not the whole manifest: that check loads the taskfile
            # package (its kinds) for every `coder status`.
            listed = manifests.read_listed(coder_dir, task_id)
        except CorruptState as exc:
            found.append({"id": task_id, "status": "corrupt", "error": exc.message})
            continue
        except UnknownTask:  # deleted since run_ids()
            continue
        found.append(_row(coder_dir, task_id, listed, item))
    return found


def _row(
    coder_dir: Path, task_id: str, listed: manifests.Listed, state: RunState | None
) -> StatusRow:
    """A run's row: its manifest's title, branch, order and parent, its checkpoint's progress
    (none: its runner was killed before writing the first one, or the file was deleted)."""
    running = read_lock_owner(coder_dir, task_id) is not None
    row: StatusRow = {
        "id": task_id,
        "title": listed.title,
        "branch": listed.branch,
        "seq": listed.seq,
        "parent": listed.parent,
    }
    if state is None:
        return row | {
            "status": "running" if running else "interrupted (no state; coder resume)",
            "progress": f"0/{listed.steps}",
            "skipped": 0,
            "updated_at": listed.created_at,
            "error": None,
        }
    done = sum(1 for r in state.steps.values() if r.status in DONE)
    skipped = sum(1 for r in state.steps.values() if r.status == "skipped")
    return row | {
        "status": "running" if running else state.status,
        "progress": f"{done}/{len(state.steps)}",
        "skipped": skipped,
        "updated_at": state.updated_at,
        "error": state.error,
        "runner_gone": state.status == "running" and not running,  # nobody runs it
        "merged": state.merge.get("commit") if state.merge else None,
        "pushed": _remote_branch(state.pushed) if state.pushed else None,
    }


def _remote_branch(pushed: PushRecord) -> str:
    """`origin/agent/x`, as git names a remote-tracking branch."""
    return f"{pushed['remote']}/{pushed['ref'].removeprefix('refs/heads/')}"
