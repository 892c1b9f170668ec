"""The command line: a thin Click layer over the services (parse, call a service, render).

Only click is imported at start-up; each command imports what it needs when it runs, so
`coder --help` stays fast. Expected failures (`CoderError`) become one line on stderr and a
documented exit code; `--debug` (or CODER_DEBUG=1) shows the traceback as well.

May import: every service. Nothing imports the CLI.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from coder import __version__
from coder.errors import EXIT_INTERRUPTED, CoderError

EPILOG = """\b
Exit codes: 0 ok, 1 the run failed, 2 bad usage or invalid input,
3 environment problem (no git repo, Ollama unreachable, model missing), 130 interrupted.

\b
Examples:
  coder init
  coder validate -f tasks/hello-shell.yaml
  coder run --autonomous -f tasks/hello-shell.yaml
  coder status
"""


class CoderGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CoderError as exc:
            report_error(ctx, exc)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("coder: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # registration order: the journey order, not alphabetical


def report_error(ctx: click.Context, exc: CoderError) -> None:
    obj = ctx.ensure_object(dict)
    if obj.get("json"):
        import json

        click.echo(json.dumps({"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}))
    click.echo(f"coder: error: {exc.message}", err=True)
    if exc.hint:
        click.echo(f"  hint: {exc.hint}", err=True)
    if obj.get("debug"):
        import traceback

        traceback.print_exception(exc, file=sys.stderr)


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


class PathType(click.Path):
    """click.Path giving a pathlib.Path, without importing pathlib at start-up."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from pathlib import Path

        return Path(super().convert(value, param, ctx))


def cwd() -> Any:
    from pathlib import Path

    return Path.cwd()


def json_option(func: Any) -> Any:
    """`--json`: print data as JSON on stdout (errors too, as {"error": ...})."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
        ctx.find_root().ensure_object(dict)["json"] = value
        return value

    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=remember,
        expose_value=True,
        help="Print the result as JSON.",
    )(func)


def emit_json(data: Any) -> None:
    import json

    click.echo(json.dumps(data, indent=2, default=str))


from coder.cli import (  # noqa: E402  (registration needs `main` defined)
    demo_cmd,
    history,
    mcp_cmd,
    merge_cmd,
    plan_cmd,
    project,
    revert_cmd,
    runs,
    tasks,
)

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
    history.logs,
    history.clean,
    project.config,
    project.doctor,
    mcp_cmd.mcp,
    demo_cmd.demo,
):
    main.add_command(command)
