"""coder's own writes stay inside too (RELIABILITY.md row 27): a command plants something in
the worktree (a symlink, a submodule's `core.worktree`, a forged admin file), and what coder
itself does there afterwards (the discard of a failed step, submodule resets, removing a
worktree, the merge's writes into the user's checkout, the model's file tools) writes,
deletes and chmods nothing outside the tree it means. Each verdict is a fingerprint (content,
mode, mtime, link target) of the target taken before and after, not coder's messages."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coder.policy import kernel
from tests.conftest import coder, git
from tests.helpers import fingerprint, snapshot, state_of, taskfile

confined_here = pytest.mark.skipif(
    not kernel.support().available,
    reason=f"no kernel sandbox here: {kernel.support().problem}",
)


def outside_dir(tmp_path: Path) -> Path:
    """A directory outside the repository holding a file a planted link would overwrite."""
    out = tmp_path / "outside"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("outside a\n")
    (out / "sub" / "keep.txt").write_text("keep me\n")
    return out


def run_steps(repo: Path, *cmds: str, extra: str = "") -> tuple[int, str, str]:
    steps = "\n".join(
        f"  - id: s{i}\n    kind: shell\n    cmd: {json.dumps(c)}{extra}"
        for i, c in enumerate(cmds, 1)
    )
    path = taskfile(repo, f"id: own\ntitle: own writes\ngraph:\n{steps}\n")
    return coder(repo, "run", "--autonomous", "-f", str(path))


def worktree(repo: Path, name: str = "own") -> Path:
    return repo / ".coder" / "worktrees" / name


# --------------------------------------------------------------------------- the artifacts


def test_a_link_planted_at_a_steps_artifact_is_replaced_not_written_through(
    make_repo, tmp_path: Path
) -> None:
    """Without the sandbox (which keeps `.coder/` read-only) a command can plant links where
    coder writes the step's command log and diff: coder replaces them with its files and
    writes nothing where they point."""
    repo = make_repo()
    out = outside_dir(tmp_path)
    before = fingerprint(out)
    plant = (
        "mkdir -p ../../artifacts/own && echo x > x.txt"
        f" && ln -s {out / 'a.txt'} ../../artifacts/own/s1.diff"
        f" && ln -s {out / 'sub' / 'keep.txt'} ../../artifacts/own/s1-attempt1.log"
    )
    path = taskfile(
        repo, f"id: own\ntitle: t\ngraph:\n  - {{id: s1, kind: shell, cmd: {json.dumps(plant)}}}\n"
    )
    code, stdout, stderr = coder(repo, "run", "--autonomous", "--no-sandbox", "-f", str(path))
    assert code == 0, stdout + stderr
    assert fingerprint(out) == before
    artifacts = repo / ".coder" / "artifacts" / "own"
    for name in ("s1.diff", "s1-attempt1.log"):
        assert not (artifacts / name).is_symlink()
        assert (artifacts / name).stat().st_mode & 0o777 == 0o600
    assert "+x" in (artifacts / "s1.diff").read_text()
    assert (artifacts / "s1-attempt1.log").read_text().startswith("$ mkdir -p")


# --------------------------------------------------------------------------- the discard


@pytest.mark.parametrize("aim", ["home", "checkout", "outside"])
def test_the_discard_of_a_failed_step_never_writes_through_a_planted_link(
    make_repo, isolated_home: Path, tmp_path: Path, aim: str
) -> None:
    """A step replaces the tracked directory `src` with a link to $HOME, the user's checkout
    (holding uncommitted work in its own `src/`) or a directory outside, then fails: the
    discard puts `src` back as a directory in the worktree and writes nothing there."""
    repo = make_repo({"src/a.txt": "committed a\n", "src/.bashrc": "from the repo\n"})
    (repo / "src" / "a.txt").write_text("the user's uncommitted edit\n")
    (isolated_home / ".bashrc").write_text("my shell setup\n")
    (isolated_home / "a.txt").write_text("home a\n")
    out = outside_dir(tmp_path)
    target = {"home": isolated_home, "checkout": repo / "src", "outside": out}[aim]
    before = {p: fingerprint(p) for p in (isolated_home, repo / "src", out)}
    checkout = snapshot(repo)

    code, stdout, stderr = run_steps(repo, f"rm -rf src && ln -s {target} src && false")

    assert code == 1, stdout + stderr  # the step failed; the discard was no environment problem
    assert state_of(repo, "own")["steps"]["s1"]["status"] == "failed"
    assert {p: fingerprint(p) for p in before} == before
    assert snapshot(repo) == checkout
    src = worktree(repo) / "src"
    assert not src.is_symlink() and (src / ".bashrc").read_text() == "from the repo\n"
    assert git(worktree(repo), "status", "--porcelain") == ""


def test_the_discard_removes_a_planted_link_but_not_what_it_names(
    make_repo, tmp_path: Path
) -> None:
    """Untracked leftovers the discard deletes: a link to a directory outside goes, the
    directory and its files stay."""
    repo = make_repo({"a.txt": "a\n"})
    out = outside_dir(tmp_path)
    before = fingerprint(out)
    code, _, _ = run_steps(repo, f"ln -s {out} link && ln -s {out}/a.txt flink && false")
    assert code == 1
    assert fingerprint(out) == before
    assert not os.path.lexists(worktree(repo) / "link")
    assert not os.path.lexists(worktree(repo) / "flink")


@confined_here
def test_the_discard_runs_confined(make_repo, tmp_path: Path) -> None:
    """The second wall under the first: the discard's own libgit2 checkout runs confined like
    the commands, so even a write it is tricked into aiming outside fails in the kernel."""
    from coder.policy.confine import confined

    repo = make_repo()
    code, _, _ = run_steps(repo, "true")
    assert code == 0
    out = outside_dir(tmp_path)
    before = fingerprint(out)

    def write_outside() -> None:
        (out / "a.txt").write_text("written by a confined call\n")

    # Landlock's EACCES, the read-only mount's EROFS, or ENOENT: not in the thread's view
    with pytest.raises(OSError) as refused:
        confined(worktree(repo), write_outside)
    assert refused.value.errno in (errno.EACCES, errno.EROFS, errno.ENOENT)
    assert fingerprint(out) == before


# --------------------------------------------------------------------------- submodules


def with_submodule(make_repo) -> Path:
    lib = make_repo({"lib.txt": "lib\n", "dir/x.txt": "x\n"}, name="lib")
    repo = make_repo({"README.md": "# r\n"}, name="repo")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(repo, "commit", "-q", "-m", "add the submodule")
    return repo


@pytest.mark.parametrize(
    "plant",
    [
        # the submodule's own config aims its files elsewhere
        "printf '[core]\\n\\tworktree = {out}\\n' >> vendor/lib/.git/config",
        # its .git directory replaced by a gitdir: file naming another repository
        "mv vendor/lib/.git vendor/lib/.git.real && printf 'gitdir: {out}/.git\\n' > "
        "vendor/lib/.git",
        # the submodule directory itself replaced by a link
        "rm -rf vendor/lib && ln -s {out} vendor/lib",
    ],
    ids=["core.worktree", "gitdir-file", "link"],
)
def test_submodule_resets_stay_in_the_worktree(make_repo, tmp_path: Path, plant: str) -> None:
    repo = with_submodule(make_repo)
    out = outside_dir(tmp_path)
    git(out, "init", "-q")  # a repository out there, for the gitdir: file to name
    (out / "untracked.txt").write_text("the discard removes untracked files\n")
    before = fingerprint(out)
    code, stdout, stderr = run_steps(repo, plant.format(out=out) + " && false")
    assert code == 1, stdout + stderr
    assert state_of(repo, "own")["steps"]["s1"]["status"] == "failed"
    assert fingerprint(out) == before
    sub = worktree(repo) / "vendor" / "lib"
    assert (sub / "lib.txt").read_text() == "lib\n" and (sub / ".git").is_dir()
    recorded = git(repo, "rev-parse", "HEAD:vendor/lib").strip()
    assert git(sub, "rev-parse", "HEAD").strip() == recorded
    assert "core.worktree" not in git(sub, "config", "--list", "--local")  # re-created
    assert git(sub, "status", "--porcelain") == ""


def test_an_injected_gitlink_with_a_nested_repository_is_reset_in_place(
    make_repo, tmp_path: Path
) -> None:
    """A commit carries a gitlink and a nested repository whose config aims its files at a
    directory outside: discarding the next step's changes resets it where it is."""
    from coder.git import restore, worktrees

    repo = make_repo({"README.md": "# r\n"})
    import pygit2

    wt = worktrees.create_worktree(
        pygit2.Repository(str(repo)),
        name="inj",
        path=repo / ".coder" / "worktrees" / "inj",
        branch="agent/inj",
        start="main",
    )
    nested = wt / "evil"
    git(wt, "init", "-q", "evil")
    (nested / "f.txt").write_text("nested\n")
    git(nested, "add", "f.txt")
    git(nested, "commit", "-q", "-m", "nested")
    head = git(nested, "rev-parse", "HEAD").strip()
    (wt / ".gitmodules").write_text('[submodule "evil"]\n\tpath = evil\n\turl = ./evil\n')
    git(wt, "update-index", "--add", "--cacheinfo", f"160000,{head},evil")
    git(wt, "add", ".gitmodules")
    git(wt, "commit", "-q", "-m", "inject")
    tip = git(wt, "rev-parse", "HEAD").strip()
    out = outside_dir(tmp_path)
    git(nested, "config", "core.worktree", str(out))
    before = fingerprint(out)

    restore.discard_changes(wt, tip)

    assert fingerprint(out) == before
    assert (nested / "f.txt").read_text() == "nested\n"


