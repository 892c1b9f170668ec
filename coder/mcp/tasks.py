"""Task control for MCP clients: `task_validate`, `task_run`, `task_status`, `task_stop`.

Registry tools like the others (flat schemas, errors as data), served by `coder mcp serve`.
`task_run` starts `coder run --autonomous` as a background process in the repository and
returns the run's id: a taskfile without `id` is copied to `.coder/mcp/ID.yaml` with a generated
id first, so the id is known before the run starts. The process outlives the server (its own
session); its output is appended to `.coder/mcp/ID.log` (each launch's from a line of its own,
never over an earlier one's).

Clients each start a server of their own, so several may call `task_run` on one taskfile at the
same moment. The one that takes the task's claim (`.coder/mcp/ID.lock`, an `flock`) starts the
run, and hands the claim to it (an inherited descriptor): it lasts as long as that `coder run`
does, and the kernel ends it when that process ends, however it ends. The others are told the
run is already running, with its id and pid, and start nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Required, TypedDict

from coder import project, taskfile
from coder.display import counted
from coder.errors import CoderError, InvalidInput, NotRegular, RunNotStarted, UnknownTask
from coder.files import nofollow
from coder.files.durable import write_failed, write_private
from coder.files.safeio import file_kind
from coder.git import repository
from coder.policy.paths import resolve_in_root
from coder.run import manifest as manifests
from coder.run.lock import processes_holding, read_lock_owner
from coder.run.records import DONE, check_task_id, now_iso
from coder.run.state import StateStore
from coder.run.stop import stop_run
from coder.services import validate as validation
from coder.taskfile import graph
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop

START_WAIT = 5.0  # seconds task_run waits for the run to be created (or to fail early)


@dataclass
class _Launch:
    process: subprocess.Popen[bytes]
    log: Path
    merge: bool = False
    offset: int = 0  # where this launch's output starts in the log


_launched: dict[str, _Launch] = {}
_lock = threading.Lock()


class PathArgs(TypedDict):
    path: str


class RunArgs(TypedDict, total=False):
    path: Required[str]
    merge_on_success: bool


class IdArgs(TypedDict):
    id: str


def _taskfile(ctx: ToolContext, rel: str) -> Path:
    return resolve_in_root(Path(ctx.root), rel, write=False, policy=ctx.policy)


def _repo(ctx: ToolContext) -> tuple[Any, Path]:
    """The git repository at the server's root and its `.coder/` directory."""
    repo = repository.open_repo(Path(ctx.root))
    return repo, project.coder_dir(repository.repo_root(repo))


# --------------------------------------------------------------------------- handlers


def task_validate(ctx: ToolContext, args: PathArgs) -> ToolResult:
    rel = args["path"]
    problems, task = validation.check(_taskfile(ctx, rel), cwd=Path(ctx.root), name=rel)
    if problems:
        lines = [str(p) for p in problems]
        count = f"{len(problems)} problem{'s' * (len(problems) != 1)}"
        return ToolResult.error(
            "\n".join(lines) + f"\n{rel}: {count}",
            hint="fix the taskfile, then validate it again",
            data={"valid": False, "problems": [p.as_dict() for p in problems]},
        )
    assert task is not None
    levels = graph.levels(graph.build(task.deps()))
    return ToolResult(
        ok=True,
        content=f"{rel}: valid ({counted(len(task.steps), 'step')} in "
        f"{counted(len(levels), 'level')})",
        data={
            "valid": True,
            "id": task.id if task.source.get("id") else None,
            "steps": len(task.steps),
            "levels": levels,
        },
    )


def task_run(ctx: ToolContext, args: RunArgs) -> ToolResult:
    rel = args["path"]
    task = taskfile.load(_taskfile(ctx, rel), rel)
    repo, coder_dir = _repo(ctx)
    project.ensure_coder_dir(coder_dir.parent)
    repository.ensure_excluded(repo, f"/{project.CODER_DIR}/")
    work = coder_dir / "mcp"  # written without following a link (coder.files.nofollow, durable)
    claim_path = work / f"{task.id}.lock"
    claim = _claim(claim_path)
    if claim is None:  # another task_run is starting it, or its run is running
        return _already_running(task.id, _claimant(claim_path))
    try:
        runner = read_lock_owner(coder_dir, task.id)
        if runner is not None:  # started by `coder run` or `coder resume`
            return _already_running(task.id, runner)
        if manifests.run_exists(coder_dir, task.id):
            raise InvalidInput(
                f"a run of task {task.id} already exists",
                hint=f"follow it with task_status, continue it with `coder resume -t "
                f"{task.id}`, or remove it with `coder clean -t {task.id}`",
            )
        run_file = _run_file(ctx, rel, task, work)
        launch = _launch(task.id, run_file, coder_dir, claim, bool(args.get("merge_on_success")))
    finally:
        os.close(claim)  # the run holds the claim now (or nobody: nothing was started)
    process = launch.process
    with _lock:
        _launched[task.id] = launch
    manifest = manifests.manifest_path(coder_dir, task.id)
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline and process.poll() is None and not manifest.exists():
        time.sleep(0.05)
    if not manifest.exists() and process.poll() is not None:
        raise _not_started(task.id, launch)
    state = "running" if manifest.exists() else "starting"
    return ToolResult(
        ok=True,
        content=(
            f"run {task.id} {'started' if state == 'running' else 'is starting'} on branch "
            f"{task.branch} (pid {process.pid}); follow it with task_status(id={task.id!r})"
        ),
        data={
            "task_id": task.id,
            "status": state,
            "branch": task.branch,
            "pid": process.pid,
            "log": str(launch.log),
        },
    )


