"""Nothing a command leaves can block coder, and `coder stop` always ends a run.

A FIFO at an asserted path used to block the run forever (the assert opened it and waited for a
writer), and `coder stop` could not end that run: SIGTERM only sets the stop flag the blocked
runner never looks at. Each run here is a real `coder` subprocess with a timeout, so a
regression fails the test instead of hanging the suite."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coder.policy.sandbox import OWNER_VAR, owner_token
from tests.conftest import git
from tests.helpers import ROOT, coder_cli, state_of, taskfile, visible_to_commands

FIFO_ASSERTS = """
    id: fifo
    title: fifo
    graph:
      - id: s1
        kind: shell
        cmd: >-
          python -c "import os; os.mkfifo('out.txt'); os.mkfifo('made.txt')"
          && ln -s /etc/hostname host.txt && echo fine > ok.txt
        assert:
          - {type: text_in_file, path: out.txt, contains: done}
          - {type: file_exists, path: made.txt}
          - {type: text_in_file, path: host.txt, contains: a}
          - {type: text_in_file, path: ok.txt, contains: fine}
"""


def test_a_fifo_at_an_asserted_path_fails_the_step(make_repo) -> None:
    repo = make_repo()
    started = time.monotonic()
    done = coder_cli(repo, "run", "--autonomous", "-f", str(taskfile(repo, FIFO_ASSERTS)))
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 30
    assert state_of(repo, "fifo")["steps"]["s1"]["error"] == (
        "assert text_in_file out.txt: it is a named pipe (FIFO), not a regular file; "
        "assert file_exists made.txt: it is a named pipe (FIFO), not a regular file; "
        "assert text_in_file host.txt: the path leads outside the worktree"
    )
    assert git(repo, "rev-parse", "agent/fifo-fifo") == git(repo, "rev-parse", "main")


def test_project_files_coder_reads_are_never_waited_on(tmp_path: Path) -> None:
    """Choosing a test or lint command reads pyproject.toml, package.json, setup.cfg: a FIFO a
    command left there is passed over, in a process that cannot hang the suite."""
    for name in ("pyproject.toml", "package.json", "setup.cfg", "tox.ini"):
        os.mkfifo(tmp_path / name)
    script = (
        "import sys; from pathlib import Path; "
        "from coder.checks.testcommand import detect_test_command; from coder.checks.lintreport import detect; "
        "root = Path(sys.argv[1]); print(detect_test_command(root), detect(root))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None []"


def owned(coder_dir: Path, task_id: str) -> list[int]:
    """Pids of the processes carrying the task's owner mark (its commands), by a /proc scan."""
    needle = f"{OWNER_VAR}={owner_token(coder_dir, task_id)}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs procfs")
def test_stop_kills_a_runner_that_does_not_stop(make_repo, tmp_path: Path) -> None:
    """A runner that does not act on SIGTERM (here held with SIGSTOP, as one blocked in a
    read is held by the kernel) is killed after --wait, with the command it left running;
    the run is left as a crash leaves it, and `coder resume` finishes it."""
    repo = make_repo()
    flag = tmp_path / "go"
    visible_to_commands(tmp_path)
    path = taskfile(
        repo,
        f"id: stuck\ntitle: t\ngraph:\n  - {{id: s1, kind: shell, cmd: "
        f"'test -e {flag} || sleep 120; echo done > out.txt'}}\n",
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "coder", "run", "--autonomous", "-f", str(path)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    coder_dir = repo / ".coder"
    try:
        deadline = time.monotonic() + 60
        while not owned(coder_dir, "stuck"):
            assert time.monotonic() < deadline and runner.poll() is None, "no command started"
            time.sleep(0.1)
        commands = owned(coder_dir, "stuck")
        os.kill(runner.pid, signal.SIGSTOP)
        started = time.monotonic()
        done = coder_cli(repo, "stop", "-t", "stuck", "--wait", "1", "--json")
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 30
        report = json.loads(done.stdout)
        assert report["stopped_pid"] == runner.pid and report["forced"] is True
        assert set(commands) <= set(report["killed_commands"])
        assert runner.wait(timeout=10) == -signal.SIGKILL
        assert owned(coder_dir, "stuck") == []
        text = coder_cli(repo, "stop", "-t", "stuck")
        assert text.returncode == 2 and "run stuck is not running" in text.stderr
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    flag.touch()
    resumed = coder_cli(repo, "resume", "-t", "stuck")
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "show", "agent/stuck-t:out.txt") == "done\n"


def test_stop_says_what_it_did_when_forced(make_repo) -> None:
    repo = make_repo()
    path = taskfile(repo, "id: held\ntitle: t\ngraph:\n  - {id: s1, kind: shell, cmd: sleep 120}\n")
    runner = subprocess.Popen(
        [sys.executable, "-m", "coder", "run", "--autonomous", "-f", str(path)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not owned(repo / ".coder", "held"):
            assert time.monotonic() < deadline and runner.poll() is None, "no command started"
            time.sleep(0.1)
        os.kill(runner.pid, signal.SIGSTOP)
        done = coder_cli(repo, "stop", "-t", "held", "--wait", "0.5")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(
            f"Run held (pid {runner.pid}) did not stop within 0.5s (it was blocked in "
        )
        assert re.search(r"killed it and [1-9][0-9]* command process\(es\) it left", done.stdout)
        assert done.stdout.rstrip().endswith("continue it with `coder resume -t held`")
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait()
