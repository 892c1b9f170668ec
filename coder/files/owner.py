"""Whose a leftover is: the coder process that made it, named in it, so that a later coder can
tell one a killed coder left behind (its cgroups, its temporary directories, its `.keep` files)
from one a live coder is using.

A pid alone does not name a process: it is reused. A pid with the process's start time (clock
ticks since boot, from /proc) does, within one pid namespace; so the tag is
`<pid namespace>-<pid>-<start time>`, and a tag of another pid namespace (another container)
names no process here and is never judged gone.
"""

from __future__ import annotations

import functools
import os


def started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if there is none: with the
    pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return int(fields[19])  # field 22, counted after the command name


@functools.lru_cache(maxsize=1)
def pid_namespace() -> str:
    try:
        return "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit())
    except OSError:  # no procfs: no tag names a process gone
        return ""


def tag() -> str:
    """This process's tag (see the module docstring)."""
    return _tag(os.getpid())


@functools.lru_cache(maxsize=4)
def _tag(pid: int) -> str:  # by pid: a forked child has a tag of its own
    return f"{pid_namespace()}-{pid}-{started(pid)}"


def gone(found: str) -> bool:
    """Whether `found`, a tag, names a process of this pid namespace that no longer runs (its
    pid is free, or names a process started at another time). False for anything else: a live
    process, another namespace's, or not a tag at all."""
    parts = found.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or not pid_namespace():
        return False
    namespace, pid, start = parts
    return namespace == pid_namespace() and started(int(pid)) != int(start)
