"""The git guard: what a command changed in a repository's `.git` is put back, and named.

Commands run where git looks for its own instructions: `.git/config` (`core.fsmonitor`,
`core.hooksPath`, aliases, filters run programs), `.git/hooks`, and the refs, HEAD and index
that say what the user's history and next commit are. Around every command that could write
there, coder takes a `GitGuard` and afterwards restores what changed and reports it:

* around a run's step (`take`): the repository's config and hooks (read-only in the sandbox,
  but not with `sandbox: off`), and the files a sandboxed command CAN write: its worktree's
  `.git` file and its admin dir's HEAD, commondir, gitdir and config.worktree (a HEAD pointed
  at the base branch would make the step commit land there); the step fails;
* around an MCP call that works in the user's checkout itself (`take_checkout`, for
  `coder mcp serve`): the whole `.git` but what is not the user's history or settings and
  only grows (`objects/`, `logs/`), what runs write beside the call (`worktrees/`, and their
  refs: `refs/heads/agent/`, `refs/heads/coder-scratch/`, `refs/tags/coder/`) and what only a
  fetch writes (`refs/remotes/`, `FETCH_HEAD`; commands have no network). So config, hooks,
  `info/`, HEAD, every other ref (loose or packed), a forged `MERGE_HEAD` or rebase todo, the
  index (by its entries, so a `git status` refreshing file times is no change; staging is),
  and each submodule's config and hooks; `.git` itself moved away and replaced by another
  directory is put back too. The call becomes a tool error.

Which files are watched is fixed when the guard is taken, from the tree as it was: a rewritten
`.git` file cannot aim the restore at another repository's files. Nothing is followed: a file
or directory replaced by a symlink (or a fifo) counts as changed, and the restore removes it
and writes the original in its place, never through it; a restore whose parent directory is
no longer where it was (a link on its way) is refused with the path, not made through the link.

What a guard costs: a stat of each path it watches, before and after the command; a file is
read only when it changed recently or since an earlier guard read it (`_settled`, `_KNOWN`).

A change made by someone else while the command ran (a commit from the user's terminal during
a long `tests_run`) cannot be told from the command's: it is put back too, and named. Nor can
one by another step of a parallel level (they share config, hooks and refs/stash): the guard
that looks first puts it back and names it; guards put back one at a time, each looking afresh.

`refs/stash` is the repository's, shared by its worktrees: with `sandbox: off` a step's
`git stash` lands there (as any `git stash` of an MCP call in the checkout does), and the user's
next `git stash pop` would apply the command's work.
Putting the old refs/stash back would lose stashes the user made meanwhile, so only the
entries the step added are dropped (`drop_stashes`): new since the guard was taken, made on the
step's worktree or the checkout (the stash names its branch, "(no branch)" where its HEAD was
detached, and its parent is the commit the command started from); any other new entry is left,
with the exact `git stash drop` command.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coder.errors import EnvironmentProblem
from coder.files.realpath import realpath
from coder.git.indexfile import index_entries

_Content = tuple[bytes, int]  # a regular file's bytes and permission bits; a directory's mode
_NOT_A_FILE: _Content = (b"", -1)  # a symlink, fifo, device, ...: never read through
# The steps of a parallel level are checked in their threads at once, and their guards share
# the repository's config, hooks and refs/stash: what is put back there is put back by one
# guard at a time, each looking afresh (two restores of one file raced on its unlink and
# create; two drops of stash@{0} took the user's entry).
_SHARED = threading.Lock()

# What the checkout guard does not watch, relative to the git dir (see the module docstring).
_NOT_WATCHED = (
    "objects",
    "logs",
    "lfs",
    "worktrees",
    "modules",  # each submodule's config and hooks are watched, not its objects and refs
    "FETCH_HEAD",
    "refs/remotes",
    "refs/heads/agent",
    "refs/heads/coder-scratch",
    "refs/tags/coder",
)
_RUN_REFS = tuple(f"{rel}/".encode() for rel in _NOT_WATCHED if rel.startswith("refs/"))


@dataclass(frozen=True)
class GitGuard:
    """A copy of what a command could change in `.git` (see the module docstring)."""

    common_dir: Path
    watched: tuple[Path, ...]  # files
    saved: dict[str, _Content]  # by path
    stashes: frozenset[str] = frozenset()  # the commit ids of refs/stash's entries
    on: tuple[str, str] | None = None  # the worktree's (branch or "(no branch)", HEAD commit)
    trees: tuple[Path, ...] = ()  # directories watched with everything below them
    skip: frozenset[str] = frozenset()  # ... but these paths
    held: int | None = None  # a descriptor of the git dir itself, to find it if it is moved
    aside: list[Path] = field(default_factory=list)  # where a replacement of it was put
    # What `changes` and `drop_stashes` compare first, a few stat calls: when every watched
    # path's inode, size, times and mode are as they were, nothing changed (any write sets a
    # ctime, which no process can set back: see `_settled`); no stash was added while the
    # stash reflog is as it was (every `git stash` appends to it).
    stamps: dict[str, _Stamp] = field(default_factory=dict)
    stash_log: _Stamp | None = None
    taken_ns: int = 0  # the wall clock just before the stamps were taken

    @property
    def _actor(self) -> str:
        return "the step" if self.held is None else "the command"

    @property
    def _unconfined(self) -> str:  # a step's command can stash only outside the sandbox
        return " with `sandbox: off`" if self.held is None else ""

    @classmethod
    def take(
        cls, common_dir: Path, workdir: Path | None = None, *, head: tuple[str, str] | None = None
    ) -> GitGuard:
        """The guard around a step in `workdir`, a linked worktree of `common_dir`. `head`:
        what `workdir`'s HEAD is, (branch or "(no branch)", commit), when the caller knows
        (read from the worktree otherwise: a repository open per step)."""
        common_dir = Path(realpath(common_dir))
        real = None if workdir is None else Path(realpath(workdir))
        watched = _watched(common_dir, real)
        trees = (common_dir / "hooks",)
        taken_ns, stamps, saved = _take(watched, trees, frozenset())
        stash_log = _stamp(_stash_log(common_dir))  # after taken_ns: see _settled
        stashes = frozenset(s.commit_id for s in _stash_list(common_dir)) if stash_log else None
        on = head if head is not None or workdir is None else _worktree_head(workdir)
        return cls(
            common_dir,
            watched,
            saved,
            stashes or frozenset(),
            on,
            trees,
            stamps=stamps,
            stash_log=stash_log,
            taken_ns=taken_ns,
        )

    @classmethod
    def take_checkout(cls, checkout: Path) -> GitGuard:
        """The guard around a command in the main checkout `checkout` (its `.git` a directory).
        Call `close` when done with it."""
        git_dir = Path(realpath(checkout / ".git"))
        held = os.open(git_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        watched, trees = _submodules(git_dir)
        trees = (git_dir, *trees)
        skip = frozenset(str(git_dir / rel) for rel in (*_NOT_WATCHED, "refs/stash"))
        taken_ns, stamps, saved = _take(watched, trees, skip)
        stash_log = _stamp(_stash_log(git_dir))
        stashes = frozenset(s.commit_id for s in _stash_list(git_dir)) if stash_log else None
        on = _worktree_head(checkout)
        return cls(
            git_dir,
            watched,
            saved,
            stashes or frozenset(),
            on,
            trees,
            skip,
            held,
            stamps=stamps,
            stash_log=stash_log,
            taken_ns=taken_ns,
        )

    def close(self) -> None:
        if self.held is not None:
            os.close(self.held)

    def changes(self) -> list[Path]:
        stamps = _stamps(self.watched, self.trees, self.skip)
        if stamps == self.stamps and all(_settled(s, self.taken_ns) for s in stamps.values()):
            return []
        now = _contents(self.watched, stamps, _known(self.watched, self.trees))
        return sorted(
            Path(k)
            for k in self.saved.keys() | now.keys()
            if _differs(self.common_dir, k, self.saved.get(k), now.get(k))
        )

    def describe(self, paths: list[Path]) -> list[str]:
        """`.git/config`-style names for messages."""
        base = self.common_dir.parent
        names = [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in paths]
        if self.aside and self.common_dir in paths:
            names[paths.index(self.common_dir)] += (
                f" (moved away and replaced; the original is back, the replacement is now "
                f"{self.aside[-1].name})"
            )
        return names

    def restore(self) -> list[Path]:
        """Put back what changed; returns it (the git dir itself first, if it was replaced).
        EnvironmentProblem if something cannot be put back."""
        with _SHARED:
            moved = [self.common_dir] if self._put_back_git_dir() else []
            changed = self.changes()
            for path in changed:
                _replace(path, self.saved.get(str(path)))
        return moved + changed

    def _put_back_git_dir(self) -> bool:
        """If the git dir was moved away (and something else put in its place), move it back:
        the replacement goes aside, to `.git.replaced-TIME`, and is not deleted."""
        if self.held is None:
            return False
        original = os.fstat(self.held)
        try:
            now = os.lstat(self.common_dir)
            if (now.st_dev, now.st_ino) == (original.st_dev, original.st_ino):
                return False
        except FileNotFoundError:
            now = None
        if original.st_nlink == 0:
            raise EnvironmentProblem(
                f"a command deleted the repository's git directory {self.common_dir}",
                hint="restore it from a backup or a clone; coder cannot put it back",
            )
        if now is not None:  # first, as the original may have been moved into it
            self.aside.append(Path(f"{self.common_dir}.replaced-{int(time.time())}"))
            os.rename(self.common_dir, self.aside[-1])
        os.rename(os.readlink(f"/proc/self/fd/{self.held}"), self.common_dir)
        return True

    def drop_stashes(self) -> list[str]:
        """Drop the refs/stash entries the step added; a problem for each new entry (empty:
        none), naming what was dropped, or the `git stash drop` command for one that may not
        be the step's or could not be dropped."""
        now = _stamp(_stash_log(self.common_dir))
        if now == self.stash_log and _settled(now, self.taken_ns):
            return []
        with _SHARED:  # two steps detached at one tip both claim a "WIP on (no branch)" entry
            return self._drop_added()

    def _drop_added(self) -> list[str]:
        import pygit2

        repo = pygit2.Repository(str(self.common_dir))
        added = [s for s in _stash_list(self.common_dir) if s.commit_id not in self.stashes]
        problems: list[str] = []
        left = []
        for entry in added:  # the step's first: the commands name the indices after the drops
            message = entry.message.strip()
            if not self._made_here(repo, entry.commit_id, message):
                left.append((entry, False))
            elif _drop(repo, self.common_dir, entry.commit_id):
                problems.append(
                    f"{self._actor} added stash entry {message!r} to the repository's shared "
                    f"refs/stash (a `git stash`{self._unconfined}); coder dropped it, the "
                    "other stash entries are as they were"
                )
            else:
                left.append((entry, True))
        for entry, ours in left:
            index = _stash_index(self.common_dir, entry.commit_id)
            if index is None:
                continue  # dropped meanwhile
            drop = f"`git stash drop stash@{{{index}}}`"
            problems.append(
                f"stash entry stash@{{{index}}} ({entry.message.strip()!r}) was added to the "
                f"repository's shared refs/stash while {self._actor} ran and "
                + (
                    f"is {self._actor}'s (a `git stash`{self._unconfined}): coder could not drop "
                    f"it (refs/stash stayed locked); drop it with {drop}"
                    if ours
                    else f"may be {self._actor}'s (a `git stash`{self._unconfined}): if it is not "
                    f"yours, drop it with {drop} (check `git stash list` first)"
                )
            )
        return problems

    def _made_here(self, repo: Any, commit_id: Any, message: str) -> bool:
        if self.on is None:
            return False
        branch, head = self.on
        try:
            parents = [str(p) for p in repo[commit_id].parent_ids]
        except (KeyError, ValueError):
            return False
        named = message.startswith((f"WIP on {branch}: ", f"On {branch}: "))
        return named and parents[:1] == [head]


