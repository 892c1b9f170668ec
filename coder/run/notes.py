"""Guidance notes: what the user tells the model about a step between its attempts.

A note names a step (by default the next step to run that a model works on) and is kept in
that step's record in the run's state (`StepRecord.notes`, journaled like every step change),
redacted before it is stored. Every later attempt of the step, and each of its fix cycles,
gets all of its notes at the end of its first user message, after the cache-stable prefix
(`coder.agent.prompts.notes_message`); the step's commit carries each as a `Coder-Note:`
trailer; `coder show` and `coder report` list them.

Given with `coder resume --note`, `coder revert --note` and `[n]ote` at the prompt before a
step. A note for a step that does not exist, is done, or has no model to read it is refused,
naming the steps that can take one, before anything changes. A note is kept once per step:
the same text given again (a `resume --note` run again after a kill) adds nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from coder.errors import InvalidInput
from coder.run.records import DONE, NoteRecord, RunState, now_iso

if TYPE_CHECKING:
    from coder.redact import Redactor
    from coder.run.context import RunContext
    from coder.taskfile import Task

VIAS = ("resume", "revert", "prompt", "fork")
MAX_CHARS = 4000  # a note is guidance, not a document: longer ones are refused
TRAILER_CHARS = 200  # a commit trailer is one line


def will_run(task: Task, state: RunState, also: Collection[str] = ()) -> list[str]:
    """The steps that run again (not done, or in `also`), in DAG order."""
    from coder.taskfile import graph

    order = graph.order(graph.build(task.deps()))
    return [s for s in order if s in also or state.steps[s].status not in DONE]


def target(task: Task, runs: Sequence[str], step_id: str | None) -> str:
    """The step a note goes to: `step_id`, or the first of `runs` (the steps that will run,
    in order) that a model works on. InvalidInput (exit 2) naming the steps that can take a
    note when there is none, or `step_id` is unknown, done, or never reaches a model."""
    steps = {s.id: s for s in task.steps}
    usable = [s for s in runs if steps[s].uses_model]
    valid = f"steps that can take a note: {', '.join(usable)}" if usable else ""
    if step_id is None:
        if not usable:
            raise InvalidInput(
                f"run {task.id} has no step left to run that a model works on, so no note "
                "would be read",
                hint="to redo a finished step with a note, `coder revert -t ID --to-step "
                "STEP --note TEXT` to the step before it",
            )
        return usable[0]
    if step_id not in steps:
        raise InvalidInput(
            f"run {task.id} has no step {step_id!r}",
            hint=valid or f"its steps: {', '.join(steps)}",
        )
    if not steps[step_id].uses_model:
        kind = steps[step_id].kind
        raise InvalidInput(
            f"step {step_id} of run {task.id} is a {kind} step: no model works on it, so "
            "no model would read the note",
            hint=valid or "notes go to model steps and test/lint steps with fix_and_retry",
        )
    if step_id not in runs:
        raise InvalidInput(
            f"step {step_id} of run {task.id} is done and will not run again, so no model "
            "would read the note",
            hint=valid or "revert the run to the step before it (`coder revert --note`)",
        )
    return step_id


def checked_text(text: str) -> str:
    """A note's text, stripped; InvalidInput when it is empty or too long."""
    text = text.strip()
    if not text:
        raise InvalidInput("the note is empty", hint="give the guidance as --note TEXT")
    if len(text) > MAX_CHARS:
        raise InvalidInput(
            f"the note is {len(text)} characters long; notes are at most {MAX_CHARS}",
            hint="say what the model should do differently in a few lines",
        )
    return text


def give(
    state: RunState, step_id: str, text: str, *, via: str, redactor: Redactor
) -> NoteRecord | None:
    """Add a note to the step's record in `state` (redacted; the caller journals or saves
    it); it reaches the step's next attempt and every later one. Once by content and step:
    a note the step has already (the same command run again after a kill) is not added
    again, and None says so."""
    assert via in VIAS, via
    record = state.steps[step_id]
    redacted = redactor.redact(checked_text(text))
    if any(n["text"] == redacted for n in record.notes):
        return None
    note: NoteRecord = {
        "text": redacted,
        "via": via,
        "at": now_iso(),
        "attempt": record.attempts + 1,
    }
    record.notes.append(note)
    return note


def give_now(run: RunContext, step_id: str, text: str) -> NoteRecord | None:
    """A note given while the run goes on (`[n]ote` at the prompt before the step, which
    runs only after it returns): journaled at once and logged (None: the step had it)."""
    note = give(run.state, step_id, text, via="prompt", redactor=run.redactor)
    if note is None:
        return None
    run.store.record(run.state, step_id)
    shown = f"for attempt {note['attempt']}: {trailer(note['text'])}"
    run.log.info("step.noted", step_id=step_id, via="prompt", message=shown)
    return note


def texts(notes: Sequence[NoteRecord]) -> tuple[str, ...]:
    return tuple(n["text"] for n in notes)


def trailer(text: str) -> str:
    """A note as a one-line commit trailer value."""
    line = " ".join(text.split())
    return line if len(line) <= TRAILER_CHARS else line[: TRAILER_CHARS - 1] + "…"


def shown(note: NoteRecord) -> str:
    """A note as `coder show` and the report list it."""
    return f"for attempt {note['attempt']} (via {note['via']}): {' '.join(note['text'].split())}"
