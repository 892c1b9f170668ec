"""Metadata stays put outside the worktree: a read-only mount namespace for the spawner thread.

Landlock has no rights for metadata: a confined command could still chmod, chown, touch -d or
setxattr any file it can reach (your `~/.bashrc`, your checkout). A read-only mount refuses
every change to a file (contents, mode, owner, times, extended attributes, names), root
included, with EROFS, before any permission check.

So the spawner thread (see coder.policy.confine), once, before Landlock and before dropping
its capabilities:

1. unshares its mount namespace (CLONE_NEWNS implies CLONE_FS, which one thread of a process
   may unshare; the other threads keep the host's namespace);
2. makes every mount private (nothing done here reaches the host, nothing mounted there later
   reaches here) and read-only, in one `mount_setattr` over the whole tree: only the read-only
   flag is set, each mount keeps its nosuid, nodev, noexec and atime flags;
3. binds each writable directory over itself and clears the read-only flag of that bind
   (unless the directory was read-only before);
4. binds each read-only carve-out (a path inside a writable directory) over itself, read-only.

Devices stay usable on a read-only mount (writing to /dev/null, opening /dev/ptmx for a new
pseudo-terminal); /dev/shm is bound writable for POSIX shared memory. A mount namespace costs
one system call per mount here and nothing per command: the commands the thread starts share it.
It needs CAP_SYS_ADMIN in the thread's user namespace: root, or a process that made its own
user namespace (coder.policy.userns). Where it can, coder builds the view of coder.policy.view
instead (the same read-only tree, and only what a command needs in it); this wall is kept for
a machine where bind mounts work but the view does not.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable

_CLONE_NEWNS = 0x00020000
_SYS_MOUNT_SETATTR = 442  # one number on every architecture (Linux 5.12)
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000

SHARED_MEMORY = "/dev/shm"  # POSIX semaphores and shared memory: multiprocessing needs it


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def wall(writable: Iterable[str], readonly: Iterable[str] = ()) -> None:
    """Give the calling thread the read-only mount namespace of the module docstring, with
    `writable` (and /dev/shm) writable and `readonly` bound read-only over themselves; all
    real paths. Raises OSError (with the path) when the kernel refuses a step."""
    rw = [p for p in (*writable, SHARED_MEMORY) if os.path.isdir(p)]
    rw = [p for p in rw if not os.statvfs(p).f_flag & os.ST_RDONLY]  # never widen
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise _error("unshare(CLONE_NEWNS)", "/")
    _set_attributes("/", _MountAttr(_MOUNT_ATTR_RDONLY, 0, _MS_PRIVATE, 0), recursive=True)
    for path in rw:
        _bind(path)
        _set_attributes(path, _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0), recursive=False)
    for path in readonly:
        _bind(path)
        _set_attributes(path, _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), recursive=True)
    try:  # a working directory inside a bind is still the one below it until looked up again
        os.chdir(os.getcwd())
    except OSError:  # removed: nothing to look up
        pass


def _bind(path: str) -> None:
    if _libc().mount(path.encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0:
        raise _error("bind mount", path)


def _set_attributes(path: str, attr: _MountAttr, *, recursive: bool) -> None:
    flags = ctypes.c_long(_AT_RECURSIVE if recursive else 0)
    size = ctypes.c_long(ctypes.sizeof(attr))  # full registers: syscall() reads longs
    dirfd = ctypes.c_long(_AT_FDCWD)
    if _libc().syscall(_SYS_MOUNT_SETATTR, dirfd, path.encode(), flags, ctypes.byref(attr), size):
        raise _error("mount_setattr", path)


def _error(what: str, path: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}", path)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