def _stash_list(common_dir: Path) -> list[Any]:
    """refs/stash's entries, newest first (pygit2 Stash: commit_id, message)."""
    import pygit2

    try:
        return list(pygit2.Repository(str(common_dir)).listall_stashes())
    except pygit2.GitError:
        return []


def _drop(repo: Any, common_dir: Path, commit_id: Any) -> bool:
    """Drop the entry `commit_id` from refs/stash: True once gone. False if refs/stash stays
    locked for a second (a `git stash` of a command still running beside the step); its
    index is read again before each try, as that command may have added an entry meanwhile."""
    import pygit2

    for delay in (0.02, 0.1, 0.3, 0.6, 0.0):
        index = _stash_index(common_dir, commit_id)
        if index is None:
            return True
        try:
            repo.stash_drop(index)
            return True
        except pygit2.GitError:
            time.sleep(delay)
    return False


def _stash_index(common_dir: Path, commit_id: Any) -> int | None:
    for index, entry in enumerate(_stash_list(common_dir)):
        if entry.commit_id == commit_id:
            return index
    return None


def _worktree_head(workdir: Path) -> tuple[str, str] | None:
    """(the branch checked out at `workdir`, or "(no branch)", the commit of its HEAD), as
    `git stash` names them in an entry's message and parents."""
    import pygit2

    try:
        repo = pygit2.Repository(str(workdir))
        head = str(repo.head.target)
        branch = "(no branch)" if repo.head_is_detached else repo.head.shorthand
    except (pygit2.GitError, KeyError, ValueError):
        return None
    return branch, head


