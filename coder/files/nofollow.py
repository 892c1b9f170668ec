"""Writes and removals under a root that never follow a link.

A tree a command has touched is hostile: any directory in it may have become a symlink to
`$HOME` or to the user's checkout, and a path like `root/src/a.py` would then write there.
These functions walk a relative path one component at a time from a descriptor of `root`
(`openat` with `O_NOFOLLOW | O_DIRECTORY`), so a link anywhere on the way stops the walk
with `LinkInTheWay` instead of being followed, whatever happens between a check and the
write (the kernel resolves each step against the directory already open). `root` itself is
coder's own path (a worktree under `.coder/`, the user's checkout) and is opened as given.

git does the same for its checkouts (`has_symlink_leading_path`).

`.coder/` is coder's own too, but a repository can ship a link there (committed as `.coder`,
or as `.coder/cache/repomap`), and a command can plant one. So a path with a `.coder`
component is never opened as given: the walk starts at the directory holding its first
`.coder` and opens `.coder` and each name under it without following a link (`anchor`). Every
read, write, rename and delete coder makes under `.coder/` goes through the functions below
(`at`, `open_file`, `read_bytes`, `listdir`, `unlink`, `remove_tree`), `coder.files.durable`'s
writes included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from coder.crashpoints import armed, crashpoint
from coder.errors import LinkInTheWay, NotRegular
from coder.files.safeio import file_kind

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CODER_DIR = ".coder"  # where coder keeps its state (coder.project), walked from its parent


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


def anchor(path: Path | str) -> tuple[str, str]:
    """Where a walk to directory `path` starts (opened as given) and what it walks from there
    (each name opened without following a link): for a path under `.coder/`, the directory
    holding its first `.coder` and `.coder/...`; for any other path, `path` itself and ""."""
    text = os.fspath(path)
    parts = text.split(os.sep)  # str ops: Path.parts costs more than the walk's openat calls
    if CODER_DIR not in parts:
        return text, ""
    i = parts.index(CODER_DIR)
    start = os.sep.join(parts[:i]) or (os.sep if text.startswith(os.sep) else ".")
    return start, "/".join(part for part in parts[i:] if part)


def _walk(fd: int, rel: str, root: Path | str, create: bool, mode: int) -> int:
    """The descriptor of `rel` under the directory open as `fd` (which it takes over), each
    name opened without following a link; missing names made with `mode` if `create`."""
    done: list[str] = []
    try:
        for name in _parts(rel) if rel not in ("", ".") else []:
            done.append(name)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
            inner = _open_dir_at(fd, name, root, "/".join(done))
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_dir(
    root: Path | str, rel_dir: str = "", *, create: bool = False, mode: int = 0o777
) -> Iterator[int]:
    """A descriptor of directory `root/rel_dir`, reached without following a link (made, with
    its parents, if `create`: with `mode`, less the umask). `root` is opened as given, but for
    what of it lies under `.coder/` (`anchor`). Closed when the block ends."""
    start, below = anchor(root)
    fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = _walk(fd, below, start, False, mode)
    fd = _walk(fd, rel_dir, root, create, mode)
    try:
        yield fd
    finally:
        os.close(fd)


# --- paths under `.coder/`, each reached from its anchor ------------------------------------


def _split(path: Path | str) -> tuple[str, str, str]:
    """`path` as (where its walk starts, the directories it walks, its last name)."""
    head, name = os.path.split(os.path.abspath(path))
    return (*anchor(head), name)


@contextlib.contextmanager
def at(path: Path | str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """A descriptor of the directory holding `path`, reached as `open_dir` reaches it, and
    the last name of `path` (for the `dir_fd` calls). With `create`, the missing directories
    under `.coder/` are made 0700 (coder's own: its logs hold what commands printed)."""
    start, below, name = _split(path)
    with open_dir(start, below, create=create and bool(below), mode=0o700) as fd:
        yield fd, name


def make_dirs(path: Path | str) -> None:
    """Directory `path` under `.coder/`, with each missing one above it up to `.coder`, made
    0700 without following a link (LinkInTheWay where one is in the way)."""
    start, below = anchor(os.path.abspath(path))
    with open_dir(start, below, create=True, mode=0o700):
        pass


def open_file(path: Path | str, flags: int, mode: int = 0o600, *, create: bool = False) -> int:
    """`os.open(path, flags, mode)` with the walk of `at` (`create`: its directories made),
    never through a link at `path` itself (O_NOFOLLOW: LinkInTheWay)."""
    with at(path, create=create) as (fd, name):
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
    start, below, name = _split(path)
    raise LinkInTheWay(start, f"{below}/{name}" if below else name)


def read_bytes(path: Path | str) -> bytes:
    """The bytes of the regular file at `path`, reached as `open_file` reaches it (a FIFO or a
    device there is NotRegular, never waited on)."""
    fd = open_file(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as file:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise NotRegular(path, file_kind(kind))
        return file.read()


def listdir(path: Path | str) -> list[str]:
    """The names in directory `path`, reached as `open_dir` reaches it."""
    with open_dir(path) as fd:
        return os.listdir(fd)


def lstat(path: Path | str) -> os.stat_result:
    """What is at `path` (a link there is a link), reached as `at` reaches it."""
    with at(path) as (fd, name):
        return os.stat(name, dir_fd=fd, follow_symlinks=False)


def unlink(path: Path | str, *, missing_ok: bool = True) -> None:
    """Remove the file (or link) at `path`, reached as `at` reaches it."""
    try:
        with at(path) as (fd, name):
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        if not missing_ok:
            raise


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
    try:
        with at(path) as (fd, name):
            _remove_at(fd, name)
    except FileNotFoundError:
        return


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
