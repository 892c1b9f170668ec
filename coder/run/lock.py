"""The per-task runner lock (`.coder/locks/ID.lock`): one runner per task; and the lock of
the user's checkout (`.coder/locks/the.checkout.lock`, `CheckoutLock`): one reader or writer
of it at a time.

Each lock is an `flock` on a file descriptor its holder keeps open: the kernel releases it when
the process dies, however it dies, so a `kill -9` can never leave a lock that blocks forever.
The record written in the file is for messages and `coder stop`; the flock is what decides who
holds the lock (the checkout lock's record also tells that a merge did not finish).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict, cast

from coder.errors import CoderError, ConcurrentRun, EnvironmentProblem
from coder.files import nofollow
from coder.files.durable import make_private_dirs, write_failed
from coder.run.records import check_task_id, now_iso
from coder.run.state import StateStore


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie waiting to be reaped)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no procfs (macOS): trust kill(0)
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _lock_path(coder_dir: Path, task_id: str) -> Path:
    return Path(coder_dir) / "locks" / f"{check_task_id(task_id)}.lock"


class Owner(TypedDict, total=False):
    """The record a lock's holder writes into the lock file."""

    pid: int
    started_at: str
    host: str
    holder: str  # "run", "merge", "revert", ...
    task: str  # the checkout lock's: the run whose command holds it
    landed: str  # the checkout lock's: the commit a merge moved the base branch to


def _read_owner(fd: int) -> Owner:
    """The owner record in a lock file; {} when empty (released cleanly) or unreadable."""
    raw = os.pread(fd, 4096, 0)
    try:
        owner = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):  # not a record coder wrote
        return {}
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return {}
    return cast(Owner, owner)


def _record(fd: int, record: Owner) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)


def _flock(fd: int, operation: int, attempts: int = 5) -> bool:
    """Try a non-blocking flock a few times: `read_lock_owner` takes a shared lock for an
    instant, and a runner starting in that instant must not mistake it for a live runner."""
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(0.02)
    return False


