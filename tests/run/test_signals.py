"""Every way a terminal ends a command ends its commands (RELIABILITY.md row 22).

SIGHUP (the terminal closed, an ssh connection dropped), SIGINT (Ctrl-C) and SIGTERM (`coder
stop`, a service manager) reach a real `coder run`, `coder resume` or `coder merge` while a
command of theirs runs. Each is judged by a scan of /proc (no process the command started is
left 5 s after the signal, including one that left its session), the exit code (130, as the
README's table says for an interruption), and git: the branch, a clean worktree, and the next
`coder resume` or `coder merge` finishing the job.

Row 22's tests: test_a_signal_mid_step_ends_every_process_of_the_step_and_resume_finishes,
test_a_hang_up_during_resume_ends_its_step_too, test_closing_the_terminal_stops_the_run,
test_a_signal_during_merge_lands_nothing_ends_its_tests_and_says_to_merge_again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coder.errors import EXIT_INTERRUPTED
from coder.run.state import StateStore
from tests.conftest import git
from tests.helpers import Terminal, coder_argv, stray_processes, visible_to_commands, wait_for
from tests.run.test_crash import coder, out, spawn  # the real CLI, in a subprocess


@pytest.fixture(autouse=True)
def flags_visible(tmp_path: Path) -> None:
    """The steps here wait on flag files in the test's directory: commands see it."""
    visible_to_commands(tmp_path)


TASK_ID = "sig1"
BRANCH = f"agent/{TASK_ID}"
BASE_FILES = {"a.txt": "a\n", "README.md": "# sample\n"}


