"""`coder mcp serve` driven by the official MCP client SDK: over stdio (the server started as a
real subprocess, as an MCP client would) and once over streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git

mcp = pytest.importorskip("mcp")

SERVE = [sys.executable, "-m", "coder", "mcp", "serve"]


@asynccontextmanager
async def stdio_session(root: Path, errlog: Path) -> AsyncIterator[Any]:
    from mcp import Client, StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=SERVE[0],
        args=[*SERVE[1:], "--root", str(root)],
        env=dict(os.environ),
        cwd=str(root.parent),
    )
    with open(errlog, "w") as err:  # pytest's captured stderr has no file descriptor
        async with Client(stdio_client(params, errlog=err), read_timeout_seconds=30) as client:
            yield client


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


async def call(client: Any, name: str, **arguments: Any) -> Any:
    return await client.call_tool(name, arguments)


def test_stdio_tools_with_the_run_policy(make_repo, tmp_path: Path) -> None:
    repo = make_repo({"README.md": "# sample\n", "calc.py": "def add(a, b):\n    return a + b\n"})
    outside = tmp_path / "outside.txt"
    outside.write_text("secret plans\n")
    os.symlink(outside, repo / "link.txt")

    async def scenario() -> None:
        async with stdio_session(repo, tmp_path / "server.err") as client:
            assert client.server_info.name == "coder"
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {
                "fs_read",
                "fs_write",
                "fs_edit",
                "fs_apply_patch",
                "fs_glob",
                "fs_grep",
                "code_search",
                "shell_run",
                "tests_run",
                "git_status",
                "git_diff",
                "git_log",
                "task_validate",
                "task_run",
                "task_status",
                "task_stop",
            } == set(tools)
            from coder.tools.registry import default_registry

            fs_read = default_registry().get("fs_read")
            assert fs_read is not None
            assert tools["fs_read"].input_schema == fs_read.parameters  # from the registry
            assert tools["fs_read"].description == fs_read.description
            assert tools["fs_read"].annotations.read_only_hint is True
            assert tools["task_run"].input_schema["required"] == ["path"]

            read = await call(client, "fs_read", path="calc.py")
            assert not read.is_error and "return a + b" in text(read)

            edit = await call(client, "fs_edit", path="calc.py", search="a + b", replace="b + a")
            assert not edit.is_error, text(edit)
            assert (repo / "calc.py").read_text() == "def add(a, b):\n    return b + a\n"

            echo = await call(client, "shell_run", cmd="echo hello-from-mcp")
            assert not echo.is_error and "hello-from-mcp" in text(echo)

            escape = await call(client, "fs_read", path="../outside.txt")
            assert escape.is_error
            assert text(escape).startswith("path escapes the worktree: ../outside.txt")

            link = await call(client, "fs_read", path="link.txt")
            assert link.is_error and "escapes the worktree through a symlink" in text(link)
            assert "secret plans" not in text(link)

            curl = await call(client, "shell_run", cmd="curl https://example.com")
            assert curl.is_error
            assert text(curl).startswith("command refused by policy; nothing was run")
            assert "`curl` is a network program and the network is off" in text(curl)

            bad = await call(client, "fs_read", paht="calc.py")
            assert bad.is_error and "unknown argument(s) for fs_read: paht" in text(bad)
            unknown = await call(client, "step_complete", summary="x")  # not served
            assert unknown.is_error and text(unknown).startswith("unknown tool 'step_complete'")

    asyncio.run(scenario())


def test_task_control_validate_run_status(make_repo, tmp_path: Path) -> None:
    repo = make_repo()
    (repo / "tasks").mkdir()
    (repo / "tasks" / "bad.yaml").write_text(
        "title: bad\ngraph:\n  - {id: s1, kind: shel, cmd: echo}\n"
        "  - {id: s2, kind: shell, cmd: echo, depends_on: [s9]}\n"
    )
    # no `id`: task_run must still know (and report) the generated one
    (repo / "tasks" / "made.yaml").write_text(
        'title: Made by MCP\ngraph:\n  - {kind: shell, cmd: "echo made > made.txt"}\n'
    )

    async def scenario() -> None:
        async with stdio_session(repo, tmp_path / "server.err") as client:
            invalid = await call(client, "task_validate", path="tasks/bad.yaml")
            assert invalid.is_error
            lines = text(invalid).splitlines()
            assert lines[0].startswith("tasks/bad.yaml:3:") and "'shel'" in lines[0]
            assert any("s9" in line for line in lines)
            assert invalid.structured_content["valid"] is False
            assert len(invalid.structured_content["problems"]) >= 2

            valid = await call(client, "task_validate", path="tasks/made.yaml")
            assert not valid.is_error and text(valid).startswith("tasks/made.yaml: valid")

            outside = await call(client, "task_validate", path="../elsewhere.yaml")
            assert outside.is_error and "escapes the worktree" in text(outside)

            started = await call(client, "task_run", path="tasks/made.yaml", merge_on_success=False)
            assert not started.is_error, text(started)
            task_id = started.structured_content["task_id"]
            branch = started.structured_content["branch"]
            assert task_id.startswith("T-") and branch == f"agent/{task_id}-made-by-mcp"

            deadline = time.monotonic() + 20
            status: dict[str, Any] = {}
            while time.monotonic() < deadline:
                result = await call(client, "task_status", id=task_id)
                assert not result.is_error, text(result)
                status = result.structured_content
                if status["status"] not in ("starting", "running"):
                    break
                await asyncio.sleep(0.2)
            assert status["status"] == "success", status
            assert status["steps"][0]["status"] == "success" and status["steps"][0]["commit"]

            again = await call(client, "task_run", path=f".coder/mcp/{task_id}.yaml")
            assert again.is_error
            assert text(again).startswith(f"a run of task {task_id} already exists")

            missing = await call(client, "task_status", id="T-nope")
            assert missing.is_error and text(missing).startswith("no task 'T-nope'")
            stop = await call(client, "task_stop", id=task_id)
            assert stop.is_error and f"run {task_id} is not running" in text(stop)
            return None

    asyncio.run(scenario())
    assert git(repo, "show", f"{_branch(repo)}:made.txt") == "made\n"
    # the checkout untouched (only the test's own taskfiles); .coder/ excluded from git
    assert git(repo, "status", "--porcelain") == "?? tasks/\n"


def _branch(repo: Path) -> str:
    branches = git(repo, "branch", "--list", "agent/*", "--format=%(refname:short)").split()
    assert len(branches) == 1, branches
    return branches[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_streamable_http_on_localhost(make_repo, tmp_path: Path) -> None:
    from mcp import Client

    repo = make_repo()
    port = free_port()
    with open(tmp_path / "server.err", "w") as err:
        server = subprocess.Popen(
            [*SERVE, "--root", str(repo), "--http", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.err").read_text()
                assert time.monotonic() < deadline, "the HTTP server did not come up"
                time.sleep(0.1)

        async def scenario() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=30) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert "fs_read" in names and "task_run" in names
                result = await client.call_tool("fs_read", {"path": "README.md"})
                assert not result.is_error and "# sample" in text(result)
                refused = await client.call_tool(
                    "fs_write", {"path": ".git/config", "content": "x"}
                )
                assert refused.is_error and "refusing to write .git/config" in text(refused)

        asyncio.run(scenario())
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert "serving" in (tmp_path / "server.err").read_text()


def test_http_port_in_use_is_one_line_error(make_repo) -> None:
    repo = make_repo()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [*SERVE, "--root", str(repo), "--http", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 3
    assert proc.stderr.startswith(f"coder: error: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in proc.stderr
