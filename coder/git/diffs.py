"""Diffs between commits, or between a commit and a worktree's files: patches, stats,
changed files and lines."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2

from coder.display import escaped
from coder.git import objects
from coder.git.filters import utf8
from coder.git.repository import Repo, open_worktree, under_coder_dir
from coder.git.staging import Change, changes
from coder.git.trees import tree_of
from coder.git.workdir import WORKDIR_FLAGS


def _diff(repo: Repo, old: str, new: str) -> pygit2.Diff:
    d = tree_of(repo, old).diff_to_tree(tree_of(repo, new))
    d.find_similar()
    return d


def diff_patch(
    repo: Repo, old: str, new: str | None = None, *, worktree: Path | None = None
) -> str:
    """Unified diff ``old``..``new``; with ``new`` None, ``old`` against the files of
    ``worktree`` (default: the repo's own working tree), untracked files included. An unusual
    file name is quoted in the headers as git quotes it (libgit2 does), so none forges a
    line; the changed lines are as they are."""
    if new is not None:
        return _diff(repo, old, new).patch or ""
    w = open_worktree(worktree, writing=False) if worktree is not None else repo
    d = tree_of(w, old).diff_to_workdir(WORKDIR_FLAGS)
    # .coder/ is normally ignored via info/exclude; drop it here too in case it is not.
    return "".join(
        p.text or "" for p in d if p is not None and not under_coder_dir(p.delta.new_file.path)
    )


def added_lines(worktree: Path, old: str) -> dict[str, set[int]]:
    """The lines (1-based, new side) each file of ``worktree`` adds or changes against the
    commit ``old``, untracked files included; names from git's structured diff, never parsed
    back from patch text (where git quotes unusual names: ``+++ "b/caf\\303\\251.py"``)."""
    w = open_worktree(worktree, writing=False)
    found: dict[str, set[int]] = {}
    for patch in tree_of(w, old).diff_to_workdir(WORKDIR_FLAGS):
        if patch is None or patch.delta.status == pygit2.enums.DeltaStatus.DELETED:
            continue
        path = patch.delta.new_file.path
        if under_coder_dir(path):
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


def step_patch(repo: Repo, old: str, new: str) -> str:
    """``diff_patch(repo, old, new)`` at the cost of what changed: the trees are walked
    through their ids, and each changed file is diffed on its own (a moved file shows as
    deleted and added, with no rename detection)."""
    return changes_patch(repo, changes(repo, tree_of(repo, old).id, tree_of(repo, new).id))


def changes_patch(repo: Repo, found: Iterable[Change]) -> str:
    """Unified diff of ``found`` (``staging.Change``), as ``git diff --no-renames`` prints it.
    ObjectsMissing when a blob is gone (a prune took a step's blob before its index had it)."""
    try:
        return "".join(_change_patch(repo, change) for change in found)
    except KeyError as exc:
        raise objects.gone("the diff of the changes", [str(exc.args[0])]) from None


# libgit2 takes a path only as UTF-8 text: a name that is not (its raw bytes kept as
# surrogates) is diffed under this stand-in, then named as git names it (`"a/bad\377.txt"`).
_STAND_IN = "coder-name-that-is-not-utf-8"


def _change_patch(repo: Repo, change: Change) -> str:
    old, new = _side(repo, change.old), _side(repo, change.new)
    path = change.path
    raw = not path.isascii() and not utf8(path)
    named = _STAND_IN if raw else path
    text = pygit2.Patch.create_from(old, new, old_as_path=named, new_as_path=named).text or ""
    sides = {side: f"{side}/{path}" for side in "ab"}
    if raw:
        inner = escaped(path.replace("\\", "\\\\").replace('"', '\\"'))
        sides = {side: f'"{side}/{inner}"' for side in "ab"}
        for side, shown in sides.items():
            text = text.replace(f"{side}/{_STAND_IN}", shown)
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
        head = f"diff --git {sides['a']} {sides['b']}\nold mode {old_mode}\nnew mode {new_mode}"
        head += f"\nindex {index}" if index else ""
    if _GITLINK in (change.old or (0,))[:1] + (change.new or (0,))[:1]:  # ids, not the text's
        ids = (e[1][:7] if e else "0000000" for e in (change.old, change.new))
        head = re.sub(r"\nindex \S+", "\nindex {}..{}".format(*ids), head)
    if sep == "\n--- " and "\n@@ " not in body:  # an empty file added or deleted: no hunk,
        sep = ""  # and git prints no ---/+++ lines for it
    return head + sep + body if sep else head + "\n"


def _side(repo: Repo, entry: tuple[int, str] | None) -> Any:
    """What ``pygit2.Patch.create_from`` compares for one side of a change (the Blob object
    is kept by the caller while the patch is made: libgit2 reads it then)."""
    if entry is None:
        return None
    mode, oid = entry
    if mode == _GITLINK:
        return f"Subproject commit {oid}\n".encode()
    return repo[oid].peel(pygit2.Blob)


def diff_stat(
    repo: Repo,
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


def diff_files(repo: Repo, old: str, new: str) -> list[FileChange]:
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


def changed_files_between(repo: Repo, old: str, new: str) -> list[str]:
    """Sorted paths touched between two commits (both sides of a rename)."""
    paths: set[str] = set()
    for delta in _diff(repo, old, new).deltas:
        paths.update((delta.old_file.path, delta.new_file.path))
    return sorted(paths)
