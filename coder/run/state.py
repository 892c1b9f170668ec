"""A run's checkpoint on disk: its typed records (coder.run.records) kept in a snapshot and an
append-only journal.

    .coder/state/ID.json       the snapshot: the whole `RunState`, replaced atomically
    .coder/state/ID.journal    one line per step transition since the snapshot: the step's
                               whole `StepRecord`, appended (and fsync'd, but for the
                               lines git can stand in for: see `StateStore.record`)

A step transition costs one journal line (O(changed step)), not a rewrite of every step. The
journal is compacted into the snapshot when a run starts and ends, and whenever it holds more
lines than the run has steps (so a 10,000-step run rewrites its snapshot a handful of times).
Each line carries a sequence number and the snapshot the last one it contains, so lines left
behind by a compaction that crashed before emptying the journal are never applied twice over
newer changes (a `coder revert` that reset steps, say).

A crash can tear only the journal's last line (one `write` per line, in order): a reader takes
the complete lines and ignores the torn one, as if the crash came just before it. Git is the
truth and the checkpoint a cache that can be rebuilt from the step commits' trailers, so a
snapshot or journal that does not read whole is reported (`CorruptState`, exit 3) and
`coder resume` rebuilds it. jsonschema checks a state when it is loaded, and when a snapshot is
written of a state made outside a run's executor (a new run's, one rebuilt from its commits'
trailers, a merge's, a fork's); the executor's own checkpoints, like the journal lines they fold
in, hold only what its typed records set, and are not checked again (`save(validate=False)`).
The snapshot goes through `write_atomic`, the one durable write. What a load checked
is remembered (`.coder/cache/state/ID.checked`: a digest of the snapshot's and journal's
bytes), so a reader of an unchanged run (`coder status`) skips the check and jsonschema's
import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coder.crashpoints import armed, crashpoint
from coder.errors import (
    CorruptState,
    EnvironmentProblem,
    LinkInTheWay,
    RunFilesGone,
    UnknownTask,
    display_path,
)
from coder.files import nofollow
from coder.files.durable import fsync_dir, make_private_dirs, write_atomic, write_private
from coder.run.records import VERSION, RunState, StepRecord, check_task_id, now_iso
from coder.schemas import TASK_ID, validator

# --- the versions ---------------------------------------------------------------------------

# What a version 1 checkpoint held of the run's identity, the manifest's since version 2 (the
# manifest's own keys but "title", which its task holds).
_V1_IDENTITY = (
    "title",
    "taskfile",
    "branch",
    "base",
    "base_commit",
    "checkout_commit",
    "worktree",
    "task",
    "created_at",
    "seq",
    "parent",
    "forked_at",
)


def identity_moved_to_manifest(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Version 1 -> 2: a checkpoint object of version 1 split into the version 2 checkpoint
    (its progress) and the manifest object its identity fields make (coder.run.manifest's
    file), which a run that lost its manifest file is read from (`v1_manifest`). Nothing is
    checked here: the checkpoint is checked against the schema after, the manifest when read."""
    state = {key: value for key, value in data.items() if key not in _V1_IDENTITY}
    state["version"] = VERSION
    manifest = {"task_id": data.get("task_id")}
    manifest |= {key: data[key] for key in _V1_IDENTITY[1:] if data.get(key) is not None}
    return state, manifest


def _upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint object in this version's form (an older version's upgraded, in memory:
    the file is rewritten by its run's next writer)."""
    if data.get("version") == 1:
        return identity_moved_to_manifest(data)[0]
    return data


# --- the files ------------------------------------------------------------------------------


def _validation_problem(instance: Any) -> str | None:
    from jsonschema.exceptions import best_match

    error = best_match(validator("state").iter_errors(instance))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "top level"
    return f"{where}: {error.message}"


@dataclass
class _Journal:
    """What this store knows of a task's journal: its whole lines' length and last number."""

    length: int = 0
    lines: int = 0
    seq: int = 0


