"""A start that fails leaves nothing behind; `clean` never deletes uncommitted work unasked;
`validate` holds a branch name to git's own rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentProblem
from tests.conftest import coder, git
from tests.fake_ollama import FakeOllama
from tests.helpers import taskfile

SHELL = """
    id: fs
    title: failed start
    graph:
      - {id: s1, kind: shell, cmd: "echo one > one.txt"}
"""


def leftovers(repo: Path, task_id: str) -> list[str]:
    """Everything a run of `task_id` could have left: files under .coder/, worktrees, branches."""
    coder_dir = repo / ".coder"
    found = [
        str(p.relative_to(coder_dir))
        for p in coder_dir.rglob("*")
        if task_id in p.name and p.is_file() or p.parent.name == task_id
    ]
    found += [line for line in git(repo, "worktree", "list").splitlines() if task_id in line]
    return found + git(repo, "branch", "--list", f"agent/{task_id}*").split()


def test_a_start_that_fails_removes_what_it_created(make_repo) -> None:
    repo = make_repo()
    (repo / ".coder" / "worktrees").mkdir(parents=True)
    (repo / ".coder" / "worktrees" / "fs").write_text("in the way\n")
    path = taskfile(repo, SHELL)
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == EXIT_ENVIRONMENT, out + err
    assert "cannot create worktree at" in err and "a file is there" in err
    assert "Traceback" not in err
    assert leftovers(repo, "fs") == ["worktrees/fs"]  # only the user's file
    assert coder(repo, "status")[1].startswith("No runs yet")

    (repo / ".coder" / "worktrees" / "fs").unlink()
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err


def test_a_start_failing_after_its_branch_exists_removes_the_branch_too(
    fake: FakeOllama, sample: Path
) -> None:
    """The extra tools (external MCP servers) fail to start: manifest, checkpoint, branch,
    worktree, log and lock are all gone, and the same run can be started again."""
    from coder.run.drive import RunOptions
    from coder.run.start import start_run

    path = taskfile(
        sample,
        """
        id: mcpfail
        title: tools fail
        graph:
          - {id: s1, kind: edit, goal: "Add multiply(a, b) to calc.py"}
        """,
    )

    def attach(*args: object, **kwargs: object) -> None:
        assert git(sample, "branch", "--list", "agent/mcpfail*").strip()  # it got that far
        raise EnvironmentProblem("MCP server `github` exited before it answered")

    with pytest.raises(EnvironmentProblem, match="github"):
        start_run(path, cwd=sample, options=RunOptions(attach_tools=attach))
    assert leftovers(sample, "mcpfail") == []
    assert not (sample / ".coder" / "tasks" / "mcpfail.json").exists()


def test_a_start_refused_before_it_creates_anything_leaves_no_lock_file(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model server answers (checked before the run's files exist), or the branch is
    taken: the lock file taken for the checks goes too."""
    import socket

    repo = make_repo()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{port}")
    path = taskfile(repo, "id: nohost\ntitle: t\ngraph:\n  - {kind: edit, goal: add a file}\n")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == EXIT_ENVIRONMENT and "cannot reach Ollama" in err, out + err
    assert leftovers(repo, "nohost") == []

    git(repo, "branch", "agent/taken")
    path = taskfile(repo, SHELL.replace("id: fs\n", "id: taken\n    branch: agent/taken\n"))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == EXIT_USAGE and "branch agent/taken already exists" in err, out + err
    assert leftovers(repo, "taken") == ["agent/taken"]  # the user's branch stays


def test_an_invalid_branch_name_is_caught_by_validate_and_run(make_repo) -> None:
    """`agent/x..y` matches the schema's pattern; git refuses it."""
    repo = make_repo()
    path = taskfile(repo, SHELL.replace("id: fs\n", "id: fixme\n    branch: agent/x..y\n"))
    code, out, _ = coder(repo, "validate", "-f", str(path))
    assert code == EXIT_USAGE
    assert "branch: 'agent/x..y' is not a valid git branch name" in out
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == EXIT_USAGE and "not a valid git branch name" in err
    assert leftovers(repo, "fixme") == []


