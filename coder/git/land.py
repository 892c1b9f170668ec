"""Landing work on a base branch (used by `coder merge` and `coder revert`): trees merged in
memory, commits written without touching a working tree, ref moves as compare-and-swap inside
ref transactions, and a checkout of the base branch brought along path by path.

Nothing here touches a working tree except `apply_checkout_update`, which writes the checkout
where the base branch is checked out: only the merged paths, and only those whose index entry
and file still hold the old tip's content (or already the new one), so no uncommitted byte of
the user's is ever overwritten.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pygit2

from coder.errors import BranchMoved, EnvironmentProblem, RunFailed
from coder.files import nofollow
from coder.git import commits, filters, objects
from coder.git.branches import branch_ref, branch_tip, checked_out_at
from coder.git.commits import TRAILER_MERGE, TRAILER_TASK, commits_between, parse_trailers
from coder.git.diffs import changed_files_between
from coder.git.repository import (
    environment_error,
    git_failure,
    identity,
    open_worktree,
    retry_on_pruned_write,
    retry_on_ref_lock,
)
from coder.git.staging import brings
from coder.git.workdir import status

_LINK = int(pygit2.enums.FileMode.LINK)
_GITLINK = int(pygit2.enums.FileMode.COMMIT)
_EXECUTABLE = int(pygit2.enums.FileMode.BLOB_EXECUTABLE)


def merged_tree(repo: pygit2.Repository, ours: str, theirs: str) -> tuple[str | None, list[str]]:
    """Three-way merge of two commits in memory (no index file, no working tree): the merged
    tree's hex and [], or None and the conflicting paths, sorted."""
    o, t = repo[ours].peel(pygit2.Commit), repo[theirs].peel(pygit2.Commit)
    base = repo.merge_base(o.id, t.id)
    ancestor = (repo[base] if base else repo[repo.TreeBuilder().write()]).peel(pygit2.Tree)
    index = repo.merge_trees(ancestor, o.tree, t.tree)
    if index.conflicts is not None:
        return None, sorted({(a or b or c).path for a, b, c in index.conflicts})
    return str(retry_on_pruned_write(lambda: index.write_tree(repo))), []


def write_commit(repo: pygit2.Repository, *, tree: str, parents: list[str], message: str) -> str:
    """A commit object on no branch yet, held from git's prune with the objects it brings
    (`commits.write_commit`): the branch moves later, by compare-and-swap (`land`)."""
    who = identity(repo)
    oid, first = pygit2.Oid(hex=tree), pygit2.Oid(hex=parents[0])
    brought = brings(repo, repo[first].peel(pygit2.Tree).id, oid)
    ids = [pygit2.Oid(hex=p) for p in parents]
    return str(commits.write_commit(repo, who.author, who.committer, message, oid, ids, brought))


def write_revert(repo: pygit2.Repository, commit: str, *, onto: str, message: str) -> str:
    """A commit on no branch, child of ``onto``, that undoes ``commit``'s change (computed in
    memory: no index file, no working tree). Conflicts raise ``RunFailed`` naming the paths."""
    index = repo.revert_commit(repo[commit].peel(pygit2.Commit), repo[onto].peel(pygit2.Commit))
    if index.conflicts is not None:
        paths = sorted({(a or b or c).path for a, b, c in index.conflicts})
        raise RunFailed(
            f"reverting {commit[:12]} conflicts in {', '.join(paths)}",
            hint="later commits changed the same lines; reset instead (--mode reset)",
        )
    tree = retry_on_pruned_write(lambda: index.write_tree(repo))
    return write_commit(repo, tree=str(tree), parents=[onto], message=message)


def commit_tree(repo: pygit2.Repository, commit: str) -> str:
    return str(repo[commit].peel(pygit2.Commit).tree_id)


def first_parent(repo: pygit2.Repository, commit: str) -> str | None:
    parents = repo[commit].peel(pygit2.Commit).parent_ids
    return str(parents[0]) if parents else None


def is_ancestor(repo: pygit2.Repository, ancestor: str, descendant: str) -> bool:
    """True if ``ancestor`` is ``descendant`` or in its history (False if either is gone)."""
    if ancestor == descendant:
        return True
    try:
        return bool(repo.descendant_of(pygit2.Oid(hex=descendant), pygit2.Oid(hex=ancestor)))
    except (KeyError, ValueError, pygit2.GitError):
        return False


def ref_target(repo: pygit2.Repository, refname: str) -> str | None:
    """Hex a ref points at directly (a tag object for an annotated tag), None if missing."""
    ref = repo.references.get(refname)
    return None if ref is None else str(ref.target)


