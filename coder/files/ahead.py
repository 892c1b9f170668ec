"""Files made ahead: empty files coder creates in a directory while it has nothing else to do
(a command of a step runs), for the next writers there to take.

A new file costs some disks far more than renaming one: ext4 on this project's machines takes
0.3-0.8 ms of kernel time to allocate an inode, against 10-50 us for a rename, and a step
creates several (its command's log, its diff, its commit's pack and pack index). Made while
the step's command runs (on another core: coder would only wait for it), each costs the step a
rename. A writer that finds none ready creates its file as before; a directory is asked for
files ahead from its second write on (one written once needs none). Made in the thread that
waits, not by a helper thread: one creating files beside the step's own writes slowed them as
much as it saved (measured: the same directory's renames and links took 5-10 times longer).

A file made ahead is named `.coder-<owner tag>.<random>` (coder.files.owner): what this
process did not use is removed at exit, and what a killed coder left is removed when a later
coder first makes files ahead in that directory (`sweep`). A directory is reached as
coder.files.nofollow reaches it: one under `.coder/` never through a link.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from coder.files import nofollow, owner

PREFIX = ".coder-"  # how the name of a file coder made ahead, or a temporary one, starts


def fresh_name() -> str:
    """A name no other file has, naming this process as its owner."""
    return f"{PREFIX}{owner.tag()}.{os.urandom(8).hex()}"


def claim(directory: Path | str, dir_fd: int, name: str) -> int | None:
    """A descriptor (open for writing) of an empty file made ahead in ``directory`` (open as
    ``dir_fd``), renamed to ``name``: what was there is replaced, never followed. None when
    none is ready; one more is made for next time either way."""
    spare = _ahead.take(os.fspath(directory))
    if spare is None:
        return None
    try:
        fd = os.open(
            spare, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_size or found.st_nlink != 1:
            raise OSError(f"{spare} is not the empty file coder made")
        os.rename(spare, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(spare, dir_fd=dir_fd)
        return None
    return fd


def sweep(dir_fd: int) -> None:
    """Remove the files made ahead (or temporary files named by `fresh_name`) that coders that
    are gone left in the directory open as ``dir_fd``."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX) and owner.gone(name[len(PREFIX) :].partition(".")[0]):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)


def make_wanted(meanwhile: Callable[[], bool]) -> None:
    """Make the files asked for since the last time (see the module docstring) while
    ``meanwhile()`` holds (a command still runs): the rest wait for the next time."""
    _ahead.make(meanwhile)


class _Ahead:
    """The files made ahead, by directory, and the directories that asked for one more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: dict[str, list[str]] = {}
        self.wanted: list[str] = []
        self.swept: set[str] = set()
        self.pid = os.getpid()

    def take(self, directory: str) -> str | None:
        """The name of a file made ahead in ``directory``, or None; asks for one more, but
        the first time."""
        with self.lock:
            if self.pid != os.getpid():  # forked: the files made ahead are the parent's
                self.ready, self.wanted, self.pid = {}, [], os.getpid()
            found = self.ready.get(directory)
            if found is None:
                self.ready[directory] = []
                return None
            self.wanted.append(directory)
            return found.pop() if found else None

    def make(self, meanwhile: Callable[[], bool]) -> None:
        with self.lock:
            wanted, self.wanted = self.wanted, []
        for done, directory in enumerate(wanted):
            if not meanwhile():
                with self.lock:
                    self.wanted[:0] = wanted[done:]
                return
            name = fresh_name()
            try:
                with nofollow.open_dir(directory) as fd:
                    if directory not in self.swept:
                        self.swept.add(directory)
                        sweep(fd)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    os.close(os.open(name, flags, 0o600, dir_fd=fd))
            except OSError:
                continue  # the directory is gone, or a link is in the way: none made there
            with self.lock:
                self.ready.setdefault(directory, []).append(name)

    def close(self) -> None:
        """Remove what was made ahead and not taken."""
        with self.lock:
            made, self.ready, self.wanted = self.ready, {}, []
        if self.pid != os.getpid():
            return
        for directory, names in made.items():
            if names:
                with contextlib.suppress(OSError), nofollow.open_dir(directory) as fd:
                    for name in names:
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=fd)


_ahead = _Ahead()
atexit.register(_ahead.close)
