"""The Ray engine (`coder run --executor ray`): one Ray task per WorkerJob.

Each task runs `run_worker_process(job)` in a Ray worker process, so the worker itself is a
child of it (`coder worker`: its own clone, its own sandbox, its crash its own). Ray schedules
the tasks over the cluster's CPUs and retries a task whose Ray worker process died
(`MAX_RETRIES`); a step run twice that way is still taken once, because a step's ref on the
remote is pushed with compare-and-swap "must not exist" (coder.fleet.refs): the second
worker finds it `taken`.

Without an address the engine starts a local cluster of `workers` CPUs (as many worker
processes run tasks at once) and shuts it down on `close`; with one (`HOST:PORT`,
`ray://HOST:PORT`, `auto`) it joins that cluster, where coder must be installed on every node,
and leaves it running. `ray` is imported only here, and this module only when the ray
executor is chosen (coder.fleet.engines.engine_for).
"""

from __future__ import annotations

import signal
import socket
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

import ray

from coder.errors import EnvironmentProblem
from coder.fleet.jobs import WorkerJob, WorkerResult, run_worker_process
from coder.interrupts import STOP_SIGNALS

MAX_RETRIES = 3  # a Ray worker process killed mid-task: the task runs again, up to this
CONNECT_S = 5.0  # how long a cluster's address may take to answer a TCP connection


def _run_job(job: WorkerJob) -> WorkerResult:
    """The Ray task: one worker, as a child process of this Ray worker process."""
    return run_worker_process(job)


class RayEngine:
    """Jobs as Ray tasks, at most `workers` of them submitted at once."""

    name = "ray"

    def __init__(self, workers: int, address: str | None) -> None:
        self.workers = max(1, workers)
        if address is not None:
            _check_reachable(address)
        self._connect(address)
        self._task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_run_job)
        self._lock = threading.Lock()
        self._waiting: deque[tuple[WorkerJob, Future[WorkerResult]]] = deque()
        self._running = 0

    def _connect(self, address: str | None) -> None:
        # ray.init installs its own SIGTERM handler in the driver; coder's own handlers
        # (coder.interrupts: a stop signal stops the run) are put back.
        handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        try:
            if address is None:  # "local": a new cluster, never one found on this machine
                ray.init(
                    address="local",
                    num_cpus=self.workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # ray's errors share no base class (RayError, ConnectionError...)
            where = "a local Ray cluster" if address is None else f"the Ray cluster at {address}"
            raise EnvironmentProblem(
                f"cannot start or join {where}: {exc}",
                hint="check `ray status` there, or leave out --ray-address for a local cluster",
            ) from None
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    if handler is not None:
                        signal.signal(sig, handler)

    def submit(self, job: WorkerJob) -> Future[WorkerResult]:
        """The job's result, when its Ray task ends; a task Ray gave up on (its retries
        spent, the cluster gone) is an `error` result, never an exception."""
        done: Future[WorkerResult] = Future()
        with self._lock:
            if self._running >= self.workers:
                self._waiting.append((job, done))
                return done
            self._running += 1
        self._start(job, done)
        return done

    def _start(self, job: WorkerJob, done: Future[WorkerResult]) -> None:
        try:
            pending = self._task.remote(job).future()
        except Exception as exc:  # ray's errors are not one family
            self._finish(job, done, _failed(job, exc))
            return
        pending.add_done_callback(lambda f: self._finish(job, done, _outcome(job, f)))

    def _finish(self, job: WorkerJob, done: Future[WorkerResult], result: WorkerResult) -> None:
        done.set_result(result)
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            following = self._waiting.popleft()  # its slot is the one just freed
        self._start(*following)

    def close(self) -> None:
        """Shut down the cluster this engine started (one it joined keeps running); jobs not
        yet submitted to Ray end as errors."""
        with self._lock:
            left = list(self._waiting)
            self._waiting.clear()
        for job, done in left:
            done.set_result(WorkerResult(job.step_id, "error", None, error="engine closed"))
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """A HOST:PORT nobody listens on fails here, at once: ray.init would retry it for
    minutes. Other forms (`auto`, `ray://...`) are Ray's to resolve."""
    host, sep, port = address.rpartition(":")
    if not sep or "/" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot join the Ray cluster at {address}: {exc.strerror or exc}",
            hint="start it there (`ray start --head`) or fix --ray-address (the head's "
            "GCS address, HOST:PORT)",
        ) from None


def _outcome(job: WorkerJob, future: Future[Any]) -> WorkerResult:
    exc = future.exception()
    if exc is not None:
        return _failed(job, exc)
    result = future.result()
    if not isinstance(result, WorkerResult):
        return WorkerResult(job.step_id, "error", None, error=f"ray task returned {result!r}")
    return result


def _failed(job: WorkerJob, exc: BaseException) -> WorkerResult:
    said = str(exc).strip().splitlines()
    detail = said[0] if said else type(exc).__name__
    return WorkerResult(
        job.step_id,
        "error",
        None,
        error=f"ray task for step {job.step_id} failed ({type(exc).__name__}): {detail}",
    )