# --------------------------------------------------------------------------- worktree removal


def test_removing_a_worktree_never_deletes_what_its_admin_file_names(
    make_repo, tmp_path: Path
) -> None:
    """The worktree's admin `gitdir` file names a directory outside (a run's git guard
    restores it after each step; a process the sandbox did not hold, or the merge check's
    tests below, can still write it): `coder clean` deletes the worktree coder made, not
    that directory."""
    repo = make_repo()
    out = outside_dir(tmp_path)
    before = fingerprint(out)
    code, _, _ = run_steps(repo, "echo x > x.txt")
    assert code == 0
    (repo / ".git" / "worktrees" / "own" / "gitdir").write_text(f"{out}/.git\n")
    code, stdout, stderr = coder(repo, "clean", "-t", "own", "--force")
    assert code == 0, stdout + stderr
    assert fingerprint(out) == before
    assert not worktree(repo).exists()
    assert "own" not in git(repo, "worktree", "list")


def test_merge_if_green_cleanup_never_deletes_what_the_check_admin_file_names(
    make_repo, tmp_path: Path
) -> None:
    """The project's tests, run by `merge --if-green` in its check worktree, rewrite that
    worktree's admin `gitdir` (where the mount wall does not keep it read-only, and go on
    either way): the cleanup after the check deletes only the check worktree."""
    repo = make_repo({"README.md": "# r\n"})
    out = outside_dir(tmp_path)
    before = fingerprint(out)
    forge = f'echo {out}/.git > "$(git rev-parse --git-dir)/gitdir"; true'
    config = {"test_command": forge}
    (repo / "coder.config.json").write_text(json.dumps(config))
    git(repo, "add", "coder.config.json")
    git(repo, "commit", "-q", "-m", "config")
    code, stdout, stderr = run_steps(repo, "echo x > x.txt")
    assert code == 0, stdout + stderr
    code, stdout, stderr = coder(repo, "merge", "-t", "own", "--if-green")
    assert code == 0, stdout + stderr
    assert fingerprint(out) == before
    assert not (repo / ".coder" / "worktrees" / "own--merge.check").exists()


