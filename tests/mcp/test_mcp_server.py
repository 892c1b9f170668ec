"""`coder mcp serve` driven by the official MCP client SDK: over stdio (the server started as a
real subprocess, as an MCP client would) and over streamable HTTP on 127.0.0.1, which answers
only requests with the user's bearer token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
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
            assert task_id == "made" and branch == "agent/made-made-by-mcp"  # the file names it

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


def test_three_clients_starting_one_taskfile_start_one_run(make_repo, tmp_path: Path) -> None:
    """Three clients, each with its own server, call task_run on one taskfile at the same
    moment: one is told "started", the others "already running" with its id; the run's log
    keeps its own output (appended, never replaced by a loser's)."""
    repo = make_repo()
    (repo / "tasks").mkdir()
    (repo / "tasks" / "once.yaml").write_text(
        'id: once\ntitle: Once\ngraph:\n  - {kind: shell, cmd: "sleep 1 && echo once >> once.txt"}\n'
    )
    log = repo / ".coder" / "mcp" / "once.log"
    log.parent.mkdir(parents=True)
    log.write_text("an earlier launch's output\n")  # a run of this id, since removed

    async def scenario() -> list[Any]:
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(stdio_session(repo, tmp_path / f"server{n}.err"))
                for n in range(3)
            ]
            answers = await asyncio.gather(
                *(call(client, "task_run", path="tasks/once.yaml") for client in clients)
            )
            # one told "already running" follows the run its server did not start
            loser = next((c for c, a in zip(clients, answers, strict=True) if a.is_error), None)
            assert loser is not None, [text(a) for a in answers]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                result = await call(loser, "task_status", id="once")
                assert not result.is_error, text(result)
                status = result.structured_content
                if status["status"] not in ("starting", "running"):
                    break
                await asyncio.sleep(0.2)
            assert status["status"] == "success", status
            return list(answers)

    answers = asyncio.run(scenario())
    started = [a for a in answers if not a.is_error]
    assert len(started) == 1, [text(a) for a in answers]
    assert started[0].structured_content["task_id"] == "once"
    pid = started[0].structured_content["pid"]
    for refused in (a for a in answers if a.is_error):
        assert text(refused).startswith("run once is already running"), text(refused)
        assert refused.structured_content["task_id"] == "once"
        assert refused.structured_content["pid"] == pid
    # one run, one step commit, the step's file written once
    branch = _branch(repo)
    assert git(repo, "rev-list", "--count", f"main..{branch}").strip() == "1"
    assert git(repo, "show", f"{branch}:once.txt") == "once\n"
    earlier, printed = log.read_text().split("\n", 1)
    assert earlier == "an earlier launch's output"
    assert printed.startswith("--- ") and printed.count("task_run: coder run") == 1, printed
    assert "Run once: success" in printed
    assert "already" not in printed and "error" not in printed, printed


