"""Everything coder does with git, as small functions over pygit2.

Why these shapes:

* **The user's checkout is never touched.** A run works in a linked worktree on its own
  branch; nothing here writes the main checkout's index, HEAD or files (``ensure_excluded``
  only appends to ``<common dir>/info/exclude``).
* **Git is the truth.** Each step is one commit with ``Coder-Task``/``Coder-Step``/
  ``Coder-Attempt`` trailers; ``step_commits`` reads them back to rebuild lost state.
* **Compare-and-swap on every ref move.** ``commit_step`` creates the commit *through* the
  branch ref with ``expected_tip`` as first parent, so libgit2 refuses ("current tip is not the
  first parent") if anyone moved the branch in between; ``reset_branch`` locks the ref and checks
  its old value. Either failure is ``BranchMoved``; nobody's commit is ever overwritten.
* **One walk of the tree per step.** ``staging.stage`` finds and stages a step's changes
  in one scan (the git program's, which trusts the index's stat data and keeps an untracked
  cache); the verify stage checks that change set and ``commit_step`` records its tree, so
  what was checked is what is committed.

libgit2 limits to keep in mind (see APIS.md §3): no hooks, no sha256 or sparse-index
repositories, ``GIT_AUTHOR_*`` variables ignored.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pygit2
from pygit2.enums import (
    CheckoutStrategy,
    DiffOption,
    FileStatus,
    ResetMode,
    SortMode,
)

from coder import nofollow, safeio
from coder.durable import fsync_dir, make_private_dirs
from coder.errors import BranchMoved, EnvironmentProblem, InvalidInput, RunFailed
from coder.git.staging import Change, Staged, changes, stage

CODER_DIR = ".coder"
FALLBACK_NAME = "coder"
FALLBACK_EMAIL = "coder@localhost"
TRAILER_TASK = "Coder-Task"
TRAILER_STEP = "Coder-Step"
TRAILER_ATTEMPT = "Coder-Attempt"
TRAILER_REVERTS = "Coder-Reverts"  # on `coder revert`'s commits: the step whose commit it undoes
REFLOG_REVERT = "coder: revert"  # how `coder revert`'s branch moves start in the reflog

_T = TypeVar("_T")


# --------------------------------------------------------------------------- opening


def open_repo(path: Path) -> pygit2.Repository:
    """Open the repository containing ``path`` (searching upward), or explain why not."""
    path = Path(path).absolute()
    try:
        gitdir = pygit2.discover_repository(str(path))
    except (pygit2.GitError, OSError) as exc:
        raise _environment_error(exc, path) from None
    if gitdir is None:
        raise EnvironmentProblem(
            f"not a git repository: {path}",
            hint="run `git init` or run coder inside a repository",
        )
    where = Path(gitdir).parent if Path(gitdir).name == ".git" else Path(gitdir)
    try:
        repo = pygit2.Repository(gitdir)
    except (pygit2.GitError, OSError) as exc:
        raise _environment_error(exc, where) from None
    if repo.is_bare:
        raise EnvironmentProblem(
            f"{gitdir.rstrip('/')} is a bare repository; coder needs a working tree",
            hint="clone it (`git clone REPO DIR`) and run coder inside the clone",
        )
    try:
        repo.index  # noqa: B018 - reading the index is where a sparse index fails
    except (pygit2.GitError, OSError) as exc:
        raise _environment_error(exc, Path(repo.workdir)) from None
    return repo


def _admin_text(path: Path) -> str:
    """A small git admin file (HEAD, commondir, gitdir, a worktree's `.git`) as text, never
    blocking on what a command left there (a FIFO) nor read through a link."""
    return safeio.read_regular(path, limit=1 << 16, follow=False).decode("utf-8", "replace").strip()


def _environment_error(exc: Exception, where: Path) -> EnvironmentProblem:
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


def _open_worktree(worktree: Path, *, writing: bool = True) -> pygit2.Repository:
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
        raise _environment_error(exc, Path(worktree)) from None
    if w.workdir is None or Path(w.workdir).resolve() != Path(worktree).resolve():
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
        admin = worktree / _admin_text(dotgit).removeprefix("gitdir:").strip()
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


def _git_failure(exc: Exception, doing: str, worktree: Path) -> EnvironmentProblem:
    """An unexpected libgit2 failure while changing a worktree, as one actionable line."""
    text = str(exc)
    lock = re.search(r"'([^']+\.lock)'", text)
    hint = (
        f"if no git process is running, delete the stale lock file {lock.group(1)}"
        if lock
        else None
    )
    return EnvironmentProblem(f"cannot {doing} in {worktree}: {text}", hint=hint)


def common_dir(repo: pygit2.Repository) -> Path:
    """The git dir shared by all worktrees (``.git`` of the main checkout)."""
    gitdir = Path(repo.path)
    link = gitdir / "commondir"  # only linked worktrees have it; git writes it relative
    if link.is_file():
        return (gitdir / _admin_text(link)).resolve()
    return gitdir.resolve()


def repo_root(repo: pygit2.Repository) -> Path:
    """The main working tree's root, also when ``repo`` was opened inside a linked worktree."""
    common = common_dir(repo)
    if Path(repo.path).resolve() == common:
        workdir = repo.workdir
    else:
        workdir = pygit2.Repository(str(common), pygit2.enums.RepositoryOpenFlag.NO_SEARCH).workdir
    if workdir is None:
        raise EnvironmentProblem(f"{common} is a bare repository; coder needs a working tree")
    return Path(workdir).resolve()


# --------------------------------------------------------------------------- identity, refs


def current_branch(repo: pygit2.Repository) -> str:
    """Short name of the checked-out branch; detached or unborn HEAD is an error."""
    where = repo.workdir or repo.path
    if repo.head_is_unborn:
        target = repo.lookup_reference("HEAD").target
        name = str(target).removeprefix("refs/heads/")
        raise EnvironmentProblem(
            f"branch '{name}' in {where} has no commits yet",
            hint="commit something first (`git commit --allow-empty -m init`)",
        )
    if repo.head_is_detached:
        raise EnvironmentProblem(
            f"HEAD is detached at {str(repo.head.target)[:12]} in {where}",
            hint="check out a branch first (`git switch BRANCH`)",
        )
    return str(repo.head.shorthand)


@dataclass(frozen=True)
class Identity:
    """Who a commit is by, as git decides it."""

    author: pygit2.Signature
    committer: pygit2.Signature
    fallback: bool  # nothing named anyone: both are coder <coder@localhost> (callers warn)


def identity(repo: pygit2.Repository) -> Identity:
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


def ensure_excluded(repo: pygit2.Repository, pattern: str = "/.coder/") -> bool:
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


def branch_tip(repo: pygit2.Repository, branch: str) -> str | None:
    """Hex id the branch points at, or None if it does not exist."""
    try:
        ref = repo.references.get(f"refs/heads/{branch}")
    except (pygit2.GitError, ValueError):
        return None
    return None if ref is None else str(ref.resolve().target)


def resolve_commit(repo: pygit2.Repository, rev: str) -> str:
    """Hex id of the commit ``rev`` names (branch, tag, sha, ``HEAD~2``...)."""
    try:
        return str(repo.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError):
        raise InvalidInput(
            f"unknown revision '{rev}' in {repo.workdir or repo.path}",
            hint=f"check it with `git rev-parse --verify '{rev}^{{commit}}'`",
        ) from None


def delete_branch(repo: pygit2.Repository, branch: str) -> None:
    """Delete a local branch; a missing one is fine (idempotent)."""
    ref = repo.branches.local.get(branch)
    if ref is None:
        return
    where = _checked_out_at(repo, ref.name)
    if where is not None:
        raise EnvironmentProblem(
            f"cannot delete branch '{branch}': it is checked out in {where}",
            hint="remove that worktree or switch it to another branch first",
        )
    ref.delete()


# --------------------------------------------------------------------------- worktrees


def create_worktree(
    repo: pygit2.Repository, *, name: str, path: Path, branch: str, start: str
) -> Path:
    """A worktree ``name`` at ``path`` on ``branch`` (created at ``start`` if missing).

    Re-creating works: if the branch exists it is checked out as it is (never moved), and a
    registration whose directory was deleted is pruned first. An existing healthy worktree
    with the same name, path and branch is returned unchanged.
    """
    path = Path(path).absolute()
    refname = f"refs/heads/{branch}"
    common = common_dir(repo)
    if pending_change(path) is not None:  # a checkout or removal cut short: start afresh
        remove_worktree(repo, name, path)
    _prune_stale(repo, common, name)

    if name in repo.list_worktrees():
        wt = repo.lookup_worktree(name)
        same_place = Path(wt.path).resolve() == path.resolve()
        if same_place and _head_of(common / "worktrees" / name) == refname:
            return path
        raise EnvironmentProblem(
            f"a worktree named '{name}' already exists at {wt.path}",
            hint=f"remove it with `git worktree remove {wt.path}` (or `coder clean`)",
        )
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "the directory exists and is not empty" if path.is_dir() else "a file is there"
        raise EnvironmentProblem(
            f"cannot create worktree at {path}: {what}",
            hint="move or delete it, then retry",
        )

    ref = repo.branches.local.get(branch)
    if ref is None:
        commit = repo[resolve_commit(repo, start)].peel(pygit2.Commit)
        try:
            ref = repo.branches.local.create(branch, commit)
        except (pygit2.GitError, ValueError) as exc:
            raise InvalidInput(f"cannot create branch '{branch}': {exc}") from None
    else:
        where = _checked_out_at(repo, refname)
        if where is not None:
            raise EnvironmentProblem(
                f"branch '{branch}' is already checked out in {where}",
                hint="a branch can be checked out in one worktree only: "
                "switch that checkout to another branch or remove that worktree",
            )

    make_private_dirs(path.parent)
    if path.exists():
        path.rmdir()  # empty (checked above); libgit2 insists on creating it itself
    creating = _mark(path, CREATING)
    try:
        repo.add_worktree(name, str(path), ref)
    except (pygit2.GitError, OSError) as exc:
        # libgit2 creates <common>/worktrees/<name> before failing; don't leave it behind.
        _remove_half_registration(common, name)
        raise EnvironmentProblem(f"cannot create worktree '{name}' at {path}: {exc}") from None
    init_submodules(repo, path, str(ref.target))
    os.unlink(creating)  # the checkout is complete: from now on its files are the branch's
    return path


# --- a worktree being created or removed ---------------------------------------------------
#
# A checkout of thousands of files takes seconds, their removal a moment: a kill in between
# leaves a half worktree whose missing or extra files would read as someone's uncommitted
# changes. So the worktree is marked first (`<path>.creating` or `<path>.removing`, next to it
# in `.coder/worktrees/`) and unmarked when done; whoever finds a mark finishes the job
# (`create_worktree` removes the half checkout and checks out again, `remove_worktree` removes
# what is left), and a marked worktree's files are never counted as changes.

CREATING = "creating"
REMOVING = "removing"


def _marker(path: Path, doing: str) -> Path:
    return path.with_name(f"{path.name}.{doing}")


def _mark(path: Path, doing: str) -> Path:
    """Mark ``path`` as being created or removed, durably, before the work starts."""
    marker = _marker(path, doing)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(marker, flags, 0o600))
    fsync_dir(marker.parent)
    return marker


