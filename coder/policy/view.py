"""What a command sees: a root of its own, built as bubblewrap builds one, once per spawner thread.

Landlock lets a command read everything and connect to any UNIX socket by path (an ssh agent, a
container daemon's socket, which is root on the host); `/dev/shm` and `/dev/pts` are shared
with the host. So the spawner thread (coder.policy.confine), before Landlock, gives itself a
mount namespace whose root holds only what its commands need, each at the same absolute path
as on the host:

- the profile's writable directories (the worktree, its git admin dir, the sandbox's temp
  root), read-write; its read-only carve-outs inside them (`Profile.readonly`), read-only;
- read-only: the system (`/usr`, `/etc`, `/opt`, `/bin`, `/lib*`..., a top-level link such as
  `/bin -> usr/bin` made again as a link), the toolchain the command's PATH names (`toolchain`:
  each entry's directory, and for `.../bin` its prefix, such as a venv or a pyenv version, with
  the base interpreter a venv's `pyvenv.cfg` names), the repository's common git dir (a
  linked worktree's git needs its objects, refs and config), what the config lists in
  `visible_paths`, and coder's own Python (`runtime`: the spawner thread runs coder's code too,
  `Confinement.call`); the files `/etc` links to elsewhere (`resolv.conf`); the user's git
  config, ignore and attributes files;
- `/proc` (the host's: no PID namespace here; Landlock keeps other processes' `root`, `cwd` and
  `fd` closed) and `/sys`, read-only;
- a `/dev` of its own: the usual device nodes, a new pseudo-terminal instance (a command can
  make terminals but never open the user's), and a private `/dev/shm`; with a private IPC
  namespace, so System V and POSIX message queues of the host are out of reach too;
- an empty `$HOME`; and nothing else: no other file of `$HOME`, no `/run`, no `/tmp` but the
  sandbox's own, no other repository, no user checkout beside a run's worktree.

Everything is read-only but the writable directories (each mount keeps its nosuid, nodev and
noexec flags), so metadata outside stays put as with coder.policy.mounts' wall. How: unshare
the thread's mount namespace (CLONE_NEWNS implies CLONE_FS, so the other threads of coder keep
the host's root and working directory), make every mount private and read-only, mount a tmpfs
on the sandbox's temp root and `pivot_root` into it with the old root below, bind from there,
detach the old root. It needs CAP_SYS_ADMIN in the thread's user namespace: root, or a coder
that made its own user namespace at start (coder.policy.userns). Building costs a few ms per
spawner thread and nothing per command: the commands it starts share its namespace.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from coder.files.realpath import realpath
from coder.policy.mounts import (
    _CLONE_NEWNS,
    _MOUNT_ATTR_RDONLY,
    _MS_BIND,
    _MS_PRIVATE,
    _MS_REC,
    _error,
    _libc,
    _MountAttr,
    _set_attributes,
)

_CLONE_NEWIPC = 0x08000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_OLD = "/.coder-old-root"  # where the host's root hangs while the view is built

SYSTEM = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/nix")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEVICE_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "ptmx": "pts/ptmx",
}


@dataclass(frozen=True)
class Plan:
    """What to put in the view, worked out on the host before the namespace exists."""

    binds: tuple[tuple[str, bool], ...]  # (real path, writable), parents before children
    links: tuple[tuple[str, str], ...]  # (path, target): links made again inside the view
    home: str | None  # made as an empty directory, when nothing else puts it there


def plan(
    writable: Iterable[str], readonly: Iterable[str] = (), visible: Iterable[str] = ()
) -> Plan:
    """The view of a profile: `writable` (real paths, as `Profile.writable`), `readonly`
    carve-outs inside them, and `visible` paths shown read-only (as named: a link on the way
    is made again in the view) besides the system and coder's own runtime."""
    rw = {p for p in writable if os.path.isdir(p)}
    rw = {p for p in rw if not os.statvfs(p).f_flag & os.ST_RDONLY}  # never widen
    links: dict[str, str] = {}
    shown: set[str] = set()
    for path in (*SYSTEM, *_etc_links(), *runtime(), *_git_config(), *visible):
        real = _follow(path, links)
        if real is not None and real != "/":
            shown.add(real)
    shown = {p for p in shown if not _under(p, rw) and not _under(p, shown - {p})}
    carve = {realpath(p) for p in readonly if os.path.exists(p)}  # directories and files
    binds = sorted(
        [(p, True) for p in rw]
        + [(p, False) for p in shown | carve]
        + [("/proc", False), ("/sys", False)]
    )
    home = os.environ.get("HOME")
    return Plan(tuple(binds), tuple(sorted(links.items())), home if home != "/" else None)