def _run_file(ctx: ToolContext, rel: str, task: Any, work: Path) -> Path:
    """The taskfile the run starts from: a copy with its generated id pinned when it has
    none, so the id can be reported."""
    if task.source.get("id"):
        return _taskfile(ctx, rel)
    import yaml

    run_file = work / f"{task.id}.yaml"
    document = {"id": task.id, **json.loads(json.dumps(dict(task.source), default=str))}
    write_private(run_file, yaml.safe_dump(document, sort_keys=False))
    return run_file


def _launch(task_id: str, run_file: Path, coder_dir: Path, claim: int, merge: bool) -> _Launch:
    """`coder run --autonomous` in the background, its output appended to the run's log, the
    claim handed to it (and its pid written in the claim's file)."""
    # -P: never import a `coder` or `mcp` package from the repository being worked on.
    cmd = [sys.executable, "-P", "-m", "coder", "run", "--autonomous", "-f", str(run_file)]
    if merge:
        cmd.append("--merge-on-success")
    log = coder_dir / "mcp" / f"{task_id}.log"
    fd = _open_log(log)
    with os.fdopen(fd, "ab") as out:
        offset = out.tell()
        out.write(f"--- {now_iso()} task_run: {' '.join(cmd[3:])}\n".encode())
        out.flush()
        process = subprocess.Popen(
            cmd,
            cwd=coder_dir.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(claim,),
        )
    os.pwrite(claim, f"{process.pid}\n".encode(), 0)
    return _Launch(process, log, merge, offset)


