"""The per-task runner lock (`.coder/locks/ID.lock`): one runner per task.

The lock is an `flock` on a file descriptor the runner keeps open: the kernel releases it when
the process dies, however it dies, so a `kill -9` can never leave a lock that blocks forever.
The pid written in the file is for messages and `coder stop`; the flock is what decides.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict, cast

from coder import nofollow
from coder.durable import make_private_dirs, write_failed
from coder.errors import ConcurrentRun
from coder.run.state import check_task_id, now_iso


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


class TaskLock:
    """One runner per task. `with TaskLock(coder_dir, task_id) as lock: ...`

    Raises ConcurrentRun if a live process holds it. If the previous holder died without
    releasing it, the lock is taken over and `took_over_from` holds its pid (log a warning).
    Keep the object alive for as long as the run lasts: the lock lives in its open fd."""

    def __init__(self, coder_dir: Path, task_id: str, *, holder: str = "run") -> None:
        self.task_id = check_task_id(task_id)
        self.path = _lock_path(coder_dir, task_id)
        self.holder = holder  # the command taking it (run, merge, revert), for the refusals
        self.took_over_from: int | None = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Self:
        if self._fd is not None:
            raise RuntimeError(f"lock for task {self.task_id} is already held by this object")
        try:
            make_private_dirs(self.path.parent)
            # O_CLOEXEC (open_file's): commands the runner starts must not keep the lock.
            fd = nofollow.open_file(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a link under .coder/ (never followed), a full disk
            raise write_failed(self.path, exc) from exc
        try:
            if not _flock(fd, fcntl.LOCK_EX):
                raise self._busy(_read_owner(fd))
            previous = _read_owner(fd)
            import socket  # here: `coder status` reads locks, and socket costs a 10th of it

            record: Owner = {
                "pid": os.getpid(),
                "started_at": now_iso(),
                "host": socket.gethostname(),
                "holder": self.holder,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        except OSError as exc:  # a full disk
            os.close(fd)
            raise write_failed(self.path, exc) from exc
        except BaseException:
            os.close(fd)
            raise
        # A record left behind means the holder died without releasing (a clean release
        # empties the file). The flock proved it no longer holds it, whatever its pid is now.
        self.took_over_from = previous.get("pid")
        self._fd = fd
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
        return ConcurrentRun(
            f"task {self.task_id} is already being run by {who}{since}{host}",
            hint=f"wait for it to finish, or stop it with `coder stop -t {self.task_id}`",
        )

    def release(self) -> None:
        """Empty the record (so the next runner sees a clean release) and unlock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the fd drops the flock

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_for_command(
    coder_dir: Path, task_id: str, holder: str, *, hint: str | None = None
) -> TaskLock:
    """The task's lock, taken for `holder` (`merge`, `revert`): no run, resume or other such
    command meanwhile. Held by a run, ConcurrentRun says `holder` cannot go on while it runs
    (`hint`, else the lock's own); held by another merge or revert, its own refusal stands."""
    lock = TaskLock(coder_dir, task_id, holder=holder)
    try:
        return lock.acquire()
    except ConcurrentRun as exc:
        if exc.holder != "run":  # another merge or revert: it says so itself
            raise
        raise ConcurrentRun(
            f"cannot {holder} run {task_id} while it runs: {exc.message}", hint=hint or exc.hint
        ) from None


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


def processes_holding(path: Path) -> list[int]:
    """Pids of the other live processes that have `path` open (Linux: `/proc/PID/fd`; none
    where there is no procfs). A lock file still open is a lock still being written."""
    target = os.path.realpath(path)
    found = []
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
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
