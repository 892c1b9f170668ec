"""The terminal's approval questions (coder.run.approvals). Per-step (`approval_prompt`):
before each step, [r]un, [s]kip, [d]iff so far, [n]ote, [q]uit. Per-edit (`edit_prompt`):
each write, patch and command of the model, shown before it happens (a unified diff, coloured
where colour is on; the command with the policy's decision), answered [y]es, [n]o with a
reason, [e]dit in $EDITOR, or [a]ll for the rest of the step. The live view is paused while
they ask."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Protocol

import click

from coder.cli import ask
from coder.cli.pager import coloured_diff
from coder.display import escaped
from coder.errors import InvalidInput
from coder.git import diffs, repository
from coder.run.notes import give_now
from coder.taskfile import shown_command
from coder.tools.proposal import Verdict

if TYPE_CHECKING:
    from coder.run.approvals import EditPrompt
    from coder.run.context import Approval, RunContext
    from coder.taskfile import Step
    from coder.tools.proposal import Proposal


class Pausable(Protocol):
    def paused(self) -> AbstractContextManager[None]: ...


def edit_prompt(progress: Pausable) -> EditPrompt:
    """The question, asked with the live view (or the plain lines) held back meanwhile."""

    def question(
        step_id: str, proposal: Proposal, redact: Callable[[str], str], stop: threading.Event
    ) -> Verdict:
        with progress.paused():  # never draw over the question
            try:
                return ask_edit(step_id, proposal, redact, stop)
            except click.Abort:  # the editor failed to start, or the terminal is gone: stop
                raise KeyboardInterrupt from None  # at once, as anywhere else

    return question


def ask_edit(
    step_id: str, proposal: Proposal, redact: Callable[[str], str], stop: threading.Event
) -> Verdict:
    """Show the proposal (redacted, control characters escaped) and take the answer; a stop
    while it waits (Ctrl-C, SIGTERM, a hang-up) refuses the change and the step is
    interrupted by that stop."""
    click.echo(f"\n{escaped(shown(step_id, proposal, redact), lines=True)}", err=True)
    if proposal.files:
        diff = escaped(redact(proposal.diff()), lines=True)
        click.echo(_coloured(diff), nl=False, err=True, color=_colour())
    choices = ["y", "n", "e", "a"] if proposal.editable else ["y", "n", "a"]
    answer = ask.choose(
        "  [y]es  [n]o  " + ("[e]dit  " if proposal.editable else "") + "[a]ll for this step",
        choices,
        stop,
        default="y",
    )
    if answer is None:
        return Verdict("no", reason="the user stopped the run")
    if answer == "n":
        reason = ask.line("  why not (the model is told)", stop)
        return Verdict("no", reason=reason or "")
    if answer == "a":
        return Verdict("all")
    if answer == "y":
        return Verdict("yes")
    if proposal.command is not None:
        edited = click.edit(proposal.command, require_save=False, extension=".sh")
        command = (edited or proposal.command).strip()
        return Verdict("edit", command=command)
    files = {}
    for change in proposal.files:
        if change.after is not None and b"\0" not in change.after:  # text: binary stays
            suffix = editor_suffix(change.path)
            edited_bytes = click.edit(change.after, require_save=False, extension=suffix)
            files[change.path] = change.after if edited_bytes is None else bytes(edited_bytes)
    return Verdict("edit", files=files)


# An extension as editors know them (.py, .tsx, .c++): the only part of the model's file name
# that reaches the editor's command line. click 8.1 runs the editor through a shell, with the
# temporary file's name in double quotes, where `$(...)` still runs.
_PLAIN_SUFFIX = re.compile(r"\.[A-Za-z0-9_+-]{1,16}")


def editor_suffix(path: str) -> str:
    """The extension of the temporary file the editor opens for `path` (for its syntax
    colouring): the file's own when it is plain, else `.txt`."""
    suffix = PurePosixPath(path).suffix
    return suffix if _PLAIN_SUFFIX.fullmatch(suffix) else ".txt"


def shown(step_id: str, proposal: Proposal, redact: Callable[[str], str]) -> str:
    """The question's first lines: the step, the tool and what it would do."""
    if proposal.command is not None:
        return (
            f"step {step_id}: {proposal.tool} wants to run `{redact(proposal.command)}`\n"
            f"  policy: {proposal.decision}"
        )
    if proposal.files:
        return f"step {step_id}: {proposal.tool} wants to change {redact(proposal.target)}"
    return f"step {step_id}: {proposal.tool} with {redact(proposal.target)}"


def _colour() -> bool:
    """Colour as the rest of the CLI decides it (--color, NO_COLOR, else whether stderr is a
    terminal: the question goes there)."""
    ctx = click.get_current_context(silent=True)
    chosen = None if ctx is None else ctx.color
    return sys.stderr.isatty() if chosen is None else chosen


def _coloured(diff: str) -> str:
    return coloured_diff(diff) if _colour() else diff


def approval_prompt(step: Step, run: RunContext) -> Approval:
    """Ask before a step: [r]un, [s]kip, [d]iff so far, [n]ote (for a step a model works
    on), [q]uit."""
    redact = run.redactor.redact
    what = escaped(redact(f"`{shown_command(step.cmd)}`" if step.cmd else step.goal))
    keys = ["r", "s", "d", "n", "q"] if step.uses_model else ["r", "s", "d", "q"]
    note = "  [n]ote" if step.uses_model else ""
    while True:
        answer = ask.choose(
            f"\nstep {step.id} ({step.kind}): {what}\n  [r]un  [s]kip  [d]iff so far{note}  [q]uit",
            keys,
            run.stop,
            default="r",
        )
        if answer is None:  # Ctrl-C, SIGTERM or a hang-up while asking: as [q]uit
            return "quit"
        if answer == "n":
            prompt_note(step, run)
            continue
        if answer == "d":
            repo = repository.open_repo(run.worktree)
            text = diffs.diff_patch(repo, run.manifest.base_commit, worktree=run.worktree)
            click.echo(escaped(redact(text), lines=True) or "(no changes yet)", err=True)
            continue
        choice: dict[str, Approval] = {"r": "run", "s": "skip", "q": "quit"}
        return choice[answer]


def prompt_note(step: Step, run: RunContext) -> None:
    """`[n]ote` at the prompt: a line of guidance for the step's next attempt, kept in the
    run's state at once (coder.run.notes.give_now)."""
    text = ask.line(f"note for step {step.id} (empty: none)", run.stop)
    try:
        note = give_now(run, step.id, text) if text else None
    except InvalidInput as exc:
        click.echo(f"error: {exc.message}", err=True)
        return
    if note is not None:
        click.echo(f"noted for attempt {note['attempt']} of step {step.id}", err=True)
    elif text:
        click.echo(f"step {step.id} has that note already", err=True)
