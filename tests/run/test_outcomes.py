"""How a run ends (DESIGN.md invariant 10, RELIABILITY row 18): a step fails for its own
reasons only; an environment problem stops the run as `error` (exit 3) with everything kept for
resume; skips say why, and only an explicit depends_on makes a skip spread."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coder.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EnvironmentProblem
from tests.conftest import coder, git
from tests.fake_ollama import FakeOllama, Reply
from tests.helpers import call, done, state_of, step_commits, taskfile

MISSING = Reply(http_status=404, error="model 'qwen2.5-coder:7b' not found")


def test_a_model_gone_mid_run_stops_the_run_as_error_not_a_skipped_step(
    fake: FakeOllama, sample: Path
) -> None:
    """The reproduction: Ollama answers 404 "model not found" to a step with retries: 2 and
    on_fail: skip. Before, the step was tried three times, skipped, and the run ended success
    (exit 0)."""
    path = taskfile(
        sample,
        """
        id: gone
        title: model disappears
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt"}
          - id: s2
            kind: edit
            goal: Add multiply(a, b) to calc.py
            retries: 2
            on_fail: {strategy: skip}
          - {id: s3, kind: shell, cmd: "echo three > three.txt"}
        """,
    )
    fake.enqueue(MISSING, MISSING, MISSING)
    code, out, err = coder(sample, "run", "--autonomous", "--json", "-f", str(path))
    assert code == EXIT_ENVIRONMENT, out + err
    result = json.loads(out)
    assert result["status"] == "error" and "not found" in result["error"]
    assert result["error"].endswith(f"; run `OLLAMA_HOST={fake.url} ollama pull qwen2.5-coder:7b`")
    assert result["skipped"] == []
    state = state_of(sample, "gone")
    assert state["status"] == "error"
    s2 = state["steps"]["s2"]
    assert s2["status"] == "interrupted" and s2["attempts"] == 1  # not retried, not skipped
    assert "stopped by an environment problem" in s2["reasons"][-1]
    assert state["steps"]["s3"]["status"] == "pending"
    assert fake.pending == 2  # one call, no retries of an environment problem
    branch = "agent/gone-model-disappears"
    assert [c[0] for c in step_commits(sample, branch)] == ["s1"]

    # the model is back: resume finishes the run, s1 is not redone
    assert fake.next_reply() == fake.next_reply() == MISSING
    fake.enqueue(
        call("fs_edit", path="calc.py", search="    return a - b\n", replace="    return b\n"),
        done("changed subtract", "calc.py"),
    )
    code, out, err = coder(sample, "resume", "-t", "gone")
    assert code == 0, out + err
    assert [c[0] for c in step_commits(sample, branch)] == ["s1", "s2", "s3"]
    state = state_of(sample, "gone")
    assert state["status"] == "success" and state["steps"]["s1"]["attempts"] == 1


def test_a_full_disk_under_a_model_tool_stops_the_run_not_the_step(
    fake: FakeOllama, sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while the model writes a file: before, the tool answered the model
    "No space left on device", and a step with retries and on_fail: skip went on to be
    retried and skipped (a run that could end `success`). It is the environment's: the run
    stops as `error`, the step is not retried, and resume runs it again."""
    import errno
    import os

    from coder.files import nofollow
    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    path = taskfile(
        sample,
        """
        id: diskful
        title: disk fills
        graph:
          - id: s1
            kind: edit
            goal: Add a multiply module
            retries: 2
            on_fail: {strategy: skip}
          - {id: s2, kind: shell, cmd: "echo two > two.txt"}
        """,
    )

    class FullDisk:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(nofollow, "os", FullDisk())
    fake.enqueue(call("fs_write", path="mul.py", content="def mul(a, b):\n    return a * b\n"))
    result = start_run(path, cwd=sample, options=RunOptions())
    assert result.status == "error"
    assert result.state.error == "fs_write: No space left on device; free some disk space"
    s1 = result.state.steps["s1"]
    assert (s1.status, s1.attempts) == ("interrupted", 1)  # not retried, not skipped
    assert result.state.steps["s2"].status == "pending"
    assert fake.pending == 0  # the model was asked once, and not told about the disk

    monkeypatch.setattr(nofollow, "os", os)  # room again
    fake.enqueue(
        call("fs_write", path="mul.py", content="def mul(a, b):\n    return a * b\n"),
        done("added mul.py", "mul.py"),
    )
    code, out, err = coder(sample, "resume", "-t", "diskful")
    assert code == 0, out + err
    assert [c[0] for c in step_commits(sample, "agent/diskful-disk-fills")] == ["s1", "s2"]