class StateStore:
    """The checkpoints of one project: `<coder_dir>/state/<task_id>.json` and `.journal`.

    One writer per task (the holder of its lock) calls `save` or `load` first, then `record`
    for each step transition; any number of readers `load`."""

    def __init__(self, coder_dir: Path, *, compact_every: int | None = None) -> None:
        self.coder_dir = Path(coder_dir)
        self.dir = self.coder_dir / "state"
        self.compact_every = compact_every  # None: when the journal outgrows the run's steps
        self._journals: dict[str, _Journal] = {}

    def path(self, task_id: str) -> Path:
        return self.dir / f"{check_task_id(task_id)}.json"

    def journal_path(self, task_id: str) -> Path:
        return self.dir / f"{check_task_id(task_id)}.journal"

    def exists(self, task_id: str) -> bool:
        return _is_file(self.path(task_id))

    def list_ids(self) -> list[str]:
        try:
            names = nofollow.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        # Temp files are hidden (`.X.json.*.tmp`), so `*.json` never picks one up.
        stems = (name.removesuffix(".json") for name in names if name.endswith(".json"))
        return sorted(stem for stem in stems if TASK_ID.fullmatch(stem))

    # --- reading --------------------------------------------------------------------------

    def load(self, task_id: str) -> RunState:
        """The snapshot with the journal's whole lines applied, checked against the schema."""
        path = self.path(task_id)
        try:
            raw = nofollow.read_bytes(path)
        except FileNotFoundError:
            raise UnknownTask(task_id, self.list_ids()) from None
        except LinkInTheWay as exc:
            raise exc.problem() from None
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read state file {display_path(path)}: {exc}") from exc
        whole = self._journal_lines(task_id)
        # The schema check costs jsonschema's import (about half of `coder status`): skipped
        # for bytes that passed it before (`_checked`).
        digest = _digest(raw, whole)
        checked = self._checked(task_id) == digest
        data = _parse_snapshot(path, task_id, raw, check=not checked)
        journal = self._replay(task_id, data, whole)
        problem = _validation_problem(data) if journal.lines and not checked else None
        if problem:
            journal_path = self.journal_path(task_id)
            raise CorruptState(
                journal_path, task_id, f"does not match the state schema at {problem}"
            )
        if not checked:
            self._remember_checked(task_id, digest)
        self._journals[task_id] = journal
        return RunState.from_dict(data)

    def _checked_path(self, task_id: str) -> Path:
        """What the last schema check passed: the digest of the snapshot and journal it read
        (a cache, under `.coder/cache/`: a torn or stale one only means checking again)."""
        return self.coder_dir / "cache" / "state" / f"{check_task_id(task_id)}.checked"

    def _checked(self, task_id: str) -> str | None:
        try:
            return nofollow.read_bytes(self._checked_path(task_id)).decode("ascii").strip()
        except (OSError, ValueError):
            return None

    def _remember_checked(self, task_id: str, digest: str) -> None:
        with contextlib.suppress(EnvironmentProblem):  # a read-only disk: check each time
            write_private(self._checked_path(task_id), digest + "\n")

    def _journal_lines(self, task_id: str) -> bytes:
        """The journal's whole lines (a torn last line: the crash came before it)."""
        path = self.journal_path(task_id)
        try:
            raw = nofollow.read_bytes(path)
        except FileNotFoundError:
            return b""
        except LinkInTheWay as exc:
            raise exc.problem() from None
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read {display_path(path)}: {exc}") from exc
        return raw[: raw.rfind(b"\n") + 1]

    def _replay(self, task_id: str, data: dict[str, Any], whole: bytes) -> _Journal:
        """Apply the journal's whole lines (`whole`) newer than the snapshot to `data`."""
        path = self.journal_path(task_id)
        journal = _Journal(seq=int(data.get("journal_seq") or 0))
        for number, line in enumerate(whole.splitlines(), 1):
            try:
                entry = json.loads(line)
                seq, step_id, record = entry["seq"], entry["step"], entry["record"]
                if not isinstance(record, dict) or step_id not in data["steps"]:
                    raise ValueError(f"no step {step_id!r} in the run")
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise CorruptState(path, task_id, f"line {number}: {exc}") from None
            journal.lines += 1
            if seq <= journal.seq:  # already in the snapshot (a compaction cut short)
                continue
            data["steps"][step_id] = record
            data["updated_at"] = entry.get("at", data["updated_at"])
            journal.seq = seq
        journal.length = len(whole)
        return journal

    def salvage(self, task_id: str, state: RunState) -> list[str]:
        """After a CorruptState or a missing snapshot: put into `state` (rebuilt from the
        manifest) each step record the run's files still hold whole, so its notes, attempts
        and usage are not lost with the file: the snapshot's steps if it parses, then the
        journal's lines up to the first unreadable one, newer over older. Each record must
        match the schema on its own; git has the last word after (`resume.reconcile`). Returns
        the steps taken."""
        found: dict[str, Any] = {}
        seq = 0
        with contextlib.suppress(OSError, ValueError, RecursionError):
            snapshot = json.loads(nofollow.read_bytes(self.path(task_id)))
            ours = isinstance(snapshot, dict) and snapshot.get("task_id") == task_id
            if ours and isinstance(snapshot.get("steps"), dict):
                found.update(snapshot["steps"])
                number = snapshot.get("journal_seq")
                seq = number if isinstance(number, int) else 0
        with contextlib.suppress(OSError, EnvironmentProblem):
            for line in self._journal_lines(task_id).splitlines():
                try:
                    entry = json.loads(line)
                    if entry["seq"] > seq:
                        found[entry["step"]] = entry["record"]
                except (ValueError, KeyError, TypeError, RecursionError):
                    break  # what follows a damaged line cannot be trusted to be in order
        taken = []
        rebuilt = state.to_dict()
        for step_id, record in found.items():
            if not isinstance(step_id, str) or step_id not in state.steps:
                continue
            alone = {**rebuilt, "steps": {step_id: record}}
            if isinstance(record, dict) and _validation_problem(alone) is None:
                state.steps[step_id] = StepRecord.from_dict(record)
                taken.append(step_id)
        return taken

    def v1_manifest(self, task_id: str) -> dict[str, Any] | None:
        """The manifest object a version 1 checkpoint of `task_id` holds (None: no such file,
        or not one of version 1), for a run whose manifest file is gone: unchecked, as a
        manifest file read from the disk is (coder.run.manifest checks it)."""
        try:
            data = json.loads(nofollow.read_bytes(self.path(task_id)))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get("version") != 1:
            return None
        if data.get("task_id") != task_id:
            return None
        return identity_moved_to_manifest(data)[1]

    def load_all(self) -> list[RunState | CorruptState]:
        """Every task's state, with a corrupt file reported in place (for `coder status`)."""
        states: list[RunState | CorruptState] = []
        for task_id in self.list_ids():
            try:
                states.append(self.load(task_id))
            except CorruptState as exc:
                states.append(exc)
            except UnknownTask:  # deleted since list_ids()
                continue
        return states

    # --- writing --------------------------------------------------------------------------

    def save(self, state: RunState, *, validate: bool = True) -> None:
        """Write the whole state as the snapshot (stamping `updated_at`), then empty the
        journal it now contains. A state that does not match the schema is a bug in coder,
        not a user error: ValueError, nothing written (`validate=False`: not checked, for a
        run's own writes: see the module docstring)."""
        if state.task_id in self._journals:  # read or written before: it must still be there
            self._require_snapshot(state.task_id)
        journal = self._journals.setdefault(state.task_id, _Journal())
        state.updated_at = now_iso()
        state.journal_seq = journal.seq
        data = state.to_dict()
        if validate:
            problem = _validation_problem(data)
            if problem:
                raise ValueError(f"refusing to save an invalid state ({problem})")
        path = self.path(state.task_id)
        text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        try:
            make_private_dirs(self.dir)
            write_atomic(path, text.encode("utf-8"))
            journal_path = self.journal_path(state.task_id)
            if journal.length or _is_file(journal_path):
                crashpoint("compaction")  # test-only: snapshot written, journal not emptied
                with contextlib.suppress(FileNotFoundError):
                    fd = nofollow.open_file(journal_path, os.O_WRONLY)
                    try:
                        os.ftruncate(fd, 0)
                    finally:
                        os.close(fd)
        except OSError as exc:
            raise _write_failed(path, exc) from exc
        journal.length = journal.lines = 0

    def record(self, state: RunState, step_id: str, *, sync: bool = True) -> None:
        """Append one step's record to the journal (durable when this returns); compact into
        the snapshot when the journal has grown past the run's size. `sync=False` leaves the
        fsync to the next durable write (the next line's, or the snapshot's): only for a record
        that git can stand in for if a power loss drops it (a kill of coder cannot: the page
        cache outlives the process). A step's success with its commit on the branch: resume
        finds the commit by its trailers and marks the step done. A step's `running`: resume
        finds the step's half-done files in the worktree, against the branch's tip, discards
        them and reruns the step (runs.reconcile)."""
        journal = self._journals.get(state.task_id)
        if journal is None:  # a writer starts from a snapshot it wrote or read
            self.save(state, validate=False)
            return
        self._require_snapshot(state.task_id)
        journal.seq += 1
        at = now_iso()
        line = json.dumps(
            {
                "seq": journal.seq,
                "at": at,
                "step": step_id,
                "record": state.steps[step_id].to_dict(),
            },
            ensure_ascii=False,
        )
        path = self.journal_path(state.task_id)
        try:
            _append(path, (line + "\n").encode("utf-8"), journal.length, sync=sync)
        except OSError as exc:
            journal.seq -= 1
            raise _write_failed(path, exc) from exc
        journal.length += len(line.encode("utf-8")) + 1
        journal.lines += 1
        state.updated_at = at
        if journal.lines > (self.compact_every or max(256, len(state.steps))):
            self.save(state, validate=False)

    def _require_snapshot(self, task_id: str) -> None:
        """A snapshot this store wrote or read is gone: deleted by hand (or `.coder/` with
        it). Writing on would leave a journal, or a checkpoint, nobody asked for."""
        path = self.path(task_id)
        if not self.exists(task_id):
            raise RunFilesGone(
                f"the state file {display_path(path)} of run {task_id} was deleted while the "
                "run was using it"
            )

    def delete(self, task_id: str) -> None:
        nofollow.unlink(self._checked_path(task_id))
        for path in (self.path(task_id), self.journal_path(task_id)):
            with contextlib.suppress(FileNotFoundError):
                nofollow.unlink(path, missing_ok=False)
                fsync_dir(path.parent)
        self._journals.pop(task_id, None)


