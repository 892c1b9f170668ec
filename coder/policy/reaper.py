"""Whether a sandbox can still hold a process, told without starting one to look.

A process a command leaves behind (it called setsid, or double-forked and its parent exited)
would go on changing the worktree while coder checks and commits it, so after each step's
commands `confine.end_leftovers` ends every process still in the step's sandbox, from inside
it (a `kill -9 -1` that Landlock keeps to the sandbox). That costs a process start per step;
this module lets it be skipped when nothing can be left:

    start()        coder becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux): from
                   then on an orphan of any process coder started is reparented to coder
                   instead of init, so it stays coder's child until it ends and is reaped
    track(p, k)    a process coder started for sandbox k (a command, a confined git), until
                   it is reaped
    quiet(k)       True only when each child of coder is a tracked, unreaped process of
                   another sandbox than k: every live process of k descends from a child of
                   coder (the subreaper sees to that), and none of those is k's
    reap(pids)     reap those of `pids` (listed from inside a sandbox just before its kill)
                   that are or become coder's children, untracked ones only

Reaping is by pid (a pidfd), never `waitpid(-1)`: that would take the exit status of a Popen
another thread waits on (it would then read 0). The pids come from inside the sandbox, where
only the sandbox's own processes can be signalled, so they are leftovers no one waits for.

Where this cannot be sure it says "not quiet", and the kill runs as before: no subreaper (not
Linux, or `start` not called: only `coder run`/`resume` call it, where the process ends with
the run), a sandbox whose spawner started before the subreaper, no readable
`/proc/self/task/*/children` (CONFIG_PROC_CHILDREN), a thread that came or went while the
children were read, two readings that differ (the kernel may skip a child when another is
reaped during the read), or any untracked child at all (an orphan of anything coder ran, an
MCP server, a process started by another thread that is not tracked yet).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

_PR_SET_CHILD_SUBREAPER = 36
_TASKS = "/proc/self/task"

_lock = threading.Lock()
_active = False
_tracked: dict[int, tuple[weakref.ref[subprocess.Popen[bytes]], object]] = {}


def start() -> bool:
    """Make this process a child subreaper, once; whether it is one (and can list its
    children). Only for a process that exits with its work (a run): an orphan that is no
    sandbox's leftover stays its zombie until then."""
    global _active
    with _lock:
        if not _active and _readable():
            libc = ctypes.CDLL(None, use_errno=True)
            _active = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        return _active


def active() -> bool:
    return _active


def _readable() -> bool:
    try:
        with open(f"{_TASKS}/{threading.get_native_id()}/children", "rb"):
            return True
    except OSError:
        return False


def track(proc: subprocess.Popen[bytes], owner: object) -> None:
    """`proc` was started for sandbox `owner`; it counts as known until it is reaped (kept
    only in a subreaper: elsewhere nothing asks, and nothing would forget it)."""
    if not _active:
        return
    with _lock:
        _tracked[proc.pid] = (weakref.ref(proc), owner)


def _live() -> dict[int, object]:
    """pid -> sandbox of the tracked processes not reaped yet (a Popen collected unreaped is
    forgotten: its process then counts as unknown)."""
    with _lock:
        for pid, (ref, _) in list(_tracked.items()):
            proc = ref()
            if proc is None or proc.returncode is not None:
                del _tracked[pid]
        return {pid: owner for pid, (_, owner) in _tracked.items()}


def children() -> frozenset[int] | None:
    """The pids of this process's children (those of every thread), or None when unsure."""
    try:
        first, second = _reading(), _reading()
    except OSError:  # a thread ended while it was read
        return None
    if first is None or first != second:
        return None
    return first[1]


def _reading() -> tuple[tuple[str, ...], frozenset[int]] | None:
    tasks = tuple(sorted(os.listdir(_TASKS)))
    found: set[int] = set()
    for tid in tasks:
        with open(f"{_TASKS}/{tid}/children", "rb") as f:
            found.update(int(pid) for pid in f.read().split())
    if tuple(sorted(os.listdir(_TASKS))) != tasks:
        return None
    return tasks, frozenset(found)


def quiet(owner: object) -> bool:
    """Whether no process of sandbox `owner` can be running (see the module docstring). The
    caller knows none of `owner`'s commands is meant to be running, and that every process
    `owner` ever started was started while this process was a subreaper."""
    if not _active:
        return False
    found = children()
    if found is None:
        return False
    live = _live()  # read after the children: one reaped meanwhile is "unknown", not "known"
    return all(live.get(pid, owner) is not owner for pid in found)


def reap(pids: Iterable[int], wait: float = 1.0) -> None:
    """Reap those of `pids` that are or become this process's children, untracked ones only,
    waiting up to `wait` seconds for them to end (a SIGKILL is delivered, not waited for; a
    grandchild is reparented here when its killed parent ends). What is left then counts as
    an unknown child, so the next `quiet` says no and the next kill lists it again."""
    live = _live()
    fds: dict[int, int] = {}
    for pid in set(pids) - set(live):
        try:
            fds[pid] = os.pidfd_open(pid)  # the process itself, whatever reuses its pid later
        except OSError:  # gone already
            continue
    deadline = time.monotonic() + wait
    try:
        while fds and time.monotonic() < deadline:
            for pid, fd in list(fds.items()):
                if _reaped(fd):
                    os.close(fds.pop(pid))
            if fds:
                time.sleep(0.001)
    finally:
        for fd in fds.values():
            os.close(fd)


def _reaped(fd: int) -> bool:
    """Whether the process is reaped (by us now, or by its own parent before)."""
    try:
        found = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:  # not our child: its parent's, or ours once that parent ends
        return _ended_elsewhere(fd)
    except OSError:  # no waitid on a pidfd here (Linux < 5.4): left as an unknown child
        return True
    return found is not None


def _ended_elsewhere(fd: int) -> bool:
    """Not our child and ended: either reaped by its parent, or a zombie of a parent that is
    ending (then it becomes ours). Looked at again until `reap`'s time is up, unless signalling
    it shows it is gone for good."""
    import signal

    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:  # reaped: nothing left of it
        return True
    except OSError:
        return False
    return False
