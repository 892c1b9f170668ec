"""coder's worktrees: created, re-created after a crash, removed, pruned; and the scratch
worktrees in which independent steps of one DAG level run side by side (each with a detached
HEAD at the same tip; their commits are then replayed onto the agent branch)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

import pygit2

from coder.errors import EnvironmentProblem, InvalidInput, LinkInTheWay
from coder.files import nofollow
from coder.files.durable import fsync_dir, make_private_dirs
from coder.git import objects
from coder.git.branches import checked_out_at, delete_branch, head_of, resolve_commit
from coder.git.repository import Repo, admin_text, common_dir, open_worktree, repo_root
from coder.git.submodules import init_submodules


def create_worktree(repo: Repo, *, name: str, path: Path, branch: str, start: str) -> Path:
    """A worktree ``name`` at ``path`` on ``branch`` (created at ``start`` if missing).

    Re-creating works: if the branch exists it is checked out as it is (never moved), and a
    registration whose directory was deleted is pruned first. An existing healthy worktree
    with the same name, path and branch is returned unchanged.
    """
    path = Path(path).absolute()
    refname = f"refs/heads/{branch}"
    common = common_dir(repo)
    if pending_change(path) is not None:  # a checkout or removal cut short: start afresh
        remove_worktree(repo, name, path)
    _prune_stale(repo, common, name)

    if name in _registered_names(repo):
        wt = repo.lookup_worktree(name)
        same_place = Path(wt.path).resolve() == path.resolve()
        if same_place and head_of(common / "worktrees" / name) == refname:
            link_back(common, name, path)
            return path
        raise EnvironmentProblem(
            f"a worktree named '{name}' already exists at {wt.path}",
            hint=f"remove it with `git worktree remove {wt.path}` (or `coder clean`)",
        )
    what = _in_the_way(path)
    if what is not None:
        raise EnvironmentProblem(
            f"cannot create worktree at {path}: {what}",
            hint="move or delete it, then retry",
        )

    ref = repo.branches.local.get(branch)
    if ref is None:
        commit = repo[resolve_commit(repo, start)].peel(pygit2.Commit)
        try:
            ref = repo.branches.local.create(branch, commit)
        except (pygit2.GitError, ValueError) as exc:
            raise InvalidInput(f"cannot create branch '{branch}': {exc}") from None
        objects.release(repo, commit.id)  # a fork's copies, a checkout's snapshot: reached now
    else:
        where = checked_out_at(repo, refname)
        if where is not None:
            raise EnvironmentProblem(
                f"branch '{branch}' is already checked out in {where}",
                hint="a branch can be checked out in one worktree only: "
                "switch that checkout to another branch or remove that worktree",
            )

    # libgit2 writes the registration (<common>/worktrees/<name>) file by file, with no
    # `locked` file first as git does, and `git worktree prune` (which every `git gc` runs)
    # deletes a registration it finds without its `gitdir` file: a prune meanwhile takes
    # some or all of it. So the registration is checked whole after the add, and made again.
    for tries_left in reversed(range(ADD_TRIES)):
        creating = _make_room(path)
        problem = None
        try:
            repo.add_worktree(name, str(path), ref)
        except (pygit2.GitError, OSError) as exc:
            problem = str(exc)
        if problem is None and _registered_whole(common, name, path):
            break
        if not tries_left:
            # libgit2 creates <common>/worktrees/<name> before failing; don't leave it behind.
            _remove_half_registration(common, name)
            raise EnvironmentProblem(
                f"cannot create worktree '{name}' at {path}: "
                f"{problem or 'its registration in ' + str(common / 'worktrees') + ' went'}",
                hint="if `git gc` or `git worktree prune` runs in a loop, stop it and retry",
            )
        remove_worktree(repo, name, path)  # what the add made (the mark says it is coder's)
    init_submodules(repo, path, str(ref.target))
    nofollow.unlink(creating, missing_ok=False)  # complete: from now on its files are the branch's
    return path


ADD_TRIES = 5


def _make_room(path: Path) -> Path:
    """Make the directories on the way to ``path`` and mark it being created (the mark)."""
    try:
        # libgit2 goes by path: right before, each directory on the way under .coder/ is made
        # or checked to be a real one (LinkInTheWay), and the empty one there (checked by the
        # caller) goes, as libgit2 insists on creating it itself.
        make_private_dirs(path.parent)
        with nofollow.at(path) as (fd, leaf):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(leaf, dir_fd=fd)
        return _mark(path, CREATING)
    except LinkInTheWay as exc:
        raise exc.problem() from None


def _registered_whole(common: Path, name: str, path: Path) -> bool:
    """Whether the worktree at ``path`` and its registration hold every file an add writes
    (none followed through a link): nothing of them was pruned while they were made."""
    admin = common / "worktrees" / name
    try:
        return all(
            stat.S_ISREG(nofollow.lstat(file).st_mode)
            for file in (admin / "gitdir", admin / "commondir", admin / "HEAD", path / ".git")
        )
    except (FileNotFoundError, NotADirectoryError):
        return False


def dot_git_missing(path: Path) -> bool:
    """Whether the worktree directory at ``path`` is there but its `.git` file is not (deleted
    by hand or by a command, or something else put in its place): `link_back` writes it."""
    try:
        if not stat.S_ISDIR(nofollow.lstat(Path(path)).st_mode):
            return False
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        return not stat.S_ISREG(nofollow.lstat(Path(path) / ".git").st_mode)
    except FileNotFoundError:
        return True


def link_back(common: Path, name: str, path: Path) -> bool:
    """Write the `.git` file of coder's worktree ``name`` at ``path`` again (as `git worktree
    repair` does) when it is missing or is not a file: it names the admin dir, whose `gitdir`
    names it back. Whether it wrote. The worktree's files stay as they are."""
    if not dot_git_missing(path):
        return False
    admin = common / "worktrees" / name
    try:
        if stat.S_ISDIR(nofollow.lstat(path / ".git").st_mode):
            raise EnvironmentProblem(
                f"{path / '.git'} is a directory, not the file that names the worktree's git "
                "directory",
                hint="move it away, then resume (or remove the run with `coder clean`)",
            )
    except FileNotFoundError:
        pass
    nofollow.write_file(path, ".git", f"gitdir: {admin}\n".encode())
    nofollow.write_file(admin, "gitdir", f"{path / '.git'}\n".encode())
    return True


def _in_the_way(path: Path) -> str | None:
    """What at `path` keeps a worktree from being made there (a link is not followed)."""
    try:
        mode = nofollow.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return f"a symbolic link is there (to {os.readlink(path)})"
    if not stat.S_ISDIR(mode):
        return "a file is there"
    return "the directory exists and is not empty" if nofollow.listdir(path) else None


# A worktree being created or removed.
#
# A checkout of thousands of files takes seconds, their removal a moment: a kill in between
# leaves a half worktree whose missing or extra files would read as someone's uncommitted
# changes. So the worktree is marked first (`<path>.creating` or `<path>.removing`, next to it
# in `.coder/worktrees/`) and unmarked when done; whoever finds a mark finishes the job
# (`create_worktree` removes the half checkout and checks out again, `remove_worktree` removes
# what is left), and a marked worktree's files are never counted as changes.

CREATING = "creating"
REMOVING = "removing"


def _marker(path: Path, doing: str) -> Path:
    return path.with_name(f"{path.name}.{doing}")


def _mark(path: Path, doing: str) -> Path:
    """Mark ``path`` as being created or removed, durably, before the work starts."""
    marker = _marker(path, doing)
    os.close(nofollow.open_file(marker, os.O_WRONLY | os.O_CREAT, 0o600))
    fsync_dir(marker.parent)
    return marker


def pending_change(path: Path) -> str | None:
    """``REMOVING`` or ``CREATING`` when coder's removal or checkout of the worktree at
    ``path`` was cut short (by a kill), else None."""
    path = Path(path).absolute()
    for doing in (REMOVING, CREATING):
        try:
            nofollow.lstat(_marker(path, doing))
        except FileNotFoundError:
            continue
        return doing
    return None


def worktree_ready(path: Path) -> bool:
    """Whether ``path`` holds a complete worktree: checked out to the end, not half removed.
    Only then can its files differ from its branch by anyone's changes. Under `.coder/` it is
    reached without following a link (LinkInTheWay): commands would run wherever one leads."""
    try:
        checked_out = stat.S_ISREG(nofollow.lstat(Path(path) / ".git").st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return checked_out and pending_change(path) is None


def remove_worktree(repo: Repo, name: str, path: Path) -> None:
    """Delete the worktree coder made at ``path`` and its registration ``name`` (its admin
    dir, ``worktrees/<name>``: what `git worktree prune` deletes); missing parts are fine,
    and without a registration nothing is deleted.

    The directory deleted is ``path``, coder's own, never the one the registration's
    ``gitdir`` file names: that file is in the admin dir, which the worktree's commands can
    write. Nothing is followed through a link. A removal or checkout cut short by a kill
    (see ``pending_change``) is finished even where its registration is already gone."""
    common = common_dir(repo)
    root = repo_root(repo)
    real = Path(os.path.realpath(path))
    if real == root or real in root.parents or real == common or common in real.parents:
        raise EnvironmentProblem(f"refusing to delete {real}: it is not a linked worktree")
    admin = common / "worktrees" / name
    path = Path(path).absolute()
    if not os.path.lexists(admin) and pending_change(path) is None:
        return  # not coder's (any more): whatever is at `path` is someone else's
    removing = _mark(path, REMOVING) if path.parent.is_dir() else None
    nofollow.remove_tree(path)
    nofollow.remove_tree(admin)  # after the files: a removal cut short is still registered
    nofollow.unlink(_marker(path, CREATING))
    if removing is not None:
        nofollow.unlink(removing, missing_ok=False)


def point_head_back(repo: Repo, name: str, branch: str) -> str | None:
    """Point the HEAD of coder's worktree ``name`` back at ``branch`` when it names anything
    else (a process the run left pointed it at ``main``: ``commit_step`` refuses such a
    worktree). Returns what it named ("refs/heads/main", a commit id), None when it names
    ``branch``, or is missing or not a regular file (opening the worktree refuses that, with
    the way out). The admin dir is found from the repository, never from the worktree's `.git`
    file, and the new HEAD replaces the old one, never written through it."""
    admin = common_dir(repo) / "worktrees" / name
    wanted = f"ref: refs/heads/{branch}"
    try:
        named = admin_text(admin / "HEAD")
    except OSError:
        return None
    if named == wanted:
        return None
    nofollow.write_file(admin, "HEAD", f"{wanted}\n".encode())
    return named.removeprefix("ref: ")


def _prune_stale(repo: Repo, common: Path, name: str) -> None:
    _remove_half_registration(common, name)
    prune_stale_worktrees(repo)


def prune_stale_worktrees(repo: Repo) -> None:
    """Forget registrations whose directory is gone (as `git worktree prune` does; locked ones
    stay), so a deleted worktree neither blocks its name nor keeps its branch checked out
    (`git branch -D` refuses a branch checked out in a worktree, even a missing one)."""
    for other in _registered_names(repo):
        try:
            wt = repo.lookup_worktree(other)
        except (pygit2.GitError, OSError):
            continue  # pruned meanwhile (by `git gc`): what this was to do
        if not Path(wt.path).exists() and wt.is_prunable:
            wt.prune(True)


def _registered_names(repo: Repo) -> list[str]:
    """The worktrees' registrations; none when `worktrees/` went meanwhile (`git worktree
    prune` deletes it once empty, between libgit2's look for it and its read)."""
    try:
        return list(repo.list_worktrees())
    except OSError:
        if os.path.lexists(common_dir(repo) / "worktrees"):
            raise
        return []


def _remove_half_registration(common: Path, name: str) -> None:
    """A ``worktrees/<name>`` dir without a ``gitdir`` file is debris from a failed add."""
    admin = common / "worktrees" / name
    if admin.is_dir() and not (admin / "gitdir").exists():
        shutil.rmtree(admin, ignore_errors=True)


def add_scratch_worktree(repo: Repo, *, name: str, path: Path, commit: str) -> Path:
    """A throwaway worktree ``name`` at ``path`` with a detached HEAD at ``commit``.

    A leftover with the same name (from a crash) is removed first: scratch work is
    disposable. libgit2 can only add a worktree on a branch, so a temporary
    ``coder-scratch/<name>`` branch carries it and is deleted once HEAD is detached.
    """
    target = repo[resolve_commit(repo, commit)].id
    temp = f"coder-scratch/{name}"
    remove_worktree(repo, name, path)
    delete_branch(repo, temp)
    path = create_worktree(repo, name=name, path=path, branch=temp, start=str(target))
    open_worktree(path).set_head(target)
    delete_branch(repo, temp)
    return path
