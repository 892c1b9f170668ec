"""A user namespace of coder's own, so that an ordinary user's commands get the walls root's get.

The view (coder.policy.view), the read-only mounts and a network namespace per spawner thread
need CAP_SYS_ADMIN, and a thread cannot get it: a process with threads cannot make a user
namespace. A process that has one thread still can. So commands that start commands call
`enter` first thing (the CLI, before anything starts a thread; the MCP launcher), and when
coder lacks CAP_SYS_ADMIN (an ordinary user, or a container's root without it), its process
moves into a new user namespace where its own uid and gid are mapped to themselves. It then
holds every capability there, which reach only what it owns anyway (its files, namespaces it
makes); outside it nothing changes: files, processes, the network and `ls -l` of its own files
look the same, other users' files show as `nobody`, and setgroups is denied (its supplementary
groups stay, as they are). Each spawner thread drops those capabilities before it starts a
command, and a program coder starts unconfined (git, an editor) loses them at exec (a non-zero
uid keeps none), so nothing coder runs is more privileged than before.

Where the kernel refuses (user namespaces off, a seccomp profile of a container), coder goes on
without: commands keep Landlock, seccomp and a network namespace per command (`unshare`), and
`coder doctor` says the view is missing.
"""

from __future__ import annotations

import functools
import os
import sys

from coder.errors import EnvironmentProblem

_CLONE_NEWUSER = 0x10000000
_CAP_SYS_ADMIN = 21
_refused: list[str] = []  # why `enter` could not, for `coder doctor`


def enter() -> str | None:
    """Move this single-threaded process into a user namespace of its own when it lacks
    CAP_SYS_ADMIN (see the module docstring). Returns why it did not, or None (done, or not
    needed): without it coder keeps the walls it had. Raises EnvironmentProblem only when
    the kernel made the namespace and then refused the map of coder's own ids."""
    if not sys.platform.startswith("linux") or _capable():
        return None
    why = _unshare()
    if why is not None:
        _refused.append(why)
    return why


def problem() -> str | None:
    """Why this process lacks the user namespace it asked `enter` for, or None."""
    return _refused[-1] if _refused else None


def _unshare() -> str | None:
    import ctypes

    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:  # mapping root needs CAP_SETFCAP in the parent namespace, from outside it
        return "root without CAP_SYS_ADMIN (a container) cannot map itself in a namespace"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER) != 0:  # also EINVAL: a thread was started already
        return f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}"
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    try:  # in the order the kernel asks for: setgroups denied before the gid map
        for name, text in maps:
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(text)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot map uid {uid} in coder's user namespace: {exc.strerror}"
        ) from None
    _capable.cache_clear()
    return None


@functools.lru_cache(maxsize=1)
def _capable() -> bool:
    """Whether this process holds CAP_SYS_ADMIN (effective) in its user namespace."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False
