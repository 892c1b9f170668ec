"""`coder run`: a new run of a taskfile. Its manifest is written first, then its branch and
worktree; a run that stopped before its first step commit can be started again (what it left is
removed), one that got further is resumed instead (coder.run.resume).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from coder import config as config_mod
from coder import project, taskfile
from coder.crashpoints import crashpoint
from coder.errors import (
    CoderError,
    EnvironmentProblem,
    InvalidInput,
    RunFilesGone,
    UnknownTask,
)
from coder.files import nofollow
from coder.git import branches, remotes, repository, submodules, worktrees
from coder.git import commits as gitcommits
from coder.run import manifest as manifests
from coder.run import uncommitted
from coder.run.candidates import with_candidates
from coder.run.lock import TaskLock
from coder.run.manifest import Manifest, manifest_path, new_run
from coder.run.records import now_iso
from coder.run.secrets import stored_task
from coder.run.settings import RunSettings, resolve
from coder.run.state import StateStore

if TYPE_CHECKING:
    from coder.agent.session import AgentSession
    from coder.git.repository import Repo
    from coder.redact import Redactor
    from coder.run.eventlog import Console
from coder.run.drive import (
    RunOptions,
    RunResult,
    execute,
    open_agent,
    preflight,
    refuse_unasked,
    run_redactor,
)


def start_run(
    path: Path, *, cwd: Path, options: RunOptions, console: Console | None = None
) -> RunResult:
    """Validate, prepare the branch and worktree, and run the whole DAG."""
    task, settings, repo, base_commit = _checked(path, cwd, options)
    refuse_unasked(settings.approvals, options)  # before anything of the run exists
    cfg, policy = settings.config, settings.policy
    root = repository.repo_root(repo)
    coder_dir = project.ensure_coder_dir(root)
    repository.ensure_excluded(repo, f"/{project.CODER_DIR}/")
    store = StateStore(coder_dir)
    # every secret the run knows, before anything is stored, sent or logged (the worktree's
    # own `.env*` files join when it exists)
    redactor = run_redactor([root], task, policy, cfg)
    if not task.source.get("branch"):  # named after the title: never after a secret in it
        task = replace(task, branch=taskfile.default_branch(task.id, redactor.redact(task.title)))
    # The lock before the checks: a second `coder run` of a task that is running is told who
    # runs it (ConcurrentRun), and two starts cannot both pass the checks and create the run.
    with TaskLock(coder_dir, task.id) as lock:
        agent = _claim(repo, coder_dir, task, path, lock.path, base_commit, cfg, options, redactor)
        included = None
        try:  # the manifest first, then the branch and worktree, then the first checkpoint
            if options.include_uncommitted:
                assert task.base is not None, "a resolved task names its base"
                included = uncommitted.include(
                    repo, coder_dir, path, task_id=task.id, base=task.base, policy=policy
                )
                base_commit = included.base_commit  # a merge may have moved it since
            checkout_commit = included.commit if included else None
            manifest = _create(
                repo, coder_dir, task, path, base_commit, redactor, checkout_commit, options.fleet
            )
            state = new_run(manifest)
            store.save(state)
            return execute(
                task,
                settings,
                root=root,
                manifest=manifest,
                state=state,
                store=store,
                agent=agent,
                redactor=redactor,
                warnings=_start_warnings(repo, task, path, included),
                options=options,
                console=console,
            )
        except BaseException as exc:
            if agent is not None:  # execute closes it too; closing twice is harmless
                agent.stop_priming()
                agent.models.close()
            start_at = (included.commit if included else None) or base_commit
            if not _started(repo, store, task.id, task.branch, start_at):
                _remove_unstarted(repo, coder_dir, task, store, lock.path, start_at)
                if isinstance(exc, RunFilesGone):  # before any step: nothing to rebuild
                    raise RunFilesGone(
                        exc.message,
                        hint=f"nothing of the run was kept; start it again with `coder run "
                        f"--autonomous -f {path}`",
                    ) from None
            raise


def _run_exists(store: StateStore, task_id: str) -> InvalidInput:
    """The refusal to start a run whose id is taken, with the way forward from where it is."""
    try:
        finished = store.load(task_id).status == "success"
    except CoderError:
        finished = False
    again = "set another `id:` in the taskfile to start a second run of it"
    if finished:
        hint = (
            f"it finished: `coder merge -t {task_id}` lands its work, `coder clean -t "
            f"{task_id}` removes the run so this taskfile can run again; or {again}"
        )
    else:
        hint = (
            f"continue it with `coder resume -t {task_id}`, or remove it with `coder clean -t "
            f"{task_id}`; or {again}"
        )
    return InvalidInput(f"a run of task {task_id} already exists", hint=hint)


def _checked(
    path: Path, cwd: Path, options: RunOptions
) -> tuple[taskfile.Task, RunSettings, Repo, str]:
    """The taskfile, resolved against its base branch, with the settings, repository and
    base commit of its run: refused (creating nothing) when the policy forbids its commands,
    the base is missing or a submodule cannot be copied."""
    task = with_candidates(taskfile.load(path), options.candidates)
    cfg = config_mod.load(cwd, flags={"model": options.model, "sandbox": options.sandbox})
    config_mod.require_trusted(cfg)
    repo = repository.open_repo(cwd)
    settings = resolve(task, cfg, options)
    preflight(task, settings.policy, repository.repo_root(repo), cfg)
    base = task.base or branches.current_branch(repo)
    base_commit = (
        branches.resolve_commit(repo, f"refs/heads/{base}")
        if branches.branch_tip(repo, base)
        else _missing_base(base)
    )
    if options.include_uncommitted:
        uncommitted.check_includable(repo, base)
    submodules.submodules(repo, base_commit)  # each must be copyable into the worktree, or refuse
    return task.resolved(base=base, model=str(cfg.model)), settings, repo, base_commit


def _claim(
    repo: Repo,
    coder_dir: Path,
    task: taskfile.Task,
    path: Path,
    lock: Path,
    base_commit: str,
    cfg: config_mod.Config,
    options: RunOptions,
    redactor: Redactor,
) -> AgentSession | None:
    """Under the task's lock: refuse a run that exists already or whose branch does, and open
    the model side (no model: we stop here). A refusal leaves nothing, the lock file neither."""
    if manifests.run_exists(coder_dir, task.id):
        raise _run_exists(StateStore(coder_dir), task.id)
    try:  # refused before anything of the run exists: its lock file goes too
        if branches.branch_tip(repo, task.branch):
            raise _branch_exists(repo, task, path)
        if options.fleet is not None:  # its steps' models are the workers' own
            return None
        return open_agent(task, cfg, repo, base_commit, options, redactor)
    except BaseException:
        nofollow.unlink(lock)
        raise


def _create(
    repo: Repo,
    coder_dir: Path,
    task: taskfile.Task,
    path: Path,
    base_commit: str,
    redactor: Redactor,
    checkout_commit: str | None = None,
    fleet: manifests.Fleet | None = None,
) -> Manifest:
    """The run's manifest, written, then its branch and worktree (at `checkout_commit`, the
    checkout's changes, when there is one)."""
    assert task.base is not None, "a resolved task names its base"
    worktree = coder_dir / "worktrees" / task.id
    manifest = manifests.build(
        stored_task(task.to_dict(), redactor),  # secrets left out
        taskfile=path,
        base=task.base,
        base_commit=base_commit,
        worktree=worktree,
        created_at=now_iso(),
        checkout_commit=checkout_commit,
        seq=manifests.next_seq(coder_dir),
        fleet=fleet and replace(fleet, remote=remotes.url_of(repo, fleet.remote)),
    )
    manifests.write(coder_dir, manifest)
    worktrees.create_worktree(
        repo, name=task.id, path=worktree, branch=task.branch, start=manifest.start_commit
    )
    crashpoint("after_worktree")
    return manifest


