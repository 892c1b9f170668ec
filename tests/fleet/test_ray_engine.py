"""`coder run --executor ray` on a real local Ray cluster (2 CPUs: 2 Ray worker processes run
tasks at once, seen in /proc): each step a Ray task whose `coder worker` child clones a real
bare remote (file://) into a directory of its own and pushes the step's commit once; the
coordinator lands them. Checked with the git CLI: the merged tree equals the taskfile run
here, each step landed once, also after SIGKILL of a Ray worker process mid-step (Ray runs the
task again) and of the coordinator mid-run (then `coder resume`).

One cluster serves the module (`cluster`: a driver process of its own holds it, so it ends
with that process); its worker processes run coder with the module's HOME. The coordinators
join it with `--ray-address`, as they would join a cluster of many machines.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from coder.errors import EXIT_ENVIRONMENT  # noqa: E402
from coder.fleet.jobs import WorkerJob  # noqa: E402
from coder.fleet.ray_engine import RayEngine  # noqa: E402
from tests.conftest import GIT_ENV, git  # noqa: E402
from tests.helpers import coder_cli, wait_for  # noqa: E402

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
HOLD = """\
import sys, ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@dataclass(frozen=True)
class Cluster:
    address: str
    pid: int  # the driver process that holds it: its processes are below this one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local Ray cluster of 2 CPUs for the module. Its worker processes (and
    so the `coder worker`s) get a HOME of their own and git's identity; the drivers that
    join it (this process, a coordinator) its token (RAY_AUTH_MODE and RAY_AUTH_TOKEN, set in
    this process's environment for the module)."""
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
        yield Cluster(address, holder.pid)
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
def engine(cluster: Cluster) -> Iterator[RayEngine]:
    """This process joined to the module's cluster, as `--ray-address` does."""
    # ray read RAY_AUTH_* when it was imported, before `cluster` set them: Ray's own test
    # helper makes it read them again
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()
    joined = RayEngine(workers=2, address=cluster.address)
    yield joined
    joined.close()


def ray_workers(cluster: Cluster) -> list[int]:
    """The cluster's Ray worker processes running our Ray task now (another cluster, of
    another test process, is not ours)."""
    found = []
    for pid in descendants(cluster.pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if title == f"ray::{TASK_RAY}":
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = []
        try:
            threads = list(Path(f"/proc/{here}/task").iterdir())  # each thread's own children
        except OSError:  # it ended meanwhile
            continue
        for thread in threads:
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

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
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
            for pid in ray_workers(self.cluster):
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


def test_a_job_ray_runs_but_cannot_do_is_an_error_result(engine: RayEngine) -> None:
    """A worker whose remote does not exist ends with an error result, not an exception."""
    job = WorkerJob(TASK_ID, "a", "file:///nonexistent/remote.git", "0" * 40, {"id": TASK_ID})
    done = engine.submit(job).result(timeout=120)
    assert done.status == "error" and done.commit is None and done.error


# --------------------------------------------------------------------------- coder run --executor ray

BRANCH = f"agent/{TASK_ID}"
FILES = {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "a\nb\n", "e.txt": "c\n"}
FILES["f.txt"] = "a\nb\nc\n"


def ray_run(cluster: Cluster) -> list[str]:
    return [
        *("run", "-f", "task.yaml", "--autonomous", "--executor", "ray", "--workers", "2"),
        *("--remote", "origin", "--ray-address", cluster.address),
    ]


_STARTED: list[subprocess.Popen[str]] = []


def coordinator(repo: Path, *args: str) -> subprocess.Popen[str]:
    """`coder ARGS` in the background (the tests kill it; one a failed test left is killed
    after it, so its Ray tasks do not pass for the next test's)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "coder", *args],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_coordinator_left() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def started(repo: Path) -> bool:
    """This test's run exists (its manifest): a step running now is this run's."""
    return (repo / ".coder" / "tasks" / f"{TASK_ID}.json").is_file()


def with_origin(repo: Path) -> Path:
    """`repo` with a bare remote `origin` holding main, and the taskfile: the bare repo."""
    bare = repo.parent / "remote.git"
    git(repo.parent, "init", "-q", "--bare", str(bare))
    git(repo, "remote", "add", "origin", f"file://{bare}")
    git(repo, "push", "-q", "origin", "main")
    (repo / "task.yaml").write_text(TASKFILE)
    return bare


def expected_tree(repo: Path) -> str:
    """main's tree with the six steps' files: what the run makes, built by git alone."""
    env = {**os.environ, "GIT_INDEX_FILE": str(repo.parent / "expected.index")}
    subprocess.run(["git", "read-tree", "main"], cwd=repo, env=env, check=True)
    for name, text in FILES.items():
        blob = subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=repo,
            input=text,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info = f"100644,{blob},{name}"
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", info], cwd=repo, env=env)
    return subprocess.run(
        ["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def landed(repo: Path) -> tuple[str, list[str]]:
    """The run's branch: its tree, and the Coder-Step trailer of each commit past main."""
    out = git(
        repo, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}"
    )
    steps = [line.strip() for line in out.splitlines() if line.strip()]
    return git(repo, "rev-parse", f"{BRANCH}^{{tree}}").strip(), steps


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def test_the_taskfile_through_ray_equals_the_local_run(
    cluster: Cluster, make_repo, repo: Path
) -> None:
    """--executor ray --workers 2 against the module's cluster: the same tree as the taskfile
    run here, each step landed once in the DAG's order, each step ref on the remote."""
    here = make_repo(name="here")
    (here / "task.yaml").write_text(TASKFILE)
    code, said = finish(coordinator(here, "run", "-f", "task.yaml", "--autonomous"))
    assert code == 0, said
    local = landed(here)
    bare = with_origin(repo)
    with Watch(cluster) as watch:
        code, said = finish(coordinator(repo, *ray_run(cluster)))
    assert code == 0, said
    assert landed(repo) == local == (expected_tree(repo), list("abcdef"))
    refs = git(bare, "for-each-ref", "--format=%(refname)", f"{REF}/").split()
    assert refs == [f"{REF}/{s}" for s in "abcdef"]
    # every job clones into a directory of its own (tests/fleet/test_coordinator.py's
    # test_each_worker_has_its_own_clone shows it from the steps' own `pwd`); polling /proc
    # sees a clone only while a process works in it, so a quick step's may pass unseen
    assert len(watch.workers) >= 2 and len(watch.clones) >= 2, (watch.workers, watch.clones)


def victim(cluster: Cluster, step: str) -> int | None:
    """The Ray worker process whose worker runs `step`'s command now (its `sh -c` says)."""
    for pid in ray_workers(cluster):
        for kid in descendants(pid):
            try:
                argv = Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"echo {step} > {step}.txt".encode() in argv:
                return pid
    return None


@pytest.mark.slow
@pytest.mark.parametrize("step", ["a"])
def test_a_ray_worker_killed_mid_run(cluster: Cluster, repo: Path, step: str) -> None:
    """SIGKILL to the Ray worker process running `step`'s command, the coordinator running:
    Ray runs the task again, the run succeeds with the same tree, no step lost or doubled."""
    with_origin(repo)
    proc = coordinator(repo, *ray_run(cluster))
    found: list[int] = []
    wait_for(
        lambda: started(repo) and bool(found.append(victim(cluster, step) or 0) or found[-1]),
        90,
        f"{step} running",
    )
    os.kill(found[-1], signal.SIGKILL)
    code, said = finish(proc)
    assert code == 0, said
    assert landed(repo) == (expected_tree(repo), list("abcdef"))


# Killed after 3 landed, the coordinator is often landing the 4th: a kill inside its update
# of the run's branch leaves refs/heads/agent/ID.lock, which `coder resume` removes (no
# process has it open, and resume holds the task lock: tests/run/test_crash.py).


@pytest.mark.slow
@pytest.mark.parametrize("landed_before", [0, 3])
def test_the_coordinator_killed_mid_run_then_resumed(
    cluster: Cluster, repo: Path, landed_before: int
) -> None:
    """SIGKILL to `coder run --executor ray` once `landed_before` steps are on the branch
    (0: while the first level's commands run), then `coder resume`: the same tree, each step
    landed once (a step a worker pushed before the kill is taken from its ref)."""
    bare = with_origin(repo)
    proc = coordinator(repo, *ray_run(cluster))

    def ready() -> bool:
        if landed_before == 0:
            return started(repo) and (
                victim(cluster, "a") is not None or victim(cluster, "b") is not None
            )
        ok = (
            subprocess.run(
                ["git", "rev-parse", "-q", "--verify", BRANCH], cwd=repo, capture_output=True
            ).returncode
            == 0
        )
        return ok and len(landed(repo)[1]) >= landed_before

    wait_for(ready, 90, "the point to kill at")
    proc.kill()
    assert finish(proc)[0] == -signal.SIGKILL
    code, said = finish(coordinator(repo, "resume", "-t", TASK_ID))
    assert code == 0, said
    assert landed(repo) == (expected_tree(repo), list("abcdef"))
    refs = git(bare, "for-each-ref", "--format=%(refname)", f"{REF}/").split()
    assert refs == [f"{REF}/{s}" for s in "abcdef"]


def test_an_address_nobody_answers_is_an_environment_problem(repo: Path) -> None:
    """A --ray-address where no cluster listens: exit 3 naming it, at once (ray.init would
    retry it for minutes), and no run started."""
    with_origin(repo)
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    proc = coder_cli(repo, *ray_run(Cluster(address, 0)))
    assert proc.returncode == EXIT_ENVIRONMENT, proc.stderr
    assert f"cannot join the Ray cluster at {address}: Connection refused" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 60
    assert not (repo / ".coder" / "state" / f"{TASK_ID}.json").exists()