def pending_change(path: Path) -> str | None:
    """``REMOVING`` or ``CREATING`` when coder's removal or checkout of the worktree at
    ``path`` was cut short (by a kill), else None."""
    path = Path(path).absolute()
    for doing in (REMOVING, CREATING):
        if os.path.lexists(_marker(path, doing)):
            return doing
    return None


def worktree_ready(path: Path) -> bool:
    """Whether ``path`` holds a complete worktree: checked out to the end, not half removed.
    Only then can its files differ from its branch by anyone's changes."""
    return (Path(path) / ".git").is_file() and pending_change(path) is None


# --- submodules ----------------------------------------------------------------------------
#
# libgit2 checks a submodule out as an empty directory: a step would see no files there and
# its writes into it would never be committed. So a worktree gets each submodule at the
# recorded commit, from the user's own copy of the submodule (its objects shared through
# `objects/info/alternates`, like `git clone --shared`: no copy, no network), or the run is
# refused up front naming it. Submodules of submodules likewise, at any depth. A step that
# changes a submodule fails (see `changed_submodules`): coder commits only the repository
# itself.


@dataclass(frozen=True)
class Submodule:
    path: str  # relative to the superproject's top, parents before their own submodules
    commit: str  # the commit the superproject records
    source: Path  # the user's copy of its repository (its git dir)


def _gitlinks(repo: pygit2.Repository, commit: str) -> list[tuple[str, str, str]]:
    """(name, path, recorded commit) of every submodule in ``commit``, from its .gitmodules."""
    tree = repo[commit].peel(pygit2.Tree)
    try:
        text = repo[tree[".gitmodules"].id].peel(pygit2.Blob).data.decode("utf-8", "replace")
    except KeyError:
        return []
    names: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        section = re.match(r'\s*\[\s*submodule\s+"(.*)"\s*\]', line)
        if section:
            name = section.group(1)
            continue
        setting = re.match(r"\s*path\s*=\s*(.*?)\s*$", line)
        if setting and name is not None:
            names[setting.group(1).strip('"')] = name
    found = []
    for path, name in names.items():
        try:
            entry = tree[path]
        except KeyError:
            continue
        if entry.filemode == pygit2.enums.FileMode.COMMIT:
            found.append((name, path, str(entry.id)))
    return found


