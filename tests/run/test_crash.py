"""The crash/resume matrix (RELIABILITY.md rows 1, 2, 5, 6; DESIGN.md invariants 1-4).

Every test drives the real `coder` CLI in subprocesses, kills it with the test-only crash hook
(`CODER_CRASH_AT`, see coder/crashpoints.py) or with SIGKILL after a seeded random delay, resumes
it, and checks with the git CLI that the result equals an uninterrupted ("golden") run: the
same step commits (step id and tree, none duplicated, none lost), the same final tree, a clean
worktree, `git fsck` clean, and the user's own checkout untouched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coder.crashpoints import POINTS
from coder.errors import EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_USAGE, CoderError
from coder.run.state import StateStore
from coder.schemas import validator
from tests.conftest import git
from tests.helpers import coder_argv, stray_processes, visible_to_commands, wait_for

TASK_ID = "crash1"
BRANCH = f"agent/{TASK_ID}"
# Five shell steps that change the tree in different ways. s5 *appends* after a pause: a
# command that outlives a crashed runner and then writes again would show up as "x\nx\n".
TASKFILE = f"""\
id: {TASK_ID}
branch: {BRANCH}
title: crash matrix
graph:
  - {{id: s1, kind: shell, goal: create a file, cmd: "echo one > new.txt"}}
  - {{id: s2, kind: shell, goal: modify a file, cmd: "echo more >> a.txt"}}
  - {{id: s3, kind: shell, goal: delete a file, cmd: "rm new.txt"}}
  - {{id: s4, kind: shell, goal: change nothing, cmd: "true"}}
  - {{id: s5, kind: shell, goal: take a moment, cmd: "sleep 0.5 && echo x >> slow.txt"}}
