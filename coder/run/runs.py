"""The run lifecycle: start a run, resume one after a crash or a stop, stop one.

Files per run, under `.coder/`:
    tasks/<id>.json       the run's manifest: the resolved taskfile, base commit, branch,
                          worktree. Written once, before anything else, never changed.
    state/<id>.json       the checkpoint (coder.run.state): a snapshot, and a journal of the
    state/<id>.journal    step transitions since; can be rebuilt from the manifest and the
                          branch's trailers.
    worktrees/<id>/       the git worktree on the run's branch: all work happens there.
    logs/<id>.jsonl       the event log. artifacts/<id>/: per-step diffs and command logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder import project, taskfile
from coder.crashpoints import crashpoint
from coder.display import counted, listed
from coder.errors import (
    CoderError,
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    RunFilesGone,
    UnknownTask,
    display_path,
)
from coder.files import nofollow
from coder.git import branches, repository, submodules, workdir, worktrees
from coder.git import commits as gitcommits
from coder.git import land as gitland
from coder.git import objects as gitobjects
from coder.git import recovery as gitrepair
from coder.git import restore as gitrestore
from coder.interrupts import detach_terminal, taken
from coder.run import amend, notes, uncommitted
from coder.run import manifest as manifests
from coder.run.foreign import refuse_foreign_commits
from coder.run.lock import TaskLock
from coder.run.manifest import Manifest, load_manifest, manifest_path, new_run
from coder.run.preflight import policy_for
from coder.run.secrets import restore, run_secrets, stored_task
from coder.run.settings import RunSettings, resolve
from coder.run.state import DONE, RunState, StateStore, now_iso

if TYPE_CHECKING:
    from coder.agent.session import AgentSession, ToolAttacher
    from coder.git.repository import Repo
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.run.approvals import EditPrompt, Mode
    from coder.run.eventlog import Console, EventLog, LiveView
    from coder.run.executor import Approver, RunContext


@dataclass(frozen=True)
class RunOptions:
    max_parallel: int | None = None
    fail_fast: bool = False
    model: str | None = None
    record: Path | None = None  # write the model's replies here
    replay: Path | None = None  # answer model calls from this recording instead of Ollama
    # approvals (coder.run.approvals): the command line's mode (--approvals; --autonomous is
    # "none"), else the taskfile's policies.approvals, else `default_approvals`
    approvals: str | None = None
    default_approvals: Mode = "none"
    approve: Approver | None = None  # the terminal's question before a step (per-step)
    approve_edit: EditPrompt | None = None  # and before an edit or a command (per-edit)
    attach_tools: ToolAttacher | None = None  # extra tools for the model (the MCP servers')
    sandbox: str | None = None  # "off" (--no-sandbox) overrides the config's `sandbox`
    # The live view: gets each typed model-loop event (coder.agent.events) with its step's
    # context (run.events.LiveView); nothing it gets is written to the log.
    live: LiveView | None = None
    # resume: take the taskfile's new version for the steps not yet done ("": the file the
    # run started from; else the path of another). None: keep the run's own copy when
    # `ignore_edits`, else refuse an edited taskfile (coder.run.amend.TaskfileEdited).
    taskfile: str | None = None
    ignore_edits: bool = False
    # resume: guidance notes, (step id or None for the next model step, text) (run/notes.py)
    notes: tuple[tuple[str | None, str], ...] = ()
    # start: the checkout's uncommitted changes become the run's first commit
    include_uncommitted: bool = False


@dataclass(frozen=True)
class RunResult:
    task_id: str
    status: str  # success | failed | error | interrupted
    state: RunState
    warnings: tuple[str, ...] = ()
    resume: str = ""  # how to continue it: `coder resume -t ID`, with -f when its files are gone


# --- start ---------------------------------------------------------------------------------


def start(
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
            state = _create(repo, coder_dir, task, path, base_commit, redactor, checkout_commit)
            store.save(state)
            return _execute(
                task,
                settings,
                root=root,
                worktree=Path(state.worktree),
                state=state,
                store=store,
                agent=agent,
                redactor=redactor,
                warnings=_start_warnings(repo, task, path, included),
                options=options,
                console=console,
            )
        except BaseException as exc:
            if agent is not None:  # _execute closes it too; closing twice is harmless
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


def refuse_unasked(mode: Mode, options: RunOptions) -> None:
    """Refuse an approvals mode that asks when nobody can be asked (no terminal)."""
    from coder.run import approvals

    prompt = options.approve if mode == "per-step" else options.approve_edit
    approvals.require_prompt(mode, can_ask=prompt is not None)


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
    task = taskfile.load(path)
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
        return _open_agent(task, cfg, repo, base_commit, options, redactor)
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
) -> RunState:
    """The run's manifest, then its branch and worktree (at `checkout_commit`, the checkout's
    changes, when there is one): its first checkpoint, not saved."""
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
    )
    manifests.write(coder_dir, manifest)
    worktrees.create_worktree(
        repo, name=task.id, path=worktree, branch=task.branch, start=manifest.start_commit
    )
    crashpoint("after_worktree")
    return new_run(manifest)


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


def run_redactor(
    roots: list[Path], task: taskfile.Task, policy: Policy, cfg: config_mod.Config
) -> Redactor:
    """The run's redactor: every secret it knows (coder.run.secrets.run_secrets)."""
    from coder.redact import Redactor

    return Redactor(run_secrets(roots, task, policy, cfg.values))


