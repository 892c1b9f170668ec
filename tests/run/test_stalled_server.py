"""A model server that takes requests and answers none (hung, overloaded) cannot hold a run
(RELIABILITY.md rows 9, 18 and 22): a real `coder run` against the fake Ollama, stalled.

- `coder stop` (SIGTERM, no SIGKILL needed), SIGINT or SIGHUP ends the run within a few
  seconds (exit 130, the checkpoint says `interrupted`, the server saw its client go, no
  process left in /proc), and `coder resume` finishes it once the server answers; with the
  warm prefix on (the default) the step waits on the prefix first, without it on its own
  request: both are ended.
- A step's `timeout` ends the step on time (the step's own failure, as a command's timeout is),
  where the request used to wait for the client's 600 s timeout and then be retried.
- A request that times out on every attempt (`request_timeout`) is the environment's problem:
  the run stops as `error`, exit 3, the step not counted failed, and `coder resume` finishes.
Each is judged by git, the state on disk, the fake server's record and /proc.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from coder.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_INTERRUPTED
from tests.conftest import git
from tests.fake_ollama import FakeOllama
from tests.helpers import call, done, state_of, taskfile, wait_for
from tests.run.test_crash import coder, out, spawn

TASK_ID = "stall"
BRANCH = f"agent/{TASK_ID}"
# How soon after the signal or the deadline: the server sees its client go; the process has
# exited (its checkpoint written; the figure, with room for a loaded machine).
HANG_UP_S = 5.0
EXIT_S = 15.0


def task(repo: Path, timeout: int | None = None) -> Path:
    limit = f", timeout: {timeout}" if timeout else ""
    return taskfile(
        repo,
        f"""
        id: {TASK_ID}
        branch: {BRANCH}
        title: Writes a file through the model
        graph:
          - {{id: s1, kind: custom, goal: Write hello.txt{limit}}}
        """,
    )


def configure(home: Path, **settings: object) -> None:
    """The user's coder config (the test's HOME)."""
    path = home / ".config" / "coder" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings))


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text` (the run's taskfile: its runner)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if proc.name.isdigit() and text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def step_started(repo: Path) -> bool:
    log = repo / ".coder" / "logs" / f"{TASK_ID}.jsonl"
    return log.exists() and '"step.started"' in log.read_text()


def finish(fake: FakeOllama, repo: Path) -> None:
    """The server answers again: `coder resume` finishes the run, s1's one commit on the
    branch."""
    fake.stall = None
    fake.enqueue(call("fs_write", path="hello.txt", content="hello\n"), done("wrote", "hello.txt"))
    resumed = coder(repo, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    log = git(repo, "log", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}")
    assert log.split() == ["s1"]
    assert git(repo, "show", f"{BRANCH}:hello.txt") == "hello\n"


def assert_nothing_committed(repo: Path) -> None:
    assert git(repo, "rev-list", f"main..{BRANCH}") == ""
    worktree = repo / ".coder" / "worktrees" / TASK_ID
    assert git(worktree, "status", "--porcelain", "--untracked-files=all") == ""


@pytest.mark.parametrize(
    ("sig", "warm_prefix"),
    [(signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGHUP, False)],
    ids=["coder-stop-waiting-on-the-warm-prefix", "SIGINT", "SIGHUP"],
)
def test_a_signal_ends_a_run_waiting_on_a_stalled_server(
    fake: FakeOllama, make_repo, isolated_home: Path, sig: signal.Signals, warm_prefix: bool
) -> None:
    repo = make_repo()
    configure(isolated_home, warm_prefix=warm_prefix)  # request_timeout: the default 600 s
    fake.stall = "answer"
    path = task(repo)
    runner = spawn(repo, "run", "--autonomous", "-f", str(path))
    try:  # s1 waits on the warm prefix or, without it, on its own request
        wait_for(lambda: step_started(repo) and fake.stalled, timeout=30, what="s1 to wait")
        time.sleep(0.3)
    finally:
        sent = time.monotonic()
        if sig == signal.SIGTERM:  # as `coder stop` sends it: no SIGKILL needed
            stopped = coder(repo, "stop", "-t", TASK_ID)
            assert stopped.returncode == 0 and "Stopped run" in stopped.stdout, out(stopped)
        else:
            runner.send_signal(sig)
        try:
            _, err = runner.communicate(timeout=30)
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.communicate()
    ended = time.monotonic()
    assert runner.returncode == EXIT_INTERRUPTED, err
    assert ended - sent < EXIT_S, f"the run took {ended - sent:.1f}s to stop"
    assert len(fake.hangups) == len(fake.stalled) and fake.hangups[-1] - sent < HANG_UP_S
    assert processes_naming(str(path)) == []
    state = state_of(repo, TASK_ID)
    assert state["status"] == "interrupted" and state["steps"]["s1"]["status"] == "interrupted"
    assert_nothing_committed(repo)
    finish(fake, repo)


def test_a_step_timeout_ends_the_step_on_time(fake: FakeOllama, make_repo) -> None:
    """`timeout: 3` with the server stalled (the warm prefix too): the step fails after 3 s, as
    after a command's timeout, instead of waiting for the client's timeout (600 s) and a
    retry."""
    repo = make_repo()
    fake.stall = "stream"  # the headers and a first piece, then nothing
    ran = coder(repo, "run", "--autonomous", "-f", str(task(repo, timeout=3)))
    assert ran.returncode == EXIT_FAILED, out(ran)
    step = state_of(repo, TASK_ID)["steps"]["s1"]
    assert step["status"] == "failed" and "time limit reached (3s)" in step["error"]
    assert fake.stalled and len(fake.hangups) == len(fake.stalled)  # every request ended
    # the step's own request (the last one) was ended on time, not retried
    assert fake.hangups[-1] - fake.stalled[-1] < 3 + HANG_UP_S
    assert_nothing_committed(repo)


def test_a_request_timing_out_on_every_attempt_stops_the_run_as_an_environment_problem(
    fake: FakeOllama, make_repo, isolated_home: Path
) -> None:
    repo = make_repo()
    configure(isolated_home, request_timeout=1, warm_prefix=False)
    fake.stall = "answer"
    ran = coder(repo, "run", "--autonomous", "-f", str(task(repo)))
    assert ran.returncode == EXIT_ENVIRONMENT, out(ran)
    assert f"the model server at {fake.url}" in ran.stderr
    assert "answered none in time" in ran.stderr and "request_timeout" in ran.stderr
    assert len(fake.stalled) == 3  # each attempt, then no more
    state = state_of(repo, TASK_ID)
    assert state["status"] == "error"
    assert state["steps"]["s1"]["status"] == "interrupted"  # not failed: it runs again
    assert_nothing_committed(repo)
    finish(fake, repo)
