"""coder.git (repository, branches, worktrees, commits, diffs, ...) against real repositories,
checked with the real git CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pygit2
import pytest
from pygit2.enums import ConfigLevel

from coder.errors import BranchMoved, EnvironmentProblem, InvalidInput, RunFailed
from coder.git import branches, commits, diffs, repository, restore, workdir, worktrees
from tests.conftest import git

BRANCH = "agent/t1-demo"


@pytest.fixture
def files() -> dict[str, str]:
    return {
        "README.md": "# sample\n",
        "src/app.py": "print('hi')\n",
        "src/old.py": "x = 1\n",
        ".gitignore": "*.log\nbuild/\n",
    }


@pytest.fixture
def setup(make_repo, files):
    """A repo with coder's exclude in place and a worktree on a fresh agent branch."""
    root = make_repo(files)
    repo = repository.open_repo(root)
    repository.ensure_excluded(repo)
    base = branches.resolve_commit(repo, "main")
    wt = worktrees.create_worktree(
        repo, name="t1", path=root / ".coder" / "worktrees" / "t1", branch=BRANCH, start="main"
    )
    return root, repo, wt, base


def step(wt: Path, tip: str, step_id: str = "s1", *, task: str = "t1", attempt: int = 1) -> str:
    sha = commits.commit_step(
        wt,
        branch=BRANCH,
        task_id=task,
        step_id=step_id,
        attempt=attempt,
        title=f"{step_id}: work",
        expected_tip=tip,
    )
    assert sha is not None
    return sha


