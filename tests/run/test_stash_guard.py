"""`refs/stash` is the repository's, shared by all its worktrees. With `sandbox: off` a step's
`git stash` writes it, and the user's next `git stash pop` would apply the agent's work: the
git guard fails the step and drops the entries the step added, never a stash of the user's.
Real runs of `coder` (no sandbox), checked with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coder.git.guard import GitGuard
from tests.conftest import coder, git
from tests.helpers import at_once, level_worktrees, state_of, taskfile

pytestmark = pytest.mark.usefixtures("scan")  # each test with both ways of staging


def user_repo(make_repo: Any) -> Path:
    """A repo on main with one stash of the user's already in refs/stash."""
    repo = make_repo({"work.txt": "committed\n", "README.md": "# r\n"})
    (repo / "work.txt").write_text("the user's stashed edit\n")
    git(repo, "stash", "push", "-q", "-m", "users own stash")
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("/.coder/\n")
    return repo


def stashes(repo: Path) -> list[str]:
    """`git stash list` as (commit id, message) lines, newest first."""
    return git(repo, "stash", "list", "--format=%H %gs").splitlines()


def run_shell(repo: Path, cmd: str) -> tuple[int, dict[str, Any]]:
    path = taskfile(
        repo,
        f"""
        id: st
        title: stash
        graph:
          - {{id: s1, kind: shell, cmd: {json.dumps(cmd)}}}
        """,
    )
    code, _out, _err = coder(repo, "run", "--autonomous", "--no-sandbox", "-f", str(path))
    return code, state_of(repo, "st")["steps"]["s1"]


def test_a_stash_the_step_made_is_dropped_and_fails_the_step(make_repo) -> None:
    repo = user_repo(make_repo)
    before = stashes(repo)
    code, step = run_shell(repo, "echo agent >> README.md && git stash -q && echo done")
    assert code == 1, step
    assert step["status"] == "failed"
    error = step["error"]
    assert "the step added stash entry 'WIP on agent/st-stash: " in error, error
    assert "shared refs/stash" in error and "coder dropped it" in error
    assert stashes(repo) == before  # the user's stash is still stash@{0}
    git(repo, "stash", "pop", "-q")  # and pops the user's work, not the agent's
    assert (repo / "work.txt").read_text() == "the user's stashed edit\n"
    assert (repo / "README.md").read_text() == "# r\n"


def test_a_stash_not_made_in_the_steps_worktree_is_kept_with_the_drop_command(
    make_repo,
) -> None:
    """A new entry made elsewhere (here: in the user's checkout, as the user could while the
    step ran) may be the user's: it stays, and the step fails naming the exact command; the
    step's own entry, made after it, is still dropped."""
    repo = user_repo(make_repo)
    (repo / "notes.txt").write_text("the user's next edit\n")
    git(repo, "add", "notes.txt")
    cmd = (
        f"git -C {json.dumps(str(repo))} stash push -q -m elsewhere"
        " && echo agent >> README.md && git stash -q"
    )
    code, step = run_shell(repo, cmd)
    assert code == 1, step
    error = step["error"]
    assert "coder dropped it" in error, error
    assert (
        "stash entry stash@{0} ('On main: elsewhere') was added to the repository's shared "
        "refs/stash while the step ran" in error
    )
    assert "`git stash drop stash@{0}`" in error
    listed = [line.split(" ", 1)[1] for line in stashes(repo)]
    assert listed == ["On main: elsewhere", "On main: users own stash"]


def test_a_stash_made_by_a_step_of_a_parallel_level_is_dropped(make_repo) -> None:
    """A step beside others works in a scratch worktree, its HEAD detached: `git stash` names
    its entry "WIP on (no branch)", and it is still the step's own, dropped."""
    repo = user_repo(make_repo)
    before = stashes(repo)
    path = taskfile(
        repo,
        """
        id: st
        title: stash
        policies: {max_parallel: 2}
        graph:
          - {id: a, kind: shell, cmd: "echo agent >> README.md && git stash -q", depends_on: []}
          - {id: b, kind: shell, cmd: "echo b > b.txt", depends_on: []}
        """,
    )
    code, _out, _err = coder(repo, "run", "--autonomous", "--no-sandbox", "-f", str(path))
    # Both scratch worktrees are detached at the same tip, so the entry's message ("WIP on (no
    # branch): TIP") fits either step: the guard whose check comes first after the stash claims
    # it (usually a's, b's when b ends while a stashes). Either way the run fails and the entry
    # is gone.
    steps = state_of(repo, "st")["steps"]
    failed = [steps[s] for s in ("a", "b") if steps[s]["status"] == "failed"]
    assert code == 1 and len(failed) == 1, steps
    error = failed[0]["error"]
    assert "the step added stash entry 'WIP on (no branch): " in error, error
    assert "coder dropped it" in error
    assert stashes(repo) == before


def test_steps_checked_at_once_drop_their_one_entry_never_the_users(make_repo) -> None:
    """The steps of a parallel level are checked in threads, both detached at one tip, so both
    claim the one new entry: dropped once, and the user's stash below it is kept. Raced
    directly, round after round (two drops of stash@{0} took the user's entry)."""
    repo = user_repo(make_repo)
    tip, trees = level_worktrees(repo)
    before = stashes(repo)
    for turn in range(40):
        guards = [GitGuard.take(repo / ".git", tree, head=("(no branch)", tip)) for tree in trees]
        (trees[turn % 2] / "README.md").write_text(f"agent {turn}\n")
        git(trees[turn % 2], "stash", "-q")
        problems = at_once(GitGuard.drop_stashes, guards)
        assert stashes(repo) == before, (turn, problems)
        assert sorted(map(len, problems)) == [0, 1], problems
        assert "coder dropped it" in max(problems, key=len)[0]


def test_an_entry_that_cannot_be_dropped_is_named_with_the_command(make_repo) -> None:
    """refs/stash held locked (a `git stash` of a command still running beside the step)
    past the retries: no traceback, the step's problem names the exact drop command."""
    repo = user_repo(make_repo)
    tip, [tree] = level_worktrees(repo, 1)
    guard = GitGuard.take(repo / ".git", tree, head=("(no branch)", tip))
    (tree / "README.md").write_text("agent\n")
    git(tree, "stash", "-q")
    after = stashes(repo)
    lock = repo / ".git" / "refs" / "stash.lock"
    lock.write_text("")
    try:
        problems = guard.drop_stashes()
    finally:
        lock.unlink()
    assert stashes(repo) == after  # nothing dropped, the user's entry still below
    assert len(problems) == 1, problems
    assert "coder could not drop it (refs/stash stayed locked)" in problems[0], problems
    assert "`git stash drop stash@{0}`" in problems[0]
    assert "'WIP on (no branch): " in problems[0]