def _is_file(path: Path) -> bool:
    """Whether a regular file is at `path` (a link there is not one, and is not followed)."""
    try:
        return stat.S_ISREG(nofollow.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _digest(snapshot: bytes, journal: bytes) -> str:
    return hashlib.blake2b(b"%d\n" % len(snapshot) + snapshot + journal, digest_size=16).hexdigest()


def _parse_snapshot(path: Path, task_id: str, raw: bytes, *, check: bool) -> dict[str, Any]:
    """The snapshot's object; `check`: against the schema too."""

    def corrupt(reason: str) -> CorruptState:
        return CorruptState(path, task_id, reason)

    if not raw.strip():
        raise corrupt("the file is empty")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise corrupt(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise corrupt("not a JSON object")
    data = _upgraded(data)
    problem = _validation_problem(data) if check else None
    if problem:
        raise corrupt(f"does not match the state schema at {problem}")
    if data.get("task_id") != task_id:
        raise corrupt(f"it belongs to task {data.get('task_id')!r}")
    return data


def _append(path: Path, data: bytes, length: int, *, sync: bool = True) -> None:
    """Append `data` at `length` (what a torn line after it, left by a crash, is cut back to)
    with one write, then fsync (unless not `sync`: the next fsync of the file covers this line
    too); on failure the file is cut back to `length`. A new journal is always made durable,
    its directory entry too."""
    try:
        fd = nofollow.open_file(path, os.O_WRONLY)
        created = False
    except FileNotFoundError:
        fd = nofollow.open_file(path, os.O_WRONLY | os.O_CREAT, 0o600)
        created = True
    try:
        if os.fstat(fd).st_size != length:
            os.ftruncate(fd, length)
        half = len(data) // 2 if armed("journal") else len(data)
        _write_at(fd, data[:half], length)
        crashpoint("journal")  # test-only: the crash tests kill coder with half a line written
        _write_at(fd, data[half:], length + half)
        if sync or created:
            os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):  # no line that was not made durable
            os.ftruncate(fd, length)
        raise
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_failed(path: Path, exc: OSError) -> EnvironmentProblem:
    if isinstance(exc, LinkInTheWay):
        return exc.problem()
    return EnvironmentProblem(
        f"cannot write the checkpoint {display_path(path)}: {exc.strerror or exc}",
        hint="free some disk space (or fix the file system), then `coder resume` the run",
    )
