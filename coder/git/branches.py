"""Branches and refs: reading them, and moving them by compare-and-swap.

Every ref move checks the old value under the ref's lock (``move_branch_ref``, or a commit
created *through* the ref with the expected tip as first parent): a branch someone else moved
fails with ``BranchMoved``, and nobody's commit is ever overwritten.
"""

from __future__ import annotations

from pathlib import Path

import pygit2
from pygit2.enums import ReferenceType

from coder.errors import BranchMoved, EnvironmentProblem, InvalidInput
from coder.git import objects
from coder.git.repository import (
    Repo,
    admin_text,
    common_dir,
    git_failure,
    open_worktree,
    repo_root,
    retry_on_ref_lock,
)


def current_branch(repo: Repo) -> str:
    """Short name of the checked-out branch; detached or unborn HEAD is an error."""
    where = repo.workdir or repo.path
    if repo.head_is_unborn:
        target = repo.lookup_reference("HEAD").target
        name = str(target).removeprefix("refs/heads/")
        raise EnvironmentProblem(
            f"branch '{name}' in {where} has no commits yet",
            hint="commit something first (`git commit --allow-empty -m init`)",
        )
    if repo.head_is_detached:
        raise EnvironmentProblem(
            f"HEAD is detached at {str(repo.head.target)[:12]} in {where}",
            hint="check out a branch first (`git switch BRANCH`)",
        )
    return str(repo.head.shorthand)


def branch_tip(repo: Repo, branch: str) -> str | None:
    """Hex id the branch points at, or None if it does not exist."""
    try:
        ref = repo.references.get(f"refs/heads/{branch}")
    except (pygit2.GitError, ValueError):
        return None
    return None if ref is None else str(ref.resolve().target)


def resolve_commit(repo: Repo, rev: str) -> str:
    """Hex id of the commit ``rev`` names (branch, tag, sha, ``HEAD~2``...)."""
    try:
        return str(repo.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError):
        raise InvalidInput(
            f"unknown revision '{rev}' in {repo.workdir or repo.path}",
            hint=f"check it with `git rev-parse --verify '{rev}^{{commit}}'`",
        ) from None


def point_branch(repo: Repo, branch: str, commit: str) -> None:
    """Create local `branch` at `commit`, or move it there (a branch coder alone writes, such
    as a candidate's kept try: coder.run.candidates)."""
    target = repo[resolve_commit(repo, commit)].peel(pygit2.Commit)
    retry_on_ref_lock(lambda: repo.branches.local.create(branch, target, force=True))


def delete_branch(repo: Repo, branch: str) -> None:
    """Delete a local branch; a missing one is fine (idempotent)."""
    ref = repo.branches.local.get(branch)
    if ref is None:
        return
    where = checked_out_at(repo, ref.name)
    if where is not None:
        raise EnvironmentProblem(
            f"cannot delete branch '{branch}': it is checked out in {where}",
            hint="remove that worktree or switch it to another branch first",
        )
    retry_on_ref_lock(ref.delete)


def head_of(gitdir: Path) -> str | None:
    """Symbolic target of a HEAD file (``refs/heads/x``), None if detached/unreadable."""
    try:
        text = admin_text(gitdir / "HEAD")
    except OSError:
        return None
    return text[len("ref: ") :] if text.startswith("ref: ") else None


def registered_branch(repo: Repo, name: str) -> str | None:
    """The branch the worktree registered as ``name`` has checked out (its directory may be
    gone), or None."""
    head = head_of(common_dir(repo) / "worktrees" / name)
    return head.removeprefix("refs/heads/") if head and head.startswith("refs/heads/") else None


def checked_out_at(repo: Repo, refname: str) -> Path | None:
    """Where ``refname`` is checked out (main checkout or a linked worktree), else None.

    Read from the HEAD files directly so the answer names the directory to fix.
    """
    common = common_dir(repo)
    if head_of(common) == refname:
        return repo_root(repo)
    admin_root = common / "worktrees"
    if admin_root.is_dir():
        for admin in sorted(admin_root.iterdir()):
            if head_of(admin) == refname:
                try:  # gitdir holds "<worktree>/.git"
                    return Path(admin_text(admin / "gitdir")).parent
                except OSError:
                    return admin
    return None


def branch_ref(w: Repo, worktree: Path) -> str:
    """The branch the worktree's HEAD names (resolved): for reading only. What coder moves
    is named by the run, never by HEAD: ``run_branch_ref``."""
    if w.head_is_detached or w.head_is_unborn:
        raise EnvironmentProblem(
            f"worktree {worktree} is not on a branch (detached or unborn HEAD)",
            hint="`coder clean` the task and run it again, or check the branch out there",
        )
    return str(w.head.name)


