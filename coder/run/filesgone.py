"""The attempt's one "files gone" check: a run's own files deleted under it by hand.

The executor asks before each attempt starts, after it acted, when a checkpoint write fails,
and when an OSError ends an attempt midway: `.coder/`, the manifest, the checkpoint, the
worktree (or the step's scratch worktree) gone stops the run as `error` with RunFilesGone,
naming everything that vanished and the way back."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from coder.errors import RunFilesGone, display_path
from coder.run.manifest import manifest_path

if TYPE_CHECKING:
    from coder.run.context import RunContext


def check(run: RunContext, workdir: Path | None = None, *, assume_state: bool = False) -> None:
    """RunFilesGone when the run's own files were deleted under it: `.coder/`, the manifest,
    the checkpoint (assumed gone with `assume_state`), the worktree (or the scratch worktree
    `workdir`), named in one error with the way back."""
    task_id = run.task.id
    manifest, state = manifest_path(run.coder_dir, task_id), run.store.path(task_id)
    if not run.coder_dir.is_dir():
        gone = [run.coder_dir]
    else:
        places = dict.fromkeys([run.worktree, workdir or run.worktree])
        gone = [p for p in (manifest, state) if not p.is_file()]
        gone += [w for w in places if not w.is_dir()]
        if assume_state and state not in gone:
            gone.append(state)
    if not gone:
        return
    if run.coder_dir in gone or {manifest, state} <= set(gone):
        taskfile = run.manifest.taskfile or "TASKFILE"
        hint = (
            f"`coder resume -t {task_id} -f {taskfile}` rebuilds the run from the taskfile "
            "and the commits on its branch"
        )
    elif manifest in gone or state in gone:
        hint = f"`coder resume -t {task_id}` rebuilds what is missing"
    else:
        hint = f"`coder resume -t {task_id}` checks the worktree out again from the branch"
    named = ", ".join(display_path(p) for p in gone)
    raise RunFilesGone(f"deleted while run {task_id} was running: {named}", hint=hint) from None
