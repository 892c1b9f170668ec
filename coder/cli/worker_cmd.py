"""`coder worker`: one step of a run on this machine, its commit pushed to the remote's
`refs/coder/RUN/steps/STEP` (coder.fleet.worker does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from coder import taskfile
from coder.cli.common import PathType, emit_json, json_option
from coder.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_OK, CoderError, InvalidInput
from coder.fleet.jobs import WorkerJob, WorkerResult
from coder.fleet.worker import run_worker
from coder.git import remotes, repository

WORKER_EPILOG = """\b
The worker clones the remote into a fresh directory (--workdir, else a temporary one it
removes), builds the step's start (the run's base with its dependencies' pushed commits
picked onto it), runs the step there as a one-step run (checks, fix cycles, budgets,
policy and sandbox as any run) and pushes its commit to refs/coder/RUN/steps/STEP, only if
no worker pushed that step before (compare-and-swap). It never touches the run's branch.

\b
Exit codes: 0 pushed, or taken (another worker pushed the step first), 1 the step failed
(nothing pushed), 2 bad options or job, 3 the remote, a dependency's ref or the machine.

\b
Examples:
  coder worker --job job.json --json
  coder worker --remote https://git.example/repo.git --step s2 \\
      --taskfile tasks/t.yaml --base 1a2b3c4d --run T-1
"""
EXIT_FOR = {"pushed": EXIT_OK, "taken": EXIT_OK, "failed": EXIT_FAILED, "error": EXIT_ENVIRONMENT}


@click.command(epilog=WORKER_EPILOG)
@click.option(
    "--remote",
    help="The remote's URL, a path, or a remote's name in this repository (a --job's own "
    "unless given).",
)
@click.option("--step", "step_id", help="The step to run (a --job's own unless given).")
@click.option("--job", "job_file", help="A WorkerJob as JSON: a file, or - for stdin.")
@click.option(
    "--taskfile",
    "taskfile_path",
    type=PathType(dir_okay=False, exists=True),
    help="The run's taskfile (instead of --job: an exported CI workflow's).",
)
@click.option("--base", help="With --taskfile: the run's base commit.")
@click.option("--run", "run_id", help="With --taskfile: the run's id (default: the task's id).")
@click.option(
    "--workdir",
    type=PathType(file_okay=False),
    help="Clone into DIR/repo and keep it (default: a temporary directory, removed).",
)
@json_option
def worker(
    remote: str | None,
    step_id: str | None,
    job_file: str | None,
    taskfile_path: Path | None,
    base: str | None,
    run_id: str | None,
    workdir: Path | None,
    as_json: bool,
) -> None:
    """Run one step of a run here and push its commit to the remote."""
    job = _job(remote, step_id, job_file, taskfile_path, base, run_id)
    result = run_worker(job, workdir=workdir)
    if as_json:
        emit_json(result.__dict__)
    else:
        click.echo(_line(job, result), err=result.status in ("failed", "error"))
    raise SystemExit(EXIT_FOR[result.status])


def _job(
    remote: str | None,
    step_id: str | None,
    job_file: str | None,
    taskfile_path: Path | None,
    base: str | None,
    run_id: str | None,
) -> WorkerJob:
    if (job_file is None) == (taskfile_path is None):
        raise InvalidInput("give the step's job: --job FILE (or -), or --taskfile PATH --base SHA")
    if job_file is not None:
        text = sys.stdin.read() if job_file == "-" else _read(Path(job_file))
        try:
            job = WorkerJob.from_json(text)
        except ValueError as exc:
            raise InvalidInput(f"--job {job_file}: {exc}") from None
        return WorkerJob(
            run_id=job.run_id,
            step_id=step_id or job.step_id,
            remote=_url(remote) if remote else job.remote,
            base=job.base,
            task=job.task,
        )
    missing = [f for f, v in (("--remote", remote), ("--step", step_id), ("--base", base)) if not v]
    if missing:
        raise InvalidInput(f"--taskfile needs {', '.join(missing)}")
    assert taskfile_path is not None and remote and step_id and base
    task = taskfile.load(taskfile_path)
    return WorkerJob(run_id or task.id, step_id, _url(remote), base, dict(task.to_dict()))


def _url(remote: str) -> str:
    """`--remote` as the worker's clone can use it from a directory of its own: a path made
    absolute (from here), a remote's name of the repository here its URL, else as given."""
    if "://" not in remote and Path(remote).exists():
        return str(Path(remote).resolve())
    try:
        repo = repository.open_repo(Path.cwd())
    except CoderError:
        return remote
    return remotes.url_of(repo, remote) if remote in remotes.remote_names(repo) else remote


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read --job {path}: {exc.strerror or exc}") from None


def _line(job: WorkerJob, result: WorkerResult) -> str:
    commit = (result.commit or "")[:12]
    if result.status == "pushed":
        return f"step {job.step_id} of run {job.run_id}: pushed {commit}"
    if result.status == "taken":
        return f"step {job.step_id} of run {job.run_id}: taken ({commit}, pushed by another worker)"
    return f"step {job.step_id} of run {job.run_id}: {result.status}: {result.error}"