def submodules(repo: pygit2.Repository, commit: str) -> list[Submodule]:
    """The submodules of ``commit``, nested ones included (each after the one that holds
    it), with where their commits are found locally; an EnvironmentProblem naming the first
    one this machine has no copy of (coder never fetches)."""
    return _submodules(repo, commit, repo_root(repo), common_dir(repo), "", repo_root(repo))


def _submodules(
    repo: pygit2.Repository, commit: str, root: Path, common: Path, prefix: str, top: Path
) -> list[Submodule]:
    """``root`` is the user's checkout of ``repo`` (it may be missing for a nested one) and
    ``common`` its git dir: a submodule's copy is checked out under the first, or kept in
    the second's ``modules/``, as `git submodule update --init --recursive` leaves them."""
    found = []
    for name, path, oid in _gitlinks(repo, commit):
        source = None
        for candidate in (root / path, common / "modules" / name):
            try:
                sub = pygit2.Repository(str(candidate), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
            except (pygit2.GitError, OSError):
                continue
            if sub.get(oid) is not None:
                source = Path(sub.path)
                break
        if source is None:
            where = prefix + path
            raise EnvironmentProblem(
                f"submodule {where} at {oid[:12]} is not in your checkout {top}: coder copies "
                "submodules from there into its worktree (it never fetches)",
                hint=(
                    f"run `git submodule update --init {where}`"
                    if not prefix
                    else "run `git submodule update --init --recursive`"
                )
                + ", then run coder again",
            )
        found.append(Submodule(prefix + path, oid, source))
        found += _submodules(sub, oid, root / path, source, f"{prefix}{path}/", top)
    return found


def init_submodules(repo: pygit2.Repository, worktree: Path, commit: str) -> None:
    """Check each submodule of ``commit`` out in ``worktree`` (detached at its commit)."""
    for sub in submodules(repo, commit):
        dest = Path(worktree) / sub.path
        try:
            if os.path.lexists(dest / ".git"):
                continue  # already there (a worktree re-created in place)
            new = pygit2.init_repository(str(dest))
            info = Path(new.path) / "objects" / "info"
            info.mkdir(parents=True, exist_ok=True)
            (info / "alternates").write_text(f"{sub.source / 'objects'}\n", encoding="utf-8")
            opened = _open_submodule(dest)
            assert opened is not None  # just made
            _reset_submodule(opened, sub.commit)
        except (pygit2.GitError, OSError) as exc:
            raise _git_failure(exc, f"check out submodule {sub.path}", Path(worktree)) from None


def _reset_submodule(sub: pygit2.Repository, commit: str) -> None:
    oid = pygit2.Oid(hex=commit)
    sub.set_head(oid)
    sub.reset(oid, ResetMode.HARD)
    _remove_untracked(sub, Path(sub.workdir))


def _stop_aiming_elsewhere(sub: pygit2.Repository) -> None:
    """Drop a ``core.worktree`` a command set in the submodule's own config: coder ignores it
    (``_open_submodule``), but the git CLI (the user's, a later command's) would follow it."""
    config = pygit2.Config(os.path.join(sub.path, "config"))
    if "core.worktree" in config:
        del config["core.worktree"]


def _open_submodule(dest: Path) -> pygit2.Repository | None:
    """The submodule checked out at ``dest``, its files at ``dest`` whatever its config says,
    or None when ``dest`` holds no repository of its own. A command may have set the
    submodule's ``core.worktree`` (aiming its files elsewhere) or replaced ``.git`` with a
    ``gitdir:`` file or a link naming another repository: coder opens only a real ``.git``
    directory, as a bare repository (so ``core.worktree`` is never read), then gives it
    ``dest`` as its working tree."""
    gitdir = Path(dest) / ".git"
    try:
        if os.path.islink(dest) or not stat.S_ISDIR(os.lstat(gitdir).st_mode):
            return None
        flags = pygit2.enums.RepositoryOpenFlag
        sub = pygit2.Repository(str(gitdir), flags.NO_SEARCH | flags.BARE)
    except (pygit2.GitError, OSError):
        return None
    sub.workdir = str(dest)
    return sub


def _checked_out_submodules(
    w: pygit2.Repository, worktree: Path, prefix: str = ""
) -> Iterator[tuple[str, Path, str]]:
    """(path from the top, directory, recorded commit) of each submodule the files of ``w``
    (at its HEAD) hold, nested ones after the one that holds them."""
    if not (Path(worktree) / ".gitmodules").is_file():
        return
    for _name, path, oid in _gitlinks(w, str(w.head.target)):
        dest = Path(worktree) / path
        yield prefix + path, dest, oid
        sub = _open_submodule(dest)
        try:
            if sub is None or str(sub.head.target) != oid:
                continue  # its own submodules are those of another commit
        except (pygit2.GitError, OSError):
            continue
        yield from _checked_out_submodules(sub, dest, f"{prefix}{path}/")


def changed_submodules(worktree: Path) -> list[str]:
    """Submodules whose files or commit a step changed: coder would not commit that work."""
    w = _open_worktree(worktree, writing=False)
    changed = []
    for path, dest, oid in _checked_out_submodules(w, worktree):
        try:
            sub = _open_submodule(dest)
            if sub is None:
                raise OSError(f"no repository at {dest}")
            own = str(sub.head.target) == oid
            # a change inside one of its own submodules is named as that one's
            inner = {p for _name, p, _oid in _gitlinks(sub, oid)} if own else set()
            same = own and not [p for p in sub.status() if p.rstrip("/") not in inner]
        except (pygit2.GitError, OSError):  # not a repository (any more): anything inside counts
            same = not dest.is_dir() or not any(dest.iterdir())
        if not same:
            changed.append(path)
    return changed


def _reset_submodules(w: pygit2.Repository, worktree: Path) -> None:
    """Each submodule back at its recorded commit, with no other files (after a reset). One
    that holds no repository of its own any more (see ``_open_submodule``) is emptied and
    checked out again from the user's copy."""
    broken = False
    for _path, dest, oid in _checked_out_submodules(w, worktree):
        sub = _open_submodule(dest)
        if sub is not None:
            _reset_submodule(sub, oid)
            _stop_aiming_elsewhere(sub)
        elif os.path.lexists(dest):
            broken = True
            nofollow.remove_tree(dest)
    if broken:
        init_submodules(w, worktree, str(w.head.target))


def remove_worktree(repo: pygit2.Repository, name: str, path: Path) -> None:
    """Delete the worktree coder made at ``path`` and its registration ``name`` (its admin
    dir, ``worktrees/<name>``: what `git worktree prune` deletes); missing parts are fine,
    and without a registration nothing is deleted.

    The directory deleted is ``path``, coder's own, never the one the registration's
    ``gitdir`` file names: that file is in the admin dir, which the worktree's commands can
    write. Nothing is followed through a link. A removal or checkout cut short by a kill
    (see ``pending_change``) is finished even where its registration is already gone."""
    common = common_dir(repo)
    root = repo_root(repo)
    real = Path(os.path.realpath(path))
    if real == root or real in root.parents or real == common or common in real.parents:
        raise EnvironmentProblem(f"refusing to delete {real}: it is not a linked worktree")
    admin = common / "worktrees" / name
    path = Path(path).absolute()
    if not os.path.lexists(admin) and pending_change(path) is None:
        return  # not coder's (any more): whatever is at `path` is someone else's
    removing = _mark(path, REMOVING) if path.parent.is_dir() else None
    nofollow.remove_tree(path)
    nofollow.remove_tree(admin)  # after the files: a removal cut short is still registered
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_marker(path, CREATING))
    if removing is not None:
        os.unlink(removing)


