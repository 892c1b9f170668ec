"""What this kernel offers for confining commands, probed once per process: the Landlock ABI,
how a command gets a network namespace of its own, and whether the metadata wall, the setid
filter and the view can be built here (each probe runs on a throwaway thread, so what it
changes dies with it). `coder doctor` shows it; coder.policy.confine refuses to run without it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from coder.policy import mounts, seccomp, tmpdirs, view

MIN_ABI = 3  # truncate(2) is only covered from ABI 3 on
CLONE_NEWNET = 0x40000000


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

    @property
    def mount_wall(self) -> bool:
        """Whether commands get a mount namespace here (the view, or the read-only wall),
        which keeps a carve-out of their writable dirs read-only."""
        return self.view_problem is None or self.mounts_problem is None


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
        if libc().unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), errno_text())

    if _in_throwaway_thread(probe) is None:
        return "thread"
    return "per-command" if unshare_prefix() is not None else "none"


def _mounts_problem() -> str | None:
    with tempfile.TemporaryDirectory(prefix=tmpdirs.prefix("probe")) as tmp:
        failed = _in_throwaway_thread(lambda: mounts.wall([tmp]))
    if failed is None:
        return None
    if failed.errno == errno.EPERM:
        return "making a mount namespace in a thread needs CAP_SYS_ADMIN (root, or user namespaces)"
    return failed.strerror or str(failed)


def _view_problem() -> str | None:
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
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def errno_text() -> str:
    return os.strerror(ctypes.get_errno())
