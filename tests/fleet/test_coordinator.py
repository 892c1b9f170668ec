"""`coder run --executor local|pushed`: a run's steps each run by a `coder worker` in its own
clone of a real bare remote, landed on the run's branch by the coordinator; the merged tree
equals the same taskfile run locally, whatever was killed on the way (checked with git)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder.errors import EXIT_ENVIRONMENT
from tests.conftest import git
from tests.fleet.common import BRANCH, STEPS, TASK_ID, TASKFILE, remote_refs, with_remote, worker
from tests.helpers import coder_cli, taskfile

FLEET = ("--autonomous", "--executor", "local", "--remote", "origin", "--workers", "2")


def tree(repo: Path) -> str:
    return git(repo, "rev-parse", f"{BRANCH}^{{tree}}").strip()


def step_commits(repo: Path) -> list[str]:
    """The Coder-Step trailer of each commit on the run's branch past main, oldest first."""
    out = git(
        repo, "log", "--reverse", "--format=%(trailers:key=Coder-Step,valueonly)", f"main..{BRANCH}"
    )
    return [line.strip() for line in out.splitlines() if line.strip()]


@pytest.fixture
def local_tree(make_repo) -> str:
    """The tree of the taskfile run here, the ordinary way (no --executor)."""
    here = make_repo(name="here")
    path = taskfile(here, TASKFILE, name="here.yaml")
    proc = coder_cli(here, "run", str(path), "--autonomous")
    assert proc.returncode == 0, proc.stderr
    return tree(here)


def test_a_run_on_local_workers_equals_the_local_run(repo: Path, local_tree: str) -> None:
    path, url, bare = with_remote(repo)
    proc = coder_cli(repo, "run", str(path), *FLEET)
    assert proc.returncode == 0, proc.stderr
    assert tree(repo) == local_tree
    assert step_commits(repo) == list(STEPS)  # each step once, in the DAG's order
    assert set(remote_refs(bare)) == {f"refs/coder/{TASK_ID}/base"} | {
        f"refs/coder/{TASK_ID}/steps/{s}" for s in STEPS
    }
    for command in (["status", "--json"], ["show", "-t", TASK_ID], ["report", "-t", TASK_ID]):
        shown = coder_cli(repo, *command)
        assert shown.returncode == 0, (command, shown.stderr)
    state = json.loads(coder_cli(repo, "show", "-t", TASK_ID, "--json").stdout)
    assert state["status"] == "success"


def test_each_worker_has_its_own_clone(repo: Path) -> None:
    """Two steps of one level at once, each writing where it ran: two directories, neither
    the run's worktree nor the user's checkout."""
    text = (
        f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: where\ngraph:\n"
        '  - {id: a, kind: shell, goal: where, cmd: "pwd > a.where", depends_on: []}\n'
        '  - {id: b, kind: shell, goal: where, cmd: "pwd > b.where", depends_on: []}\n'
    )
    path, url, bare = with_remote(repo, text)
    proc = coder_cli(repo, "run", str(path), *FLEET)
    assert proc.returncode == 0, proc.stderr
    dirs = {git(repo, "show", f"{BRANCH}:{s}.where").strip() for s in ("a", "b")}
    assert len(dirs) == 2
    worktree = repo / ".coder" / "worktrees" / TASK_ID
    assert not {str(repo), str(worktree)} & dirs


@pytest.mark.parametrize(
    "crash", ["before_step@d", "after_commit@b", "checkpoint#4", "before_finish"]
)
def test_a_killed_coordinator_resumes_to_the_same_tree(
    repo: Path, local_tree: str, crash: str
) -> None:
    path, url, bare = with_remote(repo)
    proc = coder_cli(repo, "run", str(path), *FLEET, crash=crash)
    assert proc.returncode == -9, proc.stderr
    again = coder_cli(repo, "resume", "-t", TASK_ID)
    assert again.returncode == 0, again.stderr
    assert tree(repo) == local_tree
    assert step_commits(repo) == list(STEPS)


