"""What a run leaves out: it starts from a commit, so edits not yet committed in the user's
checkout are not part of it (said before it starts, never silently)."""

from __future__ import annotations

import os
from pathlib import Path

from coder.display import listed
from coder.errors import CoderError
from coder.git import branches, repository, workdir
from coder.git.repository import Repo

SHOWN = 5  # file names in the note


def left_out(repo: Repo, base: str, taskfile: Path) -> list[str]:
    """The uncommitted changes of the checkout that a run from `base` would not see: none
    when `base` is not the branch checked out; the taskfile itself aside (it is read from the
    disk)."""
    try:
        if base != branches.current_branch(repo):
            return []
    except CoderError:  # a detached HEAD: the run's base is another commit anyway
        return []
    root = repository.repo_root(repo)
    own = Path(os.path.relpath(taskfile.resolve(), root.resolve())).as_posix()
    return [rel for rel in workdir.changed_paths(root) if rel != own]


def note(files: list[str]) -> str:
    names = listed(files, SHOWN)
    return (
        f"the run starts from your last commit; {len(files)} uncommitted "
        f"change{'s' * (len(files) != 1)} in your checkout {'are' if len(files) != 1 else 'is'} "
        f"not part of it: {names} (commit them first to include them)"
    )
