"""The metadata wall in real runs (issue 20): a step's command or the model's `shell_run` cannot
change the mode, times or extended attributes of anything outside its worktree (the user's
checkout, its .git, `$HOME`, a directory outside the repository), and cannot leave a setuid or
setgid file anywhere. Each is judged by fingerprints (content, mode, owner, mtime, xattrs) of
the targets taken before and after, never by coder's messages."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from coder.policy import kernel
from tests.conftest import coder, git
from tests.helpers import call, done, fingerprint, state_of, taskfile
from tests.run.test_containment import step_log, user_repo

FOUND = kernel.support()
needs_mounts = pytest.mark.skipif(
    not FOUND.available or FOUND.mounts_problem is not None,
    reason=f"no read-only mount namespace here: {FOUND.problem or FOUND.mounts_problem}",
)
needs_seccomp = pytest.mark.skipif(
    not FOUND.available or FOUND.setid_problem is not None,
    reason=f"no seccomp filter here: {FOUND.problem or FOUND.setid_problem}",
)
SETID = stat.S_ISUID | stat.S_ISGID
# How each attempt is refused: read-only where the target is in the command's view (the
# checkout's directory, $HOME), absent where it is not (coder.policy.view).
REFUSED = ("Read-only file system", "No such file or directory")


def refusals(text: str) -> int:
    return sum(1 for line in text.splitlines() if any(sign in line for sign in REFUSED))


class Targets:
    """The user's checkout (its files, its .git config and hooks), $HOME and a directory
    outside the repository, fingerprinted before and compared after."""

    def __init__(self, repo: Path, home: Path, elsewhere: Path) -> None:
        (home / ".bashrc").write_text("# mine\n")
        elsewhere.mkdir()
        (elsewhere / "data.txt").write_text("outside\n")
        self.repo, self.home, self.elsewhere = repo, home, elsewhere
        self.before = self.take()

    def take(self) -> dict[str, Any]:
        checkout = {
            rel: entry
            for rel, entry in fingerprint(self.repo).items()
            if not rel.startswith((".coder", ".git"))  # the run's own state, refs, objects
        }
        git_dir = self.repo / ".git"
        config = fingerprint(git_dir)["config"]
        return {
            "checkout": checkout,
            "git": (git_dir.stat().st_mode, config, fingerprint(git_dir / "hooks")),
            "home": fingerprint(self.home),
            "elsewhere": fingerprint(self.elsewhere),
        }

    def assert_unchanged(self) -> None:
        after = self.take()
        for key, value in self.before.items():
            assert after[key] == value, key


ATTEMPTS = [  # (target as seen from the worktree .coder/worktrees/esc, what is done to it)
    "chmod 777 ../../../README.md",
    "touch -d 2000-01-01 ../../../work.txt",
    "python3 -c \"import os; os.setxattr('../../../notes.txt', 'user.x', b'1')\"",
    "chmod 700 ../../..",
    "chmod 666 ../../../.git/config",
    "chmod 777 ../../../.git",
    "touch -d 2000-01-01 ../../../.git/hooks",
    "chmod 777 ~/.bashrc",
    "touch -d 2000-01-01 ~",
    "python3 -c \"import os; os.setxattr(os.path.expanduser('~/.bashrc'), 'user.x', b'1')\"",
    "chmod 777 {elsewhere}/data.txt",
    "touch -d 2000-01-01 {elsewhere}",
]


def run_shell(repo: Path, cmd: str) -> tuple[int, dict[str, Any]]:
    """One shell step `cmd` in a run `esc` (as tests/run/test_containment.py runs them)."""
    path = taskfile(
        repo,
        f"id: esc\ntitle: escape attempt\ngraph:\n  - {{id: s1, kind: shell, cmd: {json.dumps(cmd)}}}\n",
    )
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert (repo / ".coder" / "state" / "esc.json").exists(), err  # it ran
    return code, state_of(repo, "esc")["steps"]["s1"]


@needs_mounts
def test_a_step_cannot_change_metadata_outside_its_worktree(
    make_repo, isolated_home: Path, tmp_path: Path
) -> None:
    repo = user_repo(make_repo)
    targets = Targets(repo, isolated_home, tmp_path / "elsewhere")
    cmd = "; ".join(a.format(elsewhere=targets.elsewhere) for a in ATTEMPTS)
    code, step = run_shell(repo, cmd + "; echo done > done.txt")
    assert code == 0, step  # the last command succeeds: the step is judged by the targets
    targets.assert_unchanged()
    assert refusals(step_log(repo)) == len(ATTEMPTS)


@needs_mounts
def test_the_model_cannot_change_metadata_outside_its_worktree(
    make_repo, isolated_home: Path, tmp_path: Path, fake: Any
) -> None:
    repo = user_repo(make_repo)
    targets = Targets(repo, isolated_home, tmp_path / "elsewhere")
    cmd = "chmod 777 ../../../README.md ~/.bashrc; touch -d 2000-01-01 ../../../.git/config"
    fake.enqueue(call("shell_run", cmd=cmd), done("tried"))
    path = taskfile(
        repo,
        """
        id: esc
        title: model metadata
        graph:
          - {id: s1, kind: custom, goal: loosen some modes}
        """,
    )
    coder(repo, "run", "--autonomous", "-f", str(path))
    tool_reply = next(m for m in fake.chat_bodies()[-1]["messages"] if m["role"] == "tool")
    assert refusals(tool_reply["content"]) == 3, tool_reply
    targets.assert_unchanged()


@needs_seccomp
def test_no_setuid_file_is_left_in_the_worktree_or_merged(
    make_repo, isolated_home: Path, tmp_path: Path
) -> None:
    """A setuid shell left in a checkout runs as its owner for whoever starts it. The step's
    chmod fails; the copy it commits and the merge brings are plain executables."""
    repo = user_repo(make_repo)
    targets = Targets(repo, isolated_home, tmp_path / "elsewhere")
    code, step = run_shell(
        repo,
        "cp /bin/sh ./sh && chmod 4755 ./sh; cp -p /bin/sh ./sh2 && chmod 6755 ./sh2;"
        " python3 -c \"import os; os.open('sh3', os.O_CREAT | os.O_WRONLY, 0o4755)\"; true",
    )
    assert code == 0, step
    log = step_log(repo)
    assert log.count("Operation not permitted") == 3, log
    worktree = repo / ".coder" / "worktrees" / "esc"
    assert [p.name for p in worktree.iterdir() if p.lstat().st_mode & SETID] == []
    assert (worktree / "sh").stat().st_mode & 0o777 == 0o755
    targets.assert_unchanged()

    git(repo, "stash", "-q", "-u")  # merge needs a clean checkout
    merged, _, err = coder(repo, "merge", "-t", "esc")
    assert merged == 0, err
    assert (repo / "sh").stat().st_mode & (SETID | 0o777) == 0o755
    assert not [p for p in repo.rglob("*") if p.is_file() and p.lstat().st_mode & SETID]
