"""kill -9 in the newest commands (issue 34): `resume --note`, `fork --note` and `push`, each
killed at every durable write with the test-only crash hook (coder/crashpoints.py), then
carried on as a user would (the same command again, `resume`, or the hint coder gave); and a
fork whose `.coder/` was deleted, rebuilt from its trailers.

Judged by git (the trailers on the step commits, the remote's refs, `fsck`), the files under
`.coder/` and what reached the (fake) model, never by coder's own messages: a note is
recorded before the command acts and exactly once (by content and step), and `push` knows
what it pushed even when it was killed before it could say so.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import coder as cli
from tests.conftest import git
from tests.fake_ollama import FakeOllama
from tests.helpers import call, chat_requests, manifest_of, state_of, taskfile
from tests.run.test_crash import coder, out
from tests.run.test_notes import BRANCH, NOTE, TASK, edit_calc, failed_run, trailers
from tests.services.test_fork import TASK as FORK_TASK
from tests.services.test_push import BRANCH as PUSH_BRANCH
from tests.services.test_push import remote_ref, run_with_remote

KILLED = -signal.SIGKILL
READS = [call("fs_read", path="README.md"), call("fs_read", path="calc.py")]


def fsck(repo: Path) -> None:
    found = subprocess.run(
        ["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True, text=True, check=False
    )
    assert found.returncode == 0 and not found.stdout.strip(), found.stdout + found.stderr


def notes_sent(fake: FakeOllama, since: int = 0) -> list[int]:
    """How many times the note is in each model request since request `since`."""
    return [json.dumps(r["messages"]).count(NOTE) for r in chat_requests(fake)[since:]]


# --- resume --note ---------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["checkpoint", "before_step@s2", "after_commit@s2"])
def test_resume_note_run_again_after_a_kill_records_the_note_once(
    fake: FakeOllama, sample: Path, at: str
) -> None:
    """Before: the note was recorded twice (two `Coder-Note` trailers on s2's commit, the
    model told twice). Killed while recording it (`checkpoint`), before s2 ran, or after s2
    committed, the same command again records and sends it once."""
    failed_run(fake, sample)
    asked = len(chat_requests(fake))
    fake.enqueue(*edit_calc())  # the killed command's, or else the next one's
    killed = coder(sample, "resume", "-t", "steer", "--note", NOTE, crash=at)
    assert killed.returncode == KILLED, out(killed)
    code, stdout, stderr = cli(sample, "resume", "-t", "steer", "--note", NOTE)
    assert code == 0, stdout + stderr
    [note] = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert (note["text"], note["via"], note["attempt"]) == (NOTE, "resume", 2)
    assert trailers(sample, "s2") == [f"Coder-Note: {NOTE}"]
    assert set(notes_sent(fake, asked)) <= {1}
    if at != "checkpoint":
        assert "step s2 has that note already; it is kept once" in stderr
    fsck(sample)


def test_the_same_note_after_a_failed_attempt_is_kept_once_and_another_is_added(
    fake: FakeOllama, sample: Path
) -> None:
    """Idempotent by content and step, not by command: the note given again after the
    attempt it reached failed adds nothing; a different note is added."""
    failed_run(fake, sample)
    fake.enqueue(*READS)  # the attempt fails again: max_turns
    code, out_, err = cli(sample, "resume", "-t", "steer", "--note", NOTE)
    assert code == 1, out_ + err
    fake.enqueue(*READS)
    code, out_, err = cli(sample, "resume", "-t", "steer", "--note", NOTE)
    assert code == 1 and "step s2 has that note already" in err, out_ + err
    fake.enqueue(*edit_calc())
    code, out_, err = cli(sample, "resume", "-t", "steer", "--note", "and keep it short")
    assert code == 0, out_ + err
    notes = state_of(sample, "steer")["steps"]["s2"]["notes"]
    assert [(n["text"], n["attempt"]) for n in notes] == [(NOTE, 2), ("and keep it short", 4)]
    assert trailers(sample, "s2") == [f"Coder-Note: {NOTE}", "Coder-Note: and keep it short"]


# --- fork --note -----------------------------------------------------------------------------

FORK = "steer-fork-1"
FORK_BRANCH = "agent/steer-fork-1-add-mul"


def finished_run(fake: FakeOllama, repo: Path) -> None:
    """Run `steer` to the end: s2 writes mul.py."""
    fake.enqueue(*edit_calc())
    code, out_, err = cli(repo, "run", "--autonomous", "-f", str(taskfile(repo, TASK)))
    assert code == 0, out_ + err


def resume_as_told(repo: Path, *fork_again: str) -> None:
    """`coder resume -t FORK`, and where it refuses, what it says to do: no such run (the
    fork was killed before it existed) is forked again; a branch gone is restored with the
    `git branch` it names."""
    code, out_, err = cli(repo, "resume", "-t", FORK)
    if code == 2 and f"no task '{FORK}'" in err:
        code, out_, err = cli(repo, *fork_again)
        assert code == 0, out_ + err
        code, out_, err = cli(repo, "resume", "-t", FORK)
    elif code == 3 and "git branch" in err:
        restore = re.search(r"`git branch (\S+) ([0-9a-f]+)`", err)
        assert restore, err
        git(repo, "branch", restore[1], restore[2])
        code, out_, err = cli(repo, "resume", "-t", FORK)
    assert code == 0, out_ + err


@pytest.mark.parametrize("step", ["s1", "s2"])
@pytest.mark.parametrize("at", ["checkpoint#1", "checkpoint#2"])
def test_fork_note_survives_a_kill_at_every_write_of_the_fork(
    fake: FakeOllama, sample: Path, at: str, step: str
) -> None:
    """Before: killed after its branch and worktree were made, before its checkpoint, the
    fork was resumed from a state rebuilt without the note: the model never saw it and the
    commit had no `Coder-Note` (and nothing said so). The manifest and the checkpoint, note
    included, are now the fork's first writes (killed between them, the fork was never made:
    resume says so and it is forked again): killed at any write, the note reaches s2 of the
    fork once (a fork at s1 copies no commit: its branch is restored where the run started)."""
    finished_run(fake, sample)
    asked = len(chat_requests(fake))
    fork = ("fork", "-t", "steer", "--at", step, "--note", NOTE)
    killed = coder(sample, *fork, crash=at)
    assert killed.returncode == KILLED, out(killed)
    fake.enqueue(*edit_calc())
    resume_as_told(sample, *fork)
    [note] = state_of(sample, FORK)["steps"]["s2"]["notes"]
    assert (note["text"], note["via"]) == (NOTE, "fork")
    assert trailers(sample, "s2", FORK_BRANCH) == [f"Coder-Note: {NOTE}"]
    assert notes_sent(fake, asked) and set(notes_sent(fake, asked)) == {1}
    assert git(sample, "show", f"{FORK_BRANCH}:mul.py") == git(sample, "show", f"{BRANCH}:mul.py")
    fsck(sample)


# --- push ------------------------------------------------------------------------------------


@pytest.fixture
def setup(make_repo: Any, tmp_path: Path) -> tuple[Path, Path, Path]:
    return run_with_remote(make_repo, tmp_path)


@pytest.mark.parametrize("later", ["step", "revert"])
@pytest.mark.parametrize("at", ["checkpoint#1", "checkpoint#2"])
def test_a_push_killed_at_any_write_is_known_to_the_next_push(
    setup: tuple[Path, Path, Path], at: str, later: str
) -> None:
    """Before: a push killed after git pushed, before the state said so, left the remote
    branch at a commit coder did not know it had put there; the next push, after a new step
    or a `revert --mode reset`, was refused as "someone else pushed". A push is now recorded
    before it is made and checked against the remote after: the next one replaces it."""
    repo, remote, path = setup
    if later == "revert":
        code, out_, err = cli(repo, "push", "-t", "pr")
        assert code == 0, out_ + err
        fix_step_two(repo, path)
    killed = coder(repo, "push", "-t", "pr", crash=at)
    assert killed.returncode == KILLED, out(killed)
    if later == "revert":
        code, out_, err = cli(repo, "revert", "-t", "pr", "--to-step", "s1", "--mode", "reset")
    else:
        fix_step_two(repo, path)
    tip = git(repo, "rev-parse", PUSH_BRANCH).strip()
    code, out_, err = cli(repo, "push", "-t", "pr", "--json")
    assert code == 0, out_ + err
    assert remote_ref(remote, f"refs/heads/{PUSH_BRANCH}") == tip
    record = state_of(repo, "pr")
    assert record["pushed"]["commit"] == tip and "pushing" not in record
    fsck(repo)


def fix_step_two(repo: Path, path: Path) -> None:
    """s2 passes now: resume takes the edited taskfile and commits it (the branch moves on)."""
    path.write_text(path.read_text().replace("exit 1", "echo two > b.txt"))
    code, out_, err = cli(repo, "resume", "-t", "pr", "--taskfile")
    assert code == 0, out_ + err


# --- a fork whose .coder/ is gone ------------------------------------------------------------


@pytest.fixture
def finished(make_repo: Any) -> Path:
    """Run `rv` (four shell steps, each a commit) run to the end; its taskfile beside it."""
    repo = make_repo({"README.md": "# r\n"})
    code, out_, err = cli(repo, "run", "--autonomous", "-f", str(taskfile(repo, FORK_TASK)))
    assert code == 0, out_ + err
    return repo


@pytest.mark.parametrize(
    ("forks", "resumed", "at"),
    [
        ([("rv", "s3")], False, "s3"),  # two copied commits, nothing of its own
        ([("rv", "s3")], True, "s3"),  # the copies and its own s3, s4
        # a fork of a fork at s4 of one that copied s1 only: s2 is the first step it lacks
        ([("rv", "s2"), ("rv-fork-1", "s4")], False, "s2"),
        ([("rv", "s1")], True, None),  # no copy: only its id says whose fork it is
    ],
)
def test_a_fork_is_rebuilt_from_its_trailers_after_coder_dir_is_deleted(
    finished: Path, forks: list[tuple[str, str]], resumed: bool, at: str | None
) -> None:
    """Before: `resume -t FORK -f TASKFILE`, as the hint says, refused the taskfile (it names
    the run the fork was made from), so a fork could not be rebuilt. Its copied commits'
    trailers say whose fork it is and where it began (`Coder-Task`, `Coder-Forked-From`):
    resume rebuilds it from the first parent's taskfile and finishes it. The fork point is
    the first step the copies do not hold (the step it was forked at, or an earlier one
    its parent had not committed)."""
    repo, path = finished, finished.parent / "task.yaml"
    for parent, step in forks:
        code, out_, err = cli(repo, "fork", "-t", parent, "--at", step)
        assert code == 0, out_ + err
    fork = f"{forks[-1][0]}-fork-1"
    if resumed:
        code, out_, err = cli(repo, "resume", "-t", fork)
        assert code == 0, out_ + err
    before = fork_state(repo, fork)
    branch = before["branch"]
    commits_before = git(repo, "rev-list", branch)
    shutil.rmtree(repo / ".coder")

    code, out_, err = cli(repo, "resume", "-t", fork)
    assert code == 3 and f"`coder resume -t {fork} -f " in err, out_ + err
    code, out_, err = cli(repo, "resume", "-t", fork, "-f", str(path))
    assert code == 0, out_ + err
    assert f"rebuilt it from {path}" in err
    after = fork_state(repo, fork)
    assert after["status"] == "success" and after["branch"] == branch
    assert git(repo, "rev-list", branch).endswith(commits_before)  # nothing of it lost
    assert tree(repo, branch) == tree(repo, "agent/rv-fork-demo")  # all of it done
    steps = [s for _, s in branch_steps(repo, branch)]
    assert steps == ["s1", "s2", "s3", "s4"]
    if at is None:  # nothing on the branch names a parent
        assert after["parent"] is None and after["forked_at"] is None
    else:
        assert after["parent"] == forks[-1][0]
        assert after["forked_at"] == {"step": at, "commit": before["forked_at"]["commit"]}
        [row] = status_rows(repo)
        assert (row["id"], row["parent"], row["status"]) == (fork, forks[-1][0], "success")
    fsck(repo)


def fork_state(repo: Path, task_id: str) -> dict[str, Any]:
    manifest = manifest_of(repo, task_id)
    return {
        "status": state_of(repo, task_id)["status"],
        **{k: manifest.get(k) for k in ("branch", "parent", "forked_at")},
    }


def tree(repo: Path, rev: str) -> str:
    return git(repo, "rev-parse", f"{rev}^{{tree}}").strip()


def branch_steps(repo: Path, branch: str) -> list[tuple[str, str]]:
    log = git(repo, "log", "--reverse", "--format=%H %(trailers:key=Coder-Step,valueonly)", branch)
    return [tuple(line.split()) for line in log.splitlines() if len(line.split()) == 2]  # type: ignore[misc]


def status_rows(repo: Path) -> list[dict[str, Any]]:
    code, out_, err = cli(repo, "status", "--json")
    assert code == 0, out_ + err
    return list(json.loads(out_))
