"""`refs/stash` is the repository's, shared by all its worktrees. With `sandbox: off` a step's
`git stash` writes it, and the user's next `git stash pop` would apply the agent's work: the
git guard fails the step and drops the entries the step added, never a stash of the user's.
Real runs of `coder` (no sandbox), checked with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import coder, git
from tests.helpers import state_of, taskfile

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
