"""`coder worker`: one step of a run, anywhere the repository can be cloned.

The worker clones the remote into a fresh directory, fetches the run's refs, builds the step's
start by the start rule, runs the step there as a one-step coder run (the same task id, so its
commit's trailers name the run; fix cycles, checks, budgets, policy and sandbox as any run),
and pushes the commit to `refs/coder/RUN/steps/STEP`, once (coder.fleet.refs). It never
touches the run's branch. Killed before the push, it leaves nothing anyone would take.

Its start is the start rule's (coder.fleet.refs.start_of), which the coordinator checks.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from coder.crashpoints import crashpoint
from coder.errors import CoderError, EnvironmentProblem, InvalidInput
from coder.fleet import refs
from coder.fleet.jobs import WorkerJob, WorkerResult
from coder.git import branches, picks, remotes, repository
from coder.run.drive import RunOptions
from coder.run.manifest import parse_task
from coder.run.secrets import SECRET_ENV_MARKER, redacted
from coder.run.start import start_run

REMOTE = "origin"  # the clone's name for the remote it came from


def run_worker(job: WorkerJob, *, workdir: Path | None = None) -> WorkerResult:
    """Run `job` in `workdir` (kept) or a temporary directory (removed): its result. A problem
    of the machine, the remote or the refs is status `error`, never raised."""
    started = time.monotonic()
    place = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="coder-worker-"))
    try:
        return _work(job, place, started)
    except CoderError as exc:
        return _result(job, "error", None, started, error=exc.message)
    finally:
        if workdir is None:
            shutil.rmtree(place, ignore_errors=True)


def _work(job: WorkerJob, place: Path, started: float) -> WorkerResult:
    task = parse_task(job.task)
    task.step(job.step_id)  # InvalidInput naming the steps there are
    place.mkdir(parents=True, exist_ok=True)
    clone = place / "repo"
    if clone.exists():
        raise InvalidInput(f"{clone} exists: a worker clones into a fresh directory")
    remotes.clone(job.remote, clone)
    repo = repository.open_repo(clone)
    pushed = refs.fetch_run(clone, REMOTE, job.run_id)
    if job.step_id in pushed:  # another worker ran it: nothing of ours to push
        return _taken(job, repo, pushed[job.step_id], started)
    missing = [d for d in refs.start_rule(task, job.step_id) if d not in pushed]
    if missing:
        raise EnvironmentProblem(
            f"step {job.step_id} needs step {missing[0]}, whose commit is not on the remote "
            f"({refs.step_ref(job.run_id, missing[0])})",
            hint="run the workers of its dependencies first (the DAG's order)",
        )
    try:
        base = branches.resolve_commit(repo, job.base)
    except CoderError:
        raise EnvironmentProblem(
            f"the run's base commit {job.base[:12]} is not on the remote",
            hint=f"push it there (the coordinator pushes it as {refs.base_ref(job.run_id)})",
        ) from None
    start = refs.start_of(repo, base, task, job.step_id, pushed)
    start_branch = f"coder-worker/{job.run_id}/start"
    branches.point_branch(repo, start_branch, start)
    path = place / "task.json"  # outside the clone: not a change of the repository's
    path.write_text(json.dumps(_one_step(job, start_branch)), encoding="utf-8")
    options = RunOptions(approvals="none", default_approvals="none", max_parallel=1)
    run = start_run(path, cwd=clone, options=options)
    record = run.state.steps[job.step_id]
    if run.status != "success" or record.status != "success":
        status = "failed" if record.status in ("failed", "skipped") else "error"
        error = record.error or run.state.error or f"the step's run ended {run.status}"
        return _result(job, status, None, started, record=record, error=error)
    commit = record.commit or picks.empty_step_commit(
        repo,
        start,
        task_id=job.run_id,
        step_id=job.step_id,
        attempt=record.attempts,
        title=f"{job.step_id}: no changes",
    )
    crashpoint("worker_before_push", job.step_id)
    done = refs.push_step(clone, repo, REMOTE, job.run_id, job.step_id, commit)
    return _result(job, "taken" if done.taken else "pushed", done.commit, started, record=record)


def _one_step(job: WorkerJob, start_branch: str) -> dict[str, Any]:
    """The run's task document with step S alone, free of dependencies (its start holds
    their work), on a branch of the clone's own from the start; the run's id."""
    doc = {k: v for k, v in job.task.items() if k not in ("success", "created_at")}
    step = next(s for s in job.task["graph"] if s["id"] == job.step_id)
    step = {**step, "depends_on": [], **_own_secrets(step)}
    if redacted(json.dumps(step)):  # a command or goal the redactor cut: it cannot run as is
        raise InvalidInput(
            f"step {job.step_id} of the job holds a redacted secret in its command or goal",
            hint="run the worker with --taskfile (the job's task leaves secrets out), or put "
            "the secret in the step's env, which a worker takes from its own environment",
        )
    doc["graph"] = [step]
    doc["id"] = job.run_id  # the run's (`--run` may differ from the taskfile's): its trailers
    doc["base"] = start_branch
    doc["branch"] = f"agent/{job.run_id}--worker--{job.step_id}"
    return doc


def _own_secrets(step: dict[str, Any]) -> dict[str, Any]:
    """A step's `env` values the job left out as secret, from this machine's environment
    (InvalidInput naming the variable when it has none)."""
    env = step.get("env")
    if not env:
        return {}
    missing = [k for k, v in env.items() if v == SECRET_ENV_MARKER and k not in os.environ]
    if missing:
        raise InvalidInput(
            f"step {step['id']} needs the secret {missing[0]} in its env, which jobs leave "
            "out: this worker's environment has none",
            hint=f"set {missing[0]} in the worker's environment",
        )
    return {"env": {k: os.environ[k] if v == SECRET_ENV_MARKER else v for k, v in env.items()}}


def _taken(job: WorkerJob, repo: repository.Repo, commit: str, started: float) -> WorkerResult:
    if not refs.is_step_commit(repo, commit, job.run_id, job.step_id):
        raise EnvironmentProblem(
            f"{refs.step_ref(job.run_id, job.step_id)} holds {commit[:12]}, not a commit of "
            f"step {job.step_id} of run {job.run_id}"
        )
    return _result(job, "taken", commit, started)


def _result(
    job: WorkerJob,
    status: str,
    commit: str | None,
    started: float,
    *,
    record: Any = None,
    error: str | None = None,
) -> WorkerResult:
    return WorkerResult(
        job.step_id,
        status,
        commit,
        attempts=record.attempts if record is not None else 0,
        tokens=record.tokens if record is not None else 0,
        duration_s=round(time.monotonic() - started, 3),
        error=error,
        summary=record.summary if record is not None else None,
        usage=dict(record.usage.as_dict()) if record is not None and record.usage else None,
    )
