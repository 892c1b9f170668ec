"""The kernel filesystem sandbox every command runs in: Landlock, applied by a spawner thread.

What a confined command can do: read and execute what it sees (coder.policy.view: its
worktree, its temp dir, the system and its toolchain, where this machine allows a view; else
anything); write only under its profile's writable directories (a run's worktree, that
worktree's own git admin directory, less the files naming its branch, repository and config
where the mount wall is: coder.policy.writes, a private temporary directory) and to `/dev/null`-like
devices; no TCP at all while the network is off, and no signals or abstract UNIX sockets
reaching processes outside the sandbox. The user's
checkout, the repository's refs, objects, hooks and config, `.coder/` and `$HOME` are
read-only to it, and that holds for root too: Landlock is checked after file permissions.

How it is applied, and why this way. Landlock restricts the thread that asks for it and
everything that thread starts afterwards; the restriction cannot be lifted. So each profile
gets one long-lived thread that restricts itself once and then only starts commands
(`subprocess.Popen`, which forks and execs in C: no Python runs in the child, so this is safe in
a threaded process, unlike a `preexec_fn`). A command costs what a plain `bash -c` costs; no
launcher process sits in between. The rest of coder (the runner, git, the model client) keeps
its own, unrestricted threads.

Network. While the network is off a command also gets a private network namespace, as before
this sandbox existed. With CAP_SYS_ADMIN (coder running as root) the spawner thread unshares
its own network namespace and then drops every capability from the thread (bounding set
included), so commands run as a capability-less root that cannot load modules, reboot or undo
the sandbox. An ordinary user gets CAP_SYS_ADMIN so too, in a user namespace coder makes for
itself at start (coder.policy.userns). Without it, each command runs under
`unshare --map-current-user --net` (a user and
network namespace per command); `unshare` must write its own uid map under `/proc`, so in that
mode the ruleset also lets commands write under `/proc`, where an unprivileged user can only
touch their own processes (Landlock still denies ptrace-like access to processes outside the
sandbox).

The view, and metadata. Landlock has no rights for a file's mode, owner, times or extended
attributes, and lets a command read anything and connect to any UNIX socket by path. With
CAP_SYS_ADMIN the spawner thread also makes itself a mount namespace whose root holds only what
its commands need, everything read-only but the profile's writable directories
(coder.policy.view; where only bind mounts work, the host's tree all read-only,
coder.policy.mounts; `Profile.readonly` carves read-only paths out of the writable ones),
before Landlock and before it drops its capabilities; for
every user, a seccomp filter refuses setuid and setgid modes (coder.policy.seccomp), after
Landlock. Both are made once per thread and inherited by every command, so they cost nothing
per command. Without CAP_SYS_ADMIN there is no mount namespace (a thread of a process with
threads cannot make the user namespace it would need): commands then see everything, metadata
outside the worktree is not contained, and `kernel.support().view_problem` and `mounts_problem` say
why. And coder's process is made not dumpable while it has spawners (`_undumpable`): a
spawner thread shares its commands' Landlock domain, and would otherwise let them into
coder's memory through `/proc`.

Leftovers. A process that leaves its command's process group (`setsid`, a daemon) outlives
the kill of the group, and would go on changing the worktree while coder checks and commits
it. `end_leftovers` ends every process still in a worktree's sandbox. Where coder can make
cgroups (root), each spawner thread joins a pids cgroup of its own first (coder.policy.cgroups):
coder kills what it lists, from outside, and its `pids.max` is `limits.processes`, which binds
root (`ulimit -u` does not). Elsewhere, and for coder's own children that ended unreaped, a
process started in the same sandbox sends SIGKILL to all it may signal, which Landlock's signal
scope limits to the sandbox's own processes. It first checks that it cannot signal coder
itself, and kills nothing when it can (a kernel before Landlock ABI 6 has no signal scope).
The external MCP servers confined to the worktree (`launch.launcher_argv`) have sandboxes of their
own: what they started since they were ready is ended too (coder.policy.proctrees).

`landlockpy` is the binding (ctypes, no compiler, follows each new Landlock ABI). ABI 3 or newer
is required: before it, truncating a file was not covered.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import os
import queue
import select
import shutil
import subprocess
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from coder.errors import EnvironmentProblem
from coder.files.realpath import realpath
from coder.policy import cgroups, kernel, mounts, proctrees, reaper, seccomp, tmpdirs, view
from coder.policy.kernel import CLONE_NEWNET, errno_text, libc
from coder.policy.writes import Profile, admin_files, writable_for

_KEEP_THREADS = 16  # idle spawner threads kept (one per profile); older ones are stopped
# Devices any command may open for writing: the ones a shell and a test suite expect.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/ptmx")
_DEVICE_DIRS = ("/dev/pts", "/dev/shm")  # pseudo-terminals; POSIX shared memory (semaphores)

_T = TypeVar("_T")
_PR_CAPBSET_DROP = 24
_PR_SET_DUMPABLE = 4
_CAP_VERSION_3 = 0x20080522
_CAP_SETFCAP = 31


class ProcessExit:
    """Waits for a started process to end. A pidfd wakes the waiter the moment it does;
    `Popen.wait(timeout)` sleeps in doubling steps and is late by up to half the command's
    time (4 ms for an 8 ms command), on every step."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux 5.3+
            self.fd = None

    def within(self, seconds: float) -> bool:
        """Whether the process ended (and was reaped) within `seconds`."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        poller = select.poll()  # not select(): no limit on the descriptor's number
        poller.register(self.fd, select.POLLIN)
        poller.poll(seconds * 1000)
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Confinement:
    """One profile's spawner thread: restricts itself once, then starts commands."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.identity = _identity(profile)
        self.tmp_root = tmpdirs.make("sandbox")
        self._spare: list[str] = []  # commands' TMPDIRs given back empty (command_tmp)
        self._spare_lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None]
        self._requests = queue.SimpleQueue()
        self._ready: Future[None] = Future()
        self.per_command_netns = False
        # Each process it starts is coder's descendant until it ends (coder.policy.reaper),
        # so whether one is left can be told without a kill
        self.watched = reaper.active()
        self.group: cgroups.Group | None = None  # its pids cgroup (`_join_group`), if any
        _undumpable()
        self._thread = threading.Thread(target=self._serve, name="coder-sandbox", daemon=True)
        self._thread.start()
        self._ready.result()  # raises what confining the thread raised

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `argv` confined (Popen's keyword arguments). Raises what Popen raises."""
        if not self.profile.network and self.per_command_netns:
            prefix = kernel.unshare_prefix()
            assert prefix is not None
            argv = [*prefix, *argv]

        def start() -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(argv, **kwargs)
            reaper.track(proc, self)
            return proc

        return self.call(start)

    def call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` on the confined thread and return what it returns (or raise what it
        raises): coder's own writes into a tree a command touched (a reset, the model's
        file tools) can then write nothing the commands could not. `fn` must not wait for
        this spawner itself (it is busy running `fn`)."""
        if threading.current_thread() is self._thread:
            return fn()
        done: Future[_T] = Future()
        self._requests.put((fn, done))
        return done.result()

    def hold_to(self, processes: int) -> None:
        """At most `processes` processes (and threads) at once in this sandbox from now on (0:
        no limit), where it has a pids cgroup: `limits.processes`, which binds root too
        (`ulimit -u` does not). Written only when it changes: a command costs nothing more."""
        tasks = processes + 1 if processes else None  # this thread is in the cgroup too
        if self.group is None or self.group.tasks == tasks:
            return
        try:
            self.group.limit(tasks)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot hold commands to {processes} processes: {exc}"
            ) from exc

    def stop(self) -> None:
        self._requests.put(None)
        if self.group is not None:
            self.group.retire()

    def command_tmp(self) -> str:
        """A private, empty temporary directory for one command (its TMPDIR), under this
        sandbox's temporary root; `give_back` it when the command is done. One given back is
        lent again only while it is still an empty directory (not a link a command put in
        its place): a mkdir and an rmdir a command cost 1-2 ms on a busy disk."""
        while True:
            with self._spare_lock:
                if not self._spare:
                    break
                path = self._spare.pop()
            if _empty_dir(path):
                return path
            shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a link inside
        return tempfile.mkdtemp(prefix="cmd-", dir=self.tmp_root)

    def give_back(self, path: str) -> None:
        """`path` from `command_tmp`, its command done: kept for the next command if it is
        left empty, else removed with what is in it."""
        if not _empty_dir(path):
            shutil.rmtree(path, ignore_errors=True)
            return
        with self._spare_lock:
            self._spare.append(path)

    def end_leftovers(self) -> None:
        """SIGKILL every process still running in this sandbox (see the module docstring).
        Only when none of its commands is meant to be running: they would be killed too.
        Nothing is started when none can be running (coder.policy.reaper.quiet)."""
        if self.watched and reaper.quiet(self):
            return
        if self.group is None:
            self._end_from_inside()
            return
        # From outside, by the sandbox's cgroup: nothing is started in the sandbox to do it,
        # so one at its process limit is ended too (coder.policy.cgroups).
        killed = self.group.end()
        if not self.watched:  # the orphans among them are init's to reap
            return
        reaper.reap(killed)
        if not reaper.quiet(self):  # coder's unreaped children are in no cgroup's list
            with self.group.lifted():  # ... and still count: the lister is not refused a fork
                self._end_from_inside()

    def _end_from_inside(self) -> None:
        """The kill from inside the sandbox (see the module docstring); when coder is a
        subreaper, the pids it may signal are listed and those of coder's children reaped."""
        done: Future[subprocess.Popen[bytes]] = Future()
        script = _LIST_AND_END_LEFTOVERS if self.watched else _END_LEFTOVERS
        argv = ["/bin/sh", "-c", script.format(coder=os.getpid())]
        start = functools.partial(
            subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env={}
        )
        self._requests.put((start, done))
        try:
            proc = done.result(timeout=30)  # TimeoutError is an OSError
        except OSError as exc:
            raise EnvironmentProblem(f"cannot end the processes a command left: {exc}") from exc
        exited = ProcessExit(proc)
        assert proc.stdout is not None
        with proc.stdout:
            try:
                if not exited.within(30):
                    raise EnvironmentProblem(
                        "cannot end the processes a command left: no end in 30 s"
                    )
            finally:
                exited.close()
            listed = proc.stdout.read(1 << 20).split()  # its only writer has ended
        if self.watched:  # the killed ones are (or become) coder's children: reap them
            reaper.reap(int(pid) for pid in listed if pid.isdigit())

    def _serve(self) -> None:
        try:
            self._join_group()
            self._confine_this_thread()
        except BaseException as exc:
            if self.group is not None:
                self.group.retire()
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        while (request := self._requests.get()) is not None:
            fn, done = request
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

    def _join_group(self) -> None:
        """This (spawner) thread joins a pids cgroup of its own where coder can make one
        (coder.policy.cgroups), before confining itself shuts the cgroup files: what its
        commands start is listed there, and held to `hold_to`."""
        self.group = cgroups.join_new("sandbox")

    def _confine_this_thread(self) -> None:
        self.per_command_netns = confine_current_thread(self.profile, self.tmp_root)


def confine_current_thread(profile: Profile, tmp_root: str, *, netns_done: bool = False) -> bool:
    """Restrict the calling thread (and all it starts) to `profile`; see the module docstring.
    Returns whether each command must still get its own network namespace from `unshare`.
    `netns_done`: the process already runs in a private network (the launcher, started under
    `unshare`)."""
    from landlockpy import AccessFS, AccessNet, Ruleset, Scope

    found = kernel.support()
    if not found.available:
        raise EnvironmentProblem(f"no command sandbox: {found.problem}")
    per_command_netns = False
    if not profile.network and not netns_done:
        if found.netns == "thread":
            if libc().unshare(CLONE_NEWNET) != 0:
                raise EnvironmentProblem(f"cannot give commands a private network: {errno_text()}")
        else:
            per_command_netns = found.netns == "per-command"
    _metadata_wall(found, profile, tmp_root)
    # Root without CAP_SYS_ADMIN (a container): `unshare` maps uid 0 into its namespace, which
    # the kernel allows only with CAP_SETFCAP (harmless under no_new_privs): keep that one. A
    # command is then root in a namespace whose root is the real one: the seccomp filter
    # refuses it extended attributes, or it could give a file capabilities (security.capability).
    mapped_root = per_command_netns and os.geteuid() == 0
    _drop_capabilities(_CAP_SETFCAP if mapped_root else None)
    read = AccessFS.READ_FILE | AccessFS.READ_DIR | AccessFS.EXECUTE
    device = AccessFS.READ_FILE | AccessFS.WRITE_FILE | AccessFS.IOCTL_DEV
    full = ~(AccessFS.MAKE_CHAR | AccessFS.MAKE_BLOCK | AccessFS.IOCTL_DEV)
    handled_net = AccessNet.NONE if profile.network else None  # None: every right
    scoped = Scope.SIGNAL | Scope.ABSTRACT_UNIX_SOCKET  # nothing outside is signalled
    with Ruleset(handled_net=handled_net, scoped=scoped) as rs:
        rs.allow_path("/", read)
        for path in (*profile.writable, tmp_root):
            rs.allow_path(path, AccessFS(full & rs.handled_fs))
        for path in _existing(_DEVICES):
            rs.allow_path(path, device)
        for path in _existing(_DEVICE_DIRS):
            rs.allow_path(path, read | device | AccessFS(full & rs.handled_fs))
        if per_command_netns:  # unshare writes /proc/self/{uid,gid}_map, setgroups
            rs.allow_path("/proc", read | AccessFS.WRITE_FILE)
        rs.restrict()
    if found.setid_problem is None:
        try:
            seccomp.refuse_setid(xattrs=mapped_root)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot refuse setuid files to commands: {exc}") from exc
    return per_command_netns


def _metadata_wall(found: kernel.Support, profile: Profile, tmp_root: str) -> None:
    """The thread's own root showing only what its commands need (coder.policy.view), else
    everything read-only to it but the profile's writable dirs (coder.policy.mounts), where
    this machine allows either; a read-only carve-out needs one of them."""
    writable = (*profile.writable, realpath(tmp_root))
    if found.view_problem is None:
        shown = (*profile.visible, *_common_dirs(profile.writable))
        try:
            view.build(view.plan(writable, profile.readonly, shown), tmp_root)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot build the view of commands: {exc}") from exc
        return
    if found.mounts_problem is not None:
        if profile.readonly:
            raise EnvironmentProblem(
                f"cannot keep {profile.readonly[0]} read-only for commands: "
                f"no read-only mount namespace here ({found.mounts_problem})"
            )
        return
    try:
        mounts.wall(writable, profile.readonly)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot make the filesystem read-only for commands: {exc}"
        ) from exc


def _common_dirs(writable: Iterable[str]) -> list[str]:
    """The repository's common git dir of a linked worktree's admin dir in `writable`
    (`COMMON/worktrees/ID`, by its place, not by the `commondir` file a command can write):
    git in the worktree needs its objects, refs and config."""
    found = []
    for path in writable:
        parent = os.path.dirname(path)
        common = os.path.dirname(parent)
        if os.path.basename(parent) == "worktrees" and os.path.isdir(f"{common}/objects"):
            found.append(common)
    return found


def _empty_dir(path: str) -> bool:
    """Whether `path` is a directory itself (not a link to one) with nothing in it."""
    import stat

    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _undumpable() -> None:
    """Keep commands out of coder's memory. A spawner thread is in its commands' Landlock
    domain and holds no capability, so the kernel's ptrace checks would let a command open
    `/proc/CODER/task/SPAWNER/mem` and read or write all of coder (its unconfined threads
    included); a process that is not dumpable can be reached so only with CAP_SYS_PTRACE.
    Programs coder starts are dumpable again (exec resets it)."""
    libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _existing(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities(keep: int | None = None) -> None:
    """Empty this thread's capability bounding set and its capability sets, so what it starts
    has none, even as root (capabilities are per thread); `keep` one capability, if held. A
    no-op for an unprivileged user."""
    lib = libc()
    for cap in range(64):
        if cap != keep and lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:  # past the last capability this kernel knows
                break
            if err == errno.EPERM:  # no CAP_SETPCAP: we hold nothing to drop
                break
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if keep is not None and lib.capget(ctypes.byref(header), data) == 0:
        word, bit = divmod(keep, 32)
        for i in range(2):
            mask = (1 << bit) if i == word else 0
            data[i].effective &= mask
            data[i].permitted &= mask
            data[i].inheritable &= mask
    else:
        data = (_CapData * 2)()
    if lib.capset(ctypes.byref(header), data) != 0:
        raise EnvironmentProblem(f"cannot drop capabilities for commands: {errno_text()}")


# Run inside a sandbox: kill(-1) reaches only the sandbox's own processes, as long as Landlock
# scopes signals; if coder itself can be signalled, nothing is killed.
_END_LEFTOVERS = "kill -0 {coder} 2>/dev/null || kill -9 -1 2>/dev/null; exit 0"
# The same, printing first the pids it may signal (the sandbox's processes, itself left out):
# coder reaps those that were reparented to it (coder.policy.reaper).
_LIST_AND_END_LEFTOVERS = (
    "kill -0 {coder} 2>/dev/null && exit 0; for p in /proc/[0-9]*; do p=${{p#/proc/}}; "
    '[ "$p" = $$ ] || ! kill -0 "$p" 2>/dev/null || echo "$p"; done; kill -9 -1 2>/dev/null; '
    "exit 0"
)


def confined(root: Path, fn: Callable[[], _T]) -> _T:
    """`fn()` run confined like the commands of `root` (the same spawner thread), so that a
    write it makes through a link or a path a command planted fails instead of landing
    outside `root`. Where this machine has no sandbox, `fn()` runs as it is: the callers
    also avoid following links themselves (see docs/safety.md)."""
    spawner = spawner_for(root)
    return fn() if spawner is None else spawner.call(fn)


def spawner_for(root: Path) -> Confinement | None:
    """The spawner for coder's own work in `root`: it may write only `writable_for(root)` (the
    commands' spawner when their profile is exactly that, whatever its network), or None where
    this machine has no sandbox."""
    if not kernel.support().available:
        return None
    # Inside `root` coder's own writes go where they mean to (a checkout's `.git` included:
    # libgit2 locks the index even to patch files); a command's carve-outs are not theirs,
    # but for the admin files, which coder writes only outside the sandbox.
    writable = writable_for(root)
    toolchain = view.toolchain(os.environ.get("PATH", ""))
    profile = Profile(writable, readonly=admin_files(writable), visible=toolchain)
    with _lock:
        paths = (profile.writable, profile.readonly)
        same = next((p for p in _confinements if (p.writable, p.readonly) == paths), profile)
    return confinement(same)


def end_leftovers(root: Path) -> None:
    """End every process left running in the sandboxes of worktree `root`: its commands' (all
    returned), and what the MCP servers confined to it started since they were ready
    (coder.policy.proctrees; none of their calls is running)."""
    real = realpath(root)
    with _lock:
        found = [c for p, c in _confinements.items() if p.writable[:1] == (real,)]
    for spawner in found:
        spawner.end_leftovers()
    proctrees.end(real)


_confinements: OrderedDict[Profile, Confinement] = OrderedDict()
_lock = threading.Lock()


def _identity(profile: Profile) -> tuple[tuple[int, int] | None, ...]:
    """Which directories `profile`'s paths are now: Landlock's rules and the mount binds hold
    the directories a spawner found when it started, not their names."""
    found: list[tuple[int, int] | None] = []
    for path in (*profile.writable, *profile.readonly):
        try:
            info = os.stat(path)
        except OSError:
            found.append(None)
            continue
        found.append((info.st_dev, info.st_ino))
    return tuple(found)


def confinement(profile: Profile) -> Confinement:
    """The spawner for `profile` (created on first use; a few idle ones are kept)."""
    with _lock:
        found = _confinements.get(profile)
        if found is not None and found.identity == _identity(profile):
            _confinements.move_to_end(profile)
            return found
        if found is not None:  # a directory was removed and made again: its rules name the old
            del _confinements[profile]
            found.stop()
            _tmp_roots.append(found.tmp_root)
        created = Confinement(profile)
        _confinements[profile] = created
        while len(_confinements) > _KEEP_THREADS:
            _, oldest = _confinements.popitem(last=False)
            oldest.stop()
            _tmp_roots.append(oldest.tmp_root)
        return created


_tmp_roots: list[str] = []


def new_tmp_root() -> str:
    """A temporary root for a program coder does not start itself (coder.policy.launch), removed
    when coder exits."""
    path = tmpdirs.make("sandbox")
    _tmp_roots.append(path)
    return path


@atexit.register
def _clean_up() -> None:
    """At exit: nothing left running in a sandbox, no temporary directory left behind."""
    for spawner in list(_confinements.values()):
        try:
            spawner.end_leftovers()
        except EnvironmentProblem:
            pass
    for root in [*_tmp_roots, *(c.tmp_root for c in _confinements.values())]:
        shutil.rmtree(root, ignore_errors=True)