def test_clean_refuses_uncommitted_changes_unless_forced(make_repo) -> None:
    repo = make_repo()
    assert coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SHELL)))[0] == 0
    worktree = repo / ".coder" / "worktrees" / "fs"
    (worktree / "one.txt").write_text("my edit\n")
    (worktree / "notes.md").write_text("mine\n")
    code, out, err = coder(repo, "clean", "-t", "fs")
    assert code == EXIT_ENVIRONMENT, out + err  # as resume and revert refuse the same worktree
    assert "has uncommitted changes (notes.md, one.txt); cleaning would delete them" in err
    assert "--force" in err
    assert (worktree / "notes.md").read_text() == "mine\n"
    assert (repo / ".coder" / "tasks" / "fs.json").exists()

    code, out, err = coder(repo, "clean", "-t", "fs", "--force")
    assert code == 0, out + err
    assert "Discarded uncommitted changes: notes.md, one.txt." in out
    assert not worktree.exists()
    assert leftovers(repo, "fs") == ["agent/fs-failed-start"]  # unmerged: the branch stays


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 100_000, "nesting is too deep"),
        ("[1]", "not a JSON object"),
        ('{"task_id": "fs"}', "its base is missing"),
        ("{", "Expecting property name"),
    ],
)
def test_a_corrupt_manifest_is_named_and_clean_still_removes_the_run(
    make_repo, text: str, reason: str
) -> None:
    """`.coder/tasks/ID.json` edited or torn by hand: every command says which file and
    why (before: RecursionError, TypeError or KeyError tracebacks), and `clean`, which the
    hint offers, removes the run from its checkpoint."""
    repo = make_repo()
    assert coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SHELL)))[0] == 0
    (repo / ".coder" / "tasks" / "fs.json").write_text(text)
    for args in (["show", "-t", "fs"], ["resume", "-t", "fs"], ["merge", "-t", "fs"]):
        code, out, err = coder(repo, *args)
        assert code == EXIT_ENVIRONMENT, out + err
        assert err.startswith("coder: error: run file .coder/tasks/fs.json is corrupt (")
        assert reason in err
        assert "hint: restore the file, or remove the run with `coder clean -t fs`" in err
    code, out, err = coder(repo, "clean", "-t", "fs")
    assert code == 0, out + err
    assert "Kept branch agent/fs-failed-start" in out
    assert leftovers(repo, "fs") == ["agent/fs-failed-start"]


def test_clean_removes_a_branch_that_holds_nothing_so_the_taskfile_runs_again(make_repo) -> None:
    """A run whose only step failed made no commit: its branch is still at the base, and
    `clean` removes it with the rest, as the hint says; then the same taskfile runs."""
    repo = make_repo()
    failing = taskfile(repo, "id: bad\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'exit 1'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(failing))[0] == 1
    code, out, err = coder(repo, "clean", "-t", "bad")
    assert code == 0, err
    assert "Deleted branch agent/bad-t." in out
    assert git(repo, "branch", "--list", "agent/*") == ""
    assert coder(repo, "run", "--autonomous", "-f", str(failing))[0] == 1  # runs, fails again
    # a branch that holds a commit of the run is kept, as before
    path = taskfile(repo, SHELL)
    assert coder(repo, "run", "--autonomous", "-f", str(path))[0] == 0
    code, out, _ = coder(repo, "clean", "-t", "fs")
    assert "Kept branch agent/fs-failed-start" in out
    assert git(repo, "branch", "--list", "agent/fs-*").strip() == "agent/fs-failed-start"


def test_clean_all_delete_branch_takes_the_branch_of_a_run_without_commits_or_files(
    make_repo,
) -> None:
    """A run that stopped before its first commit, whose files under .coder/ were deleted:
    no commit names it, but git still has its worktree registered, and so its branch."""
    import shutil

    repo = make_repo()
    failing = taskfile(repo, "id: left\ntitle: t\ngraph:\n  - {kind: shell, cmd: 'exit 1'}\n")
    assert coder(repo, "run", "--autonomous", "-f", str(failing))[0] == 1
    git(repo, "branch", "agent/mine")  # the user's own, under the same prefix: stays
    shutil.rmtree(repo / ".coder")
    code, out, err = coder(repo, "clean", "--all", "--delete-branch")
    assert code == 0, err
    assert "Removed run left and branch agent/left-t." in out
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["agent/mine", "main"]
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
