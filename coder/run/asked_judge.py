"""`judge: model`: among a round's candidates that passed, the step's model chooses.

The evidence (coder.run.judge) still decides which candidates passed; what it cannot weigh is
which of several passing diffs reads better, handles the case the goal hints at, changes the
right place. With `judge: model` on a step, the step's model is shown the goal and the passing
candidates' diffs side by side (each redacted, and cut to `MAX_DIFF` characters so the request
fits a small model's window) and asked to answer `candidate N: why`. A reply that names no
candidate among them, or a model that fails to answer, leaves the evidence's winner, and the
verdict says so: a judge can be wrong, never stuck.

Its request is filed as `STEP--judge` (coder.run.steps.StepContext.asker): `--record` keeps it
apart from the candidates' replies, and `--replay` answers it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coder.errors import ModelError
from coder.models import bounds

if TYPE_CHECKING:
    from coder.models.provider import ChatResult, Message, Models, Usage
    from coder.run.context import RunContext
    from coder.taskfile import Step

MAX_DIFF = 6000  # characters of each candidate's diff the judge is shown
_ANSWER = re.compile(r"candidate\s+#?(\d+)\s*[:.,-]?\s*(.*)", re.IGNORECASE | re.DOTALL)
SYSTEM = (
    "You judge code changes. Several candidate diffs each try to reach the same goal; all "
    "of them passed the automatic checks. Choose the one that best reaches the goal: "
    "correct, complete, clear, changing only what the goal needs. Answer with one line: "
    "`candidate N: <one sentence why>`."
)


@dataclass(frozen=True)
class Choice:
    number: int | None  # None: the reply named no candidate shown, or the model failed
    why: str  # the model's reason, or what went wrong
    usage: Usage | None = None


def ask(run: RunContext, step: Step, patches: Mapping[int, str]) -> Choice:
    """The step's model's choice among `patches` (candidate number -> its diff)."""
    agent = run.agent
    if agent is None:  # a run with model steps has a session; kept for a clear failure
        return Choice(None, "no model to ask")
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": run.redactor.redact(_shown(step.goal or "", patches))},
    ]
    seconds = float(step.timeout_s or run.settings.model_timeout)
    try:
        with bounds.within(time.monotonic() + seconds, run.stop):
            result = _chat(agent.models, step, messages)
    except ModelError as exc:
        return Choice(None, f"the model did not answer ({exc.message})")
    number, why = parse(result.content, patches)
    return Choice(number, why, result.usage)


def _chat(models: Models, step: Step, messages: list[Message]) -> ChatResult:
    """One request, filed as the step's judge's (`--record`, `--replay`)."""
    provider = models.for_step(f"{step.id}--judge", step.model)
    try:
        return provider.chat(messages)
    finally:
        provider.close()


def parse(reply: str, patches: Mapping[int, str]) -> tuple[int | None, str]:
    """The candidate a reply names and its reason; (None, what was wrong) when it names none
    of those shown."""
    said = " ".join(reply.split())
    match = _ANSWER.search(said)
    if match is None or int(match.group(1)) not in patches:
        named = f"the model's reply named no candidate among {_numbers(patches)}"
        return None, f"{named}: {said[:120]!r}"
    return int(match.group(1)), match.group(2).strip()[:300] or "no reason given"


def _shown(goal: str, patches: Mapping[int, str]) -> str:
    parts = [f"Goal: {goal}", ""]
    for number, patch in patches.items():
        cut = patch[:MAX_DIFF] + ("\n[... cut]" if len(patch) > MAX_DIFF else "")
        parts += [f"### candidate {number}", "```diff", cut, "```", ""]
    parts.append(f"Which of {_numbers(patches)} is best? Answer `candidate N: why`.")
    return "\n".join(parts)


def _numbers(patches: Mapping[int, str]) -> str:
    return ", ".join(str(n) for n in patches)
