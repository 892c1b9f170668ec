"""One process tree per step, with real processes (coder.policy.cgroups, coder.policy.proctrees):
what a step's commands and its MCP servers' tools start is ended with the step, even a process
that left its session or whose parent exited; `limits.processes` binds root; and the cgroups
coder makes do not outlive it, nor a coder killed outright. Judged by /proc and the cgroup
files, never by coder's messages."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coder.policy import cgroups, confine, kernel, sandbox
from coder.policy.commands import Limits
from coder.policy.sandbox import run_command
from tests.conftest import coder
from tests.fake_ollama import FakeOllama
from tests.helpers import ROOT, call, chat_requests, done, taskfile
from tests.policy.test_confine import DAEMON, POLICY, daemon_pid, gone
from tests.policy.test_sandbox import sleep_marker

pytestmark = pytest.mark.skipif(
    not kernel.support().available,
    reason=f"no kernel sandbox here: {kernel.support().problem}",
)
needs_cgroups = pytest.mark.skipif(
    cgroups.problem() is not None, reason=f"no pids cgroup here: {cgroups.problem()}"
)
SPAWN = {
    "name": "spawn",
    "command": sys.executable,
    "args": [str(ROOT / "fixtures/mcp_spawn_server.py")],
}


def sleeping(marker: str) -> list[int]:
    """The processes running `sleep MARKER` (not one whose command line only mentions it)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == f"sleep\0{marker}\0".encode():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def none_left(marker: str) -> bool:
    deadline = time.monotonic() + 5  # SIGKILL is delivered, not waited for
    while sleeping(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not sleeping(marker)


def kill_all(*markers: str) -> None:
    for marker in markers:
        for pid in sleeping(marker):
            os.kill(pid, signal.SIGKILL)


def cgroup_dirs(pid: int) -> list[str]:
    """The directories of cgroups coder process `pid` made (coder.policy.cgroups' layout)."""
    home = cgroups._home()
    assert home is not None
    return sorted(
        e for e in os.listdir(home[0]) if e.startswith("coder-") and e.split("-")[2] == str(pid)
    )


def mcp_cgroups() -> list[str]:
    """The MCP servers' cgroups this (test) process has now."""
    home = cgroups._home()
    if home is None:
        return []
    return [
        child
        for base in cgroup_dirs(os.getpid())
        for child in os.listdir(os.path.join(home[0], base))
        if child.startswith("mcp-")
    ]


# Starts 200 `sleep MARKER` in sessions of their own, counting those the kernel let start.
FORK_200 = (
    "python3 -c 'import subprocess, sys\n"
    "started = 0\n"
    "for _ in range(200):\n"
    "    try:\n"
    '        subprocess.Popen(["setsid", "sleep", sys.argv[1]])\n'
    "    except OSError:\n"
    "        continue\n"
    "    started += 1\n"
    "print(started)' {marker} 2>/dev/null"
)


@needs_cgroups
def test_limits_processes_holds_root_to_it_and_the_step_end_ends_them_all(tmp_path: Path) -> None:
    """As root, `ulimit -u` binds nothing (200 processes ran under a limit of 64): the
    sandbox's pids cgroup does. Full as it is, the end of the step still ends every one."""
    assert os.geteuid() == 0
    marker = sleep_marker()
    policy = replace(POLICY, limits=Limits(processes=64))
    try:
        result = run_command(
            FORK_200.format(marker=marker), cwd=tmp_path, policy=policy, root=tmp_path
        )
        started = int(result.stdout)
        assert len(sleeping(marker)) == started
        assert 50 <= started <= 64 - 2  # its shell and python3 count too
        confine.end_leftovers(tmp_path)
        assert none_left(marker)
    finally:
        kill_all(marker)


FAKE_SERVER_RUN = """
    id: trees
    title: what an MCP server starts ends with the step
    graph:
      - {id: s1, kind: analyze, goal: leave sleepers running, tools: ["spawn__*"]}
      - {id: s2, kind: analyze, goal: count the sleepers, tools: ["spawn__*"]}
"""


def test_what_an_mcp_tool_starts_ends_with_its_step(fake: FakeOllama, make_repo) -> None:
    """A tool of an external MCP server leaves a process in a session of its own, and another
    whose parent (a shell) exited: both are gone when the next step runs, and the server
    still answers. Counted by the server itself, from /proc, and by the test after the run."""
    from coder import config as config_mod

    repo = make_repo()
    (repo / "coder.config.json").write_text(json.dumps({"mcp_servers": [SPAWN]}))
    config_mod.trust(repo)
    own, orphan = sleep_marker(), sleep_marker()
    fake.enqueue(
        call("spawn__spawn", marker=own),
        call("spawn__orphan", marker=orphan),
        call("spawn__running", marker=own),
        done("left two sleepers", no_change_reason="nothing to change"),
        call("spawn__running", marker=own),
        call("spawn__running", marker=orphan),
        done("counted them", no_change_reason="nothing to change"),
    )
    try:
        code, out, err = coder(
            repo, "run", "--autonomous", "-f", str(taskfile(repo, FAKE_SERVER_RUN))
        )
        assert code == 0, out + err
        requests = chat_requests(fake)
        assert tool_results(requests[3])[-1] == "1"  # s1: running during its step
        assert tool_results(requests[-1]) == ["0", "0"]  # s2: ended with s1, before s2
        assert none_left(own) and none_left(orphan)
        assert mcp_cgroups() == []  # the server's, removed once it stopped
    finally:
        kill_all(own, orphan)


PARALLEL_RUN = """
    id: level
    title: what an MCP server starts in a level of parallel steps ends with the level
    graph:
      - {id: a, kind: analyze, goal: leave a sleeper, tools: ["spawn__*"]}
      - {id: b, kind: analyze, goal: leave a sleeper too, tools: ["spawn__*"]}
      - {id: c, kind: analyze, goal: count them, tools: ["spawn__*"], depends_on: [a, b]}
"""


def test_what_an_mcp_tool_starts_in_parallel_steps_ends_with_their_level(
    fake: FakeOllama, make_repo
) -> None:
    """Parallel steps work in scratch worktrees, but the servers are the run's, confined to
    its worktree: what they started is ended once the level's steps are done, before any
    lands."""
    from coder import config as config_mod

    repo = make_repo()
    config = {"mcp_servers": [SPAWN], "max_parallel": 2}
    (repo / "coder.config.json").write_text(json.dumps(config))
    config_mod.trust(repo)
    marker = sleep_marker()
    fake.enqueue(  # a and b take these in whatever order they ask
        call("spawn__orphan", marker=marker),
        call("spawn__orphan", marker=marker),
        done("left a sleeper", no_change_reason="nothing to change"),
        done("left a sleeper", no_change_reason="nothing to change"),
        call("spawn__running", marker=marker),
        done("counted them", no_change_reason="nothing to change"),
    )
    try:
        code, out, err = coder(repo, "run", "--autonomous", "-f", str(taskfile(repo, PARALLEL_RUN)))
        assert code == 0, out + err
        assert tool_results(chat_requests(fake)[-1]) == ["0"]
        assert none_left(marker)
    finally:
        kill_all(marker)


def bridge_script(root: Path) -> str:
    """Python that starts the spawn server confined to `root`, has it leave sleepers, ends the
    step (`end_leftovers`), then stops the server; prints what /proc shows at each stage."""
    return inspect.getsource(sleeping) + textwrap.dedent(
        f"""
        import json, os, sys
        from pathlib import Path
        from coder.mcp.client import McpBridge
        from coder.policy import cgroups, confine, sandbox
        root, markers = Path({str(root)!r}), sys.argv[1:4]
        spec = {{"name": "spawn", "command": sys.executable, "args": [{str(ROOT / "fixtures/mcp_spawn_server.py")!r}]}}
        seen = {{"cgroups": cgroups.problem()}}
        with McpBridge([spec], cwd=root) as bridge:
            assert not bridge.warnings, bridge.warnings
            assert bridge.call("spawn__spawn", {{"marker": markers[0]}}).ok
            assert bridge.call("spawn__orphan", {{"marker": markers[1]}}).ok
            seen["running"] = [len(sleeping(m)) for m in markers[:2]]
            confine.end_leftovers(root)
            seen["after the step"] = [len(sleeping(m)) for m in markers[:2]]
            seen["server answers"] = bridge.call("spawn__running", {{"marker": markers[0]}}).content
            assert bridge.call("spawn__spawn", {{"marker": markers[2]}}).ok
        seen["after the run"] = len(sleeping(markers[2]))
        print(json.dumps(seen))
        """
    )


@pytest.fixture(scope="module")
def nobody_home() -> Iterator[Path]:
    """A directory user 65534 owns and can reach (pytest's own are root's, mode 0700)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running as another user needs root and setpriv")
    home = Path(tempfile.mkdtemp(prefix="coder-nobody-"))
    shutil.chown(home, 65534, 65534)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def nobody_python(nobody_home: Path) -> Path:
    """A Python that user 65534 can run, which sees coder and the mcp SDK: a venv of an
    interpreter that user can reach (the tests' own may sit under /root)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for base in (
        os.path.realpath(sys.executable),
        f"/usr/bin/{version}",
        f"/usr/local/bin/{version}",
    ):
        check = "import os, sys; sys.exit(not os.access(sys.executable, os.X_OK))"
        if os.path.exists(base) and as_nobody([base, "-c", check], Path("/")).returncode == 0:
            break
    else:
        pytest.skip(f"no {version} that user 65534 can run")
    venv = nobody_home / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "coder-tests.pth").write_text("\n".join([str(ROOT), *sys.path[1:]]) + "\n")
    python = venv / "bin" / "python"
    imports = "import coder.mcp.client, jsonschema, landlockpy, mcp, pygit2"
    if as_nobody([str(python), "-c", imports], nobody_home).returncode != 0:
        pytest.skip("user 65534 cannot read coder's dependencies here (tox keeps .tox/ 0700)")
    return python