def find_merge_commit(
    repo: pygit2.Repository, *, branch: str, since: str, task_id: str
) -> tuple[str, str] | None:
    """The newest commit in ``since..branch`` carrying ``Coder-Task: task_id`` and a
    ``Coder-Merge: MODE`` trailer, as (hex, mode); None if there is none."""
    for commit in reversed(commits_between(repo, branch, since)):
        t = parse_trailers(commit.message)
        if t.get(TRAILER_TASK.lower()) == task_id and TRAILER_MERGE.lower() in t:
            return str(commit.id), t[TRAILER_MERGE.lower()]
    return None


def landed_from_reflog(
    repo: pygit2.Repository, branch: str, commit: str, *, prefix: str = "coder: merge"
) -> str | None:
    """The value ``branch`` had before coder moved it to ``commit`` (newest such reflog
    entry whose message starts with ``prefix``), None if the reflog does not say."""
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None:
        return None
    for entry in ref.log():
        if str(entry.oid_new) == commit and (entry.message or "").startswith(prefix):
            return str(entry.oid_old)
    return None


def land(
    repo: pygit2.Repository,
    *,
    branch: str,
    target: str,
    expected_tip: str,
    tag: str,
    tag_expected: str | None,
    message: str,
) -> None:
    """Point ``branch`` and tag ``tag`` at ``target`` in one ref transaction, only if the branch
    still points at ``expected_tip`` and the tag at ``tag_expected`` (None: absent). Either
    check failing raises ``BranchMoved`` and moves nothing."""
    refname, tagref = f"refs/heads/{branch}", f"refs/tags/{tag}"

    def move() -> None:
        with repo.transaction() as tx:
            tx.lock_ref(refname)
            tx.lock_ref(tagref)
            _check_ref(repo, refname, expected_tip)
            _check_ref(repo, tagref, tag_expected)
            # The branch first: a crash between the two leaves a missing tag, which
            # `coder merge` finishes, never a tag on a commit that did not land.
            tx.set_target(refname, pygit2.Oid(hex=target), message=message)
            tx.set_target(tagref, pygit2.Oid(hex=target), message=message)

    try:
        retry_on_ref_lock(move)
    except pygit2.GitError as exc:
        raise EnvironmentProblem(
            f"cannot move {branch} to {target[:12]}: {exc}",
            hint="if no git process is running, delete the stale .lock file it names",
        ) from None
    objects.release(repo, target)


def set_tag(repo: pygit2.Repository, tag: str, target: str, *, expected: str | None) -> None:
    """Point ``tag`` at ``target`` if it still points at ``expected`` (None: absent)."""
    tagref = f"refs/tags/{tag}"

    def move() -> None:
        with repo.transaction() as tx:
            tx.lock_ref(tagref)
            _check_ref(repo, tagref, expected)
            tx.set_target(tagref, pygit2.Oid(hex=target), message=f"coder: tag {target[:12]}")

    retry_on_ref_lock(move)


def _check_ref(repo: pygit2.Repository, refname: str, expected: str | None) -> None:
    actual = ref_target(repo, refname)
    if actual != expected:
        name = refname.removeprefix("refs/heads/").removeprefix("refs/")
        was = expected[:12] if expected else "absent"
        now = actual[:12] if actual else "deleted"
        raise BranchMoved(
            f"{name} moved while merging (expected {was}, now {now}); nothing was landed",
            hint="someone updated it meanwhile; run the merge again",
        )


def checked_out_in(repo: pygit2.Repository, branch: str) -> Path | None:
    """The checkout (main or linked worktree) where ``branch`` is checked out, else None."""
    return checked_out_at(repo, f"refs/heads/{branch}")


@dataclass(frozen=True)
class CheckoutUpdate:
    """What moving a checkout from ``old`` to ``new`` means for each path that differs:
    ``pending`` paths still hold ``old`` (or are half-way: index or file already ``new``) and
    are safe to write; ``done`` ones hold ``new``; ``blocked`` ones hold the user's own
    changes and must not be written. ``busy`` names an unfinished merge/rebase there."""

    checkout: Path
    pending: tuple[str, ...]
    done: tuple[str, ...]
    blocked: tuple[str, ...]
    busy: str | None = None
    ignored: tuple[str, ...] = ()  # blocked by a git-ignored file (`git stash -u` skips it)
    linked: tuple[str, ...] = ()  # blocked by a link (or file) where a directory must be


_Entry = tuple[str, int] | None  # (blob hex, file mode) or absent


def _entry(tree: pygit2.Tree, path: str) -> _Entry:
    try:
        obj = tree[path]
    except KeyError:
        return None
    return None if obj.type_str == "tree" else (str(obj.id), int(obj.filemode))


def _index_has(index: pygit2.Index, path: str, entry: _Entry) -> bool:
    try:
        found = index[path]
    except KeyError:
        found = None
    if entry is None:
        return found is None
    return found is not None and (str(found.id), int(found.mode)) == entry


