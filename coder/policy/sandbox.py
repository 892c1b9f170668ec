"""Run one policy-checked shell command: no network, a scrubbed environment, a timeout, a
process-group kill, capped output.

The command runs as `bash -c CMD` (a command too long for one argument, `bash FILE`) in a new
session (its own process group), so one signal
reaches it and everything it started; whatever is left of the group when it ends (for
example `sleep 1000 &`) is killed too. While the network is off, and the kernel lets an
unprivileged user create a network namespace, the command also runs under
`unshare --map-current-user --net` (or `unshare -rn`): it sees only a loopback device that is
down, so not even a server on the host's 127.0.0.1 is reachable. `unshare` execs the shell in
place, so the process group is still ours.

A runner killed with SIGKILL cannot end its commands' groups, and they would go on writing
into the worktree behind `coder resume`'s back. So every command of a run carries its owner
in `CODER_RUN_OWNER`, and resume, holding the task lock, ends whatever still carries it
(`kill_owned`) before it looks at the worktree.
"""

from __future__ import annotations

import functools
import math
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from coder.errors import EnvironmentProblem, InvalidInput, PolicyViolation
from coder.files import ahead
from coder.files.realpath import realpath
from coder.files.safeio import read_regular
from coder.policy import cgroups, confine, kernel, tmpdirs, writes
from coder.policy.commands import Limits, Policy, check_command
from coder.policy.confine import ProcessExit
from coder.policy.env import scrub_env

_KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
_POLL_S = 0.05  # how often the waiting loop looks at the cancel event and the clock
OWNER_VAR = "CODER_RUN_OWNER"  # in every command's environment, for `kill_owned`


@dataclass(frozen=True)
class CommandResult:
    cmd: str
    exit_code: int | None  # None when timed out or cancelled; negative: killed by that signal
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False
    truncated: bool = False  # some stream was cut to the output cap
    note: str = ""  # what happened besides the output, for the model and the log
    # `results_var`: what the command wrote to the file that variable named (None: nothing)
    results: bytes | None = None
    confined: bool = False  # it ran in the kernel sandbox

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled

    @property
    def refused_write(self) -> str:
        """Why the command failed, when it ran confined and its output says a write was refused
        (a `git add` storing an object, a file outside the worktree): else "". Said to the user
        in the step's error, to the model in shell_run's result."""
        if not self.confined or self.ok:
            return ""
        output = self.stderr + self.stdout
        if not any(sign in output for sign in _REFUSED_WRITE):
            return ""
        why = "the sandbox lets a command write only its worktree and its TMPDIR"
        if re.search(r"\bgit\b", self.cmd):  # the program, not "digit"
            why += (
                ", not the repository's objects or refs: `git add` and `git commit` fail "
                "(coder commits each step of a run itself)"
            )
        return why


# What a write the sandbox refused prints: the read-only mounts' EROFS, and git's message for
# the objects Landlock keeps read-only.
_REFUSED_WRITE = ("Read-only file system", "insufficient permission for adding an object")


def network_isolation_available() -> bool:
    """Whether commands get a real network namespace while the network is off (otherwise
    only the command allowlist and Landlock's TCP rules keep them off the network)."""

    return kernel.support().netns != "none" or kernel.unshare_prefix() is not None


def require_sandbox(policy: Policy) -> None:
    """EnvironmentProblem unless commands can be confined (or the user turned that off)."""

    if not policy.sandbox:
        return
    found = kernel.support()
    if not found.available:
        raise EnvironmentProblem(
            f"no kernel sandbox for commands: {found.problem}",
            hint="run on a kernel with Landlock (Linux 6.2+), or accept running commands "
            'unconfined with "sandbox": "off" in coder.config.json or --no-sandbox',
        )


