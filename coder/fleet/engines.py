"""Where a run's workers run (`Engine`): each job becomes a `coder worker` somewhere, whose
WorkerResult comes back as a future. coder schedules nothing of its own beyond a level's
batch: the engine (a local pool, Ray, a CI system) runs the workers.

    local   a thread pool here, each thread waiting on one `coder worker` process (its own
            clone of the remote: no working directory is shared)
    pushed  runs nothing: takes what workers elsewhere already pushed (an exported CI
            workflow's last job); a step nobody pushed has failed
    ray     one Ray task per job (coder.fleet.ray_engine; `pip install 'coder[ray]'`)
"""

from __future__ import annotations

import importlib
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from coder.errors import CoderError, InvalidInput
from coder.fleet.jobs import WorkerJob, WorkerResult, run_worker_process
from coder.fleet.refs import step_ref
from coder.git import remotes

ENGINES = ("local", "ray", "pushed")


class Engine(Protocol):
    name: str

    def submit(self, job: WorkerJob) -> Future[WorkerResult]: ...

    def close(self) -> None: ...


class LocalEngine:
    """`workers` workers at once on this machine, each a `coder worker` process."""

    name = "local"

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="worker")

    def submit(self, job: WorkerJob) -> Future[WorkerResult]:
        return self.pool.submit(run_worker_process, job)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class PushedEngine:
    """Runs nothing: a step's result is the commit a worker elsewhere pushed to its ref."""

    name = "pushed"

    def submit(self, job: WorkerJob) -> Future[WorkerResult]:
        done: Future[WorkerResult] = Future()
        ref = step_ref(job.run_id, job.step_id)
        try:
            there = remotes.remote_ref(Path(tempfile.gettempdir()), job.remote, ref)
        except CoderError as exc:
            done.set_result(WorkerResult(job.step_id, "error", None, error=exc.message))
            return done
        if there is None:
            result = WorkerResult(
                job.step_id, "failed", None, error=f"no worker pushed step {job.step_id} ({ref})"
            )
        else:
            result = WorkerResult(job.step_id, "taken", there)
        done.set_result(result)
        return done

    def close(self) -> None:
        pass


def engine_for(name: str, *, workers: int, address: str | None) -> Engine:
    """The engine called `name` (local | ray | pushed)."""
    if name == "local":
        return LocalEngine(workers)
    if name == "pushed":
        return PushedEngine()
    if name == "ray":
        try:  # only here: ray is an optional extra
            module = importlib.import_module("coder.fleet.ray_engine")
        except ImportError as exc:
            raise InvalidInput(
                f"--executor ray needs Ray: {exc}", hint="pip install 'coder[ray]'"
            ) from None
        engine: Engine = module.RayEngine(workers=workers, address=address)
        return engine
    raise InvalidInput(f"unknown executor {name!r}", hint=f"one of: {', '.join(ENGINES)}")
