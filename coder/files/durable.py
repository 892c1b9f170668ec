"""The one durable write: nothing else in coder writes a file that must survive a crash.

Temp file in the same directory, write, fsync, `os.replace`, fsync the directory: a crash at any
instant leaves either the old or the new content, never half of either. Each write works in a
descriptor of its directory, reached as coder.files.nofollow reaches it: under `.coder/`, never
through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from coder.crashpoints import crashpoint
from coder.errors import EnvironmentProblem, LinkInTheWay, display_path
from coder.files import ahead, nofollow


def write_atomic(
    path: Path, data: bytes, *, new_mode: int = 0o600, crash_point: str | None = "checkpoint"
) -> None:
    """Replace `path` with `data` so that a crash at any instant leaves either the old or the
    new content: temp file in the same directory, write, fsync, `os.replace`, fsync the
    directory. On any failure the temp file is removed and the old file is untouched. Under
    `.coder/` the directory is reached without following a link (coder.files.nofollow.at); a link
    at `path` is replaced, never written through.

    A new file gets `new_mode` (private by default: coder's state; the file tools pass 0644
    for the user's files); an existing file keeps its mode. `crash_point` names the test-only
    crash hook between the write and the rename."""
    with nofollow.at(path) as (dir_fd, name):
        fd, tmp = _create_temp(dir_fd, name)
        try:
            try:
                try:
                    old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    os.fchmod(fd, old.st_mode & 0o7777 if stat.S_ISREG(old.st_mode) else new_mode)
                except FileNotFoundError:
                    os.fchmod(fd, new_mode)
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if crash_point:
                crashpoint(crash_point)  # test-only: the crash tests kill coder here
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        _fsync(dir_fd)


def _create_temp(dir_fd: int, name: str) -> tuple[int, str]:
    """A new private file `.NAME.XXXXXXXX.tmp` in the directory open as `dir_fd`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = f".{name}.{os.urandom(4).hex()}.tmp"
        with contextlib.suppress(FileExistsError):
            return os.open(tmp, flags, 0o600, dir_fd=dir_fd), tmp


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (reached as `nofollow.open_dir` reaches it)."""
    with nofollow.open_dir(directory) as fd:
        _fsync(fd)


def _fsync(dir_fd: int) -> None:
    """Some filesystems cannot fsync a directory (EINVAL)."""
    try:
        os.fsync(dir_fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def write_private(path: Path, text: str) -> None:
    """Write an artifact or log under `.coder/` readable by its owner only (0600), its
    directories created 0700 when missing. Not crash-safe, nor synced: for what `write_atomic`
    does not need to protect (logs, diffs, transcripts). What was at `path` is replaced, never
    written through (a link there is removed, not followed; a link above it under `.coder/`
    stops the write), and a new file is written (an existing one truncated and rewritten would
    make ext4 flush it on close, 1 ms). A file system that refuses (full, read-only) is an
    EnvironmentProblem: a run stops as `error`, not as a failed step."""
    path = Path(path)
    try:
        fd = create_private(path)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            _write_all(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_failed(path, exc) from exc


def create_private(path: Path) -> int:
    """A descriptor of a new, empty file at `path` readable by its owner only, made in place
    of what was there (a link is removed, not followed), its directories made 0700 when
    missing (under `.coder/`: none of them a link)."""
    try:
        return _create_private(path)
    except FileNotFoundError:  # its directory is missing (the first write, or deleted)
        make_private_dirs(path.parent)
        return _create_private(path)


def _create_private(path: Path) -> int:
    with nofollow.at(path) as (dir_fd, name):
        fd = ahead.claim(path.parent, dir_fd, name)  # a rename, not a new file (ahead.py)
        if fd is not None:
            return fd
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=dir_fd)


def make_private_dirs(path: Path) -> None:
    """`path` and each missing directory above it, made 0700 (`Path.mkdir(parents=True)` gives
    the parents the umask's mode: a `.coder/` deleted during a run came back 0755); under
    `.coder/` without following a link (coder.files.nofollow.make_dirs)."""
    path = Path(path)
    if nofollow.anchor(path)[1]:
        nofollow.make_dirs(path)
        return
    if path.is_dir():  # the common case: one stat, not one per parent
        return
    for directory in [*reversed(path.parents), path]:
        if not directory.is_dir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)


def write_failed(path: Path, exc: OSError) -> EnvironmentProblem:
    """coder could not write one of its files under `.coder/` (a full disk, most often; a
    link in the way, which it does not follow)."""
    if isinstance(exc, LinkInTheWay):
        return exc.problem()
    return EnvironmentProblem(
        f"cannot write {display_path(path)}: {exc.strerror or exc}",
        hint="free some disk space (or fix the file system), then run the command again "
        "(`coder resume -t ID` continues a run)",
    )
