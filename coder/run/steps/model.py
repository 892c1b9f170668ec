"""Model steps (`analyze`, `edit`, `doc`, `custom`): the kind's runner. What an attempt does
(its tools, the conversation, the claim checked against the real changes) is
coder.agent.modelstep's; here its result becomes the step's outcome."""

from __future__ import annotations

from coder.agent import modelstep
from coder.run.steps import StepContext, StepOutcome


def run(ctx: StepContext) -> StepOutcome:
    if ctx.agent is None:
        return StepOutcome(False, f"{ctx.step.kind} steps need a model; none is configured")
    result = modelstep.attempt(ctx, ctx.agent)
    usage, notes, protocol = result.usage, tuple(result.notes), result.protocol
    if not result.ok:
        cancelled = result.error == "interrupted"
        return StepOutcome(
            False, result.error, cancelled=cancelled, usage=usage, notes=notes, protocol=protocol
        )
    return StepOutcome(True, summary=result.summary, usage=usage, notes=notes, protocol=protocol)
