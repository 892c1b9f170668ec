"""`coder run`, `resume` and `stop`: driving runs (`coder status` is in status_cmd.py)."""

from __future__ import annotations

import sys
import threading
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypedDict, get_type_hints

import click

from coder import project, taskfile
from coder.cli import ask
from coder.cli.approve import approval_prompt, edit_prompt
from coder.cli.common import (
    PathType,
    cwd,
    emit_json,
    json_option,
    run_option,
)
from coder.cli.dry_run import show_dry_run
from coder.cli.fleet_options import fleet_of, fleet_options
from coder.cli.init_cmd import ask_trust
from coder.cli.merge_cmd import describe, merge_activity
from coder.cli.steering import given_note, note_options
from coder.cli.summary import run_usage, summary_table, usage_line
from coder.cli.views import progress_for
from coder.config import PerRun
from coder.display import escaped
from coder.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CoderError,
    TaskfileEdited,
)
from coder.fleet.coordinator import dispatcher
from coder.git import repository
from coder.mcp.attach import attach_configured
from coder.run.drive import RunOptions, RunResult
from coder.run.resume import resume_run
from coder.run.start import start_run
from coder.run.stop import stop_run
from coder.schemas import load_schema
from coder.services import history, merge

if TYPE_CHECKING:
    from pathlib import Path

    from coder.run.approvals import EditPrompt, Mode
    from coder.run.context import Approval, Approver, RunContext
    from coder.run.records import RunState
    from coder.taskfile import Step

EXIT_FOR = {
    "success": EXIT_OK,
    "failed": EXIT_FAILED,
    "error": EXIT_ENVIRONMENT,
    "interrupted": EXIT_INTERRUPTED,
}

RUN_EPILOG = """\b
Examples:
  coder run --autonomous -f tasks/hello-shell.yaml
  coder run --autonomous -f tasks/parallel-levels.yaml --max-parallel 2 --json
"""


def per_run_options(record: type) -> list[Any]:
    """An option for each field of `record` (coder.config.PerRun) that names a flag
    (coder.config.option): a boolean's as a `--x/--no-x` pair, a number's or a choice's checked
    as its config setting is (schemas/config.schema.json); each reaches the command as
    its field's name (None when not given), for RunOptions' `per_run`."""
    hints, known = get_type_hints(record), load_schema("config")["properties"]
    options = []
    for f in fields(record):
        if "flag" not in f.metadata:
            continue
        flag, rule = f.metadata["flag"], known.get(f.name, {})
        kind: Any = str
        if hints[f.name] in (bool, bool | None):
            flag, kind = f"{flag}/--no-{flag.removeprefix('--')}", None
        elif "integer" in rule.get("type", ()):
            kind = click.IntRange(rule.get("minimum"), rule.get("maximum"))
        elif "enum" in rule:
            kind = click.Choice(rule["enum"])
        options.append(click.option(flag, f.name, type=kind, default=None, help=f.metadata["help"]))
    return options


def chosen(given: dict[str, Any]) -> dict[str, Any]:
    """The `PerRun` settings the command line set, of the options `per_run_options` gave."""
    return {name: value for name, value in given.items() if value is not None}


def run_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--max-parallel",
                type=click.IntRange(1, 32),
                help="Run up to N independent steps of a level at once (default: as many as "
                "the model server serves at once, its slots; 1 without model steps).",
            ),
            click.option(
                "--fail-fast",
                is_flag=True,
                help="Stop at the first failing step, even one whose on_fail is skip.",
            ),
            click.option(
                "--model",
                help="The model to use (overrides config and CODER_MODEL).",
            ),
            click.option(
                "--record",
                type=PathType(dir_okay=False),
                help="Record the model's replies to FILE (for --replay).",
            ),
            click.option(
                "--replay",
                type=PathType(dir_okay=False),
                help="Answer model calls from a recording instead of the model server.",
            ),
            click.option(
                "--approvals",
                type=click.Choice(["per-step", "per-edit", "none"]),
                help="Ask before each step (per-step), before each write, patch and command of "
                "the model, shown as a diff (per-edit), or never (none); overrides the "
                "taskfile's policies.approvals. Default: the taskfile's, else per-step for "
                "`run` (none with --autonomous) and none for `resume`.",
            ),
            click.option(
                "--no-sandbox",
                is_flag=True,
                help="Run commands without the kernel sandbox (for a machine that has none; "
                "see `coder doctor`).",
            ),
            click.option(
                "-q",
                "--quiet",
                is_flag=True,
                help="No live view: one plain line per event (as when stderr is not a terminal).",
            ),
            click.option(
                "-v",
                "--verbose",
                is_flag=True,
                help="Show the last lines of the model's streamed text in the live view.",
            ),
            *per_run_options(PerRun),
        ]
    ):
        func = option(func)
    return func