def _open_agent(
    task: taskfile.Task,
    cfg: config_mod.Config,
    repo: Repo,
    base_commit: str,
    options: RunOptions,
    redactor: Redactor,
    done: Collection[str] = (),
    attempts: Mapping[str, int] | None = None,
) -> AgentSession | None:
    """coder.agent.session.open_agent for this run: its prefix shows the task as the manifest
    keeps it."""
    from coder.agent.session import open_agent

    return open_agent(
        task,
        cfg,
        repo,
        base_commit,
        stored=stored_task(task.to_dict(), redactor),
        redactor=redactor,
        replay=options.replay,
        record=options.record,
        done=done,
        attempts=attempts,
    )


def preflight(task: taskfile.Task, policy: Policy, root: Path, cfg: config_mod.Config) -> None:
    """Refuse a run whose commands the policy forbids (or that has a test step with no test
    command), or that needs a sandbox the machine lacks, before anything is created."""
    from coder.policy.sandbox import require_sandbox
    from coder.run.preflight import refusals

    require_sandbox(policy)
    found = refusals(task.steps, root=root, policy=policy, config=cfg)
    if found:
        more = f" (and {counted(len(found) - 1, 'more refusal')})" if len(found) > 1 else ""
        raise InvalidInput(f"{found[0]}{more}", hint=found[0].hint)


# --- resume --------------------------------------------------------------------------------


