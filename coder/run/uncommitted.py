"""What a run leaves out: it starts from a commit, so edits not yet committed in the user's
checkout are not part of it (said before it starts, never silently)."""

from __future__ import annotations

import os
from pathlib import Path

from coder import taskfile
from coder.errors import CoderError
from coder.git import branches, repository, workdir

SHOWN = 5  # file names in the note


def left_out(cwd: Path, path: Path) -> list[str]:
    """The uncommitted changes of the checkout at `cwd` that a run of the taskfile at `path`
    would not see, the taskfile itself aside (it is read from the disk): none when the run
    starts from another branch than the one checked out (or when the taskfile or repository
    cannot be read: starting the run reports that)."""
    try:
        repo = repository.open_repo(cwd)
        base = taskfile.load(path).base
        if base is not None and base != branches.current_branch(repo):
            return []
        root = repository.repo_root(repo)
        changed = workdir.changed_paths(root)
    except CoderError:
        return []
    own = Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()
    return [rel for rel in changed if rel != own]  # the taskfile is read from the disk


def note(files: list[str]) -> str:
    more = len(files) - SHOWN
    names = ", ".join(files[:SHOWN]) + (f" and {more} more" if more > 0 else "")
    return (
        f"Note: the run starts from your last commit; {len(files)} uncommitted "
        f"change{'s' * (len(files) != 1)} in your checkout {'are' if len(files) != 1 else 'is'} "
        f"not part of it: {names} (commit them first to include them)"
    )
