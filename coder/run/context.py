"""What one run carries through the executor, its steps and its questions: `RunContext`, built
once by coder.run.drive.execute for `run` and `resume`, and the per-step question's types
(`Approver`, `Approval`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from coder.policy.sandbox import owner_token

if TYPE_CHECKING:
    from coder.agent.session import AgentSession
    from coder.redact import Redactor
    from coder.run.approvals import EditApprovals
    from coder.run.eventlog import EventLog
    from coder.run.manifest import Fleet, Manifest
    from coder.run.records import RunState
    from coder.run.settings import RunSettings
    from coder.run.state import StateStore
    from coder.run.steps import StepOutcome
    from coder.taskfile import Step, Task


Approval = Literal["run", "skip", "quit"]


class Approver(Protocol):
    """Interactive mode: asked before each step that writes or runs something."""

    def __call__(self, step: Step, run: RunContext) -> Approval: ...


class Dispatch(Protocol):
    """A run whose steps run on other machines (coder.fleet.coordinator): step `step`, from
    `tip`, run there; its outcome (its usage), its commit fetched into the run's repository
    (None: it changed nothing) and how many attempts it took."""

    def __call__(self, step: Step, tip: str) -> tuple[StepOutcome, str | None, int]: ...

    def close(self) -> None:
        """The run's walk is over: its engine's workers end."""


# What makes a run's Dispatch once its context exists (coder.fleet.coordinator.dispatcher).
Dispatcher = Callable[["RunContext", "Fleet"], Dispatch]


@dataclass
class RunContext:
    """Everything one run needs; built by `coder.run.drive.execute` for `run` and `resume`."""

    task: Task
    manifest: Manifest  # what the run is (its branch, base, taskfile); `state`: its progress
    settings: RunSettings
    repo_root: Path
    coder_dir: Path
    worktree: Path
    state: RunState
    store: StateStore
    log: EventLog
    redactor: Redactor
    stop: threading.Event = field(default_factory=threading.Event)
    agent: AgentSession | None = None  # when the task has model steps
    approve: Approver | None = None  # approvals per-step: asked before each step
    approve_edit: EditApprovals | None = None  # per-edit: before each edit and command
    dispatch: Dispatch | None = None  # its steps run elsewhere, each batch at once

    @property
    def branch(self) -> str:
        return self.manifest.branch

    @property
    def artifacts(self) -> Path:
        return self.coder_dir / "artifacts" / self.task.id

    @functools.cached_property
    def owner(self) -> str:
        """Carried by every command of the run, so a resume can end those a crash left (its
        project's real path: resolved once a run, not once a step)."""
        return owner_token(self.coder_dir, self.task.id)
