"""The kernel sandbox with real processes: what a confined command may write, its
capabilities, signals, resource limits, and the refusal to run unconfined by accident."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from coder.errors import EnvironmentProblem, InvalidInput
from coder.policy import confine, kernel, launch, sandbox, writes
from coder.policy.commands import Limits, Policy
from coder.policy.sandbox import run_command
from tests.conftest import coder, git
from tests.helpers import denied, state_of, taskfile

needs_sandbox = pytest.mark.skipif(
    not kernel.support().available,
    reason=f"no kernel sandbox here: {kernel.support().problem}",
)
POLICY = Policy(allowed_commands=Policy().allowed_commands | {"kill", "dd", "ulimit"})


@needs_sandbox
def test_only_the_root_and_tmpdir_are_writable(tmp_path: Path) -> None:
    root, outside = tmp_path / "wt", tmp_path / "outside.txt"
    root.mkdir()
    outside.write_text("keep\n")
    result = run_command(
        f'echo a > in.txt; echo b > "$TMPDIR/t" && echo tmp-ok; echo c > {outside}; : > {outside}',
        cwd=root,
        policy=POLICY,
        root=root,
    )
    assert (root / "in.txt").read_text() == "a\n"
    assert "tmp-ok" in result.stdout
    assert result.stderr.count(denied()) == 2, result.stderr
    assert outside.read_text() == "keep\n"


@needs_sandbox
def test_no_capabilities_and_no_signals_outside(tmp_path: Path) -> None:
    result = run_command(
        f"grep CapEff /proc/self/status; kill -0 {os.getpid()} || echo refused",
        cwd=tmp_path,
        policy=POLICY,
        root=tmp_path,
    )
    assert "CapEff:\t0000000000000000" in result.stdout
    assert "refused" in result.stdout


@needs_sandbox
def test_resource_limits_apply_to_the_command(tmp_path: Path) -> None:
    policy = Policy(allowed_commands=POLICY.allowed_commands, limits=Limits(file_size_mb=1))
    result = run_command(
        "dd if=/dev/zero of=big bs=1M count=3 2>/dev/null; echo $?; ulimit -f",
        cwd=tmp_path,
        policy=policy,
        root=tmp_path,
    )
    assert result.stdout.split() == ["153", "1024"]  # 128 + SIGXFSZ; 1 MiB in 1 KiB blocks
    assert (tmp_path / "big").stat().st_size == 1024 * 1024


def test_limits_from_config() -> None:
    assert Policy.from_config({"limits": {"memory_mb": 0}}).limits == Limits(memory_mb=0)
    with pytest.raises(InvalidInput, match="limits.cpu is unknown"):
        Limits.from_config({"cpu": 1})
    with pytest.raises(InvalidInput, match="limits.processes must be an integer >= 0"):
        Limits.from_config({"processes": -1})


def test_without_a_sandbox_commands_are_refused_unless_turned_off(
    make_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = kernel.Support(0, "none", "this kernel has no Landlock")
    monkeypatch.setattr(kernel, "support", lambda: missing)
    with pytest.raises(EnvironmentProblem, match="no kernel sandbox for commands"):
        sandbox.require_sandbox(Policy())
    sandbox.require_sandbox(Policy(sandbox=False))

    repo = make_repo()
    path = taskfile(repo, "title: t\ngraph:\n  - {kind: shell, cmd: echo x > x.txt}\n")
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 3 and "no kernel sandbox for commands: this kernel has no Landlock" in err
    assert '"sandbox": "off"' in err and not (repo / ".coder" / "tasks").exists()
    assert git(repo, "branch", "--list", "agent/*") == ""
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(path), "--no-sandbox")
    assert code == 0, err


@needs_sandbox
def test_the_launcher_confines_a_program_coder_does_not_start_itself(tmp_path: Path) -> None:
    """How external MCP servers run: the same sandbox, applied by a launcher process."""
    import subprocess

    root, outside = tmp_path / "wt", tmp_path / "outside.txt"
    root.mkdir()
    script = f"echo in > in.txt; echo out > {outside}; grep CapEff /proc/self/status"
    argv = launch.launcher_argv(["bash", "-c", script], root, network=False)
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    assert (root / "in.txt").read_text() == "in\n" and not outside.exists()
    assert denied() in done.stderr and "CapEff:\t0000000000000000" in done.stdout


# Leaves its command's process group, as a daemon does, before the command returns; its pid
# is in daemon.pid.
DAEMON = (
    "python3 -c 'import os, time\n"
    "r, w = os.pipe()\n"
    "pid = os.fork()\n"
    "if pid:\n"
    '    os.read(r, 1); open("daemon.pid", "w").write(str(pid)); os._exit(0)\n'
    'os.setsid(); os.write(w, b"x"); time.sleep(60)\''
    " >/dev/null 2>&1 </dev/null"
)


def daemon_pid(root: Path) -> int:
    return int((root / "daemon.pid").read_text())


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 5  # SIGKILL is delivered, not waited for
    while sandbox._alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not sandbox._alive(pid)


@needs_sandbox
def test_processes_left_in_a_sandbox_are_ended_and_nothing_else(tmp_path: Path) -> None:
    """What a daemon a command left is up against: `end_leftovers` for its worktree. A daemon
    in another worktree's sandbox and a process of coder's own (same user) are untouched."""
    import signal
    import subprocess

    one, two = tmp_path / "one", tmp_path / "two"
    pids = {}
    for root in (one, two):
        root.mkdir()
        run_command(DAEMON, cwd=root, policy=POLICY, root=root)
        pids[root] = daemon_pid(root)
    outside = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert sandbox._alive(pids[one]) and sandbox._alive(pids[two])
        confine.end_leftovers(one)
        assert gone(pids[one])
        assert sandbox._alive(pids[two]) and outside.poll() is None
        confine.end_leftovers(two)
        assert gone(pids[two]) and outside.poll() is None
    finally:
        outside.kill()
        outside.wait()
        for pid in pids.values():
            if sandbox._alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_rewritten_git_file_cannot_widen_the_next_commands_sandbox(make_repo) -> None:
    repo = make_repo()
    git(repo, "worktree", "add", "-q", str(repo.parent / "one"), "-b", "one")
    git(repo, "worktree", "add", "-q", str(repo.parent / "two"), "-b", "two")
    one, two_admin = repo.parent / "one", repo / ".git" / "worktrees" / "two"
    assert writes.writable_for(one) == (str(one), str(one_admin := repo / ".git/worktrees/one"))
    assert one_admin.is_dir()
    (one / ".git").write_text(f"gitdir: {two_admin}\n")  # what a command in `one` can do
    assert writes.writable_for(one) == (str(one),)


@needs_sandbox
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="simulating a runner without CAP_SYS_ADMIN needs root and setpriv",
)
def test_without_cap_sys_admin_each_command_gets_its_own_namespace(tmp_path: Path) -> None:
    """The path an unprivileged user (or a container's root) takes: `unshare` per command,
    under the same Landlock rules; what a command leaves running is ended as well."""
    import subprocess
    import sys

    root = tmp_path / "wt"
    root.mkdir()
    script = f"""
from pathlib import Path
from coder.policy import confine, kernel
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
assert kernel.support().netns == "per-command", kernel.support()
cmd = "echo a > in.txt; echo b > {tmp_path}/out.txt; python3 -c 'import socket; socket.socket().connect((\\"127.0.0.1\\", 9))'"
result = run_command(cmd, cwd=Path("{root}"), policy=Policy(), root=Path("{root}"))
print(result.stderr)
run_command({DAEMON!r}, cwd=Path("{root}"), policy=Policy(), root=Path("{root}"))
confine.end_leftovers(Path("{root}"))  # the daemon is in a user namespace of its own
"""
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (root / "in.txt").read_text() == "a\n" and not (tmp_path / "out.txt").exists()
    assert "out.txt: Permission denied" in done.stdout
    assert "PermissionError" in done.stdout or "Network is unreachable" in done.stdout
    assert gone(daemon_pid(root))


@needs_sandbox
def test_a_worktree_removed_and_made_again_at_its_path_is_writable(tmp_path: Path) -> None:
    """A spawner's rules hold the directory it started with: one made again at the same path
    (a run cleaned and started again in `coder mcp serve`'s process) gets a new spawner,
    for the commands and for coder's own confined writes alike."""
    root = tmp_path / "wt"
    for round in range(2):
        root.mkdir()
        result = run_command("echo a > in.txt", cwd=root, policy=POLICY, root=root)
        assert result.exit_code == 0, (round, result.stderr)
        confine.confined(root, lambda: (root / "own.txt").write_text("b\n"))
        assert (root / "in.txt").read_text() == "a\n" and (root / "own.txt").read_text() == "b\n"
        shutil.rmtree(root)


@needs_sandbox
def test_each_command_gets_an_empty_tmpdir_of_its_own_whatever_the_last_one_left(
    tmp_path: Path,
) -> None:
    """TMPDIRs are reused (a mkdir and an rmdir a command cost 1-2 ms): what a command leaves
    there is gone before the next, and one it replaced with a link is not lent again (nor is
    anything removed through it)."""
    root, yours = tmp_path / "wt", tmp_path / "yours"
    root.mkdir()
    yours.mkdir()
    (yours / "keep").write_text("yours\n")
    policy = Policy(allowed_commands=POLICY.allowed_commands | {"ln", "rmdir", "ls"})
    left = run_command(
        'echo x > "$TMPDIR/left"; echo "$TMPDIR"', cwd=root, policy=policy, root=root
    )
    first = left.stdout.strip()
    assert not os.path.exists(first)  # what it left was removed with it
    again = run_command('ls -A "$TMPDIR"; echo "$TMPDIR"', cwd=root, policy=policy, root=root)
    assert again.stdout.split() == [again.stdout.strip()]  # empty
    tmpdir = again.stdout.strip()
    swap = f'rmdir "$TMPDIR" && ln -s {yours} "$TMPDIR"'
    assert run_command(swap, cwd=root, policy=policy, root=root).ok
    assert os.path.islink(tmpdir)
    after = run_command('ls -A "$TMPDIR"; echo "$TMPDIR"', cwd=root, policy=policy, root=root)
    assert after.stdout.split() == [after.stdout.strip()] and after.stdout.strip() != tmpdir
    assert (yours / "keep").read_text() == "yours\n"


@needs_sandbox
def test_a_git_add_the_sandbox_refused_says_why(make_repo) -> None:
    """A confined `git add` cannot store the object (the repository's objects are read-only
    to commands): the result says why, and that coder commits a run's steps itself. Not
    for a command that ran unconfined, nor for one that exited 0."""
    repo = make_repo()
    tree = repo.parent / "wt"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), "HEAD")
    refused = run_command(
        "echo new > new.txt && git add new.txt", cwd=tree, policy=POLICY, root=tree
    )
    assert refused.exit_code not in (0, None), refused
    assert refused.refused_write == (
        "the sandbox lets a command write only its worktree and its TMPDIR, not the "
        "repository's objects or refs: `git add` and `git commit` fail (coder commits each "
        "step of a run itself)"
    ), refused.stderr
    echoed = f"echo '{denied()}' >&2"
    assert not run_command(echoed, cwd=tree, policy=POLICY, root=tree).refused_write
    unconfined = Policy(allowed_commands=POLICY.allowed_commands, sandbox=False)
    assert not run_command(
        echoed + "; exit 1", cwd=tree, policy=unconfined, root=tree
    ).refused_write
    assert git(tree, "status", "--short").split() == ["??", "new.txt"]  # nothing was staged


@needs_sandbox
def test_a_step_whose_write_was_refused_says_why_in_its_error(make_repo) -> None:
    """The same explanation reaches the user in the step's error (`coder run`, real sandbox);
    without git in the command it does not mention git."""
    repo = make_repo()
    outside = repo.parent / "outside.txt"
    outside.write_text("keep\n")
    path = taskfile(
        repo, f"id: w\ntitle: w\ngraph:\n  - {{id: s1, kind: shell, cmd: 'echo x > {outside}'}}\n"
    )
    code, _out, _err = coder(repo, "run", "--autonomous", "-f", str(path))
    error = state_of(repo, "w")["steps"]["s1"]["error"]
    assert code == 1 and outside.read_text() == "keep\n"
    if denied() == "Read-only file system":  # Landlock alone says "Permission denied": no hint
        assert error.endswith(
            "; the sandbox lets a command write only its worktree and its TMPDIR"
        ), error
