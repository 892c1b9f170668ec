"""What one run carries through the executor, its steps and its questions: `RunContext`, built
once by coder.run.drive.execute for `run` and `resume`, and the per-step question's types
(`Approver`, `Approval`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from coder.policy.sandbox import owner_token

if TYPE_CHECKING:
    from coder.agent.session import AgentSession
    from coder.redact import Redactor
    from coder.run.approvals import EditApprovals
    from coder.run.eventlog import EventLog
    from coder.run.manifest import Manifest
    from coder.run.records import RunState
    from coder.run.settings import RunSettings
    from coder.run.state import StateStore
    from coder.taskfile import Step, Task


Approval = Literal["run", "skip", "quit"]


class Approver(Protocol):
    """Interactive mode: asked before each step that writes or runs something."""

    def __call__(self, step: Step, run: RunContext) -> Approval: ...


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

    @property
    def branch(self) -> str:
        return self.manifest.branch

    @property
    def artifacts(self) -> Path:
        return self.coder_dir / "artifacts" / self.task.id

    @property
    def owner(self) -> str:
        """Carried by every command of the run, so a resume can end those a crash left."""
        return owner_token(self.coder_dir, self.task.id)
