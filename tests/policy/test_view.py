"""What a command sees (coder.policy.view), with real commands judged by the kernel and on disk:
its worktree, its temp dir, the system and its toolchain; not a UNIX socket, a file of
`/dev/shm`, a terminal, `$HOME` or another repository of this machine, nor coder's memory.
The same for an ordinary user (coder.policy.userns), tried as uid 65534 through setpriv."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from coder.policy import confine, kernel, launch, writes
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
from tests.conftest import git
from tests.helpers import fingerprint
from tests.run.test_metadata_containment import run_shell

FOUND = kernel.support()
pytestmark = pytest.mark.skipif(
    not FOUND.available or FOUND.view_problem is not None,
    reason=f"no view for commands here: {FOUND.problem or FOUND.view_problem}",
)
POLICY = Policy(allowed_commands=Policy().allowed_commands | {"ipcs", "hello"})


def run(root: Path, cmd: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = run_command(cmd, cwd=root, policy=POLICY, root=root, **kwargs)  # type: ignore[arg-type]
    return subprocess.CompletedProcess(cmd, result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    worktree = tmp_path / "wt"
    worktree.mkdir()
    return worktree


def listener(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    server.setblocking(False)
    return server


def connections(server: socket.socket) -> int:
    """How many connections reached `server` (the kernel's word, not the command's)."""
    count = 0
    while True:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return count
        count += 1


CONNECT = "python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' {}"


def test_a_unix_socket_outside_cannot_be_reached(root: Path, tmp_path: Path) -> None:
    """An ssh agent or a container daemon listens so; Landlock alone lets a command connect."""
    (tmp_path / "agent").mkdir()
    server = listener(tmp_path / "agent" / "agent.sock")
    daemons = "/run" if os.access("/run", os.W_OK) else None  # where daemons put theirs
    run_dir = Path(tempfile.mkdtemp(prefix="coder-test-", dir=daemons))
    daemon = listener(run_dir / "daemon.sock")
    try:
        for path in (tmp_path / "agent" / "agent.sock", run_dir / "daemon.sock"):
            done = run(root, CONNECT.format(path))
            assert done.returncode != 0 and "No such file or directory" in done.stderr, done
        assert connections(server) == 0 and connections(daemon) == 0
        inside = listener(root / "own.sock")  # one in the worktree is the command's own
        assert run(root, CONNECT.format(root / "own.sock")).returncode == 0
        assert connections(inside) == 1
        inside.close()
    finally:
        server.close()
        daemon.close()
        shutil.rmtree(run_dir)


def test_dev_shm_is_private_and_the_ipc_of_this_machine_out_of_reach(root: Path) -> None:
    host = Path("/dev/shm") / f"coder-test-{os.getpid()}"
    host.write_text("the host's\n")
    queue = subprocess.run(["ipcmk", "-Q"], capture_output=True, text=True, check=False)
    key = queue.stdout.split()[-1] if queue.returncode == 0 else None
    try:
        cmd = f"ls -A /dev/shm; echo mine > /dev/shm/coder-cmd-{os.getpid()}; ipcs -q"
        done = run(root, cmd)
        assert done.returncode == 0, done
        assert host.name not in done.stdout  # the host's file is not there
        assert not Path(f"/dev/shm/coder-cmd-{os.getpid()}").exists()  # nor its own here
        if key is not None:
            assert key in subprocess.check_output(["ipcs", "-q"], text=True)
            assert key not in done.stdout
        shared = (
            "python3 -c 'from multiprocessing import shared_memory as s;"
            " print(s.SharedMemory(create=True, size=8).size)'"
        )
        assert run(root, shared).stdout.split() == ["8"]  # still works, in the private one
    finally:
        host.unlink()
        if key is not None:
            subprocess.run(["ipcrm", "-Q", key], check=False)


def test_home_other_repositories_and_the_hosts_tmp_are_not_there(
    root: Path, tmp_path: Path, isolated_home: Path, make_repo
) -> None:
    (isolated_home / "canary.txt").write_text("a secret of yours\n")
    (isolated_home / ".ssh").mkdir()
    (isolated_home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    other = make_repo(name="other")
    host_tmp = Path(tempfile.mkdtemp(prefix="coder-test-"))  # beside the sandbox's temp root
    cmd = (
        f"cat ~/canary.txt ~/.ssh/id_ed25519 {other}/README.md {host_tmp}; ls -A ~;"
        f" ls /run /var/run {tmp_path} 2>&1 | grep -c 'No such file'"
    )
    try:
        done = run(root, cmd)
    finally:
        host_tmp.rmdir()
    assert not any(text in done.stdout for text in ("secret", "PRIVATE", "# sample"))
    assert done.stderr.count("No such file or directory") == 4, done.stderr
    # $HOME holds only git's config of the user; /run and /var/run are absent
    assert done.stdout.split() == [".gitconfig", "2"]
    # the test's own directory is there only as the way to the worktree
    assert run(root, f"ls -A {tmp_path}").stdout.split() == ["wt"]


def test_the_toolchain_of_a_venv_outside_still_runs(root: Path, tmp_path: Path) -> None:
    """PATH names a venv outside the worktree: its programs, its packages and the
    interpreter it was made from are there, read-only (a `python -m pytest` in a venv)."""
    env_dir = tmp_path / "tools" / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (env_dir / "lib" / version / "site-packages" / "venvmod.py").write_text("WHERE = 'venv'\n")
    hello = env_dir / "bin" / "hello"
    hello.write_text("#!/bin/sh\necho hello from the venv\n")
    hello.chmod(0o755)
    path = f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"
    cmd = (
        "hello; python -c 'import sys, venvmod; print(sys.prefix == sys.argv[1], venvmod.WHERE)'"
        f" {env_dir}; touch {env_dir}/lib/x"
    )
    done = run(root, cmd, env={"PATH": path})
    assert done.stdout.split() == ["hello", "from", "the", "venv", "True", "venv"], done
    assert "Read-only file system" in done.stderr and not (env_dir / "lib" / "x").exists()


def test_terminals_of_this_machine_cannot_be_opened(root: Path) -> None:
    """Commands get a pseudo-terminal instance of their own: they can make terminals, but
    not open (and type into, or read) yours."""
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        cmd = f"echo typed > {name}; ls /dev/pts; python3 -c 'import os, pty; m, s = pty.openpty(); print(os.ttyname(s))'"
        done = run(root, cmd)
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 100)  # nothing reached the terminal
    finally:
        os.close(master)
        os.close(slave)
    assert f"{name}: " in done.stderr  # not there (and not to be made)
    assert done.stdout.split() == ["ptmx", "/dev/pts/0"], done


def test_a_command_cannot_read_coders_memory(root: Path) -> None:
    """The spawner thread is in its commands' sandbox and holds no capability: without more,
    `/proc/CODER/task/SPAWNER/mem` would open (and be written) from a command."""
    secret = f"coder-memory-{os.getpid()}-canary".encode()
    spawner = confine.confinement(writes.profile_for(root))
    tid = spawner.call(threading.get_native_id)
    task = f"/proc/{os.getpid()}/task/{tid}"
    cmd = f"head -c 64 {task}/mem; cat {task}/maps | wc -l; cat {task}/environ; ls /proc/1/root"
    done = run(root, cmd)
    assert secret  # kept alive in this process's memory while the command runs
    assert done.stderr.count("Permission denied") == 4, done.stderr  # Landlock: /proc/1/root


def test_a_runs_command_does_not_see_the_users_checkout(make_repo) -> None:
    repo = make_repo({"README.md": "# r\n", "private.txt": "mine\n"})
    (repo / "untracked.txt").write_text("notes\n")
    code, step = run_shell(
        repo, "ls -A ../../.. > seen.txt; cat ../../../private.txt > read.txt; true"
    )
    assert code == 0, step
    worktree = repo / ".coder" / "worktrees" / "esc"
    # the checkout's directory holds only the way to the worktree and the repository's git dir
    assert (worktree / "seen.txt").read_text().split() == [".coder", ".git"]
    assert (worktree / "read.txt").read_text() == ""
    assert git(repo, "show", "agent/esc-escape-attempt:read.txt") == ""


def test_the_checkout_stays_hidden_when_coder_runs_as_python_m(make_repo) -> None:
    """`python -m coder` puts the working directory, the user's checkout, on coder's import
    path; the view shows only the entries coder imported from."""
    from tests.run.test_crash import coder as coder_process

    repo = make_repo({"README.md": "# r\n"})
    path = repo.parent / "t.yaml"
    path.write_text("id: m\ntitle: m\ngraph:\n  - {kind: shell, cmd: ls -A ../../.. > seen.txt}\n")
    done = coder_process(repo, "run", "--autonomous", "-f", str(path))
    assert done.returncode == 0, done.stderr
    seen = repo / ".coder" / "worktrees" / "m" / "seen.txt"
    assert seen.read_text().split() == [".coder", ".git"]


# ------------------------------------------------------------------------------ an ordinary user

NOBODY = 65534


@functools.lru_cache(maxsize=1)
def nobody_python() -> list[str] | None:
    """An interpreter uid 65534 can run with coder importable (PYTHONPATH), or None."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    for exe in (sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"):
        argv = [*as_nobody(), exe, "-c", "import coder.policy.sandbox, landlockpy, pygit2"]
        if subprocess.run(argv, env=nobody_env(), capture_output=True, check=False).returncode == 0:
            return [exe]
    return None


