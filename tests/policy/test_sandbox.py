"""run_command with real processes: output, exit codes, environment, caps, kills, network."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coder.errors import InvalidInput, PolicyViolation
from coder.policy import sandbox
from coder.policy.commands import Policy
from coder.policy.sandbox import CommandResult, network_isolation_available, run_command

POLICY = Policy()
PYTHON = shlex.quote(sys.executable)  # its basename, `python`, is on the default allowlist


def run(cmd: str, cwd: Path, policy: Policy = POLICY, **kw: object) -> CommandResult:
    return run_command(cmd, cwd=cwd, policy=policy, **kw)  # type: ignore[arg-type]


def sleep_marker() -> str:
    """A `sleep` duration nobody else uses, to find our processes in /proc."""
    return f"1000.{uuid.uuid4().int % 10**9:09d}"


def processes_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                pids.append(int(entry))
    return pids


def assert_none_survive(marker: str) -> None:
    deadline = time.monotonic() + 2  # a SIGKILLed process leaves /proc asynchronously
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_with(marker) == []


def test_output_and_exit_code(tmp_path: Path) -> None:
    result = run("echo hello; echo oops >&2; exit 3", tmp_path)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 3)
    assert not result.ok and not result.timed_out and not result.truncated and result.note == ""
    assert run("true", tmp_path).ok


def test_runs_in_cwd(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    result = run("pwd; ls", tmp_path / "sub", root=tmp_path)
    assert result.stdout == os.path.realpath(tmp_path / "sub") + "\n"


def test_cwd_outside_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wt").mkdir()
    with pytest.raises(PolicyViolation, match="working directory escapes the worktree"):
        run("true", tmp_path, root=tmp_path / "wt")
    with pytest.raises(InvalidInput, match="working directory does not exist"):
        run("true", tmp_path / "missing")


def test_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "sk-fake-0123456789")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_fake")
    monkeypatch.setenv("SHARED_TOKEN", "passed-on-purpose")
    policy = Policy(env_passthrough=frozenset({"SHARED_TOKEN"}))
    result = run("env", tmp_path, policy, env={"STEP_VAR": "from-taskfile"})
    assert result.ok
    assert "sk-fake-0123456789" not in result.stdout and "FAKE_API_KEY" not in result.stdout
    assert "ghp_fake" not in result.stdout
    lines = result.stdout.splitlines()
    assert f"PATH={os.environ['PATH']}" in lines
    assert "SHARED_TOKEN=passed-on-purpose" in lines and "STEP_VAR=from-taskfile" in lines


def test_output_is_capped_with_a_note(tmp_path: Path) -> None:
    policy = Policy(output_cap=1024)
    result = run(
        f"{PYTHON} -c \"print('A' * 600 + 'B' * 20000 + 'C' * 600, end='')\"", tmp_path, policy
    )
    assert result.ok and result.truncated
    assert result.stdout.startswith("A" * 512) and result.stdout.endswith("C" * 512)
    assert "\n[... 20176 bytes omitted ...]\n" in result.stdout
    assert result.note == "output capped at 1024 bytes per stream (20176 bytes omitted)"


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    result = run("printf 'ok \\377\\n'", tmp_path)
    assert result.stdout == "ok \ufffd\n"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    marker = sleep_marker()
    started = time.monotonic()
    result = run(
        f"sleep {marker} & sleep {marker} & echo started; sleep {marker}", tmp_path, timeout=1
    )
    assert time.monotonic() - started < 4
    assert result.timed_out and result.exit_code is None and not result.ok
    assert result.stdout == "started\n"
    assert result.note == "timed out after 1s; process group killed"
    assert_none_survive(marker)


def test_background_children_do_not_outlive_the_command(tmp_path: Path) -> None:
    marker = sleep_marker()
    started = time.monotonic()
    result = run(f"sleep {marker} & echo done", tmp_path)
    assert result.ok and result.stdout == "done\n"
    assert time.monotonic() - started < 3
    assert_none_survive(marker)


def test_a_child_ignoring_sigterm_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "_KILL_GRACE_S", 0.3)  # SIGKILL follows sooner than in real use
    marker = sleep_marker()
    started = time.monotonic()
    result = run(f"trap '' TERM; sleep {marker}", tmp_path, timeout=0.5)
    assert result.timed_out and time.monotonic() - started < 2
    assert_none_survive(marker)


def test_a_process_leaving_the_group_does_not_hang_the_call(tmp_path: Path) -> None:
    """Known limit: a process that calls setsid() escapes the group kill. The call still
    returns (after about a second) and says that the output may be incomplete."""
    marker = sleep_marker()
    started = time.monotonic()
    try:
        result = run(
            f'{PYTHON} -c "import subprocess; '
            f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\"; "
            "echo hi",
            tmp_path,
        )
        assert time.monotonic() - started < 3
        assert result.ok and result.stdout == "hi\n"
        assert "output may be incomplete" in result.note
    finally:
        for pid in processes_with(marker):  # the escaped sleep this test started
            os.kill(pid, signal.SIGKILL)
    assert_none_survive(marker)


def test_cancel_event_stops_the_command(tmp_path: Path) -> None:
    marker = sleep_marker()
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = run(f"sleep {marker}", tmp_path, cancel=cancel)
    assert time.monotonic() - started < 3
    assert result.cancelled and not result.timed_out and result.exit_code is None
    assert result.note == "cancelled; process group killed"
    assert_none_survive(marker)
    result = run("touch ran.txt", tmp_path, cancel=cancel)  # already set: nothing starts
    assert result.cancelled and result.note == "cancelled before it started"
    assert not (tmp_path / "ran.txt").exists()


def test_refused_command_does_not_run(tmp_path: Path) -> None:
    with pytest.raises(PolicyViolation, match="`curl` is a network program"):
        run("touch ran.txt; curl http://example.com", tmp_path)
    with pytest.raises(PolicyViolation, match="`eval` runs a string as code"):
        run("touch ran.txt && eval 'ls'", tmp_path)
    assert not (tmp_path / "ran.txt").exists()


@pytest.fixture
def loopback_server() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def connect_cmd(port: int) -> str:
    return (
        f'{PYTHON} -c "import socket; '
        f"socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\""
    )


def test_network_is_unreachable_when_off(tmp_path: Path, loopback_server: int) -> None:
    if not network_isolation_available():
        pytest.skip(
            "the kernel does not allow an unprivileged network namespace "
            "(unshare -rn); only the command allowlist applies"
        )
    result = run(connect_cmd(loopback_server), tmp_path)
    assert result.exit_code != 0
    assert "PermissionError" in result.stderr  # Landlock refuses TCP before the namespace
    # Without the sandbox, the network namespace alone: [Errno 101] Network is unreachable
    bare = run(connect_cmd(loopback_server), tmp_path, Policy(sandbox=False))
    assert bare.exit_code != 0 and "Network is unreachable" in bare.stderr


def test_network_is_reachable_when_allowed(tmp_path: Path, loopback_server: int) -> None:
    result = run(connect_cmd(loopback_server), tmp_path, Policy(allow_network=True))
    assert result.ok, result.stderr


def test_a_command_longer_than_one_argument_runs_whole(tmp_path: Path) -> None:
    """200 KB of heredoc: `bash -c` got "Argument list too long" (one argv string is limited
    to 128 KiB); the script goes through a private file instead, removed afterwards."""
    body = "\n".join(f"line {i} " + "x" * 60 for i in range(3_000))  # ~200 KB
    cmd = f"cat > big.txt <<'EOF'\n{body}\nEOF\necho done; echo $#"
    assert len(cmd) > 150_000
    result = run(cmd, tmp_path, root=tmp_path)
    assert result.ok, result.stderr
    assert result.stdout == "done\n0\n"
    assert (tmp_path / "big.txt").read_text() == body + "\n"
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("coder-cmd-*/command.sh"))
