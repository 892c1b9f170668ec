"""The Ray engine on a real local Ray cluster (2 CPUs, so 2 Ray worker processes run tasks at
once): each job a Ray task whose `coder worker` child clones a real bare remote (file://) and
pushes its step's commit once, checked with the git CLI; a Ray worker process killed with
SIGKILL mid-step is retried by Ray and the step is still pushed once.

One cluster serves the module (`cluster`: a driver process of its own holds it, so the cluster
ends with it even if pytest is killed); its worker processes run coder with the module's HOME.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from coder import taskfile  # noqa: E402
from coder.fleet.jobs import WorkerJob, WorkerResult  # noqa: E402
from coder.fleet.ray_engine import RayEngine  # noqa: E402
from tests.conftest import GIT_ENV, git  # noqa: E402

TASK_ID = "rayrun"
REF = f"refs/coder/{TASK_ID}/steps"
TASK_RAY = "_run_job"  # the Ray task's function: its worker process is titled ray::_run_job
PAUSE = 1.5  # each step's command sleeps this long first: the time to see (or kill) it
# Six steps, two parallel levels: [a, b, c], then [d, e], then f.
TASKFILE = f"""\
id: {TASK_ID}
branch: agent/{TASK_ID}
title: ray
graph:
  - {{id: a, kind: shell, goal: write a, cmd: "sleep {PAUSE} && echo a > a.txt", depends_on: []}}
  - {{id: b, kind: shell, goal: write b, cmd: "sleep {PAUSE} && echo b > b.txt", depends_on: []}}
  - {{id: c, kind: shell, goal: write c, cmd: "sleep {PAUSE} && echo c > c.txt", depends_on: []}}
  - {{id: d, kind: shell, goal: join, cmd: "cat a.txt b.txt > d.txt", depends_on: [a, b]}}
  - {{id: e, kind: shell, goal: copy c, cmd: "cat c.txt > e.txt", depends_on: [c]}}
  - {{id: f, kind: shell, goal: join, cmd: "cat d.txt e.txt > f.txt", depends_on: [d, e]}}
"""
CLONE = re.compile(r"^.*/coder-worker-[^/]+")  # a worker's temporary directory
LEVELS = (("a", "b", "c"), ("d", "e"), ("f",))
HOLD = """\
import sys, ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray cluster of 2 CPUs for the module: its address. Its worker processes (and
    so the `coder worker`s) get a HOME of their own and git's identity; the drivers that
    join it (this process, a coordinator) its token (RAY_AUTH_MODE and RAY_AUTH_TOKEN, set in this environment)."""
    home = tmp_path_factory.mktemp("rayhome")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {name: os.environ.get(name) for name in auth}
    os.environ.update(auth)
    (home / ".gitconfig").write_text("[user]\n\tname = Test User\n\temail = test@example.com\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OLLAMA", "CODER_"))}
    env.update(
        GIT_ENV,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        GIT_CONFIG_NOSYSTEM="1",
        **auth,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=home,
    )
    assert holder.stdout is not None and holder.stdin is not None
    address = holder.stdout.readline().strip()
    assert address, "the Ray cluster did not start"
    try:
        yield address
    finally:
        holder.stdin.close()
        holder.stdout.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def engine(cluster: str) -> Iterator[RayEngine]:
    """This process joined to the module's cluster, as `--ray-address` does."""
    # ray read RAY_AUTH_* when it was imported, before `cluster` set them: Ray's own test
    # helper makes it read them again
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()
    joined = RayEngine(workers=2, address=cluster)
    yield joined
    joined.close()


def with_remote(repo: Path) -> tuple[str, Path, dict[str, object]]:
    """`repo` with a bare remote holding main: (its file:// URL, the bare repo, the task)."""
    bare = repo.parent / "remote.git"
    git(repo.parent, "init", "-q", "--bare", str(bare))
    git(repo, "push", "-q", f"file://{bare}", "main")
    path = repo / "task.yaml"
    path.write_text(TASKFILE)
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        task = dict(taskfile.load(path).to_dict())
    finally:
        os.chdir(cwd)
    return f"file://{bare}", bare, task