def resume(
    task_id: str, *, cwd: Path, options: RunOptions, console: Console | None = None
) -> RunResult:
    """Continue a run after a crash, a kill or a stop: finished steps never run again."""
    from coder.policy import sandbox

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
        state = _resumable_state(repo, store, manifest, warnings)
        task = taskfile.from_dict(restore(manifest.task, manifest.taskfile))
        amend.align(state, task)  # after a crash while an edited taskfile was being taken
        given = _notes_for(task, state, options.notes)  # checked before anything changes
        edit, warning = amend.load_or_warn(  # so is an edited taskfile
            manifest, task, root, options.taskfile, keep=options.ignore_edits
        )
        warnings += [warning] if warning else []
        warnings += reconcile(repo, state, manifest, manifest.worktree_path)
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
        agent = _open_agent(task, cfg, repo, manifest.base_commit, options, redactor, done, made)
        return _execute(
            task,
            settings,
            root=root,
            worktree=manifest.worktree_path,
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
    from coder.policy import sandbox

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
        raise _branch_gone(repo, state, manifest.branch)
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
    """The run's manifest. A missing one is rebuilt and written back: from the checkpoint,
    or, when that is gone too (`.coder/` deleted by hand), from the taskfile given with -f
    and the commits on the run's branch."""
    try:
        return manifests.read_manifest(coder_dir, task_id)
    except UnknownTask:
        pass
    try:
        manifest = manifests.from_state(store.load(task_id))
        warnings.append(f"the manifest of run {task_id} was missing; rebuilt it from its state")
    except (UnknownTask, CorruptState):
        if not options.taskfile:
            raise manifests.missing_run(repo, coder_dir, task_id) from None
        cfg = config_mod.load(cwd, flags={"model": options.model, "sandbox": options.sandbox})
        path = Path(options.taskfile)
        task = taskfile.load(path)
        redactor = run_redactor([repository.repo_root(repo)], task, policy_for(task, cfg), cfg)
        manifest, count = manifests.rebuild(
            repo, coder_dir, task_id, path, str(cfg.model), redactor
        )
        warnings.append(
            f"run {task_id} had no manifest or state; rebuilt it from {path} and the {count} "
            f"commit{'s' * (count != 1)} of the run on {manifest.branch}"
        )
    project.ensure_coder_dir(repository.repo_root(repo))
    manifests.write(coder_dir, manifest)
    return manifest


def reconcile(repo: Repo, state: RunState, manifest: Manifest, worktree: Path) -> list[str]:
    """Bring the checkpoint in line with git, the source of truth. Refuses (changing nothing)
    when someone else moved the branch or edited the worktree while no runner was there."""
    warnings = []
    task_id, branch = manifest.task_id, manifest.branch
    tip = branches.branch_tip(repo, branch)
    if tip is None:
        raise _branch_gone(repo, state, branch)
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
    if not worktrees.worktree_ready(worktree):
        pending = worktrees.pending_change(worktree)
        done = {
            worktrees.CREATING: "the checkout of worktree {} was cut short; checked it out again",
            worktrees.REMOVING: "the removal of worktree {} was cut short; re-created it",
        }.get(pending or "", "worktree {} was missing; re-created it")
        done = f"{done.format(worktree)} from {branch}"
        if pending is None and worktrees.dot_git_missing(worktree):
            done = f"the `.git` file of worktree {worktree} was missing; wrote it again"
        worktrees.create_worktree(repo, name=task_id, path=worktree, branch=branch, start=tip)
        warnings.append(done)
    if repository.clear_stale_index_lock(worktree):
        warnings.append("removed a stale index.lock left by the crash")
    named = worktrees.point_head_back(repo, task_id, branch)
    if named is not None:
        warnings.append(f"the worktree's HEAD named {named}, not {branch}; pointed it back")
    committed = {
        c.step_id: c.commit
        for c in gitcommits.effective_step_commits(
            repo, branch=branch, base_commit=manifest.base_commit, task_id=task_id
        )
    }
    if _align_steps(state, committed) or rolled_back is not None:
        gitrestore.discard_changes(worktree, tip)
    elif not workdir.is_clean(worktree):
        warnings.append(_left_by_revert(repo, worktree, branch, tip))
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


def _left_by_revert(repo: Repo, worktree: Path, branch: str, tip: str) -> str:
    """Changes in the worktree no runner left: those of a `coder revert` killed after moving
    the branch, before the files followed it, are updated to the branch (the warning says
    so); anyone else's refuse the resume."""
    if not gitland.left_behind_at(repo, worktree, reflog_prefix=gitcommits.REFLOG_REVERT):
        changed = workdir.changed_paths(worktree)
        raise EnvironmentProblem(
            f"the worktree {worktree} has changes coder did not make "
            f"({', '.join(changed[:5])}); refusing to resume so they are not lost",
            hint=f"commit or stash them elsewhere (e.g. `git -C {worktree} stash -u`), then resume",
        )
    gitrestore.discard_changes(worktree, tip)
    return (
        "the worktree still had files from before an interrupted "
        f"`coder revert`; updated them to {branch}"
    )


def _branch_gone(repo: Repo, state: RunState, branch: str) -> EnvironmentProblem:
    """The run's branch was deleted by hand (or a kill cut a fork short before it made its
    branch): how to bring it back, at its last step commit or where the run started, or
    remove the run."""
    last = gitcommits.last_commit(repo, [st.commit for st in state.steps.values() if st.commit])
    start = gitcommits.last_commit(repo, [state.checkout_commit or state.base_commit])
    at, what = (last, "its last step commit") if last else (start, "where the run started")
    restore = (
        f"restore it with `git branch {branch} {at[:12]}` ({what}) and resume, or " if at else ""
    )
    return EnvironmentProblem(
        f"branch {branch} of run {state.task_id} no longer exists",
        hint=f"{restore}remove the run with `coder clean -t {state.task_id}`",
    )


# --- running and stopping ------------------------------------------------------------------


def _execute(
    task: taskfile.Task,
    settings: RunSettings,
    *,
    root: Path,
    worktree: Path,
    state: RunState,
    store: StateStore,
    agent: AgentSession | None,
    redactor: Redactor,
    warnings: tuple[str, ...],
    options: RunOptions,
    console: Console | None,
) -> RunResult:
    """Run a started or resumed run to its end: the one place its RunContext is built."""
    from coder.redact import secrets_from_repo
    from coder.run.approvals import EditApprovals
    from coder.run.eventlog import EventLog
    from coder.run.executor import RunContext

    coder_dir = store.coder_dir
    # the worktree's `.env*` files too, before anything is logged or any command runs
    redactor.add(*secrets_from_repo(worktree))
    if agent is not None and options.replay is None:  # the server's API key stays secret
        from coder.config import api_key

        redactor.add(*filter(None, [api_key(settings.config)]))
    live = options.live
    with EventLog(coder_dir, task.id, redactor=redactor, console=console, live=live) as log:
        for warning in warnings:
            log.warning("run.warning", message=warning)
        stop = threading.Event()  # the run's, which its questions watch too
        run = RunContext(
            task=task,
            settings=settings,
            repo_root=root,
            coder_dir=coder_dir,
            worktree=worktree,
            state=state,
            store=store,
            log=log,
            redactor=redactor,
            stop=stop,
            agent=agent,
            approve=options.approve if settings.approvals == "per-step" else None,
            approve_edit=EditApprovals(options.approve_edit, redactor, stop)
            if settings.approvals == "per-edit" and options.approve_edit is not None
            else None,
        )
        status = _drive(run, options)
    resume = f"coder resume -t {task.id}"
    if not manifests.run_exists(coder_dir, task.id):  # deleted under the run
        resume += f" -f {state.taskfile or 'TASKFILE'}"
    return RunResult(task.id, status, state, warnings, resume)


def _drive(run: RunContext, options: RunOptions) -> str:
    """The executor's walk, with the model's extra tools attached and its prefix sent ahead;
    the model side closed whatever happens."""
    from coder.run.executor import Executor

    agent, config = run.agent, run.settings.config
    if agent is not None:
        run.log.info("model.ready", **agent.facts.as_dict())
    attached = None
    try:
        if agent is not None and options.attach_tools is not None:  # they join the prefix
            attached = options.attach_tools(
                agent, config, cwd=run.worktree, log=run.log, redactor=run.redactor
            )
        if agent is not None:
            agent.prime(config)  # unless it is already being sent
        with _stop_on_signals(run.stop, run.log):
            return Executor(run).execute()
    finally:
        if attached is not None:
            attached.close()
        if agent is not None:
            agent.stop_priming()  # a warm prefix still being sent is ended first
            agent.models.close()


@contextmanager
def _stop_on_signals(stop: threading.Event, log: EventLog) -> Iterator[None]:
    """SIGTERM (`coder stop`), Ctrl-C and a hang-up (the terminal closed; not under nohup:
    coder.interrupts.taken) stop gracefully: the current step is interrupted, its commands
    and model requests ended and the checkpoint written. A second Ctrl-C stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:  # before anything is written to the terminal that is gone
            detach_terminal()
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        log.warning("run.stop_requested", signal=signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in taken()}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass(frozen=True)
class Stopped:
    """How `stop` ended a run: `forced` when the runner did not stop when asked (blocked in
    `blocked_in`, the kernel function it waited in) and was killed with its commands."""

    pid: int
    forced: bool = False
    blocked_in: str | None = None
    commands: tuple[int, ...] = ()  # pids of the command processes killed with it


def stop(task_id: str, *, cwd: Path, wait: float = 30.0) -> Stopped:
    """End the run of `task_id`. First as asked (SIGTERM: the current step is interrupted and
    checkpointed); a runner that is still there after `wait` seconds is stuck (a read that
    blocks, a wait that never ends), so it is killed (SIGKILL), and the commands it left
    running (its sandboxed processes, in their own sessions) with it. A killed runner leaves
    its run as a crash does: `coder resume` continues it."""
    from coder.run.lock import pid_alive, read_lock_owner

    root = repository.repo_root(repository.open_repo(cwd))
    coder_dir = project.coder_dir(root)
    load_manifest(coder_dir, task_id)
    pid = read_lock_owner(coder_dir, task_id)
    if pid is None:
        raise InvalidInput(
            f"run {task_id} is not running",
            hint=f"see `coder status`; continue it with `coder resume -t {task_id}`",
        )

    def gone(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while pid_alive(pid) and read_lock_owner(coder_dir, task_id) == pid:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    os.kill(pid, signal.SIGTERM)
    if gone(wait):
        return Stopped(pid)
    blocked_in = _waiting_in(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not gone(10.0):
        raise EnvironmentProblem(
            f"run {task_id} (pid {pid}) did not stop within {wait:.0f}s, nor when killed",
            hint=f"see `ps -o stat,wchan -p {pid}` (a D state waits on the kernel, often a "
            "stuck file system)",
        )
    return Stopped(pid, True, blocked_in, tuple(_end_commands(coder_dir, task_id)))


def _waiting_in(pid: int) -> str | None:
    """The kernel function the process sleeps in (`wait_for_partner`: opening a FIFO), if any."""
    try:
        where = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return None
    return where if where not in ("", "0") else None


def _end_commands(coder_dir: Path, task_id: str) -> list[int]:
    """Kill what a killed runner's commands left running, holding the task's lock (so no new
    runner starts commands meanwhile); none when another runner already took the lock (its
    `resume` does the same)."""
    from coder.errors import ConcurrentRun
    from coder.policy import sandbox

    try:
        with TaskLock(coder_dir, task_id):
            return sandbox.kill_owned(sandbox.owner_token(coder_dir, task_id))
    except ConcurrentRun:
        return []
