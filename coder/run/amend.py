"""Resuming with an edited taskfile: what changed since the run started, and taking it.

`coder resume` compares the taskfile on disk with the run's own copy (the manifest keeps the
task as resolved at the start). When they differ it says so, and:

    neither flag         resume refuses before anything changes (TaskfileEdited, exit 2),
                         naming what changed and both ways on; at a terminal the CLI asks
    --taskfile           the new version is taken for the steps not yet done, provided every
                         done step (committed or skipped) is unchanged; otherwise resume
                         refuses, naming the first done step that differs
    --ignore-edits       the run goes on with its own copy (said in a warning)

Taking it rewrites the manifest first (atomically), then the checkpoint: new steps join as
pending, removed steps (never done ones) leave, changed steps run with their new definition.
A crash between the two writes is mended by `align` on the next resume.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from coder import taskfile
from coder.errors import CoderError, InvalidInput, TaskfileEdited
from coder.run.candidates import chosen_kept
from coder.run.manifest import Manifest, write_path
from coder.run.records import DONE, RunState, StepRecord
from coder.run.secrets import stored_task

if TYPE_CHECKING:
    from coder.redact import Redactor


@dataclass(frozen=True)
class Edit:
    """The taskfile on disk differs from the run's copy."""

    path: Path
    task: taskfile.Task  # the file's version, with the run's id, branch and base
    differences: tuple[str, ...]  # "step s2 changed", "step s5 added", "policies changed", ...
    steps: tuple[str, ...]  # the ids of the steps that changed, were added or removed

    def todo(self, state: RunState) -> taskfile.Task:
        """The new version's steps not yet done (what preflight checks before it is taken)."""
        done = {sid for sid, r in state.steps.items() if r.status in DONE}
        return replace(self.task, steps=tuple(s for s in self.task.steps if s.id not in done))

    def summary(self) -> str:
        listed = ", ".join(self.differences[:5])
        more = f" and {len(self.differences) - 5} more" if len(self.differences) > 5 else ""
        return f"the taskfile {self.path} changed since the run started ({listed}{more})"


def taskfile_path(manifest: Manifest, root: Path, given: str | None) -> Path | None:
    """The file to compare with: the one given, else the one the run started from (a relative
    path recorded by an older coder is read from the repository's root)."""
    recorded = given or manifest.taskfile
    if not recorded:
        return None
    path = Path(recorded)
    return path if path.is_absolute() or given else root / path


def compare(manifest: Manifest, current: taskfile.Task, path: Path) -> Edit | None:
    """The file at `path` against the run's task (None when they agree). InvalidInput when it
    does not load, or names another id, branch or base than the run's."""
    new = taskfile.load(path)
    origin = manifest.origin or {}  # a fork's taskfile names the run it was forked from
    for field in ("id", "branch", "base"):
        declared = new.source.get(field)
        if declared is not None and declared not in (getattr(current, field), origin.get(field)):
            raise InvalidInput(
                f"the taskfile {path} sets {field} {declared!r}, but run {current.id} has "
                f"{field} {getattr(current, field)!r}; a run keeps its {field}",
                hint=f"restore `{field}` in the taskfile, or start a new run from it",
            )
    new = replace(
        new,
        id=current.id,
        branch=current.branch,
        base=current.base,
        model=new.model or current.model,
        created_at=current.created_at,
    )
    new = chosen_kept(new, current)  # `coder run --candidates N` stays the run's
    old_steps = {s.id: s for s in current.steps}
    new_steps = {s.id: s for s in new.steps}
    differences = []
    ids = []
    for sid in dict.fromkeys([*old_steps, *new_steps]):
        if sid not in new_steps:
            differences.append(f"step {sid} removed")
        elif sid not in old_steps:
            differences.append(f"step {sid} added")
        elif old_steps[sid] != new_steps[sid]:
            differences.append(f"step {sid} changed")
        else:
            continue
        ids.append(sid)
    for field in ("title", "model", "spec", "policies", "success"):
        if getattr(new, field) != getattr(current, field):
            differences.append(f"{field} changed")
    if not differences:
        return None
    return Edit(path, new, tuple(differences), tuple(ids))


def check_done_unchanged(edit: Edit, state: RunState) -> None:
    """Refuse (InvalidInput) when a step that will not run again differs in the new version."""
    for sid in edit.steps:
        record = state.steps.get(sid)
        if record is None or record.status not in DONE:
            continue
        what = f"its commit {record.commit[:8]}" if record.commit else f"it was {record.status}"
        first = next(iter(state.steps)) == sid  # nothing to roll back to before it
        back = (
            ""
            if first
            else f", roll the run back before it with `coder revert -t {edit.task.id} "
            "--to-step STEP`"
        )
        raise InvalidInput(
            f"step {sid} of run {edit.task.id} is done ({what}), and the taskfile "
            f"{edit.path} changes it; the new version can only change steps not yet done",
            hint=f"undo the change to {sid}{back}, or start again with `coder clean -t "
            f"{edit.task.id}`",
        )


def take(
    edit: Edit, state: RunState, manifest: Manifest, manifest_path: Path, redactor: Redactor
) -> Manifest:
    """Make the new version the run's: the manifest (its task with the secrets `redactor`
    knows left out), then the checkpoint's steps (the caller saves it). Returns the new
    manifest."""
    stored = stored_task(edit.task.to_dict(), redactor)
    manifest = replace(manifest, doc=stored, taskfile=str(edit.path.resolve()))
    write_path(manifest_path, manifest)
    align(state, edit.task)
    for sid in edit.steps:
        if sid in state.steps:
            state.steps[sid].reasons.append(
                f"its definition changed in {edit.path.name}; runs with the new version"
            )
    return manifest


def align(state: RunState, task: taskfile.Task) -> None:
    """The checkpoint's steps in the task's order: a step new to it pending, a step the task
    no longer has dropped (only one never done; a done step is never dropped)."""
    ids = {s.id for s in task.steps}
    missing = [s for s, r in state.steps.items() if (r.status in DONE or r.commit) and s not in ids]
    if missing:
        raise InvalidInput(
            f"step {missing[0]} of run {task.id} is done but no longer in its task",
            hint=f"start again with `coder clean -t {task.id}`",
        )
    state.steps = {s.id: state.steps.get(s.id) or StepRecord() for s in task.steps}


def load_or_warn(
    manifest: Manifest, current: taskfile.Task, root: Path, given: str | None, *, keep: bool
) -> tuple[Edit | None, str | None]:
    """The edit to take and a warning: with `given` (--taskfile) a problem is an error;
    without, it is a warning and the run keeps its own copy. An edit found without either
    `given` or `keep` (--ignore-edits) is refused: TaskfileEdited."""
    path = taskfile_path(manifest, root, given)
    if path is None:
        if given is not None:
            raise InvalidInput(
                f"run {current.id} does not record the taskfile it started from",
                hint="name it: `coder resume -t ID -f FILE`",
            )
        return None, None
    if given is None and not path.is_file():
        return None, None  # moved or deleted since: nothing to compare with
    try:
        edit = compare(manifest, current, path)
    except CoderError as exc:
        if given is not None:
            raise
        return None, f"{exc.message}; resuming with the run's own copy of the task"
    if edit is None or given is not None:
        return edit, None
    if not keep:
        raise TaskfileEdited(edit.summary(), current.id, edit.differences)
    return None, f"{edit.summary()}; resuming with the run's own copy of the task"