def ray_workers() -> dict[int, int]:
    """Processes on this machine running our Ray task: Ray worker pid -> its parent."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
                status = (entry / "status").read_text()
            except OSError:
                continue
            if title == f"ray::{TASK_RAY}":
                found[int(entry.name)] = int(status.split("PPid:")[1].split()[0])
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = []
        for thread in Path(f"/proc/{here}/task").glob("*"):  # each thread's own children
            try:
                kids += (thread / "children").read_text().split()
            except OSError:
                continue
        found += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return found


class Watch:
    """Polls /proc while jobs run: which Ray worker processes ran a `coder worker`, and the
    clones (a worker's temporary directory) its processes worked in."""

    def __init__(self) -> None:
        self.workers: set[int] = set()
        self.clones: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            for pid in ray_workers():
                for kid in descendants(pid):
                    try:
                        argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
                        cwd = os.readlink(f"/proc/{kid}/cwd")
                    except OSError:
                        continue
                    if b"worker" in argv and b"coder" in argv:
                        self.workers.add(pid)
                    clone = CLONE.search(cwd)
                    if clone:
                        self.clones.add(clone.group(0))
            time.sleep(0.05)


def run_levels(engine: RayEngine, url: str, base: str, task: dict[str, object]) -> list[str]:
    """Every step through the engine, a level at a time: the statuses in step order."""
    statuses = []
    for level in LEVELS:
        jobs = [WorkerJob(TASK_ID, step, url, base, task) for step in level]
        results: list[WorkerResult] = [
            f.result(timeout=120) for f in [engine.submit(j) for j in jobs]
        ]
        for done in results:
            assert done.status in ("pushed", "taken"), done
        statuses += [r.status for r in results]
    return statuses


def step_log(bare: Path, step: str) -> list[str]:
    """The Coder-Step trailers of the commits on the step's ref since main (its own and its
    dependencies', as the start rule picked them)."""
    out = git(bare, "log", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{REF}/{step}")
    return [line for line in out.split() if line]


def test_each_step_is_a_ray_task_in_its_own_clone(engine: RayEngine, repo: Path) -> None:
    url, bare, task = with_remote(repo)
    base = git(repo, "rev-parse", "main").strip()
    with Watch() as watch:
        assert run_levels(engine, url, base, task) == ["pushed"] * 6
    refs = git(bare, "for-each-ref", "--format=%(refname)", "refs/coder/").split()
    assert refs == [f"{REF}/{s}" for s in "abcdef"]
    # f's commit sits on its start: the base and its five dependencies, one commit each
    assert sorted(step_log(bare, "f")) == list("abcdef")
    assert git(bare, "show", f"{REF}/f:f.txt") == "a\nb\nc\n"
    assert len(watch.workers) >= 2, watch.workers  # two Ray worker processes ran workers
    # each job's worker cloned into a directory of its own (no working directory shared)
    assert len(watch.clones) == 6, watch.clones


def test_a_killed_ray_worker_is_retried_and_its_step_pushed_once(
    engine: RayEngine, repo: Path
) -> None:
    """SIGKILL to the Ray worker process while its step's command runs: Ray runs the task
    again (its worker child died with it: nothing pushed by the first try), the step is
    pushed once."""
    url, bare, task = with_remote(repo)
    base = git(repo, "rev-parse", "main").strip()
    before = set(ray_workers())
    pending = engine.submit(WorkerJob(TASK_ID, "a", url, base, task))
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        for pid in set(ray_workers()) - before:  # ours: the others are idle or gone
            if any(_is_sleep(k) for k in descendants(pid)):
                victim = pid
        time.sleep(0.05)
    assert victim is not None, "the step's command never ran"
    os.kill(victim, signal.SIGKILL)
    done = pending.result(timeout=120)
    assert done.status in ("pushed", "taken"), done
    assert done.commit == git(bare, "rev-parse", f"{REF}/a").strip()
    assert step_log(bare, "a") == ["a"]
    assert git(bare, "for-each-ref", "--format=%(refname)", "refs/coder/").split() == [f"{REF}/a"]


def _is_sleep(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return Path(argv0.decode()).name == "sleep"


def test_a_job_ray_runs_but_cannot_do_is_an_error_result(engine: RayEngine) -> None:
    """A worker whose remote does not exist ends with an error result, not an exception."""
    job = WorkerJob(TASK_ID, "a", "file:///nonexistent/remote.git", "0" * 40, {"id": TASK_ID})
    done = engine.submit(job).result(timeout=120)
    assert done.status == "error" and done.commit is None and done.error
