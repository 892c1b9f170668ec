"""A step's changes in one scan of its worktree: what it changed, staged, as the tree its commit
will record.

    stage(worktree, base)   scan and stage everything the step changed (as `git add -A` would,
                            less `.coder/`, nested repositories and submodules), then take the
                            change set: the staged tree against the base commit's tree
    Staged                  that tree, its changes, and the directories the scan saw but
                            nothing stages (nested repositories)
    changes(w, old, new)    the entries two trees differ in, walking only subtrees whose ids
                            differ: it costs what changed, not the size of the tree

The verify stage stages and checks this change set; the commit then only writes the commit
object for the tree (`commits.commit_step(staged=...)`): what was checked is exactly what is
committed, and the tree is walked once per step.

Two ways of scanning and staging, by the index's size (`IN_PROCESS_BELOW`, from bench/scan.py,
where each is faster): libgit2 in process (its status, index.add, write_tree) for a small tree;
for a large one the git program: `git status --porcelain=v2` (it trusts the index's stat data,
keeps an untracked cache, stats files on several threads), `git update-index` of what it
reported and `git write-tree`. libgit2 reads every directory and writes the index about twice
as slowly, which costs more than three processes from about 8,000 files on. A file a filter
driver or a working-tree-encoding covers goes through git either way (git's semantics: its
`clean` runs), so both ways stage the same tree.

The worktree is one a command has touched, and git runs programs its config names (config a
command can write). So every git call here runs confined like the commands
(`confine.spawner_for`): a filter driver a planted `config.worktree` names can do no more than
the command that planted it. Besides: `core.fsmonitor` off, no hooks, submodules ignored
(`--ignore-submodules=all`: coder checks them itself, `submodules.changed_submodules`; git would
otherwise run `git status` inside each), the git dir and work tree given (the `.git` file is
the command's to write; the executor's guard puts it back before verify). The confined git
cannot write the repository's objects, so its objects go to a quarantine directory (as `git
receive-pack` does) and coder copies them into the object database, each read back against
its id: nothing a filter planted there can stand in for an object it does not match.

`.coder/` is never staged (a command's `git add -f` there is undone), nested repositories are
seen but not staged, submodules are never staged, and a conflicted index (a merge a command
left half-done) is an error naming the paths.

A `git gc --prune=now` may run meanwhile (a user's or an IDE's maintenance). What libgit2
writes as it stages is held in memory (coder.git.objects.hold_writes), out of any prune's
reach, until it goes to disk with the index that names it (`settle`) or in the step commit's
kept pack. An object libgit2 found on disk already and so did not write is reached by
nothing, though: one the prune took is found missing (by libgit2's tree writer, the walk of
the changes or `_check_objects`) and everything is staged again from the files, with the
index read afresh from the base (`stage`). The git program's objects are reached by the index
it writes. `Staged.brings` names what the step's commit holds from the prune until its branch
reaches it (coder.git.objects).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pygit2
from pygit2.enums import FileStatus

from coder.errors import EnvironmentProblem, ObjectsMissing
from coder.git import filters, objects
from coder.git.repository import (
    clear_stale_index_lock,
    common_dir,
    git_failure,
    open_worktree,
    retry_on_index_lock,
)
from coder.policy import confine

if TYPE_CHECKING:
    from coder.policy.confine import Confinement

CODER_DIR = ".coder"
_TIMEOUT_S = 600
# Options of every git call on a worktree (see the module docstring).
_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.untrackedCache=true",
    "status.showUntrackedFiles=all",  # the untracked cache serves `-uall` only when so created
    "core.splitIndex=false",  # libgit2 (the discard, `coder diff`) cannot read a split index
)
_TREE = pygit2.enums.FileMode.TREE
_GITLINK = pygit2.enums.FileMode.COMMIT
# Trees of fewer index entries are scanned and staged by libgit2 in process, larger ones by the
# git program: where each costs less (bench/scan.py).
IN_PROCESS_BELOW = 8_000
# How many times a step's changes are staged when a prune takes what was staged (`stage`).
_STAGINGS = 3

Entry = tuple[int, str]  # (file mode, object id) of a tree entry


@dataclass(frozen=True)
class Change:
    """One path the staged tree changes: its entry in the base and in the staged tree."""

    path: str
    old: Entry | None  # None: added
    new: Entry | None  # None: deleted


@dataclass(frozen=True)
class Staged:
    base: str  # the commit the change set is taken against
    tree: str  # the staged tree: what the step's commit records
    changes: tuple[Change, ...]  # sorted by path
    unstaged: tuple[str, ...] = ()  # directories seen but not staged ("nested/")
    trees: tuple[str, ...] = ()  # the subtrees of `tree` the base's lacks
    # `stage(hold=True)`: the repository whose memory holds the new objects and the index
    # until `settle` (or the commit's kept pack) puts them on disk
    held: pygit2.Repository | None = field(default=None, compare=False, repr=False)

    @property
    def paths(self) -> list[str]:
        """Every changed path (both sides of a rename), and the unstaged directories."""
        return sorted({c.path for c in self.changes} | set(self.unstaged))

    @property
    def brings(self) -> list[str]:
        """The objects the staged tree has that the base's lacks: the tree, its new subtrees,
        the blobs the changes add (what the commit's kept pack holds: coder.git.objects)."""
        return [self.tree, *self.trees, *_added_blobs(self.changes)]


def stage(
    worktree: Path, base: str, *, repo: pygit2.Repository | None = None, hold: bool = False
) -> Staged:
    """Stage everything that differs from the index in ``worktree`` (like ``git add -A``, less
    ``.coder/``, nested repositories and submodules) and return the staged tree with its
    changes against commit ``base``. ``repo``: the worktree, opened already (`open_worktree`)
    since the last command there ended. ``hold``: the new objects and the index stay in the
    memory of ``repo`` (`Staged.held`) for the commit that records them, whose kept pack takes
    the objects (coder.git.commits); `settle` puts them on disk otherwise. A step then writes
    one pack, not two (a new file costs some disks 0.3-0.8 ms: coder.files.ahead).

    An object of the change set that is not in the object database (a `git gc --prune=now`
    took it before the index that names it was written) is staged again from the files: the
    index is read afresh from ``base``, so that every file is hashed again and what is gone is
    written again (up to `_STAGINGS` times; then ObjectsMissing)."""
    worktree = Path(worktree)
    w = repo if repo is not None else open_worktree(worktree)
    base_tree = objects.commit_of(w, base, "the commit the step started from").tree_id
    for _ in range(_STAGINGS - 1):
        try:
            staged = _stage(w, worktree, base, base_tree)
            break
        except ObjectsMissing:
            _forget_index(w, worktree, base_tree)
    else:
        staged = _stage(w, worktree, base, base_tree)
    if not hold:
        settle(staged)
        staged = replace(staged, held=None)
    return staged


def _stage(w: pygit2.Repository, worktree: Path, base: str, base_tree: pygit2.Oid) -> Staged:
    git = _Git(w, worktree)
    staged = _stage_in_process(w, worktree) if _index_entries(w) < IN_PROCESS_BELOW else None
    tree, unstaged = staged or _stage_with_git(git, worktree)
    held = w if staged else None  # the git program wrote its index and objects already
    trees: list[str] = []
    found = changes(w, base_tree, pygit2.Oid(hex=tree), trees=trees)
    ours = [c for c in found if _under_coder_dir(c.path)]
    if ours:  # a command staged something under .coder/: the base's entries go back
        if held is not None:  # git reads the index and the objects from disk
            _settle(held, worktree)
            held = None
        with _quarantine(w, git) as written:
            git("update-index", "-z", "--index-info", stdin=b"".join(map(_index_info, ours)))
            tree = _write_tree(git, written)
        trees = []
        found = changes(w, base_tree, pygit2.Oid(hex=tree), trees=trees)
    _check_objects(w, found)
    return Staged(base, tree, tuple(found), unstaged, tuple(trees), held)


def settle(staged: Staged) -> None:
    """What `stage(hold=True)` left in memory put on disk: the new objects in one pack (not
    kept: the index reaches them once it is written; a commit's kept pack took them already
    if one was written), then the index. Nothing for a Staged that holds nothing."""
    if staged.held is not None:
        _settle(staged.held, Path(staged.held.workdir))


def _settle(w: pygit2.Repository, worktree: Path) -> None:
    try:
        objects.put_down(w)
        retry_on_index_lock(worktree, w.index.write)
    except (pygit2.GitError, OSError) as exc:
        raise git_failure(exc, "write the staged changes", worktree) from None


def _forget_index(w: pygit2.Repository, worktree: Path, base_tree: pygit2.Oid) -> None:
    """The worktree's index read afresh from the base's tree, its stat data gone: the next
    scan hashes every file, and writes the objects of what differs again."""

    def forget() -> None:
        index = w.index
        index.read_tree(w[base_tree].peel(pygit2.Tree))
        index.write()

    _CACHE_WHOLE.discard(str(worktree))
    try:
        retry_on_index_lock(worktree, forget)
    except (pygit2.GitError, OSError, KeyError) as exc:
        raise git_failure(exc, "read the index again", worktree) from None


# Worktrees whose index's untracked cache the last staging left whole: their next `git status`
# need not write the index. Staging a new or deleted file invalidates that file's directory in
# the cache; the next status then writes the index with the directory read again (else every
# later status would read it again: cost growing with the directories a run touched).
_CACHE_WHOLE: set[str] = set()


def _index_entries(w: pygit2.Repository) -> int:
    """How many entries the index holds, from its header (0 when unreadable)."""
    try:  # the admin dir is the commands' to write: a fifo there must not hang coder
        fd = os.open(os.path.join(w.path, "index"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        header = os.read(fd, 12) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    return int.from_bytes(header[8:12], "big") if header[:4] == b"DIRC" else 0


def _unmerged(worktree: Path, paths: list[str]) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"the index of {worktree} has unmerged paths: {', '.join(sorted(paths))} "
        "(a merge or cherry-pick a command left half-done)",
        hint="the step's command must finish or abort what it started",
    )


# --- the scan: the git program -------------------------------------------------------------


def _stage_with_git(git: _Git, worktree: Path) -> tuple[str, tuple[str, ...]]:
    """`git status`, `git update-index` of what it reported, `git write-tree`: the tree and
    the unstaged directories."""
    # git status writes the index when it refreshed something (9 ms at 20,000 files, a third
    # write in the step): only when the untracked cache needs it kept (see _CACHE_WHOLE).
    whole = str(worktree) in _CACHE_WHOLE
    out = git(
        *(["--no-optional-locks"] if whole else []),
        "status",
        "--porcelain=v2",
        "-z",
        "--untracked-files=all",
        "--ignore-submodules=all",
        "--no-renames",
    )
    to_stage: list[bytes] = []
    beyond_links: list[bytes] = []  # deleted: a directory above them is now a symlink
    conflicted: list[str] = []
    unstaged: list[str] = []
    reshaped = False  # a file added or deleted
    links = _LeadingLinks(worktree)
    records = iter(out.split(b"\0"))
    for record in records:
        kind = record[:2]
        if kind == b"1 ":
            fields = record.split(b" ", 8)
            path, worktree_side, submodule = fields[8], fields[1][1:2], fields[2]
        elif kind == b"2 ":  # a rename (should --no-renames be ignored): its source follows
            fields = record.split(b" ", 9)
            path, worktree_side, submodule = fields[9], fields[1][1:2], fields[2]
            next(records, None)
        elif kind == b"u ":
            conflicted.append(os.fsdecode(record.split(b" ", 10)[10]))
            continue
        elif kind == b"? ":
            path, worktree_side, submodule = record[2:], b"?", b"N..."
        else:  # headers, ignored files, the empty field after the last NUL
            continue
        if _under_coder_dir(os.fsdecode(path)) or worktree_side == b".":
            continue  # coder's own; or staged already as it is in the worktree
        if path.endswith(b"/"):  # an untracked nested repository: not coder's to record
            unstaged.append(os.fsdecode(path))
        elif submodule.startswith(b"S"):
            continue  # a submodule: submodules.changed_submodules judges it
        elif worktree_side == b"D" and links.above(os.fsdecode(path)):
            beyond_links.append(path)
        else:
            to_stage.append(path)
        reshaped = reshaped or worktree_side in (b"?", b"D")
    if conflicted:
        raise _unmerged(worktree, conflicted)
    if reshaped:  # staging a new or a deleted file invalidates its directory in the cache
        _CACHE_WHOLE.discard(str(worktree))
    else:
        _CACHE_WHOLE.add(str(worktree))
    with _quarantine(git.w, git) as objects:
        if to_stage:  # sorted: a file replacing a directory comes before what it replaces
            _update_index(git, objects, ["--add", "--remove", "--replace"], sorted(to_stage))
        if beyond_links:  # git refuses to look at them, and they are gone anyway
            _update_index(git, objects, ["--force-remove"], beyond_links)
        tree = _write_tree(git, objects)
    return tree, tuple(sorted(unstaged))


def _update_index(
    git: _Git, objects: dict[str, str], options: list[str], paths: list[bytes]
) -> None:
    stdin = b"".join(p + b"\0" for p in paths)
    git("update-index", *options, "-z", "--stdin", stdin=stdin, env=objects)


def _write_tree(git: _Git, objects: dict[str, str]) -> str:
    return git("write-tree", env=objects).decode().strip()


def _index_info(change: Change) -> bytes:
    """A `git update-index --index-info` line putting back the base's entry (mode 0: none)."""
    mode, oid = change.old if change.old is not None else (0, "0" * 40)
    return f"{mode:o} {oid}\t{change.path}".encode() + b"\0"


# --- the scan: libgit2, in process ---------------------------------------------------------


def _stage_in_process(w: pygit2.Repository, worktree: Path) -> tuple[str, tuple[str, ...]] | None:
    """libgit2's status and index, for a small tree (see the module docstring): the tree and
    the unstaged directories; None when a changed path needs the git program (a filter
    driver, a working-tree-encoding), which then stages them all."""
    status = w.status(untracked_files="all", ignored=False)
    index = w.index
    index.read(False)  # status() just loaded it; re-read only if it changed on disk
    links = _LeadingLinks(worktree)
    adds: list[str] = []
    removes: list[str] = []
    conflicted: list[str] = []
    unstaged: list[str] = []
    for rel, flags in status.items():
        if flags == FileStatus.CURRENT or flags & FileStatus.IGNORED or _under_coder_dir(rel):
            continue
        if flags & FileStatus.CONFLICTED:
            conflicted.append(rel)
            continue
        if rel.endswith("/"):  # an untracked nested repository: not coder's to record
            unstaged.append(rel)
            continue
        entry = index[rel] if rel in index else None
        if entry is not None and entry.mode == pygit2.enums.FileMode.COMMIT:
            continue  # a submodule: submodules.changed_submodules judges it
        try:
            mode = None if links.above(rel) else os.lstat(worktree / rel).st_mode
        except OSError:
            mode = None
        if mode is None:
            removes.append(rel)
        elif stat.S_ISDIR(mode):
            continue  # a repository of its own, or a submodule
        elif filters.needs_git(w, rel) is not None:
            return None
        else:
            adds.append(rel)
    if conflicted:
        raise _unmerged(worktree, conflicted)

    def write() -> str:
        objects.hold_writes(w)  # the blobs and trees: in memory, then one pack (`settle`)
        for rel in removes:
            if rel in index:
                index.remove(rel)
        for rel in sorted(adds):
            index.add(rel)
        # write_tree() fills the index's tree cache, which `settle` then persists with the
        # index, so the next step only re-hashes the trees it touched.
        return str(index.write_tree())

    try:
        tree = write()
    except KeyError as exc:  # libgit2's NotFoundError: a blob it wrote was pruned before
        raise objects.gone("staging the step's changes", [_named(exc)]) from None
    except pygit2.GitError as exc:
        if "invalid object specified" in str(exc):  # write_tree found a blob pruned
            raise objects.gone("staging the step's changes", []) from None
        raise git_failure(exc, "stage the step's changes", worktree) from None
    except OSError as exc:
        raise git_failure(exc, "stage the step's changes", worktree) from None
    return tree, tuple(sorted(unstaged))


# --- both -------------------------------------------------------------------------------------


class _LeadingLinks:
    """Which paths have a symlink among their parent directories (cached per directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.known: dict[str, bool] = {}

    def above(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        if not parent:
            return False
        if parent not in self.known:
            try:
                link = stat.S_ISLNK(os.lstat(self.root / parent).st_mode)
            except OSError:
                link = False
            self.known[parent] = link or self.above(parent)
        return self.known[parent]


def _under_coder_dir(path: str) -> bool:
    return path == CODER_DIR or path.startswith(CODER_DIR + "/")


# --- the git program, confined --------------------------------------------------------------


class _Git:
    """The git program on one worktree, run as the module docstring says."""

    def __init__(self, w: pygit2.Repository, worktree: Path) -> None:
        self.w, self.worktree = w, worktree
        self.argv = ["git", f"--git-dir={w.path}", f"--work-tree={worktree}"]
        for option in _CONFIG:
            self.argv += ["-c", option]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    @functools.cached_property
    def spawner(self) -> Confinement | None:
        """The spawner of the worktree's commands (found when git first runs)."""
        return confine.spawner_for(self.worktree)

    def __call__(
        self, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
    ) -> bytes:
        try:
            return self._run(args, stdin, env)
        except _Failed as exc:
            if "index.lock" not in exc.detail or not clear_stale_index_lock(self.worktree):
                raise exc.problem(self.worktree) from None
        try:  # a lock a crash left behind, now cleared
            return self._run(args, stdin, env)
        except _Failed as exc:
            raise exc.problem(self.worktree) from None

    def _run(self, args: tuple[str, ...], stdin: bytes | None, env: dict[str, str] | None) -> bytes:
        popen = self.spawner.popen if self.spawner is not None else subprocess.Popen
        try:
            proc = popen(
                [*self.argv, *args],
                cwd=self.worktree,
                env={**self.env, **(env or {})},
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot run git in {self.worktree}: {exc}",
                hint="coder needs the git program on PATH",
            ) from None
        try:
            out, err = proc.communicate(stdin, timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise _Failed(args[0], f"no answer in {_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            said = [line for line in lines if line.startswith(("fatal: ", "error: "))]
            raise _Failed(args[0], (said or lines or [f"exit code {proc.returncode}"])[0])
        return out


class _Failed(Exception):
    def __init__(self, command: str, detail: str) -> None:
        super().__init__(detail)
        self.command, self.detail = command, detail

    def problem(self, worktree: Path) -> EnvironmentProblem:
        quoted = self.detail.partition("'")[2].partition("'")[0]
        hint = None
        if quoted.endswith("index.lock"):
            hint = f"if no git process is running, delete the stale lock file {quoted}"
        elif "filter" in self.detail:
            hint = (
                f"the filter `{quoted}` (.gitattributes) must be configured here "
                f"(git config filter.{quoted}.clean ...; for Git LFS: `git lfs install`); it "
                "runs confined like the step's commands, writing only the worktree"
            )
        return EnvironmentProblem(f"git {self.command} in {worktree}: {self.detail}", hint=hint)


@contextmanager
def _quarantine(w: pygit2.Repository, git: _Git) -> Iterator[dict[str, str]]:
    """The environment that makes git write its objects into a quarantine directory (where
    the confined git may write), the repository's own objects readable as an alternate; what
    it wrote is copied into the object database afterwards (one pack), each object read back
    against its id. The directory is new each time (a random name made while no command runs:
    a path the commands could plant a link at would aim coder's cleanup elsewhere), and
    removed without following links."""
    parent = git.spawner.tmp_root if git.spawner is not None else None
    quarantine = tempfile.mkdtemp(prefix="objects-", dir=parent)
    try:
        yield {
            "GIT_OBJECT_DIRECTORY": quarantine,
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(common_dir(w) / "objects"),
            "GIT_QUARANTINE_PATH": quarantine,  # git refuses ref updates meanwhile
        }
        written = pygit2.Odb(quarantine)
        found = {}
        for oid in written:
            try:
                found[oid] = written.read(oid)  # the read checks the content against the id
            except pygit2.GitError as exc:
                raise EnvironmentProblem(
                    f"staging the step's changes: git's object quarantine {quarantine} holds "
                    f"an object that does not hold what its name says ({exc}); nothing was "
                    "committed"
                ) from None
        objects.write_pack(w, found)  # one pack, not a loose file each (`packed_writes`)
    finally:
        shutil.rmtree(quarantine, ignore_errors=True)  # fd-based: never follows a link inside


# --- the change set ---------------------------------------------------------------------------


def changes(
    w: pygit2.Repository,
    old: pygit2.Oid | None,
    new: pygit2.Oid | None,
    *,
    trees: list[str] | None = None,
) -> list[Change]:
    """The entries that differ between two trees, sorted by path, walking only subtrees whose
    ids differ: the cost is what changed, not the size of the trees. ``trees``, if given,
    receives the ids of the subtrees of ``new`` that ``old`` lacks. ObjectsMissing if a tree
    is not in the object database."""
    found: list[Change] = []

    def walk(old: bytes | None, new: bytes | None, prefix: str) -> None:
        before, after = _entries(w, old), _entries(w, new)
        differ = {name for _, name, _ in before.symmetric_difference(after)}
        olds = {name: (int(mode, 8), oid) for mode, name, oid in before if name in differ}
        news = {name: (int(mode, 8), oid) for mode, name, oid in after if name in differ}
        for raw in differ:
            o, n = olds.get(raw), news.get(raw)
            if o == n:  # the same entry, its mode written otherwise (`040000`, `40000`)
                continue
            path = prefix + raw.decode("utf-8", "surrogateescape")
            o_tree = o is not None and o[0] == _TREE
            n_tree = n is not None and n[0] == _TREE
            if n_tree and trees is not None:
                trees.append(n[1].hex())  # type: ignore[index]
            if o_tree or n_tree:
                walk(o[1] if o and o_tree else None, n[1] if n and n_tree else None, path + "/")
            old_entry = None if o is None or o_tree else (o[0], o[1].hex())
            new_entry = None if n is None or n_tree else (n[0], n[1].hex())
            if old_entry is not None or new_entry is not None:
                found.append(Change(path, old_entry, new_entry))

    if old != new:
        try:
            walk(old.raw if old else None, new.raw if new else None, "")
        except KeyError as exc:
            raise objects.gone("reading a tree", [_named(exc)]) from None
    return sorted(found, key=lambda c: c.path)


def _entries(w: pygit2.Repository, tree: bytes | None) -> set[tuple[bytes, bytes, bytes]]:
    """A tree's entries, (mode, name, raw id) as the tree object writes them, read from the
    object itself: a step reads a few trees of every level it touched, and `changes` compares
    them as sets (pygit2's entry objects cost ten times more, a parse in Python three)."""
    if tree is None:
        return set()
    kind, data = w.odb.read(pygit2.Oid(raw=tree))
    if kind != pygit2.enums.ObjectType.TREE:
        raise KeyError(pygit2.Oid(raw=tree))
    found = _TREE_ENTRY.findall(data)
    if sum(len(mode) + len(name) + 22 for mode, name, _ in found) != len(data):
        raise EnvironmentProblem(f"tree {pygit2.Oid(raw=tree)} is malformed")  # bytes skipped
    return set(found)


_TREE_ENTRY = re.compile(rb"([0-7]+) ([^\0]+)\0(.{20})", re.DOTALL)


def brings(w: pygit2.Repository, old: pygit2.Oid, new: pygit2.Oid) -> list[str]:
    """The objects tree ``new`` has that tree ``old`` lacks: itself, its subtrees, its blobs."""
    trees: list[str] = []
    found = changes(w, old, new, trees=trees)
    return [str(new), *trees, *_added_blobs(found)]


def _added_blobs(found: Iterable[Change]) -> list[str]:
    return [c.new[1] for c in found if c.new is not None and c.new[0] != _GITLINK]


def _named(exc: KeyError) -> str:
    """The object id libgit2's NotFoundError names ("... no match for id (HEX)")."""
    text = str(exc)
    return text.rpartition("(")[2].rstrip(")'") if "(" in text else text.strip("'")


def _check_objects(w: pygit2.Repository, found: list[Change]) -> None:
    """Every blob the staged tree adds is in the object database: one is not when a prune took
    it before the index named it, or when git's object quarantine did not really hold it (see
    `_quarantine`). ObjectsMissing then."""
    odb = w.odb
    missing = [oid for oid in _added_blobs(found) if not odb.exists(oid)]
    if missing:
        raise objects.gone("staging the step's changes", missing)
