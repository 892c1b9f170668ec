"""Git's worktree filters: the bytes `git checkout` writes for a blob, and the blob `git add`
makes of a file.

libgit2 applies git's built-in conversions (`text`, `eol`, `core.autocrlf`, `ident`) as git
does (the tests compare with `git checkout -- FILE` byte for byte). Two things only git itself
can do: filter drivers (`filter=NAME` in .gitattributes, e.g. Git LFS's smudge and clean) and
`working-tree-encoding`. Paths with either go through the git CLI (`git cat-file --filters`,
`git hash-object`, `git update-index`), so they get exactly what git would give them; a
required driver that is not configured here, or no git on PATH, is refused naming the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pygit2

from coder.errors import EnvironmentProblem


def _attr(w: pygit2.Repository, path: str, name: str) -> object:
    """A git attribute of `path`. The path as bytes: pygit2 hands out a name that is not UTF-8
    with surrogates (surrogateescape) and encodes a str back strictly."""
    return w.get_attr(os.fsencode(path), name)


def needs_git(w: pygit2.Repository, path: str) -> str | None:
    """What makes `path` need git itself (a filter driver, an encoding), or None."""
    driver = _attr(w, path, "filter")
    if isinstance(driver, str):
        return f"the filter `{driver}`"
    encoding = _attr(w, path, "working-tree-encoding")
    if isinstance(encoding, str):
        return f"working-tree-encoding {encoding}"
    return None


def check_available(w: pygit2.Repository, path: str) -> None:
    """EnvironmentProblem naming `path` if writing it needs what this machine lacks."""
    why = needs_git(w, path)
    if why is None:
        return
    if shutil.which("git") is None:
        raise EnvironmentProblem(
            f"{path} needs {why} (.gitattributes), which only the git program can apply, and "
            "git is not on PATH; nothing was changed",
            hint="install git, then run the command again",
        )
    driver = _attr(w, path, "filter")
    if isinstance(driver, str) and _required(w, driver) and not _configured(w, driver):
        raise EnvironmentProblem(
            f"{path} needs the filter `{driver}` (.gitattributes), which is required but not "
            "configured here; nothing was changed",
            hint=f"install the filter (for Git LFS: `git lfs install`), or set "
            f"filter.{driver}.smudge and filter.{driver}.clean in git's config",
        )


def smudged(w: pygit2.Repository, path: str, oid: str) -> bytes:
    """The content `git checkout` writes at `path` for blob `oid`. A name that is not UTF-8
    goes to git too: pygit2's BlobIO cannot take it (its reading thread dies, and the read
    waits for ever)."""
    if not utf8(path) and shutil.which("git") is None:
        return bytes(w[oid].peel(pygit2.Blob).data)  # no filter can be applied: as stored
    if utf8(path) and needs_git(w, path) is None:
        plain = pygit2.enums.BlobFilter(0)  # no binary sniffing: git converts `text` files anyway
        with pygit2.BlobIO(w[oid].peel(pygit2.Blob), as_path=path, flags=plain) as blob:
            return blob.read()
    return _git(w, "cat-file", "--filters", f"--path={path}", oid)


def utf8(path: str) -> bool:
    """Whether libgit2 can be handed `path` as text (a name that is not UTF-8 holds the raw
    bytes as surrogates, which pygit2 refuses to encode)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def blob_id(w: pygit2.Repository, path: str) -> str:
    """The blob `git add` would store for the file at `path` (clean filters applied)."""
    if needs_git(w, path) is None:
        return str(w.hashfile(path))
    return _git(w, "hash-object", "--", path).decode().strip()


def stage(w: pygit2.Repository, paths: Iterable[str]) -> None:
    """Record in the index those of `paths` (files just written) that need git, through
    `git update-index` (its clean filter gives the blob id, and it records the stat data).
    libgit2 records the others; the caller writes its index first."""
    through_git = [p for p in paths if needs_git(w, p) is not None]
    if through_git:
        _git(w, "update-index", "--add", "--", *through_git)


def _required(w: pygit2.Repository, driver: str) -> bool:
    key = f"filter.{driver}.required"
    return key in w.config and bool(w.config.get_bool(key))


def _configured(w: pygit2.Repository, driver: str) -> bool:
    return any(f"filter.{driver}.{k}" in w.config for k in ("smudge", "process"))


def _git(w: pygit2.Repository, *args: str) -> bytes:
    root = Path(w.workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        proc = subprocess.run(
            ["git", *args], cwd=root, env=env, capture_output=True, check=False, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"git {args[0]} in {root} failed: {exc}") from None
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        raise EnvironmentProblem(
            f"git {args[0]} in {root} failed: {detail[-1] if detail else proc.returncode}"
        )
    return proc.stdout
