"""`coder status`: the runs of a repository, one row each (the CLI sorts and draws them).

A row is read from the run's checkpoint, else from its manifest alone (a runner killed before
its first checkpoint); a state that cannot be read is a row of its own, never an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from coder.errors import CorruptState
from coder.run import manifest as manifests
from coder.run.lock import read_lock_owner
from coder.run.manifest import read_manifest
from coder.run.records import DONE
from coder.run.state import StateStore

if TYPE_CHECKING:
    from pathlib import Path

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


def rows(coder_dir: Path) -> list[StatusRow]:
    """Every run under `coder_dir` (a manifest or a checkpoint), in the order runs are found."""
    found: list[StatusRow] = []
    states = {item.task_id: item for item in StateStore(coder_dir).load_all()}
    for task_id in manifests.run_ids(coder_dir):  # a run: a manifest or a checkpoint
        # A checkpoint still holds the run's title, branch, order and parent: reading its
        # manifest too would load the taskfile package (its kinds) for every `coder status`.
        item = states.get(task_id) or _from_manifest(coder_dir, task_id)
        if isinstance(item, CorruptState):
            found.append({"id": item.task_id, "status": "corrupt", "error": item.message})
            continue
        if isinstance(item, dict):
            found.append(item)
            continue
        done = sum(1 for r in item.steps.values() if r.status in DONE)
        skipped = sum(1 for r in item.steps.values() if r.status == "skipped")
        running = read_lock_owner(coder_dir, item.task_id) is not None
        gone = item.status == "running" and not running  # the state says so; nobody runs it
        found.append(
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
    return found


def _remote_branch(pushed: PushRecord) -> str:
    """`origin/agent/x`, as git names a remote-tracking branch."""
    return f"{pushed['remote']}/{pushed['ref'].removeprefix('refs/heads/')}"


def _from_manifest(coder_dir: Path, task_id: str) -> StatusRow | CorruptState:
    """`status`'s row of a run with a manifest and no checkpoint: its runner was killed
    before writing the first one (during its checkout), or the file was deleted."""
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
