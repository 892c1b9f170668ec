"""Submodules in a run's worktree: checked out at their recorded commit from the user's own
copy (no network), so steps see their files; a step that changes one fails (coder would not
commit that work); a submodule the checkout lacks refuses the run up front, naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import coder, git

pytestmark = pytest.mark.usefixtures("scan")  # each test with both ways of staging


def with_submodule(tmp_path: Path, make_repo) -> Path:
    lib = make_repo({"lib.txt": "lib\n"}, name="lib")
    repo = make_repo({"README.md": "# r\n"}, name="repo")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(repo, "commit", "-q", "-m", "add the submodule")
    return repo


def with_nested_submodule(tmp_path: Path, make_repo) -> Path:
    """repo -> vendor/lib (a submodule) -> deps/inner (its own submodule)."""
    inner = make_repo({"inner.txt": "inner\n"}, name="inner")
    lib = make_repo({"lib.txt": "lib\n"}, name="lib")
    allow = ("-c", "protocol.file.allow=always")
    git(lib, *allow, "submodule", "add", "-q", str(inner), "deps/inner")
    git(lib, "commit", "-q", "-m", "add the nested submodule")
    repo = make_repo({"README.md": "# r\n"}, name="repo")
    git(repo, *allow, "submodule", "add", "-q", str(lib), "vendor/lib")
    git(repo, *allow, "submodule", "update", "-q", "--init", "--recursive")
    git(repo, "commit", "-q", "-m", "add the submodule")
    return repo


def run(repo: Path, cmd: str, task_id: str = "sm") -> tuple[int, str, str]:
    path = repo.parent / f"{task_id}.yaml"
    step = {"kind": "shell", "cmd": cmd}
    path.write_text(f"id: {task_id}\ntitle: t\ngraph:\n  - {json.dumps(step)}\n")
    return coder(repo, "run", "--autonomous", "-f", str(path))


def test_a_step_sees_the_submodules_files(tmp_path: Path, make_repo) -> None:
    repo = with_submodule(tmp_path, make_repo)
    code, out, err = run(repo, "cat vendor/lib/lib.txt > copy.txt")
    assert code == 0, out + err
    assert git(repo, "show", "agent/sm-t:copy.txt") == "lib\n"
    # the submodule's commit is what the superproject records, and the user's copy is untouched
    worktree = repo / ".coder" / "worktrees" / "sm"
    recorded = git(repo, "rev-parse", "HEAD:vendor/lib").strip()
    assert git(worktree / "vendor" / "lib", "rev-parse", "HEAD").strip() == recorded
    assert git(repo, "status", "--porcelain") == ""


def test_a_step_that_changes_a_submodule_fails_instead_of_losing_the_work(
    tmp_path: Path, make_repo
) -> None:
    repo = with_submodule(tmp_path, make_repo)
    code, out, _ = run(repo, "echo new > vendor/lib/new.txt")
    assert code == 1
    assert "the step changed the submodule vendor/lib/; coder commits only this repository" in out
    assert git(repo, "rev-list", "--count", "main..agent/sm-t") == "0\n"
    worktree = repo / ".coder" / "worktrees" / "sm"
    assert not (worktree / "vendor" / "lib" / "new.txt").exists()  # discarded with the step


def test_a_submodule_the_checkout_lacks_refuses_the_run_up_front(tmp_path: Path, make_repo) -> None:
    origin = with_submodule(tmp_path, make_repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))  # without --recurse-submodules
    code, _, err = run(clone, "true")
    assert code == 3
    assert err.splitlines()[:2] == [
        f"coder: error: submodule vendor/lib at "
        f"{git(clone, 'rev-parse', 'HEAD:vendor/lib')[:12]} is not in your checkout {clone}: "
        "coder copies submodules from there into its worktree (it never fetches)",
        "  hint: run `git submodule update --init vendor/lib`, then run coder again",
    ]
    assert git(clone, "branch", "--list", "agent/*") == ""
    assert not (clone / ".coder" / "worktrees" / "sm").exists()


def test_a_nested_submodule_is_checked_out_too(tmp_path: Path, make_repo) -> None:
    repo = with_nested_submodule(tmp_path, make_repo)
    code, out, err = run(repo, "cat vendor/lib/deps/inner/inner.txt > copy.txt")
    assert code == 0, out + err
    assert git(repo, "show", "agent/sm-t:copy.txt") == "inner\n"
    nested = repo / ".coder" / "worktrees" / "sm" / "vendor" / "lib" / "deps" / "inner"
    recorded = git(repo / "vendor" / "lib", "rev-parse", "HEAD:deps/inner").strip()
    assert git(nested, "rev-parse", "HEAD").strip() == recorded
    assert git(repo, "status", "--porcelain") == ""


def test_a_step_that_changes_a_nested_submodule_fails_and_is_discarded(
    tmp_path: Path, make_repo
) -> None:
    repo = with_nested_submodule(tmp_path, make_repo)
    code, out, _ = run(repo, "echo new > vendor/lib/deps/inner/new.txt")
    assert code == 1
    assert "the step changed the submodule vendor/lib/deps/inner/; coder commits only" in out
    assert "submodule vendor/lib/;" not in out  # only the one that changed is named
    nested = repo / ".coder" / "worktrees" / "sm" / "vendor" / "lib" / "deps" / "inner"
    assert not (nested / "new.txt").exists()
    assert (nested / "inner.txt").read_text() == "inner\n"  # still checked out


def test_a_nested_submodule_the_checkout_lacks_refuses_the_run(tmp_path: Path, make_repo) -> None:
    origin = with_nested_submodule(tmp_path, make_repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    allow = ("-c", "protocol.file.allow=always")
    git(clone, *allow, "submodule", "update", "-q", "--init", "vendor/lib")  # not --recursive
    code, _, err = run(clone, "true")
    assert code == 3
    assert "submodule vendor/lib/deps/inner at " in err
    assert "hint: run `git submodule update --init --recursive`, then run coder again" in err
    assert git(clone, "branch", "--list", "agent/*") == ""