def _prune_stale(repo: pygit2.Repository, common: Path, name: str) -> None:
    _remove_half_registration(common, name)
    prune_stale_worktrees(repo)


def prune_stale_worktrees(repo: pygit2.Repository) -> None:
    """Forget registrations whose directory is gone (as `git worktree prune` does; locked ones
    stay), so a deleted worktree neither blocks its name nor keeps its branch checked out
    (`git branch -D` refuses a branch checked out in a worktree, even a missing one)."""
    for other in repo.list_worktrees():
        wt = repo.lookup_worktree(other)
        if not Path(wt.path).exists() and wt.is_prunable:
            wt.prune(True)


def _remove_half_registration(common: Path, name: str) -> None:
    """A ``worktrees/<name>`` dir without a ``gitdir`` file is debris from a failed add."""
    admin = common / "worktrees" / name
    if admin.is_dir() and not (admin / "gitdir").exists():
        shutil.rmtree(admin, ignore_errors=True)


def _head_of(gitdir: Path) -> str | None:
    """Symbolic target of a HEAD file (``refs/heads/x``), None if detached/unreadable."""
    try:
        text = _admin_text(gitdir / "HEAD")
    except OSError:
        return None
    return text[len("ref: ") :] if text.startswith("ref: ") else None


def registered_branch(repo: pygit2.Repository, name: str) -> str | None:
    """The branch the worktree registered as ``name`` has checked out (its directory may be
    gone), or None."""
    head = _head_of(common_dir(repo) / "worktrees" / name)
    return head.removeprefix("refs/heads/") if head and head.startswith("refs/heads/") else None


def _checked_out_at(repo: pygit2.Repository, refname: str) -> Path | None:
    """Where ``refname`` is checked out (main checkout or a linked worktree), else None.

    Read from the HEAD files directly so the answer names the directory to fix.
    """
    common = common_dir(repo)
    if _head_of(common) == refname:
        return repo_root(repo)
    admin_root = common / "worktrees"
    if admin_root.is_dir():
        for admin in sorted(admin_root.iterdir()):
            if _head_of(admin) == refname:
                try:  # gitdir holds "<worktree>/.git"
                    return Path(_admin_text(admin / "gitdir")).parent
                except OSError:
                    return admin
    return None


# --------------------------------------------------------------------------- status, commit


def _under_coder_dir(path: str) -> bool:
    return path == CODER_DIR or path.startswith(CODER_DIR + "/")


_WORKDIR_CHANGES = (
    FileStatus.WT_NEW
    | FileStatus.WT_MODIFIED
    | FileStatus.WT_DELETED
    | FileStatus.WT_TYPECHANGE
    | FileStatus.WT_RENAMED
)


def _status(w: pygit2.Repository) -> dict[str, int]:
    """Paths differing from HEAD (index or workdir), ignored files and ``.coder/`` left out.
    When HEAD's branch is gone (deleted by hand), the files are compared with the index,
    which still holds the last commit checked out there: against no commit at all, every
    file would read as a change."""
    mask = _WORKDIR_CHANGES if w.head_is_unborn else ~0
    return {
        p: flags & mask
        for p, flags in w.status(untracked_files="all", ignored=False).items()
        if flags & mask
        and flags != FileStatus.CURRENT
        and not (flags & FileStatus.IGNORED)
        and not _under_coder_dir(p)
    }


def changed_paths(worktree: Path) -> list[str]:
    """Sorted relative posix paths that differ from HEAD: new, modified, deleted, renamed
    (both sides). Honours .gitignore/info/exclude; never anything under ``.coder/``."""
    return sorted(_status(_open_worktree(worktree, writing=False)))


def is_clean(worktree: Path) -> bool:
    """True if nothing differs from HEAD besides ignored files and ``.coder/``."""
    return not _status(_open_worktree(worktree, writing=False))


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
        text = _admin_text(dotgit)
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


def _retry_on_index_lock(worktree: Path, action: Callable[[], _T]) -> _T:
    """Run ``action``; if a stale ``index.lock`` (left by a crash) blocks it, clear and retry."""
    try:
        return action()
    except (pygit2.GitError, OSError) as exc:
        if "index is locked" not in str(exc) or not clear_stale_index_lock(worktree):
            raise
    return action()


def _branch_ref(w: pygit2.Repository, worktree: Path) -> str:
    if w.head_is_detached or w.head_is_unborn:
        raise EnvironmentProblem(
            f"worktree {worktree} is not on a branch (detached or unborn HEAD)",
            hint="`coder clean` the task and run it again, or check the branch out there",
        )
    return str(w.head.name)


def _check_tip(w: pygit2.Repository, refname: str, expected: str, worktree: Path) -> None:
    ref = w.references.get(refname)
    actual = None if ref is None else str(ref.target)
    if actual != expected:
        raise _moved(refname, expected, actual, worktree)


def _check_detached_head(w: pygit2.Repository, expected: str, worktree: Path) -> None:
    actual = str(w.head.target)
    if actual != expected:
        raise BranchMoved(
            f"HEAD of scratch worktree {worktree} moved: expected {expected[:12]}, "
            f"now at {actual[:12]}",
            hint="remove the scratch worktree and run the step again",
        )


def _moved(refname: str, expected: str, actual: str | None, worktree: Path) -> BranchMoved:
    branch = refname.removeprefix("refs/heads/")
    now = f"now at {actual[:12]}" if actual else "deleted"
    return BranchMoved(
        f"branch '{branch}' moved under us: expected {expected[:12]}, {now} (worktree {worktree})",
        hint=f"someone committed to or reset '{branch}'; inspect it with "
        f"`git log {branch}` and move it back or `coder clean` the task",
    )


def commit_message(title: str, body: str, *, task_id: str, step_id: str, attempt: int) -> str:
    """Step commit message: title, optional body, then the trailer paragraph (always last)."""
    title = " ".join(title.split()) or f"step {step_id}"
    body = body.strip()
    parts = [title] + ([body] if body else [])
    trailers = (
        f"{TRAILER_TASK}: {task_id}\n{TRAILER_STEP}: {step_id}\n{TRAILER_ATTEMPT}: {attempt}\n"
    )
    return "\n\n".join([*parts, trailers])