@pytest.mark.parametrize("point", ["before_step@e", "worker_before_push@c"])
def test_a_killed_worker_is_run_again_on_resume(
    repo: Path, local_tree: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, url, bare = with_remote(repo)
    monkeypatch.setenv("CODER_WORKER_CRASH_AT", point)
    proc = coder_cli(repo, "run", str(path), *FLEET)
    assert proc.returncode == EXIT_ENVIRONMENT, proc.stderr
    step = point.split("@")[1]
    assert f"refs/coder/{TASK_ID}/steps/{step}" not in remote_refs(bare)
    monkeypatch.delenv("CODER_WORKER_CRASH_AT")
    again = coder_cli(repo, "resume", "-t", TASK_ID)
    assert again.returncode == 0, again.stderr
    assert tree(repo) == local_tree
    assert step_commits(repo) == list(STEPS)


def test_the_pushed_executor_takes_what_workers_pushed(repo: Path, local_tree: str) -> None:
    """An exported CI workflow's way: a job per step runs `coder worker` (in the DAG's order),
    the last job `coder run --executor pushed`."""
    path, url, bare = with_remote(repo)
    for step in STEPS:
        proc = worker(repo, step, path, url)
        assert proc.returncode == 0, (step, proc.stderr)
    refs = remote_refs(bare)
    proc = coder_cli(
        repo, "run", str(path), "--autonomous", "--executor", "pushed", "--remote", url
    )
    assert proc.returncode == 0, proc.stderr
    assert tree(repo) == local_tree
    assert step_commits(repo) == list(STEPS)
    after = remote_refs(bare)  # the steps' refs as the workers left them, and the base
    assert after == {**refs, f"refs/coder/{TASK_ID}/base": after[f"refs/coder/{TASK_ID}/base"]}


def test_the_pushed_executor_fails_a_step_nobody_pushed(repo: Path) -> None:
    path, url, bare = with_remote(repo)
    assert worker(repo, "a", path, url).returncode == 0
    proc = coder_cli(
        repo, "run", str(path), "--autonomous", "--executor", "pushed", "--remote", "origin"
    )
    assert proc.returncode == 1
    assert "no worker pushed step b" in proc.stdout + proc.stderr


MODEL_TASKFILE = f"""\
id: {TASK_ID}
branch: {BRANCH}
title: with a model
graph:
  - {{id: a, kind: shell, goal: write a, cmd: "echo a > a.txt", depends_on: []}}
  - {{id: b, kind: edit, goal: Write b.txt, depends_on: []}}
  - {{id: c, kind: shell, goal: join, cmd: "cat a.txt b.txt > c.txt", depends_on: [a, b]}}
"""


def test_a_model_step_runs_on_a_worker(make_repo, fake) -> None:  # type: ignore[no-untyped-def]
    """A model step's worker asks the model server its own config names (here the fake
    Ollama server, through OLLAMA_HOST); the tree equals the local run's."""
    from tests.run.test_parallel_levels import answers

    fake.answer = answers()
    here = make_repo(name="here")
    proc = coder_cli(here, "run", str(taskfile(here, MODEL_TASKFILE, "here.yaml")), "--autonomous")
    assert proc.returncode == 0, proc.stderr
    repo = make_repo(name="repo")
    path, url, bare = with_remote(repo, MODEL_TASKFILE)
    proc = coder_cli(repo, "run", str(path), *FLEET)
    assert proc.returncode == 0, proc.stderr
    assert tree(repo) == tree(here)
    assert git(repo, "show", f"{BRANCH}:c.txt") == "a\nb\n"
    assert step_commits(repo) == ["a", "b", "c"]
    shown = json.loads(coder_cli(repo, "show", "-t", TASK_ID, "--json").stdout)
    assert shown["status"] == "success"
    # what the worker's model cost and what its step said come back with its result
    local = json.loads(coder_cli(here, "show", "-t", TASK_ID, "--json").stdout)
    assert shown["steps"]["b"]["usage"]["prompt_tokens"] > 0
    ours, theirs = shown["steps"]["b"]["usage"], local["steps"]["b"]["usage"]
    assert (ours["calls"], ours["eval_tokens"]) == (theirs["calls"], theirs["eval_tokens"])
    assert shown["steps"]["b"]["summary"] == local["steps"]["b"]["summary"]


def test_a_step_commit_off_its_start_is_not_landed(repo: Path) -> None:
    """The coordinator checks the start rule: a commit of step b made on the base, not on
    the base with a's commit (b depends on a), fails b and lands nothing of it."""
    text = (
        f"id: {TASK_ID}\nbranch: {BRANCH}\ntitle: t\ngraph:\n"
        '  - {id: a, kind: shell, goal: write a, cmd: "echo a > a.txt", depends_on: []}\n'
        '  - {id: b, kind: shell, goal: write b, cmd: "echo b > b.txt", depends_on: [a]}\n'
    )
    path, url, bare = with_remote(repo, text)
    assert worker(repo, "a", path, url).returncode == 0
    (repo / "b.txt").write_text("b\n")
    git(repo, "add", "b.txt")
    tree_b = git(repo, "write-tree").strip()
    git(repo, "reset", "-q", "--hard")
    message = f"b: write b\n\nCoder-Task: {TASK_ID}\nCoder-Step: b\nCoder-Attempt: 1\n"
    off = git(repo, "commit-tree", tree_b, "-p", "main", "-m", message).strip()
    git(repo, "push", "-q", "origin", f"{off}:refs/coder/{TASK_ID}/steps/b")
    proc = coder_cli(
        repo, "run", str(path), "--autonomous", "--executor", "pushed", "--remote", "origin"
    )
    assert proc.returncode == 1, proc.stderr
    assert "does not start where step b starts" in proc.stdout + proc.stderr
    assert step_commits(repo) == ["a"]
