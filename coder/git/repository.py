"""Opening a repository or one of coder's worktrees, where its roots are, who commits.

* **The user's checkout is never touched.** A run works in a linked worktree on its own
  branch; nothing in ``coder.git`` writes the main checkout's index, HEAD or files
  (``ensure_excluded`` only appends to ``<common dir>/info/exclude``), and ``open_worktree``
  opens exactly the directory it is given, never the checkout above it.
* Every failure to open is one actionable line (``environment_error``). libgit2 limits to
  keep in mind (see APIS.md §3): no hooks, no sha256 or sparse-index repositories,
  ``GIT_AUTHOR_*`` variables ignored (``identity`` reads them itself).

``Repo`` is the handle the other layers pass back to ``coder.git``'s functions; they never
look inside it.
"""

from __future__ import annotations

import os
import re
import stat
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeVar

import pygit2

from coder.errors import EnvironmentProblem
from coder.files import safeio
from coder.files.realpath import realpath

Repo: TypeAlias = pygit2.Repository


CODER_DIR = ".coder"
FALLBACK_NAME = "coder"
FALLBACK_EMAIL = "coder@localhost"

_T = TypeVar("_T")


def open_repo(path: Path) -> Repo:
    """Open the repository containing ``path`` (searching upward), or explain why not."""
    path = Path(path).absolute()
    try:
        gitdir = pygit2.discover_repository(str(path))
    except (pygit2.GitError, OSError) as exc:
        raise environment_error(exc, path) from None
    if gitdir is None:
        raise EnvironmentProblem(
            f"not a git repository: {path}",
            hint="run `git init` or run coder inside a repository",
        )
    where = Path(gitdir).parent if Path(gitdir).name == ".git" else Path(gitdir)
    try:
        repo = pygit2.Repository(gitdir)
    except (pygit2.GitError, OSError) as exc:
        raise environment_error(exc, where) from None
    if repo.is_bare:
        raise EnvironmentProblem(
            f"{gitdir.rstrip('/')} is a bare repository; coder needs a working tree",
            hint="clone it (`git clone REPO DIR`) and run coder inside the clone",
        )
    try:
        repo.index  # noqa: B018 - reading the index is where a sparse index fails
    except (pygit2.GitError, OSError) as exc:
        raise environment_error(exc, Path(repo.workdir)) from None
    return repo


def admin_text(path: Path) -> str:
    """A small git admin file (HEAD, commondir, gitdir, a worktree's `.git`) as text, never
    blocking on what a command left there (a FIFO) nor read through a link."""
    return safeio.read_regular(path, limit=1 << 16, follow=False).decode("utf-8", "replace").strip()


def environment_error(exc: Exception, where: Path) -> EnvironmentProblem:
    """Turn a libgit2 failure to open/read a repository into one actionable line."""
    text = str(exc)
    if "sha256" in text:
        return EnvironmentProblem(
            f"{where} uses sha256 object format, which libgit2 cannot open yet",
            hint="coder needs a sha1 repository (`git init --object-format=sha1`)",
        )
    if "sdir" in text:
        return EnvironmentProblem(
            f"{where} uses a sparse index, which libgit2 cannot read "
            "(unsupported mandatory extension 'sdir')",
            # Not `git config index.sparse false`: sparse-checkout sets it per worktree
            # (extensions.worktreeConfig), where the repo-level value does not override it.
            hint="run `git sparse-checkout disable`, or `git sparse-checkout init "
            "--no-sparse-index` to keep the sparse checkout with a full index",
        )
    if "not owned by current user" in text:
        return EnvironmentProblem(
            f"{where} is owned by another user and git's safe.directory check refuses it",
            hint=f"run `git config --global --add safe.directory {where}`",
        )
    if "extension" in text:
        return EnvironmentProblem(
            f"{where}: {text}", hint="libgit2 cannot read this repository format"
        )
    return EnvironmentProblem(f"cannot open git repository at {where}: {text}")


def open_worktree(worktree: Path, *, writing: bool = True) -> Repo:
    """Open exactly the working tree at ``worktree``: no upward search, because a deleted
    worktree directory that reappeared empty would otherwise resolve to the user's main
    checkout, and a reset there would destroy their work. Writers also insist on a linked
    worktree (coder never writes the main checkout)."""
    _check_admin_files(Path(worktree))
    try:
        w = pygit2.Repository(str(worktree), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, OSError) as exc:
        if "not found" in str(exc):
            raise EnvironmentProblem(
                f"worktree {worktree} is missing or not a git worktree",
                hint="`coder resume` re-creates it from the branch",
            ) from None
        raise environment_error(exc, Path(worktree)) from None
    if w.workdir is None or realpath(w.workdir) != realpath(worktree):
        raise EnvironmentProblem(f"{worktree} is not the root of a git working tree")
    if writing and not (Path(w.path) / "commondir").is_file():
        raise EnvironmentProblem(
            f"{worktree} is a main checkout, not one of coder's worktrees; coder never writes there"
        )
    return w