def tree_files(repo_dir: Path, rev: str = "HEAD") -> list[str]:
    return git(repo_dir, "ls-tree", "-r", "--name-only", rev).split()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a checkout outside .git/.coder, plus the index and HEAD bytes."""
    out = {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".coder")
    }
    for name in ("index", "HEAD", "refs/heads/main"):
        out[f".git/{name}"] = (root / ".git" / name).read_bytes()
    out["status"] = git(root, "--no-optional-locks", "status", "--porcelain").encode()
    return out


# --------------------------------------------------------------------------- opening


def test_open_repo_from_subdirectory_and_from_a_worktree(setup):
    root, _repo, wt, _ = setup
    sub = repository.open_repo(root / "src")
    assert repository.repo_root(sub) == root.resolve()
    inside = repository.open_repo(wt / "src")
    assert Path(inside.workdir).resolve() == wt.resolve()
    assert repository.repo_root(inside) == root.resolve()
    assert repository.common_dir(inside) == (root / ".git").resolve()
    assert repository.common_dir(sub) == (root / ".git").resolve()


def test_open_not_a_repository(tmp_path):
    with pytest.raises(EnvironmentProblem) as err:
        repository.open_repo(tmp_path)
    assert err.value.message == f"not a git repository: {tmp_path}"
    assert "git init" in err.value.hint
    assert err.value.exit_code == 3


def test_open_bare_repository(tmp_path):
    git(tmp_path, "init", "-q", "--bare", "b.git")
    with pytest.raises(EnvironmentProblem, match="bare repository"):
        repository.open_repo(tmp_path / "b.git")


def test_open_sha256_repository(tmp_path):
    try:
        git(tmp_path, "init", "-q", "--object-format=sha256", "s")
    except subprocess.CalledProcessError:
        pytest.skip("this git CLI cannot create sha256 repositories")
    with pytest.raises(EnvironmentProblem, match="uses sha256 object format, which libgit2"):
        repository.open_repo(tmp_path / "s")


def test_open_sparse_index_repository(make_repo):
    root = make_repo({"a/x": "1\n", "b/y": "2\n"})
    try:
        git(root, "sparse-checkout", "set", "--cone", "--sparse-index", "a")
    except subprocess.CalledProcessError:
        pytest.skip("this git CLI has no sparse index")
    with pytest.raises(EnvironmentProblem, match="sparse index") as err:
        repository.open_repo(root)
    assert "git sparse-checkout disable" in err.value.hint
    git(root, "sparse-checkout", "init", "--no-sparse-index")  # the other fix the hint offers
    assert branches.current_branch(repository.open_repo(root)) == "main"


# --------------------------------------------------------------------------- identity, refs


def test_current_branch(repo):
    assert branches.current_branch(repository.open_repo(repo)) == "main"
    git(repo, "switch", "-q", "-c", "feature/x")
    assert branches.current_branch(repository.open_repo(repo)) == "feature/x"


def test_current_branch_detached(repo):
    git(repo, "checkout", "-q", "--detach")
    with pytest.raises(EnvironmentProblem, match="detached") as err:
        branches.current_branch(repository.open_repo(repo))
    assert "check out a branch" in err.value.hint


def test_current_branch_unborn(tmp_path):
    git(tmp_path, "init", "-q", "-b", "trunk", "fresh")
    with pytest.raises(EnvironmentProblem, match="branch 'trunk' .* has no commits") as err:
        branches.current_branch(repository.open_repo(tmp_path / "fresh"))
    assert "commit something first" in err.value.hint


def test_identity_from_config(repo):
    who = repository.identity(repository.open_repo(repo))
    assert (who.author.name, who.author.email, who.fallback) == (
        "Test User",
        "test@example.com",
        False,
    )
    assert who.committer == who.author


def no_user_config(tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "empty-home"
    empty.mkdir()
    monkeypatch.setenv("HOME", str(empty))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(empty / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    paths = pygit2.settings.search_path
    paths[ConfigLevel.GLOBAL] = str(empty)  # restored by the libgit2_config fixture
    paths[ConfigLevel.XDG] = str(empty / ".config" / "git")


def test_identity_fallback_without_user_config(repo, tmp_path, monkeypatch):
    no_user_config(tmp_path, monkeypatch)
    who = repository.identity(repository.open_repo(repo))
    assert (who.author.name, who.author.email, who.fallback) == ("coder", "coder@localhost", True)


def test_identity_follows_git_environment_and_config_as_git_does(repo, tmp_path, monkeypatch):
    """GIT_AUTHOR_*/GIT_COMMITTER_* first (CI sets them; libgit2 ignores them), then
    author.*/committer.*, then user.*: a commit coder makes carries what `git commit` would."""
    no_user_config(tmp_path, monkeypatch)
    git(repo, "config", "user.name", "Config User")
    git(repo, "config", "user.email", "config@example.com")
    git(repo, "config", "committer.name", "Config Committer")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "CI Author")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "ci@example.com")
    who = repository.identity(repository.open_repo(repo))
    assert not who.fallback
    assert (who.author.name, who.author.email) == ("CI Author", "ci@example.com")
    assert (who.committer.name, who.committer.email) == ("Config Committer", "config@example.com")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="CI Author", GIT_AUTHOR_EMAIL="ci@example.com")
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, env=env, check=True
    )
    shown = git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>")
    assert shown.strip() == "CI Author <ci@example.com>|Config Committer <config@example.com>"


def test_ensure_excluded_is_idempotent_and_leaves_gitignore_alone(make_repo, files):
    root = make_repo(files)
    gitignore = (root / ".gitignore").read_bytes()
    exclude = root / ".git" / "info" / "exclude"
    exclude.write_text("# no trailing newline")
    repo = repository.open_repo(root)
    assert repository.ensure_excluded(repo) is True
    assert repository.ensure_excluded(repo) is False
    assert exclude.read_text() == "# no trailing newline\n/.coder/\n"
    assert (root / ".gitignore").read_bytes() == gitignore
    (root / ".coder" / "state").mkdir(parents=True)
    (root / ".coder" / "state" / "t1.json").write_text("{}")
    assert git(root, "status", "--porcelain") == ""


def test_ensure_excluded_creates_info_dir(repo):
    shutil.rmtree(repo / ".git" / "info")
    assert repository.ensure_excluded(repository.open_repo(repo), "/x/") is True
    assert (repo / ".git" / "info" / "exclude").read_text() == "/x/\n"


def test_branch_tip_and_resolve_commit(repo):
    r = repository.open_repo(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert branches.branch_tip(r, "main") == head
    assert branches.branch_tip(r, "nope") is None
    assert branches.resolve_commit(r, "main") == head
    assert branches.resolve_commit(r, head[:8]) == head
    for bad in ("nope", "HEAD~5", "HEAD^{tree}", "a..b"):
        with pytest.raises(InvalidInput, match="unknown revision"):
            branches.resolve_commit(r, bad)


# --------------------------------------------------------------------------- worktrees


def test_create_worktree(setup):
    root, _repo, wt, base = setup
    listing = git(root, "worktree", "list", "--porcelain")
    assert f"worktree {wt}\nHEAD {base}\nbranch refs/heads/{BRANCH}" in listing
    assert (wt / "src" / "app.py").read_text() == "print('hi')\n"
    assert git(wt, "status", "--porcelain") == ""
    assert git(root, "status", "--porcelain") == ""
    assert workdir.is_clean(wt)


def test_create_worktree_again_is_a_no_op(setup):
    root, repo, wt, base = setup
    again = worktrees.create_worktree(repo, name="t1", path=wt, branch=BRANCH, start="main")
    assert again == wt
    assert git(root, "worktree", "list").count("\n") == 2


def test_recreate_worktree_after_its_directory_was_deleted(setup):
    root, repo, wt, base = setup
    (wt / "new.txt").write_text("kept in history\n")
    tip = step(wt, base)
    shutil.rmtree(wt)
    path = worktrees.create_worktree(repo, name="t1", path=wt, branch=BRANCH, start="main")
    assert path == wt
    assert branches.branch_tip(repo, BRANCH) == tip  # the branch is checked out, never moved
    assert (wt / "new.txt").read_text() == "kept in history\n"
    assert git(wt, "status", "--porcelain") == ""
    assert git(root, "worktree", "list").count("\n") == 2
    git(root, "fsck", "--strict")


def test_worktrees_made_while_git_prunes_in_a_loop_are_whole(setup):
    """`git gc` runs `git worktree prune`, which deletes a registration it finds without its
    `gitdir` file. libgit2 writes one file by file, so a prune meanwhile took some or all of it:
    the add failed, or left a worktree git could not read (5 adds of 200 here, before). Each
    add is now checked whole, and made again."""
    root, repo, _wt, _base = setup
    done = threading.Event()

    def prune() -> None:
        while not done.is_set():
            subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)

    pruning = threading.Thread(target=prune, daemon=True)
    pruning.start()
    path = root / ".coder" / "worktrees" / "p"
    try:
        for _ in range(100):
            worktrees.create_worktree(repo, name="p", path=path, branch="agent/p", start="main")
            assert git(path, "status", "--porcelain") == ""
            assert f"worktree {path}\n" in git(root, "worktree", "list", "--porcelain")
            worktrees.remove_worktree(repo, "p", path)
    finally:
        done.set()
        pruning.join()
    assert not path.exists() and "worktree " + str(path) not in git(root, "worktree", "list")


def test_a_deleted_worktree_does_not_hold_its_branch(setup):
    root, repo, wt, base = setup
    shutil.rmtree(wt)
    other = root.parent / "elsewhere"
    assert worktrees.create_worktree(repo, name="t9", path=other, branch=BRANCH, start="x") == other
    assert git(other, "status", "--porcelain") == ""
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 2


def test_branch_checked_out_elsewhere(setup):
    root, repo, wt, _ = setup
    other = root.parent / "other"
    with pytest.raises(EnvironmentProblem, match=f"'{BRANCH}' is already checked out in {wt}"):
        worktrees.create_worktree(repo, name="t2", path=other, branch=BRANCH, start="main")
    with pytest.raises(EnvironmentProblem, match=f"'main' is already checked out in {root}"):
        worktrees.create_worktree(repo, name="t3", path=other, branch="main", start="main")
    assert not other.exists()
    assert sorted(p.name for p in (root / ".git" / "worktrees").iterdir()) == ["t1"]
    assert git(root, "worktree", "list").count("\n") == 2


def test_create_worktree_refuses_a_non_empty_directory(repo):
    target = repo.parent / "busy"
    target.mkdir()
    (target / "f").write_text("mine\n")
    with pytest.raises(EnvironmentProblem, match="not empty"):
        worktrees.create_worktree(
            repository.open_repo(repo), name="t1", path=target, branch="b", start="main"
        )
    assert (target / "f").read_text() == "mine\n"


def test_remove_worktree_and_delete_branch(setup):
    root, repo, wt, _ = setup
    with pytest.raises(EnvironmentProblem, match="checked out in"):
        branches.delete_branch(repo, BRANCH)
    worktrees.remove_worktree(repo, "t1", wt)
    worktrees.remove_worktree(repo, "t1", wt)  # idempotent
    assert not wt.exists()
    assert git(root, "worktree", "list").count("\n") == 1
    branches.delete_branch(repo, BRANCH)
    branches.delete_branch(repo, BRANCH)
    assert git(root, "branch", "--list", BRANCH) == ""
    git(root, "fsck", "--strict")


# --------------------------------------------------------------------------- commit_step


def test_commit_step_makes_one_commit_with_trailers(setup):
    root, repo, wt, base = setup
    (wt / "src" / "app.py").write_text("print('hello')\n")
    (wt / "src" / "old.py").unlink()
    (wt / "pkg" / "deep").mkdir(parents=True)
    (wt / "pkg" / "deep" / "new.py").write_text("y = 2\n")
    (wt / "debug.log").write_text("ignored\n")
    (wt / "build").mkdir()
    (wt / "build" / "out.bin").write_text("ignored\n")
    (wt / ".coder").mkdir()
    (wt / ".coder" / "notes.md").write_text("never committed\n")
    assert workdir.changed_paths(wt) == ["pkg/deep/new.py", "src/app.py", "src/old.py"]

    sha = commits.commit_step(
        wt,
        branch=BRANCH,
        task_id="t1",
        step_id="s2",
        attempt=3,
        title="Add greeting",
        body="Why: demo.",
        expected_tip=base,
    )
    assert sha == branches.branch_tip(repo, BRANCH) == git(wt, "rev-parse", "HEAD").strip()
    assert git(root, "rev-parse", f"{sha}^@").split() == [base]
    assert git(root, "rev-list", "--count", f"{base}..{BRANCH}").strip() == "1"
    assert git(root, "log", "-1", "--format=%B", BRANCH) == (
        "Add greeting\n\nWhy: demo.\n\nCoder-Task: t1\nCoder-Step: s2\nCoder-Attempt: 3\n\n"
    )
    assert git(root, "log", "-1", "--format=%(trailers)", BRANCH) == (
        "Coder-Task: t1\nCoder-Step: s2\nCoder-Attempt: 3\n\n"
    )
    step_only = "--format=%(trailers:key=Coder-Step,valueonly)"
    assert git(root, "log", "-1", step_only, BRANCH) == "s2\n\n"
    assert git(root, "log", "-1", "--format=%an <%ae>|%cn <%ce>", BRANCH).strip() == (
        "Test User <test@example.com>|Test User <test@example.com>"
    )
    assert tree_files(root, BRANCH) == [".gitignore", "README.md", "pkg/deep/new.py", "src/app.py"]
    assert git(wt, "status", "--porcelain") == ""
    assert workdir.is_clean(wt)
    git(root, "fsck", "--strict")


def test_commit_step_without_changes_makes_no_commit(setup):
    root, repo, wt, base = setup
    assert (
        commits.commit_step(
            wt,
            branch=BRANCH,
            task_id="t1",
            step_id="s1",
            attempt=1,
            title="noop",
            expected_tip=base,
        )
        is None
    )
    (wt / "README.md").write_text("changed\n")
    (wt / "README.md").write_text("# sample\n")  # ...and changed back
    (wt / "x.log").write_text("ignored only\n")
    assert (
        commits.commit_step(
            wt,
            branch=BRANCH,
            task_id="t1",
            step_id="s1",
            attempt=1,
            title="noop",
            expected_tip=base,
        )
        is None
    )
    assert branches.branch_tip(repo, BRANCH) == base


def test_commit_step_without_body_omits_the_paragraph(setup):
    root, _repo, wt, base = setup
    (wt / "a.txt").write_text("a\n")
    commits.commit_step(
        wt,
        branch=BRANCH,
        task_id="t1",
        step_id="s1",
        attempt=1,
        title="multi\nline  title",
        expected_tip=base,
    )
    assert git(root, "log", "-1", "--format=%B", BRANCH) == (
        "multi line title\n\nCoder-Task: t1\nCoder-Step: s1\nCoder-Attempt: 1\n\n"
    )


def test_commit_step_stages_a_rename_and_a_change_staged_by_a_command(setup):
    root, _repo, wt, base = setup
    git(wt, "mv", "src/old.py", "src/renamed.py")
    (wt / "README.md").write_text("staged then edited\n")
    git(wt, "add", "README.md")
    (wt / "README.md").write_text("final\n")
    sha = step(wt, base)
    assert git(root, "diff", "--name-status", "--no-renames", base, sha).split("\n")[:-1] == [
        "M\tREADME.md",
        "D\tsrc/old.py",
        "A\tsrc/renamed.py",
    ]
    assert git(root, "show", f"{sha}:README.md") == "final\n"


def test_coder_dir_is_never_committed_even_without_the_exclude(make_repo):
    root = make_repo({"README.md": "r\n"})
    repo = repository.open_repo(root)  # no ensure_excluded: .coder/ is not ignored here
    base = branches.resolve_commit(repo, "main")
    wt = worktrees.create_worktree(
        repo, name="t1", path=root.parent / "wt", branch=BRANCH, start="main"
    )
    (wt / ".coder" / "logs").mkdir(parents=True)
    (wt / ".coder" / "logs" / "t1.jsonl").write_text("{}\n")
    (wt / ".coder" / "forced").write_text("force-added by a command\n")
    git(wt, "add", "-f", ".coder/forced")
    (wt / ".coderish").write_text("a lookalike is fine\n")
    assert workdir.changed_paths(wt) == [".coderish"]
    assert ".coder/" not in diffs.diff_patch(repo, base, worktree=wt)
    sha = step(wt, base)
    assert tree_files(root, sha) == [".coderish", "README.md"]


def test_commit_step_refuses_when_the_branch_moved(setup):
    root, repo, wt, base = setup
    git(wt, "commit", "-q", "--allow-empty", "-m", "someone else")
    theirs = git(wt, "rev-parse", "HEAD").strip()
    (wt / "a.txt").write_text("a\n")
    with pytest.raises(BranchMoved, match=f"branch '{BRANCH}' moved under us") as err:
        step(wt, base)
    assert err.value.exit_code == 3
    assert branches.branch_tip(repo, BRANCH) == theirs


def test_commit_step_compare_and_swap_is_libgit2s(setup, monkeypatch):
    """The early tip check is a courtesy; the real guard is create_commit through the ref."""
    root, repo, wt, base = setup
    git(wt, "commit", "-q", "--allow-empty", "-m", "racing commit")
    theirs = git(wt, "rev-parse", "HEAD").strip()
    monkeypatch.setattr(commits, "check_tip", lambda *a: None)
    (wt / "a.txt").write_text("a\n")
    with pytest.raises(BranchMoved, match=f"now at {theirs[:12]}"):
        step(wt, base)
    assert branches.branch_tip(repo, BRANCH) == theirs
    git(root, "fsck", "--strict")


def test_user_checkout_is_untouched_by_worktree_work(make_repo, files):
    root = make_repo(files)
    (root / "README.md").write_text("user edit in progress\n")
    (root / "src" / "app.py").write_text("print('staged by user')\n")
    git(root, "add", "src/app.py")
    (root / "scratch.txt").write_text("untracked user file\n")
    repo = repository.open_repo(root)
    repository.ensure_excluded(repo)
    before = snapshot(root)

    base = branches.resolve_commit(repo, "main")
    wt = worktrees.create_worktree(
        repo, name="t1", path=root / ".coder" / "worktrees" / "t1", branch=BRANCH, start="main"
    )
    (wt / "README.md").write_text("agent edit\n")
    (wt / "new.py").write_text("n = 1\n")
    s1 = step(wt, base)
    (wt / "more.py").write_text("m = 1\n")
    restore.discard_changes(wt, s1)
    (wt / "new.py").unlink()
    s2 = step(wt, s1, "s2")
    restore.reset_branch(wt, s1, branch=BRANCH, expected_tip=s2)
    diffs.diff_patch(repo, base, worktree=wt)
    worktrees.remove_worktree(repo, "t1", wt)

    assert snapshot(root) == before
    git(root, "fsck", "--strict")


def test_stale_index_lock_is_cleared(setup):
    root, _repo, wt, base = setup
    lock = root / ".git" / "worktrees" / "t1" / "index.lock"
    assert repository.clear_stale_index_lock(wt) is False
    lock.write_text("")  # left behind by a crash
    (wt / "a.txt").write_text("a\n")
    sha = step(wt, base)
    assert not lock.exists()
    assert "a.txt" in tree_files(root, sha)
    lock.write_text("")
    (wt / "a.txt").write_text("partial\n")
    restore.discard_changes(wt, sha)
    assert (wt / "a.txt").read_text() == "a\n"
    assert not lock.exists()


# --------------------------------------------------------------------------- discard, reset


def test_discard_changes_restores_the_commit(setup):
    root, repo, wt, base = setup
    (wt / "src" / "app.py").write_text("half-applied\n")
    (wt / "README.md").unlink()
    (wt / "tmpdir" / "a" / "b").mkdir(parents=True)
    (wt / "tmpdir" / "a" / "b" / "new.py").write_text("new\n")
    (wt / "staged.py").write_text("staged\n")
    git(wt, "add", "staged.py")
    (wt / "keep.log").write_text("ignored stays\n")
    (wt / ".coder").mkdir()
    (wt / ".coder" / "artifact").write_text("stays\n")
    restore.discard_changes(wt, base)
    assert (wt / "src" / "app.py").read_text() == "print('hi')\n"
    assert (wt / "README.md").read_text() == "# sample\n"
    assert not (wt / "tmpdir").exists()
    assert not (wt / "staged.py").exists()
    assert (wt / "keep.log").read_text() == "ignored stays\n"
    assert (wt / ".coder" / "artifact").read_text() == "stays\n"
    assert git(wt, "status", "--porcelain") == ""
    assert branches.branch_tip(repo, BRANCH) == base


def test_discard_changes_never_moves_the_branch(setup):
    root, repo, wt, base = setup
    (wt / "a.txt").write_text("a\n")
    s1 = step(wt, base)
    (wt / "a.txt").write_text("user's uncommitted work\n")
    with pytest.raises(BranchMoved):
        restore.discard_changes(wt, base)
    assert branches.branch_tip(repo, BRANCH) == s1
    assert (wt / "a.txt").read_text() == "user's uncommitted work\n"


def test_reset_branch(setup):
    root, repo, wt, base = setup
    (wt / "one.txt").write_text("1\n")
    s1 = step(wt, base)
    (wt / "two" / "sub").mkdir(parents=True)
    (wt / "two" / "sub" / "t.txt").write_text("2\n")
    (wt / "one.txt").write_text("1 changed\n")
    s2 = step(wt, s1, "s2")
    with pytest.raises(BranchMoved):
        restore.reset_branch(wt, base, branch=BRANCH, expected_tip=s1)
    with pytest.raises(InvalidInput):
        restore.reset_branch(wt, "no-such-rev", branch=BRANCH, expected_tip=s2)
    assert branches.branch_tip(repo, BRANCH) == s2
    restore.reset_branch(wt, s1, branch=BRANCH, expected_tip=s2)
    assert branches.branch_tip(repo, BRANCH) == s1
    assert (wt / "one.txt").read_text() == "1\n"
    assert not (wt / "two").exists()
    assert git(wt, "status", "--porcelain") == ""
    assert "coder: reset to" in git(root, "reflog", "-1", BRANCH)
    git(root, "fsck", "--strict")


def test_a_deleted_worktree_never_resolves_to_the_main_checkout(setup):
    """A worktree dir that vanished and reappeared (e.g. recreated by a log writer) is inside
    the main checkout; searching upward would find main, and a reset there would destroy the
    user's edits. Every worktree operation opens exactly that path instead."""
    root, repo, wt, base = setup
    (root / "README.md").write_text("user edit\n")
    (root / "untracked.txt").write_text("user file\n")
    shutil.rmtree(wt)
    wt.mkdir()
    (wt / "stray.txt").write_text("x\n")
    for call in (
        lambda: restore.discard_changes(wt, base),
        lambda: restore.reset_branch(wt, base, branch=BRANCH, expected_tip=base),
        lambda: commits.commit_step(
            wt, branch=BRANCH, task_id="t1", step_id="s1", attempt=1, title="t", expected_tip=base
        ),
        lambda: workdir.changed_paths(wt),
    ):
        with pytest.raises(EnvironmentProblem, match="missing or not a git worktree"):
            call()
    assert repository.clear_stale_index_lock(wt) is False
    with pytest.raises(EnvironmentProblem, match="main checkout"):
        restore.discard_changes(root, base)
    assert (root / "README.md").read_text() == "user edit\n"
    assert (root / "untracked.txt").read_text() == "user file\n"


