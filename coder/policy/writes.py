"""What a confined command may write and see: its `Profile`. The worktree, and a linked
worktree's own admin directory (never the repository's shared refs, objects, hooks or config);
inside them, what stays read-only (the admin files git reads to know the worktree's branch and
repository, a main checkout's `.git` and `.coder`); besides the system, the toolchain of its
PATH and the config's `visible_paths`. coder.policy.confine builds the walls these name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from coder.files import safeio
from coder.files.realpath import realpath
from coder.policy import kernel, view


@dataclass(frozen=True)
class Profile:
    """What a confined command may write, and whether it may use the network."""

    writable: tuple[str, ...]  # real paths of directories
    network: bool = False
    # real paths inside `writable` kept read-only (bound over themselves; needs the mount wall)
    readonly: tuple[str, ...] = ()
    # paths shown read-only besides the system, in the view (coder.policy.view): the toolchain
    # the commands' PATH names and the config's `visible_paths`
    visible: tuple[str, ...] = ()


def writable_for(root: Path) -> tuple[str, ...]:
    """The directories a command in worktree `root` may write: the worktree and, for a linked
    worktree, its own admin directory (`.git/worktrees/<id>`: its index; not its HEAD and the
    other files of `admin_files`), never the repository's shared refs, objects, hooks or
    config.

    The worktree's `.git` file is writable, so it is not trusted alone: the admin directory
    it names must name this worktree back (its `gitdir` file, which git wrote and a command
    cannot), or a command could aim the next one's sandbox at another run's admin dir."""
    real = realpath(root)
    gitfile = os.path.join(real, ".git")

    def text(path: str) -> str:  # never blocking on a FIFO a command left, nor following
        return safeio.read_regular(path, limit=1 << 16, follow=False).decode(errors="replace")

    try:
        found = text(gitfile).strip()
        admin = realpath(os.path.join(real, found.removeprefix("gitdir:").strip()))
        back = text(os.path.join(admin, "gitdir")).strip()
    except OSError:  # a main checkout (.git is a directory), or no git at all
        return (real,)
    if found.startswith("gitdir:") and realpath(os.path.join(admin, back)) == gitfile:
        return (real, admin)
    return (real,)


def profile_for(
    root: Path, *, network: bool = False, path: str | None = None, visible: Iterable[str] = ()
) -> Profile:
    """The profile of the commands that run in worktree (or checkout) `root` with `path` as
    their PATH (coder's own by default): they see its toolchain (coder.policy.view) and
    `visible` (the config's `visible_paths`) besides the system."""
    writable = writable_for(root)
    readonly = kept_readonly(root) + admin_files(writable)
    toolchain = view.toolchain(os.environ.get("PATH", "") if path is None else path)
    shown = (*toolchain, *visible)
    return Profile(writable, network=network, readonly=readonly, visible=shown)


# What git reads in a linked worktree's admin dir to know the worktree's repository, branch
# and config: a HEAD pointed at main aims the step commit there, a commondir at another
# repository (whose config runs a `core.fsmonitor`) the user's next `git status`, a
# config.worktree's `core.worktree` coder's checkouts. Never written by a command.
_ADMIN_FILES = ("HEAD", "commondir", "gitdir", "config.worktree")


def admin_files(writable: tuple[str, ...]) -> tuple[str, ...]:
    """`_ADMIN_FILES` of the admin dir among `writable` (`writable_for`'s second path, a
    linked worktree's), kept read-only inside it: bound over themselves, where this machine
    has the read-only mount wall (elsewhere the git guard around each step puts them back).
    config.worktree, absent unless the repository uses it, is made empty first (an empty one
    sets nothing): a name that does not exist cannot be bound, and a command could create it.
    A name that is not a regular file (a link a command left) is not bound: never through a
    link; the git guard replaces it."""
    import stat

    if len(writable) < 2 or not kernel.support().mount_wall:
        return ()
    admin = writable[1]
    fd = os.open(admin, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open("config.worktree", flags, 0o644, dir_fd=fd))
        except OSError:  # there already; or not ours to make (then not a command's either)
            pass
        found = []
        for name in _ADMIN_FILES:
            try:
                if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    found.append(os.path.join(admin, name))
            except FileNotFoundError:
                continue
        return tuple(found)
    finally:
        os.close(fd)


def kept_readonly(root: Path) -> tuple[str, ...]:
    """What stays read-only to the commands of `root` inside it: a main checkout's `.git` and
    `.coder` (`coder mcp serve` runs commands in the user's checkout itself; a run's worktree
    has neither: its `.git` is a file, its repository is outside it). Only where this machine
    has the read-only mount wall that keeps them so; elsewhere the git guard around each call
    puts `.git` back (coder.mcp.walls)."""
    if not kernel.support().mount_wall:
        return ()
    real = realpath(root)
    inside = (os.path.join(real, name) for name in (".git", ".coder"))
    return tuple(p for p in inside if os.path.isdir(p) and not os.path.islink(p))
