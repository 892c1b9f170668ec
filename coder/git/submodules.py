"""Submodules in coder's worktrees.

libgit2 checks a submodule out as an empty directory: a step would see no files there and
its writes into it would never be committed. So a worktree gets each submodule at the
recorded commit, from the user's own copy of the submodule (its objects shared through
`objects/info/alternates`, like `git clone --shared`: no copy, no network), or the run is
refused up front naming it. Submodules of submodules likewise, at any depth. A step that
changes a submodule fails (see `changed_submodules`): coder commits only the repository
itself.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import ResetMode

from coder.errors import EnvironmentProblem
from coder.files import nofollow
from coder.git.repository import Repo, common_dir, git_failure, open_worktree, repo_root
from coder.git.workdir import remove_untracked


@dataclass(frozen=True)
class Submodule:
    path: str  # relative to the superproject's top, parents before their own submodules
    commit: str  # the commit the superproject records
    source: Path  # the user's copy of its repository (its git dir)


def _gitlinks(repo: Repo, commit: str) -> list[tuple[str, str, str]]:
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


def submodules(repo: Repo, commit: str) -> list[Submodule]:
    """The submodules of ``commit``, nested ones included (each after the one that holds
    it), with where their commits are found locally; an EnvironmentProblem naming the first
    one this machine has no copy of (coder never fetches)."""
    return _submodules(repo, commit, repo_root(repo), common_dir(repo), "", repo_root(repo))


def _submodules(
    repo: Repo, commit: str, root: Path, common: Path, prefix: str, top: Path
) -> list[Submodule]:
    """``root`` is the user's checkout of ``repo`` (it may be missing for a nested one) and
    ``common`` its git dir: a submodule's copy is checked out under the first, or kept in
    the second's ``modules/``, as `git submodule update --init --recursive` leaves them."""
    found = []
    for name, path, oid in _gitlinks(repo, commit):
        source = None
        # A copy kept in `modules/` is opened bare: only its objects are wanted, and its
        # work tree (`core.worktree`, in the user's checkout) is not in a confined thread's
        # view (coder.policy.view), where libgit2 would not open it.
        opened = pygit2.enums.RepositoryOpenFlag
        for candidate, flags in (
            (root / path, opened.NO_SEARCH),
            (common / "modules" / name, opened.NO_SEARCH | opened.BARE),
        ):
            try:
                sub = Repo(str(candidate), flags)
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


def init_submodules(repo: Repo, worktree: Path, commit: str) -> None:
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
            raise git_failure(exc, f"check out submodule {sub.path}", Path(worktree)) from None


def _reset_submodule(sub: Repo, commit: str) -> None:
    oid = pygit2.Oid(hex=commit)
    sub.set_head(oid)
    sub.reset(oid, ResetMode.HARD)
    remove_untracked(sub, Path(sub.workdir))


def _stop_aiming_elsewhere(sub: Repo) -> None:
    """Drop a ``core.worktree`` a command set in the submodule's own config: coder ignores it
    (``_open_submodule``), but the git CLI (the user's, a later command's) would follow it."""
    config = pygit2.Config(os.path.join(sub.path, "config"))
    if "core.worktree" in config:
        del config["core.worktree"]


def _open_submodule(dest: Path) -> Repo | None:
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
        sub = Repo(str(gitdir), flags.NO_SEARCH | flags.BARE)
    except (pygit2.GitError, OSError):
        return None
    sub.workdir = str(dest)
    return sub


def _checked_out_submodules(
    w: Repo, worktree: Path, prefix: str = ""
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


def changed_submodules(worktree: Path, *, repo: Repo | None = None) -> list[str]:
    """Submodules whose files or commit a step changed: coder would not commit that work.
    ``repo``: the worktree, opened already."""
    w = repo if repo is not None else open_worktree(worktree, writing=False)
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


def reset_submodules(w: Repo, worktree: Path) -> None:
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
