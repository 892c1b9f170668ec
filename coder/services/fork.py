"""`coder fork -t ID --at STEP`: a new run that tries STEP (and what comes after it) again,
another way, while run ID stays exactly as it is.

The fork is a run of its own: id `ID-fork-N`, its own branch, worktree, manifest and state
(`parent: ID`, `forked_at: {step, commit}`), the parent's task with the fork's id (and
`--model`'s model). Its branch begins where STEP began in the parent: at the parent's commit
right before the first commit of STEP or of any step after it in DAG order (the parent's
base when there is none), so STEP and every step after it are pending, and `coder resume -t
FORK` runs them. The steps before keep their records (summary, tests, tokens), each with the
reason it is done. The branch holds copies of the parent's commits up to there (coder.git.
forks: same trees, authors and messages, the trailer naming the fork), since each command
reads a run's steps from commits that carry its own id. The parent's branch, worktree, state
and files are read, never written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coder import project, taskfile
from coder.errors import CoderError, InvalidInput
from coder.git import branches, forks, repository, worktrees
from coder.git import commits as gitcommits
from coder.run import manifest as manifests
from coder.run.lock import TaskLock
from coder.run.state import DONE, RunState, StateStore, check_task_id, now_iso

SUFFIX = "-fork-"


@dataclass(frozen=True)
class ForkResult:
    task_id: str
    parent: str
    step: str
    commit: str  # the parent's commit the fork's history copies up to (its base: none)
    branch: str
    worktree: str
    done: tuple[str, ...]  # steps carried over from the parent, DAG order
    pending: tuple[str, ...]
    model: str | None
    note: str | None

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def fork_id(parent: str, taken: set[str]) -> str:
    """`PARENT-fork-N`, N the smallest not `taken` (the parent's id cut short to fit the
    64 characters of an id)."""
    n = 1
    while True:
        suffix = f"{SUFFIX}{n}"
        candidate = f"{parent[: 64 - len(suffix)]}{suffix}"
        if candidate not in taken:
            return check_task_id(candidate)
        n += 1


def dag_order(task: dict[str, Any]) -> list[str]:
    """The run's steps in DAG order, as the run's task has them."""
    from coder import graph

    steps = taskfile.from_dict(task).steps
    return graph.order(graph.build({s.id: list(s.depends_on) for s in steps}))


def fork_point(
    order: list[str], step: str, commits: list[gitcommits.StepCommit], base_commit: str
) -> tuple[str, list[gitcommits.StepCommit]]:
    """(the commit the fork's history ends at, the effective step commits it keeps): those
    before the first commit of `step` or of a step after it in `order`."""
    later = set(order[order.index(step) :])
    first = next((i for i, c in enumerate(commits) if c.step_id in later), len(commits))
    kept = commits[:first]
    return (kept[-1].commit if kept else base_commit), kept


def fork_run(
    task_id: str,
    *,
    cwd: Path,
    at: str,
    model: str | None = None,
    note: str | None = None,
) -> ForkResult:
    """Fork run `task_id` at step `at` (see the module docstring)."""
    repo = repository.open_repo(cwd)
    coder_dir = project.coder_dir(repository.repo_root(repo))
    parent = manifests.load_manifest(coder_dir, task_id)
    parent_state = StateStore(coder_dir).load(task_id)
    order = dag_order(parent.task)
    if at not in order:
        raise InvalidInput(
            f"run {task_id} has no step {at!r}", hint=f"its steps: {', '.join(order)}"
        )
    if branches.branch_tip(repo, parent.branch) is None:
        raise InvalidInput(f"branch {parent.branch} of run {task_id} no longer exists")
    commits = gitcommits.effective_step_commits(
        repo, branch=parent.branch, base_commit=parent.base_commit, task_id=task_id
    )
    cut, kept = fork_point(order, at, commits, parent.base_commit)
    new_id = fork_id(task_id, set(manifests.run_ids(coder_dir)))
    task = dict(parent.task, id=new_id)
    task["branch"] = taskfile.default_branch(new_id, parent_state.title)
    if model:
        task["model"] = model
    with TaskLock(coder_dir, new_id):
        if manifests.run_exists(coder_dir, new_id) or branches.branch_tip(repo, task["branch"]):
            raise InvalidInput(
                f"run {new_id} (or its branch {task['branch']}) appeared meanwhile",
                hint="fork again",
            )
        tip = forks.copy_history(
            repo, base_commit=parent.base_commit, upto=cut, parent_id=task_id, fork_id=new_id
        )
        manifest = manifests.Manifest(
            task_id=new_id,
            task=task,  # the parent's stored task, renamed
            taskfile=parent.taskfile,
            base=parent.base,
            base_commit=parent.base_commit,
            branch=task["branch"],
            worktree=str(coder_dir / "worktrees" / new_id),
            created_at=now_iso(),
            origin=parent.origin or {"id": task_id, "branch": parent.branch},
        )
        state = _state(manifest, parent_state, kept, at, cut, note)
        _create(repo, coder_dir, manifest, tip, state)
    return ForkResult(
        task_id=new_id,
        parent=task_id,
        step=at,
        commit=cut,
        branch=manifest.branch,
        worktree=manifest.worktree,
        done=tuple(s for s in order if state.steps[s].status in DONE),
        pending=tuple(s for s in order if state.steps[s].status not in DONE),
        model=model,
        note=note,
    )


def _state(
    manifest: manifests.Manifest,
    parent: RunState,
    kept: list[gitcommits.StepCommit],
    at: str,
    cut: str,
    note: str | None,
) -> RunState:
    """The fork's first checkpoint: the kept steps done with the parent's records, on the
    copied commits; every other step pending."""
    state = manifests.new_run(manifest)
    state.parent, state.forked_at, state.note = parent.task_id, {"step": at, "commit": cut}, note
    state.status = "pending"
    for commit in kept:
        record = parent.steps.get(commit.step_id)
        if record is None or commit.step_id not in state.steps:
            continue
        state.steps[commit.step_id] = replace(
            record,
            status="success",
            commit=None,  # its copy's, once the branch exists (`_create`)
            start_tip=None,
            reasons=[
                *record.reasons,
                f"carried over from run {parent.task_id} (its commit {commit.commit[:12]}) "
                f"by `coder fork --at {at}`",
            ],
        )
    return state


def _create(
    repo: repository.Repo,
    coder_dir: Path,
    manifest: manifests.Manifest,
    tip: str,
    state: RunState,
) -> None:
    """The manifest, then the branch and worktree at `tip`, then the checkpoint with each
    carried-over step on its copied commit; anything made is removed again on failure."""
    store = StateStore(coder_dir)
    worktree = Path(manifest.worktree)
    try:
        manifests.write(coder_dir, manifest)
        worktrees.create_worktree(
            repo, name=manifest.task_id, path=worktree, branch=manifest.branch, start=tip
        )
        for commit in gitcommits.effective_step_commits(
            repo,
            branch=manifest.branch,
            base_commit=manifest.base_commit,
            task_id=manifest.task_id,
        ):
            record = state.steps.get(commit.step_id)
            if record is not None and record.status == "success":
                record.commit = commit.commit
        store.save(state)
    except BaseException:
        undo: list[Callable[[], object]] = [
            lambda: worktrees.remove_worktree(repo, manifest.task_id, worktree),
            lambda: branches.delete_branch(repo, manifest.branch),
            lambda: store.delete(manifest.task_id),
            lambda: manifests.manifest_path(coder_dir, manifest.task_id).unlink(missing_ok=True),
        ]
        for step in undo:
            with contextlib.suppress(CoderError, OSError):
                step()
        raise