def build(found: Plan, scratch: str) -> None:
    """Give the calling thread the view of `found`; `scratch` is an empty directory of the
    host (the sandbox's temp root) that the view's tmpfs is mounted on while it is built.
    Raises OSError (naming the step and path) when the kernel refuses one."""
    libc = _libc()
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # removed
        cwd = None
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC) != 0:
        raise _error("unshare(CLONE_NEWNS | CLONE_NEWIPC)", "/")
    _set_attributes("/", _MountAttr(_MOUNT_ATTR_RDONLY, 0, _MS_PRIVATE, 0), recursive=True)
    _mount("tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    os.mkdir(scratch + _OLD, 0o700)
    _pivot_root(scratch, scratch + _OLD)
    os.chdir("/")
    for path, writable in found.binds:
        _bind_in(path, writable)
    for path, target in found.links:
        if not os.path.lexists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
    _devices()
    if found.home and not os.path.lexists(found.home):
        try:
            os.makedirs(found.home, 0o755)
        except OSError:  # inside a read-only bind, where the host has no such directory
            pass
    if libc.umount2(_OLD.encode(), _MNT_DETACH) != 0:
        raise _error("umount2", _OLD)
    os.rmdir(_OLD)
    _set_attributes("/", _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), recursive=False)
    try:  # the same directory, where the view has it (the launcher's program starts there)
        os.chdir(cwd or "/")
    except OSError:
        os.chdir("/")


def problem() -> str | None:
    """Why this machine cannot build a view at all (before trying), or None."""
    if not sys.platform.startswith("linux"):
        return "a view needs Linux mount namespaces"
    if os.uname().machine not in _SYS_PIVOT_ROOT:
        return f"pivot_root's number on {os.uname().machine} is not known to coder"
    return None


@functools.lru_cache(maxsize=64)
def toolchain(path_var: str) -> tuple[str, ...]:
    """What a command whose PATH is `path_var` runs from, to be shown read-only: each
    absolute PATH entry, and for an entry `PREFIX/bin` (or `sbin`) its PREFIX (a venv, a
    pyenv version, `~/.local`: its libraries), unless PREFIX is `/` or `$HOME` (or holds
    it); for a venv
    also the base interpreter's prefix (`home` in its `pyvenv.cfg`)."""
    home = os.path.normpath(os.environ.get("HOME") or "/")
    found: list[str] = []
    for entry in path_var.split(os.pathsep):
        _toolchain_entry(os.path.normpath(entry), home, found, depth=0)
    return tuple(dict.fromkeys(found))


def _toolchain_entry(entry: str, home: str, found: list[str], depth: int) -> None:
    if not entry.startswith("/") or not os.path.isdir(entry) or _under(home, {entry}):
        return  # relative, missing, or `/` or $HOME (or above it) itself: never all of it
    found.append(entry)
    prefix, name = os.path.split(entry)
    if name not in ("bin", "sbin") or _under(home, {prefix}):  # `/`, $HOME, or above it
        return
    found.append(prefix)
    base = _venv_home(prefix)
    if base is not None and depth < 2:
        _toolchain_entry(os.path.normpath(base), home, found, depth + 1)


