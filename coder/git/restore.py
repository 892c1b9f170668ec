"""Putting a worktree back to a commit (``git reset --hard`` without moving a ref), and the
branch moves that bring its files along: the discard of a failed step, revert's reset.

A command may have planted links, forged files or re-aimed a submodule in the worktree, and
coder runs outside the sandbox: so the restore runs confined like the commands (docs/safety.md,
"Safety": coder's own writes stay inside too).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pygit2
from pygit2.enums import CheckoutStrategy

from coder.git.branches import (
    branch_ref,
    check_detached_head,
    check_tip,
    move_branch_ref,
    resolve_commit,
    run_branch_ref,
)
from coder.git.objects import commit_of
from coder.git.repository import Repo, git_failure, open_worktree, retry_on_index_lock
from coder.git.submodules import reset_submodules
from coder.git.workdir import remove_untracked
from coder.policy.confine import confined


def restore_files(w: Repo, worktree: Path, commit: str, doing: str) -> None:
    """Index and files of ``w`` back to ``commit``, untracked files removed, submodules at
    their recorded commits: ``git reset --hard`` without moving any ref.

    A command may have planted links and forged files here, so this runs confined like the
    commands (``confine.confined``): a write it is tricked into aiming outside the worktree
    fails instead of landing. And it avoids being tricked in the first place: links that
    stand where the commit has directories go before the checkout, submodules are reset in
    their own directory whatever their config says."""
    tree = commit_of(w, commit, f"to {doing}").tree

    def restore() -> None:
        _remove_planted_links(Path(worktree), tree)
        w.checkout_tree(tree, strategy=CheckoutStrategy.FORCE)  # type: ignore[no-untyped-call]
        index = w.index
        index.read_tree(tree)
        index.write()
        w.state_cleanup()  # a merge or cherry-pick a command left half-done
        remove_untracked(w, worktree)
        reset_submodules(w, worktree)

    try:
        confined(worktree, lambda: retry_on_index_lock(worktree, restore))
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, doing, worktree) from None


def _remove_planted_links(root: Path, tree: pygit2.Tree) -> None:
    """Remove a symlink (or file) that stands where ``tree`` has a directory (or a submodule),
    so that the checkout creates the directory instead of writing its files through the
    link, as git does (and instead of failing on a link to what the confined checkout does
    not see). Only the link itself goes, never what it points at."""
    submodule = pygit2.enums.FileMode.COMMIT

    def walk(tree: pygit2.Tree, rel: str) -> None:
        for entry in tree:
            if not isinstance(entry, pygit2.Tree) and entry.filemode != submodule:
                continue
            path = f"{rel}{entry.name}"
            try:
                mode = os.lstat(root / path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not stat.S_ISDIR(mode):
                os.unlink(root / path)
            elif isinstance(entry, pygit2.Tree):
                walk(entry, f"{path}/")

    walk(tree, "")


def discard_changes(worktree: Path, to_commit: str) -> None:
    """Throw away uncommitted/partial edits: files and index back to ``to_commit``, untracked
    non-ignored files removed. The branch (or a scratch worktree's detached HEAD) must already
    point at ``to_commit`` (else ``BranchMoved``): this never moves a branch, so no commit can
    be lost by it."""
    worktree = Path(worktree)
    w = open_worktree(worktree)
    if w.head_is_detached:  # a scratch worktree: its HEAD must already be there
        check_detached_head(w, to_commit, worktree)
    else:
        check_tip(w, branch_ref(w, worktree), to_commit, worktree)
    restore_files(w, worktree, to_commit, "discard changes")


def reset_branch(worktree: Path, to_commit: str, *, branch: str, expected_tip: str) -> None:
    """Move ``branch``, checked out in the worktree, to ``to_commit`` and make the files match
    (revert by reset).

    The ref is locked and its old value checked inside a ref transaction, so a concurrent
    commit to the branch makes this fail with ``BranchMoved`` instead of being dropped.
    The ref moves first, then the files: if the files step fails (crash, disk), the branch is
    already at ``to_commit`` and ``discard_changes(worktree, to_commit)`` finishes the job.
    """
    worktree = Path(worktree)
    w = open_worktree(worktree)
    refname = run_branch_ref(w, worktree, branch)
    target = w[resolve_commit(w, to_commit)].id
    try:
        move_branch_ref(w, refname, target, expected_tip, worktree, "reset to")
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, f"reset branch to {str(target)[:12]}", worktree) from None
    # HEAD now names to_commit; index and files follow (removing files only the old tip
    # tracked), then leftovers that became untracked go too.
    restore_files(w, worktree, str(target), f"reset branch to {str(target)[:12]}")
