"""State checkpoints and the task lock: real files, real processes (RELIABILITY rows 3-5)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coder.errors import (
    EXIT_ENVIRONMENT,
    ConcurrentRun,
    CorruptState,
    EnvironmentProblem,
    InvalidInput,
    UnknownTask,
)
from coder.files.durable import write_atomic
from coder.run.lock import TaskLock, pid_alive, read_lock_owner
from coder.run.records import RunState, StepRecord, now_iso
from coder.run.state import StateStore
from coder.schemas import validator

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "89abcdef0123456789abcdef0123456789abcdef"


def make_state(task_id: str = "T-1") -> RunState:
    """A realistic mid-run checkpoint: one step done, one running, one pending."""
    return RunState.from_dict(state_dict(task_id))


def state_dict(task_id: str = "T-1") -> dict[str, Any]:
    return {
        "version": 2,
        "task_id": task_id,
        "status": "running",
        "pid": 4242,
        "error": None,
        "updated_at": "2026-11-22T03:00:00.000000Z",
        "merge": None,
        "steps": {
            "s1": {
                "status": "success",
                "attempts": 1,
                "commit": SHA2,
                "start_tip": SHA,
                "started_at": "2026-11-22T03:00:01.000000Z",
                "ended_at": "2026-11-22T03:01:00.5Z",
                "duration_s": 59.5,
                "error": None,
                "reasons": [],
                "summary": "added Retry class — with backoff",
                "tests": None,
                "usage": {"calls": 3, "prompt_tokens": 5120, "eval_tokens": 812, "total_s": 41.2},
            },
            "s2": {
                "status": "running",
                "attempts": 2,
                "commit": None,
                "start_tip": SHA2,
                "started_at": "2026-11-22T03:01:01.000000Z",
                "ended_at": None,
                "reasons": ["attempt 1: tests red (2 failed)"],
                "tests": {"passed": 10, "failed": 2, "skipped": 0, "exit_code": 1},
            },
            "s3": {"status": "pending", "attempts": 0},
        },
    }


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / ".coder")


# --- write_atomic ---------------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_atomic_replaces_content(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert leftovers(tmp_path) == []


def test_write_atomic_new_file_private_existing_mode_kept(tmp_path: Path) -> None:
    new = tmp_path / "new"
    write_atomic(new, b"x")
    assert new.stat().st_mode & 0o777 == 0o600
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    write_atomic(script, b"#!/bin/sh\necho hi\n")
    assert script.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    ("function", "code"),
    [("replace", errno.ENOSPC), ("fsync", errno.EIO), ("write", errno.ENOSPC)],
)
def test_write_atomic_failure_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str, code: int
) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b'{"old": true}')

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, function, fail)
    with pytest.raises(OSError) as info:
        write_atomic(target, b'{"new": true, "padding": "' + b"x" * 100_000 + b'"}')
    monkeypatch.undo()
    assert info.value.errno == code
    assert target.read_bytes() == b'{"old": true}'
    assert leftovers(tmp_path) == []


def test_write_atomic_interrupt_cleans_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "f", b"data")
    assert list(tmp_path.iterdir()) == []


# --- StateStore -----------------------------------------------------------------------------


def test_round_trip(store: StateStore) -> None:
    state = make_state()
    store.save(state)
    loaded = store.load("T-1")
    assert loaded == state
    assert [k for k in loaded.to_dict() if k in state_dict()] == list(state_dict())  # key order
    assert loaded.steps["s1"].usage is not None and loaded.steps["s1"].usage.calls == 3
    assert state.updated_at.endswith("Z") and state.updated_at != "2026-11-22T03:00:00.000000Z"
    text = store.path("T-1").read_text(encoding="utf-8")
    assert text.startswith('{\n "version": 2,') and text.endswith("}\n")
    assert "—" in text  # written as UTF-8, not \u escapes
    assert store.exists("T-1") and store.list_ids() == ["T-1"]


def test_now_iso_is_utc_z_and_valid() -> None:
    stamp = now_iso()
    assert stamp.endswith("Z")
    state = make_state()
    state.updated_at = stamp
    assert validator("state").is_valid(state.to_dict())


def test_save_invalid_state_raises_and_writes_nothing(store: StateStore) -> None:
    store.save(make_state())
    before = store.path("T-1").read_bytes()
    bad = make_state()
    bad.steps["s1"].status = "exploded"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="steps/s1/status"):
        store.save(bad)
    empty = make_state()
    empty.task_id = ""
    with pytest.raises(ValueError, match="task_id"):
        store.save(empty)
    assert store.path("T-1").read_bytes() == before
    assert leftovers(store.dir) == []


def test_every_truncation_is_loaded_whole_or_reported(store: StateStore) -> None:
    state = make_state()
    store.save(state)
    path = store.path("T-1")
    full = path.read_bytes()
    complete = len(full.rstrip())  # cutting only the trailing newline loses nothing
    outcomes = {"loaded": 0, "corrupt": 0}
    for length in range(len(full) + 1):
        path.write_bytes(full[:length])
        try:
            loaded = store.load("T-1")
        except CorruptState as exc:
            assert length < complete, f"complete file reported corrupt at {length}"
            assert exc.path == path and path.name in exc.message
            assert "coder resume -t T-1" in exc.message
            outcomes["corrupt"] += 1
        else:
            assert length >= complete, f"a torn file was accepted at length {length}"
            assert loaded == state
            outcomes["loaded"] += 1
    assert outcomes == {"loaded": len(full) - complete + 1, "corrupt": complete}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"version": 1}', "state schema"),
    ],
)
def test_corrupt_contents_are_reported(store: StateStore, content: bytes, reason: str) -> None:
    store.dir.mkdir(parents=True)
    store.path("T-1").write_bytes(content)
    with pytest.raises(CorruptState, match=reason) as info:
        store.load("T-1")
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert isinstance(info.value, EnvironmentProblem)


def test_state_of_another_task_is_corrupt(store: StateStore) -> None:
    store.save(make_state("T-2"))
    store.path("T-2").rename(store.path("T-1"))
    with pytest.raises(CorruptState, match="belongs to task 'T-2'"):
        store.load("T-1")


def test_unknown_task(store: StateStore) -> None:
    with pytest.raises(UnknownTask, match="no task 'nope'") as info:
        store.load("nope")
    assert "coder status" in (info.value.hint or "")
    store.save(make_state("T-1"))
    store.save(make_state("T-2"))
    with pytest.raises(UnknownTask) as info:
        store.load("nope")
    assert isinstance(info.value, InvalidInput)
    assert info.value.hint == "known tasks: T-1, T-2"


@pytest.mark.parametrize("bad_id", ["../x", "a/b", ".hidden", "", "x" * 65])
def test_task_ids_cannot_escape_the_directory(store: StateStore, bad_id: str) -> None:
    with pytest.raises(InvalidInput, match="invalid task id"):
        store.load(bad_id)


def test_list_load_all_delete(store: StateStore) -> None:
    store.save(make_state("A"))
    store.save(make_state("B"))
    store.path("C").write_text("{torn")
    (store.dir / ".A.json.abc123.tmp").write_text("left by a kill -9")
    assert store.list_ids() == ["A", "B", "C"]
    results = store.load_all()
    assert [r.task_id for r in results if isinstance(r, RunState)] == ["A", "B"]
    assert [r.task_id for r in results if isinstance(r, CorruptState)] == ["C"]
    store.delete("B")
    store.delete("B")  # idempotent
    assert store.list_ids() == ["A", "C"]
    assert StateStore(store.coder_dir / "missing").list_ids() == []


def test_bytes_checked_once_are_not_checked_again_and_any_change_is(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema check (jsonschema's import: half of `coder status`) runs once for the bytes
    of a snapshot and journal; a change of one byte, in either, is checked again."""
    from coder.run import state as state_mod

    state = make_state()
    store.save(state)
    transitions(store, state)
    checks: list[int] = []
    real = state_mod._validation_problem
    monkeypatch.setattr(
        state_mod, "_validation_problem", lambda data: checks.append(1) or real(data)
    )
    first = StateStore(store.coder_dir).load("T-1")
    assert len(checks) == 2  # the snapshot, then the state with the journal's lines
    again = StateStore(store.coder_dir).load("T-1")
    assert again == first and len(checks) == 2
    # the same length, one byte changed: a status no state may have
    path = store.path("T-1")
    path.write_bytes(path.read_bytes().replace(b'"status": "running"', b'"status": "rUnning"', 1))
    with pytest.raises(CorruptState, match="state schema"):
        StateStore(store.coder_dir).load("T-1")
    store.save(state)
    StateStore(store.coder_dir).load("T-1")
    journal = store.journal_path("T-1")
    journal.write_bytes(b'{"seq": 9, "at": "x", "step": "s1", "record": {"status": "lost"}}\n')
    with pytest.raises(CorruptState, match="state schema"):
        StateStore(store.coder_dir).load("T-1")
    checked = store.coder_dir / "cache" / "state" / "T-1.checked"
    assert checked.is_file()
    store.delete("T-1")
    assert sorted(p.name for p in store.dir.iterdir()) == [] and not checked.exists()


