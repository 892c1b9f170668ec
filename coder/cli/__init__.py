"""The command line: a thin Click layer over the services (parse, call a service, render).

Only click is imported at start-up; each command imports what it needs when it runs, so
`coder --help` stays fast. Expected failures (`CoderError`) become one line on stderr and a
documented exit code; `--debug` (or CODER_DEBUG=1) shows the traceback as well.

May import: every service. Nothing imports the CLI.
"""

from __future__ import annotations

import os

import click

from coder import __version__
from coder.cli.common import EPILOG, CoderGroup, colour_setting, help_width

# The commands in journey order: name -> (module in coder.cli, function, the one line
# `coder --help` shows). A command's module is imported only when that command runs or shows
# its own help, so `coder --help` imports none of them; tests/test_cli_basics.py holds each
# line here equal to the command's own docstring.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("init_cmd", "init", "Prepare this repo: .coder/ and coder.config.json."),
    "plan": ("plan_cmd", "plan", "Turn a spec or a prompt into a validated taskfile in tasks/."),
    "validate": ("validate_cmd", "validate", "Check a taskfile; report every problem at once."),
    "show": ("show_cmd", "show", "Show a taskfile's DAG (-f) or a run's progress (-t)."),
    "run": ("run_cmd", "run", "Run a taskfile on its own branch, one commit per step."),
    "resume": ("run_cmd", "resume", "Continue a run that crashed, was killed or was stopped."),
    "stop": ("run_cmd", "stop", "Stop a run; a runner that does not stop when asked is killed."),
    "worker": (
        "worker_cmd",
        "worker",
        "Run one step of a run here and push its commit to the remote.",
    ),
    "status": ("status_cmd", "status", "List the runs in this repository."),
    "merge": (
        "merge_cmd",
        "merge",
        "Land a successful run on its base branch and tag it coder/ID.",
    ),
    "revert": ("revert_cmd", "revert", "Put a run's branch back at the state right after STEP."),
    "fork": (
        "fork_cmd",
        "fork",
        "Start a new run from a step of run ID: its own branch, worktree and state.",
    ),
    "compare": (
        "fork_cmd",
        "compare",
        "Show two runs side by side: steps, outcomes, tokens, time, and their branches' diff.",
    ),
    "push": (
        "push_cmd",
        "push",
        "Push a run's branch for review; print the PR body and the compare URL.",
    ),
    "export": (
        "export_cmd",
        "export",
        "Write a taskfile's DAG as a GitHub Actions or Argo workflow, a job per step.",
    ),
    "diff": (
        "history_cmd",
        "diff",
        "Show a run's accumulated diff (base..branch) or one step's diff.",
    ),
    "report": ("report_cmd", "report", "What a reviewer needs to judge a run."),
    "logs": ("history_cmd", "logs", "Print a run's structured event log."),
    "clean": ("history_cmd", "clean", "Remove a run: worktree, state, artifacts, logs."),
    "config": (
        "init_cmd",
        "config",
        "Show the merged config and where each value comes from.",
    ),
    "trust": (
        "init_cmd",
        "trust",
        ("Trust the settings of this repository's coder.config.json that widen what runs."),
    ),
    "doctor": (
        "init_cmd",
        "doctor",
        "Check git, the sandbox, the model server and the model; say how to fix each problem.",
    ),
    "mcp": (
        "mcp_cmd",
        "mcp",
        "MCP: serve coder's tools, or list the external MCP servers runs use.",
    ),
    "completion": (
        "completion_cmd",
        "completion",
        "Print the shell completion script for bash, zsh or fish.",
    ),
    "demo": (
        "demo_cmd",
        "demo",
        ("Run a sample task end to end: analyze, edit, a failing test, the fix, docs, merge."),
    ),
}


# The commands that start commands (or MCP servers, or coder's own confined git): they make
# coder a user namespace of its own first, while it has one thread, so that an ordinary user's
# commands get the view and walls root's get (coder.policy.userns). Not the others: a program
# they start (ssh for `push`, an editor) keeps the user's exact identity.
CONFINING = frozenset(
    {"init", "plan", "run", "resume", "worker", "merge", "revert", "fork", "doctor", "mcp", "demo"}
)


@click.group(
    cls=CoderGroup,
    lazy_commands=COMMANDS,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "terminal_width": help_width()},
)
@click.version_option(__version__, "-V", "--version", prog_name="coder")
@click.option("--debug", is_flag=True, envvar="CODER_DEBUG", help="Show tracebacks for errors.")
@click.option(
    "--color",
    "colour",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    help="Colour output: auto (on a terminal, unless NO_COLOR is set), always or never.",
)
@click.pass_context
def main(ctx: click.Context, debug: bool, colour: str) -> None:
    """coder: a local-first autonomous coding agent.

    A YAML taskfile describes a DAG of steps; coder runs it on an agent/ branch in a git
    worktree with a local model (Ollama or an OpenAI-compatible server), one commit per step,
    and merges only when green.
    """
    from coder.cli.streams import survive_closed_pipes

    survive_closed_pipes()
    ctx.ensure_object(dict)["debug"] = debug or os.environ.get("CODER_DEBUG") == "1"
    if ctx.invoked_subcommand in CONFINING:
        from coder.policy import userns

        userns.enter()
    ctx.color = colour_setting(colour)
