""".coder/ is coder's own and never a link (issue 33): a repository that ships `.coder` as a
link, or a link under it (`.coder/cache/repomap`, `.coder/logs`, `.coder/mcp/ID.log`, ...), and
a command that plants one before `.coder/` exists, never make coder write, chmod or delete
through it. Each verdict is taken on disk: the link's target is fingerprinted (content, mode,
times; coder.tests.helpers.fingerprint) before and compared after."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coder.errors import EXIT_ENVIRONMENT
from coder.policy import kernel
from tests.conftest import coder, git
from tests.helpers import done, fingerprint, taskfile

SHELL = """
    id: fs
    title: one shell step
    graph:
      - {id: s1, kind: shell, cmd: "echo one > one.txt"}
"""
FOUND = kernel.support()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory of the user's, outside the repository, with files in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    for i in range(40):
        (folder / f"file{i:02}.txt").write_text(f"mine {i}\n")
    os.chmod(folder, 0o755)
    return folder


def shipped_link(make_repo: Any, rel: str, target: Path) -> Path:
    """A repository whose last commit has a symbolic link `rel` to `target` (`git add -f`:
    coder's own `/.coder/` exclusion does not stop a committed file)."""
    repo = make_repo()
    link = repo / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    git(repo, "add", "-f", rel)
    git(repo, "commit", "-q", "-m", f"ship {rel}")
    return repo


def refused(code: int, err: str, link: Path) -> None:
    """Exit 3, one line naming the link and what it points to, and how to fix it."""
    assert code == EXIT_ENVIRONMENT, err
    assert f"{link} is a symbolic link (to {os.readlink(link)})" in err, err
    assert "coder keeps its state, logs and worktrees in real directories" in err, err
    assert f"remove the link (`rm {link}`)" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ("init", "--no-test-probe"),
        ("init",),
        ("run", "--autonomous", "-f", "TASK"),
        ("status",),
        ("clean", "--all"),
    ],
    ids=["init", "init-probe", "run", "status", "clean"],
)
def test_a_linked_coder_dir_is_refused_and_nothing_is_written(
    make_repo: Any, outside: Path, args: tuple[str, ...]
) -> None:
    repo = shipped_link(make_repo, ".coder", outside)
    (repo / "coder.config.json").write_text('{"test_command": "echo probed > probed.txt"}\n')
    git(repo, "add", "coder.config.json")
    git(repo, "commit", "-q", "-m", "config")
    path = taskfile(repo, SHELL)
    before = fingerprint(outside), fingerprint(repo / ".git" / "info")
    listing = sorted(p.name for p in repo.iterdir())
    code, _, err = coder(repo, *(str(path) if a == "TASK" else a for a in args))
    assert (fingerprint(outside), fingerprint(repo / ".git" / "info")) == before
    assert sorted(p.name for p in repo.iterdir()) == listing
    refused(code, err, repo / ".coder")
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "branch", "--list", "agent/*") == ""


@pytest.mark.parametrize(
    "rel",
    ["logs", "state", "locks", "worktrees", "tasks", "artifacts"],
)
def test_a_linked_folder_of_coder_dir_is_refused(make_repo: Any, outside: Path, rel: str) -> None:
    repo = make_repo()
    assert coder(repo, "init", "--no-test-probe")[0] == 0
    link = repo / ".coder" / rel
    os.rmdir(link)
    os.symlink(outside, link)
    before = fingerprint(outside)
    code, _, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SHELL)))
    assert fingerprint(outside) == before
    refused(code, err, link)
    assert git(repo, "branch", "--list", "agent/*") == ""


def test_resume_does_not_check_a_worktree_out_through_a_link(make_repo: Any, outside: Path) -> None:
    """`.coder/worktrees` swapped for a link between a run and its resume: the worktree is
    not checked out again where the link leads (libgit2 goes by path: each directory on the
    way is checked right before)."""
    repo = make_repo()
    failing = SHELL.replace("echo one > one.txt", "exit 1")
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, failing)))
    assert code == 1, out + err
    worktrees = repo / ".coder" / "worktrees"
    os.rename(worktrees, repo.parent / "worktrees.away")
    os.symlink(outside, worktrees)
    before = fingerprint(outside)
    code, _, err = coder(repo, "resume", "-t", "fs")
    assert fingerprint(outside) == before
    refused(code, err, worktrees)