def _staged_tree(worktree: Path, base: str, staged: Staged | None) -> pygit2.Oid:
    """The tree of a step's commit: the one the verify stage staged (taken against the same
    base), or what ``worktree`` holds now."""
    if staged is None:
        staged = stage(worktree, base)
    elif staged.base != base:
        raise ValueError(f"the changes were staged against {staged.base}, not {base}")
    return pygit2.Oid(hex=staged.tree)


def commit_step(
    worktree: Path,
    *,
    task_id: str,
    step_id: str,
    attempt: int,
    title: str,
    body: str = "",
    expected_tip: str,
    staged: Staged | None = None,
) -> str | None:
    """Commit everything the step changed in ``worktree`` as one commit on its branch: the
    tree ``staged`` holds (what the verify stage staged and checked), or staged now.

    Returns the new commit's hex, or None if the tree equals ``expected_tip``'s (a step that
    changed nothing makes no commit). Raises ``BranchMoved`` if the branch is not at
    ``expected_tip``: the commit is created through the ref with ``expected_tip`` as first
    parent, which libgit2 turns into an atomic compare-and-swap.
    """
    worktree = Path(worktree)
    w = _open_worktree(worktree)
    refname = _branch_ref(w, worktree)
    _check_tip(w, refname, expected_tip, worktree)
    tree = _staged_tree(worktree, expected_tip, staged)
    parent = w[expected_tip].peel(pygit2.Commit)
    if tree == parent.tree_id:
        return None
    who = identity(w)
    message = commit_message(title, body, task_id=task_id, step_id=step_id, attempt=attempt)
    try:
        oid = w.create_commit(refname, who.author, who.committer, message, tree, [parent.id])
    except (pygit2.GitError, OSError) as exc:
        if "current tip is not the first parent" in str(exc):
            raise _moved(refname, expected_tip, branch_tip(w, refname[11:]), worktree) from None
        raise _git_failure(exc, f"commit step {step_id}", worktree) from None
    return str(oid)


_LINKS: dict[str, frozenset[str]] = {}  # tree id -> the paths of its symlinks (a few kept)


def committed_links(worktree: Path) -> frozenset[str]:
    """The paths of the symlinks in the worktree's HEAD commit. Cached by tree id, and a tree
    whose parent commit's tree is cached is derived from it through their diff, so a run
    pays for one walk of the tree, not one per step."""
    w = _open_worktree(worktree, writing=False)
    if w.head_is_unborn:
        return frozenset()
    commit = w.head.peel(pygit2.Commit)
    found = _LINKS.get(str(commit.tree_id))
    if found is not None:
        return found
    parent = commit.parents[0] if commit.parents else None
    before = _LINKS.get(str(parent.tree_id)) if parent is not None else None
    if parent is not None and before is not None:
        links = set(before)
        for delta in parent.tree.diff_to_tree(commit.tree).deltas:
            links.discard(delta.old_file.path)
            if delta.new_file.mode == pygit2.enums.FileMode.LINK:
                links.add(delta.new_file.path)
        found = frozenset(links)
    else:
        found = frozenset(_tree_links(commit.tree, ""))
    if len(_LINKS) >= 8:
        _LINKS.pop(next(iter(_LINKS)))
    _LINKS[str(commit.tree_id)] = found
    return found


def _tree_links(tree: pygit2.Tree, prefix: str) -> Iterator[str]:
    for entry in tree:
        if isinstance(entry, pygit2.Tree):
            yield from _tree_links(entry, f"{prefix}{entry.name}/")
        elif entry.filemode == pygit2.enums.FileMode.LINK:
            yield f"{prefix}{entry.name}"


def _remove_untracked(w: pygit2.Repository, worktree: Path) -> None:
    """Delete untracked, non-ignored files (never ``.coder/``) and the dirs they leave empty
    (an untracked nested repository shows up as "dir/"); nothing is followed through a link."""
    root = worktree.resolve()
    for rel, flags in _status(w).items():
        if flags == FileStatus.WT_NEW:
            nofollow.remove(root, rel.rstrip("/"))


def _restore_files(w: pygit2.Repository, worktree: Path, commit: str, doing: str) -> None:
    """Index and files of ``w`` back to ``commit``, untracked files removed, submodules at
    their recorded commits: ``git reset --hard`` without moving any ref.

    A command may have planted links and forged files here, so this runs confined like the
    commands (``confine.confined``): a write it is tricked into aiming outside the worktree
    fails instead of landing. And it avoids being tricked in the first place: links that
    stand where the commit has directories go before the checkout, submodules are reset in
    their own directory whatever their config says."""
    from coder.policy.confine import confined

    tree = w[commit].peel(pygit2.Tree)

    def restore() -> None:
        _remove_planted_links(Path(worktree), tree)
        w.checkout_tree(tree, strategy=CheckoutStrategy.FORCE)  # type: ignore[no-untyped-call]
        index = w.index
        index.read_tree(tree)
        index.write()
        w.state_cleanup()  # a merge or cherry-pick a command left half-done
        _remove_untracked(w, worktree)
        _reset_submodules(w, worktree)

    try:
        confined(worktree, lambda: _retry_on_index_lock(worktree, restore))
    except (pygit2.GitError, OSError) as exc:
        raise _git_failure(exc, doing, worktree) from None