def _file_has(w: pygit2.Repository, root: Path, path: str, entry: _Entry, filemode: bool) -> bool:
    full = root / path
    if entry is None:
        return not os.path.lexists(full)
    oid, mode = entry
    if mode == _GITLINK:  # a submodule: its own repository, not ours to compare
        return full.is_dir()
    if mode == _LINK:
        return full.is_symlink() and str(pygit2.hash(os.fsencode(os.readlink(full)))) == oid
    if full.is_symlink() or not full.is_file():
        return False
    if filemode and bool(full.stat().st_mode & stat.S_IXUSR) != (mode == _EXECUTABLE):
        return False
    return filters.blob_id(w, path) == oid  # through git's filters (eol, drivers, ...)


def _open_checkout(checkout: Path) -> pygit2.Repository:
    try:
        return pygit2.Repository(str(checkout), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, OSError) as exc:
        raise environment_error(exc, Path(checkout)) from None


def plan_checkout_update(
    checkout: Path, old: str, new: str, *, taken: str | None = None
) -> CheckoutUpdate:
    """Classify every path that differs between ``old`` and ``new`` in ``checkout``.
    ``taken``: a commit on top of ``old`` that holds the checkout's uncommitted changes (a run
    started with `--include-uncommitted`); a path whose file or index still holds what it took
    is the user's edit already in ``new``, not one the update would lose."""
    w = _open_checkout(checkout)
    root = Path(w.workdir)
    old_tree, new_tree = w[old].peel(pygit2.Tree), w[new].peel(pygit2.Tree)
    taken_tree = w[taken].peel(pygit2.Tree) if taken else None
    paths: set[str] = set()
    for delta in old_tree.diff_to_tree(new_tree).deltas:
        paths.update((delta.old_file.path, delta.new_file.path))
    index = w.index
    index.read(False)
    conflicted = {(a or b or c).path for a, b, c in (index.conflicts or ())}
    filemode = bool(w.config.get_bool("core.filemode")) if "core.filemode" in w.config else True
    pending, done, blocked = [], [], []
    linked: list[str] = []
    for path in sorted(paths):
        was, now = _entry(old_tree, path), _entry(new_tree, path)
        if path in conflicted:
            blocked.append(path)
            continue
        # A link (or file) of the user's where a directory of this path must be: git refuses
        # or replaces it; coder refuses, and never writes through it. One the update itself
        # replaces (a tracked link becoming a directory; sorted before its paths) is fine.
        link = nofollow.leading_link(root, path)
        if link is not None and link not in pending:
            blocked.append(path)
            linked.append(link)
            continue
        took = _entry(taken_tree, path) if taken_tree is not None else was
        in_index = [e for e in (was, now) if _index_has(index, path, e)]
        if not in_index and took != was and _index_has(index, path, took):
            in_index = [was]
        on_disk: list[_Entry]
        if link is not None:  # behind a link the update replaces: nothing is there yet
            on_disk = [e for e in (was, now) if e is None]
        else:
            on_disk = [e for e in (was, now) if _file_has(w, root, path, e, filemode)]
            if not on_disk and took != was and _file_has(w, root, path, took, filemode):
                on_disk = [was]
        if not in_index or not on_disk:
            blocked.append(path)
        elif in_index == [now] and on_disk == [now]:
            done.append(path)
        else:
            pending.append(path)
    for path in pending:  # refuse now, before anything lands, what could not be written
        filters.check_available(w, path)
    busy = None
    if w.state() != pygit2.enums.RepositoryState.NONE:
        busy = pygit2.enums.RepositoryState(w.state()).name.lower().replace("_", " ")
    ignored = tuple(p for p in blocked if os.path.lexists(root / p) and w.path_is_ignored(p))
    return CheckoutUpdate(
        Path(checkout),
        tuple(pending),
        tuple(done),
        tuple(blocked),
        busy,
        ignored,
        tuple(dict.fromkeys(linked)),
    )