def _limits_prefix(limits: Limits) -> str:
    """`ulimit` settings that bash applies before the command (rlimits are per process, so
    they are set in the command's own shell, never in coder). Values above the hard limits
    coder itself runs under are lowered to them, so `ulimit` never fails."""
    import resource

    parts = []
    for flag, rlimit, value, unit in (
        ("-t", resource.RLIMIT_CPU, limits.cpu_seconds, 1),
        ("-v", resource.RLIMIT_AS, limits.memory_mb, 1024),  # ulimit -v counts KiB
        ("-f", resource.RLIMIT_FSIZE, limits.file_size_mb, 1024),  # bash -f: 1 KiB blocks
        ("-u", resource.RLIMIT_NPROC, limits.processes, 1),
    ):
        if not value:
            continue
        amount = value * unit
        hard = resource.getrlimit(rlimit)[1]
        if hard != resource.RLIM_INFINITY:
            per_unit = 1024 if flag in ("-v", "-f") else 1
            amount = min(amount, hard // per_unit)
        parts.append(f"{flag} {amount}")
    return f"ulimit {' '.join(parts)}; " if parts else ""


class _CappedBuffer:
    """Keeps the first cap/2 and the last cap/2 bytes of a stream, and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.lock = threading.Lock()  # a reader that never ends may still be writing

    def add(self, data: bytes) -> None:
        with self.lock:
            self.total += len(data)
            room = self.head_cap - len(self.head)
            if room > 0:
                self.head += data[:room]
                data = data[room:]
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def omitted(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        with self.lock:
            head = self.head.decode("utf-8", errors="replace")
            tail = self.tail.decode("utf-8", errors="replace")
            if self.omitted:
                return f"{head}\n[... {self.omitted} bytes omitted ...]\n{tail}"
            return head + tail


class _Pipes:
    """A command's stdout and stderr, read by the thread that waits for it, as they fill:
    reader threads would cost two thread starts and joins, about 1 ms a command."""

    def __init__(self, proc: subprocess.Popen[bytes], cap: int) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.out, self.err = _CappedBuffer(cap), _CappedBuffer(cap)
        self._open: dict[int, tuple[IO[bytes], _CappedBuffer]] = {
            proc.stdout.fileno(): (proc.stdout, self.out),
            proc.stderr.fileno(): (proc.stderr, self.err),
        }

    @property
    def open(self) -> bool:
        """Whether a pipe still has a writer (the command, or something it started)."""
        return bool(self._open)

    def pump(self, seconds: float, wake: int | None = None) -> None:
        """Read what the pipes hold, waiting up to `seconds` for output, a pipe's end, or
        `wake` to become readable (a pidfd: the process ended)."""
        if not self._open and wake is None:
            time.sleep(max(0.0, seconds))
            return
        poller = select.poll()
        for fd in (*self._open, *([wake] if wake is not None else [])):
            poller.register(fd, select.POLLIN)
        for fd, _event in poller.poll(math.ceil(max(0.0, seconds) * 1000)):
            if fd not in self._open:
                continue
            chunk = os.read(fd, 65536)
            if chunk:
                self._open[fd][1].add(chunk)
            else:  # every writer is gone
                self._open.pop(fd)[0].close()

    def drain(self, seconds: float) -> None:
        """Read until both pipes end, for up to `seconds`."""
        deadline = time.monotonic() + seconds
        while self._open and (left := deadline - time.monotonic()) > 0:
            self.pump(left)

    def close(self) -> None:
        for stream, _ in self._open.values():
            stream.close()
        self._open.clear()


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the process group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pgid was reused by someone else's group: not ours
        return False
    return True


def _end_group(proc: subprocess.Popen[bytes], pipes: _Pipes, exited: ProcessExit) -> None:
    """Stop everything in the command's process group and reap the main process.

    SIGTERM first; the group is done when the main process has exited and the output pipes
    are closed (every writer is gone), or after the grace period (the pipes read meanwhile,
    so a process flushing its output as it ends is not blocked); then SIGKILL for the rest.
    The group id stays ours while any member lives, so killing it late is safe.
    """
    pgid = proc.pid
    if proc.poll() is not None and not _signal_group(pgid, 0):
        return  # exited and nothing left behind
    if _signal_group(pgid, signal.SIGTERM):
        deadline = time.monotonic() + _KILL_GRACE_S
        while (left := deadline - time.monotonic()) > 0:
            running = proc.poll() is None
            if not running and not pipes.open:
                break
            pipes.pump(min(left, _POLL_S), exited.fd if running else None)
        _signal_group(pgid, signal.SIGKILL)
    proc.wait()


def owner_token(coder_dir: Path, task_id: str) -> str:
    """What the commands of one task's runs carry in OWNER_VAR (unique per project and task)."""
    return f"{realpath(coder_dir)}#{task_id}"


def kill_owned(owner: str, wait: float = 5.0) -> list[int]:
    """SIGKILL the process groups of every process whose environment carries `owner` (left
    running by a runner that was killed), and wait until they are gone. Returns their pids.

    Only the caller may know none of them is live work: `coder resume` calls it holding the
    task lock, before it starts any command. Linux only (it reads /proc); a command that
    cleared its environment escapes it, as one that left its process group escapes the
    timeout kill: what the cgroups of a killed coder hold is ended then too, whatever its
    environment (coder.policy.cgroups)."""
    needle = f"{OWNER_VAR}={owner}".encode()
    mine = {os.getpid(), os.getpgrp()}
    found = []
    for entry in _proc_entries():
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0") and int(entry) not in mine:
            found.append(int(entry))
    for pid in found:
        try:
            pgid = os.getpgid(pid)
            if pgid not in mine:  # the group is a command's session; never our own
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait  # dead, not dying: one may be inside a write()
    while any(_alive(pid) for pid in found) and time.monotonic() < deadline:
        time.sleep(0.01)
    cgroups.sweep()
    tmpdirs.sweep()  # the temporary directories of coders that are gone, their commands ended
    return found


def _proc_entries() -> list[str]:
    try:
        return [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:  # no procfs (macOS)
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def run_command(
    cmd: str,
    *,
    cwd: Path,
    policy: Policy,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cancel: threading.Event | None = None,
    root: Path | None = None,
    owner: str | None = None,
    results_var: str | None = None,
) -> CommandResult:
    """Run `cmd` with bash in `cwd` under `policy`; see the module docstring. `owner`
    (see `owner_token`) marks the command for `kill_owned`. `results_var`: the variable that
    gives the command a file to write machine-readable results to, in a private directory
    outside `root` (the sandbox's temp dir); its bytes come back as `results`.

    Raises PolicyViolation (before anything runs) if the command or `cwd` is refused,
    InvalidInput for a bad cwd or timeout, EnvironmentProblem if no shell can be started.
    A non-zero exit, a timeout or a cancel is reported in the result, never raised.
    """
    command_env = scrub_env(policy.env_passthrough, env)
    check_command(cmd, policy, root=Path(root or cwd), cwd=Path(cwd), path=command_env.get("PATH"))
    cwd = Path(cwd)
    if root is not None:
        real_root, real_cwd = realpath(root), realpath(cwd)
        if os.path.commonpath([real_root, real_cwd]) != real_root:
            raise PolicyViolation(f"working directory escapes the worktree: {cwd}")
    if not cwd.is_dir():
        raise InvalidInput(f"working directory does not exist: {cwd}")
    limit = float(policy.command_timeout if timeout is None else timeout)
    if limit <= 0:
        raise InvalidInput(f"command timeout must be positive, got {limit:g}")

    if cancel is not None and cancel.is_set():  # stopping already: do not start anything
        return CommandResult(
            cmd, None, "", "", 0.0, cancelled=True, note="cancelled before it started"
        )

    if owner is not None:
        command_env[OWNER_VAR] = owner
    shell, bash = _shell(os.environ.get("PATH"))
    script = (_limits_prefix(policy.limits) if bash else "") + cmd
    started = time.monotonic()
    with (
        _spawner(policy, root or cwd, command_env) as spawn,
        _shell_argv(shell, script, command_env.get("TMPDIR")) as argv,
        _results_file(results_var, command_env, private=policy.sandbox) as results,
    ):
        try:
            proc = spawn(
                argv,
                cwd=cwd,
                env=command_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise EnvironmentProblem(f"cannot start {shell} for a command: {exc}") from exc
        ahead.make_wanted(lambda: proc.poll() is None)  # the files the next writes take
        done = _wait(proc, cmd, policy, limit, cancel, started)
        return done if results is None else replace(done, results=_read_results(results))


@functools.lru_cache(maxsize=4)
def _shell(path: str | None) -> tuple[str, bool]:
    """The shell commands run with on coder's PATH ``path`` (bash, else sh), and whether it is
    bash: looked up once per PATH, not per command."""
    bash = shutil.which("bash", path=path)
    return bash or shutil.which("sh", path=path) or "/bin/sh", bash is not None


_RESULTS_CAP = 64 * 1024 * 1024  # bytes of a results file read back


@contextmanager
def _results_file(var: str | None, env: dict[str, str], *, private: bool) -> Iterator[Path | None]:
    """A fresh directory for the command's results file, named in `env[var]`: in the
    command's private TMPDIR under the sandbox (`private`: set by `_spawner`, the one place
    outside the worktree it may write), else a temp dir of its own; removed afterwards."""
    if var is None:
        yield None
        return
    tmp = (
        tempfile.mkdtemp(prefix="coder-results-", dir=env["TMPDIR"])
        if private
        else tmpdirs.make("results")
    )
    path = Path(tmp, "results")
    env[var] = str(path)
    try:
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_results(path: Path) -> bytes | None:
    """The results file, a regular file not reached through a final link; None if missing."""
    try:
        return read_regular(path, limit=_RESULTS_CAP, follow=False)
    except (OSError, ValueError):
        return None


Spawn = Callable[..., "subprocess.Popen[bytes]"]

# Bytes of a script passed as one argument: Linux refuses a single argv string over 128 KiB
# (MAX_ARG_STRLEN) with "Argument list too long".
_MAX_ARG = 100_000


@contextmanager
def _shell_argv(shell: str, script: str, tmp_dir: str | None) -> Iterator[list[str]]:
    """`shell -c SCRIPT`; a script too long for one argument (a big heredoc) is read by the
    shell from a private temporary file instead (in `tmp_dir`, the command's own TMPDIR: the
    one place outside the worktree a confined command sees), removed when it is done."""
    if len(script.encode()) <= _MAX_ARG:
        yield [shell, "-c", script]
        return
    with tempfile.TemporaryDirectory(prefix=tmpdirs.prefix("cmd"), dir=tmp_dir) as tmp:
        path = Path(tmp, "command.sh")
        path.write_text(script, encoding="utf-8")
        yield [shell, str(path)]


@contextmanager
def _spawner(policy: Policy, root: Path, env: dict[str, str]) -> Iterator[Spawn]:
    """How to start the command: confined in the kernel sandbox for `root` (with a private
    TMPDIR, emptied afterwards: `Confinement.command_tmp`), or, with the sandbox off, only in
    its own network namespace."""
    if not policy.sandbox:
        prefix = None if policy.allow_network else _unshare_prefix()

        def unconfined(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
            return subprocess.Popen([*(prefix or ()), *argv], **kwargs)

        yield unconfined
        return

    require_sandbox(policy)
    profile = writes.profile_for(
        root, network=policy.allow_network, path=env.get("PATH", ""), visible=policy.visible_paths
    )
    spawner = confine.confinement(profile)
    spawner.hold_to(policy.limits.processes)
    tmp = spawner.command_tmp()
    env.update(TMPDIR=tmp, TMP=tmp, TEMP=tmp)
    try:
        yield spawner.popen
    finally:
        spawner.give_back(tmp)


def _unshare_prefix() -> tuple[str, ...] | None:

    return kernel.unshare_prefix()


def _wait(
    proc: subprocess.Popen[bytes],
    cmd: str,
    policy: Policy,
    limit: float,
    cancel: threading.Event | None,
    started: float,
) -> CommandResult:
    """Collect the output of a started command until it ends, times out or is cancelled."""
    pipes = _Pipes(proc, policy.output_cap)
    timed_out = cancelled = False
    exited = ProcessExit(proc)
    try:
        try:
            while proc.poll() is None:
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if time.monotonic() - started >= limit:
                    timed_out = True
                    break
                pipes.pump(_POLL_S, exited.fd)
        finally:  # also on KeyboardInterrupt: never leave the group running
            _end_group(proc, pipes, exited)
    finally:
        exited.close()
    pipes.drain(1.0)  # a process that left the group (setsid) may still hold a pipe open:
    incomplete = pipes.open  # do not wait for it
    pipes.close()
    out, err = pipes.out, pipes.err
    duration = time.monotonic() - started

    notes = []
    if timed_out:
        notes.append(f"timed out after {limit:g}s; process group killed")
    if cancelled:
        notes.append("cancelled; process group killed")
    omitted = out.omitted + err.omitted
    if omitted:
        notes.append(
            f"output capped at {policy.output_cap} bytes per stream ({omitted} bytes omitted)"
        )
    if incomplete:
        notes.append(
            "output may be incomplete: a process that left the command's process "
            "group still holds its output open"
        )
    return CommandResult(
        cmd=cmd,
        exit_code=None if (timed_out or cancelled) else proc.returncode,
        stdout=out.text(),
        stderr=err.text(),
        duration_s=duration,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated=omitted > 0,
        note="; ".join(notes),
        confined=policy.sandbox,
    )