# --- the journal ----------------------------------------------------------------------------


def transitions(store: StateStore, state: RunState) -> list[RunState]:
    """Three step transitions journaled; the state after each."""
    after = []
    for step_id, status in (("s2", "success"), ("s3", "running"), ("s3", "success")):
        record = state.steps[step_id]
        record.status = status  # type: ignore[assignment]
        record.attempts += status == "running"
        record.reasons.append(f"{step_id} {status}")
        store.record(state, step_id)
        after.append(RunState.from_dict(state.to_dict()))
    return after


def test_a_transition_appends_one_line_and_leaves_the_snapshot_alone(store: StateStore) -> None:
    state = make_state()
    store.save(state)
    snapshot = store.path("T-1").read_bytes()
    after = transitions(store, state)
    assert store.path("T-1").read_bytes() == snapshot  # O(changed step), not O(all steps)
    lines = store.journal_path("T-1").read_bytes().splitlines()
    assert [json.loads(line)["step"] for line in lines] == ["s2", "s3", "s3"]
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3]
    loaded = StateStore(store.coder_dir).load("T-1")  # a reader in another process
    assert loaded.steps == after[-1].steps
    assert loaded.updated_at == json.loads(lines[-1])["at"]


def test_every_truncation_of_the_journal_loads_the_lines_before_it(store: StateStore) -> None:
    """A crash tears at most the last line: each cut loads as the whole lines before it."""
    state = make_state()
    store.save(state)
    before = RunState.from_dict(state.to_dict())
    after = transitions(store, state)
    path = store.journal_path("T-1")
    full = path.read_bytes()
    for length in range(len(full) + 1):
        path.write_bytes(full[:length])
        whole = full[:length].count(b"\n")
        expected = after[whole - 1] if whole else before
        assert StateStore(store.coder_dir).load("T-1").steps == expected.steps, length


