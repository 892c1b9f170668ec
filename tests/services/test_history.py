"""Inspecting runs: show -t, diff, logs, clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder.run.lock import TaskLock
from tests.conftest import coder, git
from tests.helpers import taskfile

TASK = """
    id: h1
    title: History demo
    graph:
      - {id: a, kind: shell, cmd: "echo one > one.txt"}
      - {id: b, kind: shell, cmd: "true", depends_on: [a]}
      - {id: c, kind: shell, cmd: "echo two >> one.txt && echo 3 > three.txt", depends_on: [b]}
"""


@pytest.fixture
def finished(make_repo) -> Path:
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    return repo


def test_show_run_text_and_json(finished: Path) -> None:
    code, out, _ = coder(finished, "show", "-t", "h1")
    assert code == 0
    assert out.startswith("History demo\n  id        h1\n  status    success\n")
    assert "  branch    agent/h1-history-demo (from main at " in out
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("step ")))
    assert [line.split()[:3] for line in lines[header + 1 : header + 4]] == [
        ["a", "shell", "success"],
        ["b", "shell", "success"],
        ["c", "shell", "success"],
    ]
    code, out, _ = coder(finished, "show", "-t", "h1", "--json")
    data = json.loads(out)
    assert data["status"] == "success" and data["running_pid"] is None
    assert data["steps"]["b"]["commit"] is None and len(data["steps"]["c"]["commit"]) == 40


def test_show_needs_exactly_one_of_file_or_task(finished: Path) -> None:
    code, _, err = coder(finished, "show")
    assert code == 2 and "pass exactly one of -f FILE" in err


def test_diff_whole_run_step_and_stat(finished: Path) -> None:
    code, out, _ = coder(finished, "diff", "-t", "h1")
    assert code == 0
    assert out == git(finished, "diff", "main", "agent/h1-history-demo")
    code, out, _ = coder(finished, "diff", "-t", "h1", "--step", "c")
    assert "+two" in out and "+one" not in out
    code, out, _ = coder(finished, "diff", "-t", "h1", "--stat")
    assert "2 files changed, 3 insertions(+)" in out
    code, _, err = coder(finished, "diff", "-t", "h1", "--step", "b")
    assert code == 2 and "step b has no commit (status success" in err
    code, _, err = coder(finished, "diff", "-t", "h1", "--step", "zz")
    assert code == 2 and "run h1 has no step 'zz' (its steps: a, b, c)" in err


def test_logs_plain_json_and_follow(finished: Path) -> None:
    code, out, _ = coder(finished, "logs", "-t", "h1")
    assert code == 0
    assert any(" info    a          step.succeeded commit=" in line for line in out.splitlines())
    code, out, _ = coder(finished, "logs", "-t", "h1", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["event"] == "run.started" and events[-1]["event"] == "run.finished"
    code, followed, _ = coder(finished, "logs", "-t", "h1", "--follow", "--json")
    assert code == 0 and followed == out  # nothing running: prints what is there and returns


def test_unknown_task_everywhere(finished: Path) -> None:
    for args in (
        ["show", "-t", "nope"],
        ["diff", "-t", "nope"],
        ["logs", "-t", "nope"],
        ["stop", "-t", "nope"],
    ):
        code, _, err = coder(finished, *args)
        assert code == 2 and "nope" in err, args
    # clean is idempotent: with nothing of the run left there is nothing to do, and it says
    # which runs there are (a mistyped id)
    code, out, err = coder(finished, "clean", "-t", "nope")
    assert code == 0 and "Nothing to clean: no run nope (runs here: h1)" in out, out + err


def test_clean_removes_the_run_but_keeps_an_unmerged_branch(finished: Path) -> None:
    tip = git(finished, "rev-parse", "agent/h1-history-demo")
    code, out, _ = coder(finished, "clean", "-t", "h1")
    assert code == 0 and "Kept branch agent/h1-history-demo" in out
    assert git(finished, "rev-parse", "agent/h1-history-demo") == tip
    assert "h1" not in git(finished, "worktree", "list")
    coder_dir = finished / ".coder"
    assert not any(
        (coder_dir / d / name).exists()
        for d, name in [
            ("state", "h1.json"),
            ("tasks", "h1.json"),
            ("logs", "h1.jsonl"),
            ("artifacts", "h1"),
            ("worktrees", "h1"),
        ]
    )
    assert "No runs yet" in coder(finished, "status")[1]


def test_clean_delete_branch(finished: Path) -> None:
    code, out, _ = coder(finished, "clean", "-t", "h1", "--delete-branch", "--json")
    assert code == 0 and json.loads(out)["branch_deleted"] is True
    assert git(finished, "branch", "--list", "agent/*") == ""


def test_clean_refuses_a_running_task(finished: Path) -> None:
    before = sorted(
        p.relative_to(finished) for p in (finished / ".coder").rglob("*") if "locks" not in p.parts
    )
    with TaskLock(finished / ".coder", "h1"):
        code, _, err = coder(finished, "clean", "-t", "h1")
    assert code == 3 and "run h1 is running" in err and "coder stop -t h1" in err
    after = sorted(
        p.relative_to(finished) for p in (finished / ".coder").rglob("*") if "locks" not in p.parts
    )
    assert after == before
