"""The canonical path of a file, as `os.path.realpath` gives it, asked of the kernel.

`os.path.realpath` resolves a path in Python, an `lstat` per component: 40-50 us for a path
under a run's worktree, and a step asks about 20 times (the sandbox's profile, the git guard,
the path policy). The kernel resolves it in one `open(O_PATH)` (which opens nothing for I/O:
a FIFO or a device is not touched) and `/proc/self/fd` names what it reached: under 10 us.
The answer is the same, the kernel following the same links; where it cannot say (a path
that does not exist, or not all of it, a loop, no `/proc`, not Linux) `os.path.realpath`
answers.
"""

from __future__ import annotations

import os

_O_PATH = getattr(os, "O_PATH", 0)  # Linux only


def realpath(path: str | os.PathLike[str]) -> str:
    """`os.path.realpath(path)`, see the module docstring."""
    if not _O_PATH:
        return os.path.realpath(path)
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return os.path.realpath(path)
    try:
        found = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    finally:
        os.close(fd)
    if not found.startswith("/") or found.endswith(" (deleted)"):  # not a path of this root
        return os.path.realpath(path)
    return found