def _remove_planted_links(root: Path, tree: pygit2.Tree) -> None:
    """Remove a symlink (or file) that stands where ``tree`` has a directory, so that the
    checkout creates the directory instead of writing its files through the link, as git
    does. Only the link itself goes, never what it points at."""

    def walk(tree: pygit2.Tree, rel: str) -> None:
        for entry in tree:
            if not isinstance(entry, pygit2.Tree):
                continue
            path = f"{rel}{entry.name}"
            try:
                mode = os.lstat(root / path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISDIR(mode):
                walk(entry, f"{path}/")
            else:
                os.unlink(root / path)

    walk(tree, "")


def discard_changes(worktree: Path, to_commit: str) -> None:
    """Throw away uncommitted/partial edits: files and index back to ``to_commit``, untracked
    non-ignored files removed. The branch (or a scratch worktree's detached HEAD) must already
    point at ``to_commit`` (else ``BranchMoved``): this never moves a branch, so no commit can
    be lost by it."""
    worktree = Path(worktree)
    w = _open_worktree(worktree)
    if w.head_is_detached:  # a scratch worktree: its HEAD must already be there
        _check_detached_head(w, to_commit, worktree)
    else:
        _check_tip(w, _branch_ref(w, worktree), to_commit, worktree)
    _restore_files(w, worktree, to_commit, "discard changes")


def reset_branch(worktree: Path, to_commit: str, *, expected_tip: str) -> None:
    """Move the worktree's branch to ``to_commit`` and make the files match (revert by reset).

    The ref is locked and its old value checked inside a ref transaction, so a concurrent
    commit to the branch makes this fail with ``BranchMoved`` instead of being dropped.
    The ref moves first, then the files: if the files step fails (crash, disk), the branch is
    already at ``to_commit`` and ``discard_changes(worktree, to_commit)`` finishes the job.
    """
    worktree = Path(worktree)
    w = _open_worktree(worktree)
    refname = _branch_ref(w, worktree)
    target = w[resolve_commit(w, to_commit)].id
    try:
        _move_branch(w, refname, target, expected_tip, worktree, "reset to")
    except (pygit2.GitError, OSError) as exc:
        raise _git_failure(exc, f"reset branch to {str(target)[:12]}", worktree) from None
    # HEAD now names to_commit; index and files follow (removing files only the old tip
    # tracked), then leftovers that became untracked go too.
    _restore_files(w, worktree, str(target), f"reset branch to {str(target)[:12]}")


def _move_branch(
    w: pygit2.Repository, refname: str, target: pygit2.Oid, expected: str, worktree: Path, why: str
) -> None:
    """Point ``refname`` at ``target`` if it still points at ``expected`` (lock, check, set)."""
    with w.transaction() as tx:
        tx.lock_ref(refname)
        _check_tip(w, refname, expected, worktree)
        tx.set_target(refname, target, message=f"coder: {why} {str(target)[:12]}")


def move_branch(worktree: Path, target: str, *, expected_tip: str, message: str) -> None:
    """Point the worktree's branch at ``target`` if it still points at ``expected_tip`` (lock,
    check, set; ``message`` goes to the reflog, where the old tip stays). The files are left
    as they are: ``discard_changes(worktree, target)`` brings them along afterwards."""
    worktree = Path(worktree)
    w = _open_worktree(worktree)
    refname = _branch_ref(w, worktree)
    try:
        with w.transaction() as tx:
            tx.lock_ref(refname)
            _check_tip(w, refname, expected_tip, worktree)
            tx.set_target(refname, pygit2.Oid(hex=target), message=message)
    except pygit2.GitError as exc:
        raise _git_failure(exc, f"move the branch to {target[:12]}", worktree) from None


# --------------------------------------------------------------------------- parallel steps
# Independent steps of one DAG level run side by side, each in a scratch worktree with a
# detached HEAD at the same tip; their commits are then replayed onto the agent branch.


def add_scratch_worktree(repo: pygit2.Repository, *, name: str, path: Path, commit: str) -> Path:
    """A throwaway worktree ``name`` at ``path`` with a detached HEAD at ``commit``.

    A leftover with the same name (from a crash) is removed first: scratch work is
    disposable. libgit2 can only add a worktree on a branch, so a temporary
    ``coder-scratch/<name>`` branch carries it and is deleted once HEAD is detached.
    """
    target = repo[resolve_commit(repo, commit)].id
    temp = f"coder-scratch/{name}"
    remove_worktree(repo, name, path)
    delete_branch(repo, temp)
    path = create_worktree(repo, name=name, path=path, branch=temp, start=str(target))
    _open_worktree(path).set_head(target)
    delete_branch(repo, temp)
    return path


def commit_detached(
    workdir: Path,
    *,
    task_id: str,
    step_id: str,
    attempt: int,
    title: str,
    body: str = "",
    parent: str,
    staged: Staged | None = None,
) -> str | None:
    """``commit_step`` for a scratch worktree: the step commit advances only its detached
    HEAD (so the HEAD reflog keeps it reachable until ``cherry_pick`` lands it). Returns None
    if nothing changed."""
    workdir = Path(workdir)
    w = _open_worktree(workdir)
    if not w.head_is_detached:
        raise EnvironmentProblem(f"{workdir} is on a branch, not a scratch worktree")
    _check_detached_head(w, parent, workdir)
    tree = _staged_tree(workdir, parent, staged)
    base = w[parent].peel(pygit2.Commit)
    if tree == base.tree_id:
        return None
    who = identity(w)
    message = commit_message(title, body, task_id=task_id, step_id=step_id, attempt=attempt)
    try:  # through "HEAD": libgit2 checks the detached HEAD is still at `parent`
        oid = w.create_commit("HEAD", who.author, who.committer, message, tree, [base.id])
    except (pygit2.GitError, OSError) as exc:
        if "current tip is not the first parent" in str(exc):
            _check_detached_head(w, parent, workdir)
        raise _git_failure(exc, f"commit step {step_id}", workdir) from None
    return str(oid)


def cherry_pick(worktree: Path, commit: str, *, expected_tip: str) -> str | None:
    """Land a scratch step commit on the worktree's branch (at ``expected_tip``, CAS).

    If the commit's parent is the tip it lands as is (fast-forward); otherwise its change is
    three-way merged in memory onto the tip and committed with the same message (trailers
    included) and author. Returns the commit now at the tip, None if the change was already
    there; conflicting edits raise ``RunFailed`` naming the paths, changing nothing.
    """
    worktree = Path(worktree)
    w = _open_worktree(worktree)
    refname = _branch_ref(w, worktree)
    _check_tip(w, refname, expected_tip, worktree)
    pick = w[resolve_commit(w, commit)].peel(pygit2.Commit)
    ours = w[expected_tip].peel(pygit2.Commit)
    if len(pick.parents) != 1:
        raise InvalidInput(f"cannot cherry-pick {str(pick.id)[:12]}: it is a merge or root commit")
    try:
        if pick.parents[0].id == ours.id:
            new = pick.id
            _move_branch(w, refname, new, expected_tip, worktree, "fast-forward to")
        else:
            merged = w.merge_trees(pick.parents[0].tree, ours.tree, pick.tree)
            if merged.conflicts:
                paths = sorted({(o or t or a).path for a, o, t in merged.conflicts})
                raise RunFailed(
                    f"step commit {str(pick.id)[:12]} conflicts with {refname[11:]} "
                    f"in {', '.join(paths)}",
                    hint="parallel steps edited the same lines; make one depend on the other",
                )
            tree = merged.write_tree(w)
            if tree == ours.tree_id:
                return None
            committer = identity(w).committer
            try:  # CAS through the ref, as in commit_step
                new = w.create_commit(
                    refname, pick.author, committer, pick.message, tree, [ours.id]
                )
            except pygit2.GitError as exc:
                if "current tip is not the first parent" in str(exc):
                    now = branch_tip(w, refname[11:])
                    raise _moved(refname, expected_tip, now, worktree) from None
                raise
    except (pygit2.GitError, OSError) as exc:
        raise _git_failure(exc, f"cherry-pick {str(pick.id)[:12]}", worktree) from None
    _restore_files(w, worktree, str(new), f"cherry-pick {str(pick.id)[:12]}")
    return str(new)


# --------------------------------------------------------------------------- history


@dataclass(frozen=True)
class StepCommit:
    commit: str
    step_id: str
    attempt: int
    task_id: str
    summary: str


_TRAILER_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)\s*:\s*(.*?)\s*$")


