"""Which model each attempt of a step uses: its own (else the task's), and its
`fallback_model` once FALLBACK_AFTER attempts have failed.

Apart from session.py (which opens the models) so that reading a run back (`coder report`)
needs these rules without the model side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coder.taskfile import Step, Task

FALLBACK_AFTER = 2  # failed attempts with a step's model before its fallback_model takes over


def model_uses(
    task: Task, steps: Sequence[Step], attempts: Mapping[str, int] | None = None
) -> dict[str, dict[str, list[str]]]:
    """model name -> {"model" | "fallback_model": ids of the steps that can use it so}: each
    step's own model, else the task's, and its fallback_model, else the task's, where the
    step can still reach it (`reaches_fallback`: its retries allow a third attempt, counting
    the `attempts` it already made) -- what `model_at` picks from."""
    uses: dict[str, dict[str, list[str]]] = {}
    for step in steps:
        if not step.uses_model:
            continue
        made = (attempts or {}).get(step.id, 0)
        model = step.model or task.model
        fallback = step.fallback_model or task.fallback_model
        if not reaches_fallback(task, step, made):
            fallback = None
        for role, name in (("model", model), ("fallback_model", fallback)):
            if name:
                uses.setdefault(name, {}).setdefault(role, []).append(step.id)
    return uses


def model_at(task: Task, step: Step, attempt: int) -> tuple[str | None, str | None]:
    """The model attempt number `attempt` (from 1, counted over the run's life) of the step
    uses (None: the run's) and, when the attempt escalates to `fallback_model` (the step's,
    else the task's), why."""
    fallback = step.fallback_model or task.fallback_model
    if fallback and attempt > FALLBACK_AFTER:
        first = step.model or task.model
        return fallback, (
            f"attempt {attempt} uses fallback_model {fallback} after {FALLBACK_AFTER} "
            f"failed attempts with {first}"
        )
    return step.model, None


def next_model(task: Task, step: Step, attempts: int = 0) -> str | None:
    """The model the step's next attempt uses, after the `attempts` it already made: its
    own, else the task's (its fallback once those attempts reached it)."""
    return model_at(task, step, attempts + 1)[0] or task.model


def reaches_fallback(task: Task, step: Step, attempts: int = 0) -> bool:
    """Whether the step, after the `attempts` it already made, can still get to its
    `fallback_model`: its retries allow an attempt past the FALLBACK_AFTER ones (with
    `retries` under 2, a fresh step never does)."""
    fallback = step.fallback_model or task.fallback_model
    return bool(fallback) and attempts + task.retries(step) + 1 > FALLBACK_AFTER
