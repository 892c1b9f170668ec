"""A worktree's files against its HEAD: what changed (``.coder/`` and ignored files never
count), untracked files removed, and what the model's git tools read and apply there."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import ApplyLocation, DiffOption, FileStatus, RepositoryOpenFlag

from coder.errors import EnvironmentProblem, PatchProblem
from coder.files import nofollow
from coder.git.repository import Repo, open_worktree, under_coder_dir
from coder.git.trees import blob_data, tree_blobs
from coder.policy import tmpdirs
from coder.policy.confine import confined

WORKDIR_FLAGS = (
    DiffOption.INCLUDE_UNTRACKED
    | DiffOption.RECURSE_UNTRACKED_DIRS
    | DiffOption.SHOW_UNTRACKED_CONTENT
    | DiffOption.INCLUDE_TYPECHANGE
)


_WORKDIR_CHANGES = (
    FileStatus.WT_NEW
    | FileStatus.WT_MODIFIED
    | FileStatus.WT_DELETED
    | FileStatus.WT_TYPECHANGE
    | FileStatus.WT_RENAMED
)


def status(w: Repo) -> dict[str, int]:
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
        and not under_coder_dir(p)
    }


def changed_paths(worktree: Path) -> list[str]:
    """Sorted relative posix paths that differ from HEAD: new, modified, deleted, renamed
    (both sides). Honours .gitignore/info/exclude; never anything under ``.coder/``."""
    return sorted(status(open_worktree(worktree, writing=False)))


def unstaged_paths(worktree: Path) -> list[str]:
    """Sorted paths whose file differs from the index (untracked ones included, ``.coder/`` and
    ignored files not): what was changed since the index was last written. Read without HEAD,
    whose commit may be gone."""
    w = open_worktree(worktree, writing=False)
    deltas = w.index.diff_to_workdir(WORKDIR_FLAGS).deltas
    return sorted({d.new_file.path for d in deltas if not under_coder_dir(d.new_file.path)})


def is_clean(worktree: Path) -> bool:
    """True if nothing differs from HEAD besides ignored files and ``.coder/``."""
    return not status(open_worktree(worktree, writing=False))


def remove_untracked(w: Repo, worktree: Path) -> None:
    """Delete untracked, non-ignored files (never ``.coder/``) and the dirs they leave empty
    (an untracked nested repository shows up as "dir/"); nothing is followed through a link."""
    root = worktree.resolve()
    for rel, flags in status(w).items():
        if flags == FileStatus.WT_NEW:
            nofollow.remove(root, rel.rstrip("/"))


# --- what the model's git tools read and apply ------------------------------------------


def open_files(root: str | Path) -> Repo:
    """The repository whose working tree is exactly ``root`` (no upward search)."""
    try:
        return pygit2.Repository(str(root), RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, OSError) as exc:
        raise EnvironmentProblem(f"the worktree is not a readable git repository: {exc}") from None


_INDEX_CODES = (
    (FileStatus.INDEX_NEW, "A"),
    (FileStatus.INDEX_MODIFIED, "M"),
    (FileStatus.INDEX_DELETED, "D"),
    (FileStatus.INDEX_RENAMED, "R"),
    (FileStatus.INDEX_TYPECHANGE, "T"),
)
_WT_CODES = (
    (FileStatus.WT_MODIFIED, "M"),
    (FileStatus.WT_DELETED, "D"),
    (FileStatus.WT_RENAMED, "R"),
    (FileStatus.WT_TYPECHANGE, "T"),
)


def _porcelain(flags: int) -> str:
    if flags & FileStatus.CONFLICTED:
        return "UU"
    index = next((c for f, c in _INDEX_CODES if flags & f), " ")
    if flags & FileStatus.WT_NEW and index == " ":
        return "??"
    return index + next((c for f, c in _WT_CODES if flags & f), " ")


def porcelain_status(repo: Repo) -> dict[str, str]:
    """Each changed path (ignored files and ``.coder/`` left out) with its two-letter code, as
    ``git status --porcelain`` writes it (``??`` a new file)."""
    return {
        p: _porcelain(f)
        for p, f in repo.status(untracked_files="all", ignored=False).items()
        if f != FileStatus.CURRENT and not f & FileStatus.IGNORED and not under_coder_dir(p)
    }


@dataclass(frozen=True)
class FilePatch:
    path: str  # the new path, or the old one of a deleted file
    new_path: str
    status: str  # git's letter (A, D, M, R, T, ? untracked)
    added: int
    removed: int
    text: str


def head_patches(repo: Repo, *, staged: bool) -> list[FilePatch]:
    """The changes against HEAD (against nothing before the first commit), file by file: the
    index's with ``staged``, else the working files', untracked files included; ``.coder/``
    left out."""
    if repo.head_is_unborn:  # no commit yet: everything is new
        tree = repo[repo.TreeBuilder().write()].peel(pygit2.Tree)
    else:
        tree = repo.head.peel(pygit2.Tree)
    diff = tree.diff_to_index(repo.index) if staged else tree.diff_to_workdir(WORKDIR_FLAGS)
    found = []
    for patch in diff:
        if patch is None:  # libgit2 gives no patch for an unchanged (e.g. mode-only) entry
            continue
        delta = patch.delta
        _, added, removed = patch.line_stats
        path = delta.new_file.path or delta.old_file.path
        if under_coder_dir(path):
            continue
        found.append(
            FilePatch(
                path, delta.new_file.path, delta.status_char(), added, removed, patch.text or ""
            )
        )
    return found


def check_patch(repo: Repo, text: str) -> None:
    """PatchProblem unless the unified diff ``text`` applies to the working files."""
    try:
        repo.applies(pygit2.Diff.parse_diff(text), ApplyLocation.WORKDIR, raise_error=True)
    except pygit2.GitError as exc:
        raise PatchProblem(
            f"the patch does not apply: {exc}",
            hint="re-read the files and make the patch again, or use fs_edit",
        ) from None


def apply_patch(repo: Repo, text: str, root: Path) -> None:
    """Apply the unified diff ``text`` to the working files at ``root``. libgit2 writes the
    files confined like the commands, so a directory swapped for a link by a process the
    model left running makes the write fail (PatchProblem), not land outside."""
    diff = pygit2.Diff.parse_diff(text)
    try:
        confined(root, lambda: repo.apply(diff, ApplyLocation.WORKDIR))
    except (pygit2.GitError, PermissionError) as exc:
        raise PatchProblem(f"the patch did not apply: {exc}") from None


def patched(text: str, files: Mapping[str, tuple[bytes, int] | None]) -> dict[str, bytes | None]:
    """What applying the unified diff ``text`` would make of ``files`` (path: (content, mode),
    None for a file that does not exist), worked out by libgit2 in a scratch repository, so
    it is what `apply_patch` writes, line ends and missing final newlines included; the
    working files are not touched. None: the patch deletes the file."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix=tmpdirs.prefix("patch")) as scratch:
        repo = pygit2.init_repository(scratch)
        for rel, found in files.items():
            if found is not None:
                target = Path(scratch, rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(found[0])
                os.chmod(target, found[1] & 0o755 | 0o600)
        try:
            repo.apply(pygit2.Diff.parse_diff(text), ApplyLocation.WORKDIR)
        except pygit2.GitError as exc:
            raise PatchProblem(f"the patch does not apply: {exc}") from None
        return {
            rel: Path(scratch, rel).read_bytes() if Path(scratch, rel).is_file() else None
            for rel in files
        }


def ignored_dirs(root: str) -> Callable[[str], bool] | None:
    """A predicate telling git-ignored directories (build/, dist/, ...), or None without git."""
    try:
        repo = pygit2.Repository(root, RepositoryOpenFlag.NO_SEARCH)
    except Exception:  # noqa: BLE001 - no repository (or an unreadable one): skip the check
        return None

    def ignored(rel_dir: str) -> bool:
        try:
            return bool(repo.path_is_ignored(rel_dir + "/"))
        except Exception:  # noqa: BLE001
            return False

    return ignored


@dataclass(frozen=True)
class WorkingFiles:
    committed: Mapping[str, str]  # (path: blob id) of HEAD's regular files
    changed: frozenset[str]  # paths that differ from HEAD, new ones included, ignored ones not
    read_blob: Callable[[str], bytes]  # a committed file's contents by its blob id


def working_files(root: Path) -> WorkingFiles:
    """The files of the working tree at ``root`` (or the one above it) as the code index
    reads them: HEAD's blobs, and which paths the working files change."""
    repo = pygit2.Repository(str(root))
    committed: dict[str, str] = {}
    if not repo.head_is_unborn:
        committed = dict(tree_blobs(repo, str(repo.head.peel(pygit2.Tree).id)))
    changed = frozenset(
        path
        for path, flags in repo.status(untracked_files="all").items()
        if not flags & FileStatus.IGNORED
    )
    return WorkingFiles(committed, changed, lambda blob: blob_data(repo, blob))
