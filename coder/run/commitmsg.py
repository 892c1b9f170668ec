"""What a step commit says: its title, its body and the values of its trailers
(coder.git.commits writes them). The taskfile's and the model's words, and the user's notes,
pass the run's redactor first: a commit is shown, pushed and logged."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

from coder.run.notes import trailer
from coder.taskfile import shown_command

if TYPE_CHECKING:
    from coder.run.steps import StepOutcome
    from coder.taskfile import Step, Task


class CommitParts(TypedDict):
    """A step commit's message (title, body) and the values of its trailers."""

    task_id: str
    step_id: str
    attempt: int
    title: str
    body: str
    notes: list[str]  # the user's guidance notes (coder.run.notes), as Coder-Note trailers


def commit_parts(
    task: Task,
    step: Step,
    attempt: int,
    outcome: StepOutcome,
    redact: Callable[[str], str],
    notes: Sequence[str] = (),
) -> CommitParts:
    """What a step commit says: title, body and the trailers' values; what the taskfile and
    the model wrote, and the user's `notes`, pass `redact` (the run's redactor)."""
    return {
        "task_id": task.id,
        "step_id": step.id,
        "attempt": attempt,
        "title": commit_title(step, redact),
        "body": commit_body(step, outcome, redact),
        "notes": [trailer(redact(note)) for note in notes],
    }


def commit_title(step: Step, redact: Callable[[str], str]) -> str:
    goal = redact(" ".join(step.goal.split()))
    title = f"{step.id}: {goal}"
    return title if len(title) <= 72 else title[:71] + "…"


def commit_body(step: Step, outcome: StepOutcome, redact: Callable[[str], str]) -> str:
    lines = [f"Step {step.id} ({step.kind})."]
    if step.cmd:
        lines.append(f"Command: {shown_command(step.cmd)}")
    if outcome.summary:
        lines.append(outcome.summary)
    return redact("\n".join(lines))
