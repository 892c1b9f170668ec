"""The checkout's `index.lock` during `coder merge` (its step 6, coder.services.merge): the
merge journal that says which index a merge of a run is writing, and the check that removes the
`index.lock` a killed merge of that run left, or refuses on any other.

The journal (`.coder/artifacts/ID/merge-index.json`) is written just before the index is, and
removed once its write is done or failed: a kill inside the write leaves both, and the next
merge of the run reads there that the lock was its own (same host, a dead pid, written within a
minute of the journal, open in no process). Any other `index.lock` is a git process working in
the checkout, or one killed there: nobody but the user can tell, so the merge refuses.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from coder.errors import EnvironmentProblem
from coder.files import nofollow
from coder.files.durable import write_private
from coder.git import land as gitland
from coder.run.lock import pid_alive, processes_holding


class IndexJournal:
    """Which index a merge of run `task_id` is writing."""

    def __init__(self, coder_dir: Path, task_id: str) -> None:
        self.path = coder_dir / "artifacts" / task_id / "merge-index.json"

    def write(self, lock: Path) -> None:
        """Just before the index is written: a kill inside the write leaves `lock`, and the
        next merge of this run reads here that it was this merge's."""
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "lock": str(lock),
            "since": time.time(),
        }
        write_private(self.path, json.dumps(record) + "\n")

    def clear(self) -> None:
        """The index is written, or its write failed and removed its lock."""
        nofollow.unlink(self.path)

    def killed_writer(self, lock: Path) -> int | None:
        """The pid of the merge of this run that was writing the index when it was killed, if
        `lock` is the one it left: the journal names this lock, its pid is dead (this merge
        holds the task lock), the lock was last written within a minute of the journal, and
        no process has it open."""
        try:
            record = json.loads(nofollow.read_bytes(self.path))
            pid, since = record["pid"], float(record["since"])
            mine = record["lock"] == str(lock) and record["host"] == socket.gethostname()
            written = lock.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not mine or not isinstance(pid, int) or pid == os.getpid() or pid_alive(pid):
            return None
        if not since - 1 <= written <= since + 60 or processes_holding(lock):
            return None
        return pid


def free_index(
    checkout: Path, journal: IndexJournal, *, task_id: str, base: str, landed: str | None = None
) -> str | None:
    """Make sure the checkout's index is free to record the merged files in: an `index.lock`
    left by a merge of this run that was killed writing it goes (the warning saying so is
    returned); any other refuses, before this call changes anything (``landed``: an earlier,
    interrupted merge moved `base` there)."""
    lock = gitland.index_lock(checkout)
    if not lock.exists():
        return None
    killed = journal.killed_writer(lock)
    if killed is not None:
        lock.unlink(missing_ok=True)
        return (
            f"removed {lock}, left by a `coder merge` of this run (pid {killed}) killed "
            "while it wrote the index"
        )
    what = f"{lock} exists: a git process is working in {checkout}, or one was killed there"
    if landed is None:
        message = f"{what}; nothing was changed"
    else:
        message = (
            f"run {task_id} landed on {base} as {landed[:12]}, but {checkout} cannot follow: {what}"
        )
    raise EnvironmentProblem(
        message,
        hint=f"if no git process is running there, delete {lock}; then run "
        f"`coder merge -t {task_id}` again",
    )