def _start_warnings(
    repo: Repo, task: taskfile.Task, path: Path, included: uncommitted.Included | None
) -> tuple[str, ...]:
    """What the user should know as the run starts: commits under coder's fallback name, and
    uncommitted edits of the checkout the run leaves out (or took in: --include-uncommitted)."""
    found = []
    if repository.identity(repo).fallback:
        found.append(
            "git user.name/user.email are not set (nor GIT_AUTHOR_NAME/_EMAIL); "
            "commits are authored by coder <coder@localhost> (set them with "
            "`git config user.name ...`)"
        )
    if included is not None:
        return (*found, *uncommitted.included_notes(included))
    assert task.base is not None, "a resolved task names its base"
    left = uncommitted.left_out(repo, task.base, path)
    if left:
        found.append(uncommitted.note(left))
    return tuple(found)


def _branch_exists(repo: Repo, task: taskfile.Task, path: Path) -> CoderError:
    """The run's branch is there before the run: a run whose files under `.coder/` were
    deleted (its commits say so), or a branch of someone else's."""
    found = gitcommits.run_base(repo, task.branch, task.id)
    if found is not None:
        count = found[1]
        return EnvironmentProblem(
            f"branch {task.branch} already exists and holds {count} commit"
            f"{'s' * (count != 1)} of run {task.id}, whose files under .coder/ are gone",
            hint=f"continue the run with `coder resume -t {task.id} -f {path}`, or delete the "
            f"branch with `coder clean -t {task.id} --delete-branch` and run again",
        )
    worktrees.prune_stale_worktrees(repo)  # else `git branch -D` refuses a branch checked out
    return InvalidInput(  # in a worktree deleted by hand
        f"branch {task.branch} already exists",
        hint="set another `id` or `branch` in the taskfile, or delete the branch "
        f"(`git branch -D {task.branch}`)",
    )