@pytest.mark.parametrize("head", ["ref: refs/heads/main\n", "HEAD-COMMIT\n"])
def test_no_branch_moves_through_a_head_pointed_elsewhere(setup, head: str) -> None:
    """The run's branch is moved by name: a worktree whose HEAD names main (or a commit)
    moves nothing, main least of all (at a run's first step main is at the expected tip, so
    a compare-and-swap through HEAD would pass); `point_head_back` puts HEAD back."""
    root, repo, wt, base = setup
    scratch_tree = scratch(repo, root, "t1--s2", base)
    (scratch_tree / "s2.txt").write_text("s2\n")
    picked = detached(scratch_tree, base, "s2")
    admin_head = root / ".git" / "worktrees" / "t1" / "HEAD"
    head = head.replace("HEAD-COMMIT", base)
    admin_head.write_text(head)
    (wt / "a.txt").write_text("a\n")
    refs = git(root, "for-each-ref", "--format=%(refname) %(objectname)")
    for call in (
        lambda: step(wt, base),
        lambda: commits.cherry_pick(wt, picked, branch=BRANCH, expected_tip=base),
        lambda: restore.reset_branch(wt, base, branch=BRANCH, expected_tip=base),
        lambda: branches.move_branch(
            wt, picked, branch=BRANCH, expected_tip=base, message="coder: revert"
        ),
    ):
        with pytest.raises(EnvironmentProblem, match=f"not the run's branch {BRANCH}"):
            call()
    assert git(root, "for-each-ref", "--format=%(refname) %(objectname)") == refs
    assert git(root, "rev-parse", "main").strip() == base

    assert worktrees.point_head_back(repo, "t1", BRANCH) == head.strip().removeprefix("ref: ")
    assert git(wt, "symbolic-ref", "HEAD") == f"refs/heads/{BRANCH}\n"
    assert worktrees.point_head_back(repo, "t1", BRANCH) is None
    assert step(wt, base) == git(root, "rev-parse", BRANCH).strip()
    assert git(root, "rev-parse", "main").strip() == base