@click.command(epilog=RUN_EPILOG)
@click.argument("given", required=False, metavar="[TASKFILE]")
@click.option("-f", "--file", "path", type=PathType(), help="The taskfile (YAML).")
@click.option(
    "-t", "--task", "task_id", help="A taskfile in tasks/ by its id (instead of -f FILE)."
)
@click.option("--autonomous", is_flag=True, help="Run every step without asking.")
@click.option(
    "--merge-on-success",
    is_flag=True,
    help="When the run succeeds, merge it as `coder merge --if-green` does.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show the plan, each command with the policy's decision and the model; run nothing.",
)
@click.option(
    "--include-uncommitted",
    is_flag=True,
    help="Start from your checkout's uncommitted changes (new files included): they become "
    "the run's first commit on its branch; your checkout is left as it is.",
)
@click.option(
    "--candidates",
    type=click.IntRange(1, 8),
    help="Try every edit, doc and custom step N ways at once, each with its own seed; the one "
    "whose checks pass with the smallest diff lands (the taskfile's `candidates`, for all).",
)
@run_options
@fleet_options
@json_option
def run(
    given: str | None,
    path: Path | None,
    task_id: str | None,
    autonomous: bool,
    merge_on_success: bool,
    dry_run: bool,
    include_uncommitted: bool,
    candidates: int | None,
    max_parallel: int | None,
    fail_fast: bool,
    model: str | None,
    record: Path | None,
    replay: Path | None,
    approvals: str | None,
    no_sandbox: bool,
    quiet: bool,
    verbose: bool,
    executor: str | None,
    remote: str | None,
    workers: int | None,
    ray_address: str | None,
    as_json: bool,
    **per_run: Any,
) -> None:
    """Run a taskfile on its own branch, one commit per step.

    Exit 0 when the run succeeded, 1 when a step or the success criteria failed, 3 when an
    environment problem stopped it (model host gone, branch moved, disk full), 130 when it
    was stopped (Ctrl-C, SIGTERM, the terminal closed); resume the last two with
    `coder resume -t ID`.
    """
    path = _taskfile_given(given, path, task_id, as_json)
    options = RunOptions(
        max_parallel=max_parallel,
        fail_fast=fail_fast,
        model=model,
        record=record,
        replay=replay,
        sandbox="off" if no_sandbox else None,
        include_uncommitted=include_uncommitted,
        candidates=candidates,
        per_run=chosen(per_run),
        fleet=fleet_of(executor, remote, workers, ray_address),
        dispatcher=dispatcher,
    )
    if dry_run:
        show_dry_run(path, options, as_json)
        return
    from dataclasses import replace

    if autonomous and approvals not in (None, "none"):
        raise click.UsageError(
            f"--autonomous asks nothing: it cannot go with --approvals {approvals}"
        )
    ask_trust(as_json)
    progress = _progress(as_json, quiet, verbose, steps=lambda: dag_steps(path=path))
    try:
        result = start_run(
            path,
            cwd=cwd(),
            console=progress,
            options=replace(
                options,
                **_asking(progress, "none" if autonomous else approvals, "per-step"),
                attach_tools=attach_configured,
                live=progress.loop_event,
            ),
        )
    finally:
        progress.close()
    _finish(
        result, as_json, _merge_on_success(result, as_json, quiet) if merge_on_success else None
    )


class Asking(TypedDict):
    """RunOptions' approvals: the mode chosen, the command's default, who is asked."""

    approvals: str | None
    default_approvals: Mode
    approve: Approver | None
    approve_edit: EditPrompt | None


def _asking(progress: Any, approvals: str | None, default: Mode) -> Asking:
    """RunOptions' approvals (coder.run.approvals): the mode chosen on the command line and
    the questions at this terminal; none without one (stdin and stdout a terminal), so a run
    that would ask is refused."""

    def approve(step: Step, run: RunContext) -> Approval:
        with progress.paused():  # never draw over the question
            return approval_prompt(step, run)

    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    return {
        "approvals": approvals,
        "default_approvals": default,
        "approve": approve if terminal else None,
        "approve_edit": edit_prompt(progress) if terminal else None,
    }


