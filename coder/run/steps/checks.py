"""What the executor's verify stage checks after a step acted, before its commit.

Each check takes a `Verification` (what the step was and where it worked) and returns its
problems; a step with any problem fails, with all of them. Adding a check is a function here and
one line in CHECKS. Around every step, `GitGuard` keeps `.git` the executor's own (a step that
changed .git/config, .git/hooks, its worktree's `.git` file or its admin dir's HEAD fails, and
the originals are put back; a step that added an entry to the repository's shared `refs/stash`
fails too, and its own entries are dropped).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.policy.paths import naming, protected_changes, resolve_inside
from coder.taskfile import Assertion

if TYPE_CHECKING:
    from coder.config import Config
    from coder.policy.commands import Policy
    from coder.taskfile import Step, Task


class Verification:
    """What a check sees: the step, its working directory, the run's policy and config."""

    def __init__(
        self, task: Task, step: Step, workdir: Path, policy: Policy, config: Config
    ) -> None:
        self.task, self.step, self.workdir = task, step, workdir
        self.policy, self.config = policy, config

    @functools.cached_property
    def changed(self) -> list[str]:
        """The paths the step changed (computed once, for every check that asks)."""
        from coder.git import ops as gitops

        return gitops.changed_paths(self.workdir)


def asserts_hold(seen: Verification) -> list[str]:
    """The step's `assert` list."""
    return failed_asserts(seen.step.asserts, seen.workdir)


def protected_paths_untouched(seen: Verification) -> list[str]:
    """A problem for each protected path the step changed without naming it in `changes`,
    by its name or by a name a symlink of the worktree gives it."""
    from coder.git import ops as gitops

    changed = set(seen.changed)
    links = (gitops.committed_links(seen.workdir) - changed) | {
        rel for rel in changed if os.path.islink(seen.workdir / rel)
    }
    return protected_changes(
        seen.changed, naming(seen.policy, seen.step.changes), seen.workdir, sorted(links)
    )


