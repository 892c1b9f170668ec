"""Removing a run (`coder clean`): its worktrees, state, artifacts and logs, and its branch when
it was merged or when asked; what a killed run left is removed too."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from coder import project
from coder.display import listed
from coder.errors import (
    CoderError,
    ConcurrentRun,
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    UnknownTask,
)
from coder.files import nofollow
from coder.git import branches as gitbranches
from coder.git import commits, objects, repository, workdir, worktrees
from coder.policy import sandbox
from coder.policy.confine import end_leftovers
from coder.run import candidates
from coder.run import manifest as manifests
from coder.run.lock import TaskLock, read_lock_owner
from coder.run.manifest import Manifest, load_manifest, manifest_path
from coder.run.records import check_task_id
from coder.run.state import StateStore

if TYPE_CHECKING:
    from coder.git.repository import Repo


class Cleaned(TypedDict, total=False):
    """What `clean` did (`coder clean --json` prints it)."""

    task_id: str
    nothing: bool  # neither manifest nor checkpoint, and nothing left to remove
    runs: list[str]  # with `nothing`: the runs there are
    branch: str | None
    branch_deleted: bool
    merged: bool
    discarded: list[str]  # the worktree's uncommitted changes, with --force
    ended: list[int]  # pids of the commands a killed runner left


class Refused(TypedDict):
    """A run `clean_all` left, and why."""

    task_id: str
    error: str
    hint: str | None


class CleanedAll(TypedDict):
    """What `clean_all` did (`coder clean --all --json` prints it)."""

    cleaned: list[Cleaned]
    refused: list[Refused]


@dataclass(frozen=True)
class _Remains:
    """What `clean` removes of a run: its worktree, its branch (None: unknown) and the
    scratch worktrees of its steps."""

    worktree: Path
    branch: str | None
    step_ids: tuple[str, ...] = ()
    start: str | None = None  # the commit the run's branch started at (None: unknown)

    @classmethod
    def of(cls, manifest: Manifest) -> _Remains:
        steps = tuple(manifest.step_ids)
        return cls(manifest.worktree_path, manifest.branch, steps, manifest.start_commit)


def clean(
    cwd: Path,
    task_id: str,
    *,
    keep_branch: bool = False,
    delete_branch: bool = False,
    force: bool = False,
) -> Cleaned:
    """Remove a run's worktree, state, artifacts and logs; its branch only when it was merged
    (unless `keep_branch`) or when asked (`delete_branch`). Uncommitted changes in the
    worktree are refused (InvalidInput naming them) unless `force` discards them; a worktree
    coder was still checking out or removing when it was killed has none. Commands a killed
    runner left running are ended first. Of a run whose manifest and checkpoint are gone, what
    is left is removed (its worktree; its branch with `delete_branch`); with nothing left,
    nothing happens (`nothing` in the result)."""
    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    coder_dir = project.coder_dir(root)
    check_task_id(task_id)
    try:
        remains = _Remains.of(load_manifest(coder_dir, task_id))
    except CorruptState:  # the run cannot go on: what it made can still be removed
        remains = _remains_from_state(repo, coder_dir, task_id)
    except UnknownTask:
        remains = _remains_from_state(repo, coder_dir, task_id)
        if not _anything_left(repo, coder_dir, task_id, remains, delete_branch):
            return {
                "task_id": task_id,
                "nothing": True,
                "runs": manifests.run_ids(coder_dir),
                "branch": remains.branch,
                "branch_deleted": False,
                "merged": False,
                "discarded": [],
                "ended": [],
            }
    pid = read_lock_owner(coder_dir, task_id)
    if pid is not None:
        raise ConcurrentRun(
            f"run {task_id} is running (pid {pid})",
            hint=f"stop it first with `coder stop -t {task_id}`",
        )
    with TaskLock(coder_dir, task_id) if coder_dir.is_dir() else contextlib.nullcontext():
        return _remove(repo, coder_dir, task_id, remains, keep_branch, delete_branch, force)


def clean_all(
    cwd: Path,
    *,
    merged_only: bool = False,
    keep_branch: bool = False,
    delete_branch: bool = False,
    force: bool = False,
) -> CleanedAll:
    """`clean` of every run of the project (with `merged_only`, of each one merged): those
    coder knows under `.coder/`, and those whose files there are gone but whose `agent/`
    branch ends in one of their commits, or whose worktree git still has registered. A run
    that refuses (uncommitted changes, running) is listed under `refused` with why, and the
    others are cleaned all the same."""
    repo = repository.open_repo(cwd)
    coder_dir = project.coder_dir(repository.repo_root(repo))
    known = manifests.run_ids(coder_dir) if coder_dir.is_dir() else []
    left = set(commits.branch_task_ids(repo)) | _registered_runs(repo, coder_dir)
    ids = sorted(set(known) | left)
    cleaned: list[Cleaned] = []
    refused: list[Refused] = []
    for task_id in ids:
        if merged_only and not _was_merged(coder_dir, task_id):
            continue
        try:
            result = clean(
                cwd, task_id, keep_branch=keep_branch, delete_branch=delete_branch, force=force
            )
        except CoderError as exc:
            refused.append({"task_id": task_id, "error": exc.message, "hint": exc.hint})
            continue
        if not result["nothing"]:
            cleaned.append(result)
    return {"cleaned": cleaned, "refused": refused}


def _registered_runs(repo: Repo, coder_dir: Path) -> set[str]:
    """The runs git still has a worktree registered for under `.coder/worktrees/` (their
    directory may be gone): what is left of a run that stopped before its first commit and
    whose files are gone, whose branch no commit of it names."""
    admin_root = repository.common_dir(repo) / "worktrees"
    found = set()
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        try:
            gitdir = Path(repository.admin_text(admin / "gitdir"))
        except OSError:
            continue
        if gitdir.parent.parent == coder_dir / "worktrees" and "--" not in admin.name:
            found.add(admin.name)  # a step's scratch worktree (`ID--STEP`) is its run's
    return found


def _was_merged(coder_dir: Path, task_id: str) -> bool:
    """Whether the run's state records its merge (unreadable: not known to be merged)."""
    try:
        return bool((StateStore(coder_dir).load(task_id).merge or {}).get("commit"))
    except CoderError:
        return False


