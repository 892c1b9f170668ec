"""The step commit never goes through HEAD (RELIABILITY.md row 31): coder moves the run's
branch by name, with a compare-and-swap on its expected tip, and a worktree whose HEAD no
longer names that branch is an environment problem (exit 3): nothing lands anywhere, the
user's `main` least of all, and `coder resume` points the HEAD back and goes on.

The HEAD is flipped where no git guard looks: by a process while the runner is down, and by
a parallel step (sandbox off) in the run's own worktree, which only the landing of the
level's commits reads. Judged with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder.errors import EXIT_ENVIRONMENT
from coder.policy import kernel
from tests.conftest import git
from tests.helpers import coder_cli, state_of, taskfile

BRANCH = "agent/flip"


def admin_head(repo: Path) -> Path:
    return repo / ".git" / "worktrees" / "flip" / "HEAD"


def steps_on_branch(repo: Path) -> list[str]:
    """The Coder-Step trailer of each commit in main..BRANCH, oldest first."""
    log = git(
        repo, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}"
    )
    return [line for line in log.splitlines() if line.strip()]


def flip_task(repo: Path, first: str) -> Path:
    return taskfile(
        repo,
        f"""
        id: flip
        branch: {BRANCH}
        title: flip the head
        graph:
          - {{id: s1, kind: shell, cmd: {json.dumps(first)}, depends_on: []}}
          - {{id: s2, kind: shell, cmd: "echo two > two.txt", depends_on: []}}
        """,
    )


@pytest.mark.skipif(not kernel.support().available, reason="no kernel sandbox here")
def test_a_head_flipped_while_the_runner_was_down_is_pointed_back_by_resume(make_repo) -> None:
    """The runner dies after s1's checks, before its commit; a process left behind points the
    worktree's HEAD at main. Resume reruns s1 from a guard taken with HEAD already at main:
    its commit must still land on the run's branch, never on main."""
    repo = make_repo({"README.md": "# r\n"})
    main = git(repo, "rev-parse", "main")
    path = flip_task(repo, "echo one > one.txt")
    crashed = coder_cli(repo, "run", "--autonomous", "-f", str(path), crash="after_checks@s1")
    assert crashed.returncode < 0, crashed.stderr  # killed by the hook
    admin_head(repo).write_text("ref: refs/heads/main\n")

    resumed = coder_cli(repo, "resume", "-t", "flip")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "HEAD" in resumed.stdout + resumed.stderr  # resume says it pointed it back
    assert git(repo, "rev-parse", "main") == main
    assert steps_on_branch(repo) == ["s1", "s2"]
    assert admin_head(repo).read_text() == f"ref: refs/heads/{BRANCH}\n"
    worktree = repo / ".coder" / "worktrees" / "flip"
    assert git(worktree, "status", "--porcelain") == ""
    assert git(repo, "status", "--porcelain") == ""


def test_a_step_that_points_the_runs_head_at_main_lands_nothing(make_repo, tmp_path) -> None:
    """Two parallel steps work in scratch worktrees; s1 (sandbox off, so it can) points the
    run's worktree's HEAD at main, which its own guard does not watch. Landing the level's
    commits then finds HEAD naming main: the run stops as an environment problem, main and
    the run's branch are as they were, and resume (HEAD pointed back) finishes the run."""
    repo = make_repo({"README.md": "# r\n"})
    main = git(repo, "rev-parse", "main")
    once = tmp_path / "flipped-once"
    flip = (
        f"echo one > one.txt && if [ ! -e {once} ]; then touch {once} && "
        'echo "ref: refs/heads/main" > "$(git rev-parse --path-format=absolute '
        '--git-common-dir)/worktrees/flip/HEAD"; fi'
    )
    path = flip_task(repo, flip)
    run = coder_cli(
        repo, "run", "--autonomous", "--no-sandbox", "--max-parallel", "2", "-f", str(path)
    )

    assert run.returncode == EXIT_ENVIRONMENT, run.stdout + run.stderr
    assert git(repo, "rev-parse", "main") == main
    assert git(repo, "rev-parse", BRANCH) == main  # nothing landed on the run's branch either
    state = state_of(repo, "flip")
    assert state["status"] == "error"
    assert f"names refs/heads/main, not the run's branch {BRANCH}" in state["error"]
    assert "refs/heads/main" in run.stderr

    resumed = coder_cli(repo, "resume", "-t", "flip", "--no-sandbox")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert git(repo, "rev-parse", "main") == main
    assert steps_on_branch(repo) == ["s1", "s2"]
    assert admin_head(repo).read_text() == f"ref: refs/heads/{BRANCH}\n"
    assert git(repo, "status", "--porcelain") == ""


def test_a_step_that_makes_the_runs_branch_a_symbolic_ref_to_main_lands_nothing(
    make_repo,
) -> None:
    """With the sandbox off a step can write the repository's refs: its run's branch made a
    symbolic ref to main would have the commit follow it there (HEAD still names the
    branch). The step errs instead: main and the branch file are as the step left them."""
    repo = make_repo({"README.md": "# r\n"})
    main = git(repo, "rev-parse", "main")
    symbolic = (
        'echo one > one.txt && echo "ref: refs/heads/main" > '
        f'"$(git rev-parse --path-format=absolute --git-common-dir)/refs/heads/{BRANCH}"'
    )
    run = coder_cli(
        repo, "run", "--autonomous", "--no-sandbox", "-f", str(flip_task(repo, symbolic))
    )
    assert run.returncode == EXIT_ENVIRONMENT, run.stdout + run.stderr
    assert git(repo, "rev-parse", "main") == main
    assert f"branch '{BRANCH}' was made a symbolic ref to refs/heads/main" in run.stderr
    assert git(repo, "log", "--format=%H", "main") == main  # no commit of the step on main
