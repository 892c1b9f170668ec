"""`coder fork -t ID --at STEP`: a new run that tries STEP (and what comes after it) again,
another way, while run ID stays exactly as it is.

The fork is a run of its own: id `ID-fork-N`, its own branch, worktree, manifest and state
(`parent: ID`, `forked_at: {step, commit}`), the parent's task with the fork's id (and
`--model`'s model). Its branch begins where STEP began in the parent: at the parent's commit
right before the first commit of STEP or of any step after it in DAG order (the parent's
base when there is none), so STEP and every step after it are pending, and `coder resume -t
FORK` runs them. The steps before keep their records (summary, tests, tokens), each with the
reason it is done: those whose commits the history keeps, and those that finished without a
commit (an analyze or test step) once what they depend on is carried over too. The branch
holds copies of the parent's commits up to there (coder.git.forks: same trees, authors and
messages, the trailer naming the fork), since each command reads a run's steps from commits
that carry its own id. The parent's branch, worktree, state and files are read, never
written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coder import taskfile
from coder.errors import CoderError, InvalidInput
from coder.files import nofollow
from coder.git import branches, forks, repository, worktrees
from coder.git import commits as gitcommits
from coder.run import manifest as manifests
from coder.run import notes
from coder.run.lock import TaskLock
from coder.run.opened import open_run
from coder.run.records import DONE, RunState, now_iso
from coder.run.secrets import view_redactor
from coder.run.state import StateStore
from coder.taskfile import graph


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
    note: str | None  # the step `--note` went to

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def dag(task: taskfile.Task) -> tuple[list[str], dict[str, list[str]]]:
    """The run's steps in DAG order, and what each depends on, as the run's task has them."""
    deps = {s.id: list(s.depends_on) for s in task.steps}
    return graph.order(graph.build(deps)), deps


@dataclass(frozen=True)
class ForkPlan:
    cut: str  # the commit the fork's history ends at
    kept: tuple[gitcommits.StepCommit, ...]  # the parent's effective step commits it copies
    carried: tuple[str, ...]  # the steps done in the fork, DAG order


def plan_fork(
    order: list[str],
    deps: dict[str, list[str]],
    step: str,
    commits: list[gitcommits.StepCommit],
    done: set[str],
    base_commit: str,
) -> ForkPlan:
    """Where the fork of a run at `step` begins: `commits` are the parent's effective step
    commits in branch order, `done` the steps the parent finished. The history is kept up to
    the first commit of `step` or of a step after it in `order`. A step before `step` is
    carried over when its commit is kept, or when it finished without a commit (an analyze
    or test step, one that changed nothing, a skipped one) and every step it depends on is
    carried over."""
    later = set(order[order.index(step) :])
    first = next((i for i, c in enumerate(commits) if c.step_id in later), len(commits))
    kept = commits[:first]
    committed = {c.step_id for c in commits}
    carried: list[str] = []
    for sid in order:
        if sid in later:
            break
        by_commit = sid in {c.step_id for c in kept}
        no_commit = sid in done and sid not in committed
        if by_commit or no_commit and all(d in carried for d in deps.get(sid, [])):
            carried.append(sid)
    return ForkPlan(kept[-1].commit if kept else base_commit, tuple(kept), tuple(carried))


def fork_run(
    task_id: str,
    *,
    cwd: Path,
    at: str,
    model: str | None = None,
    note: str | None = None,
) -> ForkResult:
    """Fork run `task_id` at step `at` (see the module docstring)."""
    run = open_run(cwd, task_id)  # not locked: the parent is only read, and stays untouched
    repo, coder_dir, parent, parent_state = run.repo, run.coder_dir, run.manifest, run.state
    order, deps = dag(parent.task)
    if at not in order:
        raise InvalidInput(
            f"run {task_id} has no step {at!r}", hint=f"its steps: {', '.join(order)}"
        )
    if branches.branch_tip(repo, parent.branch) is None:
        raise InvalidInput(f"branch {parent.branch} of run {task_id} no longer exists")
    commits = gitcommits.effective_step_commits(
        repo, branch=parent.branch, base_commit=parent.base_commit, task_id=task_id
    )
    done = {sid for sid, r in parent_state.steps.items() if r.status in DONE}
    # never below the checkout's commit (--include-uncommitted): it is the run's own start
    plan = plan_fork(order, deps, at, commits, done, parent.start_commit)
    cut = plan.cut
    taken = set(manifests.run_ids(coder_dir))

    def branch_of(fork: str) -> str:
        return taskfile.default_branch(fork, parent.task.title)

    def free(fork: str) -> bool:  # no run, nor a branch a cleaned one left
        return fork not in taken and branches.branch_tip(repo, branch_of(fork)) is None

    new_id = manifests.fork_id(task_id, free)
    task = dict(parent.doc, id=new_id, branch=branch_of(new_id))
    if model:
        task["model"] = model
    with TaskLock(coder_dir, new_id):
        if manifests.run_exists(coder_dir, new_id) or not free(new_id):
            raise InvalidInput(
                f"run {new_id} (or its branch {task['branch']}) appeared meanwhile",
                hint="fork again",
            )
        manifest = manifests.Manifest(
            task_id=new_id,
            doc=task,  # the parent's stored task, renamed
            taskfile=parent.taskfile,
            base=parent.base,
            base_commit=parent.base_commit,
            branch=task["branch"],
            worktree=str(coder_dir / "worktrees" / new_id),
            created_at=now_iso(),
            origin=parent.origin or {"id": task_id, "branch": parent.branch},
            parent=task_id,
            forked_at={"step": at, "commit": plan.cut},
        )
        state = _state(manifest, parent_state, plan, at)
        noted = _note(repo, parent, manifest, state, note) if note is not None else None
        manifest, tip = _copied(repo, coder_dir, parent, plan, manifest, state)
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
        note=noted,
    )


def _state(manifest: manifests.Manifest, parent: RunState, plan: ForkPlan, at: str) -> RunState:
    """The fork's first checkpoint: the carried-over steps with the parent's records (a
    committed one on the copy of its commit, once the copies are made); every other step
    pending."""
    state = manifests.new_run(manifest)  # parent and forked_at: the manifest's
    commits = {c.step_id: c.commit for c in plan.kept}
    for sid in plan.carried:
        record = parent.steps.get(sid)
        if record is None or sid not in state.steps:
            continue
        where = f" (its commit {commits[sid][:12]})" if sid in commits else ""
        state.steps[sid] = replace(
            record,
            status="success" if sid in commits else record.status,
            commit=None,
            start_tip=None,
            reasons=[
                *record.reasons,
                f"carried over from run {manifest.parent}{where} by `coder fork --at {at}`",
            ],
        )
    return state


def _copied(
    repo: repository.Repo,
    coder_dir: Path,
    parent: manifests.Manifest,
    plan: ForkPlan,
    manifest: manifests.Manifest,
    state: RunState,
) -> tuple[manifests.Manifest, str]:
    """The parent's history up to the fork point copied for the fork (coder.git.forks): the
    manifest with the fork's number and checkout commit, the checkpoint with them and each
    carried-over step on the copy of its commit; and the commit the fork's branch starts at."""
    copies = forks.copy_history(
        repo,
        base_commit=parent.base_commit,
        upto=plan.cut,
        parent_id=parent.task_id,
        fork_id=manifest.task_id,
    )
    checkout = copies[parent.checkout_commit] if parent.checkout_commit else None
    manifest = replace(manifest, seq=manifests.next_seq(coder_dir), checkout_commit=checkout)
    for kept in plan.kept:
        record = state.steps.get(kept.step_id)
        if record is not None and record.status == "success":
            record.commit = copies[kept.commit]
    return manifest, list(copies.values())[-1] if copies else parent.base_commit