def _branch(repo: Path) -> str:
    branches = git(repo, "branch", "--list", "agent/*", "--format=%(refname:short)").split()
    assert len(branches) == 1, branches
    return branches[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def http_server(repo: Path, port: int, errlog: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`coder mcp serve --http` on `port`, up and answering, stopped with SIGINT afterwards."""
    with open(errlog, "w") as err:
        server = subprocess.Popen(
            [*SERVE, "--root", str(repo), "--http", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60  # a wait, not a measure: a loaded machine is slow
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert server.poll() is None, errlog.read_text()
                assert time.monotonic() < deadline, "the HTTP server did not come up"
                time.sleep(0.1)
        yield server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@asynccontextmanager
async def authorized(url: str, token: str) -> AsyncIterator[Any]:
    """The SDK's client over streamable HTTP, sending the bearer token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, read_timeout_seconds=30) as client:
            yield client


def test_streamable_http_on_localhost_with_the_token(make_repo, tmp_path: Path) -> None:
    repo = make_repo()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with http_server(repo, port, tmp_path / "server.err"):
        token = subprocess.run(
            [*SERVE[:-1], "token"], capture_output=True, text=True, check=True
        ).stdout.strip()

        async def scenario() -> None:
            async with authorized(url, token) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert "fs_read" in names and "task_run" in names
                result = await client.call_tool("fs_read", {"path": "README.md"})
                assert not result.is_error and "# sample" in text(result)
                refused = await client.call_tool(
                    "fs_write", {"path": ".git/config", "content": "x"}
                )
                assert refused.is_error and "refusing to write .git/config" in text(refused)

        asyncio.run(scenario())
    printed = (tmp_path / "server.err").read_text()
    assert f"serving {repo} at {url}" in printed
    assert f"every request needs the header `Authorization: Bearer {token}`" in printed
    assert f'claude mcp add --transport http coder {url} --header "Authorization: Bearer' in printed
    settings = json.loads(printed.split("(.mcp.json and the like):\n", 1)[1].splitlines()[0])
    assert settings["mcpServers"]["coder"] == {
        "type": "http",
        "url": url,
        "headers": {"Authorization": f"Bearer {token}"},
    }
    stored = Path(os.environ["XDG_CONFIG_HOME"]) / "coder" / "mcp-token"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert stored.read_text() == f"{token}\n"


def rpc(method: str, params: dict[str, Any], id_: int | None = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    return message if id_ is None else {**message, "id": id_}


INITIALIZE = rpc(
    "initialize",
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
)


def test_http_without_the_token_gets_401_and_nothing_runs(make_repo, tmp_path: Path) -> None:
    """Requests without the token, with a wrong one, a stale one (`coder mcp token --new`) or a
    second Authorization header get 401, even inside a session the right token opened; the
    same tools/call with the token runs (so the refused ones would have)."""
    import httpx

    repo = make_repo()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    accept = {"Accept": "application/json, text/event-stream"}
    touch = rpc("tools/call", {"name": "shell_run", "arguments": {"cmd": "touch ran.txt"}}, 2)
    with http_server(repo, port, tmp_path / "server.err"), httpx.Client(timeout=30) as http:
        token = subprocess.run(
            [*SERVE[:-1], "token"], capture_output=True, text=True, check=True
        ).stdout.strip()
        good = {**accept, "Authorization": f"Bearer {token}"}
        assert http.post(url, json=INITIALIZE, headers=accept).status_code == 401
        opened = http.post(url, json=INITIALIZE, headers=good)
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"]}
        ready = http.post(
            url, json=rpc("notifications/initialized", {}, None), headers={**good, **session}
        )
        assert ready.status_code == 202, ready.text

        for headers in (
            accept,
            {**accept, "Authorization": f"Bearer {token[:-1]}x"},
            {**accept, "Authorization": f"Basic {token}"},
            {**accept, "Authorization": token},
        ):
            refused = http.post(url, json=touch, headers={**headers, **session})
            assert refused.status_code == 401, refused.text
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert refused.json()["error"] == "unauthorized"
        twice = [*good.items(), *session.items(), ("Authorization", "Bearer wrong")]
        assert http.post(url, json=touch, headers=httpx.Headers(twice)).status_code == 401
        assert http.get(url, headers=session).status_code == 401
        assert not (repo / "ran.txt").exists()

        ran = http.post(url, json=touch, headers={**good, **session})
        assert ran.status_code == 200 and '"isError":false' in ran.text, ran.text
        assert (repo / "ran.txt").exists()

        new = subprocess.run(
            [*SERVE[:-1], "token", "--new"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert new != token
        stale = http.post(url, json=touch, headers={**good, **session})
        assert stale.status_code == 401  # the running server refuses the old token at once
        fresh = http.post(
            url, json=INITIALIZE, headers={**accept, "Authorization": f"Bearer {new}"}
        )
        assert fresh.status_code == 200


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


def test_the_token_is_private_and_replaced_on_request(repo: Path) -> None:
    """`coder mcp token` makes one 0600 token and prints the same one again; `--new` replaces
    it; a token file others can read is refused (its token may be known), as by the server."""
    from tests.conftest import coder

    code, first, _ = coder(repo, "mcp", "token")
    assert code == 0 and len(first.strip()) >= 40
    stored = Path(os.environ["XDG_CONFIG_HOME"]) / "coder" / "mcp-token"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert coder(repo, "mcp", "token")[1] == first
    code, second, _ = coder(repo, "mcp", "token", "--new")
    assert code == 0 and second != first and stored.read_text() == second
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600

    stored.chmod(0o644)
    code, out, err = coder(repo, "mcp", "token")
    assert code == 3 and out == ""
    assert err.startswith(f"coder: error: {stored} can be read by other users (mode 0644)")
    assert "coder mcp token --new" in err
    code, third, _ = coder(repo, "mcp", "token", "--new")
    assert code == 0 and third not in (first, second)
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
