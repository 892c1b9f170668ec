"""coder.git.staging: a step's changes found and staged in one scan, by libgit2 in process (small
trees) and by the git program run confined (large ones). Every test runs both ways; what they
stage is checked against the git CLI, and what a command planted for git to run is checked by
its traces outside the worktree."""

from __future__ import annotations

import os
import subprocess
import sys
from hashlib import sha1
from pathlib import Path

import pytest

from coder.errors import EnvironmentProblem
from coder.git import branches, commits, diffs, repository, staging, submodules, worktrees
from coder.policy import confine, kernel
from tests.conftest import git

BRANCH = "agent/t1-demo"
FILES = {
    "README.md": "# sample\n",
    "src/app.py": "print('hi')\n",
    "src/old.py": "x = 1\n",
    "docs/a.md": "a\n",
    "docs/b.md": "b\n",
    ".gitignore": "*.log\n",
}
sandboxed = pytest.mark.skipif(
    not kernel.support().available, reason=f"no kernel sandbox: {kernel.support().problem}"
)


@pytest.fixture
def setup(make_repo, scan: str) -> tuple[Path, Path, str]:
    root = make_repo(FILES)
    repo = repository.open_repo(root)
    repository.ensure_excluded(repo)
    wt = worktrees.create_worktree(
        repo, name="t1", path=root / ".coder" / "worktrees" / "t1", branch=BRANCH, start="main"
    )
    return root, wt, branches.resolve_commit(repo, "main")


def as_git_stages(wt: Path) -> str:
    """The tree `git add -A` makes of the worktree, from the index coder staged."""
    git(wt, "add", "-A")
    return git(wt, "write-tree").strip()


def test_the_staged_tree_is_what_git_add_all_stages(setup) -> None:
    root, wt, base = setup
    (wt / "src" / "app.py").write_text("print('hello')\n")
    (wt / "src" / "old.py").unlink()
    (wt / "pkg" / "deep").mkdir(parents=True)
    (wt / "pkg" / "deep" / "new.py").write_text("y = 2\n")
    (wt / "run.sh").write_text("#!/bin/sh\n")
    (wt / "run.sh").chmod(0o755)
    (wt / "docs" / "a.md").chmod(0o755)
    (wt / "link").symlink_to("README.md")
    (wt / "debug.log").write_text("ignored\n")
    staged = staging.stage(wt, base)
    assert staged.paths == [
        "docs/a.md",
        "link",
        "pkg/deep/new.py",
        "run.sh",
        "src/app.py",
        "src/old.py",
    ]
    by_path = {c.path: c for c in staged.changes}
    assert by_path["src/old.py"].new is None and by_path["pkg/deep/new.py"].old is None
    assert by_path["docs/a.md"].new is not None and by_path["docs/a.md"].new[0] == 0o100755
    assert by_path["link"].new is not None and by_path["link"].new[0] == 0o120000
    assert as_git_stages(wt) == staged.tree
    assert git(wt, "diff", "--name-only", base) == "".join(f"{p}\n" for p in staged.paths)


def test_files_and_directories_replacing_each_other(setup) -> None:
    root, wt, base = setup
    (wt / "README.md").unlink()
    (wt / "README.md").mkdir()
    (wt / "README.md" / "inside.txt").write_text("now a directory\n")
    for name in ("a.md", "b.md"):
        (wt / "docs" / name).unlink()
    (wt / "docs").rmdir()
    (wt / "docs").write_text("now a file\n")
    staged = staging.stage(wt, base)
    assert staged.paths == ["README.md", "README.md/inside.txt", "docs", "docs/a.md", "docs/b.md"]
    assert as_git_stages(wt) == staged.tree


def test_a_directory_replaced_by_a_symlink(setup, tmp_path: Path) -> None:
    root, wt, base = setup
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "app.py").write_text("outside\n")
    for name in ("app.py", "old.py"):
        (wt / "src" / name).unlink()
    (wt / "src").rmdir()
    (wt / "src").symlink_to(elsewhere)
    staged = staging.stage(wt, base)
    assert staged.paths == ["src", "src/app.py", "src/old.py"]
    assert by_mode(staged)["src"] == 0o120000  # the link itself, nothing read through it
    assert as_git_stages(wt) == staged.tree