def test_a_branch_made_a_symbolic_ref_is_never_followed(setup) -> None:
    root, repo, wt, base = setup
    git(root, "symbolic-ref", f"refs/heads/{BRANCH}", "refs/heads/main")
    (wt / "a.txt").write_text("a\n")
    with pytest.raises(BranchMoved, match="was made a symbolic ref to refs/heads/main"):
        step(wt, base)
    assert git(root, "rev-parse", "main").strip() == base
    assert git(root, "symbolic-ref", f"refs/heads/{BRANCH}") == "refs/heads/main\n"


def test_a_stale_ref_lock_is_reported_with_the_file_to_delete(setup):
    root, _repo, wt, base = setup
    lock = root / ".git" / "refs" / "heads" / "agent" / "t1-demo.lock"
    lock.write_text("")
    (wt / "a.txt").write_text("a\n")
    with pytest.raises(EnvironmentProblem, match="cannot commit step s1") as err:
        step(wt, base)
    assert str(lock) in err.value.hint
    with pytest.raises(EnvironmentProblem, match="cannot reset branch"):
        restore.reset_branch(wt, base, branch=BRANCH, expected_tip=base)
    lock.unlink()
    step(wt, base)


# --------------------------------------------------------------------------- history


def test_step_commits_reads_trailers_of_this_task_only(setup):
    root, repo, wt, base = setup
    (wt / "a.txt").write_text("a\n")
    s1 = step(wt, base, "s1")
    (wt / "b.txt").write_text("b\n")
    other = step(wt, s1, "s1", task="t2")
    git(wt, "commit", "-q", "--allow-empty", "-m", "a user commit\n\nCoder-Step: s9")
    user = git(wt, "rev-parse", "HEAD").strip()
    (wt / "c.txt").write_text("c\n")
    s3 = step(wt, user, "s3", attempt=2)
    git(
        wt,
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "hand-made\n\nbody\n\nCoder-Task: t1\nCoder-Step: s4\nsome stray line\nCoder-Attempt: 7\n"
        "Signed-off-by: A <a@b.c>",
    )
    s4 = git(wt, "rev-parse", "HEAD").strip()

    found = commits.step_commits(repo, branch=BRANCH, base_commit=base, task_id="t1")
    assert found == [
        commits.StepCommit(s1, "s1", 1, "t1", "s1: work"),
        commits.StepCommit(s3, "s3", 2, "t1", "s3: work"),
        commits.StepCommit(s4, "s4", 7, "t1", "hand-made"),
    ]
    assert [
        c.commit for c in commits.step_commits(repo, branch=BRANCH, base_commit=s1, task_id="t2")
    ] == [other]
    assert commits.step_commits(repo, branch="missing", base_commit=base, task_id="t1") == []
    tasks = git(root, "log", "--format=%(trailers:key=Coder-Task,valueonly)", f"{base}..{BRANCH}")
    assert tasks.split() == ["t1", "t1", "t2", "t1"]


