"""Step kinds' runners: what each kind does in a working directory, and what it reports.

One module per runner (`shell`, `test`, `lint`, `model`), each with `run(ctx) -> StepOutcome`, a
`StepRunner`; `runners.RUNNERS` holds them by name, and a kind names its runner
(`coder.taskfile.kinds.Kind.runner`). `fix` is the fix cycles test and lint steps share,
`verify` the checks the executor runs after every step. The runners' modules are named after
their kinds: `shell` here runs the `shell` kind (the `shell_run` tool is coder.tools.shell).

A step never commits and never touches the branch: the executor does both. A step reports an
outcome; failures of the step itself (red checks, non-zero exit) are outcomes, not exceptions.
A problem of the environment (the model host gone, git failing) is raised as an
EnvironmentProblem: the executor turns it into an `errored` outcome that stops the run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from coder.files.durable import make_private_dirs

if TYPE_CHECKING:
    from coder.agent.session import AgentSession
    from coder.models.provider import Usage
    from coder.redact import Redactor
    from coder.run.approvals import EditApprovals
    from coder.run.eventlog import EventLog
    from coder.run.records import TestCounts
    from coder.run.settings import RunSettings
    from coder.taskfile import Step, Task


@dataclass
class StepContext:
    task: Task
    step: Step
    workdir: Path  # the worktree (or a scratch worktree for a parallel step)
    attempt: int
    settings: RunSettings
    artifacts: Path  # .coder/artifacts/<task id>/
    cancel: threading.Event
    log: EventLog
    redactor: Redactor
    owner: str | None = None  # marks the step's commands (coder.policy.sandbox.kill_owned)
    agent: AgentSession | None = None  # when the run has model steps
    previous_error: str | None = None  # why the previous attempt failed, for the model
    approve_edit: EditApprovals | None = None  # approvals per-edit (coder.run.approvals)
    notes: tuple[str, ...] = ()  # the user's guidance for this step so far (run/notes.py)
    candidate: int | None = None  # which try of a step tried several ways (run/candidates.py)

    @property
    def asker(self) -> str:
        """Whose model requests these are, as a recording files their replies (--record,
        --replay): the step's, or one candidate's (each replays its own, whatever ran first)."""
        return f"{self.step.id}--c{self.candidate}" if self.candidate else self.step.id

    def artifact(self, suffix: str) -> Path:
        make_private_dirs(self.artifacts)
        tried = f"-c{self.candidate}" if self.candidate else ""
        return self.artifacts / f"{self.step.id}-attempt{self.attempt}{tried}{suffix}"


Result = Literal["ok", "failed", "errored", "cancelled"]


@dataclass(frozen=True)
class StepOutcome:
    ok: bool
    error: str | None = None
    summary: str | None = None
    tests: TestCounts | None = None
    cancelled: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    usage: Usage | None = None  # model usage of this attempt
    notes: tuple[str, ...] = ()  # for the step's reasons (a model escalation, an output cap)
    protocol: str | None = None  # the tool protocol its model used: native | text
    errored: bool = False  # set by the executor only, from an EnvironmentProblem

    @property
    def result(self) -> Result:
        """ok; failed (the step's own doing); errored (the environment); cancelled (a stop)."""
        if self.ok:
            return "ok"
        return "errored" if self.errored else "cancelled" if self.cancelled else "failed"


class StepRunner(Protocol):
    """What a kind does in a working directory (`coder.run.steps.runners.RUNNERS`): its
    outcome; never a commit."""

    def __call__(self, ctx: StepContext, /) -> StepOutcome: ...
