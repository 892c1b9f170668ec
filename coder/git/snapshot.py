"""The user's checkout as a commit, without touching it: `coder run --include-uncommitted`.

    snapshot(repo, base, paths)   a commit on no branch (parent ``base``) whose tree is
                                  ``base``'s with ``paths`` as the checkout's files have them
    checkout_commit(...)          the run's commit of that kind, read back from its branch

Only the repository's object database is written: the checkout's files and its index stay as
they are (no `git add`, no stash). Each file is read from a descriptor of its directory reached
without following a link (`coder.files.nofollow.open_dir`): a symlink is stored as a link (its
target's text), never read through, and a path below a directory that became a link counts
as deleted, as git sees it. Other kinds of file (fifos, sockets) and untracked nested
repositories are left out; so are submodules (their commit is git's business). Files go in as
their bytes: no clean filter (eol, LFS) runs, as for a file git has no attributes for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pygit2
from pygit2.enums import FileMode

from coder.errors import LinkInTheWay
from coder.files import nofollow
from coder.git.commits import TRAILER_TASK, commits_between, parse_trailers, write_commit
from coder.git.repository import Repo, identity
from coder.git.staging import brings

TRAILER_CHECKOUT = "Coder-Checkout"  # on the run's first commit: the checkout's own changes
TITLE = "coder: uncommitted changes from the checkout"
GONE: Literal["gone"] = "gone"
UNRECORDABLE: Literal["unrecordable"] = "unrecordable"
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Snapshot:
    commit: str
    paths: tuple[str, ...]  # what it changes against its parent
    left_out: tuple[str, ...]  # asked for but not recordable (a fifo, a nested repository)


def snapshot(
    repo: Repo, root: Path, base: str, paths: list[str], *, task_id: str, body: str = ""
) -> Snapshot | None:
    """The commit of ``paths`` as the working files under ``root`` have them, on top of commit
    ``base``: a path that is gone (or lies beyond a link) is deleted. None when that changes
    nothing. The commit is referenced by no branch yet (it is held from git's prune until one
    is: `commits.write_commit`); its trailers name the task."""
    parent = repo[base].peel(pygit2.Commit)
    index = pygit2.Index()
    index.read_tree(parent.tree)
    filemode = _filemode(repo)
    entries: dict[str, tuple[FileMode, pygit2.Oid] | None] = {}
    left_out: list[str] = []
    for rel in paths:
        old = _entry(parent.tree, rel)
        if rel.endswith("/") or (old is not None and old[0] == FileMode.COMMIT):
            left_out.append(rel)  # a nested repository, or a submodule
            continue
        found = _working_entry(repo, root, rel, filemode, old)
        if found == UNRECORDABLE:
            left_out.append(rel)
        else:
            entries[rel] = None if found == GONE else found
    for rel, entry in entries.items():  # deletions first: a file may replace a directory
        if entry is None:
            with contextlib.suppress(OSError, KeyError, pygit2.GitError):
                index.remove(rel)
    for rel, entry in sorted(entries.items()):
        if entry is not None:
            _drop_below(index, rel)
            index.add(pygit2.IndexEntry(rel, entry[1], entry[0]))
    tree = index.write_tree(repo)
    if tree == parent.tree_id:
        return None
    deltas = parent.tree.diff_to_tree(repo[tree].peel(pygit2.Tree)).deltas
    changed = tuple(sorted({d.new_file.path for d in deltas} | {d.old_file.path for d in deltas}))
    who = identity(repo)
    trailers = f"{TRAILER_TASK}: {task_id}\n{TRAILER_CHECKOUT}: uncommitted\n"
    message = "\n\n".join([TITLE, *([body.strip()] if body.strip() else []), trailers])
    brought = brings(repo, parent.tree_id, tree)  # held from git's prune until a ref has it
    oid = write_commit(repo, who.author, who.committer, message, tree, [parent.id], brought)
    return Snapshot(str(oid), changed, tuple(left_out))


def checkout_commit(repo: Repo, *, branch: str, base_commit: str, task_id: str) -> str | None:
    """The run's commit of the checkout's changes, if its branch holds one (its first)."""
    for commit in commits_between(repo, branch, base_commit)[:1]:
        t = parse_trailers(commit.message)
        if t.get(TRAILER_TASK.lower()) == task_id and TRAILER_CHECKOUT.lower() in t:
            return str(commit.id)
    return None


def _filemode(repo: Repo) -> bool:
    config = repo.config
    return bool(config.get_bool("core.filemode")) if "core.filemode" in config else True


def _entry(tree: pygit2.Tree, rel: str) -> tuple[int, str] | None:
    try:
        obj = tree[rel]
    except KeyError:
        return None
    return int(obj.filemode), str(obj.id)


def _drop_below(index: pygit2.Index, rel: str) -> None:
    """Remove the index's entries under ``rel/`` (a directory this file replaces) and those
    at its parents (a file where this one's directory goes): libgit2 finds them by binary
    search, so the snapshot costs one pass over the index, not one per changed file."""
    with contextlib.suppress(OSError, KeyError, pygit2.GitError):
        index.remove_directory(rel)
    parts = rel.split("/")
    for i in range(1, len(parts)):
        with contextlib.suppress(OSError, KeyError, pygit2.GitError):
            index.remove("/".join(parts[:i]))


def _working_entry(
    repo: Repo, root: Path, rel: str, filemode: bool, old: tuple[int, str] | None
) -> tuple[FileMode, pygit2.Oid] | Literal["gone", "unrecordable"]:
    """(mode, blob) of the working file ``rel``; GONE when it is gone (or beyond a link);
    UNRECORDABLE when it is something git cannot record (a fifo, a socket)."""
    parent, _, name = rel.rpartition("/")
    try:
        with nofollow.open_dir(root, parent) as dir_fd:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                return FileMode.LINK, repo.create_blob(os.fsencode(target))
            if stat.S_ISDIR(st.st_mode):  # a file became a directory: its files are listed
                return GONE
            if not stat.S_ISREG(st.st_mode):
                return UNRECORDABLE
            fd = os.open(name, _READ, dir_fd=dir_fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                    return UNRECORDABLE
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
            finally:
                os.close(fd)
    except LinkInTheWay:
        return GONE
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return GONE
        raise
    executable = bool(st.st_mode & stat.S_IXUSR)
    if not filemode and old is not None and old[0] in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
        mode = FileMode(old[0])  # core.filemode off: git keeps the committed mode
    else:
        mode = FileMode.BLOB_EXECUTABLE if executable else FileMode.BLOB
    return mode, repo.create_blob(b"".join(chunks))