def _taskfile_given(
    given: str | None, path: Path | None, task_id: str | None, as_json: bool
) -> Path:
    """`run`'s taskfile: -f FILE, or -t ID's file in this checkout's tasks/ (named on
    stderr), or either as the argument (`coder run tasks/x.yaml`, `coder run x`): a file when
    one is there or the name ends in .yaml/.yml, else an id."""
    if given is not None:
        import os

        if path is not None or task_id is not None:
            raise click.UsageError(f"{given} and -f/-t both name a taskfile; give one")
        if os.path.exists(given) or given.endswith((".yaml", ".yml")):
            path = PathType().convert(given, None, None)
        else:
            task_id = given
    if (path is None) == (task_id is None):
        raise click.UsageError(
            "pass exactly one of -f FILE or -t ID (a taskfile in tasks/), or either as "
            "`coder run TASKFILE`"
        )
    if path is not None:
        return path
    assert task_id is not None
    from pathlib import Path

    checkout = repository.open_repo(cwd()).workdir  # this checkout's tasks/, as -f would see
    found = project.find_taskfile(Path(checkout or cwd()), task_id)
    if not as_json:
        click.echo(f"Taskfile {found}", err=True)
    return found


@click.command(
    epilog="\b\nExamples:\n  coder resume -t T-20261122-101500-ab12\n"
    "  coder resume -t T-20261122-101500-ab12 --taskfile\n"
    "  coder resume -t T-20261122-101500-ab12 --note 'use the helper in utils.py'"
)
@run_option()
@click.option(
    "-f",
    "--taskfile",
    "taskfile",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[FILE]",
    help="Take the edited taskfile (the one the run started from, or FILE) for the steps not "
    "yet done; the done steps must be unchanged.",
)
@click.option(
    "--ignore-edits",
    is_flag=True,
    help="Go on with the run's own copy of the task although the taskfile changed.",
)
@note_options
@run_options
@json_option
def resume(
    task_id: str,
    taskfile: str | None,
    ignore_edits: bool,
    note: str | None,
    note_file: str | None,
    step: str | None,
    max_parallel: int | None,
    fail_fast: bool,
    model: str | None,
    record: Path | None,
    replay: Path | None,
    approvals: str | None,
    no_sandbox: bool,
    quiet: bool,
    verbose: bool,
    as_json: bool,
    **per_run: Any,
) -> None:
    """Continue a run that crashed, was killed or was stopped.

    Finished steps never run again; a step caught mid-way is checked against git: committed
    means done, otherwise its partial changes are discarded and it runs again. When the
    taskfile changed since the run started, resume asks which version to go on with (without
    a terminal it refuses, changing nothing): --taskfile takes the new version for the steps
    not yet done, --ignore-edits keeps the run's own copy. A --note reaches the next attempt
    of the step (--step, else the next one a model works on).
    """
    if taskfile is not None and ignore_edits:
        raise click.UsageError("pass one of --taskfile or --ignore-edits, not both")
    text = given_note(note, note_file, step)
    ask_trust(as_json)
    progress = _progress(as_json, quiet, verbose, steps=lambda: dag_steps(task_id=task_id))

    def resumed(taskfile: str | None, ignore_edits: bool) -> RunResult:
        return resume_run(
            task_id,
            cwd=cwd(),
            console=progress,
            options=RunOptions(
                max_parallel=max_parallel,
                fail_fast=fail_fast,
                model=model,
                record=record,
                replay=replay,
                attach_tools=attach_configured,
                sandbox="off" if no_sandbox else None,
                live=progress.loop_event,
                taskfile=taskfile,
                ignore_edits=ignore_edits,
                **_asking(progress, approvals, "none"),
                notes=((step, text),) if text is not None else (),
                per_run=chosen(per_run),
                dispatcher=dispatcher,
            ),
        )

    try:
        try:
            result = resumed(taskfile, ignore_edits)
        except TaskfileEdited as edited:
            if as_json or not (sys.stdin.isatty() and sys.stdout.isatty()):
                raise
            with progress.paused():
                taken = _ask_which_version(edited)
            result = resumed("" if taken else None, not taken)
    finally:
        progress.close()
    _finish(result, as_json)


def _ask_which_version(edited: TaskfileEdited) -> bool:
    """At a terminal: the steps the edited taskfile changes, and whether to take it (True)
    or go on with the run's own copy (False); [q]uit is an interruption."""
    click.echo(f"{escaped(edited.message)}:", err=True)
    for difference in edited.differences:
        click.echo(f"  {difference}", err=True)
    answer = ask.choose(
        "  [t]ake the new version for the steps not yet done  [k]eep the run's copy  [q]uit",
        ["t", "k", "q"],
        threading.Event(),
        default="t",
    )
    if answer in (None, "q"):
        raise KeyboardInterrupt
    return answer == "t"