def test_a_writer_cuts_a_torn_tail_before_appending(store: StateStore) -> None:
    state = make_state()
    store.save(state)
    transitions(store, state)
    path = store.journal_path("T-1")
    path.write_bytes(path.read_bytes() + b'{"seq": 4, "at": "2026-')  # a crash mid-append
    writer = StateStore(store.coder_dir)
    resumed = writer.load("T-1")
    resumed.steps["s3"].summary = "done after the crash"
    writer.record(resumed, "s3")
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 4
    assert StateStore(store.coder_dir).load("T-1").steps["s3"].summary == "done after the crash"


def test_a_line_corrupt_before_the_end_is_reported(store: StateStore) -> None:
    state = make_state()
    store.save(state)
    transitions(store, state)
    path = store.journal_path("T-1")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + lines[2])
    with pytest.raises(CorruptState, match="line 2") as info:
        StateStore(store.coder_dir).load("T-1")
    assert info.value.path == path and "coder resume -t T-1" in info.value.message
    bad = json.loads(lines[0])
    bad["record"]["status"] = "exploded"
    path.write_bytes(json.dumps(bad).encode() + b"\n")
    with pytest.raises(CorruptState, match="steps/s2/status"):
        StateStore(store.coder_dir).load("T-1")


def fresh(task_id: str = "T-1") -> RunState:
    """The state a resume rebuilds from the manifest: every step pending, nothing known."""
    data = state_dict(task_id)
    data["steps"] = {s: {"status": "pending", "attempts": 0} for s in data["steps"]}
    return RunState.from_dict(data)