@pytest.fixture
def strays() -> Iterator[list[list[str]]]:
    """Command lines of processes a test starts; any still running at its end (the test
    failed) are killed, so a failure does not leave them behind."""
    marks: list[list[str]] = []
    yield marks
    for mark in marks:
        for pid in stray_processes(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def unique_sleep() -> list[str]:
    """A command line no other process has, to find in /proc."""
    return ["sleep", f"1000.{random.randrange(10**9):09d}"]


def hanging_task(repo: Path, go: Path, *, escape: bool = False) -> tuple[Path, list[list[str]]]:
    """s1 writes a file, then waits on two sleeps (one in the background); with `escape`, a
    third process leaves the command's session (setsid) and so its process group. Once `go`
    exists s1 is quick. Returns the taskfile and the command lines of those processes."""
    marks = [unique_sleep(), unique_sleep()]
    escaping = ""
    if escape:
        code = f"import os, time; os.setsid(); time.sleep({marks[0][1]}1)"
        marks.append(["python", "-c", code])
        escaping = f"python -c '{code}' & "
    cmd = (
        f"if [ -e {go} ]; then echo done > s1.txt; else echo partial > partial.txt; "
        f"{escaping}{' '.join(marks[0])} & {' '.join(marks[1])}; fi"
    )
    text = (
        f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: hangs until told\ngraph:\n"
        f"  - {{id: s1, kind: shell, cmd: {json.dumps(cmd)}}}\n"
        '  - {id: s2, kind: shell, cmd: "echo two > two.txt", depends_on: [s1]}\n'
    )
    path = repo.parent / f"{repo.name}-task.yaml"  # outside: the checkout stays as it was
    path.write_text(text)
    return path, marks


def worktree(repo: Path) -> Path:
    return repo / ".coder" / "worktrees" / TASK_ID


def started(repo: Path, marks: list[list[str]]) -> bool:
    return (worktree(repo) / "partial.txt").exists() and all(stray_processes(m) for m in marks)


def assert_all_ended(marks: list[list[str]], since: float) -> None:
    """Every process of the step is gone within 5 s of the signal."""
    wait_for(
        lambda: not any(stray_processes(m) for m in marks),
        timeout=max(0.0, since + 5 - time.monotonic()),
        what=f"the step's processes to end: {[m for m in marks if stray_processes(m)]}",
    )


def assert_interrupted_then_resumed(repo: Path, go: Path) -> None:
    """The run stopped as `interrupted` with nothing of s1 committed or left in the worktree;
    `coder resume` then finishes it."""
    state = StateStore(repo / ".coder").load(TASK_ID)
    assert state.status == "interrupted" and state.steps["s1"].status == "interrupted"
    assert git(repo, "rev-list", f"main..{BRANCH}") == ""
    assert git(worktree(repo), "status", "--porcelain", "--untracked-files=all") == ""
    go.touch()
    resumed = coder(repo, "resume", "-t", TASK_ID)
    assert resumed.returncode == 0, out(resumed)
    log = git(repo, "log", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}")
    assert log.split() == ["s2", "s1"]
    assert git(worktree(repo), "status", "--porcelain", "--untracked-files=all") == ""
    git(repo, "fsck", "--strict")


def spawn_ignoring(repo: Path, sig: signal.Signals, *args: str) -> subprocess.Popen[str]:
    """`coder ARGS` started with `sig` ignored, as `nohup` starts a command (SIGHUP) and a shell
    without job control a background one (SIGINT)."""
    return subprocess.Popen(
        coder_argv(*args, ignoring=[sig]),
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[float, str]:
    """Send `sig`; (when it was sent, what the process wrote on stderr) once it has exited."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    return sent, err


@pytest.mark.parametrize(
    ("sig", "escape"),
    [
        (signal.SIGHUP, False),
        (signal.SIGINT, False),
        (signal.SIGTERM, False),
        (signal.SIGHUP, True),
    ],
    ids=["SIGHUP", "SIGINT", "SIGTERM", "SIGHUP-setsid"],
)
def test_a_signal_mid_step_ends_every_process_of_the_step_and_resume_finishes(
    make_repo, tmp_path: Path, strays: list[list[str]], sig: signal.Signals, escape: bool
) -> None:
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go"
    taskfile, marks = hanging_task(repo, go, escape=escape)
    strays += marks
    runner = spawn(repo, "run", "--autonomous", "-f", str(taskfile))
    try:
        wait_for(lambda: started(repo, marks), what="s1's processes")
    finally:
        sent, err = interrupt(runner, sig)
    assert runner.returncode == EXIT_INTERRUPTED, err
    assert_all_ended(marks, sent)
    assert_interrupted_then_resumed(repo, go)


def test_a_hang_up_during_resume_ends_its_step_too(
    make_repo, tmp_path: Path, strays: list[list[str]]
) -> None:
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go"
    taskfile, marks = hanging_task(repo, go)
    strays += marks
    crashed = coder(repo, "run", "--autonomous", "-f", str(taskfile), crash="before_step@s1")
    assert crashed.returncode == -signal.SIGKILL, out(crashed)
    resuming = spawn(repo, "resume", "-t", TASK_ID)
    try:
        wait_for(lambda: started(repo, marks), what="s1's processes under resume")
    finally:
        sent, err = interrupt(resuming, signal.SIGHUP)
    assert resuming.returncode == EXIT_INTERRUPTED, err
    assert_all_ended(marks, sent)
    assert_interrupted_then_resumed(repo, go)


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid(1) from util-linux")
def test_closing_the_terminal_stops_the_run(
    make_repo, tmp_path: Path, strays: list[list[str]]
) -> None:
    """A real hang-up: coder on a terminal it controls, which then closes. It gets SIGHUP and
    every write to the terminal fails from then on; it stops as `coder stop` would."""
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go"
    taskfile, marks = hanging_task(repo, go)
    strays += marks
    term = Terminal(["run", "--autonomous", "-f", str(taskfile)], cwd=repo, session=True)
    try:

        def step_running() -> bool:
            term.read(0.05)  # keep the terminal drained, as a terminal window would
            return started(repo, marks)

        wait_for(step_running, what="s1's processes")
    finally:
        sent = time.monotonic()
        term.hang_up()
        try:
            code = term.proc.wait(timeout=30)
        finally:
            if term.proc.poll() is None:
                term.proc.kill()
                term.proc.wait(timeout=30)
    assert code == EXIT_INTERRUPTED
    assert_all_ended(marks, sent)
    assert_interrupted_then_resumed(repo, go)


def test_a_run_started_under_nohup_goes_on_after_a_hang_up(make_repo, tmp_path: Path) -> None:
    """The troubleshooting guide's advice for an unreliable connection: a run started under
    `nohup` (SIGHUP ignored) goes on when its terminal goes, its step's command too, and
    finishes."""
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go"
    waits = f"while [ ! -e {go} ]; do sleep 0.05; done; echo > partial.txt; echo done > s1.txt"
    taskfile = repo.parent / "nohup-task.yaml"
    taskfile.write_text(
        f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: waits until told\ngraph:\n"
        f"  - {{id: s1, kind: shell, cmd: {json.dumps(waits)}}}\n"
        '  - {id: s2, kind: shell, cmd: "echo two > two.txt", depends_on: [s1]}\n'
    )
    runner = spawn_ignoring(repo, signal.SIGHUP, "run", "--autonomous", "-f", str(taskfile))
    try:
        wait_for(lambda: (repo / ".coder" / "logs" / f"{TASK_ID}.jsonl").exists(), what="the run")
        time.sleep(0.5)  # s1 waits
        runner.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert runner.poll() is None, "the hang-up stopped a run started under nohup"
        go.touch()
        _, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 0, err
    log = git(repo, "log", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}")
    assert log.split() == ["s2", "s1"]


# --- coder merge --------------------------------------------------------------------------

MERGE_TASK = """\
id: m1
title: Adds a file, tested
graph:
  - {{id: add, kind: shell, cmd: "echo b > b.txt"}}
  - {{id: check, kind: test, cmd: {test}, depends_on: [add]}}
"""


@pytest.mark.parametrize(
    ("sig", "ignored"),
    [
        (signal.SIGHUP, False),
        (signal.SIGINT, False),
        (signal.SIGTERM, False),
        (signal.SIGINT, True),
    ],
    ids=["SIGHUP", "SIGINT", "SIGTERM", "SIGINT-ignored-at-start"],
)
def test_a_signal_during_merge_lands_nothing_ends_its_tests_and_says_to_merge_again(
    make_repo, tmp_path: Path, strays: list[list[str]], sig: signal.Signals, ignored: bool
) -> None:
    """`coder merge --if-green` is signalled while the tests run on the merge result: base and
    the tag are untouched, the check worktree and every test process are gone, the message
    says nothing landed and to merge again; merging again lands the one squash commit. Also
    when coder started with SIGINT ignored, as a shell without job control starts a background
    command (a suite run as `tox &` once lost its SIGINT that way: Python's own handler is
    not set then)."""
    repo = make_repo(BASE_FILES)
    go = tmp_path / "go"  # present while the run tests: quick; absent for the first merge
    mark = unique_sleep()
    strays.append(mark)
    test = f"if [ -e {go} ]; then true; else echo > started; {' '.join(mark)}; fi"
    taskfile = tmp_path / "m1.yaml"
    taskfile.write_text(MERGE_TASK.format(test=json.dumps(test)))
    go.touch()
    ran = coder(repo, "run", "--autonomous", "-f", str(taskfile))
    assert ran.returncode == 0, out(ran)
    go.unlink()
    old_main = git(repo, "rev-parse", "main").strip()
    check = repo / ".coder" / "worktrees" / "m1--merge.check"
    args = ("merge", "-t", "m1", "--if-green")
    merging = spawn_ignoring(repo, sig, *args) if ignored else spawn(repo, *args)
    try:
        wait_for(
            lambda: (check / "started").exists() and stray_processes(mark) != [],
            what="the tests on the merge result",
        )
    finally:
        sent, err = interrupt(merging, sig)
    assert merging.returncode == EXIT_INTERRUPTED, err
    assert err.splitlines()[-2:] == [
        "coder: interrupted: the merge of run m1 stopped before anything landed; main is unchanged",
        "  hint: run `coder merge -t m1` again to merge it",
    ]
    assert_all_ended([mark], sent)
    assert git(repo, "rev-parse", "main").strip() == old_main
    assert git(repo, "tag", "-l") == ""
    assert "m1--merge.check" not in git(repo, "worktree", "list") and not check.exists()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""

    go.touch()
    merged = coder(repo, "merge", "-t", "m1", "--if-green")
    assert merged.returncode == 0, out(merged)
    assert git(repo, "rev-list", "--parents", "-1", "main").split()[1:] == [old_main]
    assert git(repo, "rev-parse", "coder/m1").strip() == git(repo, "rev-parse", "main").strip()
    assert (repo / "b.txt").read_text() == "b\n"
    git(repo, "fsck", "--strict")