def _watched(common_dir: Path, workdir: Path | None) -> tuple[Path, ...]:
    paths = [common_dir / "config"]
    gitfile = None if workdir is None else workdir / ".git"
    found = None if gitfile is None else _read(gitfile)
    if gitfile is not None and found is not None and found != _NOT_A_FILE:
        paths.append(gitfile)
        text = found[0].decode("utf-8", errors="replace").strip()
        admin = Path(realpath(gitfile.parent / text.removeprefix("gitdir:").strip()))
        if admin.parent == Path(realpath(common_dir / "worktrees")):
            # config.worktree: read by git and libgit2 when the repository sets
            # extensions.worktreeConfig; a command's `core.worktree` there would redirect
            # coder's own checkouts, its `core.fsmonitor` run a program
            paths += [admin / n for n in ("HEAD", "commondir", "gitdir", "config.worktree")]
    return tuple(paths)


def _submodules(git_dir: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(files, trees) of each submodule's git dir under `modules/`: its config and hooks,
    where a command could make the user's next `git status` in the superproject run code."""
    files: list[Path] = []
    trees: list[Path] = []
    pending = [git_dir / "modules"]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:  # absent, not a directory, a link (not followed)
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            sub = Path(entry.path)
            if os.path.isfile(sub / "HEAD") and not os.path.islink(sub / "HEAD"):  # a git dir
                files += [sub / "config", sub / "config.worktree"]
                trees.append(sub / "hooks")
                pending.append(sub / "modules")
            else:  # a submodule named with slashes: modules/libs/foo
                pending.append(sub)
    return tuple(files), tuple(trees)


_Stamp = tuple[int, int, int, int, int]  # inode, size, mtime, ctime (ns), mode

# A stamp stands for a file's content only once the file's last change is older than the
# granularity of the timestamps a change after it would get: the kernel stamps changes with a
# clock that ticks every 1-10 ms (and some filesystems keep whole seconds only, FAT two), so a
# write in the same tick as the last one could leave every field of the stamp as it was
# (its mtime set back with utime). A file changed that recently is read instead.
_SETTLE_NS = 100_000_000  # sub-second timestamps: ten ticks of the slowest kernel clock
_SETTLE_WHOLE_SECONDS_NS = 3_000_000_000  # whole seconds: a filesystem may keep no finer


def _stamp(path: str | Path) -> _Stamp | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


def _settled(stamp: _Stamp | None, taken_ns: int) -> bool:
    """Whether `stamp`, taken after the wall clock read `taken_ns`, changes with any change to
    its file after that: its ctime is older than any a later change can be given (ctime is
    set by the kernel on every write, chmod, rename or utime; no process can set it back).
    An absent file has nothing to change."""
    if stamp is None:
        return True
    ctime = stamp[3]
    margin = _SETTLE_WHOLE_SECONDS_NS if ctime % 1_000_000_000 == 0 else _SETTLE_NS
    return ctime + margin < taken_ns


def _stamps(
    watched: tuple[Path, ...], trees: tuple[Path, ...], skip: frozenset[str]
) -> dict[str, _Stamp]:
    """The stamp of every watched path, and of every path in `trees` but `skip` (a directory's
    stamp covers what it lists), without following links."""
    out = {str(path): found for path in watched if (found := _stamp(path)) is not None}
    pending = [str(tree) for tree in trees]
    while pending:
        path = pending.pop()
        found = _stamp(path)
        if found is None:
            continue
        out[path] = found
        if stat.S_ISDIR(found[4]):
            try:
                with os.scandir(path) as entries:
                    pending += [e.path for e in entries if e.path not in skip]
            except OSError:
                pass
    return out


def _stash_log(common_dir: Path) -> Path:
    return common_dir / "logs" / "refs" / "stash"


# The contents of watched regular files read by earlier guards of the same watched paths, each
# with its stamp, settled when it was taken (`_settled`): while a file's stamp is still that
# one, its content is too, and the next guard need not read it (the sample hooks, the config:
# a stat each, not a read, per step). By (watched, trees); the last few sets of paths only,
# and small files only (a checkout's index can be megabytes: it is read each time, as before).
_Known = dict[str, tuple[_Stamp, _Content]]
_KNOWN: OrderedDict[tuple[tuple[Path, ...], tuple[Path, ...]], _Known] = OrderedDict()
_KNOWN_KEPT = 16
_KNOWN_MAX_BYTES = 1 << 20
_known_lock = threading.Lock()


def _known(watched: tuple[Path, ...], trees: tuple[Path, ...]) -> _Known:
    with _known_lock:
        return _KNOWN.get((watched, trees), {})


def _take(
    watched: tuple[Path, ...], trees: tuple[Path, ...], skip: frozenset[str]
) -> tuple[int, dict[str, _Stamp], dict[str, _Content]]:
    """(the wall clock before the stamps, the stamps, the contents) of what a guard watches;
    the contents of the files whose stamps were settled are kept for the next guard."""
    taken_ns = time.time_ns()
    stamps = _stamps(watched, trees, skip)
    saved = _contents(watched, stamps, _known(watched, trees))
    keep = {
        path: (found, saved[path])
        for path, found in stamps.items()
        if stat.S_ISREG(found[4])
        and found[1] <= _KNOWN_MAX_BYTES
        and _settled(found, taken_ns)
        and saved.get(path, _NOT_A_FILE) != _NOT_A_FILE  # replaced since its stamp: not kept
    }
    with _known_lock:
        _KNOWN[(watched, trees)] = keep
        _KNOWN.move_to_end((watched, trees))
        while len(_KNOWN) > _KNOWN_KEPT:
            _KNOWN.popitem(last=False)
    return taken_ns, stamps, saved


def _contents(
    watched: tuple[Path, ...], stamps: dict[str, _Stamp], known: _Known
) -> dict[str, _Content]:
    """What each stamped path holds: a directory of a watched tree its mode, anything but a
    regular file _NOT_A_FILE (never opened), a regular file its bytes and permission bits (as
    `known` holds them while its stamp is the one they were read under; else read now)."""
    files = {str(path) for path in watched}
    out: dict[str, _Content] = {}
    for path, found in stamps.items():
        mode = found[4]
        if stat.S_ISDIR(mode) and path not in files:
            out[path] = (b"", stat.S_IFDIR | stat.S_IMODE(mode))
        elif not stat.S_ISREG(mode):
            out[path] = _NOT_A_FILE
        elif (entry := known.get(path)) is not None and entry[0] == found:
            out[path] = entry[1]
        elif (content := _read(path)) is not None:  # None: removed since its stamp
            out[path] = content
    return out


def _read(path: str | Path) -> _Content | None:
    """The file's content, _NOT_A_FILE for anything but a regular file, None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP), unreadable
        return _NOT_A_FILE
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _NOT_A_FILE
        chunks = []
        while chunk := os.read(fd, max(info.st_size, 4096) + 1):
            chunks.append(chunk)
        return b"".join(chunks), stat.S_IMODE(info.st_mode)
    finally:
        os.close(fd)


def _is_dir(content: _Content | None) -> bool:
    return content is not None and content[1] > 0 and stat.S_ISDIR(content[1])


def _differs(git_dir: Path, path: str, before: _Content | None, after: _Content | None) -> bool:
    """Whether `path` changed; the index by its entries, packed-refs without the refs of runs
    (coder's runs and a `git status` rewrite them beside the command, with no change that
    matters)."""
    if before == after:
        return False
    if path.endswith("/config.worktree") and _sets_nothing(before) and _sets_nothing(after):
        return False  # the sandbox makes it empty to keep it read-only (writes.admin_files)
    if before is None or after is None or before[1] != after[1]:
        return True
    if path == str(git_dir / "index"):
        return index_entries(before[0]) != index_entries(after[0])
    if path == str(git_dir / "packed-refs"):
        return _packed_refs(before[0]) != _packed_refs(after[0])
    return True


def _sets_nothing(content: _Content | None) -> bool:
    """An absent config file, or an empty regular one (whose content carries its permission
    bits only: a directory's carries its type, anything else -1)."""
    return content is None or (content[0] == b"" and 0 <= content[1] <= 0o7777)


def _replace(path: Path, content: _Content | None) -> None:
    """Make `path` what `content` says (absent, a directory, a regular file), removing whatever
    is there now without following it."""
    parent = os.path.dirname(path)
    if realpath(parent) != parent:
        raise EnvironmentProblem(
            f"cannot put back {path}: {parent} is no longer the directory it was (a link or a "
            "moved directory is on its way)",
            hint=f"look at {parent}, then restore {path} by hand",
        )
    try:
        mode: int | None = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if content is not None and _is_dir(content) and mode is not None and stat.S_ISDIR(mode):
        os.chmod(path, stat.S_IMODE(content[1]))  # a directory keeps what is in it
        return
    if mode is not None and stat.S_ISDIR(mode):
        shutil.rmtree(path)
    elif mode is not None:
        os.unlink(path)
    if content is None or content == _NOT_A_FILE:
        return
    data, bits = content
    if _is_dir(content):
        os.mkdir(path, 0o700)
        os.chmod(path, stat.S_IMODE(bits))
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, bits)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, bits)
        file.write(data)


def _packed_refs(data: bytes) -> list[bytes]:
    """packed-refs' lines without the header and without the refs runs own (see _NOT_WATCHED)
    and their peeled `^` lines."""
    kept: list[bytes] = []
    dropped = False
    for line in data.splitlines():
        if line.startswith(b"^"):
            if not dropped:
                kept.append(line)
            continue
        name = line.partition(b" ")[2]
        dropped = line.startswith(b"#") or name.startswith(_RUN_REFS)
        if not dropped:
            kept.append(line)
    return kept
