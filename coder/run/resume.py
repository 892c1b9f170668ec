"""`coder resume`: a run that crashed, was killed or was stopped, reconciled with git and driven
on. Git is the source of truth: the checkpoint is aligned with the step commits on the branch
(`reconcile`), a worktree a dead runner left mid-step is restored, a branch whose newest commits
lost objects goes back to its last complete one, and a manifest that is gone is rebuilt from
the commits' trailers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from coder import config as config_mod
from coder import project, taskfile
from coder.display import counted, listed
from coder.errors import (
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    ManifestGone,
    UnknownTask,
    display_path,
)
from coder.files import nofollow
from coder.git import branches, repository, workdir, worktrees
from coder.git import commits as gitcommits
from coder.git import land as gitland
from coder.git import objects as gitobjects
from coder.git import recovery as gitrepair
from coder.git import restore as gitrestore
from coder.run import amend, notes
from coder.run import manifest as manifests
from coder.run.foreign import refuse_foreign_commits
from coder.run.lock import TaskLock, processes_holding
from coder.run.manifest import Manifest, manifest_path, new_run
from coder.run.opened import repair_worktree
from coder.run.preflight import policy_for
from coder.run.records import DONE, RunState
from coder.run.settings import resolve
from coder.run.state import StateStore

if TYPE_CHECKING:
    from coder.git.repository import Repo
    from coder.redact import Redactor
    from coder.run.eventlog import Console
from coder.policy import sandbox
from coder.run.drive import (
    RunOptions,
    RunResult,
    execute,
    open_agent,
    preflight,
    refuse_unasked,
    run_redactor,
)


def resume_run(
    task_id: str, *, cwd: Path, options: RunOptions, console: Console | None = None
) -> RunResult:
    """Continue a run after a crash, a kill or a stop: finished steps never run again."""
    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    coder_dir = project.coder_dir(root)
    store = StateStore(coder_dir)
    warnings: list[str] = []
    if not manifests.run_exists(coder_dir, task_id) and not options.taskfile:
        raise manifests.missing_run(repo, coder_dir, task_id)  # before a lock file is made
    with TaskLock(coder_dir, task_id) as lock:
        manifest = _recover_manifest(repo, coder_dir, store, task_id, options, cwd, warnings)
        warnings += _previous_runner(lock.took_over_from, coder_dir, task_id)
        gitobjects.sweep(repo)  # what killed coders kept from git's prune, no ref reached
        warnings += _free_branch_lock(repo, manifest.branch)
        state = _resumable_state(repo, store, manifest, warnings)
        task = manifest.restored_task()
        amend.align(state, task)  # after a crash while an edited taskfile was being taken
        given = _notes_for(task, state, options.notes)  # checked before anything changes
        edit, warning = amend.load_or_warn(  # so is an edited taskfile
            manifest, task, root, options.taskfile, keep=options.ignore_edits
        )
        warnings += [warning] if warning else []
        warnings += reconcile(repo, coder_dir, state, manifest)
        cfg = config_mod.load(cwd, flags={"model": options.model, "sandbox": options.sandbox})
        config_mod.require_trusted(cfg)
        task, manifest, redactor = _take_edit(
            coder_dir, root, state, manifest, task, edit, cfg, warnings
        )
        settings = resolve(task, cfg, options)
        refuse_unasked(settings.approvals, options)
        for step_id, text in given:
            if notes.give(state, step_id, text, via="resume", redactor=redactor) is None:
                warnings.append(f"step {step_id} has that note already; it is kept once")
        store.save(state)
        sandbox.require_sandbox(settings.policy)
        done = {sid for sid, st in state.steps.items() if st.status in DONE}
        made = {sid: st.attempts for sid, st in state.steps.items()}
        agent = (  # a run on other machines: its steps' models are the workers' own
            None
            if manifest.fleet
            else open_agent(task, cfg, repo, manifest.base_commit, options, redactor, done, made)
        )
        return execute(
            task,
            settings,
            root=root,
            manifest=manifest,
            state=state,
            store=store,
            agent=agent,
            redactor=redactor,
            warnings=tuple(warnings),
            options=options,
            console=console,
        )


def _notes_for(
    task: taskfile.Task, state: RunState, given: Sequence[tuple[str | None, str]]
) -> list[tuple[str, str]]:
    """`resume --note`'s notes with the step each goes to (InvalidInput for a bad one)."""
    later = notes.will_run(task, state)
    return [(notes.target(task, later, step), notes.checked_text(text)) for step, text in given]


