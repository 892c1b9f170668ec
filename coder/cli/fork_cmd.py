"""`coder fork` and `coder compare`: try part of a run again another way, and see the two
runs side by side."""

from __future__ import annotations

from typing import Any

import click

from coder.cli.common import (
    complete_steps,
    cwd,
    emit_json,
    fitted,
    json_option,
    resolve_run,
    run_option,
)
from coder.cli.pager import page
from coder.display import escaped
from coder.errors import InvalidInput
from coder.services.compare import compare_candidates, compare_runs
from coder.services.fork import fork_run

FORK_EPILOG = """\b
The fork's branch begins where STEP began in the parent: at the parent's commit right before
STEP's (before the first commit of STEP or of a step after it), so STEP and every step after
it are pending. Its history holds copies of the parent's commits up to there (same files,
authors and messages; the trailer names the fork). Run ID stays exactly as it is.

\b
Examples:
  coder fork -t T-1 --at s2 --model qwen2.5-coder:14b
  coder fork -t T-1 --at s2 --note "reuse parse_date from utils.py"
  coder resume -t T-1-fork-1
  coder compare -t T-1 -t T-1-fork-1
"""


@click.command(epilog=FORK_EPILOG)
@run_option()
@click.option(
    "--at",
    "step",
    required=True,
    shell_complete=complete_steps,
    help="The step the fork runs again (it and every step after it are pending).",
)
@click.option("--model", help="The model the fork's steps use (default: the parent's).")
@click.option(
    "--note",
    help="Guidance for the fork's first pending step a model works on (as `resume --note`).",
)
@json_option
def fork(task_id: str, step: str, model: str | None, note: str | None, as_json: bool) -> None:
    """Start a new run from a step of run ID: its own branch, worktree and state."""
    result = fork_run(task_id, cwd=cwd(), at=step, model=model, note=note)
    if as_json:
        emit_json(result.to_dict())
        return
    where = f"commit {result.commit[:12]}" if result.done else "the parent's base"
    click.echo(f"Forked run {result.parent} at step {result.step} as {result.task_id}.")
    click.echo(f"  branch   {result.branch} (from {where})")
    click.echo(f"  done     {', '.join(result.done) or '-'} (carried over)")
    click.echo(f"  pending  {', '.join(result.pending)}")
    if result.model:
        click.echo(f"  model    {result.model}")
    if result.note:
        click.echo(f"  note     for {result.note}")
    click.echo(f"  run it with `coder resume -t {result.task_id}`")


COMPARE_EPILOG = """\b
Examples:
  coder compare -t T-1 -t T-1-fork-1
  coder compare -t T-1 -t T-1-fork-1 --diff
  coder compare -t T-1 -t T-1-fork-1 --json
  coder compare -t T-1 --step s2              (a step's candidates side by side)
"""


@click.command(epilog=COMPARE_EPILOG)
@click.option(
    "-t",
    "--task",
    "tasks",
    multiple=True,
    help="A run (an id or its start); give it twice: -t A -t B.",
)
@click.option(
    "--step",
    "step",
    metavar="STEP",
    help="With one -t: that step's candidates side by side (a step with `candidates: N`).",
)
@click.option("--diff", "patch", is_flag=True, help="The whole diff from A's branch to B's.")
@json_option
def compare(tasks: tuple[str, ...], step: str | None, patch: bool, as_json: bool) -> None:
    """Show two runs side by side: steps, outcomes, tokens, time, and their branches' diff.

    With --step and one run: that step's candidates side by side, and what each changed."""
    if step is not None:
        if len(tasks) != 1:
            raise InvalidInput(
                f"compare --step needs one run, got {len(tasks)}",
                hint="coder compare -t A --step S",
            )
        tried = compare_candidates(cwd(), resolve_run(tasks[0]), step, patch=patch)
        if as_json:
            emit_json(tried.to_dict())
            return
        page(candidates_text(tried), diff=patch)
        return
    if len(tasks) != 2:
        raise InvalidInput(
            f"compare needs two runs, got {len(tasks)}", hint="coder compare -t A -t B"
        )
    first, second = (resolve_run(t) for t in tasks)
    result = compare_runs(cwd(), first, second, patch=patch)
    if as_json:
        emit_json(result.to_dict())
        return

    page(comparison_text(result, patch), diff=patch)  # as `coder diff`: paged on a terminal


def comparison_text(result: Any, patch: bool) -> str:
    """The comparison as a table fitted to its columns, the totals, then the diff."""
    a, b = result.a, result.b
    rows: list[tuple[str, ...]] = [
        ("STEP", a.task_id, "TRIES", "TOKENS", "TIME", b.task_id, "TRIES", "TOKENS", "TIME")
    ]
    for row in result.rows:
        rows.append((row.step, *_cells(row.a), *_cells(row.b)))
    rows.append(
        (
            "total",
            f"{a.status} {a.done}/{a.steps}",
            "",
            str(a.tokens),
            f"{a.duration_s:.1f}s",
            f"{b.status} {b.done}/{b.steps}",
            "",
            str(b.tokens),
            f"{b.duration_s:.1f}s",
        )
    )
    lines = [fitted(rows).rstrip()]
    for side in (a, b):
        fork = f", fork of {side.parent}" if side.parent else ""
        lines.append(
            f"{side.task_id}: {side.branch} at {(side.tip or 'gone')[:12]}"
            f" (model {side.model or '-'}{fork})"
        )
    if result.identical:
        lines.append("The two branches hold the same files.")
    elif result.diff:
        what = "Diff" if patch else "Changes"
        lines += ["", f"{what} from {a.task_id} to {b.task_id}:", result.diff.rstrip()]
    return "\n".join(lines)


def candidates_text(tried: Any) -> str:
    """A step's candidates as a table, then what each one's commit changed."""
    rows: list[tuple[str, ...]] = [
        ("CANDIDATE", "VERDICT", "SEED", "LINES", "TOKENS", "FAILING TESTS", "KEPT AS")
    ]
    for c in tried.candidates:
        rows.append(
            (
                str(c.number),
                c.verdict,
                _or_dash(c.seed),
                _or_dash(c.diff_lines if c.commit else None),
                _or_dash(c.tokens),
                _or_dash(c.failing_tests),
                escaped(c.branch or "-"),
            )
        )
    lines = [f"{tried.task_id} step {escaped(tried.step)}: {tried.summary}", ""]
    lines.append(fitted(rows).rstrip())
    for c in tried.candidates:
        if c.diff:
            lines += ["", f"candidate {c.number} ({c.verdict}):", c.diff.rstrip()]
        elif c.error:
            lines += ["", f"candidate {c.number} ({c.verdict}): {' '.join(c.error.split())[:300]}"]
    return "\n".join(lines)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _cells(side: Any) -> tuple[str, str, str, str]:
    if side.status is None:
        return ("(no such step)", "", "", "")
    return (
        escaped(side.status),
        str(side.attempts),
        str(side.tokens) if side.tokens is not None else "-",
        f"{side.duration_s:.1f}s" if side.duration_s is not None else "-",
    )