def diff_within_caps(seen: Verification) -> list[str]:
    """`policies.max_diff_lines` (lines added plus removed) and `policies.max_files_changed`:
    a step over either fails with the figures, before its commit."""
    policies = seen.task.policies
    max_lines, max_files = policies.get("max_diff_lines"), policies.get("max_files_changed")
    problems = []
    if max_files is not None and len(seen.changed) > max_files:
        problems.append(
            f"the step changed {len(seen.changed)} files, more than policies.max_files_changed "
            f"({max_files})"
        )
    if max_lines is not None and seen.changed:
        from coder.git import ops as gitops

        patch = gitops.diff_patch(gitops.open_repo(seen.workdir), "HEAD", worktree=seen.workdir)
        added, removed = diff_lines(patch)
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
    from coder.git import ops as gitops

    return [
        f"the step changed the submodule {path}/; coder commits only this repository, so "
        "that work would be lost (change the submodule in its own repository)"
        for path in gitops.changed_submodules(seen.workdir)
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
    from coder import safeio
    from coder.errors import NotRegular

    rel = None if os.path.isabs(a.path) else resolve_inside(workdir, a.path)
    if rel is None:
        return "the path leads outside the worktree"
    path = Path(os.path.realpath(workdir), rel)
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


@dataclass(frozen=True)
class GitGuard:
    """A copy of the git files a command could use to escape or to redirect the executor's
    next commit: the repository's config and hooks (read-only in the sandbox, but not with
    `sandbox: off`), and the files a sandboxed command CAN write: its worktree's `.git` file
    and its admin dir's HEAD, commondir, gitdir and config.worktree (a HEAD pointed at the
    base branch would make the step commit land there). A step that changed them fails; the
    originals return.

    Which files are watched is fixed when the guard is taken, from the `.git` file as coder
    made it: a rewritten `.git` file cannot aim the restore at another repository's files.
    Nothing is followed: a file replaced by a symlink (or a directory, a fifo) counts as
    changed, and the restore removes it and writes the original in its place, never through
    it.

    `refs/stash` is the repository's, shared by its worktrees: with `sandbox: off` a step's
    `git stash` lands there, and the user's next `git stash pop` would apply the step's work.
    Putting the old refs/stash back would lose stashes the user made meanwhile, so only the
    entries the step added are dropped (`drop_stashes`): new since the guard was taken, made
    on the step's worktree (the stash names its branch, "(no branch)" where its HEAD was
    detached, and its parent is the commit the step started from); any other new entry is
    left, with the exact `git stash drop` command."""

    common_dir: Path
    watched: tuple[Path, ...]
    saved: dict[Path, _Content]
    stashes: frozenset[str] = frozenset()  # the commit ids of refs/stash's entries
    on: tuple[str, str] | None = None  # the worktree's (branch or "(no branch)", HEAD commit)

    @classmethod
    def take(cls, common_dir: Path, workdir: Path | None = None) -> GitGuard:
        watched = _watched(common_dir, workdir)
        stashes = frozenset(s.commit_id for s in _stash_list(common_dir))
        on = _worktree_head(workdir) if workdir is not None else None
        return cls(common_dir, watched, _snapshot(common_dir, watched), stashes, on)

    def changes(self) -> list[Path]:
        now = _snapshot(self.common_dir, self.watched)
        return sorted(k for k in self.saved.keys() | now.keys() if self.saved.get(k) != now.get(k))

    def describe(self, paths: list[Path]) -> list[str]:
        """`.git/config`-style names for messages."""
        base = self.common_dir.parent
        return [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in paths]

    def restore(self) -> list[Path]:
        """Put back what changed; returns it."""
        changed = self.changes()
        for path in changed:
            _replace(path, self.saved.get(path))
        return changed

    def drop_stashes(self) -> list[str]:
        """Drop the refs/stash entries the step added; a problem for each new entry (empty:
        none), naming what was dropped, or the `git stash drop` command for one that may not
        be the step's."""
        import pygit2

        problems: list[str] = []
        repo = pygit2.Repository(str(self.common_dir))
        added = [s for s in _stash_list(self.common_dir) if s.commit_id not in self.stashes]
        left = []
        for entry in added:  # the step's first: the commands name the indices after the drops
            message = entry.message.strip()
            index = _stash_index(self.common_dir, entry.commit_id)
            if index is not None and self._made_here(repo, entry.commit_id, message):
                repo.stash_drop(index)
                problems.append(
                    f"the step added stash entry {message!r} to the repository's shared "
                    "refs/stash (a `git stash` with `sandbox: off`); coder dropped it, the "
                    "other stash entries are as they were"
                )
            else:
                left.append(entry)
        for entry in left:
            index = _stash_index(self.common_dir, entry.commit_id)
            if index is None:
                continue  # dropped meanwhile
            problems.append(
                f"stash entry stash@{{{index}}} ({entry.message.strip()!r}) was added to the "
                "repository's shared refs/stash while the step ran and may be the step's (a "
                "`git stash` with `sandbox: off`): if it is not yours, drop it with "
                f"`git stash drop stash@{{{index}}}` (check `git stash list` first)"
            )
        return problems

    def _made_here(self, repo: Any, commit_id: Any, message: str) -> bool:
        if self.on is None:
            return False
        branch, head = self.on
        try:
            parents = [str(p) for p in repo[commit_id].parent_ids]
        except (KeyError, ValueError):
            return False
        named = message.startswith((f"WIP on {branch}: ", f"On {branch}: "))
        return named and parents[:1] == [head]


def _stash_list(common_dir: Path) -> list[Any]:
    """refs/stash's entries, newest first (pygit2 Stash: commit_id, message)."""
    import pygit2

    try:
        return list(pygit2.Repository(str(common_dir)).listall_stashes())
    except pygit2.GitError:
        return []


def _stash_index(common_dir: Path, commit_id: Any) -> int | None:
    for index, entry in enumerate(_stash_list(common_dir)):
        if entry.commit_id == commit_id:
            return index
    return None


def _worktree_head(workdir: Path) -> tuple[str, str] | None:
    """(the branch checked out at `workdir`, or "(no branch)", the commit of its HEAD), as
    `git stash` names them in an entry's message and parents."""
    import pygit2

    try:
        repo = pygit2.Repository(str(workdir))
        head = str(repo.head.target)
        branch = "(no branch)" if repo.head_is_detached else repo.head.shorthand
    except (pygit2.GitError, KeyError, ValueError):
        return None
    return branch, head


_Content = tuple[bytes, int]  # a regular file's bytes and permission bits
_NOT_A_FILE: _Content = (b"", -1)  # a symlink, directory, fifo, ...: never read through


def _watched(common_dir: Path, workdir: Path | None) -> tuple[Path, ...]:
    paths = [common_dir / "config"]
    gitfile = None if workdir is None else workdir / ".git"
    found = None if gitfile is None else _read(gitfile)
    if gitfile is not None and found is not None and found != _NOT_A_FILE:
        paths.append(gitfile)
        text = found[0].decode("utf-8", errors="replace").strip()
        admin = Path(os.path.realpath(gitfile.parent / text.removeprefix("gitdir:").strip()))
        if admin.parent == Path(os.path.realpath(common_dir / "worktrees")):
            # config.worktree: read by git and libgit2 when the repository sets
            # extensions.worktreeConfig; a command's `core.worktree` there would redirect
            # coder's own checkouts, its `core.fsmonitor` run a program
            paths += [admin / n for n in ("HEAD", "commondir", "gitdir", "config.worktree")]
    return tuple(paths)


def _snapshot(common_dir: Path, watched: tuple[Path, ...]) -> dict[Path, _Content]:
    out = {}
    for path in (*watched, *sorted((common_dir / "hooks").glob("*"))):
        content = _read(path)
        if content is not None:
            out[path] = content
    return out


def _read(path: Path) -> _Content | None:
    """The file's content, _NOT_A_FILE for anything but a regular file, None if absent."""
    from coder import safeio

    try:
        fd = safeio.open_regular(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink, fifo, device, socket (none opened), unreadable
        return _NOT_A_FILE
    with os.fdopen(fd, "rb") as file:
        return file.read(), stat.S_IMODE(os.fstat(fd).st_mode)


def _replace(path: Path, content: _Content | None) -> None:
    """Remove whatever is at `path` now (without following it) and write `content` there as a
    new file, if it was a regular file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if content is None or content == _NOT_A_FILE:
        return
    data, mode = content
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, mode)
        file.write(data)