def _note(
    repo: repository.Repo,
    parent: manifests.Manifest,
    manifest: manifests.Manifest,
    state: RunState,
    text: str,
) -> str:
    """`--note`: a guidance note (coder.run.notes) for the fork's first pending step a model
    works on, redacted into its record; the step it went to. Refused (exit 2), before
    anything of the fork exists, when no pending step has a model to read it."""
    task = manifest.task
    step = notes.target(task, notes.will_run(task, state), None)
    redactor = view_redactor(repository.repo_root(repo), [parent.worktree])
    notes.give(state, step, text, via="fork", redactor=redactor)
    return step


def _create(
    repo: repository.Repo,
    coder_dir: Path,
    manifest: manifests.Manifest,
    tip: str,
    state: RunState,
) -> None:
    """The fork's manifest (what it is: a checkpoint holds progress only), then its first
    checkpoint, whole (its `--note` too: recorded before the fork acts, so a kill at any later
    point loses nothing of it), then the branch and worktree at `tip`; anything made is
    removed again on failure. Killed between the two files, the fork was never made (resume
    says so, removes the manifest and says to fork again); killed after them, before the
    branch exists, it is a run whose branch is gone: resume says how to restore it at its
    last copied commit."""
    store = StateStore(coder_dir)
    worktree = Path(manifest.worktree)
    try:
        manifests.write(coder_dir, manifest)
        store.save(state)
        worktrees.create_worktree(
            repo, name=manifest.task_id, path=worktree, branch=manifest.branch, start=tip
        )
    except BaseException:
        undo: list[Callable[[], object]] = [
            lambda: worktrees.remove_worktree(repo, manifest.task_id, worktree),
            lambda: branches.delete_branch(repo, manifest.branch),
            lambda: store.delete(manifest.task_id),
            lambda: nofollow.unlink(manifests.manifest_path(coder_dir, manifest.task_id)),
        ]
        for step in undo:
            with contextlib.suppress(CoderError, OSError):
                step()
        raise
