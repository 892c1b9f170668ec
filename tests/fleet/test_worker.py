"""`coder worker`: one step run in a fresh clone, its commit pushed once to
refs/coder/RUN/steps/STEP on a real bare remote, checked with the git CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder.crashpoints import WORKER_POINTS
from coder.errors import EXIT_ENVIRONMENT, EXIT_FAILED
from coder.fleet.jobs import WorkerJob, run_worker_process
from coder.run.manifest import parse_task
from tests.conftest import git
from tests.fleet.common import TASK_ID, remote_refs, result, with_remote, worker
from tests.helpers import at_once, coder_cli

REF = f"refs/coder/{TASK_ID}/steps"


def trailers(bare: Path, rev: str) -> dict[str, str]:
    out = git(bare, "log", "-1", "--format=%(trailers:only,unfold)", rev)
    return dict(line.split(": ", 1) for line in out.splitlines() if line)


def test_a_worker_pushes_its_step_commit_on_its_start(repo: Path) -> None:
    path, url, bare = with_remote(repo)
    base = git(repo, "rev-parse", "main").strip()
    for step in ("a", "b"):
        proc = worker(repo, step, path, url)
        assert proc.returncode == 0, proc.stderr
        assert result(proc)["status"] == "pushed"
    refs = remote_refs(bare)
    assert set(refs) == {f"{REF}/a", f"{REF}/b"}
    # a step without dependencies starts at the base
    assert git(bare, "rev-parse", f"{REF}/a^").strip() == base
    assert trailers(bare, f"{REF}/a") == {
        "Coder-Task": TASK_ID,
        "Coder-Step": "a",
        "Coder-Attempt": "1",
    }
    proc = worker(repo, "d", path, url)
    assert proc.returncode == 0, proc.stderr
    done = result(proc)
    assert done["status"] == "pushed" and done["commit"] == remote_refs(bare)[f"{REF}/d"]
    # d's start: the base with a then b picked onto it (the start rule)
    start = f"{REF}/d^"
    assert git(bare, "log", "--format=%(trailers:key=Coder-Step,valueonly)", f"{base}..{start}")
    assert git(bare, "show", f"{start}:a.txt") == "a\n" and git(bare, "show", f"{start}:b.txt")
    assert git(bare, "rev-parse", f"{start}~2").strip() == base
    assert git(bare, "show", f"{REF}/d:d.txt") == "a\nb\n"
    assert git(bare, "diff", "--name-only", start, f"{REF}/d").split() == ["d.txt"]


def test_a_worker_given_another_run_id_commits_and_pushes_under_it(repo: Path) -> None:
    """`--run X` (an exported workflow's run, not the taskfile's id): the commit's trailers and
    the ref name X, so a coordinator of run X takes it."""
    path, url, bare = with_remote(repo)
    proc = worker(repo, "a", path, url, "--run", "other7")
    assert proc.returncode == 0, proc.stderr
    assert result(proc)["status"] == "pushed"
    assert set(remote_refs(bare)) == {"refs/coder/other7/steps/a"}
    assert trailers(bare, "refs/coder/other7/steps/a")["Coder-Task"] == "other7"


def test_a_worker_takes_a_remotes_name_or_a_relative_path(repo: Path) -> None:
    """`--remote origin` (a remote of the repository it runs in) and `--remote ../remote.git`
    (a path from here): the worker clones from a directory of its own, so it uses the URL and
    the absolute path."""
    path, _, bare = with_remote(repo)
    base = git(repo, "rev-parse", "main").strip()
    for step, remote in (("a", "origin"), ("b", "../remote.git")):
        args = ["worker", "--remote", remote, "--step", step, "--taskfile", str(path)]
        proc = coder_cli(repo, *args, "--base", base, "--json")
        assert proc.returncode == 0, proc.stderr
        assert result(proc)["status"] == "pushed"
    assert set(remote_refs(bare)) == {f"{REF}/a", f"{REF}/b"}


def test_the_same_step_is_taken_once(repo: Path) -> None:
    """Two workers of one step at once, whose commits differ (each writes its own pid): one
    pushes, the other is told `taken` and the ref stays the first one's; a third, later, is
    taken without running anything."""
    text = "id: fleet1\nbranch: agent/fleet1\ntitle: t\ngraph:\n"
    text += '  - {id: a, kind: shell, goal: write a pid, cmd: "echo $$ > a.txt"}\n'
    path, url, bare = with_remote(repo, text)
    procs = at_once(lambda _: worker(repo, "a", path, url), [1, 2])
    assert [p.returncode for p in procs] == [0, 0], [p.stderr for p in procs]
    assert sorted(result(p)["status"] for p in procs) == ["pushed", "taken"]
    ref = remote_refs(bare)[f"{REF}/a"]
    assert {result(p)["commit"] for p in procs} == {ref}
    later = worker(repo, "a", path, url)
    assert result(later) == {**result(later), "status": "taken", "commit": ref}
    assert remote_refs(bare)[f"{REF}/a"] == ref


@pytest.mark.parametrize("point", WORKER_POINTS)
def test_a_killed_worker_leaves_no_ref(repo: Path, tmp_path: Path, point: str) -> None:
    path, url, bare = with_remote(repo)
    proc = worker(repo, "a", path, url, "--workdir", str(tmp_path / "w1"), crash=f"{point}@a")
    assert proc.returncode == -9, proc.stderr
    assert remote_refs(bare) == {}
    again = worker(repo, "a", path, url)  # the step is still there to run
    assert again.returncode == 0 and result(again)["status"] == "pushed", again.stderr
    assert set(remote_refs(bare)) == {f"{REF}/a"}


def test_a_missing_dependency_is_an_error(repo: Path) -> None:
    path, url, bare = with_remote(repo)
    assert worker(repo, "a", path, url).returncode == 0
    proc = worker(repo, "d", path, url)
    assert proc.returncode == EXIT_ENVIRONMENT
    done = result(proc)
    assert done["status"] == "error"
    assert done["error"] == (f"step d needs step b, whose commit is not on the remote ({REF}/b)")
    assert set(remote_refs(bare)) == {f"{REF}/a"}


def test_a_failed_step_pushes_nothing(repo: Path) -> None:
    text = "id: fleet1\nbranch: agent/fleet1\ntitle: t\ngraph:\n"
    text += '  - {id: a, kind: shell, goal: fail, cmd: "echo x > x.txt && false"}\n'
    path, url, bare = with_remote(repo, text)
    proc = worker(repo, "a", path, url)
    assert proc.returncode == EXIT_FAILED
    assert result(proc)["status"] == "failed" and "exit" in result(proc)["error"]
    assert remote_refs(bare) == {}


def test_a_step_that_changes_nothing_pushes_an_empty_commit(repo: Path) -> None:
    text = "id: fleet1\nbranch: agent/fleet1\ntitle: t\ngraph:\n"
    text += '  - {id: a, kind: shell, goal: look, cmd: "true"}\n'
    path, url, bare = with_remote(repo, text)
    proc = worker(repo, "a", path, url)
    assert proc.returncode == 0, proc.stderr
    ref = f"{REF}/a"
    assert git(bare, "rev-parse", f"{ref}^{{tree}}") == git(bare, "rev-parse", "main^{tree}")
    assert trailers(bare, ref)["Coder-Step"] == "a"


def test_a_job_on_stdin(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's way: a WorkerJob on the child's stdin, its WorkerResult parsed."""
    path, url, bare = with_remote(repo)
    monkeypatch.chdir(repo)
    from coder import taskfile

    task = taskfile.load(path)
    base = git(repo, "rev-parse", "main").strip()
    job = WorkerJob(TASK_ID, "c", url, base, dict(task.to_dict()))
    assert WorkerJob.from_json(job.to_json()) == job
    assert parse_task(job.task).id == TASK_ID
    done = run_worker_process(job)
    assert done.status == "pushed", done.error
    assert done.commit == remote_refs(bare)[f"{REF}/c"] and done.attempts == 1