def _previous_runner(took_over_from: int | None, coder_dir: Path, task_id: str) -> list[str]:
    """What is left of the runner before: its lock (taken over) and its commands, which live
    on in their own sessions: ended before the worktree is judged, or they write into it
    behind the reconciliation."""
    warnings = []
    if took_over_from:
        warnings.append(f"the previous runner (pid {took_over_from}) is gone; taking over its lock")
    leftovers = sandbox.kill_owned(sandbox.owner_token(coder_dir, task_id))
    if leftovers:
        warnings.append(
            f"killed {len(leftovers)} leftover command process(es) of the "
            f"previous runner (pids {', '.join(map(str, leftovers[:10]))})"
        )
    return warnings


def _resumable_state(
    repo: Repo, store: StateStore, manifest: Manifest, warnings: list[str]
) -> RunState:
    """The run's checkpoint (rebuilt from the manifest when it is missing or unreadable);
    refused when the run's branch is gone or the run already succeeded."""
    task_id = manifest.task_id
    try:
        state = store.load(task_id)
    except (CorruptState, UnknownTask) as exc:
        if isinstance(exc, UnknownTask):
            _refuse_unmade_fork(repo, store, manifest)
        problem = (
            f"state file {display_path(exc.path)} is corrupt ({exc.reason})"
            if isinstance(exc, CorruptState)
            # not "no task X":
            else (
                f"the state file of run {task_id} is missing (the runner stopped before its "
                "first checkpoint, or the file was deleted)"
            )
        )  # the run's manifest exists
        state = new_run(manifest)
        state.status = "interrupted"
        kept = store.salvage(task_id, state)
        warnings.append(
            f"{problem}; rebuilding the state from the branch's commits"
            + (
                f" and what the checkpoint still held of {counted(len(kept), 'step')} "
                f"({listed(kept, 5)}: their notes, attempts and usage)"
                if kept
                else ""
            )
        )
    if branches.branch_tip(repo, manifest.branch) is None:
        raise _branch_gone(repo, state, manifest)
    if state.status == "success":
        merged = state.merge
        raise InvalidInput(
            f"run {task_id} already finished successfully"
            + (f" and was merged into {merged['base']}" if merged else "")
            + "; nothing to resume",
            hint=f"see `coder show -t {task_id}`"
            + (
                f"; remove it with `coder clean -t {task_id}`"
                if merged
                else f", or merge it with `coder merge -t {task_id}`"
            ),
        )
    return state


def _take_edit(
    coder_dir: Path,
    root: Path,
    state: RunState,
    manifest: Manifest,
    task: taskfile.Task,
    edit: amend.Edit | None,
    cfg: config_mod.Config,
    warnings: list[str],
) -> tuple[taskfile.Task, Manifest, Redactor]:
    """The task the resume runs, its manifest and redactor: the run's own, or the edited
    taskfile's (`edit`, --taskfile) for the steps not yet done, checked as a start is."""
    running = edit.task if edit is not None else task
    redactor = run_redactor([root], running, policy_for(running, cfg), cfg)
    if edit is None:
        return task, manifest, redactor
    amend.check_done_unchanged(edit, state)
    preflight(edit.todo(state), policy_for(edit.task, cfg), root, cfg)
    path = manifest_path(coder_dir, manifest.task_id)
    manifest = amend.take(edit, state, manifest, path, redactor)
    warnings.append(f"{edit.summary()}; taking the new version for the steps not yet done")
    return edit.task, manifest, redactor


def _recover_manifest(
    repo: Repo,
    coder_dir: Path,
    store: StateStore,
    task_id: str,
    options: RunOptions,
    cwd: Path,
    warnings: list[str],
) -> Manifest:
    """The run's manifest. A missing one is rebuilt and written back: from the checkpoint
    when it is of version 1 (which held the same), else (`.coder/` deleted by hand) from the
    taskfile given with -f and the commits on the run's branch."""
    try:
        return manifests.read_manifest(coder_dir, task_id)
    except UnknownTask:
        pass
    try:
        found = manifests.from_v1_state(coder_dir, task_id)
    except CorruptState:
        found = None
    if found is not None:
        manifest = found
        warnings.append(f"the manifest of run {task_id} was missing; rebuilt it from its state")
    else:
        has_state = store.exists(task_id)
        if not options.taskfile:
            if has_state:
                raise ManifestGone(manifests.manifest_path(coder_dir, task_id), task_id)
            raise manifests.missing_run(repo, coder_dir, task_id)
        cfg = config_mod.load(cwd, flags={"model": options.model, "sandbox": options.sandbox})
        path = Path(options.taskfile)
        task = taskfile.load(path)
        redactor = run_redactor([repository.repo_root(repo)], task, policy_for(task, cfg), cfg)
        manifest, count = manifests.rebuild(
            repo, coder_dir, task_id, path, str(cfg.model), redactor
        )
        warnings.append(
            f"run {task_id} had no manifest{'' if has_state else ' or state'}; rebuilt it "
            f"from {path} and the {count} commit{'s' * (count != 1)} of the run on "
            f"{manifest.branch}"
        )
    project.ensure_coder_dir(repository.repo_root(repo))
    manifests.write(coder_dir, manifest)
    return manifest


