"""What a run does with the edits not yet committed in the user's checkout: by default it
starts from a commit and leaves them out (said before it starts, never silently); with
`coder run --include-uncommitted` they become the run's first commit on its branch
(`coder.git.snapshot`), the checkout itself left as it is.

The checkout is read under `coder.run.lock.CheckoutLock`, which `coder merge` holds while it
moves a base branch and brings the checkout along: a run never takes a merge's half-written
files (HEAD moved, files not yet) as the user's changes, which would undo the merge when the
run lands. The run starts from the commit the checkout is at then (its base branch's tip).

That commit carries `Coder-Task: ID` and `Coder-Checkout: uncommitted` (no `Coder-Step`: it is
no step's), and the run's manifest and checkpoint name it (`checkout_commit`): `coder revert
--to-step` never goes below it, the squash merge and the report count it as the run's work.
Protected paths (`.env*`, keys, coder.config.json, ...) stay out of it, as out of any step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from coder.config import PROJECT_FILE
from coder.display import listed
from coder.errors import CoderError, InvalidInput
from coder.git import branches, repository, snapshot, workdir
from coder.git.repository import Repo
from coder.policy.commands import Policy
from coder.policy.paths import is_protected
from coder.project import TASKS_DIR
from coder.run.lock import CheckoutLock

SHOWN = 5  # file names in the note


@dataclass(frozen=True)
class Included:
    base_commit: str  # the base branch's tip when the checkout was read: the run's base
    commit: str | None  # None: nothing recordable was left uncommitted
    paths: tuple[str, ...] = ()  # what the commit changes
    protected: tuple[str, ...] = ()  # left out: protected paths
    unrecordable: tuple[str, ...] = ()  # left out: nested repositories, fifos, submodules


def left_out(repo: Repo, base: str, taskfile: Path) -> list[str]:
    """The uncommitted changes a run from `base` would not see, as its start says them:
    coder's own inputs aside, which it reads from the disk, committed or not (the other
    taskfiles in `tasks/`, coder.config.json: a new user's first runs named them every
    time)."""
    tasks = f"{TASKS_DIR}/"
    changed = uncommitted(repo, base, taskfile)
    return [rel for rel in changed if rel != PROJECT_FILE and not rel.startswith(tasks)]


def uncommitted(repo: Repo, base: str, taskfile: Path) -> list[str]:
    """The uncommitted changes of the checkout, against `base`: none when `base` is not the
    branch checked out; the taskfile itself aside (it is read from the disk)."""
    try:
        if base != branches.current_branch(repo):
            return []
    except CoderError:  # a detached HEAD: the run's base is another commit anyway
        return []
    root = repository.repo_root(repo)
    own = Path(os.path.relpath(taskfile.resolve(), root.resolve())).as_posix()
    return [rel for rel in workdir.changed_paths(root) if rel != own]


def check_includable(repo: Repo, base: str) -> None:
    """InvalidInput unless the run's `base` is the branch checked out: the checkout's changes
    are against its HEAD, not against another branch."""
    try:
        current: str | None = branches.current_branch(repo)
    except CoderError:
        current = None
    if base != current:
        raise InvalidInput(
            f"--include-uncommitted takes the changes of your checkout, which is "
            f"{'on ' + current if current else 'at a detached HEAD'}, but the run starts "
            f"from branch {base}",
            hint=f"check out {base} first, or leave out --include-uncommitted",
        )


def include(
    repo: Repo, coder_dir: Path, taskfile: Path, *, task_id: str, base: str, policy: Policy
) -> Included:
    """The run's first commit: the checkout's uncommitted changes on top of the tip of `base`
    (the branch checked out), both read under the checkout's lock."""
    with CheckoutLock(coder_dir, holder="run", task_id=task_id):
        base_commit = branches.branch_tip(repo, base)
        if base_commit is None:
            raise InvalidInput(
                f"branch {base} no longer exists", hint=f"check out {base}, then run again"
            )
        changed = uncommitted(repo, base, taskfile)
        protected = tuple(rel for rel in changed if is_protected(rel.rstrip("/"), policy))
        wanted = [rel for rel in changed if rel not in protected]
        body = (
            f"The uncommitted changes of the checkout when run {task_id} started "
            "(`coder run --include-uncommitted`); the checkout itself was left as it was."
        )
        made = snapshot.snapshot(
            repo, repository.repo_root(repo), base_commit, wanted, task_id=task_id, body=body
        )
    if made is None:
        return Included(base_commit, None, (), protected, ())
    return Included(base_commit, made.commit, made.paths, protected, made.left_out)


def note(files: list[str]) -> str:
    names = listed(files, SHOWN)
    return (
        f"the run starts from your last commit; {len(files)} uncommitted "
        f"change{'s' * (len(files) != 1)} in your checkout {'are' if len(files) != 1 else 'is'} "
        f"not part of it: {names} (commit them first, or run with --include-uncommitted, to "
        "include them)"
    )


def included_notes(included: Included) -> list[str]:
    """What the start says of an --include-uncommitted run's first commit."""
    found = []
    if included.commit is not None:
        count = len(included.paths)
        found.append(
            f"the run's first commit {included.commit[:8]} holds {count} uncommitted "
            f"change{'s' * (count != 1)} from your checkout: {listed(list(included.paths), SHOWN)}"
            " (your checkout is left as it is)"
        )
    out = [*included.protected, *included.unrecordable]
    if out:
        found.append(
            f"left out of it: {listed(out, SHOWN)} (protected paths, nested repositories and "
            "special files are never committed by coder)"
        )
    return found