@click.command(epilog="\b\nExample:\n  coder stop -t T-20261122-101500-ab12")
@run_option()
@click.option(
    "--wait",
    default=30.0,
    show_default=True,
    help="Seconds the runner has to stop before it is killed.",
)
@json_option
def stop(task_id: str, wait: float, as_json: bool) -> None:
    """Stop a run; a runner that does not stop when asked is killed.

    The current step is interrupted and checkpointed; a runner stuck past --wait (a read that
    blocks, ...) is killed with its commands, as a crash would end it: resume recovers."""
    stopped = stop_run(task_id, cwd=cwd(), wait=wait)
    if as_json:
        emit_json(
            {
                "task_id": task_id,
                "stopped_pid": stopped.pid,
                "forced": stopped.forced,
                "blocked_in": stopped.blocked_in,
                "killed_commands": list(stopped.commands),
            }
        )
        return
    resume = f"continue it with `coder resume -t {task_id}`"
    if not stopped.forced:
        click.echo(f"Stopped run {task_id} (pid {stopped.pid}); {resume}")
        return
    where = f" (it was blocked in {stopped.blocked_in})" if stopped.blocked_in else ""
    commands = len(stopped.commands)
    click.echo(
        f"Run {task_id} (pid {stopped.pid}) did not stop within {wait:g}s{where}: killed it"
        + (f" and {commands} command process(es) it left" if commands else "")
        + f"; {resume}"
    )


def _progress(as_json: bool, quiet: bool = False, verbose: bool = False, steps: Any = None) -> Any:
    """The run's progress on stderr: live on a terminal, plain lines otherwise, none under
    --json (stdout is then one JSON document and stderr stays quiet)."""
    return progress_for(silent=as_json, quiet=quiet, verbose=verbose, steps=steps)


def dag_steps(*, path: Path | None = None, task_id: str | None = None) -> list[tuple[str, ...]]:
    """(id, kind, goal) of each step of a taskfile or a run, for the live view; nothing when
    they cannot be read (the run itself then reports why)."""
    try:
        if path is not None:
            task = taskfile.load(path)
        else:
            assert task_id is not None
            task = history.open_run(cwd(), task_id).manifest.task
    except CoderError:
        return []
    return [(s.id, s.kind, s.goal) for s in task.steps]


def _merge_on_success(
    result: Any, as_json: bool, quiet: bool = False
) -> tuple[dict[str, Any], str, int] | None:
    """`run --merge-on-success`: (JSON, text, exit code) of merging a green run; None if red."""
    if result.status != "success":
        return None
    try:
        with merge_activity(silent=as_json, quiet=quiet) as notify:
            landed = merge.merge_run(result.task_id, cwd=cwd(), if_green=True, notify=notify)
    except CoderError as exc:
        text = f"Not merged: {exc.message}" + (f"\n  hint: {exc.hint}" if exc.hint else "")
        return (
            {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code},
            text,
            exc.exit_code,
        )
    return landed.to_dict(), describe(landed), EXIT_OK


def _finish(
    result: Any, as_json: bool, merged: tuple[dict[str, Any], str, int] | None = None
) -> None:
    state, manifest = result.state, result.manifest
    if as_json:
        emit_json(
            {
                "task_id": result.task_id,
                "status": result.status,
                "branch": manifest.branch,
                "worktree": manifest.worktree,
                "error": state.error,
                "skipped": skipped_steps(state),
                "warnings": list(result.warnings),
                "steps": state.to_dict()["steps"],
                "usage": run_usage(state),
                **({"merge": merged[0]} if merged else {}),
            }
        )
    else:
        click.echo(summary_table(manifest.task, state))
        click.echo("")
        line = f"Run {result.task_id}: {result.status}"
        note = state.skipped_note()
        if note and not state.error:
            line += f", {note}"
        if state.error:
            line += f" ({state.error})"
        click.echo(escaped(line))
        click.echo(f"  branch   {manifest.branch}\n  worktree {manifest.worktree}")
        if usage_line(state):
            click.echo(f"  model    {usage_line(state)}")
        if result.status in ("interrupted", "failed", "error"):
            click.echo(f"  continue with `{result.resume or f'coder resume -t {result.task_id}'}`")
        if merged:
            click.echo(merged[1])
    raise SystemExit(merged[2] if merged else EXIT_FOR.get(result.status, EXIT_FAILED))


class Skipped(TypedDict):
    step_id: str
    cause: str  # failed, user or requirement
    error: str | None


def skipped_steps(state: RunState) -> list[Skipped]:
    """Each skipped step with why (`cause`: failed, user or requirement) and its error."""
    return [
        {"step_id": sid, "cause": r.skip_cause or "failed", "error": r.error}
        for sid, r in state.skipped()
    ]
