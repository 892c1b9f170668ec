"""Checkpoints (`.coder/state/ID.json`) and the per-task runner lock (`.coder/locks/ID.lock`).

Git is the truth and a state file is a cache that can be rebuilt from the step commits'
trailers, so a reader that finds a torn or invalid file says so (`CorruptState`, exit 3) and
points at `coder resume`, which rebuilds it. Every state write goes through `write_atomic`.

The lock is an `flock` on a file descriptor the runner keeps open: the kernel releases it when
the process dies, however it dies, so a `kill -9` can never leave a lock that blocks forever.
The pid written in the file is for messages and `coder stop`; the flock is what decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from coder.durable import fsync_dir, write_atomic
from coder.errors import (
    ConcurrentRun,
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    UnknownTask,
    display_path,
)
from coder.schemas import validator

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # as in task.schema.json


def now_iso() -> str:
    """The current time, UTC, ISO-8601 with a "Z" (e.g. 2026-11-22T03:57:43.897528Z)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_task_id(task_id: str) -> str:
    """A task id is used as a file name: refuse anything that could leave the directory."""
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        raise InvalidInput(
            f"invalid task id {task_id!r}",
            hint="task ids are 1-64 letters, digits, '-' or '_', starting with a letter or digit",
        )
    return task_id


# Why a step was skipped, as said in a run's summary ("1 step skipped after failing: s2").
SKIP_PHRASES = {
    "failed": "after failing",  # its own on_fail: skip
    "user": "by the user",  # at the approval prompt
    "requirement": "because a step they require was skipped",  # explicit depends_on
}


def skipped_note(steps: Mapping[str, Mapping[str, Any]]) -> str | None:
    """What a run skipped and why, in one line (None when nothing was skipped):
    `1 step skipped after failing: s2; 2 steps skipped because ...: s3, s4`."""
    by_cause: dict[str, list[str]] = {}
    for step_id, record in steps.items():
        if record["status"] == "skipped":
            by_cause.setdefault(record.get("skip_cause") or "failed", []).append(step_id)
    parts = []
    for cause, phrase in SKIP_PHRASES.items():
        ids = by_cause.get(cause, [])
        if ids:
            listed = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            parts.append(f"{len(ids)} step{'s' * (len(ids) != 1)} skipped {phrase}: {listed}")
    return "; ".join(parts) or None


# --- state files ----------------------------------------------------------------------------


def _validation_problem(schema: str, instance: Any) -> str | None:
    from jsonschema.exceptions import best_match

    error = best_match(validator(schema).iter_errors(instance))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "top level"
    return f"{where}: {error.message}"


class StateStore:
    """The checkpoints of one project: `<coder_dir>/state/<task_id>.json`."""

    def __init__(self, coder_dir: Path) -> None:
        self.coder_dir = Path(coder_dir)
        self.dir = self.coder_dir / "state"

    def path(self, task_id: str) -> Path:
        return self.dir / f"{check_task_id(task_id)}.json"

    def exists(self, task_id: str) -> bool:
        return self.path(task_id).is_file()

    def list_ids(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        # Temp files are hidden (`.X.json.*.tmp`), so `*.json` never picks one up.
        return sorted(p.stem for p in self.dir.glob("*.json") if TASK_ID.fullmatch(p.stem))

    def load(self, task_id: str) -> dict[str, Any]:
        path = self.path(task_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise UnknownTask(task_id, self.list_ids()) from None
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read state file {display_path(path)}: {exc}") from exc
        return self._parse(path, task_id, raw)

    def _parse(self, path: Path, task_id: str, raw: bytes) -> dict[str, Any]:
        def corrupt(reason: str) -> CorruptState:
            return CorruptState(path, task_id, reason)

        if not raw.strip():
            raise corrupt("the file is empty")
        try:
            state = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise corrupt(f"not valid JSON: {exc}") from None
        if not isinstance(state, dict):
            raise corrupt("not a JSON object")
        problem = _validation_problem("state", state)
        if problem:
            raise corrupt(f"does not match the state schema at {problem}")
        if state["task_id"] != task_id:
            raise corrupt(f"it belongs to task {state['task_id']!r}")
        return state

    def save(self, state: dict[str, Any], *, validate: bool = True) -> None:
        """Stamp `updated_at` (in place) and write the checkpoint atomically. A state that does
        not match the schema is a bug in coder, not a user error: ValueError, nothing written.

        The executor checkpoints after every step transition with `validate=False`: validating
        the whole state each time made a run quadratic in its number of steps (the first and
        last checkpoint of a run, and every test, still validate)."""
        state["updated_at"] = now_iso()
        if validate:
            problem = _validation_problem("state", state)
            if problem:
                raise ValueError(f"refusing to save an invalid state ({problem})")
        path = self.path(state["task_id"])
        self.dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps(state, indent=1, sort_keys=False, ensure_ascii=False) + "\n"
        write_atomic(path, data.encode("utf-8"))

    def load_all(self) -> list[dict[str, Any] | CorruptState]:
        """Every task's state, with a corrupt file reported in place (for `coder status`)."""
        states: list[dict[str, Any] | CorruptState] = []
        for task_id in self.list_ids():
            try:
                states.append(self.load(task_id))
            except CorruptState as exc:
                states.append(exc)
            except UnknownTask:  # deleted since list_ids()
                continue
        return states

    def delete(self, task_id: str) -> None:
        path = self.path(task_id)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            fsync_dir(path.parent)


# --- the task lock --------------------------------------------------------------------------


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


def _read_owner(fd: int) -> dict[str, Any]:
    """The owner record in a lock file; {} when empty (released cleanly) or unreadable."""
    raw = os.pread(fd, 4096, 0)
    try:
        owner = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {}
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return {}
    return owner


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

    def __init__(self, coder_dir: Path, task_id: str) -> None:
        self.task_id = check_task_id(task_id)
        self.path = _lock_path(coder_dir, task_id)
        self.took_over_from: int | None = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Self:
        if self._fd is not None:
            raise RuntimeError(f"lock for task {self.task_id} is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC: commands the runner starts must not inherit (and so keep) the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not _flock(fd, fcntl.LOCK_EX):
                raise self._busy(_read_owner(fd))
            previous = _read_owner(fd)
            record = {"pid": os.getpid(), "started_at": now_iso(), "host": socket.gethostname()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        # A record left behind means the holder died without releasing (a clean release
        # empties the file). The flock proved it no longer holds it, whatever its pid is now.
        self.took_over_from = previous.get("pid")
        self._fd = fd
        return self

    def _busy(self, owner: dict[str, Any]) -> ConcurrentRun:
        pid = owner.get("pid")
        who = f"pid {pid}" if pid else "another process"
        since = f", started {owner['started_at']}" if owner.get("started_at") else ""
        host = f" on {owner['host']}" if owner.get("host") else ""
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


def read_lock_owner(coder_dir: Path, task_id: str) -> int | None:
    """The pid of the live runner holding the task's lock, or None (for `stop`/`status`)."""
    try:
        fd = os.open(_lock_path(coder_dir, task_id), os.O_RDONLY | os.O_CLOEXEC)
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