def _free_branch_lock(repo: Repo, branch: str) -> list[str]:
    """The lock of the run's branch ref that a runner killed while it moved the branch left
    (`refs/heads/BRANCH.lock`: libgit2 writes it, then renames it over the ref). Only this
    run's runner moves its branch, and this one holds the task lock: a lock no process has
    open is that dead runner's, and is removed (the ref itself is whole, at its old or its
    new commit; reconcile takes it from there). One still open is a git process's: left, and
    the branch update waits for it, then says which file to delete."""
    lock = repository.common_dir(repo) / "refs" / "heads" / f"{branch}.lock"
    if not lock.is_file() or lock.is_symlink() or processes_holding(lock):
        return []
    lock.unlink(missing_ok=True)
    return [f"removed {lock}, left by a runner killed while it moved the branch {branch}"]


def reconcile(repo: Repo, coder_dir: Path, state: RunState, manifest: Manifest) -> list[str]:
    """Bring the checkpoint in line with git, the source of truth. Refuses (changing nothing)
    when someone else moved the branch or edited the worktree while no runner was there."""
    warnings = []
    task_id, branch, worktree = manifest.task_id, manifest.branch, manifest.worktree_path
    tip = branches.branch_tip(repo, branch)
    if tip is None:
        raise _branch_gone(repo, state, manifest)
    rolled_back = _roll_back_past_pruned(repo, state, manifest, worktree, tip)
    if rolled_back is not None:
        tip, warning = rolled_back
        warnings.append(warning)
    refuse_foreign_commits(
        repo,
        branch=branch,
        base_commit=manifest.base_commit,
        task_id=task_id,
        refusing="refusing to resume so none of that work is lost",
        hint=f"move those commits to another branch and reset {branch} to its last coder "
        "commit, then resume",
    )
    warnings += repair_worktree(repo, coder_dir, manifest, tip)
    committed = {
        c.step_id: c.commit
        for c in gitcommits.effective_step_commits(
            repo, branch=branch, base_commit=manifest.base_commit, task_id=task_id
        )
    }
    if _align_steps(state, committed) or rolled_back is not None:
        gitrestore.discard_changes(worktree, tip)
    elif not workdir.is_clean(worktree):
        warnings.append(_left_behind(repo, state, worktree, branch, tip))
    for step_id in state.steps:  # scratch worktrees of a parallel level the crash cut short
        name = f"{task_id}--{step_id}"
        worktrees.remove_worktree(repo, name, worktree.parent / name)
        branches.delete_branch(repo, f"coder-scratch/{task_id}--{step_id}")
    return warnings


def _roll_back_past_pruned(
    repo: Repo, state: RunState, manifest: Manifest, worktree: Path, tip: str
) -> tuple[str, str] | None:
    """When objects of the run's newest commits are gone (coder.git.recovery), its branch moves
    back to its last complete commit and the steps after it run again: the new tip and the
    warning. None when every commit of the run is complete. Refused (changing nothing) while
    the worktree holds changes no step made: the discard that follows would take them."""
    task_id, branch = manifest.task_id, manifest.branch
    bad = gitrepair.first_incomplete(repo, tip, manifest.base_commit, task_id)
    if bad is None:
        return None
    target = gitrepair.last_complete(repo, branch, tip, manifest.base_commit, task_id)
    running = any(st.status == "running" for st in state.steps.values())
    if not running and worktrees.worktree_ready(worktree):
        edited = workdir.unstaged_paths(worktree)
        if edited:
            raise EnvironmentProblem(
                f"the worktree {worktree} has changes coder did not make ({listed(edited, 5)}), "
                f"and {branch} must move back past commits whose objects are gone; refusing "
                "to resume so those changes are not lost",
                hint=f"commit or stash them elsewhere (e.g. `git -C {worktree} stash -u`), "
                "then resume",
            )
    gitrepair.roll_back(repo, branch, target, tip, worktree)
    back = "the run's base" if target == manifest.base_commit else target[:12]
    return target, (
        f"objects of the newest commits on {branch} are missing from the repository (from "
        f"{bad[:12]} on; pruned by a `git gc --prune=now` or `git prune`?); moved {branch} "
        f"back from {tip[:12]} to {back}, its last complete commit: the steps after it run again"
    )


