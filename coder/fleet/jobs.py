"""What a coordinator sends a worker (`WorkerJob`) and gets back (`WorkerResult`), both JSON,
and one worker run as a child process (`run_worker_process`): every engine runs workers so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

STATUSES = ("pushed", "taken", "failed", "error")


@dataclass(frozen=True)
class WorkerJob:
    run_id: str
    step_id: str
    remote: str  # URL (file://, ssh, https) the worker clones and pushes to
    base: str  # the run's base commit (sha)
    task: dict[str, Any]  # the run's stored task document (the manifest's), already redacted

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        data = _object(text, "WorkerJob")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"a WorkerJob needs {', '.join(missing)}")
        if not isinstance(data["task"], dict):
            raise ValueError("a WorkerJob's task is an object (the run's task document)")
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class WorkerResult:
    step_id: str
    status: str  # pushed | taken | failed | error
    commit: str | None  # the step commit on refs/coder/RUN/steps/STEP (pushed or taken)
    attempts: int = 0
    tokens: int = 0
    duration_s: float = 0.0
    error: str | None = None
    summary: str | None = None  # what the step said it did (its record's)
    usage: dict[str, Any] | None = None  # its model usage in full (coder.models.usage)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerResult:
        data = _object(text, "WorkerResult")
        if data.get("status") not in STATUSES or not isinstance(data.get("step_id"), str):
            raise ValueError(f"not a WorkerResult: {text[:200]!r}")
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a {what} is a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a {what} is a JSON object, not {type(data).__name__}")
    return data


def run_worker_process(job: WorkerJob, *, timeout: float | None = None) -> WorkerResult:
    """`python -m coder worker --job - --json` as a child process (the job on its stdin),
    waited for; its JSON result. A worker killed, or ending without a result: `error`."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "coder", "worker", "--job", "-", "--json"],
            input=job.to_json(),
            env=worker_env(),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _error(job, f"worker for step {job.step_id} did not finish: {exc}", started)
    text = proc.stdout
    last = text.rfind("\n{")  # the result is the last object printed (`--json`)
    try:
        return WorkerResult.from_json(text[last + 1 :] if last >= 0 else text)
    except ValueError:
        pass
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    how = (
        f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    )
    detail = f": {said[-1]}" if said else ""
    return _error(job, f"worker for step {job.step_id} gave no result ({how}){detail}", started)


def worker_env() -> dict[str, str]:
    """A worker's environment: this process's, but a crash point set for it is the test's
    `CODER_WORKER_CRASH_AT` (coder.crashpoints), never the coordinator's own."""
    env = {k: v for k, v in os.environ.items() if k != "CODER_CRASH_AT"}
    if env.get("CODER_WORKER_CRASH_AT"):
        env["CODER_CRASH_AT"] = env["CODER_WORKER_CRASH_AT"]
    return env


def _error(job: WorkerJob, message: str, started: float) -> WorkerResult:
    return WorkerResult(
        job.step_id, "error", None, duration_s=round(time.monotonic() - started, 3), error=message
    )
