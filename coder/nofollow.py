"""Writes and removals under a root that never follow a link.

A tree a command has touched is hostile: any directory in it may have become a symlink to
`$HOME` or to the user's checkout, and a path like `root/src/a.py` would then write there.
These functions walk a relative path one component at a time from a descriptor of `root`
(`openat` with `O_NOFOLLOW | O_DIRECTORY`), so a link anywhere on the way stops the walk
with `LinkInTheWay` instead of being followed, whatever happens between a check and the
write (the kernel resolves each step against the directory already open). `root` itself is
coder's own path (a worktree under `.coder/`, the user's checkout) and is opened as given.

git does the same for its checkouts (`has_symlink_leading_path`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from coder.crashpoints import armed, crashpoint
from coder.errors import LinkInTheWay

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"not a relative path inside its root: {rel!r}")
    return parts


def _open_dir_at(fd: int, name: str, root: Path | str, rel: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LinkInTheWay(root, rel) from None
        raise


@contextlib.contextmanager
def open_dir(root: Path | str, rel_dir: str = "", *, create: bool = False) -> Iterator[int]:
    """A descriptor of directory `root/rel_dir`, reached without following a link (made, with
    its parents, if `create`). Closed when the block ends."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        done: list[str] = []
        for name in _parts(rel_dir) if rel_dir not in ("", ".") else []:
            done.append(name)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            inner = _open_dir_at(fd, name, root, "/".join(done))
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def leading_link(root: Path | str, rel: str) -> str | None:
    """The first leading component of `rel` (not `rel` itself) that exists under `root` as
    something other than a directory (a symlink, a file), or None."""
    parts = _parts(rel)
    path = Path(root)
    for i, name in enumerate(parts[:-1]):
        path = path / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(mode):
            return "/".join(parts[: i + 1])
    return None


def write_file(
    root: Path | str,
    rel: str,
    data: bytes,
    *,
    mode: int = 0o666,
    exact_mode: bool = False,
    link: bytes | None = None,
    new_only: bool = False,
    crash_point: str | None = None,
) -> None:
    """Replace `root/rel` with a file holding `data` (created with `mode`, less the umask
    unless `exact_mode`), or with a symlink to `link`: written to a temporary name in the same
    directory, then renamed over the old entry (a link there is replaced, never written
    through), or with `new_only` linked to the name (FileExistsError if anything is there).
    Missing parent directories are made. The temporary name carries no PID, so a write killed
    half-way leaves a file the next write of the same path replaces (`.NAME.coder-tmp`).
    `crash_point` names the test-only crash hook, with half of `data` in the temp file."""
    parts = _parts(rel)
    parent, name = "/".join(parts[:-1]), parts[-1]
    tmp = f".{name}.coder-tmp"
    with open_dir(root, parent, create=True) as fd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        try:
            if link is not None:
                os.symlink(link, tmp, dir_fd=fd)
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                out = os.open(tmp, flags, mode, dir_fd=fd)
                try:
                    if exact_mode:
                        os.fchmod(out, mode)
                    view = memoryview(data)
                    if crash_point and armed(crash_point):  # test-only: killed half-way
                        half = len(data) // 2
                        while len(view) > half:
                            view = view[os.write(out, view[: len(view) - half]) :]
                        crashpoint(crash_point)
                    while view:
                        view = view[os.write(out, view) :]
                finally:
                    os.close(out)
            if new_only:  # atomic, and fails if the name appeared meanwhile
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=fd)
            else:
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:  # a full disk: no half-written temp file left behind
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise


def temp_name(rel: str) -> str:
    """The temporary name `write_file` uses for `rel` (for sweeping after a kill)."""
    parts = _parts(rel)
    return "/".join([*parts[:-1], f".{parts[-1]}.coder-tmp"])


def remove(root: Path | str, rel: str, *, prune: bool = True) -> None:
    """Remove `root/rel` (a file or link; a directory with everything in it), reached without
    following a link; missing is fine. With `prune`, parent directories left empty go too
    (never `root`)."""
    parts = _parts(rel)
    parent = "/".join(parts[:-1])
    try:
        with open_dir(root, parent) as fd:
            _remove_at(fd, parts[-1])
    except FileNotFoundError:
        return
    if prune:
        while parts[:-1]:
            parts = parts[:-1]
            try:
                with open_dir(root, "/".join(parts[:-1])) as fd:
                    os.rmdir(parts[-1], dir_fd=fd)
            except OSError:  # not empty, gone, or a link: stop there
                return


def remove_tree(path: Path | str) -> None:
    """Delete `path` and everything under it, never following a link (a link is removed, not
    what it names). Directories a command made unwritable are made writable first, through
    their descriptor. Missing is fine."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _remove_at(fd, name)
    finally:
        os.close(fd)


def _remove_at(dir_fd: int, name: str) -> None:
    """Remove entry `name` of the directory open as `dir_fd`; a directory depth-first, with an
    explicit stack (a command can nest directories deeper than Python recurses)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    # One frame per open directory: its name, its descriptor, the entries still to remove.
    stack: list[tuple[str, int, list[str]]] = []
    try:
        stack.append(_enter(dir_fd, name, st))
        while stack:
            current, fd, entries = stack[-1]
            if not entries:
                stack.pop()
                os.close(fd)
                os.rmdir(current, dir_fd=stack[-1][1] if stack else dir_fd)
                continue
            entry = entries.pop()
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(_enter(fd, entry, st))
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        for _name, fd, _entries in stack:
            os.close(fd)


def _enter(parent_fd: int, name: str, st: os.stat_result) -> tuple[str, int, list[str]]:
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    if st.st_mode & 0o700 != 0o700:  # `chmod a-w` by a command: its entries would stay
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
    return name, fd, os.listdir(fd)