def parse_trailers(message: str) -> dict[str, str]:
    """``Key: value`` lines of the message's last paragraph (keys lower-cased).

    Lines that are not trailers (wrapped text, stray notes) are skipped instead of voiding the
    block, so a commit amended by hand still parses.
    """
    paragraphs = re.split(r"\n[ \t]*\n", message.replace("\r\n", "\n").strip())
    if len(paragraphs) < 2:
        return {}
    found: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        m = _TRAILER_LINE.match(line)
        if m:
            found.setdefault(m.group(1).lower(), m.group(2))
    return found


def _walk(repo: pygit2.Repository, branch: str, base_commit: str) -> list[pygit2.Commit]:
    """Commits in ``base_commit..branch``, oldest first (empty if the branch is gone)."""
    tip = branch_tip(repo, branch)
    if tip is None:
        return []
    walker = repo.walk(pygit2.Oid(hex=tip), SortMode.TOPOLOGICAL | SortMode.REVERSE)
    walker.hide(pygit2.Oid(hex=resolve_commit(repo, base_commit)))
    return list(walker)


def step_commits(
    repo: pygit2.Repository, *, branch: str, base_commit: str, task_id: str
) -> list[StepCommit]:
    """Step commits of ``task_id`` in ``base_commit..branch``, oldest first."""
    found = []
    for commit in _walk(repo, branch, base_commit):
        t = parse_trailers(commit.message)
        if t.get(TRAILER_TASK.lower()) != task_id or TRAILER_STEP.lower() not in t:
            continue
        try:
            attempt = int(t.get(TRAILER_ATTEMPT.lower(), "1"))
        except ValueError:
            attempt = 1
        summary = commit.message.split("\n", 1)[0]
        found.append(StepCommit(str(commit.id), t[TRAILER_STEP.lower()], attempt, task_id, summary))
    return found


def effective_step_commits(
    repo: pygit2.Repository, *, branch: str, base_commit: str, task_id: str
) -> list[StepCommit]:
    """The step commits that still count, oldest first: ``step_commits`` less each one undone
    by a later ``Coder-Reverts: <step>`` commit of this task (it cancels that step's newest
    commit before it). A reverted step is not done: resume runs it again."""
    effective: list[StepCommit] = []
    by_id = {
        c.commit: c
        for c in step_commits(repo, branch=branch, base_commit=base_commit, task_id=task_id)
    }
    for commit in _walk(repo, branch, base_commit):
        if str(commit.id) in by_id:
            effective.append(by_id[str(commit.id)])
            continue
        t = parse_trailers(commit.message)
        reverted = t.get(TRAILER_REVERTS.lower())
        if t.get(TRAILER_TASK.lower()) != task_id or reverted is None:
            continue
        for i in range(len(effective) - 1, -1, -1):
            if effective[i].step_id == reverted:
                del effective[i]
                break
    return effective


def run_base(repo: pygit2.Repository, branch: str, task_id: str) -> tuple[str, int] | None:
    """Where run ``task_id`` started on ``branch``, read from its commits alone: (the base
    commit, how many of the run's commits are on it). The run's commits (steps, and `coder
    revert`'s) carry ``Coder-Task: task_id`` and follow one another from the base (parallel
    steps land as cherry-picks), so the base is the first commit without it, walking first
    parents from the tip. None when the branch is missing or its tip is not the run's."""
    tip = branch_tip(repo, branch)
    if tip is None:
        return None
    commit = repo[tip].peel(pygit2.Commit)
    count = 0
    while parse_trailers(commit.message).get(TRAILER_TASK.lower()) == task_id:
        if not commit.parents:
            return None
        count += 1
        commit = commit.parents[0]
    return (str(commit.id), count) if count else None


def task_branches(repo: pygit2.Repository, task_id: str) -> list[str]:
    """Local branches whose tip is a commit of run ``task_id`` (its trailers say so)."""
    found = []
    for name in repo.branches.local:
        tip = branch_tip(repo, name)
        message = repo[tip].peel(pygit2.Commit).message if tip else ""
        if parse_trailers(message).get(TRAILER_TASK.lower()) == task_id:
            found.append(name)
    return sorted(found)


def foreign_commits(
    repo: pygit2.Repository, *, branch: str, base_commit: str, task_id: str
) -> list[str]:
    """Commits on ``branch`` that are not this task's, oldest first: everything in
    ``base_commit..branch`` without ``Coder-Task: task_id`` (so its step commits and
    `coder revert`'s ``Coder-Reverts`` commits pass), plus the tip itself if the
    branch no longer contains ``base_commit`` (it was reset or rewritten). Resume refuses
    when this is non-empty, so nobody's work is discarded."""
    foreign = [
        str(c.id)
        for c in _walk(repo, branch, base_commit)
        if parse_trailers(c.message).get(TRAILER_TASK.lower()) != task_id
    ]
    tip = branch_tip(repo, branch)
    base = resolve_commit(repo, base_commit)
    moved_off_base = tip is not None and tip != base and not repo.descendant_of(tip, base)
    if moved_off_base and tip not in foreign:
        foreign.append(str(tip))
    return foreign


# --------------------------------------------------------------------------- diffs

_WORKDIR_FLAGS = (
    DiffOption.INCLUDE_UNTRACKED
    | DiffOption.RECURSE_UNTRACKED_DIRS
    | DiffOption.SHOW_UNTRACKED_CONTENT
    | DiffOption.INCLUDE_TYPECHANGE
)


def _tree(repo: pygit2.Repository, rev: str) -> pygit2.Tree:
    return repo[resolve_commit(repo, rev)].peel(pygit2.Tree)


def _diff(repo: pygit2.Repository, old: str, new: str) -> pygit2.Diff:
    d = _tree(repo, old).diff_to_tree(_tree(repo, new))
    d.find_similar()
    return d


def diff_patch(
    repo: pygit2.Repository, old: str, new: str | None = None, *, worktree: Path | None = None
) -> str:
    """Unified diff ``old``..``new``; with ``new`` None, ``old`` against the files of
    ``worktree`` (default: the repo's own working tree), untracked files included. An unusual
    file name is quoted in the headers as git quotes it (libgit2 does), so none forges a
    line; the changed lines are as they are."""
    if new is not None:
        return _diff(repo, old, new).patch or ""
    w = _open_worktree(worktree, writing=False) if worktree is not None else repo
    d = _tree(w, old).diff_to_workdir(_WORKDIR_FLAGS)
    # .coder/ is normally ignored via info/exclude; drop it here too in case it is not.
    return "".join(
        p.text or "" for p in d if p is not None and not _under_coder_dir(p.delta.new_file.path)
    )


def added_lines(worktree: Path, old: str) -> dict[str, set[int]]:
    """The lines (1-based, new side) each file of ``worktree`` adds or changes against the
    commit ``old``, untracked files included; names from git's structured diff, never parsed
    back from patch text (where git quotes unusual names: ``+++ "b/caf\\303\\251.py"``)."""
    w = _open_worktree(worktree, writing=False)
    found: dict[str, set[int]] = {}
    for patch in _tree(w, old).diff_to_workdir(_WORKDIR_FLAGS):
        if patch is None or patch.delta.status == pygit2.enums.DeltaStatus.DELETED:
            continue
        path = patch.delta.new_file.path
        if _under_coder_dir(path):
            continue
        lines = {
            line.new_lineno
            for hunk in patch.hunks
            for line in hunk.lines
            if line.origin == "+" and line.new_lineno > 0
        }
        if lines:
            found[path] = lines
    return found