# --------------------------------------------------------------------------- the merge


@pytest.mark.parametrize("ignored", [False, True])
def test_the_merge_never_writes_through_a_link_in_the_users_checkout(
    make_repo, tmp_path: Path, ignored: bool
) -> None:
    """The run adds `newdir/file.py`; in the user's checkout `newdir` is an untracked (or
    ignored) link to a directory outside: the merge refuses, naming it, and changes nothing."""
    repo = make_repo({"README.md": "# r\n"})
    code, _, _ = run_steps(repo, "mkdir newdir && echo 'x = 1' > newdir/file.py")
    assert code == 0
    out = outside_dir(tmp_path)
    (repo / "newdir").symlink_to(out)
    if ignored:
        (repo / ".git" / "info" / "exclude").write_text("/newdir\n/.coder/\n")
    before, checkout = fingerprint(out), snapshot(repo)
    code, stdout, stderr = coder(repo, "merge", "-t", "own")
    assert code == 3, stdout + stderr
    assert "newdir in " in stderr and "is a symbolic link or a file where the merge" in stderr
    assert "move it out of the way" in stderr and "Traceback" not in stderr
    assert fingerprint(out) == before
    assert snapshot(repo) == checkout  # main did not move either
    (repo / "newdir").unlink()
    code, stdout, stderr = coder(repo, "merge", "-t", "own")
    assert code == 0, stdout + stderr
    assert (repo / "newdir" / "file.py").read_text() == "x = 1\n"


def test_a_tracked_link_that_becomes_a_directory_is_merged(make_repo, tmp_path: Path) -> None:
    """The update itself replaces a tracked link with a directory: that is the run's change,
    not something in the way; the link goes, never what it named."""
    repo = make_repo({"README.md": "# r\n"})
    out = outside_dir(tmp_path)
    (repo / "d").symlink_to(out)
    git(repo, "add", "d")
    git(repo, "commit", "-q", "-m", "a link")
    before = fingerprint(out)
    code, _, _ = run_steps(repo, "rm d && mkdir d && echo y > d/a.txt")
    assert code == 0
    code, stdout, stderr = coder(repo, "merge", "-t", "own")
    assert code == 0, stdout + stderr
    assert fingerprint(out) == before
    assert not (repo / "d").is_symlink() and (repo / "d" / "a.txt").read_text() == "y\n"