def _align_steps(state: RunState, committed: Mapping[str, str]) -> bool:
    """Each step's status as the branch's `committed` step commits say, with the reason;
    whether a step was running when the runner stopped (its partial changes are discarded)."""
    on_branch = set(committed.values())
    was_running = False
    for step_id, st in state.steps.items():
        if st.status == "success" and st.commit and st.commit not in on_branch:
            st.status, st.commit = "pending", None
            st.reasons.append("its commit is no longer on the branch (or was reverted); rerunning")
        elif st.status in ("running", "pending", "interrupted", "failed") and step_id in committed:
            st.status, st.commit, st.error = "success", committed[step_id], None
            st.reasons.append(
                "its commit is on the branch (made before the runner stopped); "
                "marked done without rerunning"
            )
        elif st.status == "running":
            was_running = True
            st.status = "pending"
            st.reasons.append(
                "was running when the runner stopped (crash or kill); its partial "
                "changes were discarded and it runs again"
            )
        elif st.status == "interrupted":  # the stopping runner discarded its changes itself,
            st.status = "pending"  # so anything in the worktree now is someone else's
            st.reasons.append("was interrupted (a stop or an environment problem); runs again")
        elif st.status == "failed":
            st.status = "pending"
            st.reasons.append("failed in the previous run; retried on resume")
    return was_running


def _left_behind(repo: Repo, state: RunState, worktree: Path, branch: str, tip: str) -> str:
    """Changes in the worktree while no step is checkpointed as running. Those of a
    `coder revert` killed after moving the branch, before the files followed it, are updated
    to the branch; those of a step whose `running` line was lost (it is not fsync'd: a power
    loss can drop it) are discarded and the step runs again, as after any crash; the warning
    says which. Anyone else's refuse the resume."""
    if gitland.left_behind_at(repo, worktree, reflog_prefix=gitcommits.REFLOG_REVERT):
        gitrestore.discard_changes(worktree, tip)
        return (
            "the worktree still had files from before an interrupted "
            f"`coder revert`; updated them to {branch}"
        )
    changed = workdir.changed_paths(worktree)
    if _died_mid_run(state):
        gitrestore.discard_changes(worktree, tip)
        return (
            f"the worktree had changes ({', '.join(changed[:5])}) though no step was "
            "checkpointed as running: taken as a step's half-done work whose `running` line "
            "was lost (it is not fsync'd: a power loss can drop it); discarded them, and the "
            "step runs again"
        )
    raise EnvironmentProblem(
        f"the worktree {worktree} has changes coder did not make "
        f"({', '.join(changed[:5])}); refusing to resume so they are not lost",
        hint=f"commit or stash them elsewhere (e.g. `git -C {worktree} stash -u`), then resume",
    )


def _died_mid_run(state: RunState) -> bool:
    """Whether the runner stopped with steps to go and without checkpointing how the run
    ended (a crash, a kill, a power loss): one of those steps may have started since its last
    durable checkpoint. A runner that stopped cleanly wrote its end (fsync'd), after
    discarding what a step left."""
    return state.status == "running" and any(st.status not in DONE for st in state.steps.values())


def _refuse_unmade_fork(repo: Repo, store: StateStore, manifest: Manifest) -> None:
    """A fork killed while `coder fork` made it, between its manifest and its first
    checkpoint (its branch is made after both): nothing of it was kept but its manifest (its
    `--note` was in the checkpoint), so it was never made. The manifest is removed, and the
    same `coder fork` makes it again (InvalidInput, exit 2)."""
    fork_point = manifest.forked_at
    if manifest.origin is None or manifest.parent is None or fork_point is None:
        return
    if branches.branch_tip(repo, manifest.branch) is not None:  # made: its state was lost
        return
    task_id = manifest.task_id
    nofollow.unlink(manifests.manifest_path(store.coder_dir, task_id))
    raise InvalidInput(
        f"no task {task_id!r}: fork {task_id} was killed while `coder fork` was making it, "
        "before anything of it was kept",
        hint=f"make it again: `coder fork -t {manifest.parent} --at {fork_point['step']}` "
        "(with its --note and --model, if any)",
    )


def _branch_gone(repo: Repo, state: RunState, manifest: Manifest) -> EnvironmentProblem:
    """The run's branch was deleted by hand (or a kill cut a fork short before it made its
    branch): how to bring it back, at its last step commit or where the run started, or
    remove the run."""
    last = gitcommits.last_commit(repo, [st.commit for st in state.steps.values() if st.commit])
    start = gitcommits.last_commit(repo, [manifest.start_commit])
    task_id, branch = manifest.task_id, manifest.branch
    at, what = (last, "its last step commit") if last else (start, "where the run started")
    restore = (
        f"restore it with `git branch {branch} {at[:12]}` ({what}) and resume, or " if at else ""
    )
    return EnvironmentProblem(
        f"branch {branch} of run {task_id} no longer exists",
        hint=f"{restore}remove the run with `coder clean -t {task_id}`",
    )


# --- running and stopping ------------------------------------------------------------------