def by_mode(staged: staging.Staged) -> dict[str, int | None]:
    return {c.path: c.new[0] if c.new else None for c in staged.changes}


def test_a_nested_repository_is_seen_but_not_staged(setup) -> None:
    root, wt, base = setup
    nested = wt / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    (nested / "f.txt").write_text("theirs\n")
    (wt / "vendor" / "mine.txt").write_text("ours\n")
    staged = staging.stage(wt, base)
    assert staged.unstaged == ("vendor/lib/",)
    assert staged.paths == ["vendor/lib/", "vendor/mine.txt"]
    tree = git(root, "ls-tree", "-r", "--name-only", staged.tree).split()
    assert "vendor/mine.txt" in tree and not [p for p in tree if p.startswith("vendor/lib")]


def test_a_command_staged_change_and_coder_dir_entries(setup) -> None:
    root, wt, base = setup
    git(wt, "mv", "src/old.py", "src/renamed.py")
    (wt / "README.md").write_text("staged then edited\n")
    git(wt, "add", "README.md")
    (wt / "README.md").write_text("final\n")
    (wt / ".coder").mkdir()
    (wt / ".coder" / "forced").write_text("force-added by a command\n")
    git(wt, "add", "-f", ".coder/forced")
    staged = staging.stage(wt, base)
    assert staged.paths == ["README.md", "src/old.py", "src/renamed.py"]
    tree = git(root, "ls-tree", "-r", "--name-only", staged.tree).split()
    assert ".coder/forced" not in tree and "src/renamed.py" in tree
    assert git(root, "cat-file", "-p", f"{staged.tree}:README.md") == "final\n"


def test_nothing_changed_stages_the_base_tree(setup) -> None:
    root, wt, base = setup
    (wt / "README.md").write_text("changed\n")
    (wt / "README.md").write_text("# sample\n")
    (wt / "x.log").write_text("ignored only\n")
    staged = staging.stage(wt, base)
    assert staged.changes == () and staged.paths == []
    assert staged.tree == git(root, "rev-parse", "main^{tree}").strip()


def test_an_unmerged_index_is_an_error_naming_the_paths(setup) -> None:
    root, wt, base = setup
    blob = git(wt, "rev-parse", "HEAD:README.md").strip()
    entries = "".join(f"100644 {blob} {n}\tREADME.md\n" for n in (1, 2, 3))
    git(wt, "update-index", "--force-remove", "README.md")
    subprocess.run(
        ["git", "update-index", "--index-info"], cwd=wt, input=entries, text=True, check=True
    )
    (wt / "README.md").write_text("<<<<<<< ours\n")
    with pytest.raises(EnvironmentProblem, match="unmerged paths: README.md"):
        staging.stage(wt, base)


def test_the_commit_records_the_staged_tree_and_the_repository_checks_out(setup) -> None:
    root, wt, base = setup
    (wt / "src" / "app.py").write_text("print('hello')\n")
    staged = staging.stage(wt, base)
    (wt / "late.txt").write_text("after verify: not in this commit\n")
    sha = commits.commit_step(
        wt,
        branch=BRANCH,
        task_id="t1",
        step_id="s1",
        attempt=1,
        title="t",
        expected_tip=base,
        staged=staged,
    )
    assert git(root, "rev-parse", f"{sha}^{{tree}}").strip() == staged.tree
    git(root, "fsck", "--strict")
    with pytest.raises(ValueError, match="staged against"):
        commits.commit_step(
            wt,
            branch=BRANCH,
            task_id="t1",
            step_id="s2",
            attempt=1,
            title="t",
            expected_tip=sha,
            staged=staged,
        )