def _venv_home(prefix: str) -> str | None:
    """The `home` a venv's `pyvenv.cfg` names (where its base interpreter is), or None."""
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home":
            return value.strip()
    return None


@functools.lru_cache(maxsize=1)
def runtime() -> tuple[str, ...]:
    """Where coder's own Python runs from: its prefixes and the entries of its import path it
    imported from (the spawner thread runs coder's code confined, `Confinement.call`, and may
    import on the way). Not the others: `python -m coder` puts the working directory (the
    user's checkout) on the path."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    files = [
        f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)
    ]
    used = [
        entry
        for entry in sys.path
        if entry
        and os.path.isabs(entry)
        and any(f.startswith(entry.rstrip("/") + "/") for f in files)
    ]
    return tuple(dict.fromkeys((*prefixes, *used)))


def _git_config() -> list[str]:
    """The user's own git settings, files only: git in a command, and coder's own git run
    confined (the step scan of a large tree), ignore and treat files as the user's git does
    (`core.excludesFile` by default, `core.autocrlf`...). Not the credentials kept beside
    them (`~/.config/git/credentials`)."""
    home = os.environ.get("HOME") or ""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    names = (
        f"{home}/.gitconfig",
        *(f"{xdg}/git/{name}" for name in ("config", "ignore", "attributes")),
    )
    return [name for name in names if home and os.path.isfile(name)]


def _etc_links() -> list[str]:
    """Files that `/etc` links to outside the system directories (`resolv.conf` into `/run`):
    shown, the file only, so that names resolve for a command with the network."""
    found = []
    try:
        entries = list(os.scandir("/etc"))
    except OSError:
        return []
    for entry in entries:
        if entry.is_symlink():
            target = realpath(entry.path)
            elsewhere = not _under(target, {*SYSTEM, "/proc", "/sys", "/dev"})
            if elsewhere and os.path.isfile(target):
                found.append(target)
    return found


def _follow(path: str, links: dict[str, str], depth: int = 0) -> str | None:
    """The real path of `path` (None if it does not exist), recording each link on the way
    in `links` so that the view can resolve `path` as the host does."""
    if not os.path.isabs(path) or not os.path.lexists(path) or depth > 8:
        return None
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if os.path.islink(current):
            target = os.readlink(current)
            links.setdefault(current, target)
            _follow(os.path.join(os.path.dirname(current), target), links, depth + 1)
            current = realpath(current)
    return realpath(path) if os.path.exists(path) else None


def _under(path: str, roots: Iterable[str]) -> bool:
    """Whether `path` is one of `roots` or inside one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _bind_in(path: str, writable: bool) -> None:
    """Bind the host's `path` (below the old root) at `path` in the view."""
    source = _OLD + path
    if not os.path.lexists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.isdir(source):
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    _mount(source, path, None, _MS_BIND | _MS_REC, None)
    if writable:
        _set_attributes(path, _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0), recursive=False)
    else:
        _set_attributes(path, _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), recursive=True)


def _devices() -> None:
    """A `/dev` of the view's own: see the module docstring."""
    os.mkdir("/dev")
    _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755")
    for name in DEVICES:
        if os.path.exists(_OLD + "/dev/" + name):
            os.close(os.open("/dev/" + name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            _mount(_OLD + "/dev/" + name, "/dev/" + name, None, _MS_BIND, None)
    for name, target in DEVICE_LINKS.items():
        os.symlink(target, "/dev/" + name)
    os.mkdir("/dev/pts")
    options = "newinstance,ptmxmode=0666,mode=0620"
    _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, options)
    os.mkdir("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    _set_attributes("/dev", _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), recursive=False)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def c(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    if _libc().mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)) != 0:
        raise _error(f"mount {fstype or 'bind'}", target)


def _pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT[os.uname().machine]
    if _libc().syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()) != 0:
        raise _error("pivot_root", new_root)
