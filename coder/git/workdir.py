"""A worktree's files against its HEAD: what changed (``.coder/`` and ignored files never
count), untracked files removed, and what the model's git tools read and apply there."""

from __future__ import annotations

from pathlib import Path

from pygit2.enums import DiffOption, FileStatus

from coder import nofollow
from coder.git.repository import Repo, open_worktree, under_coder_dir

WORKDIR_FLAGS = (
    DiffOption.INCLUDE_UNTRACKED
    | DiffOption.RECURSE_UNTRACKED_DIRS
    | DiffOption.SHOW_UNTRACKED_CONTENT
    | DiffOption.INCLUDE_TYPECHANGE
)


_WORKDIR_CHANGES = (
    FileStatus.WT_NEW
    | FileStatus.WT_MODIFIED
    | FileStatus.WT_DELETED
    | FileStatus.WT_TYPECHANGE
    | FileStatus.WT_RENAMED
)


def status(w: Repo) -> dict[str, int]:
    """Paths differing from HEAD (index or workdir), ignored files and ``.coder/`` left out.
    When HEAD's branch is gone (deleted by hand), the files are compared with the index,
    which still holds the last commit checked out there: against no commit at all, every
    file would read as a change."""
    mask = _WORKDIR_CHANGES if w.head_is_unborn else ~0
    return {
        p: flags & mask
        for p, flags in w.status(untracked_files="all", ignored=False).items()
        if flags & mask
        and flags != FileStatus.CURRENT
        and not (flags & FileStatus.IGNORED)
        and not under_coder_dir(p)
    }


def changed_paths(worktree: Path) -> list[str]:
    """Sorted relative posix paths that differ from HEAD: new, modified, deleted, renamed
    (both sides). Honours .gitignore/info/exclude; never anything under ``.coder/``."""
    return sorted(status(open_worktree(worktree, writing=False)))


def is_clean(worktree: Path) -> bool:
    """True if nothing differs from HEAD besides ignored files and ``.coder/``."""
    return not status(open_worktree(worktree, writing=False))


def remove_untracked(w: Repo, worktree: Path) -> None:
    """Delete untracked, non-ignored files (never ``.coder/``) and the dirs they leave empty
    (an untracked nested repository shows up as "dir/"); nothing is followed through a link."""
    root = worktree.resolve()
    for rel, flags in status(w).items():
        if flags == FileStatus.WT_NEW:
            nofollow.remove(root, rel.rstrip("/"))