@pytest.mark.parametrize(
    "rel",
    ["logs/fs.jsonl", "locks/fs.lock", "state/fs.journal"],
)
def test_a_linked_file_of_coder_dir_is_never_written_through(
    make_repo: Any, isolated_home: Path, rel: str
) -> None:
    """The event log and the lock are opened for appending and writing, the journal for
    appending: each through a link at its name would write the user's file."""
    bashrc = isolated_home / ".bashrc"
    bashrc.write_text("# mine\n")
    repo = make_repo()
    assert coder(repo, "init", "--no-test-probe")[0] == 0
    link = repo / ".coder" / rel
    os.symlink(bashrc, link)
    before = fingerprint(isolated_home)
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SHELL)))
    assert fingerprint(isolated_home) == before
    assert code == EXIT_ENVIRONMENT, out + err
    assert f"{link} is a symbolic link (to {bashrc})" in err and "Traceback" not in err


def test_the_repo_map_cache_prune_leaves_a_linked_folder_alone(
    make_repo: Any, outside: Path, fake: Any
) -> None:
    """A repository that ships `.coder/cache/repomap` as a link to the user's folder: the map
    of a model step is neither written there nor is the folder pruned to the newest 32."""
    repo = shipped_link(make_repo, ".coder/cache/repomap", outside)
    before = fingerprint(outside)
    fake.enqueue(done("looked around"))
    path = taskfile(
        repo, "id: mapped\ntitle: t\ngraph:\n  - {id: s1, kind: custom, goal: look around}\n"
    )
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 0, out + err
    assert fingerprint(outside) == before


def test_init_example_does_not_follow_a_tasks_link(make_repo: Any, outside: Path) -> None:
    repo = shipped_link(make_repo, "tasks", outside)
    before = fingerprint(outside)
    code, out, err = coder(repo, "init", "--no-test-probe", "--example", "hello-shell")
    assert fingerprint(outside) == before
    assert code == EXIT_ENVIRONMENT, out + err
    assert f"{repo / 'tasks'} is a symbolic link or not a directory" in err


@pytest.mark.skipif(
    not FOUND.available or FOUND.mounts_problem is not None,
    reason=f"no read-only mount wall here: {FOUND.problem or FOUND.mounts_problem}",
)
def test_the_test_probe_cannot_plant_a_coder_link(make_repo: Any, outside: Path) -> None:
    """`coder doctor` runs the test command in the checkout: `.coder/` is made first, so the
    sandbox keeps it read-only and a link cannot take its place; the next command writes
    only into the real one."""
    repo = make_repo()
    plant = f"ln -s {outside} .coder"
    (repo / "coder.config.json").write_text(json.dumps({"test_command": plant}) + "\n")
    before = fingerprint(outside)
    coder(repo, "doctor")
    assert stat.S_ISDIR(os.lstat(repo / ".coder").st_mode)
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, SHELL)))
    assert code == 0, out + err
    assert fingerprint(outside) == before


# --- coder mcp serve ------------------------------------------------------------------------


def _serve(repo: Path, errlog: Path, scenario: Any, *, prefix: tuple[str, ...] = ()) -> None:
    """`scenario(client)` with the real MCP client of `coder mcp serve --root repo`, the
    server started under `prefix` (a command that starts it)."""
    from mcp import Client, StdioServerParameters, stdio_client

    serve = [*prefix, sys.executable, "-m", "coder", "mcp", "serve", "--root", str(repo)]
    params = StdioServerParameters(
        command=serve[0], args=serve[1:], env=dict(os.environ), cwd=str(repo.parent)
    )

    async def session() -> None:
        with open(errlog, "w") as err:
            async with Client(stdio_client(params, errlog=err), read_timeout_seconds=30) as client:
                await scenario(client)

    asyncio.run(session())


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