# --------------------------------------------------------------------------- the file tools


SWAPPER = """
import os, sys, time
root, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
d, real = os.path.join(root, "d"), os.path.join(root, "d.real")
while not os.path.exists(stop):  # a directory and a link by turns, each about a millisecond
    try:
        os.rename(d, real); os.symlink(out, d); time.sleep(0.001)
        os.unlink(d); os.rename(real, d); time.sleep(0.001)
    except OSError:
        pass
"""


def test_the_file_tools_never_write_through_a_link_swapped_in_under_them(
    make_repo, tmp_path: Path
) -> None:
    """A process the model left running swaps the directory `d` for a link to a directory
    outside, over and over, while the model writes, edits and patches files in `d`: for
    several seconds, every write lands in the worktree or is refused, never outside."""
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.taskfile.policies import Policies
    from coder.tools.base import ToolContext
    from coder.tools.registry import default_registry

    repo = make_repo({"README.md": "# r\n"})
    root = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(root))  # fs_apply_patch needs a repository
    (root / "d").mkdir()
    (root / "d" / "e.txt").write_text("edit me\n")
    out = outside_dir(tmp_path)
    (out / "e.txt").write_text("edit me\n")  # the same name and text: an edit could land
    ctx = ToolContext(
        root=root,
        policy=Policy(),
        redactor=Redactor(),
        policies=Policies(veto_syntax_errors=False, lint_after_edit=False),
    )
    registry = default_registry()
    before = fingerprint(out)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(out), str(stop)])
    landed = refused = 0
    # long enough to matter, however loaded the machine: 3 s and 100 writes that landed
    started, i = time.monotonic(), 0
    try:
        while time.monotonic() - started < 3 or landed < 100:
            i += 1
            patch = f"--- /dev/null\n+++ b/d/p{i}.txt\n@@ -0,0 +1 @@\n+{i}\n"
            for name, args in (
                ("fs_write", {"path": f"d/new{i}.txt", "content": f"{i}\n"}),
                ("fs_edit", {"path": "d/e.txt", "search": "edit me", "replace": f"edit me {i}"}),
                ("fs_edit", {"path": "d/e.txt", "search": f"edit me {i}", "replace": "edit me"}),
                ("fs_apply_patch", {"patch": patch}),
            ):
                result = registry.call(name, args, ctx)
                landed += result.ok
                refused += not result.ok
            assert time.monotonic() - started < 120, f"only {landed} writes landed in 2 min"
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert fingerprint(out) == before, "a write landed outside the worktree"
    assert refused > 0  # the swapper really got in the way
    assert not [p for p in root.rglob("*coder-tmp")]


def test_fs_edit_keeps_the_files_mode(tmp_path: Path) -> None:
    from coder.policy.commands import Policy
    from coder.redact import Redactor
    from coder.taskfile.policies import Policies
    from coder.tools.base import ToolContext
    from coder.tools.registry import default_registry

    (tmp_path / "run.sh").write_text("echo a\n")
    (tmp_path / "run.sh").chmod(0o750)
    ctx = ToolContext(
        root=tmp_path,
        policy=Policy(),
        redactor=Redactor(),
        policies=Policies(lint_after_edit=False),
    )
    args = {"path": "run.sh", "search": "echo a", "replace": "echo b"}
    assert default_registry().call("fs_edit", args, ctx).ok
    assert (tmp_path / "run.sh").stat().st_mode & 0o7777 == 0o750
    assert (tmp_path / "run.sh").read_text() == "echo b\n"


def test_a_fifo_in_place_of_an_admin_file_is_refused_not_waited_on(make_repo) -> None:
    """A runner killed before its git guard ran leaves what the command made: a FIFO in place
    of the admin dir's HEAD would hang libgit2 (and coder) at the next open of the worktree.
    `coder resume` refuses at once, naming it (a subprocess, so a hang fails the test)."""
    repo = make_repo()
    code, _, _ = run_steps(repo, "true", "false")
    assert code == 1
    head = repo / ".git" / "worktrees" / "own" / "HEAD"
    head.unlink()
    os.mkfifo(head)
    done = subprocess.run(
        [sys.executable, "-m", "coder", "resume", "-t", "own"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "HEAD is a named pipe (FIFO), not the file git made" in done.stderr
    assert "Traceback" not in done.stderr