"""
BASE_FILES = {"a.txt": "a\n", "README.md": "# sample\n"}
STEP_ORDER = ["s1", "s2", "s3", "s4", "s5"]
RUNNING_AGAIN = "was running when the runner stopped"
COMMITTED = "its commit is on the branch"


# --- helpers -------------------------------------------------------------------------------


def coder(
    repo: Path,
    *args: str,
    crash: str | None = None,
    delay: float | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in `repo` with the test's (isolated) environment."""
    return subprocess.run(
        [sys.executable, "-m", "coder", *args],
        cwd=repo,
        env=_env(crash, delay),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(repo: Path, *args: str) -> subprocess.Popen[str]:
    """The real CLI in the background, as from a terminal (tests signal it)."""
    return subprocess.Popen(
        coder_argv(*args),
        cwd=repo,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _env(crash: str | None = None, delay: float | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_CRASH")}
    if crash:
        env["CODER_CRASH_AT"] = crash
    if delay is not None:
        env["CODER_CRASH_DELAY"] = str(delay)
    return env


def out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def step_commits(repo: Path) -> list[tuple[str, str]]:
    """(Coder-Step, tree) of every commit in main..BRANCH, oldest first."""
    log = git(
        repo,
        "log",
        "--reverse",
        "--format=%T %(trailers:key=Coder-Step,valueonly)%x00",
        f"main..{BRANCH}",
    )
    rows = [entry.split() for entry in log.split("\0") if entry.strip()]
    return [(row[1] if len(row) > 1 else "?", row[0]) for row in rows]


def tree_of(repo: Path, rev: str) -> str:
    return git(repo, "rev-parse", f"{rev}^{{tree}}").strip()


def state_of(repo: Path) -> dict[str, Any]:
    """The run's checkpoint as coder reads it: the snapshot and its journal."""
    return StateStore(repo / ".coder").load(TASK_ID).to_dict()


def worktree(repo: Path) -> Path:
    return repo / ".coder" / "worktrees" / TASK_ID


def write_taskfile(repo: Path, text: str = TASKFILE) -> Path:
    """Outside the repo, so the user's checkout has no new file because of the test."""
    path = repo.parent / f"{repo.name}-task.yaml"
    path.write_text(text)
    return path


@dataclass
class Checkout:
    """The user's own checkout: every file outside .git/.coder, byte for byte, plus HEAD."""

    files: dict[str, bytes]
    head: str
    main: str
    status: str

    @classmethod
    def take(cls, repo: Path) -> Checkout:
        files = {
            str(p.relative_to(repo)): p.read_bytes()
            for p in sorted(repo.rglob("*"))
            if p.is_file() and p.relative_to(repo).parts[0] not in (".git", ".coder")
        }
        return cls(
            files,
            git(repo, "symbolic-ref", "HEAD").strip(),
            git(repo, "rev-parse", "main").strip(),
            git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        )


def user_repo(make_repo) -> tuple[Path, Path, Checkout]:
    """A repo where the user has an uncommitted edit and an untracked file, and the taskfile."""
    repo = make_repo(BASE_FILES)
    (repo / "README.md").write_text("# sample\nmy uncommitted edit\n")
    (repo / "notes.txt").write_text("untracked, mine\n")
    return repo, write_taskfile(repo), Checkout.take(repo)


@dataclass(frozen=True)
class Golden:
    commits: list[tuple[str, str]]
    tree: str
    duration: float


def assert_golden(repo: Path, golden: Golden, before: Checkout, why: str = "") -> dict[str, Any]:
    """Everything an uninterrupted run guarantees; returns the state for further checks."""
    fsck = subprocess.run(
        ["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True, text=True, check=False
    )
    assert fsck.returncode == 0 and not fsck.stdout.strip(), f"{why}git fsck: {fsck.stderr}"
    assert step_commits(repo) == golden.commits, why
    assert tree_of(repo, BRANCH) == golden.tree, why
    assert git(worktree(repo), "status", "--porcelain", "--untracked-files=all") == "", why
    assert Checkout.take(repo) == before, f"{why}the user's checkout changed"
    state = state_of(repo)
    errors = [e.message for e in validator("state").iter_errors(state)]
    assert not errors, f"{why}state does not match the schema: {errors}"
    assert state["status"] == "success", why
    assert all(s["status"] == "success" for s in state["steps"].values()), why
    commits = {
        sid: c
        for sid, c in zip(
            [sid for sid, _ in golden.commits],
            git(repo, "log", "--reverse", "--format=%H", f"main..{BRANCH}").split(),
            strict=True,
        )
    }
    for sid in STEP_ORDER:  # a step is done iff its commit is on the branch
        assert state["steps"][sid]["commit"] == commits.get(sid), f"{why}{sid}"
    return state


def warnings_logged(repo: Path) -> list[str]:
    lines = (repo / ".coder" / "logs" / f"{TASK_ID}.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    return [e.get("message", "") for e in events if e["event"] == "run.warning"]


def crash(repo: Path, taskfile: Path, at: str, delay: float | None = None) -> None:
    result = coder(repo, "run", "--autonomous", "-f", str(taskfile), crash=at, delay=delay)
    assert result.returncode == -signal.SIGKILL, f"CODER_CRASH_AT={at}: {out(result)}"


def finished(repo: Path) -> bool:
    try:
        return state_of(repo)["status"] == "success"
    except CoderError:
        return False


def running_step(repo: Path, step: str) -> bool:
    try:
        return state_of(repo)["steps"][step]["status"] == "running"
    except CoderError:
        return False


# --- the golden run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    """One uninterrupted run per worker. Trees depend only on content, so its (step, tree)
    list is what every crashed-and-resumed run must reproduce exactly."""
    with pytest.MonkeyPatch.context() as mp:  # the autouse HOME is per test; mirror it here
        home = tmp_path_factory.mktemp("golden-home")
        (home / ".gitconfig").write_text("[user]\n\tname = Test User\n\temail = t@example.com\n")
        mp.setenv("HOME", str(home))
        mp.setenv("XDG_CONFIG_HOME", str(home / ".config"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        for var in ("OLLAMA_HOST", "CODER_MODEL", "CODER_CONFIG", "GIT_DIR", "GIT_WORK_TREE"):
            mp.delenv(var, raising=False)
        repo = tmp_path_factory.mktemp("golden") / "repo"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        for rel, text in BASE_FILES.items():
            (repo / rel).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "initial")
        began = time.monotonic()
        result = coder(repo, "run", "--autonomous", "-f", str(write_taskfile(repo)))
        duration = time.monotonic() - began
        assert result.returncode == 0, out(result)
        return Golden(step_commits(repo), tree_of(repo, BRANCH), duration)


def test_golden_run_makes_one_commit_per_changing_step(golden: Golden, make_repo) -> None:
    assert [sid for sid, _ in golden.commits] == ["s1", "s2", "s3", "s5"]  # s4 changed nothing
    assert len({tree for _, tree in golden.commits}) == 4
    # the shape of the result, independently of how coder got there
    repo = make_repo({"a.txt": "a\nmore\n", "README.md": "# sample\n", "slow.txt": "x\n"})
    assert tree_of(repo, "main") == golden.tree


# --- 1. every crash point --------------------------------------------------------------------

# (CODER_CRASH_AT, CODER_CRASH_DELAY, step whose reasons must tell what resume did with it)
MATRIX = [
    ("after_worktree", None, None),  # before the first checkpoint: state rebuilt
    ("before_step@s3", None, ("s3", RUNNING_AGAIN)),
    ("during_command@s5", 0.2, ("s5", RUNNING_AGAIN)),
    ("after_checks@s3", None, ("s3", RUNNING_AGAIN)),  # s3's deletion done, not committed
    ("after_commit@s3", None, ("s3", COMMITTED)),
    ("checkpoint#1", None, None),  # the manifest write: nothing started
    ("checkpoint#3", None, None),  # the snapshot with the run's status `running`
    # Journal lines: s1 running (1), s1 success (2), s2 running (3), s2 success (4), ...
    # Each crash leaves half the line behind: a torn tail the reader must ignore.
    ("journal#3", None, None),  # s2 `running` torn: s2 still pending
    ("journal#4", None, ("s2", COMMITTED)),  # s2 `success` torn, its commit landed
    ("before_finish", None, None),
    ("checkpoint#4", None, None),  # the final snapshot, over a journal of every step
    ("compaction", None, None),  # the final snapshot written, its journal not yet emptied
]


def test_the_matrix_covers_every_crash_point() -> None:
    assert {at.partition("@")[0].partition("#")[0] for at, _, _ in MATRIX} == set(POINTS)


@pytest.mark.parametrize(("at", "delay", "reason"), MATRIX, ids=[m[0] for m in MATRIX])
def test_crash_then_resume_equals_the_golden_run(
    make_repo, golden: Golden, at: str, delay: float | None, reason: tuple[str, str] | None
) -> None:
    repo, taskfile, before = user_repo(make_repo)
    crash(repo, taskfile, at, delay)
    assert Checkout.take(repo) == before, "a crashed run touched the user's checkout"
    if at.startswith("journal"):
        torn = (repo / ".coder" / "state" / f"{TASK_ID}.journal").read_bytes()
        assert torn.count(b"\n") == int(at[-1]) - 1 and not torn.endswith(b"\n"), torn

    if at == "checkpoint#1":
        # Killed while writing the manifest: no run exists yet (no manifest, branch or
        # worktree). Resume says so cleanly, and running the taskfile again just works.
        assert not (repo / ".coder" / "tasks" / f"{TASK_ID}.json").exists()
        assert git(repo, "branch", "--list", BRANCH) == ""
        resumed = coder(repo, "resume", "-t", TASK_ID)
        assert resumed.returncode == EXIT_USAGE and "no task 'crash1'" in resumed.stderr, out(
            resumed
        )
        assert "Traceback" not in resumed.stderr
        resumed = coder(repo, "run", "--autonomous", "-f", str(taskfile))
    elif at == "compaction":
        # The run finished: its snapshot says so, and the stale journal lines it already
        # contains are not applied again. Resume says there is nothing to do.
        resumed = coder(repo, "resume", "-t", TASK_ID)
        assert resumed.returncode == EXIT_USAGE and "already finished" in resumed.stderr, out(
            resumed
        )
        assert (repo / ".coder" / "state" / f"{TASK_ID}.journal").stat().st_size > 0
        resumed = subprocess.CompletedProcess(resumed.args, 0, "", "")
    else:
        resumed = coder(repo, "resume", "-t", TASK_ID)
        # the kill left the lock behind: the next runner takes it over and says so
        assert "is gone; taking over its lock" in resumed.stderr, out(resumed)
        assert any("taking over its lock" in w for w in warnings_logged(repo))
    assert resumed.returncode == 0, out(resumed)

    state = assert_golden(repo, golden, before, f"CODER_CRASH_AT={at}: ")
    if at == "after_worktree":
        assert "state file of run crash1 is missing" in resumed.stderr, out(resumed)
        assert "rebuilding the state from the branch's commits" in resumed.stderr
    if reason:
        step, text = reason
        assert any(text in r for r in state["steps"][step]["reasons"]), state["steps"][step]
        assert state["steps"][step]["attempts"] == (2 if text == RUNNING_AGAIN else 1)
    # steps finished before the crash never ran again
    assert state["steps"]["s1"]["attempts"] == 1


def test_resume_ends_the_commands_a_killed_runner_left_behind(
    make_repo, golden: Golden, tmp_path: Path
) -> None:
    """A command runs in its own session, so SIGKILL of the runner does not reach it: it would
    go on writing into the worktree while (or after) resume reconciles it."""
    repo, _, before = user_repo(make_repo)
    go = tmp_path / "go-fast"  # created before the resume: the rerun of s1 is quick
    visible_to_commands(tmp_path)
    marks = [["sleep", f"1000.{random.randrange(10**9):09d}"] for _ in range(2)]
    cmd = (
        f"if [ -e {go} ]; then echo one > new.txt; else echo partial > partial.txt; "
        f"{' '.join(marks[0])} & {' '.join(marks[1])}; echo late > late.txt; fi"
    )
    taskfile = write_taskfile(repo, TASKFILE.replace('"echo one > new.txt"', json.dumps(cmd)))
    crash(repo, taskfile, "during_command@s1", delay=0.3)
    assert all(stray_processes(m) for m in marks), "expected the command to outlive the runner"

    go.touch()
    resumed = coder(repo, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    # Ended by this resume ("killed 2 leftover command process(es) of the previous runner"),
    # or already by another coder's sweep of a gone coder's cgroups (coder.policy.cgroups):
    # either way before the resume looked at the worktree.
    assert not any(stray_processes(m) for m in marks), "a crashed run's command survived resume"
    assert_golden(repo, golden, before)


PARALLEL_TASKFILE = """\
id: par1
branch: agent/par1
title: one parallel level
policies: {max_parallel: 2}
graph:
  - {id: p0, kind: shell, cmd: "echo base > base.txt"}
  - {id: p1, kind: shell, cmd: "echo one > one.txt", depends_on: [p0]}
  - {id: p2, kind: shell, cmd: "echo two > two.txt", depends_on: [p0]}
  - {id: p3, kind: shell, cmd: "cat one.txt two.txt > both.txt", depends_on: [p1, p2]}
"""


def test_crash_inside_a_parallel_level_then_resume(make_repo) -> None:
    """p1's commit landed on the branch, p2's is still in its scratch worktree: resume keeps
    p1, reruns p2, and leaves no scratch worktree behind."""
    repo = make_repo(BASE_FILES)
    taskfile = write_taskfile(repo, PARALLEL_TASKFILE)
    result = coder(repo, "run", "--autonomous", "-f", str(taskfile), crash="after_commit@p1")
    assert result.returncode == -signal.SIGKILL, out(result)
    assert "par1--p2" in git(repo, "worktree", "list")

    resumed = coder(repo, "resume", "-t", "par1")
    assert resumed.returncode == 0, out(resumed)
    log = git(
        repo,
        "log",
        "--reverse",
        "--format=%(trailers:key=Coder-Step,valueonly)",
        "main..agent/par1",
    )
    assert log.split() == ["p0", "p1", "p2", "p3"]
    expected = make_repo(
        {
            **BASE_FILES,
            "base.txt": "base\n",
            "one.txt": "one\n",
            "two.txt": "two\n",
            "both.txt": "one\ntwo\n",
        },
        name="expected",
    )
    assert tree_of(repo, "agent/par1") == tree_of(expected, "main")
    listed = git(repo, "worktree", "list", "--porcelain")
    assert listed.count("worktree ") == 2, listed  # the checkout and the run's worktree
    assert "coder-scratch/" not in git(repo, "branch", "--list", "--all")
    assert (
        subprocess.run(
            ["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True, check=False
        ).returncode
        == 0
    )


# --- 2. kill -9 after a seeded random delay --------------------------------------------------

SEEDS = [int(s) for s in os.environ.get("CODER_CRASH_SEEDS", "101,202,303").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_kill_then_resume_equals_the_golden_run(
    make_repo, golden: Golden, seed: int
) -> None:
    repo, taskfile, before = user_repo(make_repo)
    delay = random.Random(seed).uniform(0.0, golden.duration)
    why = f"seed {seed} (kill after {delay:.3f}s of a {golden.duration:.2f}s run): "
    proc = spawn(repo, "run", "--autonomous", "-f", str(taskfile))
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)
    if proc.returncode == 0:
        pass  # it finished before the kill: nothing to resume
    elif not (repo / ".coder" / "tasks" / f"{TASK_ID}.json").exists():
        # killed before the manifest existed: there is no run, so start it again
        result = coder(repo, "run", "--autonomous", "-f", str(taskfile))
        assert result.returncode == 0, why + out(result)
    else:
        assert proc.returncode == -signal.SIGKILL, why + stderr
        done = finished(repo)
        result = coder(repo, "resume", "-t", TASK_ID)
        if done:  # killed after the final checkpoint: it is done, and says so
            assert result.returncode == EXIT_USAGE and "already finished" in result.stderr, (
                why + out(result)
            )
        else:
            assert result.returncode == 0, why + out(result)
    assert_golden(repo, golden, before, why)


# --- 3. a torn state file --------------------------------------------------------------------


@pytest.mark.parametrize("journal", ["lost", "kept"])
def test_truncated_state_is_rebuilt_from_the_branch(
    make_repo, golden: Golden, journal: str
) -> None:
    """The snapshot cut in half: resume rebuilds the state from the branch's commits, keeping
    the step records the journal still holds whole (git then has the last word)."""
    repo, taskfile, before = user_repo(make_repo)
    crash(repo, taskfile, "after_commit@s3")
    path = repo / ".coder" / "state" / f"{TASK_ID}.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    lines = path.with_suffix(".journal").read_text().splitlines()
    journaled = [json.loads(line)["step"] for line in lines]
    assert journaled, "the crash left no journal line: nothing to keep"
    if journal == "lost":
        path.with_suffix(".journal").unlink()

    result = coder(repo, "resume", "-t", TASK_ID)
    assert result.returncode == 0, out(result)
    assert "is corrupt" in result.stderr and "rebuilding the state" in result.stderr, out(result)
    state = assert_golden(repo, golden, before)
    kept = sorted(set(journaled)) if journal == "kept" else []
    assert ("what the checkpoint still held of" in result.stderr) == bool(kept), out(result)
    for sid in ("s1", "s2", "s3"):
        reasons = state["steps"][sid]["reasons"]
        # known done from their trailers alone, unless the journal said so (s3 was running)
        said = sid in kept and sid != "s3"
        assert any(COMMITTED in r for r in reasons) != said, (journaled, state["steps"][sid])


def test_a_lost_running_line_with_a_dirty_worktree_is_rerun(make_repo, golden: Golden) -> None:
    """RELIABILITY.md row 34: a step's `running` line is not fsync'd, so a power loss can drop
    it while the step's half-done edits sit in the worktree. Resume restores the worktree and
    reruns the step, as for an interrupted one: the same tree and commits as the golden run."""
    repo, taskfile, before = user_repo(make_repo)
    crash(repo, taskfile, "before_step@s2")  # s1 committed, s2 journaled as running
    journal = repo / ".coder" / "state" / f"{TASK_ID}.journal"
    *kept, last = journal.read_text().splitlines(keepends=True)
    entry = json.loads(last)
    assert (entry["step"], entry["record"]["status"]) == ("s2", "running"), last
    journal.write_text("".join(kept))  # the line the page cache lost
    wt = worktree(repo)
    with (wt / "a.txt").open("a") as half_done:  # what s2 had done when the power went
        half_done.write("more\n")
    (wt / "half.txt").write_text("a file s2 was writing\n")
    (wt / "README.md").unlink()
    assert state_of(repo)["steps"]["s2"]["status"] == "pending"

    result = coder(repo, "resume", "-t", TASK_ID)
    assert result.returncode == 0, out(result)
    assert "half-done work whose `running` line was lost" in result.stderr, out(result)
    state = assert_golden(repo, golden, before)  # no commit lost, none duplicated
    assert git(repo, "rev-list", "--count", f"main..{BRANCH}").strip() == "4"
    assert state["steps"]["s1"]["attempts"] == 1


def test_a_branch_lock_a_killed_runner_left_is_removed_by_resume(make_repo, golden: Golden) -> None:
    """A runner killed inside its update of the run's branch leaves `refs/heads/BRANCH.lock`
    (libgit2 writes the new commit there, then renames it over the ref). Resume holds the task
    lock, so a branch lock no process has open is the dead runner's: removed, said, and the run
    finishes as the golden one. One a live process holds open is left, and named."""
    repo, taskfile, before = user_repo(make_repo)
    crash(repo, taskfile, "before_step@s2")
    lock = repo / ".git" / "refs" / "heads" / f"{BRANCH}.lock"
    tip = git(repo, "rev-parse", BRANCH).strip()
    lock.write_text(f"{tip}\n")

    holder = subprocess.Popen(  # a git process still writing it
        [sys.executable, "-c", f"f = open({str(lock)!r}); import time; time.sleep(60)"]
    )
    try:
        wait_for(lambda: _holds(holder.pid, lock), timeout=10)
        result = coder(repo, "resume", "-t", TASK_ID)
        assert result.returncode == EXIT_ENVIRONMENT, out(result)
        assert str(lock) in result.stderr and lock.exists(), out(result)
    finally:
        holder.kill()
        holder.wait()
    assert git(repo, "rev-parse", BRANCH).strip() == tip  # nothing moved meanwhile

    result = coder(repo, "resume", "-t", TASK_ID)
    assert result.returncode == 0, out(result)
    assert f"removed {lock}, left by a runner killed" in result.stderr, out(result)
    assert not lock.exists()
    assert_golden(repo, golden, before)


def _holds(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir())


# --- 4. one runner per task ------------------------------------------------------------------


def test_a_second_runner_is_refused_while_one_runs(make_repo) -> None:
    repo = make_repo(BASE_FILES)
    taskfile = write_taskfile(repo, TASKFILE.replace('"echo one > new.txt"', '"sleep 10"'))
    runner = spawn(repo, "run", "--autonomous", "-f", str(taskfile))
    try:
        wait_for(lambda: running_step(repo, "s1"), what="s1 to start")
        for args in (("resume", "-t", TASK_ID), ("run", "--autonomous", "-f", str(taskfile))):
            second = coder(repo, *args)
            assert second.returncode == EXIT_ENVIRONMENT, out(second)
            assert f"already being run by pid {runner.pid}" in second.stderr, out(second)
        assert runner.poll() is None, "the second runner disturbed the first"
        stopped = coder(repo, "stop", "-t", TASK_ID)
        assert stopped.returncode == 0, out(stopped)
        runner.communicate(timeout=30)  # stop returns once the lock is free, maybe before exit
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate(timeout=30)
    assert runner.returncode == EXIT_INTERRUPTED


# --- 5. coder stop ---------------------------------------------------------------------------


def test_stop_interrupts_the_step_kills_its_children_and_resume_finishes(
    make_repo, tmp_path: Path
) -> None:
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go-fast"  # absent: s1 writes, then hangs; present (on resume): quick
    visible_to_commands(tmp_path)
    child = ["sleep", f"1000.{random.randrange(10**9):09d}"]  # unique: found in /proc later
    cmd = (
        f"if [ -e {go} ]; then echo done > s1.txt; "
        f"else echo partial > partial.txt; {' '.join(child)} & sleep 30; fi"
    )
    taskfile = write_taskfile(
        repo,
        TASKFILE.replace('"echo one > new.txt"', json.dumps(cmd)).replace(
            '"rm new.txt"', '"rm s1.txt"'
        ),
    )
    runner = spawn(repo, "run", "--autonomous", "-f", str(taskfile))
    try:
        wait_for(
            lambda: (worktree(repo) / "partial.txt").exists() and stray_processes(child) != [],
            what="s1's command",
        )
        stopped = coder(repo, "stop", "-t", TASK_ID)
        assert stopped.returncode == 0 and str(runner.pid) in stopped.stdout, out(stopped)
        runner.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate(timeout=30)
    assert runner.returncode == EXIT_INTERRUPTED
    assert stray_processes(child) == [], "the step's background child survived"
    state = state_of(repo)
    assert state["status"] == "interrupted" and state["steps"]["s1"]["status"] == "interrupted"
    assert git(worktree(repo), "status", "--porcelain", "--untracked-files=all") == ""
    assert step_commits(repo) == []

    # The stopping runner cleaned the worktree itself, so an edit made after the stop is the
    # user's: resume must refuse rather than discard it (RELIABILITY row 6).
    (worktree(repo) / "a.txt").write_text("the user's edit\n")
    refused = coder(repo, "resume", "-t", TASK_ID)
    assert refused.returncode == EXIT_ENVIRONMENT, out(refused)
    assert "changes coder did not make (a.txt)" in refused.stderr, out(refused)
    assert (worktree(repo) / "a.txt").read_text() == "the user's edit\n"
    git(worktree(repo), "checkout", "--", "a.txt")

    go.touch()
    resumed = coder(repo, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    assert [sid for sid, _ in step_commits(repo)] == ["s1", "s2", "s3", "s5"]
    assert state_of(repo)["steps"]["s1"]["attempts"] == 2
    assert not (worktree(repo) / "partial.txt").exists()


# --- 6. the user changed things while no runner was there -------------------------------------


def test_resume_refuses_a_foreign_commit_on_the_agent_branch(make_repo) -> None:
    repo, taskfile, _ = user_repo(make_repo)
    crash(repo, taskfile, "after_commit@s2")
    wt = worktree(repo)
    (wt / "mine.txt").write_text("the user's own work\n")
    git(wt, "add", "mine.txt")
    git(wt, "commit", "-q", "-m", "my own commit")
    tip = git(repo, "rev-parse", BRANCH).strip()
    state_before = (repo / ".coder" / "state" / f"{TASK_ID}.json").read_bytes()

    result = coder(repo, "resume", "-t", TASK_ID)
    assert result.returncode == EXIT_ENVIRONMENT, out(result)
    assert "commits coder did not make" in result.stderr and tip[:8] in result.stderr
    assert "Traceback" not in result.stderr
    assert git(repo, "rev-parse", BRANCH).strip() == tip
    assert (wt / "mine.txt").read_text() == "the user's own work\n"
    assert git(wt, "status", "--porcelain") == ""
    assert (repo / ".coder" / "state" / f"{TASK_ID}.json").read_bytes() == state_before


def test_resume_refuses_a_worktree_edited_while_no_step_ran(make_repo) -> None:
    repo, taskfile, _ = user_repo(make_repo)
    crash(repo, taskfile, "before_finish")  # every step done: nothing of coder's is pending
    assert not any(s["status"] == "running" for s in state_of(repo)["steps"].values())
    wt = worktree(repo)
    (wt / "a.txt").write_text("the user's edit\n")
    tip = git(repo, "rev-parse", BRANCH).strip()

    result = coder(repo, "resume", "-t", TASK_ID)
    assert result.returncode == EXIT_ENVIRONMENT, out(result)
    assert "changes coder did not make (a.txt)" in result.stderr, out(result)
    assert (wt / "a.txt").read_text() == "the user's edit\n"
    assert git(repo, "rev-parse", BRANCH).strip() == tip