def _open_log(log: Path) -> int:
    """The run's log, opened to append (made 0600 if missing). Never written through: a link
    or a fifo there (shipped in `.coder/`, or planted) is replaced by a file of coder's own."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        with nofollow.at(log, create=True) as (dir_fd, name):
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dir_fd)
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise write_failed(log, exc) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped in since (a device): never written to
        os.close(fd)
        raise write_failed(log, NotRegular(log, file_kind(mode)))
    os.fchmod(fd, 0o600)
    return fd


def _claim(path: Path) -> int | None:
    """A descriptor holding the task's claim (`path`, emptied), or None when another holds
    it: a task_run starting the run, or the `coder run` it handed the claim to."""
    try:
        fd = nofollow.open_file(path, os.O_RDWR | os.O_CREAT, 0o600, create=True)
    except OSError as exc:
        raise write_failed(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)  # an earlier launch's pid
    return fd


def _claimant(path: Path, timeout: float = 2.0) -> int | None:
    """The pid of the `coder run` holding the claim at `path`, written by the task_run that
    started it just after it did (None if it has not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = nofollow.read_bytes(path).decode("ascii", errors="replace").strip()
        except OSError:
            text = ""
        if text.isdigit() or time.monotonic() >= deadline:
            return int(text) if text.isdigit() else None
        time.sleep(0.02)


def _starting_elsewhere(coder_dir: Path, task_id: str) -> bool:
    """Whether the `coder run` another server's task_run started holds the task's claim (it
    has not made its state yet)."""
    claim = coder_dir / "mcp" / f"{check_task_id(task_id)}.lock"
    pid = _claimant(claim, timeout=0)
    return pid is not None and processes_holding(claim, among=[pid]) == [pid]


def _already_running(task_id: str, pid: int | None) -> ToolResult:
    who = f" (pid {pid})" if pid else ""
    return ToolResult.error(
        f"run {task_id} is already running{who}; this call started nothing",
        hint=f"follow it with task_status(id={task_id!r}), or stop it with task_stop",
        data={"task_id": task_id, "status": "running", "pid": pid},
    )


def task_status(ctx: ToolContext, args: IdArgs) -> ToolResult:
    task_id = args["id"]
    _repo_obj, coder_dir = _repo(ctx)
    with _lock:
        launch = _launched.get(task_id)
    alive = launch is not None and launch.process.poll() is None
    try:
        state = StateStore(coder_dir).load(task_id)
        manifest = manifests.load_manifest(coder_dir, task_id)  # written before the state: there
    except UnknownTask:
        if alive or _starting_elsewhere(coder_dir, task_id):
            return ToolResult(
                ok=True,
                content=f"run {task_id}: starting",
                data={"task_id": task_id, "status": "starting", "steps": []},
            )
        if launch is not None:
            raise _not_started(task_id, launch) from None
        raise
    # The runner holds the lock while it runs; our own child may still be merging after it.
    running = alive or read_lock_owner(coder_dir, task_id) is not None
    status = "running" if running else state.status
    kinds = {s.id: s.kind for s in manifest.task.steps}
    steps = [
        {
            "id": sid,
            "kind": kinds.get(sid),
            "status": st.status,
            "attempts": st.attempts,
            "commit": st.commit,
            "error": st.error,
        }
        for sid, st in state.steps.items()
    ]
    done = sum(1 for st in state.steps.values() if st.status in DONE)
    lines = [
        f"run {task_id}: {status} ({done}/{len(steps)} steps done) on branch "
        f"{manifest.branch}" + (f"; error: {state.error}" if state.error else "")
    ]
    lines += [
        f"  {sid}  {kinds.get(sid)}  {st.status}"
        + (f"  commit {st.commit[:8]}" if st.commit else "")
        + (f"  ({st.error})" if st.error else "")
        for sid, st in state.steps.items()
    ]
    merge = state.merge
    extra: dict[str, str] = {}
    if merge and merge.get("commit"):
        lines.append(f"merged into {merge.get('base')} as {str(merge['commit'])[:8]}")
    elif launch is not None and launch.merge and not alive and status == "success":
        extra["merge_error"] = _log_line(launch, "Not merged: ") or "not merged"
        lines.append(extra["merge_error"])
    return ToolResult(
        ok=True,
        content="\n".join(lines),
        data={
            "task_id": task_id,
            "title": manifest.task.title,
            "status": status,
            "branch": manifest.branch,
            "base": manifest.base,
            "error": state.error,
            "merge": merge,
            "steps": steps,
            **extra,
        },
    )


def task_stop(ctx: ToolContext, args: IdArgs) -> ToolResult:
    task_id = args["id"]
    _repo_obj, coder_dir = _repo(ctx)
    stopped = stop_run(task_id, cwd=coder_dir.parent)
    pid = stopped.pid
    with _lock:
        launch = _launched.get(task_id)
    if launch is not None:  # reap our child, so it does not linger as a zombie
        try:
            launch.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return ToolResult(
        ok=True,
        content=f"{'killed' if stopped.forced else 'stopped'} run {task_id} (pid {pid}); "
        f"continue it with `coder resume -t {task_id}`",
        data={"task_id": task_id, "pid": pid, "forced": stopped.forced},
    )


def _log_line(launch: _Launch, prefix: str) -> str | None:
    """The last line of the run's output starting with `prefix`, with its hint line."""
    lines = _launch_output(launch).splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(prefix):
            hint = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return lines[i] + (f" ({hint})" if hint.startswith("hint: ") else "")
    return None


def _launch_output(launch: _Launch) -> str:
    """What this launch's `coder run` printed: the log from where it started."""
    try:
        data = nofollow.read_bytes(launch.log)
    except OSError:
        return ""
    return data[launch.offset :].decode("utf-8", errors="replace")


def _not_started(task_id: str, launch: _Launch) -> CoderError:
    """The error `coder run` printed (its `coder: error:` and `hint:` lines)."""
    text = _launch_output(launch)
    message = hint = None
    for line in text.splitlines():
        if line.startswith("coder: error: "):
            message = line[len("coder: error: ") :]
        elif line.strip().startswith("hint: ") and message is not None and hint is None:
            hint = line.strip()[len("hint: ") :]
    code = launch.process.poll()
    if message is None:
        tail = " | ".join(text.strip().splitlines()[-3:])
        message = f"`coder run` exited with code {code}" + (f": {tail}" if tail else "")
    return RunNotStarted(
        f"run {task_id} did not start: {message}", hint=hint or f"see {launch.log}"
    )


# --------------------------------------------------------------------------- tools

_ID = prop("string", "The run's task id (as returned by task_run or shown by `coder status`).")
_PATH = prop("string", "Taskfile path, relative to the repository root (e.g. tasks/feature.yaml).")

TASK_TOOLS = (
    Tool(
        name="task_validate",
        description=(
            "Check a coder taskfile (YAML) like `coder validate`: every problem at "
            "once, each as FILE:LINE:COL: message."
        ),
        parameters=params({"path": _PATH}, required=["path"]),
        handler=task_validate,
        read_only=True,
    ),
    Tool(
        name="task_run",
        description=(
            "Start `coder run --autonomous` on a taskfile in the background: the "
            "steps run on their own agent/ branch and worktree (the checkout is not "
            "touched), one commit per step. Returns the run's task id at once; "
            "follow it with task_status."
        ),
        parameters=params(
            {
                "path": _PATH,
                "merge_on_success": prop(
                    "boolean",
                    "Squash-merge the branch into its base when the run is green (default false).",
                ),
            },
            required=["path"],
        ),
        handler=task_run,
        read_only=False,
    ),
    Tool(
        name="task_status",
        description=(
            "The state of a run: its status (starting, running, success, failed, "
            "interrupted), and each step's status, attempts and commit."
        ),
        parameters=params({"id": _ID}, required=["id"]),
        handler=task_status,
        read_only=True,
    ),
    Tool(
        name="task_stop",
        description=(
            "Stop a running run gracefully (the current step is checkpointed); "
            "continue it later with `coder resume -t ID`."
        ),
        parameters=params({"id": _ID}, required=["id"]),
        handler=task_stop,
        read_only=False,
    ),
)