def test_parse_trailers():
    assert commits.parse_trailers("title only") == {}
    assert commits.parse_trailers("t\n\nCoder-Task: a\r\nCoder-Step:  s1 \n") == {
        "coder-task": "a",
        "coder-step": "s1",
    }
    assert commits.parse_trailers("t\n\nCoder-Task: old\n\nno trailers here") == {}


# --------------------------------------------------------------------------- diffs


def test_diff_helpers_agree_with_git(setup):
    root, repo, wt, base = setup
    (wt / "src" / "app.py").write_text("print('hello')\n")
    git(wt, "mv", "src/old.py", "src/moved.py")
    (wt / "new.txt").write_text("fresh\n")
    s1 = step(wt, base)

    patch = diffs.diff_patch(repo, base, s1)
    assert "-print('hi')\n+print('hello')\n" in patch
    assert "+fresh\n" in patch
    assert "rename from src/old.py\nrename to src/moved.py" in patch
    assert diffs.changed_files_between(repo, base, s1) == sorted(
        git(root, "diff", "--name-only", "--no-renames", base, s1).split()
    )
    stat = diffs.diff_stat(repo, base, s1)
    assert "3 files changed, 2 insertions(+), 1 deletion(-)" in stat
    assert git(root, "diff", "--stat", base, s1).splitlines()[-1].strip() in stat
    assert diffs.diff_stat(repo, s1, s1) == "" and diffs.diff_patch(repo, s1, s1) == ""

    (wt / "untracked" / "u.py").parent.mkdir()
    (wt / "untracked" / "u.py").write_text("u = 1\n")
    (wt / "new.txt").write_text("fresh\nmore\n")
    (wt / "noise.log").write_text("ignored\n")
    live = diffs.diff_patch(repo, s1, worktree=wt)
    assert "+u = 1\n" in live and "+more\n" in live
    assert "noise.log" not in live and ".coder" not in live
    assert "+fresh\n" in diffs.diff_patch(repo, base, worktree=wt)


