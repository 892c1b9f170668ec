"""A run's approvals (`policies.approvals`, `--approvals`): which mode, whether it can ask at
all, and, in `per-edit`, each step's questions with their answers in the event log.

    per-step  asked before each step that writes or runs something (`coder.run.executor`)
    per-edit  asked before each write, patch and command of the model, shown as a diff or
              as the command with the policy's decision (`coder.tools.approval`)
    none      never asked

The mode: the command line's (`--approvals`; `--autonomous` is `none`), else the taskfile's
`policies.approvals`, else the command's default (`coder run`: per-step; `coder resume` and
the API: none). A mode that asks needs someone to ask: without the prompt (no terminal) the
run is refused before anything of it exists.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from coder.errors import InvalidInput
from coder.tools.proposal import Verdict

if TYPE_CHECKING:
    from coder.agent.session import EventSink
    from coder.redact import Redactor
    from coder.tools.proposal import Proposal

Mode = Literal["per-step", "per-edit", "none"]
MODES: tuple[Mode, ...] = ("per-step", "per-edit", "none")
ALIASES: Mapping[str, Mode] = {"manual": "per-step"}  # the name before per-edit existed

# The terminal's per-edit question: the step, the proposed change and how to redact what it
# shows -> the answer.
# `stop` is the run's: a stop while it waits ends the question (coder.cli.ask).
EditPrompt = Callable[[str, "Proposal", Callable[[str], str], threading.Event], "Verdict"]


def mode_of(chosen: str | None, taskfile: str | None, default: Mode) -> Mode:
    """The run's mode: the command line's choice, else the taskfile's, else `default`."""
    value = chosen if chosen is not None else taskfile if taskfile is not None else default
    value = ALIASES.get(value, value)
    if value not in MODES:  # the schema allows no other; a caller of the API might
        raise InvalidInput(
            f"approvals must be one of {', '.join(MODES)}, got {value!r}",
            hint="set policies.approvals in the taskfile, or pass --approvals",
        )
    return value


def require_prompt(mode: Mode, *, can_ask: bool) -> None:
    """Refuse a mode that asks when there is nobody to ask (stdin or stdout not a terminal)."""
    if mode == "none" or can_ask:
        return
    what = "before each step" if mode == "per-step" else "before each edit and command"
    raise InvalidInput(
        f"approvals {mode}: coder asks {what}, which needs a terminal; pass --autonomous "
        "(coder run) or --approvals none to run every step without asking"
    )


@dataclass
class EditApprovals:
    """per-edit for a whole run: `for_step` gives each attempt of a step its approver. `all`
    holds for the rest of the step, its later attempts included."""

    prompt: EditPrompt
    redactor: Redactor
    stop: threading.Event  # the run's
    lock: threading.Lock = field(default_factory=threading.Lock)  # one question at a time
    _all: set[str] = field(default_factory=set)

    def for_step(self, step_id: str, log: EventSink) -> StepApprovals:
        return StepApprovals(self, step_id, log)


@dataclass
class StepApprovals:
    """One attempt's approver (`coder.tools.proposal.Approver`): asks, logs each answer
    (`approval.answered`: the tool, what it would change, the answer and the reason; the log
    redacts), and keeps the refusals for the step's reasons."""

    run: EditApprovals
    step_id: str
    log: EventSink  # the step's event log
    refusals: list[str] = field(default_factory=list)

    def __call__(self, proposal: Proposal) -> Verdict:
        with self.run.lock:
            if self.step_id in self.run._all:  # not asked again; logged as what `all` let by
                verdict = Verdict("all")
            else:
                redact = self.run.redactor.redact
                verdict = self.run.prompt(self.step_id, proposal, redact, self.run.stop)
            if verdict.answer == "all":
                self.run._all.add(self.step_id)
        fields = {"tool": proposal.tool, "target": proposal.target[:300]}
        if verdict.answer == "no":
            self.log.warning("approval.refused", **fields, reason=verdict.reason)
            self.refusals.append(
                f"the user refused {proposal.tool} ({proposal.target[:120]}): "
                + (verdict.reason.strip() or "no reason given")
            )
        else:
            edited = sorted(verdict.files) or verdict.command
            self.log.info("approval.answered", **fields, answer=verdict.answer, edited=edited)
        return verdict
