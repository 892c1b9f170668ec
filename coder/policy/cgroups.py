"""A pids cgroup per sandbox: a process limit that binds root, and every process a sandbox holds.

Two things Landlock and rlimits cannot do:

- `limits.processes` is `ulimit -u` (RLIMIT_NPROC), which the kernel does not apply to root (200
  processes ran under a limit of 64). A pids cgroup's `pids.max` binds every user.
- A process stays in its cgroup whatever it does (setsid, a double fork, its parent killed); only
  a write to cgroup files moves it, which the sandbox refuses (Landlock, the read-only mounts).
  So a cgroup's `cgroup.procs` lists every process its sandbox still holds, and coder ends them
  from outside, starting nothing inside: a sandbox at its limit cannot stop that.

How. In cgroup v1's pids hierarchy one thread can be moved alone (its tid to `tasks`), and every
process it forks starts in its cgroup: each spawner thread (coder.policy.confine) joins a cgroup
of its own once, before it confines itself, so a command costs nothing more. A launched program
(an MCP server, coder.policy.proctrees) moves its whole process in before it confines itself. Only
root may write the hierarchy's files. cgroup v2 is not used: there a thread can be moved alone
only inside a threaded subtree. `problem()` says why coder makes no cgroups here.

Layout: coder's own pids cgroup / `coder-<owner tag>` (coder.files.owner: pid namespace, pid, start
time) / `<kind>-<n>`. A cgroup is removed once its spawner has stopped and nothing is left in
it, and when coder exits (what is left in it killed first). Those of a coder killed outright
(SIGKILL) are swept, what is left in them killed, by the next coder that makes one
(`owner.gone`: a pid of another pid namespace means nothing here: never swept).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import posixpath
import re
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from coder.errors import EnvironmentProblem
from coder.files import owner

_PREFIX = "coder"
_END_WAIT_S = 30.0  # to end what a cgroup holds, forks included
_EXIT_WAIT_S = 5.0  # for SIGKILLed processes to end (SIGKILL is delivered, not waited for)


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why coder cannot give a sandbox a pids cgroup here, or None. Probed by making coder's
    own directory of cgroups (after sweeping those of coders that are gone)."""
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    if _home() is None:
        return "no cgroup v1 pids hierarchy is mounted (cgroup v2 is not used)"
    try:
        with _lock:
            _base()
    except OSError as exc:
        return f"cannot make a cgroup: {exc}"
    return None


def sweep() -> None:
    """End what the cgroups of coders that are gone hold, and remove them (`coder resume`
    before it looks at the worktree: it does not wait for its first sandbox)."""
    home = _home() if os.geteuid() == 0 else None
    if home is not None:
        with _lock:
            _sweep(*home)


class Group:
    """One pids cgroup coder made (or a gone coder made, when swept)."""

    def __init__(self, path: str, shown: str) -> None:
        self.path = path
        self.shown = shown  # its path as /proc/PID/cgroup names it
        self.tasks: int | None = None  # pids.max; None: no limit
        self.retired = False

    def join_thread(self) -> None:
        """The calling thread moves in: every process it starts from now on starts here."""
        _write(os.path.join(self.path, "tasks"), "0")

    def join_process(self) -> None:
        """The calling process moves in, every thread of it."""
        _write(os.path.join(self.path, "cgroup.procs"), "0")

    def limit(self, tasks: int | None) -> None:
        """At most `tasks` tasks (processes and threads, coder's own thread in it included)
        at once: a fork beyond them fails (EAGAIN). None: no limit."""
        _write(os.path.join(self.path, "pids.max"), "max" if tasks is None else str(tasks))
        self.tasks = tasks

    @contextlib.contextmanager
    def lifted(self) -> Iterator[None]:
        """No limit while coder itself starts a process in it (the end of a sandbox: processes
        that ended but are not reaped yet still count), set back afterwards."""
        tasks = self.tasks
        if tasks is None:
            yield
            return
        self.limit(None)
        try:
            yield
        finally:
            self.limit(tasks)

    def pids(self) -> set[int]:
        """The processes in it, coder itself left out (a thread of it may be in it)."""
        with open(os.path.join(self.path, "cgroup.procs"), "rb") as f:
            return {int(pid) for pid in f.read().split()} - {os.getpid()}

    def holds(self, pid: int) -> bool:
        """Whether process `pid` is in it now."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                for line in f:
                    _, controllers, path = line.rstrip("\n").split(":", 2)
                    if "pids" in controllers.split(","):
                        return path == self.shown
        except (OSError, ValueError):
            pass
        return False

    def end(self, spare: Callable[[int], bool] | None = None) -> list[int]:
        """SIGKILL every process in it but coder (and those `spare` keeps), again until none is
        left (one may fork while it is being killed); the pids killed."""
        killed: list[int] = []
        deadline = time.monotonic() + _END_WAIT_S
        while found := [pid for pid in self._listed() if spare is None or not spare(pid)]:
            if time.monotonic() > deadline:
                raise EnvironmentProblem(
                    f"cannot end the processes left in cgroup {self.path}: "
                    f"{len(found)} still running after {_END_WAIT_S:.0f} s"
                )
            killed += kill(found, self.holds)
        return killed

    def _listed(self) -> set[int]:
        try:
            return self.pids()
        except OSError as exc:
            problem = f"cannot list the processes in cgroup {self.path}: {exc}"
            raise EnvironmentProblem(problem) from exc

    def retire(self) -> None:
        """Not used any more: removed as soon as nothing is left in it (now, or when the next
        cgroup is made, or when coder exits)."""
        self.retired = True
        with _lock:
            _collect()

    def _release_threads(self) -> None:
        """coder's own threads in it go back to coder's own cgroup (at exit: a spawner thread
        still waits for work, and a cgroup with a task in it cannot be removed)."""
        home = _home()
        assert home is not None
        with open(os.path.join(self.path, "tasks"), "rb") as f:
            tids = f.read().split()
        for tid in tids:
            if os.path.exists(f"/proc/self/task/{int(tid)}"):
                _write(os.path.join(home[0], "tasks"), tid.decode())


def join_new(kind: str) -> Group | None:
    """A new cgroup (`kind`: what it is for, in its name) with the calling thread in it; None
    where coder makes no cgroups (`problem()`)."""
    if problem() is not None:
        return None
    group = make(kind)
    try:
        group.join_thread()
    except OSError as exc:
        group.retire()
        raise EnvironmentProblem(f"cannot put commands in a pids cgroup: {exc}") from exc
    return group


def make(kind: str) -> Group:
    """A new, empty cgroup of coder's (only where `problem()` is None)."""
    with _lock:
        _collect()
        base, shown = _base()
        name = f"{kind}-{next(_count)}"
        try:
            os.mkdir(os.path.join(base, name))
        except OSError as exc:
            raise EnvironmentProblem(f"cannot make a pids cgroup in {base}: {exc}") from exc
        group = Group(os.path.join(base, name), posixpath.join(shown, name))
        _groups.append(group)
        return group


