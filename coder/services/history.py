"""Reading a run back: its state, its diffs, its events (`coder show`, `diff`, `logs`, `report`).
Finding the run needs no libgit2 (`project.main_root`): only `diff` loads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coder import project
from coder.errors import EnvironmentProblem, InvalidInput, UnknownTask
from coder.run.lock import read_lock_owner
from coder.run.manifest import Manifest, load_manifest
from coder.run.records import RunState
from coder.run.state import StateStore

if TYPE_CHECKING:
    from coder.redact import Redactor


@dataclass(frozen=True)
class RunView:
    root: Path
    coder_dir: Path
    manifest: Manifest
    state: RunState
    running_pid: int | None


def open_run(cwd: Path, task_id: str) -> RunView:
    root = project.main_root(cwd)
    coder_dir = project.coder_dir(root)
    manifest = load_manifest(coder_dir, task_id)
    try:
        state = StateStore(coder_dir).load(task_id)
    except UnknownTask:  # a manifest alone: `status` lists the run, so this must not deny it
        raise EnvironmentProblem(
            f"run {task_id} has no state file (its runner was killed before writing the "
            "first one, or the file was deleted)",
            hint=f"`coder resume -t {task_id}` rebuilds it from the commits on the run's branch",
        ) from None
    return RunView(root, coder_dir, manifest, state, read_lock_owner(coder_dir, task_id))


def redactor_of(view: RunView) -> Redactor:
    """What showing the run redacts (coder.run.secrets.view_redactor)."""
    from coder.run.secrets import view_redactor

    return view_redactor(view.root, [view.state.worktree])


def shown_name(name: str, redactor: Redactor) -> str:
    """A file name as coder shows it: redacted, then quoted when unusual (coder.display)."""
    from coder.display import quoted_name

    return quoted_name(redactor.redact(name))


def diff(view: RunView, *, step: str | None = None, stat: bool = False) -> str:
    """The run's accumulated diff (base..branch), or one step's own commit: file names
    redacted and quoted when unusual, the text redacted, control characters escaped (it goes
    to a terminal; `git diff BASE..BRANCH` gives the patch as it is)."""
    from coder.display import escaped
    from coder.git import branches as gitbranches
    from coder.git import diffs, repository

    repo = repository.open_repo(view.root)
    state = view.state
    tip = gitbranches.branch_tip(repo, state.branch)
    if tip is None:
        raise InvalidInput(f"branch {state.branch} no longer exists")
    if step is None:
        old, new = state.base_commit, tip
    else:
        if step not in state.steps:
            known = ", ".join(state.steps)
            raise InvalidInput(f"run {state.task_id} has no step {step!r} (its steps: {known})")
        record = state.steps[step]
        if not record.commit:
            raise InvalidInput(
                f"step {step} has no commit (status {record.status}; a step that changed "
                "nothing makes none)"
            )
        old, new = gitbranches.resolve_commit(repo, f"{record.commit}^"), record.commit
    redactor = redactor_of(view)

    def shown(name: str) -> str:
        return shown_name(name, redactor)

    if stat:
        text = diffs.diff_stat(repo, old, new, shown=shown)
    else:  # libgit2 quotes an unusual name in the headers, as git does
        text = diffs.diff_patch(repo, old, new)
    return escaped(redactor.redact(text), lines=True)