def as_nobody(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "TMPDIR": str(cwd)}
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_without_cgroups_the_server_is_the_subreaper_of_what_it_starts(
    nobody_home: Path, nobody_python: Path
) -> None:
    """Without root there is no cgroup: the launcher makes the server a child subreaper, so
    a process its tool started stays below it, even once its parent (a shell) exited."""
    home = nobody_home
    (home / "wt").mkdir()
    shutil.chown(home / "wt", 65534, 65534)
    markers = [sleep_marker() for _ in range(3)]
    script = home / "script.py"
    script.write_text(bridge_script(home / "wt"))
    try:
        done_ = as_nobody([str(nobody_python), str(script), *markers], home)
        assert done_.returncode == 0, done_.stderr
        seen = json.loads(done_.stdout)
        assert seen == {
            "cgroups": "making a cgroup needs root",
            "running": [1, 1],
            "after the step": [0, 0],
            "server answers": "0",
            "after the run": 0,
        }
        assert all(none_left(m) for m in markers)
    finally:
        kill_all(*markers)


def test_doctor_says_which_process_wall_holds(
    make_repo, nobody_home: Path, nobody_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fake_ollama import down_url

    monkeypatch.setenv("OLLAMA_HOST", down_url())
    repo = make_repo()
    _, out, _ = coder(repo, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(out)["checks"]}["process trees"]
    if cgroups.problem() is None:
        assert found["status"] == "ok" and "limits.processes binds root too" in found["detail"]

    mine = nobody_home / "repo"
    subprocess.run(["git", "init", "-q", str(mine)], check=True)
    shutil.chown(mine, 65534, 65534)
    for path in mine.rglob("*"):
        shutil.chown(path, 65534, 65534)
    doctor = as_nobody([str(nobody_python), "-m", "coder", "doctor", "--json"], mine)
    found = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}["process trees"]
    assert found == {
        "name": "process trees",
        "status": "ok",
        "detail": "limits.processes by ulimit -u (no pids cgroup: making a cgroup needs root); "
        "an MCP server is the subreaper of what its tools start",
        "fix": None,
    }


