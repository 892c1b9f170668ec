"""Containment, tried as a hostile user would: a step's command or the model's `shell_run`
cannot touch anything outside its worktree (the user's checkout, refs, `$HOME`, `.coder/`), and
a step cannot commit protected paths. Each reproduction of issue 12 is a test: the attempt is
refused or fails its step, and everything outside is byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from coder.policy import kernel
from coder.policy.paths import PROTECTED
from tests.conftest import coder, git
from tests.helpers import (
    call,
    chat_requests,
    denied,
    done,
    refused_outside,
    snapshot,
    state_of,
    taskfile,
)
from tests.policy.test_protected_table import example

pytestmark = pytest.mark.skipif(
    not kernel.support().available,
    reason=f"no kernel sandbox here: {kernel.support().problem}",
)


def hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (symlinks by target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = "-> " + str(path.readlink())
        elif path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def user_repo(make_repo: Any) -> Path:
    """A repo with one commit, uncommitted work and an untracked file in the checkout, and
    another run's state under .coder/."""
    repo = make_repo({"work.txt": "committed\n", "README.md": "# r\n"})
    (repo / "work.txt").write_text("uncommitted edit\n")
    (repo / "notes.txt").write_text("untracked notes\n")
    (repo / ".coder" / "state").mkdir(parents=True)
    (repo / ".coder" / "state" / "other.json").write_text('{"other": "run"}\n')
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("/.coder/\n")  # as coder does, so the checkout's status is comparable
    return repo


class Outside:
    """Everything outside the worktree a command could damage, taken before and compared."""

    def __init__(self, repo: Path, home: Path) -> None:
        self.repo, self.home = repo, home
        self.before = self.take()

    def take(self) -> dict[str, Any]:
        return {
            "checkout": snapshot(self.repo),
            "refs": git(self.repo, "for-each-ref", "--format=%(refname) %(objectname)"),
            "git": hashes(self.repo / ".git" / "hooks")
            | {"config": hashlib.sha256((self.repo / ".git" / "config").read_bytes()).hexdigest()},
            "home": hashes(self.home),
            "other_state": (self.repo / ".coder" / "state" / "other.json").read_bytes(),
        }

    def assert_unchanged(self) -> None:
        after = self.take()
        refs_before = [r for r in self.before["refs"].splitlines() if "agent/" not in r]
        refs_after = [r for r in after["refs"].splitlines() if "agent/" not in r]
        assert refs_after == refs_before  # the run's own branch is the only ref that moves
        for key in ("checkout", "git", "home", "other_state"):
            assert after[key] == self.before[key], key


def run_shell(repo: Path, cmd: str, *extra: str, changes: str = "") -> tuple[int, dict[str, Any]]:
    path = taskfile(
        repo,
        f"""
        id: esc
        title: escape attempt
        graph:
          - id: s1
            kind: shell
            cmd: {json.dumps(cmd)}
            {changes}
        """,
    )
    code, _out, _err = coder(repo, "run", "--autonomous", "-f", str(path), *extra)
    return code, state_of(repo, "esc")["steps"]["s1"]


def step_log(repo: Path) -> str:
    return (repo / ".coder" / "artifacts" / "esc" / "s1-attempt1.log").read_text()


def test_a_step_cannot_delete_the_users_files_or_write_home(make_repo, isolated_home) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(
        repo,
        "rm ../../../notes.txt; git -C ../../.. checkout -- work.txt; echo hi > ~/pwned.txt",
    )
    assert code == 1 and step["status"] == "failed"
    log = step_log(repo)
    signs = refused_outside()  # the checkout's files are not in the command's view
    assert any(f"rm: cannot remove '../../../notes.txt': {sign}" in log for sign in signs)
    assert f"pwned.txt: {denied()}" in log
    outside.assert_unchanged()
    assert not (isolated_home / "pwned.txt").exists()
    assert (repo / "work.txt").read_text() == "uncommitted edit\n"


