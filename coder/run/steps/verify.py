"""What the executor's verify stage checks after a step acted, before its commit.

Each check takes a `Verification` (what the step was and where it worked) and returns its
problems; a step with any problem fails, with all of them. Adding a check is a function here and
one line in CHECKS. Around every step, `coder.git.guard.GitGuard` keeps `.git` the executor's
own (a step that changed .git/config, .git/hooks, its worktree's `.git` file or its admin dir's
HEAD fails, and the originals are put back; a step that added an entry to the repository's
shared `refs/stash` fails too, and its own entries are dropped).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from coder.errors import EnvironmentProblem, NotRegular
from coder.files import safeio
from coder.files.realpath import realpath
from coder.git import diffs, submodules, trees
from coder.git.repository import open_worktree
from coder.git.staging import stage
from coder.policy.paths import naming, protected_changes, resolve_inside
from coder.run.steps import StepOutcome
from coder.taskfile import Assertion

if TYPE_CHECKING:
    from coder.git.guard import GitGuard
    from coder.git.repository import Repo
    from coder.git.staging import Staged
    from coder.run.settings import RunSettings
    from coder.taskfile import Step


def verify(seen: Verification, outcome: StepOutcome, guard: GitGuard, task_id: str) -> StepOutcome:
    """The one verify stage, between act and commit. .git is put back whatever the step did; a
    step that acted successfully then passes every check in CHECKS (on its changes, staged
    once: `seen.staged`), or fails with all their problems. The worktree's `.git` file deleted
    meanwhile is not the step's failure but the run's environment (as its worktree deleted is,
    coder.run.filesgone): it is put back, and the run stops as `error`."""
    unlinked = not os.path.lexists(seen.workdir / ".git")
    touched = guard.restore()
    if unlinked:
        raise EnvironmentProblem(
            f"the `.git` file of worktree {seen.workdir} was deleted while step "
            f"{seen.step.id} ran (coder wrote it back)",
            hint=f"`coder resume -t {task_id}` runs the step again",
        )
    stashed = guard.drop_stashes()
    if touched or stashed:
        changed = [
            f"the step changed {', '.join(guard.describe(touched))}; .git "
            "belongs to coder's executor (the original was restored)"
        ]
        return StepOutcome(False, "; ".join(changed * bool(touched) + stashed))
    if not outcome.ok:
        return outcome
    problems = [problem for check in CHECKS for problem in check(seen)]
    if problems:
        return StepOutcome(False, "; ".join(problems), tests=outcome.tests)
    return outcome


class Verification:
    """What a check sees: the step, its working directory (where it started from commit
    `base`) and the run's settings."""

    def __init__(self, step: Step, workdir: Path, settings: RunSettings, base: str) -> None:
        self.step, self.workdir, self.settings, self.base = step, workdir, settings, base

    @functools.cached_property
    def repo(self) -> Repo:
        """The worktree's repository, opened once for the checks and the commit: no command
        runs there between them, and its admin files were put back before (the git guard)."""
        return open_worktree(self.workdir)

    @functools.cached_property
    def staged(self) -> Staged:
        """The step's changes, staged (once, for every check that asks and for the commit),
        held in memory for the commit (`stage(hold=True)`): one that fails is discarded
        without writing them."""
        return stage(self.workdir, self.base, repo=self.repo, hold=True)

    @property
    def changed(self) -> list[str]:
        """The paths the step changed."""
        return self.staged.paths


def asserts_hold(seen: Verification) -> list[str]:
    """The step's `assert` list."""
    return failed_asserts(seen.step.asserts, seen.workdir)


def protected_paths_untouched(seen: Verification) -> list[str]:
    """A problem for each protected path the step changed without naming it in `changes`,
    by its name or by a name a symlink of the worktree gives it."""
    changed = set(seen.changed)
    links = (trees.committed_links(seen.workdir, repo=seen.repo) - changed) | {
        rel for rel in changed if os.path.islink(seen.workdir / rel)
    }
    return protected_changes(
        seen.changed, naming(seen.settings.policy, seen.step.changes), seen.workdir, sorted(links)
    )


def diff_within_caps(seen: Verification) -> list[str]:
    """`policies.max_diff_lines` (lines added plus removed) and `policies.max_files_changed`:
    a step over either fails with the figures, before its commit."""
    policies = seen.settings.policies
    max_lines, max_files = policies.max_diff_lines, policies.max_files_changed
    problems = []
    if max_files is not None and len(seen.changed) > max_files:
        problems.append(
            f"the step changed {len(seen.changed)} files, more than policies.max_files_changed "
            f"({max_files})"
        )
    if max_lines is not None and seen.changed:
        added, removed = diff_lines(diffs.changes_patch(seen.repo, seen.staged.changes))
        if added + removed > max_lines:
            problems.append(
                f"the step changed {added + removed} lines (+{added} -{removed}), more than "
                f"policies.max_diff_lines ({max_lines})"
            )
    return problems


def diff_lines(patch: str) -> tuple[int, int]:
    """(added, removed) lines of a unified diff."""
    added = removed = 0
    header = True  # between `diff --git` and the first hunk: ---/+++ are file names
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            header = True
        elif line.startswith("@@"):
            header = False
        elif not header and line.startswith("+"):
            added += 1
        elif not header and line.startswith("-"):
            removed += 1
    return added, removed


def submodules_unchanged(seen: Verification) -> list[str]:
    """A problem for each submodule the step changed: its work would not be committed."""
    return [
        f"the step changed the submodule {path}/; coder commits only this repository, so "
        "that work would be lost (change the submodule in its own repository)"
        for path in submodules.changed_submodules(seen.workdir, repo=seen.repo)
    ]


CHECKS: tuple[Callable[[Verification], list[str]], ...] = (
    asserts_hold,
    protected_paths_untouched,
    diff_within_caps,
    submodules_unchanged,
)


def failed_asserts(asserts: tuple[Assertion, ...], workdir: Path) -> list[str]:
    failures = []
    for a in asserts:
        problem = _assert_problem(a, workdir)
        if problem:
            failures.append(f"assert {a.type} {a.path}: {problem}")
    return failures


def _assert_problem(a: Assertion, workdir: Path) -> str | None:
    """Why the assertion does not hold, or None. What a command left at the path is looked at,
    never through: a symlink resolves inside the worktree only, and a FIFO, socket or device
    is named, not opened (reading a FIFO would block the run forever)."""
    rel = None if os.path.isabs(a.path) else resolve_inside(workdir, a.path)
    if rel is None:
        return "the path leads outside the worktree"
    path = Path(realpath(workdir), rel)
    try:
        mode: int | None = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"cannot look at it ({exc.strerror})"
    if a.type == "file_not_exists":
        return None if mode is None else "the file exists"
    if mode is None:
        return "no such file"
    if not stat.S_ISREG(mode):
        return f"it is {safeio.file_kind(mode)}, not a regular file"
    if a.type == "file_exists" or a.contains is None:
        return None
    try:
        found = safeio.contains(path, a.contains.encode("utf-8"), follow=False)
    except NotRegular as exc:
        return f"it is {exc.kind}, not a regular file"
    except OSError as exc:
        return f"cannot read the file ({exc.strerror})"
    return None if found else f"{a.contains!r} not found"