# A coder that made a sandbox (so its cgroups), whose command left a process running (its pid in
# daemon.pid); it prints its own pid, then waits to be killed if told to, else exits.
LEFT_BEHIND = """
import os, sys, time
from pathlib import Path
from coder.policy.commands import Policy
from coder.policy.sandbox import run_command
root, daemon, wait = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "wait"
run_command(daemon, cwd=root, policy=Policy(), root=root)
print(os.getpid(), flush=True)
time.sleep(60 if wait else 0)
"""


def left_behind(root: Path, *, wait: bool) -> tuple[int, int, subprocess.Popen[str]]:
    """(coder's pid, its leftover's pid, coder)."""
    argv = [sys.executable, "-c", LEFT_BEHIND, str(root), DAEMON, "wait" if wait else "exit"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc.stdout:
        pid = int(proc.stdout.readline())
    return pid, daemon_pid(root), proc


@needs_cgroups
def test_coder_leaves_no_cgroup_behind_even_killed_outright(tmp_path: Path) -> None:
    """A coder that exits removes its cgroups, what is left in them ended first; one killed
    with SIGKILL cannot, and the next coder sweeps them (and ends what they hold) before it
    looks at a worktree (`coder resume`'s `kill_owned`)."""
    pid, daemon, exits = left_behind(tmp_path, wait=False)
    assert exits.wait(timeout=60) == 0
    assert cgroup_dirs(pid) == [] and gone(daemon)

    pid, daemon, killed = left_behind(tmp_path, wait=True)
    killed.kill()
    killed.wait()
    try:
        assert len(cgroup_dirs(pid)) == 1 and sandbox._alive(daemon)  # what SIGKILL leaves
        sweeps = "from coder.policy import sandbox; print(sandbox.kill_owned('another run'))"
        swept = subprocess.run(
            [sys.executable, "-c", sweeps], cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert swept.stdout == "[]\n"  # nothing carries that owner: the sweep ended it
        assert cgroup_dirs(pid) == [] and gone(daemon)
    finally:
        if sandbox._alive(daemon):
            os.kill(daemon, signal.SIGKILL)
