"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from coder.policy import kernel
from coder.schemas import validator
from tests.conftest import git
from tests.fake_ollama import FakeOllama, Reply
from tests.prefix_cache import is_priming

ROOT = Path(__file__).resolve().parent.parent  # the repository: fixtures/, tasks/, README.md
_T = TypeVar("_T")
_R = TypeVar("_R")


def visible_to_commands(*paths: Path) -> None:
    """List `paths` in the user's config under `visible_paths`, as a user does for what their
    steps must read outside the worktree (here: the flag files a test drives a step with)."""
    import json

    from coder.config import user_config_path

    config = user_config_path()
    data = json.loads(config.read_text()) if config.exists() else {}
    data["visible_paths"] = [*data.get("visible_paths", []), *map(str, paths)]
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(data))


# Starts coder with the stop signals set as the test says, then runs it in its place.
_LAUNCH = """\
import os, signal, sys
ignored = {int(n) for n in sys.argv[1].split(",") if n}
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
os.execv(sys.executable, [sys.executable, "-m", "coder", *sys.argv[2:]])
"""


def coder_argv(*args: str, ignoring: Sequence[int] = ()) -> list[str]:
    """`python -m coder ARGS` started as from a terminal: SIGINT, SIGTERM and SIGHUP at their
    defaults whatever this process ignores (a suite under `nohup`, or started in the
    background by a script, passes its ignored signals on, and coder honours an ignored
    hang-up: coder.interrupts), or with `ignoring` ignored, as nohup (SIGHUP) or a shell
    without job control (SIGINT, for a background command) starts it."""
    return [sys.executable, "-c", _LAUNCH, ",".join(map(str, ignoring)), *args]