def test_a_branch_moved_under_the_run_is_an_error_not_a_failure(make_repo) -> None:
    """Someone commits to the agent branch while s2 runs: the commit's compare-and-swap
    refuses, the run stops as `error` and nothing of theirs is lost."""
    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: moved
        title: t
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt"}
          - {id: s2, kind: shell, cmd: "echo two > two.txt"}
        """,
    )
    branch = "agent/moved-t"

    def someone_commits(event: dict[str, Any]) -> None:
        if event["event"] == "step.started" and event.get("step_id") == "s2":
            theirs = git(repo, "commit-tree", "-m", "theirs", f"{branch}^{{tree}}", "-p", branch)
            git(repo, "update-ref", f"refs/heads/{branch}", theirs.strip())

    result = start_run(path, cwd=repo, options=RunOptions(), console=someone_commits)
    assert result.status == "error"
    assert "moved" in (result.state.error or "")
    assert result.state.steps["s2"].status in ("interrupted", "running")
    assert git(repo, "log", "-1", "--format=%s", branch).strip() == "theirs"


SEQUENCE = """
    id: seq
    title: optional second step
    graph:
      - {id: s1, kind: shell, cmd: "echo one > one.txt"}
      - {id: s2, kind: shell, cmd: "false", on_fail: {strategy: skip}}
      - {id: s3, kind: shell, cmd: "echo three > three.txt"}
      - {id: s4, kind: shell, cmd: "echo four > four.txt"}
"""


def test_an_implicit_sequence_orders_but_a_skipped_step_does_not_stop_the_rest(
    make_repo,
) -> None:
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SEQUENCE)))
    assert code == 0, out + err
    assert "Run seq: success, 1 step skipped after failing: s2" in out
    assert [c[0] for c in step_commits(repo, "agent/seq-optional-second-step")] == [
        "s1",
        "s3",
        "s4",
    ]
    state = state_of(repo, "seq")
    assert state["steps"]["s2"]["skip_cause"] == "failed"
    assert "4 steps on agent/seq-optional-second-step" in err + out
    code, out, _ = coder(repo, "status")
    assert code == 0 and "seq  success (1 skipped)  4/4  " in out  # done, but one did no work
    # the resolved task keeps the sequence implicit, so a resume sees the same rule
    manifest = json.loads((repo / ".coder" / "tasks" / "seq.json").read_text())
    assert all("depends_on" not in s for s in manifest["task"]["graph"])


def test_the_json_summary_lists_what_was_skipped_and_why(make_repo) -> None:
    """With depends_on, a dependency is a requirement: s4 needs the skipped s2."""
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: req
        title: requirements
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt", depends_on: []}
          - {id: s2, kind: shell, cmd: "false", on_fail: {strategy: skip}, depends_on: [s1]}
          - {id: s3, kind: shell, cmd: "echo three > three.txt", depends_on: [s1]}
          - {id: s4, kind: shell, cmd: "echo four > four.txt", depends_on: [s2]}
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "--json", "-f", str(path))
    assert code == 0, out + err
    result = json.loads(out)
    assert result["status"] == "success"
    assert result["skipped"] == [
        {"step_id": "s2", "cause": "failed", "error": "`false` exited with 1"},
        {"step_id": "s4", "cause": "requirement", "error": None},
    ]
    steps = state_of(repo, "req")["steps"]
    assert steps["s3"]["status"] == "success"
    assert steps["s4"]["reasons"] == ["skipped: depends on skipped step s2"]
    code, out, _ = coder(repo, "show", "-t", "req")
    assert (
        "skipped   1 step skipped after failing: s2; 1 step skipped because a step they "
        "require was skipped: s4"
    ) in out


def test_a_run_where_no_step_did_its_work_fails(make_repo) -> None:
    """Every step skipped after failing (a model too weak for the task) is not a success."""
    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: weak
        title: nothing works
        graph:
          - {kind: shell, cmd: "false", on_fail: {strategy: skip}}
          - {kind: shell, cmd: "exit 4", on_fail: {strategy: skip}}
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == EXIT_FAILED, out + err
    state = state_of(repo, "weak")
    assert state["status"] == "failed"
    assert state["error"] == "no step did its work (2 steps skipped after failing: s1, s2)"
    assert "Run weak: failed (no step did its work" in out


def test_a_step_of_a_parallel_level_retries_with_the_same_events(make_repo) -> None:
    """One pipeline for both places: a flaky step in a scratch worktree logs step.retry and
    its reason as it would alone."""
    repo = make_repo()
    # counted in the scratch worktree's git admin dir: writable, and kept across attempts
    counter = '\\"$(git rev-parse --git-dir)/count\\"'
    flaky = f"echo x >> {counter}; echo b > b.txt; test $(wc -l < {counter}) -ge 2"
    path = taskfile(
        repo,
        f"""
        id: par
        title: parallel retry
        policies: {{max_parallel: 2}}
        graph:
          - {{id: a, kind: shell, cmd: "echo a > a.txt", depends_on: []}}
          - {{id: b, kind: shell, cmd: "{flaky}", retries: 1, depends_on: []}}
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    events = [
        json.loads(line)
        for line in (repo / ".coder" / "logs" / "par.jsonl").read_text().splitlines()
    ]
    retries = [e for e in events if e["event"] == "step.retry"]
    assert [(e["step_id"], e["attempt"]) for e in retries] == [("b", 1)]
    assert [c[:2] for c in step_commits(repo, "agent/par-parallel-retry")] == [
        ("a", "1"),
        ("b", "2"),
    ]
    assert "retrying (1 of 1 retries)" in state_of(repo, "par")["steps"]["b"]["reasons"][0]