def run_branch_ref(w: Repo, worktree: Path, branch: str) -> str:
    """``refs/heads/BRANCH``, the run's branch, by name: the ref a step commit, a landing or a
    revert moves. The worktree's HEAD is never followed to find it: a process that pointed
    HEAD at ``main`` (or made the branch a symbolic ref to it) would make the commit land
    there, and at a run's first step ``main``'s tip is the expected one, so no
    compare-and-swap would notice. Such a worktree is an EnvironmentProblem: nothing moves
    (and ``check_tip`` refuses a branch made a symbolic ref)."""
    refname = f"refs/heads/{branch}"
    head = w.lookup_reference("HEAD")
    named = head.target if head.type == ReferenceType.SYMBOLIC else None
    if named != refname:
        now = f"names {named}" if named else f"is detached at {str(head.target)[:12]}"
        raise EnvironmentProblem(
            f"the HEAD of worktree {worktree} {now}, not the run's branch {branch} (a process "
            "or a hand pointed it elsewhere); nothing was committed",
            hint=f"`coder resume` points it back at {branch} and runs the step again",
        )
    return refname


def check_tip(w: Repo, refname: str, expected: str, worktree: Path) -> None:
    ref = w.references.get(refname)
    if ref is not None and ref.type == ReferenceType.SYMBOLIC:  # a move would follow it
        branch = refname.removeprefix("refs/heads/")
        raise BranchMoved(
            f"branch '{branch}' was made a symbolic ref to {ref.target} (worktree {worktree})",
            hint=f"point it back at its last commit (`git reflog {branch}`) with "
            f"`git update-ref --no-deref {refname} COMMIT`, or `coder clean` the task",
        )
    actual = None if ref is None else str(ref.target)
    if actual != expected:
        raise moved(refname, expected, actual, worktree)


def check_detached_head(w: Repo, expected: str, worktree: Path) -> None:
    actual = str(w.head.target)
    if actual != expected:
        raise BranchMoved(
            f"HEAD of scratch worktree {worktree} moved: expected {expected[:12]}, "
            f"now at {actual[:12]}",
            hint="remove the scratch worktree and run the step again",
        )


def moved(refname: str, expected: str, actual: str | None, worktree: Path) -> BranchMoved:
    branch = refname.removeprefix("refs/heads/")
    now = f"now at {actual[:12]}" if actual else "deleted"
    return BranchMoved(
        f"branch '{branch}' moved under us: expected {expected[:12]}, {now} (worktree {worktree})",
        hint=f"someone committed to or reset '{branch}'; inspect it with "
        f"`git log {branch}` and move it back or `coder clean` the task",
    )


def move_branch_ref(
    w: Repo, refname: str, target: pygit2.Oid, expected: str, worktree: Path, why: str
) -> None:
    """Point ``refname`` at ``target`` if it still points at ``expected`` (lock, check, set;
    a lock another git process holds for a moment is waited for); what holds ``target`` from
    git's prune is released then (coder.git.objects)."""

    def move() -> None:
        with w.transaction() as tx:
            tx.lock_ref(refname)
            check_tip(w, refname, expected, worktree)
            tx.set_target(refname, target, message=f"coder: {why} {str(target)[:12]}")

    retry_on_ref_lock(move)
    objects.release(w, target)


def move_detached_head(w: Repo, target: pygit2.Oid, expected: str, worktree: Path) -> None:
    """``move_branch_ref`` for the detached HEAD of a scratch worktree."""

    def move() -> None:
        with w.transaction() as tx:
            tx.lock_ref("HEAD")
            check_detached_head(w, expected, worktree)
            tx.set_target("HEAD", target, message=f"coder: step {str(target)[:12]}")

    retry_on_ref_lock(move)
    objects.release(w, target)


def move_branch(
    worktree: Path, target: str, *, branch: str, expected_tip: str, message: str
) -> None:
    """Point ``branch``, checked out in the worktree, at ``target`` if it still points at
    ``expected_tip`` (lock, check, set; ``message`` goes to the reflog, where the old tip
    stays). The files are left as they are: ``discard_changes(worktree, target)`` brings them
    along afterwards."""
    worktree = Path(worktree)
    w = open_worktree(worktree)
    refname = run_branch_ref(w, worktree, branch)

    def move() -> None:
        with w.transaction() as tx:
            tx.lock_ref(refname)
            check_tip(w, refname, expected_tip, worktree)
            tx.set_target(refname, pygit2.Oid(hex=target), message=message)

    try:
        retry_on_ref_lock(move)
    except pygit2.GitError as exc:
        raise git_failure(exc, f"move the branch to {target[:12]}", worktree) from None
    objects.release(w, target)


def head_commit(repo: Repo) -> str | None:
    """The commit HEAD is at, None on an unborn branch."""
    return None if repo.head_is_unborn else str(repo.head.target)


def local_branches(repo: Repo) -> frozenset[str]:
    """The names of the local branches."""
    return frozenset(repo.branches.local)