def test_a_corrupt_snapshot_gives_up_the_steps_its_journal_still_holds(
    store: StateStore,
) -> None:
    """The snapshot unreadable: the journal's lines (whole records) are kept; the steps only
    the snapshot knew are lost with it (git restores what was committed)."""
    state = make_state()
    store.save(state)
    after = transitions(store, state)
    store.path("T-1").write_bytes(b'{"version": 1, "task_id": "T-1", "ste')
    with pytest.raises(CorruptState):
        StateStore(store.coder_dir).load("T-1")
    rebuilt = fresh()
    assert StateStore(store.coder_dir).salvage("T-1", rebuilt) == ["s2", "s3"]
    assert rebuilt.steps["s2"] == after[-1].steps["s2"]
    assert rebuilt.steps["s3"] == after[-1].steps["s3"]
    assert rebuilt.steps["s1"] == StepRecord()


def test_a_journal_damaged_mid_way_gives_up_the_snapshot_and_the_lines_before(
    store: StateStore,
) -> None:
    """Snapshot whole, journal line 2 of 3 garbage: the snapshot's steps and line 1 are kept;
    line 3 is not (after a damaged line, order is not to be trusted). A record that does not
    match the schema on its own, a step the run does not have and another task's snapshot
    give nothing."""
    state = make_state()
    state.steps["s1"].notes.append(
        {"text": "use utils.py", "via": "resume", "attempt": 2, "at": now_iso()}
    )
    store.save(state)
    after = transitions(store, state)
    path = store.journal_path("T-1")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + lines[2])
    rebuilt = fresh()
    assert StateStore(store.coder_dir).salvage("T-1", rebuilt) == ["s1", "s2", "s3"]
    assert rebuilt.steps["s1"].notes == state.steps["s1"].notes  # the note is not lost
    assert rebuilt.steps["s2"] == after[0].steps["s2"]  # line 1
    assert rebuilt.steps["s3"] == make_state().steps["s3"]  # the snapshot's, not line 3's

    bad = json.loads(lines[0])
    bad["record"]["status"] = "exploded"
    unknown = {**json.loads(lines[1]), "step": "s9"}
    path.write_bytes(json.dumps(bad).encode() + b"\n" + json.dumps(unknown).encode() + b"\n")
    store.path("T-1").write_bytes(json.dumps(state_dict("T-2")).encode())
    rebuilt = fresh()
    assert StateStore(store.coder_dir).salvage("T-1", rebuilt) == []
    assert rebuilt.steps == fresh().steps


def test_the_journal_is_compacted_when_it_outgrows_the_run(store: StateStore) -> None:
    small = StateStore(store.coder_dir, compact_every=2)
    state = make_state()
    small.save(state)
    after = transitions(small, state)  # the third line compacts
    assert small.journal_path("T-1").read_bytes() == b""
    snapshot = json.loads(small.path("T-1").read_bytes())
    assert snapshot["journal_seq"] == 3 and snapshot["steps"]["s3"]["status"] == "success"
    assert StateStore(store.coder_dir).load("T-1").steps == after[-1].steps
    state.steps["s1"].summary = "numbering goes on after a compaction"
    small.record(state, "s1")
    assert json.loads(small.journal_path("T-1").read_bytes())["seq"] == 4


