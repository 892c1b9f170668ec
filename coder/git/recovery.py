"""A run whose newest commits lost objects (pruned by a `git gc --prune=now` under a coder that
did not hold them from it yet, or deleted by hand): found, and its branch moved back to its
last complete commit, so that `coder resume` runs the steps after it again instead of failing
on a commit that is gone (coder.git.objects holds what coder writes now).

    first_incomplete(...)  the oldest of the run's commits that lacks an object
    last_complete(...)     where the branch goes back to: the newest value its reflog holds
                           that is the run's base or a complete commit of the run
    roll_back(...)         the move (compare-and-swap), and the reflog entries that name what
                           is gone dropped, so that `git fsck` finds the repository whole again
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pygit2

from coder.errors import EnvironmentProblem
from coder.git.branches import move_branch_ref
from coder.git.commits import TRAILER_TASK, parse_trailers
from coder.git.repository import Repo, common_dir, git_failure
from coder.git.staging import changes

_GITLINK = pygit2.enums.FileMode.COMMIT


def first_incomplete(repo: Repo, tip: str, base: str, task_id: str) -> str | None:
    """The oldest of run ``task_id``'s commits on ``base..tip`` (those carrying its
    ``Coder-Task`` trailer, following first parents from ``tip``) that lacks an object (itself,
    its tree, or a tree or blob it brings against its first parent), as hex; None when every
    one is complete. Read through a fresh repository: libgit2 answers from its cache for an
    object it read before it was deleted."""
    fresh = pygit2.Repository(str(common_dir(repo)))
    chain: list[pygit2.Commit] = []
    at = tip
    try:
        while at != base:
            commit = fresh[at].peel(pygit2.Commit)
            if parse_trailers(commit.message).get(TRAILER_TASK.lower()) != task_id:
                break  # not the run's: the run's check of foreign commits says so
            chain.append(commit)
            if not commit.parent_ids:
                break
            at = str(commit.parent_ids[0])
    except (KeyError, ValueError, pygit2.GitError):
        return at
    for commit in reversed(chain):
        try:
            parent = commit.parents[0].tree_id if commit.parent_ids else None
            found = changes(fresh, parent, commit.tree_id)
        except (EnvironmentProblem, KeyError, pygit2.GitError):
            return str(commit.id)
        blobs = (c.new[1] for c in found if c.new and c.new[0] != _GITLINK)
        if not all(fresh.odb.exists(b) for b in blobs):
            return str(commit.id)
    return None


def last_complete(repo: Repo, branch: str, tip: str, base: str, task_id: str) -> str:
    """Where run ``task_id``'s branch goes back to when ``first_incomplete`` finds a commit
    of it incomplete: the newest value the branch held (its reflog) that is ``base`` or a
    complete commit of the run descending from it; ``base`` when none is."""
    ref = repo.references.get(f"refs/heads/{branch}")
    held = [] if ref is None else [o for e in ref.log() for o in (e.oid_new, e.oid_old)]
    for oid in dict.fromkeys(str(o) for o in held):  # the newest first
        if oid == base:
            return base
        if oid == tip or repo.get(oid) is None:
            continue
        try:
            descends = bool(repo.descendant_of(oid, base))
        except (KeyError, pygit2.GitError):
            continue
        if descends and first_incomplete(repo, oid, base, task_id) is None:
            return oid
    return base


def roll_back(repo: Repo, branch: str, target: str, tip: str, worktree: Path) -> None:
    """Move ``branch`` from ``tip`` back to ``target`` (compare-and-swap), then drop from the
    reflogs of the branch and of its worktree's HEAD the entries that name commits whose
    objects are gone (`git reflog expire --stale-fix`, expiring nothing else)."""
    try:
        move_branch_ref(
            repo, f"refs/heads/{branch}", pygit2.Oid(hex=target), tip, worktree, "back to"
        )
    except pygit2.GitError as exc:
        raise git_failure(exc, f"move {branch} back", worktree) from None
    common = common_dir(repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    admin = common / "worktrees" / worktree.name
    for git_dir, ref in ((common, f"refs/heads/{branch}"), (admin, "HEAD")):
        if not (git_dir / "logs" / ref).is_file():
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # best effort: an entry
            subprocess.run(  # left behind only makes `git fsck` complain
                [
                    "git",
                    f"--git-dir={git_dir}",
                    "reflog",
                    "expire",
                    "--stale-fix",
                    "--expire=never",
                    "--expire-unreachable=never",
                    ref,
                ],
                env=env,
                capture_output=True,
                timeout=600,
                check=False,
            )
