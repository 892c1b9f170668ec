"""A run opened through one door (coder.run.opened): every command that works on one run finds,
locks and reads it the same way, and refuses the same way, changing nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from coder.run.lock import TaskLock, read_lock_owner
from tests.conftest import coder, git
from tests.helpers import taskfile

TASK = """
    id: d1
    title: Door demo
    graph:
      - {id: a, kind: shell, cmd: "echo one > one.txt"}
      - {id: b, kind: shell, cmd: "echo two > two.txt", depends_on: [a]}
"""

# Each command that opens one run, with what it takes besides `-t d1`.
COMMANDS = [
    ("merge",),
    ("revert", "--to-step", "a"),
    ("fork", "--at", "b"),
    ("push",),
    ("report",),
    ("show",),
]


@pytest.fixture
def finished(make_repo) -> Path:
    repo = make_repo()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out + err
    return repo


KEPT = {"locks", "logs", "cache"}  # what a refusal may write: its lock, its event, a cache


def on_disk(repo: Path) -> dict[str, str]:
    """Every ref, and every file under `.coder/` (the run's worktree too) but those a refusal
    may write (`KEPT`), each with a digest of its bytes."""
    found = {"refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)")}
    for path in sorted((repo / ".coder").rglob("*")):
        if path.is_file() and path.relative_to(repo / ".coder").parts[0] not in KEPT:
            found[str(path.relative_to(repo))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_run_without_its_checkpoint_is_refused_alike_by_every_command(
    finished: Path, command: tuple[str, ...]
) -> None:
    (finished / ".coder" / "state" / "d1.json").unlink()
    before = on_disk(finished)
    code, out, err = coder(finished, command[0], "-t", "d1", *command[1:])
    assert code == 3, out + err
    assert "run d1 has no state file" in err and "`coder resume -t d1` rebuilds it" in err, err
    assert "Traceback" not in out + err
    assert on_disk(finished) == before
    assert read_lock_owner(finished / ".coder", "d1") is None  # released on the refusal
    with TaskLock(finished / ".coder", "d1"):
        pass


def test_commits_coder_did_not_make_are_refused_alike_by_merge_and_revert(
    finished: Path,
) -> None:
    worktree = finished / ".coder" / "worktrees" / "d1"
    (worktree / "mine.txt").write_text("by hand\n")
    git(worktree, "add", "mine.txt")
    git(worktree, "commit", "-q", "-m", "by hand")
    mine = git(finished, "rev-parse", "--short=8", "agent/d1-door-demo").strip()
    before = on_disk(finished)
    for command in (("merge",), ("revert", "--to-step", "a")):
        code, out, err = coder(finished, command[0], "-t", "d1", *command[1:])
        assert code == 3, out + err
        assert f"branch agent/d1-door-demo has commits coder did not make ({mine})" in err, err
        assert on_disk(finished) == before, command
