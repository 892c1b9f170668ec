"""The one durable write: nothing else in coder writes a file that must survive a crash.

Temp file in the same directory, write, fsync, `os.replace`, fsync the directory: a crash at any
instant leaves either the old or the new content, never half of either.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from coder.crashpoints import crashpoint
from coder.errors import EnvironmentProblem, display_path


def write_atomic(
    path: Path, data: bytes, *, new_mode: int = 0o600, crash_point: str | None = "checkpoint"
) -> None:
    """Replace `path` with `data` so that a crash at any instant leaves either the old or the
    new content: temp file in the same directory, write, fsync, `os.replace`, fsync the
    directory. On any failure the temp file is removed and the old file is untouched.

    A new file gets `new_mode` (private by default: coder's state; the file tools pass 0644
    for the user's files); an existing file keeps its mode. `crash_point` names the test-only
    crash hook between the write and the rename."""
    path = Path(path)
    directory = path.parent
    import tempfile  # here: it costs a 10th of `coder status`, which writes nothing

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            try:
                os.fchmod(fd, os.stat(path).st_mode & 0o7777)
            except FileNotFoundError:
                os.fchmod(fd, new_mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if crash_point:
            crashpoint(crash_point)  # test-only: the crash tests kill coder here
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: Path) -> None:
    """Make the rename itself durable. Some filesystems cannot fsync a directory (EINVAL)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Write an artifact or log under `.coder/` readable by its owner only (0600), its
    directories created 0700 when missing. Not crash-safe, nor synced: for what `write_atomic`
    does not need to protect (logs, diffs, transcripts). What was at `path` is replaced, never
    written through (a link there is removed, not followed), and a new file is written (an
    existing one truncated and rewritten would make ext4 flush it on close, 1 ms). A file
    system that refuses (full, read-only) is an EnvironmentProblem: a run stops as `error`,
    not as a failed step."""
    path = Path(path)
    try:
        try:
            fd = _create_private(path)
        except FileNotFoundError:  # its directory is missing (the first write, or deleted)
            make_private_dirs(path.parent)
            fd = _create_private(path)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            _write_all(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_failed(path, exc) from exc


def _create_private(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def make_private_dirs(path: Path) -> None:
    """`path` and each missing directory above it, made 0700 (`Path.mkdir(parents=True)` gives
    the parents the umask's mode: a `.coder/` deleted during a run came back 0755)."""
    path = Path(path)
    if path.is_dir():  # the common case: one stat, not one per parent
        return
    for directory in [*reversed(path.parents), path]:
        if not directory.is_dir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)


def write_failed(path: Path, exc: OSError) -> EnvironmentProblem:
    """coder could not write one of its files under `.coder/` (a full disk, most often)."""
    return EnvironmentProblem(
        f"cannot write {display_path(path)}: {exc.strerror or exc}",
        hint="free some disk space (or fix the file system), then run the command again "
        "(`coder resume -t ID` continues a run)",
    )