def _remove(
    repo: Repo,
    coder_dir: Path,
    task_id: str,
    remains: _Remains,
    keep_branch: bool,
    delete_branch: bool,
    force: bool,
) -> Cleaned:
    """`clean`'s work, holding the task's lock (no runner can start meanwhile)."""
    worktree = remains.worktree
    # Commands a killed runner left (they carry the run's owner token) would go on writing
    # into the worktree while it is judged and removed.
    ended = sandbox.kill_owned(sandbox.owner_token(coder_dir, task_id))
    end_leftovers(worktree)
    objects.sweep(repo)  # what killed coders kept from git's prune, no ref reached
    changed: list[str] = []
    if worktrees.worktree_ready(worktree):  # not one coder was still checking out or removing
        try:
            changed = workdir.changed_paths(worktree)
        except EnvironmentProblem:  # unreadable (its admin files forged): only --force goes on
            if not force:
                raise
    if changed and not force:
        raise EnvironmentProblem(  # exit 3, as resume and revert refuse the same worktree
            f"the worktree {worktree} has uncommitted changes ({listed(changed, 10)}); "
            "cleaning would delete them",
            hint=f"keep them elsewhere first (e.g. `git -C {worktree} stash -u`), or pass "
            "--force to discard them",
        )
    merged = _was_merged(coder_dir, task_id)
    # the run's own worktree, its steps' scratch worktrees and merge's check worktree: exact
    # names, so cleaning task `a` never touches task `a--b`'s
    for name in _worktree_names(task_id, remains):
        worktrees.remove_worktree(repo, name, coder_dir / "worktrees" / name)
    branch = remains.branch
    if branch is not None:  # the tries of its steps tried several ways go with the run
        for kept in candidates.kept_branches(repo, branch, remains.step_ids):
            gitbranches.delete_branch(repo, kept)
    if branch is not None and gitbranches.branch_tip(repo, branch) is None:
        branch = None  # deleted by hand already
    # A branch still where the run started holds nothing of it: kept, it would only stop the
    # same taskfile from running again ("branch already exists").
    empty = branch is not None and gitbranches.branch_tip(repo, branch) == remains.start
    drop_branch = branch is not None and (delete_branch or (not keep_branch and (merged or empty)))
    if drop_branch and branch is not None:
        worktrees.prune_stale_worktrees(repo)  # one deleted by hand still "has it checked out"
        gitbranches.delete_branch(repo, branch)
    StateStore(coder_dir).delete(task_id)
    for path in _files(coder_dir, task_id):
        nofollow.unlink(path)
    nofollow.remove_tree(coder_dir / "artifacts" / task_id)
    return {
        "task_id": task_id,
        "nothing": False,
        "branch": branch,
        "branch_deleted": drop_branch,
        "merged": merged,
        "discarded": changed,
        "ended": ended,
    }


def _worktree_names(task_id: str, remains: _Remains) -> list[str]:
    scratch = [f"{task_id}--{step_id}" for step_id in remains.step_ids]
    tries = candidates.worktree_names(task_id, remains.step_ids)
    return [task_id, *scratch, *tries, f"{task_id}--merge.check"]


def _files(coder_dir: Path, task_id: str) -> list[Path]:
    """A run's own files besides its checkpoint, artifacts and worktrees."""
    return [
        coder_dir / "logs" / f"{task_id}.jsonl",
        coder_dir / "locks" / f"{task_id}.lock",
        manifest_path(coder_dir, task_id),
    ]


def _anything_left(
    repo: Repo, coder_dir: Path, task_id: str, remains: _Remains, delete_branch: bool
) -> bool:
    """Whether a run with neither manifest nor checkpoint left anything `clean` removes."""
    common = repository.common_dir(repo)
    for name in _worktree_names(task_id, remains):
        path = coder_dir / "worktrees" / name
        if os.path.lexists(path) or os.path.lexists(common / "worktrees" / name):
            return True
        if worktrees.pending_change(path) is not None:
            return True
    paths = [*_files(coder_dir, task_id), StateStore(coder_dir).journal_path(task_id)]
    if any(os.path.lexists(p) for p in [*paths, coder_dir / "artifacts" / task_id]):
        return True
    return delete_branch and remains.branch is not None


def _remains_from_state(repo: Repo, coder_dir: Path, task_id: str) -> _Remains:
    """What `clean` needs of a run whose manifest is corrupt or gone: from its checkpoint
    when that is of version 1 (which held the same), else its worktree by its name, and its
    branch: the one that worktree has checked out, or one whose tip is the run's commit; else
    none (kept: unknown)."""
    try:
        manifest = manifests.from_v1_state(coder_dir, task_id)
    except (CorruptState, InvalidInput):
        manifest = None
    if manifest is not None:
        return _Remains.of(manifest)
    branches = commits.task_branches(repo, task_id)
    return _Remains(
        coder_dir / "worktrees" / task_id,
        gitbranches.registered_branch(repo, task_id) or next(iter(branches), None),
    )