def kill(pids: Iterable[int], belongs: Callable[[int], bool]) -> list[int]:
    """SIGKILL each of `pids` that `belongs` says is still one to end (asked once a pidfd holds
    the process: a pid reused meanwhile is never signalled), and wait until they have ended;
    the pids killed."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone
            continue
        try:
            if belongs(pid):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                fds[pid] = fd
                continue
        except OSError:  # ended meanwhile
            pass
        os.close(fd)
    try:
        _wait_ended(list(fds.values()), _EXIT_WAIT_S)
    finally:
        for fd in fds.values():
            os.close(fd)
    return list(fds)


def _wait_ended(fds: list[int], seconds: float) -> None:
    """Until each process (a pidfd) has ended, or `seconds` have passed."""
    waiting = set(fds)
    deadline = time.monotonic() + seconds
    while waiting and (left := deadline - time.monotonic()) > 0:
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        for fd, _event in poller.poll(left * 1000):
            waiting.discard(fd)


_lock = threading.Lock()
_groups: list[Group] = []
_count = itertools.count(1)
_made: list[tuple[str, str]] = []  # coder's own directory of cgroups, once made


@functools.lru_cache(maxsize=1)
def _home() -> tuple[str, str] | None:
    """coder's own cgroup in the v1 pids hierarchy: its directory, and its path as
    /proc/PID/cgroup names it; None without that hierarchy."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
        with open("/proc/self/mountinfo") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    own = next(
        (
            path
            for _, ctl, path in (line.split(":", 2) for line in lines)
            if "pids" in ctl.split(",")
        ),
        None,
    )
    if own is None:
        return None
    for mount in mounts:
        fields, _, fs = mount.partition(" - ")
        fstype, _source, options = (fs.split() + ["", "", ""])[:3]
        if fstype != "cgroup" or "pids" not in options.split(","):
            continue
        root, point = (_unescape(f) for f in fields.split()[3:5])
        inside = posixpath.relpath(own, root)
        if inside == ".." or inside.startswith("../"):
            continue
        return posixpath.normpath(posixpath.join(point, inside)), own
    return None


def _unescape(field: str) -> str:
    """A mountinfo field: spaces, tabs, newlines and backslashes come as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _base() -> tuple[str, str]:
    """coder's own directory of cgroups (made once, the gone coders' swept first), as
    (directory, shown path). Under `_lock`."""
    if _made:
        return _made[0]
    home = _home()
    assert home is not None
    _sweep(*home)
    name = f"{_PREFIX}-{owner.tag()}"
    os.mkdir(os.path.join(home[0], name))
    _made.append((os.path.join(home[0], name), posixpath.join(home[1], name)))
    return _made[0]


def _sweep(home: str, shown: str) -> None:
    """Remove the cgroups of coders of this pid namespace that are gone, after ending what is
    left in them (another coder sweeping at the same time is harmless: each end and rmdir
    only finds less)."""
    for entry in os.listdir(home):
        prefix, _, tag = entry.partition("-")
        if prefix != _PREFIX or not owner.gone(tag):
            continue
        gone = os.path.join(home, entry)
        with contextlib.suppress(OSError, EnvironmentProblem):
            for child in os.listdir(gone):
                if os.path.isdir(os.path.join(gone, child)):
                    Group(os.path.join(gone, child), posixpath.join(shown, entry, child)).end()
                    os.rmdir(os.path.join(gone, child))
            os.rmdir(gone)


def _collect() -> None:
    """Remove the retired cgroups nothing is left in (under `_lock`)."""
    for group in [g for g in _groups if g.retired]:
        try:
            os.rmdir(group.path)
        except FileNotFoundError:
            pass
        except OSError:  # EBUSY: a task is still in it
            continue
        _groups.remove(group)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@atexit.register
def _clean_up() -> None:
    """At exit: nothing left in coder's cgroups, and none of them left behind."""
    with _lock:
        if not _made:
            return
        for group in list(_groups):
            with contextlib.suppress(OSError, EnvironmentProblem):
                group._release_threads()
                group.end()
                os.rmdir(group.path)
                _groups.remove(group)
        with contextlib.suppress(OSError):
            os.rmdir(_made[0][0])