def coder_cli(
    repo: Path, *args: str, crash: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m coder ARGS` in `repo`, to its end (the real CLI in a subprocess: a crash
    hook kills it, not the tests); `crash` names the test-only crash point (coder.crashpoints),
    none of the suite's own passed on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_CRASH")}
    if crash:
        env["CODER_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "coder", *args],
        cwd=repo,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def level_worktrees(repo: Path, count: int = 2) -> tuple[str, list[Path]]:
    """`count` linked worktrees of `repo` detached at its HEAD, as the steps of a parallel level
    work: (that commit, the worktrees)."""
    tip = git(repo, "rev-parse", "HEAD").strip()
    trees = [repo.parent / f"wt{i}" for i in range(1, count + 1)]
    for tree in trees:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), "HEAD")
    return tip, trees


def at_once(call: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """`call` on each item in its own thread, all released together: the results in order."""
    start = threading.Barrier(len(items))

    def released(item: _T) -> _R:
        start.wait()
        return call(item)

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(released, items))


def refused_outside() -> tuple[str, ...]:
    """How a write to a path outside a command's worktree may fail here: denied (`denied`),
    or, in the command's view (coder.policy.view), no such path at all."""

    absent = ("No such file or directory",) if kernel.support().view_problem is None else ()
    return (denied(), *absent)


def denied() -> str:
    """How a write outside a command's sandbox fails here: EROFS where the read-only mount
    namespace refuses it first (coder.policy.mounts, as root), else Landlock's EACCES."""

    found = kernel.support()
    return "Read-only file system" if found.mounts_problem is None else "Permission denied"


def stray_processes(argv: list[str]) -> list[int]:
    """Pids of live processes whose command line is exactly `argv`."""
    wanted = "\0".join(argv) + "\0"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_text()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if cmdline == wanted and state != "Z":
            found.append(int(proc.name))
    return found


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def coder_on_terminal(
    cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    """`coder ARGS` with its stdout a real pseudo-terminal (what it printed there is not kept:
    a test points GIT_PAGER at a file to see what was paged)."""
    primary, secondary = os.openpty()
    try:
        return subprocess.run(
            [sys.executable, "-m", "coder", *args],
            cwd=cwd, env=env, stdout=secondary, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
    finally:
        os.close(secondary)
        os.close(primary)


def taskfile(repo: Path, text: str, name: str = "task.yaml") -> Path:
    """Write a (dedented) taskfile beside the repository, so it is not part of the checkout."""
    path = repo.parent / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def state_of(repo: Path, task_id: str) -> dict[str, Any]:
    """A run's state as coder reads it (the snapshot and its journal), checked against its
    schema."""
    from coder.run.state import StateStore

    data = StateStore(repo / ".coder").load(task_id).to_dict()
    assert list(validator("state").iter_errors(data)) == []
    return data


def manifest_of(repo: Path, task_id: str) -> dict[str, Any]:
    """A run's manifest (what the run is: its task, branch, base, parent, ...) as stored."""
    data: dict[str, Any] = json.loads((repo / ".coder" / "tasks" / f"{task_id}.json").read_text())
    return data


def step_commits(repo: Path, branch: str) -> list[tuple[str, str, str]]:
    """(step id, attempt, subject) of each commit on the branch after main, oldest first."""
    out = git(
        repo,
        "log",
        "--reverse",
        "--format=%(trailers:key=Coder-Step,valueonly,separator=)"
        "|%(trailers:key=Coder-Attempt,valueonly,separator=)|%s",
        f"main..{branch}",
    )
    return [tuple(line.split("|", 2)) for line in out.splitlines()]  # type: ignore[misc]


def snapshot(repo: Path) -> dict[str, Any]:
    """Everything a user could notice about their own checkout."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in repo.rglob("*")
        if p.is_file() and ".git" not in p.parts and ".coder" not in p.parts
    }
    return {
        "files": files,
        "status": git(repo, "status", "--porcelain"),
        "head": git(repo, "symbolic-ref", "HEAD"),
        "index": git(repo, "diff", "--cached"),
        "main": git(repo, "rev-parse", "main"),
    }


def fingerprint(root: Path) -> dict[str, Any]:
    """Everything about a directory tree that a write, delete, chmod, chown, touch or setxattr
    changes: for each entry its type, mode, owner, mtime, extended attributes and content (a
    link: its target), never followed through a link. Compare one taken before with one taken
    after."""
    import hashlib
    import stat

    found: dict[str, Any] = {}
    for entry in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(entry)
        rel = entry.relative_to(root).as_posix()
        if stat.S_ISLNK(st.st_mode):
            found[rel] = ("link", os.readlink(entry))
            continue
        what = hashlib.sha256(entry.read_bytes()).hexdigest() if entry.is_file() else "dir"
        found[rel] = (what, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, xattrs(entry))
    return found


def xattrs(path: Path) -> dict[str, bytes]:
    """The extended attributes of `path` (none where the filesystem has none)."""
    try:
        return {name: os.getxattr(path, name) for name in sorted(os.listxattr(path))}
    except OSError:  # ENOTSUP
        return {}


def call(name: str, **arguments: Any) -> Reply:
    """A scripted model turn that calls one tool."""
    return Reply(tool_calls=[{"name": name, "arguments": arguments}])


def done(summary: str, *files: str, **extra: Any) -> Reply:
    """A scripted model turn that ends the step."""
    return call("step_complete", summary=summary, files_changed=list(files), **extra)


def chat_requests(fake: FakeOllama) -> list[dict[str, Any]]:
    """The chat requests the fake server received: the warm-up load (no messages) and the
    warm prefix (no user message) left out."""
    return [b for b in fake.chat_bodies() if b.get("messages") and not is_priming(b)]


def quoting_summaries(pattern: str) -> Callable[[dict[str, Any]], Reply | None]:
    """A `FakeOllama.answer` for summary requests (coder.agent.summarize): the text matching
    `pattern` in the turns being summarised, quoted, as a model that follows the summary
    prompt would keep it (None for any other request: the script answers it)."""
    from coder.agent import summarize

    def answer(body: dict[str, Any]) -> Reply | None:
        messages = body["messages"]
        if messages[-1].get("content") != summarize.PROMPT:
            return None
        turns = [m for m in messages[1:-1] if not summarize.is_summary(m)]  # kept as they are
        text = "\n".join(str(m.get("content") or "") for m in turns)
        return Reply(content="Found so far:\n" + "\n".join(re.findall(pattern, text)))

    return answer


# --- a grammar check of the Mermaid flowchart subset coder writes (coder.taskfile.diagram) ---------

MERMAID_KEYWORDS = {
    "end",
    "graph",
    "flowchart",
    "subgraph",
    "class",
    "classDef",
    "click",
    "style",
    "linkStyle",
    "direction",
    "default",
}
ID = r"[A-Za-z_][A-Za-z0-9_]*"
NODE = re.compile(rf'    (?P<id>{ID})\["(?P<label>[^"\n]*)"\]')
EDGE = re.compile(rf"    (?P<a>{ID}) --> (?P<b>{ID})")
CLASSDEF = re.compile(
    r"    classDef (?P<name>\w+) fill:#[0-9a-f]{6},stroke:#[0-9a-f]{6},color:#[0-9a-f]{6}"
)
CLASS = re.compile(rf"    class (?P<ids>{ID}(?:,{ID})*) (?P<name>\w+)")
ENTITY = re.compile(r"#(?:\d+|[a-z]+);")


def check_mermaid(text: str) -> dict[str, str]:
    """Parse `text` as the flowchart subset coder writes; returns {node id: label}. Raises
    AssertionError naming the line that does not fit."""
    lines = text.split("\n")
    assert lines[0] == "flowchart TD" and lines[-1] == "", "must start with `flowchart TD`"
    nodes: dict[str, str] = {}
    classes: set[str] = set()
    for number, line in enumerate(lines[1:-1], 2):
        where = f"line {number}: {line!r}"
        if m := NODE.fullmatch(line):
            assert m["id"] not in MERMAID_KEYWORDS and m["id"] not in nodes, where
            label = m["label"]
            bare = ENTITY.sub("", label.replace("<br/>", ""))
            assert not set(bare) & set('#<>&`"'), f"{where}: unescaped character in the label"
            nodes[m["id"]] = label
        elif m := EDGE.fullmatch(line):
            assert m["a"] in nodes and m["b"] in nodes, f"{where}: edge to an unknown node"
        elif m := CLASSDEF.fullmatch(line):
            classes.add(m["name"])
        elif m := CLASS.fullmatch(line):
            assert m["name"] in classes, f"{where}: class without classDef"
            assert set(m["ids"].split(",")) <= set(nodes), f"{where}: unknown node"
        else:
            raise AssertionError(f"{where}: not a flowchart statement")
    return nodes


# --- coder on a pseudo-terminal ---------------------------------------------------------


class Terminal:
    """`coder` on a real pseudo-terminal (120x30; TERM=xterm-256color unless `env` says
    otherwise): type answers, read what it prints. With `session`, coder leads a session of
    its own whose controlling terminal this is (`setsid -c`), as a login shell does: closing
    the terminal (`hang_up`) sends it SIGHUP, and its writes to the terminal fail from then
    on."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        *,
        session: bool = False,
    ) -> None:
        import fcntl
        import struct
        import termios

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        # not a process group leader, so setsid(1) calls setsid() and execs in its place
        lead = ["setsid", "--ctty"] if session else []
        self.proc = subprocess.Popen(
            [*lead, *coder_argv(*args)],
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "TERM": "xterm-256color",
                "COLUMNS": "120",
                "LINES": "30",
                **(env or {}),
            },
            close_fds=True,
        )
        os.close(slave)
        self.output = ""

    def read(self, timeout: float) -> str:
        """What arrives within `timeout` seconds."""
        got = ""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], remaining)
            if not ready:
                break
            try:
                chunk = os.read(self.master, 65536).decode(errors="replace")
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
        self.output += got
        return got

    def expect(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """Wait for `pattern` in what the screen shows (escape sequences left out)."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, plain(self.output))):
            assert time.monotonic() < deadline, f"did not see {pattern!r} in:\n{self.output!r}"
            self.read(0.1)
        return match

    def see(self, text: str, timeout: float = 30) -> None:
        """Wait for `text` as it is on the screen."""
        self.expect(re.escape(text), timeout)

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def hang_up(self) -> None:
        """Close the terminal, as closing its window or losing the ssh connection does."""
        os.close(self.master)

    def finish(self) -> int:
        while self.proc.poll() is None:
            self.read(0.1)
        self.read(0.2)
        os.close(self.master)
        return self.proc.wait(timeout=30)


def plain(text: str) -> str:
    """Terminal output without its escape sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