def test_a_step_cannot_move_the_base_branch(make_repo, isolated_home) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(repo, "echo x > x.txt && git update-ref refs/heads/main HEAD")
    assert code == 1 and "exited with 128" in step["error"]
    assert denied() in step_log(repo)
    outside.assert_unchanged()


@pytest.mark.parametrize("target", ["/tmp/coder-escape-x", "../x", "../../state/other.json"])
def test_writes_outside_the_worktree_fail(make_repo, isolated_home, target: str) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(repo, f"echo pwned > {target}")
    assert code == 1 and step["status"] == "failed"
    assert any(sign in step_log(repo) for sign in refused_outside())
    outside.assert_unchanged()
    assert not Path("/tmp/coder-escape-x").exists()
    assert not (repo / ".coder" / "worktrees" / "x").exists()


@pytest.mark.parametrize(
    "cmd",
    [
        "git tag evil",
        "echo 'exit 0' > ../../../.git/hooks/pre-commit",
        "git config user.name evil",
        "git commit --allow-empty -qm evil",
        "echo x > ~/.gitconfig",
    ],
)
def test_refs_hooks_config_and_commits_are_out_of_reach(make_repo, isolated_home, cmd: str) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(repo, cmd)
    assert code == 1 and step["status"] == "failed", step
    log = step_log(repo)  # the kernel's EACCES, as each program words it
    assert denied() in log or "insufficient permission" in log, log
    outside.assert_unchanged()
    assert git(repo, "tag") == ""


def test_the_worktree_its_git_admin_dir_and_tmpdir_are_writable(make_repo) -> None:
    repo = make_repo()
    code, step = run_shell(
        repo,
        'echo ok > made.txt && git status --short && echo t > "$TMPDIR/t" && cat "$TMPDIR/t"'
        " && echo quiet > /dev/null",
    )
    assert code == 0, step
    assert git(repo, "show", "agent/esc-escape-attempt:made.txt") == "ok\n"
    assert "?? made.txt" in step_log(repo)


def refused(admin_file: str) -> str:
    """How a step fails that rewrote its worktree's admin file: the read-only mount refuses the
    write where there is one (writes.admin_files), else the git guard puts it back."""
    walled = kernel.support().mounts_problem is None
    return "Read-only file system" if walled else f"the step changed {admin_file}"


@pytest.mark.usefixtures("scan")
def test_the_admin_dir_head_cannot_redirect_the_step_commit(make_repo, isolated_home) -> None:
    """The admin dir is writable (git status needs its index); pointing its HEAD at main
    would make the executor's commit land on main. The step fails; HEAD is as it was."""
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(
        repo, 'echo x > x.txt && echo "ref: refs/heads/main" > "$(git rev-parse --git-dir)/HEAD"'
    )
    assert code == 1
    assert refused(".git/worktrees/esc/HEAD") in step["error"]
    outside.assert_unchanged()
    admin_head = (repo / ".git" / "worktrees" / "esc" / "HEAD").read_text()
    assert admin_head == "ref: refs/heads/agent/esc-escape-attempt\n"


def test_the_worktree_config_cannot_redirect_coders_own_git(make_repo, isolated_home) -> None:
    """With extensions.worktreeConfig (sparse checkouts set it), git and libgit2 read the
    admin dir's config.worktree, which a command can write: its `core.worktree` would aim
    coder's checkouts elsewhere, its `core.fsmonitor` run a program. The step fails; the file
    is kept empty (read-only) or removed by the guard."""
    repo = user_repo(make_repo)
    git(repo, "config", "extensions.worktreeConfig", "true")
    outside = Outside(repo, isolated_home)
    code, step = run_shell(
        repo,
        'printf "[core]\\n\\tworktree = %s\\n" "$HOME" > "$(git rev-parse --git-dir)/config.worktree"',
    )
    assert code == 1
    assert refused(".git/worktrees/esc/config.worktree") in step["error"]
    outside.assert_unchanged()
    config = repo / ".git" / "worktrees" / "esc" / "config.worktree"
    assert not config.exists() or config.read_bytes() == b""


