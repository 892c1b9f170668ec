"""The process trees of programs coder launches (external MCP servers): what they start during a
step ends with the step.

An MCP server lives for the whole run (its tool list is part of the run's prompt prefix), in a
sandbox of its own (coder.policy.launch), which `confine.end_leftovers`'s kill from inside a
command's sandbox cannot reach. A process one of its tools starts (`setsid sleep &`, a daemon)
would outlive the step, and could change the worktree or flip its HEAD between the git guard
and the commit. So each launched server runs in a tree coder can list:

- a pids cgroup of its own (coder.policy.cgroups, where coder can make one: root): the launcher
  moves itself in before it confines itself, and nothing it starts can leave;
- elsewhere, the launcher makes itself a child subreaper (PR_SET_CHILD_SUBREAPER, kept across
  execve): an orphan of anything the server started is reparented to the server, so the
  server's descendants in /proc are all of them. A process whose server was killed meanwhile
  (by its own tool) goes to coder or init instead: the cgroup has no such gap. The server does
  not reap the orphans it was given, so those ended stay its zombies until it exits.

What a tree holds once its server is ready (its tools listed) is the server's own. `end(root)`,
called at the end of each step by `confine.end_leftovers`, SIGKILLs every process started since
in the trees confined to `root`; `Tree.close` ends them all once the server is stopped.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

from coder.errors import EnvironmentProblem
from coder.files import owner
from coder.files.realpath import realpath
from coder.policy import cgroups, reaper, tmpdirs

_PR_SET_CHILD_SUBREAPER = 36
Identity = tuple[int, "int | None"]  # a pid and when its process started: one process
_PASSES = 100  # of finding and ending a subreaper tree's new processes (each forks at most so)


def enter(spec: dict[str, str]) -> None:
    """In the launcher, before it confines itself: join the tree `spec` names (`Tree.spec`;
    none when empty)."""
    if not spec:
        return
    if "cgroup" in spec:
        cgroups.Group(spec["cgroup"], "").join_process()
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot become a child subreaper")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(spec["pidfile"], flags, 0o600)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def end(root: str) -> None:
    """End what the trees confined to `root` (a real path) started since their servers were
    ready (see the module docstring)."""
    with _lock:
        found = [t for t in _trees if t.root == root]
    for tree in found:
        tree.end_new()


class Tree:
    """A launched server and everything it starts: made before the server is started (its
    launcher joins it: `spec`, for `launch.launcher_argv`), ended at each step's end in
    worktree `root` (`end`) until it is closed."""

    def __init__(self, root: Path) -> None:
        self.root = realpath(root)
        self.group = cgroups.make("mcp") if cgroups.problem() is None else None
        self._dir: str | None = None  # private: the launcher writes its pid there
        if self.group is not None:
            self.spec = {"cgroup": self.group.path}
        else:
            self._dir = tmpdirs.make("tree")
            self.spec = {"pidfile": os.path.join(self._dir, "pid")}
        self._own: frozenset[Identity] = frozenset()
        with _lock:
            _trees.append(self)

    def ready(self) -> None:
        """The server is ready: what the tree holds now is its own."""
        self._own = frozenset(self._members())

    def end_new(self) -> None:
        """SIGKILL every process of the tree that is not the server's own, until none is left."""
        if self.group is not None:
            _reap(self.group.end(spare=lambda pid: _identity(pid) in self._own))
            return
        for _ in range(_PASSES):  # a process may fork while it is being killed
            found = self._members() - self._own
            if not found:
                return
            _reap(cgroups.kill((pid for pid, _ in found), lambda pid: _identity(pid) in found))
        raise EnvironmentProblem(
            f"cannot end the processes an MCP server started: still forking after {_PASSES} kills"
        )

    def close(self) -> None:
        """The server was stopped: end what is left of its tree, and forget the tree."""
        with _lock:
            if self in _trees:
                _trees.remove(self)
        if self.group is not None:
            _reap(self.group.end())
            self.group.retire()
            return
        # Its descendants went to coder or init when it ended: only its own are still known.
        own = self._own
        _reap(cgroups.kill((pid for pid, _ in own), lambda pid: _identity(pid) in own))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _members(self) -> set[Identity]:
        if self.group is not None:
            return {_identity(pid) for pid in self.group.pids()}
        server = self._server()
        return set() if server is None else _descendants(server)

    def _server(self) -> int | None:
        """The launched process's pid, as its launcher wrote it."""
        assert self._dir is not None
        try:
            return int(Path(self._dir, "pid").read_text())
        except (OSError, ValueError):
            return None


def _identity(pid: int) -> Identity:
    return pid, owner.started(pid)


def _descendants(top: int) -> set[Identity]:
    """`top` and every process below it that has not ended, from /proc."""
    children: dict[int, list[Identity]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found: set[Identity] = set()
    todo = [_identity(top)] if owner.started(top) is not None else []
    while todo:
        identity = todo.pop()
        if identity not in found:
            found.add(identity)
            todo.extend(children.get(identity[0], ()))
    return found


def _reap(killed: list[int]) -> None:
    """Reap those of the ended processes that are coder's children (orphans given to coder as
    subreaper): coder is not waiting on any of them."""
    mine = os.getpid()
    ours = [pid for pid in killed if _parent(pid) == mine]
    if ours:
        reaper.reap(ours)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


_lock = threading.Lock()
_trees: list[Tree] = []
