"""What every command shares: the error edge, `--json`, path options.

Kept apart from `coder/cli/__init__.py` (which registers the commands) so that command modules
import it without an import cycle.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

if TYPE_CHECKING:
    from coder.errors import CoderError

_F = TypeVar("_F", bound=Callable[..., Any])

EPILOG = """\b
Exit codes: 0 ok, 1 the run failed, 2 bad usage or invalid input,
3 environment problem (no git repo, model server unreachable, model missing), 130 interrupted.

\b
Examples:
  coder init
  coder validate -f tasks/hello-shell.yaml
  coder run --autonomous -f tasks/hello-shell.yaml
  coder status

See README.md for the quickstart and docs/README.md for the reference.
"""

# Where each command is documented, relative to coder's repository: the last line of the
# command's --help (tests/test_readme.py checks that each leads to a heading). A subcommand
# (`mcp serve`) without a row of its own takes its group's.
DOCS_PAGES: dict[str, str] = {
    "init": "README.md#five-minutes-on-your-own-repository",
    "plan": "docs/journey.md#from-a-spec-to-a-green-branch-coder-plan",
    "validate": "docs/taskfile.md#taskfile-reference",
    "show": "docs/commands.md#the-dag-as-a-picture",
    "run": "docs/commands.md#command-reference",
    "resume": "docs/commands.md#command-reference",
    "stop": "docs/commands.md#command-reference",
    "worker": "docs/journey.md#runs-across-machines",
    "status": "docs/commands.md#command-reference",
    "merge": "docs/journey.md#accepting-a-run-coder-merge",
    "revert": "docs/journey.md#undoing-steps-coder-revert",
    "fork": "docs/journey.md#trying-a-step-another-way-coder-fork",
    "compare": "docs/journey.md#trying-a-step-another-way-coder-fork",
    "push": "docs/journey.md#pushing-for-review-coder-push",
    "export": "docs/journey.md#running-on-github-actions-or-argo",
    "diff": "docs/commands.md#command-reference",
    "report": "docs/journey.md#reviewing-a-run-coder-report",
    "logs": "docs/commands.md#command-reference",
    "clean": "docs/journey.md#tearing-down",
    "config": "docs/configuration.md#configuration-reference",
    "trust": "docs/safety.md#what-is-contained",
    "doctor": "docs/troubleshooting.md#troubleshooting",
    "mcp": "docs/mcp.md#mcp",
    "mcp serve": "docs/mcp.md#use-coder-from-an-mcp-client-coder-mcp-serve",
    "mcp list": "docs/mcp.md#give-runs-the-tools-of-external-mcp-servers-mcp_servers",
    "completion": "docs/commands.md#command-reference",
    "demo": "README.md#see-it-work-in-a-minute-coder-demo",
}


def with_docs_link(command: click.Command, name: str, page: str | None = None) -> None:
    """End `command`'s help (and its subcommands') with the page that documents it."""
    page = DOCS_PAGES.get(name, page)
    line = f"\b\nSee {docs_location(page)}" if page else ""  # \b: never wrapped
    if page and line not in (command.epilog or ""):
        command.epilog = f"{command.epilog}\n\n{line}" if command.epilog else line
    for sub_name, sub in getattr(command, "commands", {}).items():
        with_docs_link(sub, f"{name} {sub_name}", page)


def docs_location(page: str) -> str:
    """Where `page` (`docs/journey.md#anchor`, `README.md#...`) is on this machine: the copy
    the wheel ships (`coder/_docs/`), else this source checkout's; as given when neither is
    there."""
    import os

    name, _, anchor = page.partition("#")
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # coder/
    for candidate in (os.path.join(package, "_docs", name), os.path.join(package, "..", name)):
        if os.path.isfile(candidate):
            return os.path.normpath(candidate) + (f"#{anchor}" if anchor else "")
    return page


def help_width() -> int:
    """The width click gives help (the terminal's less 2, within 50..78), found as
    `shutil.get_terminal_size` finds it, without importing shutil: it and the compressors it
    loads were a tenth of `coder --help` (bench/startup.py)."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return max(min(columns or 80, 80) - 2, 50)


class CoderGroup(click.Group):
    """The error edge for every command, and commands loaded when first used.

    `lazy_commands` maps a name to (module in coder.cli, function, help line); the listing in
    `--help` comes from the table, so it imports no command module."""

    def __init__(
        self, *args: Any, lazy_commands: dict[str, tuple[str, str, str]] | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.lazy_commands = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy_commands)  # the journey order, not alphabetical

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            import importlib

            module, function, _help = self.lazy_commands[cmd_name]
            command = getattr(importlib.import_module(f"coder.cli.{module}"), function)
            with_docs_link(command, cmd_name)
            self.add_command(command)
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = click.utils.make_str(args[0]) if args else ""
        if args and self.get_command(ctx, name) is None and not name.startswith("-"):
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            ctx.fail(f"No such command '{name}'.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        # cut as Click cuts a command's own help (a stand-in command: no import of the real one)
        rows = [
            (n, click.Command(n, help=self.lazy_commands[n][2]).get_short_help_str(limit))
            for n in names
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoisted(args))

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        json_wanted = "--json" in args  # before parsing: a usage error may stop it early
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            if json_wanted:
                _echo_json_error(exc.format_message(), _usage_hint(exc), exc.exit_code)
            raise
        ctx.meta["coder.json_wanted"] = json_wanted
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        from coder.interrupts import interrupting

        try:
            with interrupting():  # SIGTERM and a hang-up end a command as Ctrl-C does
                return super().invoke(ctx)
        except click.ClickException as exc:  # usage errors: Click prints them on stderr
            if ctx.meta.get("coder.json_wanted") or ctx.ensure_object(dict).get("json"):
                _echo_json_error(exc.format_message(), _usage_hint(exc), exc.exit_code)
            raise
        except (KeyboardInterrupt, click.Abort):  # click.prompt's Ctrl-C is Abort: the same
            click.echo("coder: interrupted", err=True)
            ctx.exit(_exit_interrupted())
        except Exception as exc:  # coder's own errors, a full disk, a link under .coder/: not bugs
            problem = expected_problem(exc)
            if problem is None:
                raise
            report_error(ctx, problem)
            ctx.exit(problem.exit_code)


_GLOBAL_FLAGS = ("--debug",)
_GLOBAL_OPTIONS = ("--color",)  # each takes a value


def hoisted(args: list[str]) -> list[str]:
    """The line with coder's own options first, wherever they were typed (`coder run --debug
    -f t.yaml` as `coder --debug run -f t.yaml`); nothing after `--` is moved."""
    front: list[str] = []
    rest: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--":
            rest += [word, *words]
        elif word in _GLOBAL_FLAGS or word.startswith(tuple(f"{o}=" for o in _GLOBAL_OPTIONS)):
            front.append(word)
        elif word in _GLOBAL_OPTIONS:
            value = next(words, None)
            front += [word] if value is None else [word, value]
        else:
            rest.append(word)
    return front + rest


def colour_setting(choice: str) -> bool | None:
    """Click's `color` for `--color CHOICE`: None lets click colour only a terminal;
    `NO_COLOR` (any value but empty, as no-color.org says) turns colour off unless `always`."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return None


def expected_problem(exc: Exception) -> CoderError | None:
    """What `exc` is to the user when it is not a bug: coder's own error, a link in the way
    under `.coder/`, a full disk; None for anything else (a bug: its traceback is shown).

    coder.errors is imported here, when a command fails, not with this module: it and the
    dataclasses it loads were a fifth of what `coder --help` and a first `coder status` add
    to importing click (bench/startup.py). A CoderError raised has loaded it already."""
    from coder.errors import CoderError, LinkInTheWay

    if isinstance(exc, CoderError):
        return exc
    if isinstance(exc, LinkInTheWay):
        return exc.problem()
    return disk_full(exc) if isinstance(exc, OSError) else None


def _exit_interrupted() -> int:
    from coder.errors import EXIT_INTERRUPTED  # as in expected_problem: only when it is needed

    return EXIT_INTERRUPTED


def disk_full(exc: OSError) -> CoderError | None:
    """The environment problem a full disk (or quota) is, naming the file; None otherwise."""
    import errno

    from coder.errors import EnvironmentProblem

    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = f": {exc.filename}" if exc.filename else ""
    return EnvironmentProblem(
        f"{exc.strerror or exc}{where}",
        hint="free some disk space, then run the command again (`coder resume -t ID` "
        "continues a run)",
    )


def _usage_hint(exc: click.ClickException) -> str | None:
    ctx = getattr(exc, "ctx", None)
    return f"see `{ctx.command_path} --help`" if ctx is not None else None


def _echo_json_error(message: str, hint: str | None, exit_code: int) -> None:
    """Under --json every error is one JSON object on stdout (and still a line on stderr)."""
    import json

    click.echo(json.dumps({"error": message, "hint": hint, "exit_code": exit_code}))


def report_error(ctx: click.Context, exc: CoderError) -> None:
    obj = ctx.ensure_object(dict)
    from coder.display import escaped  # a message may name a file or quote a command's output

    if obj.get("json"):
        _echo_json_error(exc.message, exc.hint, exc.exit_code)
    what = "interrupted" if exc.exit_code == _exit_interrupted() else "error"
    click.echo(f"coder: {what}: {escaped(exc.message)}", err=True)
    if exc.hint:
        click.echo(f"  hint: {escaped(exc.hint)}", err=True)
    if obj.get("debug"):
        import traceback

        traceback.print_exception(exc, file=sys.stderr)


class PathType(click.Path):
    """click.Path giving a pathlib.Path, without importing pathlib at start-up."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import os
        from pathlib import Path

        return Path(os.fsdecode(super().convert(value, param, ctx)))


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


def run_option(*, only: bool = True, required: bool = True) -> Callable[[_F], _F]:
    """`-t ID` and `--last`: the run a command is about, resolved by `coder.run.naming`
    (an id or a unique start of one; `--last` the newest; with `only`, no option names the
    project's only run). The command receives the whole id as `task_id` (None when not
    `required` and neither option is given)."""

    def decorate(func: _F) -> _F:
        return cast(_F, _with_run_option(func, only, required))

    return decorate


def _with_run_option(func: Callable[..., Any], only: bool, required: bool) -> Any:
    import functools

    @functools.wraps(func)
    def resolved(
        *args: Any, task_id: str | None, run: str | None, last: bool, **kwargs: Any
    ) -> Any:
        if run is not None and task_id not in (None, run):
            raise click.UsageError(f"two runs named: {run} and -t {task_id}; give one")
        task_id = task_id if run is None else run  # `coder show ID`, as gh and git take it
        if task_id is not None or last or required:
            task_id = resolve_run(task_id, last=last, only=only)
        return func(*args, task_id=task_id, **kwargs)

    what = "an id or its start" + ("; the only run when there is one" if only else "")
    resolved = click.option("--last", is_flag=True, help="The newest run.")(resolved)
    resolved = click.argument("run", required=False, metavar="[ID]", shell_complete=complete_runs)(
        resolved
    )
    return click.option(
        "-t", "--task", "task_id", help=f"The run ({what}; or as ID).", shell_complete=complete_runs
    )(resolved)


def resolve_run(given: str | None, *, last: bool = False, only: bool = True) -> str:
    """The whole id of the run meant (see `run_option`); said on stderr when it was not
    typed out, so a command never acts on a run the user did not see named."""
    from coder.run.naming import which_run

    task_id = which_run(runs_dir(), given, last=last, only=only)
    if task_id != given and not (click.get_current_context().find_root().obj or {}).get("json"):
        click.echo(f"Run {task_id}", err=True)
    return task_id


def runs_dir() -> Any:
    """This repository's `.coder/`, from the current directory (a linked worktree's too)."""
    from coder import project

    return project.coder_dir(project.main_root(cwd()))


def no_runs_yet() -> bool:
    """Whether this repository surely has no run: the nearest `.git` at or above the current
    directory is a directory (a main checkout, as `project.main_root` finds it), and its
    `.coder/` holds no manifest or checkpoint. With os.path alone: pathlib, json and the
    state's classes were a quarter of `coder status` (bench/startup.py). False whenever in
    doubt (a linked worktree, no repository, `.coder` a link or not a directory, an unreadable
    folder): the full path answers then, naming any problem."""
    try:
        here = os.getcwd()
    except OSError:
        return False
    while not os.path.isdir(os.path.join(here, ".git")):
        parent = os.path.dirname(here)
        if os.path.lexists(os.path.join(here, ".git")) or parent == here:
            return False
        here = parent
    base = os.path.join(here, ".coder")
    if os.path.islink(base) or os.path.lexists(base) and not os.path.isdir(base):
        return False
    for sub in ("tasks", "state"):  # manifests, checkpoints: `*.json` (run/manifest.run_ids)
        try:
            with os.scandir(os.path.join(base, sub)) as entries:
                if any(entry.name.endswith(".json") for entry in entries):
                    return False
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """`-t`'s completions: the project's run ids that start with what is typed."""
    from click.shell_completion import CompletionItem

    from coder.run.manifest import run_ids

    try:
        found = run_ids(runs_dir())
    except Exception:  # noqa: BLE001 - completing must never print a traceback into a shell
        return []
    return [CompletionItem(task_id) for task_id in found if task_id.startswith(incomplete)]


def complete_steps(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """`--step`/`--to-step`'s completions: the step ids of the run `-t` names."""
    from click.shell_completion import CompletionItem

    from coder.run.manifest import load_manifest
    from coder.run.naming import which_run

    try:
        coder_dir = runs_dir()
        steps = load_manifest(coder_dir, which_run(coder_dir, ctx.params.get("task_id"))).step_ids
    except Exception:  # noqa: BLE001 - as above
        return []
    return [CompletionItem(step) for step in steps if step.startswith(incomplete)]


def fitted(rows: Sequence[Sequence[str]]) -> str:
    """A table as text: each column as wide as its widest cell, the last one left free."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)
