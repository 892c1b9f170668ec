"""`coder stop`: ask a run's runner to stop (SIGTERM: it finishes what it must and checkpoints),
wait for it, and kill a runner that does not stop, with the commands it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coder import project
from coder.errors import (
    ConcurrentRun,
    EnvironmentProblem,
    InvalidInput,
)
from coder.git import repository
from coder.policy import sandbox
from coder.run.lock import TaskLock, pid_alive, read_lock_owner
from coder.run.manifest import load_manifest

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Stopped:
    """How `stop` ended a run: `forced` when the runner did not stop when asked (blocked in
    `blocked_in`, the kernel function it waited in) and was killed with its commands."""

    pid: int
    forced: bool = False
    blocked_in: str | None = None
    commands: tuple[int, ...] = ()  # pids of the command processes killed with it


def stop_run(task_id: str, *, cwd: Path, wait: float = 30.0) -> Stopped:
    """End the run of `task_id`. First as asked (SIGTERM: the current step is interrupted and
    checkpointed); a runner that is still there after `wait` seconds is stuck (a read that
    blocks, a wait that never ends), so it is killed (SIGKILL), and the commands it left
    running (its sandboxed processes, in their own sessions) with it. A killed runner leaves
    its run as a crash does: `coder resume` continues it."""
    root = repository.repo_root(repository.open_repo(cwd))
    coder_dir = project.coder_dir(root)
    load_manifest(coder_dir, task_id)
    pid = read_lock_owner(coder_dir, task_id)
    if pid is None:
        raise InvalidInput(
            f"run {task_id} is not running",
            hint=f"see `coder status`; continue it with `coder resume -t {task_id}`",
        )

    def gone(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while pid_alive(pid) and read_lock_owner(coder_dir, task_id) == pid:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    os.kill(pid, signal.SIGTERM)
    if gone(wait):
        return Stopped(pid)
    blocked_in = _waiting_in(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not gone(10.0):
        raise EnvironmentProblem(
            f"run {task_id} (pid {pid}) did not stop within {wait:.0f}s, nor when killed",
            hint=f"see `ps -o stat,wchan -p {pid}` (a D state waits on the kernel, often a "
            "stuck file system)",
        )
    return Stopped(pid, True, blocked_in, tuple(_end_commands(coder_dir, task_id)))


def _waiting_in(pid: int) -> str | None:
    """The kernel function the process sleeps in (`wait_for_partner`: opening a FIFO), if any."""
    try:
        where = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return None
    return where if where not in ("", "0") else None


def _end_commands(coder_dir: Path, task_id: str) -> list[int]:
    """Kill what a killed runner's commands left running, holding the task's lock (so no new
    runner starts commands meanwhile); none when another runner already took the lock (its
    `resume` does the same)."""
    try:
        with TaskLock(coder_dir, task_id):
            return sandbox.kill_owned(sandbox.owner_token(coder_dir, task_id))
    except ConcurrentRun:
        return []