def _check_admin_files(worktree: Path) -> None:
    """libgit2 opens a worktree through files its commands can replace (its `.git` file, the
    admin dir's HEAD, commondir, gitdir): one replaced by a FIFO would hang it, so each must
    be a regular file, or the worktree is refused (the git guard restores them after each
    step; this is what a runner killed before the guard ran leaves behind)."""
    dotgit = worktree / ".git"
    try:
        if not stat.S_ISREG(os.lstat(dotgit).st_mode):
            return  # a directory (a main checkout) or a link: libgit2 says what is wrong
        admin = worktree / admin_text(dotgit).removeprefix("gitdir:").strip()
        for name in ("HEAD", "commondir", "gitdir"):
            mode = os.lstat(admin / name).st_mode
            if not stat.S_ISREG(mode):
                raise EnvironmentProblem(
                    f"{admin / name} is {safeio.file_kind(mode)}, not the file git made: "
                    f"a command replaced the worktree's git files",
                    hint="remove the run's worktree with `coder clean --force` (its committed "
                    "steps stay on the branch)",
                )
    except OSError:
        return  # missing: opening says what is wrong


def git_failure(exc: Exception, doing: str, worktree: Path) -> EnvironmentProblem:
    """An unexpected libgit2 failure while changing a worktree, as one actionable line."""
    text = str(exc)
    lock = re.search(r"'([^']+\.lock)'", text)
    hint = (
        f"if no git process is running, delete the stale lock file {lock.group(1)}"
        if lock
        else None
    )
    return EnvironmentProblem(f"cannot {doing} in {worktree}: {text}", hint=hint)


def common_dir(repo: Repo) -> Path:
    """The git dir shared by all worktrees (``.git`` of the main checkout). Read once per
    repository object (a step asks a few times, of the repository it opened)."""
    found = _COMMON_DIRS.get(repo)
    if found is None:
        gitdir = Path(repo.path)
        link = gitdir / "commondir"  # only linked worktrees have it; git writes it relative
        found = Path(realpath(gitdir / admin_text(link) if link.is_file() else gitdir))
        _COMMON_DIRS[repo] = found
    return found


_COMMON_DIRS: weakref.WeakKeyDictionary[Repo, Path] = weakref.WeakKeyDictionary()


def repo_root(repo: Repo) -> Path:
    """The main working tree's root, also when ``repo`` was opened inside a linked worktree."""
    common = common_dir(repo)
    if Path(repo.path).resolve() == common:
        workdir = repo.workdir
    else:
        workdir = pygit2.Repository(str(common), pygit2.enums.RepositoryOpenFlag.NO_SEARCH).workdir
    if workdir is None:
        raise EnvironmentProblem(f"{common} is a bare repository; coder needs a working tree")
    return Path(workdir).resolve()


@dataclass(frozen=True)
class Identity:
    """Who a commit is by, as git decides it."""

    author: pygit2.Signature
    committer: pygit2.Signature
    fallback: bool  # nothing named anyone: both are coder <coder@localhost> (callers warn)


def identity(repo: Repo) -> Identity:
    """The author and committer `git commit` would use: `GIT_AUTHOR_NAME`/`_EMAIL` and
    `GIT_COMMITTER_NAME`/`_EMAIL` first (libgit2 ignores them; CI sets them), then
    `author.*`/`committer.*` and `user.*` in git config, else ``coder <coder@localhost>``.
    (`GIT_*_DATE` is not read: commits carry the time they are made.)"""
    config = repo.config

    def setting(role: str, field: str) -> str | None:
        for key in (f"{role}.{field}", f"user.{field}"):
            try:
                value = config[key]
            except (KeyError, pygit2.GitError):
                continue
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None

    def signature(role: str) -> pygit2.Signature | None:
        upper = role.upper()
        name = os.environ.get(f"GIT_{upper}_NAME") or setting(role, "name")
        email = os.environ.get(f"GIT_{upper}_EMAIL") or setting(role, "email")
        if name is None or email is None:
            return None
        return pygit2.Signature(name, email)

    author, committer = signature("author"), signature("committer")
    if author is None or committer is None:
        fallback = pygit2.Signature(FALLBACK_NAME, FALLBACK_EMAIL)
        return Identity(author or fallback, committer or fallback, True)
    return Identity(author, committer, False)