@pytest.mark.parametrize(
    "cmd",
    [  # each aims coder's own (unconfined) restore of .git at the user's files
        'echo "gitdir: $(realpath ../../../.git)" > .git',
        'ln -sf ../../refs/heads/main "$(git rev-parse --git-dir)/HEAD"',
        "rm .git && ln -s ~/.gitconfig .git",
        "python3 -c \"import os; os.unlink('$(git rev-parse --git-dir)/HEAD'); "
        "os.mkfifo('$(git rev-parse --git-dir)/HEAD')\"",  # reading it would hang
    ],
)
@pytest.mark.usefixtures("scan")
def test_the_git_guard_restores_without_following_the_step(
    make_repo, isolated_home, cmd: str
) -> None:
    """With the sandbox off (as a machine without the mount wall, where the admin files are
    writable to commands), the git guard is what puts them back."""
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    code, step = run_shell(repo, "echo x > x.txt && " + cmd, "--no-sandbox")
    assert code == 1 and "belongs to coder's executor" in step["error"], step
    outside.assert_unchanged()
    assert (repo / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    worktree = repo / ".coder" / "worktrees" / "esc"
    assert not (worktree / ".git").is_symlink()
    assert git(worktree, "symbolic-ref", "HEAD") == "refs/heads/agent/esc-escape-attempt\n"


def test_a_process_a_step_leaves_running_does_not_outlive_the_step(make_repo) -> None:
    """A daemon could change the worktree after the step's checks, before its commit (a
    protected path, the admin dir's HEAD): it is ended before the checks."""
    from tests.policy.test_confine import DAEMON, daemon_pid, gone

    repo = make_repo()
    code, step = run_shell(repo, DAEMON)
    assert code == 0, step
    pid = daemon_pid(repo / ".coder" / "worktrees" / "esc")
    assert gone(pid)


def test_a_double_forked_daemon_is_ended_before_the_commit(make_repo) -> None:
    """Its parent exited, so it is in no command's tree; coder, the child subreaper of its
    run, still finds and ends it before the checks: the worktree is the step's commit
    afterwards, and stays so; nothing of it is left, not even a zombie."""
    from tests.policy.test_reaper import DOUBLE_FORK

    repo = make_repo()
    code, step = run_shell(repo, DOUBLE_FORK)
    assert code == 0, step
    worktree = repo / ".coder" / "worktrees" / "esc"
    pid = int((worktree / "daemon.pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # ended and reaped
    committed = git(worktree, "show", f"{step['commit']}:tick.txt")
    time.sleep(0.1)
    assert (worktree / "tick.txt").read_text() == committed
    assert git(worktree, "status", "--porcelain") == ""


def test_the_model_cannot_reset_the_users_checkout(make_repo, isolated_home, fake) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    fake.enqueue(call("shell_run", cmd="git -C ../../.. reset -q --hard"), done("tried"))
    path = taskfile(
        repo,
        """
        id: esc
        title: model escape
        graph:
          - {id: s1, kind: custom, goal: reset the checkout}
        """,
    )
    coder(repo, "run", "--autonomous", "-f", str(path))
    tool_reply = [m for m in fake.chat_bodies()[-1]["messages"] if m["role"] == "tool"][0]
    assert denied() in tool_reply["content"]
    outside.assert_unchanged()
    assert (repo / "work.txt").read_text() == "uncommitted edit\n"


PROTECTED_WRITES = {
    "coder.config.json": "echo '{\"allow_network\": true}' > coder.config.json",
    ".env.local": "echo TOKEN=x > .env.local",
    "id_rsa": "echo key > id_rsa",
    ".github/workflows/ci.yml": "mkdir -p .github/workflows && echo on: push > "
    ".github/workflows/ci.yml",
    ".gitlab-ci.yml": "echo job: x > .gitlab-ci.yml",
    "deploy.pem": "echo cert > deploy.pem",
}


@pytest.mark.parametrize("rel", sorted(PROTECTED_WRITES))
@pytest.mark.usefixtures("scan")
def test_a_step_commit_of_a_protected_path_fails(make_repo, rel: str) -> None:
    repo = make_repo()
    code, step = run_shell(repo, PROTECTED_WRITES[rel] + " && echo fine > ok.txt")
    assert code == 1 and step["commit"] is None
    assert step["error"].startswith(f"the step changed protected path {rel} (")
    assert f"Name {rel} in the step's `changes`" in step["error"]
    assert git(repo, "rev-parse", "agent/esc-escape-attempt") == git(repo, "rev-parse", "main")


def no_commit_carries(repo: Path, *paths: str) -> None:
    """The run's branch is still main, and no commit anywhere holds any of `paths`."""
    assert git(repo, "rev-parse", "agent/esc-escape-attempt") == git(repo, "rev-parse", "main")
    committed = set(git(repo, "log", "--all", "--format=", "--name-only").split())
    assert not committed & set(paths), committed & set(paths)


def test_every_protected_path_fails_the_step_before_its_commit(make_repo) -> None:
    """One step writes an example of every row of the table: each is named, none committed."""
    repo = make_repo()
    rels = [example(pattern) for pattern, _ in PROTECTED]
    dirs = sorted({rel.rpartition("/")[0] for rel in rels if "/" in rel})
    cmd = f"mkdir -p {' '.join(dirs)} && " + " && ".join(f"echo x > {rel}" for rel in rels)
    code, step = run_shell(repo, cmd + " && echo fine > ok.txt")
    assert code == 1 and step["commit"] is None
    for rel in rels:
        assert f"the step changed protected path {rel} (" in step["error"], rel
    no_commit_carries(repo, *rels, "ok.txt")


@pytest.mark.parametrize(
    "cmd, named",
    [
        # a symlinked .github: the workflow is written under another name, the link added
        (
            "mkdir -p ci/workflows && echo on: push > ci/workflows/x.yml && ln -s ci .github",
            ".github",
        ),
        # a link pointing at a protected path is protected: committed, it is that path
        ("mkdir -p .github/workflows && ln -s .github/workflows ci", "ci"),
        ("ln -s .git/config x", "x"),
        ("ln -s .vscode/tasks.json tasks.json", "tasks.json"),  # dangling: still that path
    ],
)
def test_a_symlink_to_a_protected_path_fails_the_step(make_repo, cmd: str, named: str) -> None:
    repo = make_repo()
    code, step = run_shell(repo, cmd + " && echo fine > ok.txt")
    assert code == 1 and step["commit"] is None
    assert f"the step changed protected path {named} (" in step["error"]
    no_commit_carries(repo, named, "ci/workflows/x.yml", "ok.txt")


def test_a_tracked_symlinked_github_makes_its_target_a_workflow(make_repo) -> None:
    """`.github -> ci` committed by the user: a step writing ci/workflows/ writes a workflow."""
    repo = make_repo({"ci/README.md": "# ci\n"})
    (repo / ".github").symlink_to("ci")
    git(repo, "add", ".github")
    git(repo, "commit", "-qm", "github is ci")
    code, step = run_shell(repo, "mkdir -p ci/workflows && echo on: push > ci/workflows/x.yml")
    assert code == 1 and step["commit"] is None
    assert step["error"].startswith(
        "the step changed protected path ci/workflows/x.yml (the symlink .github makes it "
        ".github/workflows/x.yml: it runs on your CI"
    )
    no_commit_carries(repo, "ci/workflows/x.yml")


@pytest.mark.usefixtures("scan")
def test_a_protected_path_the_step_names_in_changes_is_committed(make_repo) -> None:
    repo = make_repo()
    code, step = run_shell(
        repo,
        PROTECTED_WRITES[".github/workflows/ci.yml"],
        changes="changes: [{path: .github/workflows/ci.yml}]",
    )
    assert code == 0, step
    assert git(repo, "show", "agent/esc-escape-attempt:.github/workflows/ci.yml") == "on: push\n"


def test_the_model_cannot_land_a_config_or_secrets_through_merge(make_repo, fake) -> None:
    repo = make_repo({"calc.py": "x = 1\n"})
    widen = json.dumps({"allow_network": True, "allowed_commands": ["curl"]})
    fake.enqueue(
        call("shell_run", cmd=f"echo '{widen}' > coder.config.json"),
        call("shell_run", cmd="echo SECRET=1 > .env.local && echo k > id_rsa"),
        done("widened", "coder.config.json", ".env.local", "id_rsa"),
    )
    path = taskfile(
        repo,
        """
        id: esc
        title: model widens
        graph:
          - {id: s1, kind: custom, goal: edit the config}
        """,
    )
    code, _, _ = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1
    error = state_of(repo, "esc")["steps"]["s1"]["error"]
    assert "protected path coder.config.json" in error
    assert "protected path .env.local" in error and "protected path id_rsa" in error
    merged, _, err = coder(repo, "merge", "-t", "esc", "--if-green")
    assert merged == 2 and "only a successful run can be merged" in err
    assert git(repo, "ls-tree", "-r", "--name-only", "main").split() == ["calc.py"]


def test_a_program_copied_into_the_worktree_is_refused(make_repo, isolated_home) -> None:
    repo = user_repo(make_repo)
    outside = Outside(repo, isolated_home)
    path = taskfile(
        repo, 'title: t\ngraph:\n  - {kind: shell, cmd: "cp /usr/bin/whoami ./cat && ./cat"}\n'
    )
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 2
    assert "step s1: command refused: `./cat` is a program inside the worktree" in err
    assert not (repo / ".coder" / "tasks").exists()  # refused before anything was created
    outside.assert_unchanged()


@pytest.mark.parametrize(
    "cmd",
    [
        "git -c alias.x='!whoami > f' x",
        "sed -n '1e whoami' README.md",
        "tar --checkpoint=1 --checkpoint-action=exec=whoami -cf x.tar README.md",
    ],
)
def test_the_model_cannot_run_a_program_through_an_allowed_one(make_repo, fake, cmd: str) -> None:
    repo = make_repo()
    fake.enqueue(call("shell_run", cmd=cmd), done("tried"))
    path = taskfile(repo, "id: esc\ntitle: t\ngraph:\n  - {id: s1, kind: custom, goal: g}\n")
    coder(repo, "run", "--autonomous", "-f", str(path))
    tool_reply = [m for m in fake.chat_bodies()[-1]["messages"] if m["role"] == "tool"][0]
    assert "command refused by policy; nothing was run" in tool_reply["content"]
    assert not (repo / ".coder" / "worktrees" / "esc" / "f").exists()


@pytest.mark.parametrize("named", [True, False])
def test_the_models_file_tools_follow_the_same_rule(make_repo, fake, named: bool) -> None:
    repo = make_repo()
    ci = ".github/workflows/ci.yml"
    fake.enqueue(call("fs_write", path=ci, content="on: push\n"))
    fake.enqueue(done("wrote it", ci) if named else call("fs_read", path="README.md"))
    changes = f"changes: [{{path: {ci}, mode: create}}]" if named else ""
    path = taskfile(
        repo,
        f"""
        id: esc
        title: t
        policies: {{max_turns: 2}}
        graph:
          - id: s1
            kind: edit
            goal: add CI
            {changes}
        """,
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    tool_reply = [m for m in chat_requests(fake)[1]["messages"] if m["role"] == "tool"][0]
    if named:
        assert code == 0, out + err
        assert git(repo, "show", f"agent/esc-t:{ci}") == "on: push\n"
    else:
        assert "it runs on your CI, outside coder's sandbox" in tool_reply["content"]
        assert code == 1