def as_nobody() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def nobody_env(home: Path | None = None) -> dict[str, str]:
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(paths)}
    return {**env, "HOME": str(home)} if home else env


needs_nobody = pytest.mark.skipif(
    nobody_python() is None, reason="needs root, setpriv and a Python uid 65534 can run"
)


@pytest.fixture
def nobody_dirs() -> Iterator[tuple[Path, Path, Path]]:
    """A worktree, a directory outside it and a $HOME, owned by uid 65534 (pytest's own temp
    dirs are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="coder-nobody-"))
    dirs = tuple(top / name for name in ("wt", "outside", "home"))
    for path in dirs:
        path.mkdir()
    (dirs[1] / "f.txt").write_text("keep\n")
    (dirs[2] / ".bashrc").write_text("# mine\n")
    for path in (top, *dirs, dirs[1] / "f.txt", dirs[2] / ".bashrc"):
        os.chown(path, NOBODY, NOBODY)
        os.utime(path, (1_600_000_000, 1_600_000_000))
    os.chmod(top, 0o755)
    try:
        yield dirs  # type: ignore[misc]
    finally:
        shutil.rmtree(top)


NOBODY_RUN = """
import sys
from pathlib import Path
from coder.policy import userns
assert userns.enter() is None, userns.problem()
from coder.policy import confine, kernel
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
assert kernel.support().view_problem is None, kernel.support()
root = Path(sys.argv[1])
done = run_command(sys.argv[2], cwd=root, policy=Policy(), root=root)
print(done.stdout, end="")
print(done.stderr, end="", file=sys.stderr)
"""


@needs_nobody
def test_an_ordinary_users_commands_get_the_same_view_and_metadata_wall(
    nobody_dirs: tuple[Path, Path, Path],
) -> None:
    """Before: no mount namespace without root, so chmod and touch -d went through outside."""
    root, outside, home = nobody_dirs
    before = fingerprint(outside), fingerprint(home), stat.S_IMODE(outside.stat().st_mode)
    cmd = (
        f"chmod 777 {outside}/f.txt ~/.bashrc; touch -d 2000-01-01 {outside}/f.txt ~ ~/.bashrc;"
        f" cat ~/.bashrc; ls -A ~ | wc -l; echo made > in.txt; id -u"
    )
    argv = [*as_nobody(), *(nobody_python() or []), "-c", NOBODY_RUN, str(root), cmd]
    done = subprocess.run(argv, env=nobody_env(home), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    after = fingerprint(outside), fingerprint(home), stat.S_IMODE(outside.stat().st_mode)
    assert after == before
    assert done.stdout.split() == ["0", str(NOBODY)], done
    assert (root / "in.txt").read_text() == "made\n"


@needs_nobody
def test_the_cli_makes_an_ordinary_user_its_own_namespace(
    nobody_dirs: tuple[Path, Path, Path],
) -> None:
    """`coder doctor` run by uid 65534 in a repository of its own: the view holds."""
    root, _, home = nobody_dirs
    env = {**nobody_env(home), "OLLAMA_HOST": "http://127.0.0.1:9", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run([*as_nobody(), "git", "init", "-q", str(root)], env=env, check=True)
    argv = [*as_nobody(), *(nobody_python() or []), "-m", "coder", "doctor", "--json"]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["command view"]["status"] == "ok", checks["command view"]
    assert checks["command metadata"]["status"] == "ok", checks["command metadata"]
    assert checks["command network"]["detail"].endswith("capabilities dropped")


def test_the_mcp_launcher_builds_the_same_view(root: Path, isolated_home: Path) -> None:
    (isolated_home / "canary.txt").write_text("a secret of yours\n")
    script = "echo in > in.txt; cat ~/canary.txt; ls -A ~; ls /run"
    argv = launch.launcher_argv(["bash", "-c", script], root, network=False)
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    assert (root / "in.txt").read_text() == "in\n"
    assert done.stdout.split() == [".gitconfig"]  # the user's git config only
    assert done.stderr.count("No such file or directory") == 2


@needs_nobody
def test_the_mcp_launcher_makes_an_ordinary_user_its_own_namespace(
    nobody_dirs: tuple[Path, Path, Path],
) -> None:
    """The launcher runs single-threaded: it makes the user namespace itself."""
    root, outside, home = nobody_dirs
    tmp = root.parent / "tmp"
    tmp.mkdir()
    os.chown(tmp, NOBODY, NOBODY)
    spec = {"writable": [str(root)], "readonly": [], "network": False, "tmp": str(tmp)}
    script = f"chmod 777 {outside}/f.txt; touch -d 2000-01-01 ~/.bashrc; ls -A ~ | wc -l"
    before = fingerprint(outside), fingerprint(home)
    launcher = [
        "-m",
        "coder.policy.launch",
        json.dumps({**spec, "netns_done": False, "visible": []}),
        "--",
    ]
    argv = [*as_nobody(), *(nobody_python() or []), *launcher, "bash", "-c", script]
    done = subprocess.run(
        argv, cwd=root, env=nobody_env(home), capture_output=True, text=True, check=False
    )
    assert done.stdout.split() == ["0"], done
    assert (fingerprint(outside), fingerprint(home)) == before


def test_git_run_confined_ignores_what_the_users_git_ignores(
    make_repo, scan: str, isolated_home: Path
) -> None:
    """The step scan of a large tree runs the git program in the view: it must read the
    user's global ignore file as libgit2 does in coder's own process, or the two ways of
    scanning would commit different files."""
    from coder.git import branches, repository, staging, worktrees

    (isolated_home / ".config" / "git").mkdir(parents=True)
    (isolated_home / ".config" / "git" / "ignore").write_text("*.swp\n")
    root = make_repo({"README.md": "# r\n"})
    repo = repository.open_repo(root)
    wt = worktrees.create_worktree(
        repo, name="t1", path=root / ".coder" / "worktrees" / "t1", branch="agent/t1", start="main"
    )
    (wt / "notes.swp").write_text("an editor's swap file\n")
    (wt / "a.txt").write_text("a\n")
    staged = staging.stage(wt, branches.resolve_commit(repo, "main"))
    assert staged.paths == ["a.txt"]