# --------------------------------------------------------------------------- parallel steps


def scratch(repo, root: Path, name: str, commit: str) -> Path:
    path = root / ".coder" / "worktrees" / name
    return worktrees.add_scratch_worktree(repo, name=name, path=path, commit=commit)


def detached(wt: Path, parent: str, step_id: str, task: str = "t1") -> str:
    sha = commits.commit_detached(
        wt, task_id=task, step_id=step_id, attempt=1, title=f"{step_id}: work", parent=parent
    )
    assert sha is not None
    return sha


def test_scratch_worktrees_and_cherry_pick(setup):
    root, repo, wt, base = setup
    a = scratch(repo, root, "t1--s2", base)
    b = scratch(repo, root, "t1--s3", base)
    assert git(a, "rev-parse", "HEAD").strip() == base
    assert "detached" in git(a, "worktree", "list", "--porcelain")
    assert "coder-scratch" not in git(root, "branch", "--list", "--all")

    assert (
        commits.commit_detached(a, task_id="t1", step_id="s2", attempt=1, title="none", parent=base)
        is None
    )
    (a / "src" / "app.py").write_text("print('from s2')\n")
    (a / "half.txt").write_text("discarded\n")
    restore.discard_changes(a, base)  # a failed attempt in the scratch worktree
    assert not (a / "half.txt").exists()
    (a / "src" / "app.py").write_text("print('from s2')\n")
    c2 = detached(a, base, "s2")
    assert git(a, "rev-parse", "HEAD").strip() == c2
    assert branches.branch_tip(repo, BRANCH) == base  # the agent branch has not moved yet
    (b / "s3.txt").write_text("s3\n")
    c3 = detached(b, base, "s3")

    landed2 = commits.cherry_pick(wt, c2, branch=BRANCH, expected_tip=base)
    assert landed2 == c2  # parent is the tip: fast-forward, same commit
    landed3 = commits.cherry_pick(wt, c3, branch=BRANCH, expected_tip=landed2)
    assert landed3 != c3 and git(root, "rev-parse", f"{landed3}^").strip() == landed2
    assert git(root, "log", "-1", "--format=%(trailers)", landed3) == (
        "Coder-Task: t1\nCoder-Step: s3\nCoder-Attempt: 1\n\n"
    )
    assert (wt / "s3.txt").read_text() == "s3\n"
    assert (wt / "src" / "app.py").read_text() == "print('from s2')\n"
    assert git(wt, "status", "--porcelain") == ""
    steps = commits.step_commits(repo, branch=BRANCH, base_commit=base, task_id="t1")
    assert [(c.step_id, c.commit) for c in steps] == [("s2", c2), ("s3", landed3)]
    assert commits.cherry_pick(wt, c3, branch=BRANCH, expected_tip=landed3) is None  # already there

    for name in ("t1--s2", "t1--s3"):
        worktrees.remove_worktree(repo, name, root / ".coder" / "worktrees" / name)
    assert git(root, "worktree", "list").count("\n") == 2
    git(root, "fsck", "--strict")


