"""The step runners by name: a kind names its runner (`coder.taskfile.kinds.Kind.runner`), and the
executor calls `runner_for(step.kind)(ctx)`. The runners live here, a layer above the kinds
(they need the sandbox, git and the model); a new runner is its module and one line here."""

from __future__ import annotations

from collections.abc import Mapping

from coder.run.steps import StepRunner, lint, model, shell, test
from coder.taskfile.kinds import KINDS

RUNNERS: Mapping[str, StepRunner] = {
    "model": model.run,
    "shell": shell.run,
    "test": test.run,
    "lint": lint.run,
}


def runner_for(kind: str) -> StepRunner:
    """The runner of a step of `kind` (coder.taskfile.kinds.KINDS[kind].runner)."""
    return RUNNERS[KINDS[kind].runner]
