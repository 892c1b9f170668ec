"""A run opened through one door (`open_run`): every command that works on one existing run
(merge, revert, fork, push, compare, report, show, diff, logs) finds it, locks it and reads
it the same way, so a rule about opening a run is written once.

In this order, each step refusing before the next is taken:

1. where: the main checkout's root (`project.main_root`: no libgit2 for a `.git` directory)
   and its `.coder/`;
2. the manifest (coder.run.manifest, its task typed): a mistyped id is UnknownTask before any
   lock file is made;
3. the task's lock (`TaskLock`, for a command that changes the run: `holder`), so what is read
   next is what no runner changes meanwhile;
4. the checkpoint: a manifest without one says how to rebuild it.

The repository is opened on first use (`repo`): `show` and `status` never load libgit2
(bench/startup.py keeps them honest). What a command refuses or repairs on a run's branch
and worktree is here too: commits coder did not make (`refuse_foreign_commits`), and what a
killed runner left in the worktree (`repair_worktree`). `resume` and `clean` take the lock and
these rules from here, but find their run their own way: they rebuild or remove a run whose
manifest or checkpoint is gone or unreadable, which no other command opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Self

from coder import project
from coder.errors import EnvironmentProblem, UnknownTask
from coder.run.lock import TaskLock, read_lock_owner
from coder.run.manifest import Manifest, load_manifest
from coder.run.records import RunState
from coder.run.state import StateStore

if TYPE_CHECKING:
    from types import TracebackType

    from coder.git.repository import Repo
    from coder.taskfile import Task


@dataclass
class OpenRun:
    """One run, opened (`open_run`); `release()` (or leaving a `with` block) frees its lock."""

    cwd: Path
    root: Path
    coder_dir: Path
    manifest: Manifest
    state: RunState
    store: StateStore
    lock: TaskLock | None = field(default=None, repr=False)

    @property
    def task_id(self) -> str:
        return self.manifest.task_id

    @property
    def task(self) -> Task:
        """The run's task as stored (its secrets left out: `manifest.restored_task()`)."""
        return self.manifest.task

    @cached_property
    def repo(self) -> Repo:
        """The repository, opened where the command runs (as git would from there)."""
        from coder.git import repository  # here: libgit2, which `show` never needs

        return repository.open_repo(self.cwd)

    @cached_property
    def running_pid(self) -> int | None:
        """The pid of a live runner holding the run's lock, if any (never this command)."""
        return None if self.lock is not None else read_lock_owner(self.coder_dir, self.task_id)

    def refuse_foreign_commits(self, *, refusing: str, hint: str) -> None:
        """EnvironmentProblem when the run's branch holds commits coder did not make
        (coder.run.foreign): `refusing` says what the command will not do, `hint` the way on."""
        from coder.run.foreign import refuse_foreign_commits

        refuse_foreign_commits(
            self.repo,
            branch=self.manifest.branch,
            base_commit=self.manifest.base_commit,
            task_id=self.task_id,
            refusing=refusing,
            hint=hint,
        )

    def repair_worktree(self, tip: str) -> list[str]:
        """`repair_worktree` of this run, with its lock held."""
        assert self.lock is not None, "the run's lock is held"
        return repair_worktree(self.repo, self.coder_dir, self.manifest, tip)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def open_run(
    cwd: Path, task_id: str, *, holder: str | None = None, hint: str | None = None
) -> OpenRun:
    """Run `task_id` of the repository `cwd` is in (see the module docstring); with `holder`
    (`merge`, `revert`, `push`), its lock taken for that command (`hint`: what to do when a
    runner holds it, coder.run.lock.TaskLock)."""
    root = project.main_root(cwd)
    coder_dir = project.coder_dir(root)
    manifest = load_manifest(coder_dir, task_id)
    lock = TaskLock(coder_dir, task_id, holder=holder, hint=hint).acquire() if holder else None
    store = StateStore(coder_dir)
    try:
        state = store.load(task_id)
    except UnknownTask:  # a manifest alone: `status` lists the run, so this must not deny it
        if lock is not None:
            lock.release()
        raise EnvironmentProblem(
            f"run {task_id} has no state file (its runner was killed before writing the "
            "first one, or the file was deleted)",
            hint=f"`coder resume -t {task_id}` rebuilds it from the commits on the run's branch",
        ) from None
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return OpenRun(cwd, root, coder_dir, manifest, state, store, lock)


def repair_worktree(repo: Repo, coder_dir: Path, manifest: Manifest, tip: str) -> list[str]:
    """Put back what a killed runner (or a killed `coder`) left of the run's worktree, its
    lock held: the worktree missing, or its checkout or removal cut short (re-created at
    `tip`); a crash's index.lock; commands of it still running, which would write into it
    behind the caller's back; a HEAD one of them pointed elsewhere. Returns what was done, to
    warn of."""
    from coder.git import repository, worktrees
    from coder.policy import sandbox

    done = []
    task_id, worktree, branch = manifest.task_id, manifest.worktree_path, manifest.branch
    if not worktrees.worktree_ready(worktree):
        pending = worktrees.pending_change(worktree)
        what = {
            worktrees.CREATING: "the checkout of worktree {} was cut short; checked it out again",
            worktrees.REMOVING: "the removal of worktree {} was cut short; re-created it",
        }.get(pending or "", "worktree {} was missing; re-created it")
        what = f"{what.format(worktree)} from {branch}"
        if pending is None and worktrees.dot_git_missing(worktree):
            what = f"the `.git` file of worktree {worktree} was missing; wrote it again"
        worktrees.create_worktree(repo, name=task_id, path=worktree, branch=branch, start=tip)
        done.append(what)
    if repository.clear_stale_index_lock(worktree):
        done.append("removed a stale index.lock left by a crash")
    leftovers = sandbox.kill_owned(sandbox.owner_token(coder_dir, task_id))
    if leftovers:
        done.append(
            f"killed {len(leftovers)} leftover command process(es) of a killed runner "
            f"(pids {', '.join(map(str, leftovers[:10]))})"
        )
    named = worktrees.point_head_back(repo, task_id, branch)  # after them: they could move it
    if named is not None:
        done.append(f"the worktree's HEAD named {named}, not {branch}; pointed it back")
    return done