def test_cherry_pick_conflict_and_moved_branch(setup):
    root, repo, wt, base = setup
    a = scratch(repo, root, "t1--s2", base)
    b = scratch(repo, root, "t1--s3", base)
    (a / "README.md").write_text("s2 version\n")
    (b / "README.md").write_text("s3 version\n")
    c2, c3 = detached(a, base, "s2"), detached(b, base, "s3")
    tip = commits.cherry_pick(wt, c2, branch=BRANCH, expected_tip=base)
    with pytest.raises(RunFailed, match="conflicts with .* in README.md"):
        commits.cherry_pick(wt, c3, branch=BRANCH, expected_tip=tip)
    assert branches.branch_tip(repo, BRANCH) == tip
    assert git(wt, "status", "--porcelain") == ""
    with pytest.raises(BranchMoved):
        commits.cherry_pick(wt, c3, branch=BRANCH, expected_tip=base)
    with pytest.raises(BranchMoved):
        commits.commit_detached(a, task_id="t1", step_id="s2", attempt=2, title="x", parent=base)


def test_add_scratch_worktree_replaces_a_leftover(setup):
    root, repo, wt, base = setup
    a = scratch(repo, root, "t1--s2", base)
    (a / "junk.txt").write_text("from a crashed run\n")
    again = scratch(repo, root, "t1--s2", base)
    assert again == a and not (a / "junk.txt").exists()
    assert git(root, "worktree", "list").count("\n") == 3


def test_foreign_commits(setup):
    root, repo, wt, base = setup
    assert commits.foreign_commits(repo, branch=BRANCH, base_commit=base, task_id="t1") == []
    (wt / "a.txt").write_text("a\n")
    s1 = step(wt, base)
    assert commits.foreign_commits(repo, branch=BRANCH, base_commit=base, task_id="t1") == []
    git(wt, "commit", "-q", "--allow-empty", "-m", "user work")
    user = git(wt, "rev-parse", "HEAD").strip()
    assert commits.foreign_commits(repo, branch=BRANCH, base_commit=base, task_id="t1") == [user]
    assert commits.foreign_commits(repo, branch=BRANCH, base_commit=base, task_id="t2") == [
        s1,
        user,
    ]
    git(wt, "reset", "-q", "--hard", base)  # behind s1: the branch lost the run's base
    assert commits.foreign_commits(repo, branch=BRANCH, base_commit=s1, task_id="t1") == [base]
