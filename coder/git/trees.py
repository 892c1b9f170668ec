"""Reading files and trees at a commit, read-only: what the repo map, the project
instructions, the code index and the planner are shown."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pygit2

from coder.git.branches import resolve_commit
from coder.git.repository import Repo, open_worktree


def tree_of(repo: Repo, rev: str) -> pygit2.Tree:
    return repo[resolve_commit(repo, rev)].peel(pygit2.Tree)


_LINKS: dict[str, frozenset[str]] = {}  # tree id -> the paths of its symlinks (a few kept)


def committed_links(worktree: Path, *, repo: Repo | None = None) -> frozenset[str]:
    """The paths of the symlinks in the worktree's HEAD commit. Cached by tree id, and a tree
    whose parent commit's tree is cached is derived from it through their diff, so a run
    pays for one walk of the tree, not one per step. ``repo``: the worktree, opened already."""
    w = repo if repo is not None else open_worktree(worktree, writing=False)
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
        for path, link in _changed_entries(parent.tree, commit.tree, ""):
            (links.add if link else links.discard)(path)
        found = frozenset(links)
    else:
        found = frozenset(_tree_links(commit.tree, ""))
    _keep(str(commit.tree_id), found)
    return found


def note_commit(base_tree: str, tree: str, changed: Iterable[tuple[str, int | None]]) -> None:
    """A commit of ``tree`` was made on a commit of ``base_tree``, changing ``changed``
    ((path, mode now: None if deleted) of each file): its symlinks are derived from the base's,
    if they are cached, so the next step's `committed_links` finds them without a walk."""
    before = _LINKS.get(base_tree)
    if before is not None:
        links = set(before)
        for path, mode in changed:
            (links.add if mode == pygit2.enums.FileMode.LINK else links.discard)(path)
        _keep(tree, frozenset(links))


def _keep(tree: str, links: frozenset[str]) -> None:
    if len(_LINKS) >= 8:
        _LINKS.pop(next(iter(_LINKS)))
    _LINKS[tree] = links


def _changed_entries(old: pygit2.Tree, new: pygit2.Tree, prefix: str) -> Iterator[tuple[str, bool]]:
    """(path, whether it is a symlink now) of every file that differs between two trees,
    descending only into subtrees whose ids differ: a step's commit changes a few files, and
    libgit2's tree diff walked all of a 20,000-file tree to find them (30 ms a step)."""
    before = {entry.name: entry for entry in old}
    for entry in new:
        was = before.pop(entry.name, None)
        if was is not None and was.id == entry.id and was.filemode == entry.filemode:
            continue
        path = f"{prefix}{entry.name}"
        if isinstance(entry, pygit2.Tree):
            if isinstance(was, pygit2.Tree):
                yield from _changed_entries(was, entry, f"{path}/")
                continue
            yield from ((p, True) for p in _tree_links(entry, f"{path}/"))
        else:
            yield path, entry.filemode == pygit2.enums.FileMode.LINK
        if isinstance(was, pygit2.Tree):  # a folder replaced by a file: its links are gone
            yield from ((p, False) for p in _tree_links(was, f"{path}/"))
        elif was is not None and isinstance(entry, pygit2.Tree):  # a file replaced by a folder
            yield path, False
    for name, was in before.items():  # removed
        if isinstance(was, pygit2.Tree):
            yield from ((p, False) for p in _tree_links(was, f"{prefix}{name}/"))
        else:
            yield f"{prefix}{name}", False


def _tree_links(tree: pygit2.Tree, prefix: str) -> Iterator[str]:
    for entry in tree:
        if isinstance(entry, pygit2.Tree):
            yield from _tree_links(entry, f"{prefix}{entry.name}/")
        elif entry.filemode == pygit2.enums.FileMode.LINK:
            yield f"{prefix}{entry.name}"


def tree_paths(repo: Repo, commit: str) -> list[str]:
    """Every file path in a commit's tree, sorted (the model's map of the repository)."""
    paths: list[str] = []

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id].peel(pygit2.Tree), f"{prefix}{entry.name}/")
            else:
                paths.append(f"{prefix}{entry.name}")

    walk(tree_of(repo, commit), "")
    return sorted(paths)


def tree_blobs(repo: Repo, tree_id: str) -> list[tuple[str, str]]:
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


def tree_id(repo: Repo, rev: str) -> str:
    """The id of the tree ``rev`` (a commit, branch, ``HEAD``...) names."""
    return str(repo.revparse_single(rev).peel(pygit2.Tree).id)


def blob_data(repo: Repo, blob_id: str) -> bytes:
    """The contents of a blob."""
    data: bytes = repo[blob_id].peel(pygit2.Blob).data
    return data


def hash_blob(data: bytes) -> str:
    """The id git gives ``data`` as a blob (``git hash-object``)."""
    return str(pygit2.hash(data))


def file_entries(repo: Repo, rev: str) -> list[tuple[str, str, int]]:
    """(path, blob id, mode) of every blob of ``rev``'s tree, symlinks (mode 0o120000)
    included, in the tree's own order."""
    entries: list[tuple[str, str, int]] = []

    def walk(node: pygit2.Tree, prefix: str) -> None:
        for entry in node:
            if entry.type_str == "tree":
                walk(repo[entry.id].peel(pygit2.Tree), f"{prefix}{entry.name}/")
            elif entry.type_str == "blob":
                entries.append((f"{prefix}{entry.name}", str(entry.id), entry.filemode))

    walk(repo.revparse_single(rev).peel(pygit2.Tree), "")
    return entries


def file_at(repo: Repo, commit: str, path: str) -> bytes | None:
    """The contents of the file at ``path`` (at the top of the tree, or below it) in
    ``commit``, None when that is no file (a directory, a submodule)."""
    tree = repo[commit].peel(pygit2.Tree)
    blob = repo[tree[path].id]
    return blob.data if isinstance(blob, pygit2.Blob) else None
