"""`coder revert`: a run's branch back at the state right after one of its steps."""

from __future__ import annotations

from typing import Any

import click

from coder.cli.common import complete_steps, cwd, emit_json, json_option, run_option
from coder.cli.steering import given_note, note_options
from coder.services import revert as revert_service

REVERT_EPILOG = """\b
Exit codes: 0 reverted (or already there), 2 unknown task or step, a note no step can
take, or a run that was merged (revert the merge on the base branch instead), 3 the run is
running, the branch has
commits coder did not make, or the worktree has uncommitted changes.

\b
Examples:
  coder revert -t T-1 --to-step s2
  coder revert -t T-1 --to-step s2 --mode reset --json
  coder revert -t T-1 --to-step base
  coder revert -t T-1 --to-step s1 --note 'keep the old signature' --step s2
  coder resume -t T-1
"""


@click.command(epilog=REVERT_EPILOG)
@run_option(only=False)
@click.option(
    "--to-step",
    "to_step",
    required=True,
    metavar="STEP",
    help="Keep this step and the ones before it; undo every later one (`base`: undo every "
    "step, back where the run started).",
    shell_complete=complete_steps,
)
@click.option(
    "--mode",
    type=click.Choice(["revert", "reset"]),
    default="revert",
    show_default=True,
    help="revert: add one revert commit per undone step (history kept); reset: move "
    "the branch back (the old tip stays in the reflog).",
)
@note_options
@json_option
def revert(
    task_id: str,
    to_step: str,
    mode: str,
    note: str | None,
    note_file: str | None,
    step: str | None,
    as_json: bool,
) -> None:
    """Put a run's branch back at the state right after STEP.

    The later steps become pending again, so `coder resume -t ID` redoes them. Only the run's
    branch and worktree change; your checkout and the base branch are never touched. A
    --note reaches the next attempt of the step (--step, else the first one a model works on
    that runs again).
    """
    text = given_note(note, note_file, step)
    result = revert_service.revert_run(
        task_id, cwd=cwd(), to_step=to_step, mode=mode, note=text, note_step=step
    )
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(describe(result))


def describe(result: Any) -> str:
    """A `RevertResult` as a few lines of text."""
    cut = result.target[:12]
    if result.outcome == "reverted" and result.mode == "reset":
        lines = [
            f"Reset {result.branch} to {cut} (right after step {result.to_step}); it was "
            f"at {result.previous_tip[:12]}, kept in the reflog."
        ]
    elif result.outcome == "reverted":
        lines = [
            f"Reverted run {result.task_id} to step {result.to_step}: "
            f"{len(result.revert_commits)} revert commit(s) on {result.branch} "
            f"(undoing {', '.join(result.undone)})."
        ]
    elif result.pending:
        lines = [f"{result.branch} is already at step {result.to_step} ({cut})."]
    else:
        lines = [
            f"Nothing to revert: {result.branch} is already at step {result.to_step} "
            f"({cut}) and no later step has work to redo."
        ]
    if result.finished:
        lines.append(f"  finished the interrupted revert: {', '.join(result.finished)}")
    if result.pending:
        lines.append(
            f"  pending again: {', '.join(result.pending)}; redo them with "
            f"`coder resume -t {result.task_id}`"
        )
    if result.note_step:
        lines.append(f"  note kept for the next attempt of step {result.note_step}")
    lines += [f"  warning: {w}" for w in result.warnings]
    return "\n".join(lines)