def test_a_stale_index_lock_is_cleared(setup) -> None:
    root, wt, base = setup
    lock = root / ".git" / "worktrees" / "t1" / "index.lock"
    lock.write_text("")  # left behind by a crash
    (wt / "a.txt").write_text("a\n")
    staged = staging.stage(wt, base)
    assert staged.paths == ["a.txt"] and not lock.exists()


def test_a_required_filter_that_is_not_configured_stops_the_staging(setup) -> None:
    root, wt, base = setup
    git(root, "config", "filter.lfs.required", "true")
    (wt / ".gitattributes").write_text("*.bin filter=lfs\n")
    (wt / "big.bin").write_text("data\n")
    with pytest.raises(EnvironmentProblem) as raised:
        staging.stage(wt, base)
    assert raised.value.message.endswith("fatal: big.bin: clean filter 'lfs' failed")
    assert (raised.value.hint or "").startswith("the filter `lfs` (.gitattributes) must be")


# --- what a command plants for git to run --------------------------------------------------


def planted(where: Path, name: str, body: str) -> Path:
    """An executable script that leaves `marker` files where it may and where it may not,
    put where a command can write it (the worktree's admin dir: the sandbox shows it)."""
    script = where / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


@sandboxed
def test_a_planted_fsmonitor_never_runs_and_a_filter_runs_confined(setup, tmp_path) -> None:
    root, wt, base = setup
    outside = tmp_path / "outside"
    outside.mkdir()
    admin = root / ".git" / "worktrees" / "t1"  # writable when confined: any run leaves a mark
    monitor = planted(admin, "monitor", f"touch {admin}/monitor-ran {outside}/monitor-ran")
    clean = planted(admin, "clean", f"touch {outside}/filter-wrote 2>/dev/null\ntr a-z A-Z")
    git(root, "config", "extensions.worktreeConfig", "true")  # the user's repository
    (admin / "config.worktree").write_text(  # what a command can write there
        f'[core]\n\tfsmonitor = {monitor}\n[filter "up"]\n\tclean = {clean}\n'
    )
    (wt / ".gitattributes").write_text("*.up filter=up\n")
    (wt / "x.up").write_text("hello\n")
    staged = staging.stage(wt, base)
    assert git(root, "cat-file", "-p", f"{staged.tree}:x.up") == "HELLO\n"  # git's semantics
    assert sorted(os.listdir(outside)) == []  # the filter ran confined
    assert not (admin / "monitor-ran").exists()  # the monitor never ran


@sandboxed
def test_an_object_forged_in_the_quarantine_is_refused(setup, tmp_path) -> None:
    """A filter (confined, but able to write where git writes) plants a file under the id of
    the blob git is about to store, with other content: git then skips writing it."""
    root, wt, base = setup
    admin = root / ".git" / "worktrees" / "t1"
    forge = admin / "forge.py"
    forge.write_text(
        "import os, sys, zlib, hashlib\n"
        "data = sys.stdin.buffer.read()\n"
        "oid = hashlib.sha1(b'blob %d\\0' % len(data) + data).hexdigest()\n"
        "d = os.path.join(os.environ['GIT_OBJECT_DIRECTORY'], oid[:2])\n"
        "os.makedirs(d, exist_ok=True)\n"
        "open(os.path.join(d, oid[2:]), 'wb').write(zlib.compress(b'blob 5\\0other'))\n"
        "sys.stdout.buffer.write(data)\n"
    )
    clean = planted(admin, "clean", f"exec {sys.executable} {forge}")
    git(root, "config", "filter.forge.clean", str(clean))
    (wt / ".gitattributes").write_text("*.f filter=forge\n")
    (wt / "x.f").write_text("genuine\n")
    with pytest.raises(EnvironmentProblem, match="does not hold what its name says"):
        staging.stage(wt, base)
    genuine = sha1(b"blob 8\0genuine\n").hexdigest()
    assert not (root / ".git" / "objects" / genuine[:2] / genuine[2:]).exists()
    git(root, "fsck", "--strict")