def test_a_jobs_secret_env_comes_from_the_workers_environment(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job carries the task as the manifest stores it: a secret env value is left out, and
    the worker takes it from its own environment (or refuses, naming it)."""
    from coder import taskfile
    from coder.redact import Redactor
    from coder.run.secrets import stored_task

    text = "id: fleet1\nbranch: agent/fleet1\ntitle: t\ngraph:\n"
    text += (
        '  - {id: a, kind: shell, goal: count, cmd: "printf %s \\"$API_TOKEN\\" | wc -c > n.txt",'
    )
    text += " env: {API_TOKEN: s3cret-value}}\n"
    path, url, bare = with_remote(repo, text)
    monkeypatch.chdir(repo)
    doc = dict(stored_task(taskfile.load(path).to_dict(), Redactor([])))
    assert "s3cret-value" not in str(doc)
    job = WorkerJob(TASK_ID, "a", url, git(repo, "rev-parse", "main").strip(), doc)
    monkeypatch.delenv("API_TOKEN", raising=False)
    refused = run_worker_process(job)
    assert refused.status == "error" and "API_TOKEN" in (refused.error or "")
    monkeypatch.setenv("API_TOKEN", "from-the-worker")
    done = run_worker_process(job)
    assert done.status == "pushed", done.error
    assert git(bare, "show", f"{REF}/a:n.txt").strip() == str(len("from-the-worker"))