def apply_checkout_update(
    checkout: Path,
    new: str,
    paths: tuple[str, ...],
    *,
    before_index: Callable[[Path], None] | None = None,
) -> None:
    """Write ``new``'s version of ``paths`` (from a ``CheckoutUpdate``'s ``pending``) into the
    checkout's files, then its index, as ``git checkout`` would write them (through git's
    filters: eol, ident, drivers). Deletions go first so a file can replace a directory, then
    `.gitattributes` files, which decide how the others are written. Files are replaced by
    rename, so each is either old or new; a crash part-way leaves paths that a new plan still
    finds pending. ``before_index`` is called with the index's lock file (`index_lock`) just
    before the index is written: a kill inside that write leaves the lock behind."""
    w = _open_checkout(checkout)
    root = Path(w.workdir)
    tree = w[new].peel(pygit2.Tree)
    entries = {path: _entry(tree, path) for path in paths}

    def order(path: str) -> tuple[bool, bool, str]:
        return entries[path] is not None, not path.endswith(".gitattributes"), path

    try:
        for path in sorted(paths, key=order):
            entry = entries[path]
            if entry is None:
                _remove_checkout_file(root, path)
            else:
                _write_checkout_file(w, root, path, entry)
        if before_index is not None:
            before_index(index_lock(checkout))
        index = w.index
        index.read(True)
        for path in paths:
            entry = entries[path]
            if entry is None:
                if path in index:
                    index.remove(path)
            elif entry[1] == _GITLINK:
                mode = pygit2.enums.FileMode(entry[1])
                index.add(pygit2.IndexEntry(path, pygit2.Oid(hex=entry[0]), mode))
            elif filters.needs_git(w, path) is None:
                index.add(path)  # hashes the file just written and records its stat data
        index.write()
        # paths only git can hash: until git records them the index keeps the old entry,
        # so a crash in between leaves them pending, never recorded with a wrong blob
        filters.stage(w, [p for p, e in entries.items() if e is not None and e[1] != _GITLINK])
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, "update the checked-out files", Path(checkout)) from None


def index_lock(checkout: Path) -> Path:
    """The lock file git (and libgit2) hold while writing the checkout's index: `.git/
    index.lock`, or the linked worktree's `.git/worktrees/NAME/index.lock`."""
    return Path(_open_checkout(checkout).path) / "index.lock"


# `.NAME.coder-tmp` (nofollow.write_file) and `.NAME.coder-PID.tmp` (coder's earlier checkout
# writes): a kill between writing one and renaming it over NAME leaves it.
_OLD_TEMP = re.compile(r"\.(?P<name>.+)\.coder-[0-9]+\.tmp", re.DOTALL)


def sweep_temp_files(checkout: Path, paths: tuple[str, ...]) -> list[str]:
    """Remove the temporary files a killed checkout update left next to ``paths`` in the
    checkout; never a directory, a tracked file or one of ``paths``, never through a link.
    Returns them, relative."""
    index = _open_checkout(checkout).index
    names: dict[str, set[str]] = {}
    for path in paths:
        parent, _, name = path.rpartition("/")
        names.setdefault(parent, set()).add(name)
    removed = []
    for parent, wanted in sorted(names.items()):
        temps = {nofollow.temp_name(name) for name in wanted}
        try:
            with nofollow.open_dir(checkout, parent) as fd:
                for entry in os.listdir(fd):
                    old = _OLD_TEMP.fullmatch(entry)
                    if entry not in temps and (old is None or old["name"] not in wanted):
                        continue
                    rel = f"{parent}/{entry}" if parent else entry
                    mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
                    if stat.S_ISDIR(mode) or rel in paths or rel in index:
                        continue
                    os.unlink(entry, dir_fd=fd)
                    removed.append(rel)
        except OSError:  # the directory is gone or not one (LinkInTheWay): nothing to sweep
            continue
    return removed


def _remove_checkout_file(root: Path, path: str) -> None:
    nofollow.remove(root, path)


def _write_checkout_file(
    w: pygit2.Repository, root: Path, path: str, entry: tuple[str, int]
) -> None:
    """Replace the file by rename, never through a link (``nofollow``): a checkout may hold
    links of the user's, or ones a command of theirs made."""
    oid, mode = entry
    if mode == _GITLINK:
        with nofollow.open_dir(root, path, create=True):
            return
    if mode == _LINK:
        nofollow.write_file(root, path, b"", link=w[oid].peel(pygit2.Blob).data)
        return
    perms = 0o777 if mode == _EXECUTABLE else 0o666  # less the umask, as git does
    data = filters.smudged(w, path, oid)
    nofollow.write_file(root, path, data, mode=perms, crash_point="merge_file_write")


def left_behind_at(repo: pygit2.Repository, worktree: Path, *, reflog_prefix: str) -> str | None:
    """The commit the branch was at before its last move to the tip, if that move's reflog
    message starts with ``reflog_prefix`` and the worktree still holds (some of) that commit's
    files instead of the tip's: a process killed between moving the ref and updating the files
    (``move_branch`` then ``discard_changes``). None when the worktree has anything else,
    so only changes that git can give back are ever recognised as left behind."""
    w = open_worktree(worktree, writing=False)
    changed = set(status(w))
    if not changed:
        return None
    branch = branch_ref(w, Path(worktree)).removeprefix("refs/heads/")
    tip = branch_tip(repo, branch)
    old = landed_from_reflog(repo, branch, tip, prefix=reflog_prefix) if tip else None
    if tip is None or old is None or old == tip:
        return None
    if not changed <= set(changed_files_between(repo, old, tip)):
        return None
    plan = plan_checkout_update(Path(worktree), old, str(tip))
    return None if plan.blocked or plan.busy else old