def test_a_submodule_is_never_looked_into_by_git_nor_staged(make_repo, scan, tmp_path) -> None:
    lib = make_repo({"lib.txt": "lib\n"}, name="lib")
    root = make_repo({"README.md": "# r\n"}, name="repo")
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(root, "commit", "-q", "-m", "add the submodule")
    repo = repository.open_repo(root)
    base = branches.resolve_commit(repo, "main")
    wt = worktrees.create_worktree(
        repo, name="t1", path=root / ".coder" / "worktrees" / "t1", branch=BRANCH, start="main"
    )
    sub = wt / "vendor" / "lib"
    clean = planted(root / ".git" / "worktrees" / "t1", "clean", f"touch {sub}/filter-ran\ncat")
    with (sub / ".git" / "config").open("a") as config:  # what a command can write there
        config.write(f'[filter "x"]\n\tclean = {clean}\n')
    (sub / ".gitattributes").write_text("*.txt filter=x\n")
    (sub / "lib.txt").write_text("LIB\n")  # the same size: git must read it to compare
    (wt / "top.txt").write_text("top\n")
    staged = staging.stage(wt, base)
    assert staged.paths == ["top.txt"]
    assert not (sub / "filter-ran").exists()  # `git status` would run it inside the submodule
    assert submodules.changed_submodules(wt) == ["vendor/lib"]  # coder's own check sees it


def test_a_steps_patch_is_what_git_diff_prints(make_repo) -> None:
    """diffs.step_patch (the step's diff artifact) walks only what changed; its text is
    `git diff --no-renames` byte for byte: modes, symlinks, binary files, gitlinks, empty
    files added or deleted (no ---/+++ lines: there is no hunk)."""
    root = make_repo({"m": "a\nb\n", "x": "x\n", "del": "d\n", "dir/keep": "k\n", "gone-empty": ""})
    (root / "bin").write_bytes(b"bin\0\1")
    (root / "link").symlink_to("m")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "more")
    old = git(root, "rev-parse", "HEAD").strip()
    (root / "m").write_text("a\nc\n")
    (root / "m").chmod(0o755)
    (root / "x").chmod(0o755)
    (root / "del").unlink()
    (root / "bin").write_bytes(b"bin\0\2")
    (root / "link").unlink()
    (root / "link").symlink_to("x")
    (root / "dir" / "deep").mkdir()
    (root / "dir" / "deep" / "new").write_text("new\n")
    (root / "new-empty").write_text("")
    (root / "gone-empty").unlink()
    (root / "x-empty").write_text("")
    (root / "x-empty").chmod(0o755)
    git(root, "mv", "dir/keep", "kept")
    git(root, "add", "-A")
    git(root, "update-index", "--add", "--cacheinfo", f"160000,{old},sub")
    git(root, "commit", "-q", "-m", "change")
    repo = repository.open_repo(root)
    assert diffs.step_patch(repo, old, "HEAD") == git(root, "diff", "--no-renames", old, "HEAD")


@sandboxed
def test_links_planted_in_the_sandboxs_temporary_directory_are_not_followed(setup, tmp_path):
    """Commands may write anywhere in their sandbox's temporary root: a link planted there
    under any name neither receives git's objects nor aims coder's cleanup at your files."""
    root, wt, base = setup
    yours = tmp_path / "yours"
    (yours / "ab").mkdir(parents=True)
    (yours / "ab" / "keep").write_text("yours\n")
    (yours / "notes.txt").write_text("yours\n")
    tmp_root = Path(confine.spawner_for(wt).tmp_root)
    for name in ("objects", "objects-x", "quarantine"):
        (tmp_root / name).symlink_to(yours)
    (wt / "a.txt").write_text("a\n")
    staged = staging.stage(wt, base)
    assert staged.paths == ["a.txt"]
    assert sorted(p.name for p in yours.rglob("*")) == ["ab", "keep", "notes.txt"]
    assert not [
        p
        for p in tmp_root.iterdir()
        if p.name.startswith("objects-") and p.is_dir() and not p.is_symlink()
    ]  # its own quarantine is gone