def _started(repo: Repo, store: StateStore, task_id: str, branch: str, start_at: str) -> bool:
    """Whether the run got as far as its executor (which marks it `running` before a step),
    or committed anything past `start_at` (its base, or its commit of the checkout's changes):
    its checkpoint may be gone (deleted by hand), its commits stay."""
    tip = branches.branch_tip(repo, branch)
    if tip is not None and tip != start_at:
        return True
    try:
        return store.load(task_id).status != "pending"
    except UnknownTask:
        return False
    except CoderError:  # unreadable: keep everything for someone to look at
        return True


def _remove_unstarted(
    repo: Repo,
    coder_dir: Path,
    task: taskfile.Task,
    store: StateStore,
    lock: Path,
    start_at: str,
) -> None:
    """A start that failed before any step ran leaves nothing behind, so the same `coder run`
    can simply be tried again: its worktree, branch, checkpoint, manifest, log, artifacts and
    lock file go. The branch goes only while it points where the run started (its base, or
    its commit of the checkout's changes): this start created it (the branch did not exist
    when the start took the lock) and no step committed."""

    def drop_branch() -> None:
        if branches.branch_tip(repo, task.branch) == start_at:
            branches.delete_branch(repo, task.branch)

    files = (manifest_path(coder_dir, task.id), coder_dir / "logs" / f"{task.id}.jsonl", lock)
    undo: list[Callable[[], None]] = [
        lambda: worktrees.remove_worktree(repo, task.id, coder_dir / "worktrees" / task.id),
        drop_branch,
        lambda: store.delete(task.id),
        *(lambda path=path: nofollow.unlink(path) for path in files),
        lambda: nofollow.remove_tree(coder_dir / "artifacts" / task.id),
    ]
    for step in undo:
        with contextlib.suppress(CoderError, OSError):  # a link under .coder/: left alone
            step()


def _missing_base(base: str) -> str:
    raise InvalidInput(
        f"base branch {base!r} does not exist",
        hint="set `base` in the taskfile to an existing local branch",
    )
