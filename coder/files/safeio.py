"""Reading a file a command could have left: never block on it, never read through a link
unless asked.

A FIFO at a path coder opens would block the open until a writer comes (forever), a device can
act on being opened, and a socket cannot be opened at all. Every such file is refused with what
it is, before a byte is read: the path is checked with `stat` (which opens nothing), then opened
non-blocking, and the open descriptor is checked again (the file may have been swapped between
the two).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from coder.errors import NotRegular


def file_kind(mode: int) -> str:
    """What a file of this `st_mode` is, as messages say it."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(path: Path | str, *, follow: bool = True) -> int:
    """A read-only descriptor of the regular file at `path`, or NotRegular (FileNotFoundError,
    PermissionError, ... as `open` raises them). With follow=False a symlink at `path` is
    refused too (its last component; the caller resolves the directories)."""
    info = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegular(path, file_kind(info.st_mode))
    try:
        fd = os.open(path, _FLAGS | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link, or a socket
            raise NotRegular(path, file_kind(os.lstat(path).st_mode)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(path, file_kind(mode))
    return fd


def read_regular(path: Path | str, *, limit: int | None = None, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (at most `limit`), see `open_regular`."""
    fd = open_regular(path, follow=follow)
    with os.fdopen(fd, "rb") as file:
        return file.read() if limit is None else file.read(limit)


def contains(path: Path | str, needle: bytes, *, follow: bool = True) -> bool:
    """Whether the regular file at `path` holds `needle`, read in chunks (a file of any size
    costs a chunk of memory), see `open_regular`."""
    keep = max(len(needle) - 1, 0)  # a match may straddle two chunks
    tail = b""
    with os.fdopen(open_regular(path, follow=follow), "rb") as file:
        while block := file.read(max(1 << 20, 2 * len(needle))):
            window = tail + block
            if needle in window:
                return True
            tail = window[len(window) - keep :] if keep else b""
    return not needle