def ensure_excluded(repo: Repo, pattern: str = "/.coder/") -> bool:
    """Add ``pattern`` to ``<common dir>/info/exclude`` (shared by all worktrees).

    The user's ``.gitignore`` is theirs and stays untouched. Returns True if it wrote.
    """
    exclude = common_dir(repo) / "info" / "exclude"
    text = exclude.read_text() if exclude.exists() else ""
    if pattern in (line.strip() for line in text.splitlines()):
        return False
    exclude.parent.mkdir(parents=True, exist_ok=True)
    prefix = "" if not text or text.endswith("\n") else "\n"
    with exclude.open("a") as fh:
        fh.write(f"{prefix}{pattern}\n")
    return True


def under_coder_dir(path: str) -> bool:
    return path == CODER_DIR or path.startswith(CODER_DIR + "/")


def clear_stale_index_lock(worktree: Path) -> bool:
    """Remove a leftover ``index.lock`` from the worktree's own git dir
    (``.git/worktrees/<name>/index.lock``); True if one was removed.

    Assumption: the caller holds coder's task lock, so no coder process is using this index.
    Nothing else should write an agent worktree's index; we only call this after an operation
    failed on the lock, so a lock that blocks nothing is never touched. The main checkout's
    lock is never touched (its ``.git`` is a directory, not a worktree's ``gitdir:`` file).
    """
    dotgit = Path(worktree) / ".git"
    if not dotgit.is_file():
        return False
    try:
        text = admin_text(dotgit)
    except OSError:
        return False
    if not text.startswith("gitdir:"):
        return False
    admin = Path(os.path.realpath(Path(worktree) / text[len("gitdir:") :].strip()))
    if admin.parent.name != "worktrees" or not (admin / "commondir").is_file():
        return False  # the `.git` file is the worktree's own: never trusted to name elsewhere
    try:
        (admin / "index.lock").unlink()
    except FileNotFoundError:
        return False
    return True


def retry_on_index_lock(worktree: Path, action: Callable[[], _T]) -> _T:
    """Run ``action``; if a stale ``index.lock`` (left by a crash) blocks it, clear and retry."""
    try:
        return action()
    except (pygit2.GitError, OSError) as exc:
        if "index is locked" not in str(exc) or not clear_stale_index_lock(worktree):
            raise
    return action()


# How long a ref update waits for a ref another git process holds locked (git waits 100 ms,
# core.filesRefLockTimeout): `git gc` holds each ref for a moment as it packs them and expires
# their reflogs, and a step's commit must not fail for that.
REF_LOCK_WAIT_S = 2.0


def retry_on_ref_lock(action: Callable[[], _T]) -> _T:
    """Run ``action``, a ref update; while a ref it locks is held by another process, try
    again, for up to ``REF_LOCK_WAIT_S``; then raise what it raised (a lock a crash left
    behind: `git_failure` names the file to delete)."""
    deadline = time.monotonic() + REF_LOCK_WAIT_S
    delay = 0.001
    while True:
        try:
            return action()
        except pygit2.GitError as exc:
            held = re.search(r"failed to (lock file|create locked file) '[^']*\.lock'", str(exc))
            if held is None or "index.lock" in held.group(0) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def retry_on_pruned_write(action: Callable[[], _T]) -> _T:
    """Run ``action``, which writes objects. libgit2 writes each to `objects/tmp_object_*`
    first, a name `git prune --expire=now` deletes (as a crashed git's leftover), as it may
    remove a fan-out directory just made: a write that lost its file that way is made again
    (a few times; then its error is raised)."""
    tries = 5
    while True:
        try:
            return action()
        except pygit2.GitError as exc:
            tries -= 1
            lost = "failed to rename lockfile to" in str(exc) and "No such file" in str(exc)
            if not lost or not tries:
                raise


def libgit2_version() -> str:
    """The version of the libgit2 that pygit2 was built with (doctor shows it)."""
    return str(pygit2.LIBGIT2_VERSION)


def checkout_root(repo: Repo) -> Path | None:
    """The root of the working tree ``repo`` was opened in; None for a bare repository."""
    return None if repo.workdir is None else Path(repo.workdir)


def is_main_checkout(repo: Repo) -> bool:
    """Whether ``repo`` was opened in the main checkout rather than a linked worktree."""
    return Path(os.path.realpath(repo.path)) == common_dir(repo)
