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
from coder.cli import (
    demo_cmd,
    history,
    mcp_cmd,
    merge_cmd,
    plan_cmd,
    project,
    report_cmd,
    revert_cmd,
    runs,
    tasks,
)
from coder.cli.common import EPILOG, CoderGroup


@click.group(
    cls=CoderGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, "-V", "--version", prog_name="coder")
@click.option("--debug", is_flag=True, envvar="CODER_DEBUG", help="Show tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """coder: a local-first autonomous coding agent.

    A YAML taskfile describes a DAG of steps; coder runs it on an agent/ branch in a git
    worktree with a local Ollama model, one commit per step, and merges only when green.
    """
    ctx.ensure_object(dict)["debug"] = debug or os.environ.get("CODER_DEBUG") == "1"


for command in (
    project.init,
    plan_cmd.plan,
    tasks.validate,
    tasks.show,
    runs.run,
    runs.resume,
    runs.stop,
    runs.status,
    merge_cmd.merge,
    revert_cmd.revert,
    history.diff,
    report_cmd.report,
    history.logs,
    history.clean,
    project.config,
    project.trust,
    project.doctor,
    mcp_cmd.mcp,
    demo_cmd.demo,
):
    main.add_command(command)