class _FileLock:
    """An flock on a file under `.coder/locks/` whose holder keeps it open, with the holder's
    record in it: what TaskLock and CheckoutLock share. `_take` opens it (never through a
    link) and locks it, `_keep` writes the record, `release` unlocks, emptying the record
    when the holder finished (a record left says it did not). Subclasses say how to
    `acquire`, and whether leaving the `with` block on an exception finished the work."""

    path: Path
    holder: str
    _fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _take(self, busy: Callable[[Owner], CoderError], *, attempts: int = 5) -> Owner:
        """Lock the file (`busy(its record)` raised when another holds it) and return the
        record found in it ({} after a clean release); call `_keep` to hold it."""
        try:
            make_private_dirs(self.path.parent)
            # O_CLOEXEC (open_file's): commands the holder starts must not keep the lock.
            fd = nofollow.open_file(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a link under .coder/ (never followed), a full disk
            raise write_failed(self.path, exc) from exc
        try:
            if not _flock(fd, fcntl.LOCK_EX, attempts=attempts):
                raise busy(_read_owner(fd))
            found = _read_owner(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return found

    def _keep(self, **extra: str) -> Owner:
        """Write this holder's record into the locked file; it is returned."""
        import socket  # here: `coder status` reads locks, and socket costs a 10th of it

        assert self._fd is not None, "the lock is taken"
        record = cast(
            Owner,
            {
                "pid": os.getpid(),
                "started_at": now_iso(),
                "host": socket.gethostname(),
                "holder": self.holder,
                **extra,
            },
        )
        try:
            _record(self._fd, record)
        except OSError as exc:  # a full disk
            self.release(finished=False)
            raise write_failed(self.path, exc) from exc
        return record

    def release(self, *, finished: bool = True) -> None:
        """Unlock; the record is emptied only when the holder `finished` its work."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if finished:
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the fd drops the flock

    def __enter__(self) -> Self:
        return self.acquire()

    def acquire(self) -> Self:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release(finished=self._finished_on_exit(exc_type))

    def _finished_on_exit(self, exc_type: type[BaseException] | None) -> bool:
        return True


class TaskLock(_FileLock):
    """One runner per task, and no run, resume or other command of the task while a command
    such as `merge` or `revert` (the `holder`) works on it. `with TaskLock(coder_dir, task_id)
    as lock: ...`, or `acquire()` and `release()`; a command opening a run takes it through
    `coder.run.opened.open_run`.

    Raises ConcurrentRun if a live process holds it: held by a run, a command says it cannot
    go on while it runs (`hint`, else how to stop it); held by another merge or revert, that
    one's own refusal. If the previous holder died without releasing it, the lock is taken
    over and `took_over_from` holds its pid (log a warning). Keep the object alive for as long
    as the work lasts: the lock lives in its open fd."""

    def __init__(
        self, coder_dir: Path, task_id: str, *, holder: str = "run", hint: str | None = None
    ) -> None:
        self.task_id = check_task_id(task_id)
        self.path = _lock_path(coder_dir, task_id)
        self.holder = holder  # the command taking it (run, merge, revert), for the refusals
        self.hint = hint  # what a command refused by a running run says to do
        self.took_over_from: int | None = None
        self._fd: int | None = None

    def acquire(self) -> Self:
        if self._fd is not None:
            raise RuntimeError(f"lock for task {self.task_id} is already held by this object")
        previous = self._take(self._busy)
        self._keep()
        # A record left behind means the holder died without releasing (a clean release
        # empties the file). The flock proved it no longer holds it, whatever its pid is now.
        self.took_over_from = previous.get("pid")
        return self

    def _busy(self, owner: Owner) -> ConcurrentRun:
        pid = owner.get("pid")
        who = f"pid {pid}" if pid else "another process"
        since = f", started {owner['started_at']}" if owner.get("started_at") else ""
        host = f" on {owner['host']}" if owner.get("host") else ""
        holder = owner.get("holder")
        if holder in ("merge", "revert"):  # short, and safe to kill: never to be stopped
            return ConcurrentRun(
                f"another `coder {holder}` of run {self.task_id} ({who}{since}{host}) is "
                "running; wait for it",
                hint="run the command again once it has finished",
                holder=holder,
            )
        running = f"task {self.task_id} is already being run by {who}{since}{host}"
        stop = f"wait for it to finish, or stop it with `coder stop -t {self.task_id}`"
        if self.holder == "run":
            return ConcurrentRun(running, hint=stop)
        return ConcurrentRun(
            f"cannot {self.holder} run {self.task_id} while it runs: {running}",
            hint=self.hint or stop,
        )


# --- the user's checkout ---------------------------------------------------------------------

CHECKOUT_LOCK = "the.checkout.lock"  # task ids have no dot: no task's lock is named so
CHECKOUT_WAIT = 30.0  # seconds a command waits for another to be done with the checkout


class CheckoutLock(_FileLock):
    """The user's checkout, one command at a time: `coder merge` holds this lock from just
    before it moves the base branch until the checkout has followed, and `coder run
    --include-uncommitted` while it reads the checkout into the run's first commit. So a
    snapshot never sees a checkout half-way between two commits (HEAD moved, its files not
    yet), which it would take, and a later merge land, as the user's undoing of the merge.

    `with CheckoutLock(coder_dir, holder="merge", task_id=ID) as lock: ...` waits up to
    CHECKOUT_WAIT seconds for the other holder (an update takes well under one), then refuses
    naming it (ConcurrentRun, exit 3). A holder that does not finish (killed, interrupted,
    failed) leaves its record: one of a merge that had moved its base (`landed`) means the
    checkout did not follow, and until `coder merge -t ID` finishes that (or that run's state
    records its merge) the checkout is neither read nor updated by anyone else."""

    def __init__(self, coder_dir: Path, *, holder: str, task_id: str) -> None:
        self.coder_dir = Path(coder_dir)
        self.path = self.coder_dir / "locks" / CHECKOUT_LOCK
        self.holder, self.task_id = holder, task_id
        self._record: Owner = {}
        self._fd: int | None = None

    def acquire(self) -> Self:
        attempts = max(1, int(CHECKOUT_WAIT / 0.02))
        found = self._take(lambda owner: self._busy(owner, CHECKOUT_WAIT), attempts=attempts)
        try:
            self._refuse_unfinished(found)  # its record stays, for the next one
        except BaseException:
            self.release(finished=False)
            raise
        self._record = self._keep(task=self.task_id)
        return self

    def landed(self, commit: str) -> None:
        """The holder (a merge) moved the base branch to `commit`: from now on, a holder that
        does not finish leaves a checkout behind its branch."""
        assert self._fd is not None, "the checkout lock is held"
        self._record = {**self._record, "landed": commit}
        _record(self._fd, self._record)

    def _finished_on_exit(self, exc_type: type[BaseException] | None) -> bool:
        return exc_type is None  # a merge that did not finish leaves its record

    def _busy(self, owner: Owner, waited: float) -> ConcurrentRun:
        pid = owner.get("pid")
        who = f"pid {pid}" if pid else "another process"
        task = f" of run {owner['task']}" if owner.get("task") else ""
        doing = (
            f"`coder merge`{task} ({who}) is updating"
            if owner.get("holder") == "merge"
            else f"`coder run --include-uncommitted`{task} ({who}) is reading"
        )
        return ConcurrentRun(
            f"{doing} your checkout, still after {waited:.0f}s; nothing was changed",
            hint="run the command again once it has finished",
            holder=owner.get("holder", "run"),
        )

    def _refuse_unfinished(self, owner: Owner) -> None:
        """EnvironmentProblem when `owner`, left by a holder that did not finish, is a merge of
        another run that moved its base and whose checkout update is still undone."""
        task, landed = owner.get("task"), owner.get("landed")
        if owner.get("holder") != "merge" or not landed or not task or task == self.task_id:
            return
        try:
            merge = StateStore(self.coder_dir).load(task).merge
        except CoderError:  # the run is gone (`coder clean`): nobody can finish it
            return
        if merge and merge.get("commit"):  # finished since
            return
        raise EnvironmentProblem(
            f"the merge of run {task} moved its base branch to {landed[:12]} but stopped before "
            "your checkout followed: its files may be half-way between the two commits; "
            "nothing was changed",
            hint=f"finish that merge with `coder merge -t {task}`, then run this command again",
        )


def read_lock_owner(coder_dir: Path, task_id: str) -> int | None:
    """The pid of the live runner holding the task's lock, or None (for `stop`/`status`)."""
    try:
        fd = nofollow.open_file(_lock_path(coder_dir, task_id), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _wait_for_owner_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds it
    finally:
        os.close(fd)


def _wait_for_owner_pid(fd: int, timeout: float = 1.0) -> int | None:
    """The holder writes its record just after locking: give it a moment."""
    deadline = time.monotonic() + timeout
    while True:
        pid = _read_owner(fd).get("pid")
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.02)


def processes_holding(path: Path, among: Collection[int] | None = None) -> list[int]:
    """Pids of the other live processes (`among` these, else all) that have `path` open
    (Linux: `/proc/PID/fd`; none where there is no procfs). A lock file still open is a lock
    still being written."""
    target = os.path.realpath(path)
    found = []
    try:
        pids = (
            list(among)
            if among is not None
            else [int(e) for e in os.listdir("/proc") if e.isdigit()]
        )
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found
