"""The kernel filesystem sandbox every command runs in: Landlock, applied by a spawner thread.

What a confined command can do: read and execute what it sees (coder.policy.view: its
worktree, its temp dir, the system and its toolchain, where this machine allows a view; else
anything); write only under its profile's writable directories (a run's worktree, that
worktree's own git admin directory, less the files naming its branch, repository and config
where the mount wall is: `admin_files`, a private temporary directory) and to `/dev/null`-like
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
outside the worktree is not contained, and `support().view_problem` and `mounts_problem` say
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
The external MCP servers confined to the worktree (`launcher_argv`) have sandboxes of their
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from coder.errors import EnvironmentProblem
from coder.files.realpath import realpath
from coder.policy import cgroups, reaper, tmpdirs

MIN_ABI = 3  # truncate(2) is only covered from ABI 3 on
_KEEP_THREADS = 16  # idle spawner threads kept (one per profile); older ones are stopped
# Devices any command may open for writing: the ones a shell and a test suite expect.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/ptmx")
_DEVICE_DIRS = ("/dev/pts", "/dev/shm")  # pseudo-terminals; POSIX shared memory (semaphores)

_CLONE_NEWNET = 0x40000000
_T = TypeVar("_T")
_PR_CAPBSET_DROP = 24
_PR_SET_DUMPABLE = 4
_CAP_VERSION_3 = 0x20080522
_CAP_SETFCAP = 31


@dataclass(frozen=True)
class Profile:
    """What a confined command may write, and whether it may use the network."""

    writable: tuple[str, ...]  # real paths of directories
    network: bool = False
    # real paths inside `writable` kept read-only (bound over themselves; needs the mount wall)
    readonly: tuple[str, ...] = ()
    # paths shown read-only besides the system, in the view (coder.policy.view): the toolchain
    # the commands' PATH names and the config's `visible_paths`
    visible: tuple[str, ...] = ()


@dataclass(frozen=True)
class Support:
    """What this machine offers, for `coder doctor` and for refusing to run without it."""

    abi: int  # Landlock ABI version; 0 when the kernel has none
    netns: str  # "thread" (own namespace, capabilities dropped), "per-command", or "none"
    problem: str | None  # why commands cannot be confined here, or None
    # The metadata wall: why commands get no read-only mount namespace (coder.policy.mounts),
    # and why setuid/setgid bits are not refused (coder.policy.seccomp); None when they are.
    mounts_problem: str | None = "not probed"
    setid_problem: str | None = "not probed"
    # The view (coder.policy.view): why commands see the whole filesystem here, or None.
    view_problem: str | None = "not probed"

    @property
    def available(self) -> bool:
        return self.problem is None


@functools.lru_cache(maxsize=1)
def support() -> Support:
    """Probed once per process: the Landlock ABI and how commands get a network namespace."""
    try:
        import landlockpy
    except ImportError:
        return Support(0, "none", "the landlockpy package is not installed")
    try:
        abi = landlockpy.abi_version()
    except OSError as exc:
        return Support(0, "none", f"Landlock is not usable: {exc}")
    netns = _netns_mode()
    walls = {
        "mounts_problem": _mounts_problem(),
        "setid_problem": _setid_problem(),
        "view_problem": _view_problem(),
    }
    if abi == 0:
        problem = "this kernel has no Landlock (Linux 5.13+ with lsm=landlock)"
        return Support(0, netns, problem, **walls)
    if abi < MIN_ABI:
        problem = f"this kernel's Landlock ABI {abi} is too old (needs {MIN_ABI}, Linux 6.2+)"
        return Support(abi, netns, problem, **walls)
    return Support(abi, netns, None, **walls)


def _in_throwaway_thread(probe: Callable[[], object]) -> OSError | None:
    """Run `probe` on a thread of its own (what it changes there, namespaces, filters, dies
    with the thread); the OSError it raised, or None."""
    result: list[OSError | None] = [OSError(errno.EINVAL, "the probe did not finish")]

    def run() -> None:
        try:
            probe()
        except OSError as exc:
            result[0] = exc
        else:
            result[0] = None

    thread = threading.Thread(target=run, name="coder-sandbox-probe")
    thread.start()
    thread.join()
    return result[0]


def _netns_mode() -> str:
    def probe() -> None:
        if _libc().unshare(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), _errno_text())

    if _in_throwaway_thread(probe) is None:
        return "thread"
    return "per-command" if unshare_prefix() is not None else "none"


def _mounts_problem() -> str | None:
    from coder.policy import mounts

    with tempfile.TemporaryDirectory(prefix=tmpdirs.prefix("probe")) as tmp:
        failed = _in_throwaway_thread(lambda: mounts.wall([tmp]))
    if failed is None:
        return None
    if failed.errno == errno.EPERM:
        return "making a mount namespace in a thread needs CAP_SYS_ADMIN (root, or user namespaces)"
    return failed.strerror or str(failed)


def _view_problem() -> str | None:
    from coder.policy import view

    if problem := view.problem():
        return problem
    with tempfile.TemporaryDirectory(prefix=tmpdirs.prefix("probe")) as tmp:
        found = view.plan([tmp])
        failed = _in_throwaway_thread(lambda: view.build(found, tmp))
    if failed is None:
        return None
    if failed.errno == errno.EPERM:
        return "making a mount namespace in a thread needs CAP_SYS_ADMIN (root, or user namespaces)"
    return failed.strerror or str(failed)


def _setid_problem() -> str | None:
    from coder.policy import seccomp

    if problem := seccomp.problem():
        return problem
    failed = _in_throwaway_thread(seccomp.refuse_setid)
    return None if failed is None else failed.strerror or str(failed)


@functools.lru_cache(maxsize=1)
def unshare_prefix() -> tuple[str, ...] | None:
    """argv prefix giving a command a private, empty network (`unshare`), or None if the
    kernel or a missing `unshare` does not allow it. Probed once per process."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    # Prefer keeping our uid (util-linux >= 2.38); `-r` maps us to root inside the namespace.
    for flags in (("--map-current-user", "--net"), ("-r", "-n")):
        prefix = (exe, *flags, "--")
        try:
            probe = subprocess.run(
                [*prefix, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return None


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def writable_for(root: Path) -> tuple[str, ...]:
    """The directories a command in worktree `root` may write: the worktree and, for a linked
    worktree, its own admin directory (`.git/worktrees/<id>`: its index; not its HEAD and the
    other files of `admin_files`), never the repository's shared refs, objects, hooks or
    config.

    The worktree's `.git` file is writable, so it is not trusted alone: the admin directory
    it names must name this worktree back (its `gitdir` file, which git wrote and a command
    cannot), or a command could aim the next one's sandbox at another run's admin dir."""
    real = realpath(root)
    gitfile = os.path.join(real, ".git")
    from coder.files import safeio

    def text(path: str) -> str:  # never blocking on a FIFO a command left, nor following
        return safeio.read_regular(path, limit=1 << 16, follow=False).decode(errors="replace")

    try:
        found = text(gitfile).strip()
        admin = realpath(os.path.join(real, found.removeprefix("gitdir:").strip()))
        back = text(os.path.join(admin, "gitdir")).strip()
    except OSError:  # a main checkout (.git is a directory), or no git at all
        return (real,)
    if found.startswith("gitdir:") and realpath(os.path.join(admin, back)) == gitfile:
        return (real, admin)
    return (real,)


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
            prefix = unshare_prefix()
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

    found = support()
    if not found.available:
        raise EnvironmentProblem(f"no command sandbox: {found.problem}")
    per_command_netns = False
    if not profile.network and not netns_done:
        if found.netns == "thread":
            if _libc().unshare(_CLONE_NEWNET) != 0:
                raise EnvironmentProblem(f"cannot give commands a private network: {_errno_text()}")
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
        from coder.policy import seccomp

        try:
            seccomp.refuse_setid(xattrs=mapped_root)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot refuse setuid files to commands: {exc}") from exc
    return per_command_netns


def _metadata_wall(found: Support, profile: Profile, tmp_root: str) -> None:
    """The thread's own root showing only what its commands need (coder.policy.view), else
    everything read-only to it but the profile's writable dirs (coder.policy.mounts), where
    this machine allows either; a read-only carve-out needs one of them."""
    from coder.policy import mounts, view

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


def launcher_argv(
    argv: list[str],
    root: Path,
    *,
    network: bool,
    visible: Iterable[str] = (),
    tree: dict[str, str] | None = None,
) -> list[str]:
    """`argv` wrapped to run confined to `root` (as `writable_for` says) by a launcher process:
    for programs coder does not start itself (external MCP servers, started by the MCP SDK),
    where one Python start per long-lived server costs nothing that matters. The program
    sees, besides the system, the toolchain of coder's PATH and of its own directory, and
    `visible` (the config's `visible_paths`). `tree`: the process tree it joins first
    (coder.policy.proctrees)."""
    import json
    import sys

    found = support()
    if not found.available:
        raise EnvironmentProblem(f"no command sandbox: {found.problem}")
    prefix = unshare_prefix() if not network and found.netns == "per-command" else None
    writable = writable_for(root)
    profile = {
        "writable": list(writable),
        "readonly": list(admin_files(writable)),
        "network": network,
        "tmp": tmpdirs.make("sandbox"),
        "netns_done": prefix is not None,
        "visible": [*_toolchain(argv[0], root), *_named(argv[1:]), *visible],
        "tree": tree or {},
    }
    _tmp_roots.append(profile["tmp"])  # type: ignore[arg-type]
    launcher = [sys.executable, "-I", "-m", "coder.policy.launch", json.dumps(profile), "--"]
    return [*(prefix or ()), *launcher, *argv]


def _toolchain(program: str, cwd: Path) -> tuple[str, ...]:
    """What a program started by name from `cwd` runs from (coder.policy.view.toolchain): the
    toolchain of PATH, and of the directory the program is found in."""
    from coder.policy import view

    path_var = os.environ.get("PATH", "")
    found = shutil.which(os.path.join(cwd, program) if "/" in program else program)
    where = os.path.dirname(os.path.abspath(found)) if found else ""
    return view.toolchain(f"{path_var}{os.pathsep}{where}")


def _named(args: list[str]) -> list[str]:
    """The files and directories a server's own command line names by absolute path (its
    script, `/home/me/tools/server.py`; its config): the server you configured runs from them,
    so its view shows them read-only (a file's whole directory, for what it imports)."""
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if not value.startswith("/") or not os.path.exists(value):
            continue
        found.append(value if os.path.isdir(value) else os.path.dirname(value))
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
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _existing(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


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
    libc = _libc()
    for cap in range(64):
        if cap != keep and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:  # past the last capability this kernel knows
                break
            if err == errno.EPERM:  # no CAP_SETPCAP: we hold nothing to drop
                break
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if keep is not None and libc.capget(ctypes.byref(header), data) == 0:
        word, bit = divmod(keep, 32)
        for i in range(2):
            mask = (1 << bit) if i == word else 0
            data[i].effective &= mask
            data[i].permitted &= mask
            data[i].inheritable &= mask
    else:
        data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise EnvironmentProblem(f"cannot drop capabilities for commands: {_errno_text()}")


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


def profile_for(
    root: Path, *, network: bool = False, path: str | None = None, visible: Iterable[str] = ()
) -> Profile:
    """The profile of the commands that run in worktree (or checkout) `root` with `path` as
    their PATH (coder's own by default): they see its toolchain (coder.policy.view) and
    `visible` (the config's `visible_paths`) besides the system."""
    from coder.policy import view

    writable = writable_for(root)
    readonly = kept_readonly(root) + admin_files(writable)
    toolchain = view.toolchain(os.environ.get("PATH", "") if path is None else path)
    shown = (*toolchain, *visible)
    return Profile(writable, network=network, readonly=readonly, visible=shown)


# What git reads in a linked worktree's admin dir to know the worktree's repository, branch
# and config: a HEAD pointed at main aims the step commit there, a commondir at another
# repository (whose config runs a `core.fsmonitor`) the user's next `git status`, a
# config.worktree's `core.worktree` coder's checkouts. Never written by a command.
_ADMIN_FILES = ("HEAD", "commondir", "gitdir", "config.worktree")


def admin_files(writable: tuple[str, ...]) -> tuple[str, ...]:
    """`_ADMIN_FILES` of the admin dir among `writable` (`writable_for`'s second path, a
    linked worktree's), kept read-only inside it: bound over themselves, where this machine
    has the read-only mount wall (elsewhere the git guard around each step puts them back).
    config.worktree, absent unless the repository uses it, is made empty first (an empty one
    sets nothing): a name that does not exist cannot be bound, and a command could create it.
    A name that is not a regular file (a link a command left) is not bound: never through a
    link; the git guard replaces it."""
    import stat

    if len(writable) < 2 or not _mount_wall(support()):
        return ()
    admin = writable[1]
    fd = os.open(admin, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open("config.worktree", flags, 0o644, dir_fd=fd))
        except OSError:  # there already; or not ours to make (then not a command's either)
            pass
        found = []
        for name in _ADMIN_FILES:
            try:
                if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    found.append(os.path.join(admin, name))
            except FileNotFoundError:
                continue
        return tuple(found)
    finally:
        os.close(fd)


def kept_readonly(root: Path) -> tuple[str, ...]:
    """What stays read-only to the commands of `root` inside it: a main checkout's `.git` and
    `.coder` (`coder mcp serve` runs commands in the user's checkout itself; a run's worktree
    has neither: its `.git` is a file, its repository is outside it). Only where this machine
    has the read-only mount wall that keeps them so; elsewhere the git guard around each call
    puts `.git` back (coder.mcp.walls)."""
    if not _mount_wall(support()):
        return ()
    real = realpath(root)
    inside = (os.path.join(real, name) for name in (".git", ".coder"))
    return tuple(p for p in inside if os.path.isdir(p) and not os.path.islink(p))


def _mount_wall(found: Support) -> bool:
    """Whether commands get a mount namespace here (the view, or the read-only wall), which
    keeps a carve-out of their writable dirs read-only."""
    return found.view_problem is None or found.mounts_problem is None


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
    if not support().available:
        return None
    # Inside `root` coder's own writes go where they mean to (a checkout's `.git` included:
    # libgit2 locks the index even to patch files); a command's carve-outs are not theirs,
    # but for the admin files, which coder writes only outside the sandbox.
    from coder.policy import view

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
    from coder.policy import proctrees

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