async def _finished(client: Any, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        status = (await client.call_tool("task_status", {"id": task_id})).structured_content
        if status["status"] not in ("starting", "running") or time.monotonic() > deadline:
            return dict(status)
        await asyncio.sleep(0.2)


def test_mcp_task_run_never_writes_its_log_through_a_link(
    make_repo: Any, isolated_home: Path, tmp_path: Path
) -> None:
    """A repository shipping `.coder/mcp/made.log` as a link to `~/.bashrc`: the run's log
    (whose step command the user's next shell would run) goes to coder's own file."""
    pytest.importorskip("mcp")
    bashrc = isolated_home / ".bashrc"
    bashrc.write_text("# mine\n")
    repo = shipped_link(make_repo, ".coder/mcp/made.log", bashrc)
    (repo / "tasks").mkdir()
    (repo / "tasks" / "made.yaml").write_text(
        'id: made\ntitle: t\ngraph:\n  - {kind: shell, cmd: "echo made > made.txt"}\n'
    )
    before = fingerprint(isolated_home)

    async def scenario(client: Any) -> None:
        started = await client.call_tool("task_run", {"path": "tasks/made.yaml"})
        assert not started.is_error, started.content
        assert (await _finished(client, "made"))["status"] == "success"

    _serve(repo, tmp_path / "server.err", scenario)
    assert fingerprint(isolated_home) == before
    assert not (repo / ".coder" / "mcp" / "made.log").is_symlink()


@pytest.mark.skipif(
    not FOUND.available or FOUND.mounts_problem is not None,
    reason=f"no read-only mount wall here: {FOUND.problem or FOUND.mounts_problem}",
)
def test_mcp_serve_makes_coder_dir_before_any_command(
    make_repo: Any, outside: Path, tmp_path: Path
) -> None:
    """A command of `coder mcp serve` (whose writable root is the checkout) cannot plant
    `.coder` as a link: the server made it when it started, and the sandbox keeps it
    read-only; task_run then writes into the real one."""
    pytest.importorskip("mcp")
    repo = make_repo()
    (repo / "tasks").mkdir()
    (repo / "tasks" / "made.yaml").write_text(
        'id: made\ntitle: t\ngraph:\n  - {kind: shell, cmd: "echo made > made.txt"}\n'
    )
    before = fingerprint(outside)

    async def scenario(client: Any) -> None:
        await client.call_tool("shell_run", {"cmd": f"ln -sfn {outside} .coder"})
        assert stat.S_ISDIR(os.lstat(repo / ".coder").st_mode)
        started = await client.call_tool("task_run", {"path": "tasks/made.yaml"})
        assert not started.is_error, started.content
        assert (await _finished(client, "made"))["status"] == "success"

    _serve(repo, tmp_path / "server.err", scenario)
    assert fingerprint(outside) == before
    assert stat.S_ISDIR(os.lstat(repo / ".coder").st_mode)


@pytest.mark.skipif(
    not FOUND.available or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="a runner without the mount wall is simulated as root without CAP_SYS_ADMIN",
)
def test_without_the_mount_wall_a_planted_coder_link_is_refused(
    make_repo: Any, outside: Path, tmp_path: Path
) -> None:
    """Without the read-only mount wall (no CAP_SYS_ADMIN: an ordinary user, a container's
    root), a command of `coder mcp serve`, which runs in the checkout, can replace `.coder/`
    with a link: task_run refuses it, naming it, and nothing is written through it."""
    pytest.importorskip("mcp")
    repo = make_repo()
    (repo / "tasks").mkdir()
    (repo / "tasks" / "made.yaml").write_text(
        'id: made\ntitle: t\ngraph:\n  - {kind: shell, cmd: "echo made > made.txt"}\n'
    )
    before = fingerprint(outside)

    async def scenario(client: Any) -> None:
        plant = f"rm -rf .coder && ln -s {outside} .coder"
        planted = await client.call_tool("shell_run", {"cmd": plant})
        assert os.path.islink(repo / ".coder"), _text(planted)  # what the wall keeps out
        started = await client.call_tool("task_run", {"path": "tasks/made.yaml"})
        assert fingerprint(outside) == before
        assert started.is_error, _text(started)
        assert f"{repo / '.coder'} is a symbolic link (to {outside})" in _text(started)

    without = ("setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin")
    _serve(repo, tmp_path / "server.err", scenario, prefix=without)
    assert fingerprint(outside) == before