def test_lines_a_cut_short_compaction_left_behind_are_not_applied_again(
    store: StateStore,
) -> None:
    """Killed after the snapshot was replaced, before the journal was emptied: its lines are
    older than the snapshot (a revert may have reset those steps since) and must stay unused."""
    state = make_state()
    store.save(state)
    transitions(store, state)
    stale = store.journal_path("T-1").read_bytes()
    state.steps["s3"] = StepRecord(reasons=["reverted"])  # what `coder revert` does, then saves
    store.save(state)
    store.journal_path("T-1").write_bytes(stale)  # the truncation never happened
    loaded = StateStore(store.coder_dir).load("T-1")
    assert loaded.steps["s3"] == StepRecord(reasons=["reverted"])
    assert loaded.steps["s2"].status == "success"


def test_a_full_disk_is_an_environment_problem_and_loses_nothing(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = make_state()
    store.save(state)
    transitions(store, state)
    before = store.load("T-1")

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    state.steps["s3"].summary = "never written"
    with pytest.raises(EnvironmentProblem, match="No space left on device") as info:
        store.record(state, "s3")
    assert "coder resume" in (info.value.hint or "")
    with pytest.raises(EnvironmentProblem, match="No space left on device"):
        store.save(state)
    monkeypatch.undo()
    assert StateStore(store.coder_dir).load("T-1").steps == before.steps


# --- the task lock --------------------------------------------------------------------------

HOLDER = r"""
import os, subprocess, sys, time
from pathlib import Path
from coder.run.lock import TaskLock

coder_dir, task_id, mode = sys.argv[1:4]
lock = TaskLock(Path(coder_dir), task_id).acquire()
child = subprocess.Popen(["sleep", "60"], close_fds=False) if mode == "spawn" else None
print(os.getpid(), child.pid if child else 0, flush=True)
if mode == "release":
    lock.release()
elif mode == "exit":
    os._exit(0)  # dies holding the lock, like a crash
else:
    time.sleep(60)
"""


class Holder:
    """A second process holding the task lock."""

    def __init__(self, coder_dir: Path, task_id: str, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(coder_dir), task_id, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"holder failed: {self.proc.communicate()[1]}"
        pid, child = line.split()
        self.pid, self.child = int(pid), int(child)

    def kill(self) -> None:
        for pid in (self.pid, self.child):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.communicate(timeout=10)


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.kill()


def test_second_process_holding_the_lock(tmp_path: Path, holders: list[Holder]) -> None:
    coder_dir = tmp_path / ".coder"
    holder = Holder(coder_dir, "T-1", "hold")
    holders.append(holder)
    with pytest.raises(ConcurrentRun) as info:
        TaskLock(coder_dir, "T-1").acquire()
    assert f"pid {holder.pid}" in info.value.message
    assert "coder stop -t T-1" in (info.value.hint or "")
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert read_lock_owner(coder_dir, "T-1") == holder.pid
    assert pid_alive(holder.pid)
    # Other tasks are not affected.
    with TaskLock(coder_dir, "T-2") as other:
        assert other.took_over_from is None


def test_sigkilled_holder_is_taken_over(tmp_path: Path, holders: list[Holder]) -> None:
    coder_dir = tmp_path / ".coder"
    holder = Holder(coder_dir, "T-1", "hold")
    holders.append(holder)
    os.kill(holder.pid, signal.SIGKILL)
    holder.proc.wait(timeout=10)
    assert not pid_alive(holder.pid)
    assert read_lock_owner(coder_dir, "T-1") is None
    with TaskLock(coder_dir, "T-1") as lock:
        assert lock.took_over_from == holder.pid
        assert read_lock_owner(coder_dir, "T-1") == os.getpid()
        owner = json.loads(lock.path.read_text())
        assert owner["pid"] == os.getpid() and owner["started_at"].endswith("Z") and owner["host"]
    assert read_lock_owner(coder_dir, "T-1") is None


def test_holder_dying_without_release_is_taken_over(tmp_path: Path, holders: list[Holder]) -> None:
    coder_dir = tmp_path / ".coder"
    holder = Holder(coder_dir, "T-1", "exit")
    holders.append(holder)
    holder.proc.wait(timeout=10)
    with TaskLock(coder_dir, "T-1") as lock:
        assert lock.took_over_from == holder.pid


def test_commands_started_by_the_runner_do_not_keep_the_lock(
    tmp_path: Path, holders: list[Holder]
) -> None:
    coder_dir = tmp_path / ".coder"
    holder = Holder(coder_dir, "T-1", "spawn")  # spawns `sleep 60` with close_fds=False
    holders.append(holder)
    os.kill(holder.pid, signal.SIGKILL)
    holder.proc.wait(timeout=10)
    assert pid_alive(holder.child)
    with TaskLock(coder_dir, "T-1") as lock:
        assert lock.took_over_from == holder.pid


def test_clean_release_is_not_a_takeover(tmp_path: Path, holders: list[Holder]) -> None:
    coder_dir = tmp_path / ".coder"
    holder = Holder(coder_dir, "T-1", "release")
    holders.append(holder)
    holder.proc.wait(timeout=10)
    with TaskLock(coder_dir, "T-1") as lock:
        assert lock.took_over_from is None


def test_lock_released_on_exit_of_the_with_block(tmp_path: Path, holders: list[Holder]) -> None:
    coder_dir = tmp_path / ".coder"
    lock = TaskLock(coder_dir, "T-1")
    with pytest.raises(RuntimeError, match="boom"), lock:
        assert lock.held
        raise RuntimeError("boom")
    assert not lock.held
    assert read_lock_owner(coder_dir, "T-1") is None
    holder = Holder(coder_dir, "T-1", "hold")  # another process can take it now
    holders.append(holder)
    assert read_lock_owner(coder_dir, "T-1") == holder.pid


def test_same_process_cannot_hold_a_task_twice(tmp_path: Path) -> None:
    coder_dir = tmp_path / ".coder"
    with TaskLock(coder_dir, "T-1") as first:
        with pytest.raises(ConcurrentRun, match=f"pid {os.getpid()}"):
            TaskLock(coder_dir, "T-1").acquire()
        with pytest.raises(RuntimeError):
            first.acquire()
        assert first.held


def test_read_lock_owner_without_lock_file(tmp_path: Path) -> None:
    assert read_lock_owner(tmp_path / ".coder", "T-1") is None


@pytest.mark.parametrize("junk", [b"[" * 4000, b"garbage", b"[1]", b'{"pid": "x"}'])
def test_a_lock_file_that_is_no_record_is_taken_over_quietly(tmp_path: Path, junk: bytes) -> None:
    """Not a record coder wrote (a nesting past json's recursion limit crashed resume with a
    RecursionError): nobody holds it, and the next runner takes it without a previous pid."""
    coder_dir = tmp_path / ".coder"
    (coder_dir / "locks").mkdir(parents=True)
    (coder_dir / "locks" / "T-1.lock").write_bytes(junk)
    with TaskLock(coder_dir, "T-1") as lock:
        assert lock.took_over_from is None
        assert read_lock_owner(coder_dir, "T-1") == os.getpid()


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(0) and not pid_alive(-1)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    assert not pid_alive(proc.pid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs to see zombies")
def test_unreaped_dead_process_is_not_alive() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        for _ in range(500):  # until the kernel has made it a zombie
            if Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert not pid_alive(proc.pid)
    finally:
        proc.wait(timeout=10)