_GITLINK = pygit2.enums.FileMode.COMMIT


def step_patch(repo: pygit2.Repository, old: str, new: str) -> str:
    """``diff_patch(repo, old, new)`` at the cost of what changed: the trees are walked
    through their ids, and each changed file is diffed on its own (a moved file shows as
    deleted and added, with no rename detection)."""
    return changes_patch(repo, changes(repo, _tree(repo, old).id, _tree(repo, new).id))


def changes_patch(repo: pygit2.Repository, found: Iterable[Change]) -> str:
    """Unified diff of ``found`` (``staging.Change``), as ``git diff --no-renames`` prints it."""
    return "".join(_change_patch(repo, change) for change in found)


def _change_patch(repo: pygit2.Repository, change: Change) -> str:
    old, new = _side(repo, change.old), _side(repo, change.new)
    path = change.path
    text = pygit2.Patch.create_from(old, new, old_as_path=path, new_as_path=path).text or ""
    # libgit2 takes both sides as regular files (100644): put the real modes in the header
    head, sep, body = text.partition("\n--- ") if "\n--- " in text else text.partition("\nBinary")
    old_mode, new_mode = (f"{e[0]:o}" if e else None for e in (change.old, change.new))
    if old_mode is None:
        head = head.replace("new file mode 100644", f"new file mode {new_mode}")
    elif new_mode is None:
        head = head.replace("deleted file mode 100644", f"deleted file mode {old_mode}")
    elif old_mode == new_mode:
        head = head.replace(" 100644", f" {new_mode}") if head else head
    else:
        index = head.partition("\nindex ")[2].split(" ")[0]
        head = f"diff --git a/{path} b/{path}\nold mode {old_mode}\nnew mode {new_mode}"
        head += f"\nindex {index}" if index else ""
    if _GITLINK in (change.old or (0,))[:1] + (change.new or (0,))[:1]:  # ids, not the text's
        ids = (e[1][:7] if e else "0000000" for e in (change.old, change.new))
        head = re.sub(r"\nindex \S+", "\nindex {}..{}".format(*ids), head)
    return head + sep + body if sep else head + "\n"


def _side(repo: pygit2.Repository, entry: tuple[int, str] | None) -> Any:
    """What ``pygit2.Patch.create_from`` compares for one side of a change (the Blob object
    is kept by the caller while the patch is made: libgit2 reads it then)."""
    if entry is None:
        return None
    mode, oid = entry
    if mode == _GITLINK:
        return f"Subproject commit {oid}\n".encode()
    return repo[oid].peel(pygit2.Blob)


def diff_stat(
    repo: pygit2.Repository,
    old: str,
    new: str,
    *,
    shown: Callable[[str], str] = str,
    width: int = 80,
) -> str:
    """``git diff --stat``-like text for ``old``..``new``: a line per file (`shown`: how its
    name is written), then the totals as git words them."""
    changes = diff_files(repo, old, new)
    if not changes:
        return ""
    names = [
        f"{shown(c.old_path)} => {shown(c.path)}" if c.old_path else shown(c.path) for c in changes
    ]
    sizes = [c.added + c.removed for c in changes]
    name_width, count_width = max(map(len, names)), len(str(max(sizes)))
    room = max(10, width - name_width - count_width - 6)
    biggest = max(max(sizes), 1)
    lines = []
    for name, change, size in zip(names, changes, sizes, strict=True):
        plus, minus = (
            (change.added, change.removed)
            if biggest <= room
            else (_scaled(change.added, room, biggest), _scaled(change.removed, room, biggest))
        )
        bar = "+" * plus + "-" * minus
        lines.append(f" {name:<{name_width}} | {size:>{count_width}} {bar}".rstrip())
    added, removed = sum(c.added for c in changes), sum(c.removed for c in changes)
    total = f" {len(changes)} file{'s' * (len(changes) != 1)} changed"
    if added or not removed:
        total += f", {added} insertion{'s' * (added != 1)}(+)"
    if removed or not added:
        total += f", {removed} deletion{'s' * (removed != 1)}(-)"
    return "\n".join([*lines, total]) + "\n"


def _scaled(count: int, room: int, biggest: int) -> int:
    return 0 if not count else max(1, count * room // biggest)


@dataclass(frozen=True)
class FileChange:
    path: str  # the new path (a rename's destination)
    status: str  # git's letter: A added, D deleted, M modified, R renamed, T type changed
    added: int  # lines; 0 for a binary file
    removed: int
    old_path: str | None = None  # a rename's source

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status,
            "added": self.added,
            "removed": self.removed,
            "old_path": self.old_path,
        }


def diff_files(repo: pygit2.Repository, old: str, new: str) -> list[FileChange]:
    """Each file changed between two commits with its line counts (``git diff --numstat``)."""
    changes = []
    for patch in _diff(repo, old, new):
        if patch is None:
            continue
        delta = patch.delta
        _, added, removed = patch.line_stats
        renamed = delta.old_file.path != delta.new_file.path
        changes.append(
            FileChange(
                delta.new_file.path,
                delta.status_char(),
                added,
                removed,
                delta.old_file.path if renamed else None,
            )
        )
    return sorted(changes, key=lambda c: c.path)


def changed_files_between(repo: pygit2.Repository, old: str, new: str) -> list[str]:
    """Sorted paths touched between two commits (both sides of a rename)."""
    paths: set[str] = set()
    for delta in _diff(repo, old, new).deltas:
        paths.update((delta.old_file.path, delta.new_file.path))
    return sorted(paths)


# --- reading trees -------------------------------------------------------------------------


def tree_paths(repo: pygit2.Repository, commit: str) -> list[str]:
    """Every file path in a commit's tree, sorted (the model's map of the repository)."""
    paths: list[str] = []

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id].peel(pygit2.Tree), f"{prefix}{entry.name}/")
            else:
                paths.append(f"{prefix}{entry.name}")

    walk(_tree(repo, commit), "")
    return sorted(paths)


def tree_blobs(repo: pygit2.Repository, tree_id: str) -> list[tuple[str, str]]:
    """(path, blob id) of every regular file of a tree, sorted by path; symlinks and
    submodules are left out (the code index reads file contents)."""
    blobs: list[tuple[str, str]] = []

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id].peel(pygit2.Tree), f"{prefix}{entry.name}/")
            elif entry.type_str == "blob" and entry.filemode in (0o100644, 0o100755):
                blobs.append((f"{prefix}{entry.name}", str(entry.id)))

    walk(repo[tree_id].peel(pygit2.Tree), "")
    return sorted(blobs)
