"""Reading a run back: its state, its diffs, its events (`coder show`, `diff`, `logs`, `report`).
Opening the run (`open_run`, coder.run.opened) needs no libgit2: only `diff` loads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coder.display import escaped, quoted_name
from coder.errors import InvalidInput

# The door every command opens a run through (coder.run.opened), named here for the commands
# that read a run back.
from coder.run.opened import OpenRun
from coder.run.opened import open_run as open_run

if TYPE_CHECKING:
    from coder.redact import Redactor


def redactor_of(view: OpenRun) -> Redactor:
    """What showing the run redacts (coder.run.secrets.view_redactor)."""
    from coder.run.secrets import view_redactor

    return view_redactor(view.root, [view.manifest.worktree])


def shown_name(name: str, redactor: Redactor) -> str:
    """A file name as coder shows it: redacted, then quoted when unusual (coder.display)."""
    return quoted_name(redactor.redact(name))


def diff(view: OpenRun, *, step: str | None = None, stat: bool = False) -> str:
    """The run's accumulated diff (base..branch), or one step's own commit: file names
    redacted and quoted when unusual, the text redacted, control characters escaped (it goes
    to a terminal; `git diff BASE..BRANCH` gives the patch as it is)."""
    from coder.git import branches as gitbranches
    from coder.git import diffs

    repo = view.repo
    state, manifest = view.state, view.manifest
    tip = gitbranches.branch_tip(repo, manifest.branch)
    if tip is None:
        raise InvalidInput(f"branch {manifest.branch} no longer exists")
    if step is None:
        old, new = manifest.base_commit, tip
    else:
        if step not in state.steps:
            known = ", ".join(state.steps)
            raise InvalidInput(f"run {view.task_id} has no step {step!r} (its steps: {known})")
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