def test_a_full_disk_mid_run_stops_it_as_an_environment_problem(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while s2 runs: the next checkpoint cannot be written, so the run stops with
    the reason (exit 3 at the CLI), nothing recorded failed; once there is room, resume
    finishes it with one commit per step. (A full disk fails writes and fsyncs alike; the
    commit, libgit2's own write, is let through.)"""
    import errno
    import os

    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: full
        title: disk full
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt"}
          - {id: s2, kind: shell, cmd: "echo two > two.txt"}
          - {id: s3, kind: shell, cmd: "echo three > three.txt"}
        """,
    )
    full = False

    def unless_full(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args)

        return call

    def fill_the_disk(event: dict[str, Any]) -> None:
        nonlocal full
        full = full or (event["event"] == "step.started" and event.get("step_id") == "s2")

    for name in ("fsync", "pwrite"):
        monkeypatch.setattr(os, name, unless_full(getattr(os, name)))
    with pytest.raises(EnvironmentProblem, match="No space left on device") as info:
        start_run(path, cwd=repo, options=RunOptions(), console=fill_the_disk)
    assert info.value.exit_code == EXIT_ENVIRONMENT
    full = False
    state = state_of(repo, "full")
    # s2 committed, but its `success` line could not be written: the checkpoint still says
    # running (resume finds the commit), and s3 never started
    assert [r["status"] for r in state["steps"].values()] == ["success", "running", "pending"]

    code, out, err = coder(repo, "resume", "-t", "full")
    assert code == 0, out + err
    assert [c[0] for c in step_commits(repo, "agent/full-disk-full")] == ["s1", "s2", "s3"]


def test_a_committed_step_costs_no_journal_fsync_and_its_records_stay_whole(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's `running` line is not fsync'd (a kill keeps it; after a power loss resume
    finds the step's files against git), nor its `success` line when it made a commit (the
    commit, found by its trailers, stands in for it): the next fsync of the journal makes
    them durable. A step that committed nothing fsyncs its `success` line. Every line still
    reaches the journal."""
    import os

    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: sync
        title: journal fsyncs
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt"}
          - {id: s2, kind: shell, cmd: "true"}
          - {id: s3, kind: shell, cmd: "echo three > three.txt"}
        """,
    )
    real_fsync = os.fsync
    synced: list[str] = []  # the journal's status lines when each fsync of it came

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith("sync.journal"):
            lines = Path(target).read_text().splitlines()
            synced.append(" ".join(json.loads(line)["record"]["status"] for line in lines))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    result = start_run(path, cwd=repo, options=RunOptions())
    assert result.status == "success"
    assert synced == [
        "running",  # s1 starts (the journal is new: made durable, its directory entry too)
        "running success running success",  # s2 committed nothing: its success is fsync'd,
    ]  # and s1's lines and its own `running` with it; s3's: the final snapshot holds them
    state = state_of(repo, "sync")
    assert [r["status"] for r in state["steps"].values()] == ["success"] * 3
    assert [c[0] for c in step_commits(repo, "agent/sync-journal-fsyncs")] == ["s1", "s3"]


def test_a_full_disk_under_a_step_log_stops_the_run_without_a_traceback(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while s2 runs, so its command's log (an artifact) and then the final
    checkpoint cannot be written: an EnvironmentProblem naming the file (exit 3 at the CLI),
    where an OSError traceback came before; once there is room, resume finishes the run."""
    import errno
    import os

    from coder.files import durable
    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    repo = make_repo()
    path = taskfile(
        repo,
        """
        id: full2
        title: disk full
        graph:
          - {id: s1, kind: shell, cmd: "echo one > one.txt"}
          - {id: s2, kind: shell, cmd: "echo two > two.txt"}
        """,
    )
    real_write_all = durable._write_all
    full = False

    def write_all(fd: int, data: bytes) -> None:
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    def fill_the_disk(event: dict[str, Any]) -> None:
        nonlocal full
        full = full or (event["event"] == "step.started" and event.get("step_id") == "s2")

    monkeypatch.setattr(durable, "_write_all", write_all)
    with pytest.raises(EnvironmentProblem, match="No space left on device"):
        start_run(path, cwd=repo, options=RunOptions(), console=fill_the_disk)
    full = False
    events = (repo / ".coder" / "logs" / "full2.jsonl").read_text()
    assert "/.coder/artifacts/full2/s2-attempt1.log: No space left on device" in events
    state = state_of(repo, "full2")
    assert state["steps"]["s1"]["status"] == "success"
    assert state["steps"]["s2"]["status"] in ("interrupted", "running")  # never failed

    code, out, err = coder(repo, "resume", "-t", "full2")
    assert code == 0, out + err
    assert [c[0] for c in step_commits(repo, "agent/full2-disk-full")] == ["s1", "s2"]
