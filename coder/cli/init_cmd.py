"""`coder init` and `coder config`: preparing a repository and showing the merged settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder import config as config_mod
from coder import yamldoc
from coder.cli.common import cwd, emit_json, json_option
from coder.errors import EXIT_ENVIRONMENT, EnvironmentProblem, InvalidInput
from coder.project import CODER_DIR
from coder.services import doctor as doctor_mod
from coder.services import initialize

if TYPE_CHECKING:
    from pathlib import Path

    from coder.services.testprobe import Probe


@click.command(
    epilog="\b\nExamples:\n  cd my-repo && coder init\n  coder init --example hello-shell"
    "\n  coder run --autonomous -f tasks/hello-shell.yaml"
)
@click.option("--force", is_flag=True, help="Overwrite an existing coder.config.json (or example).")
@click.option(
    "--example",
    "example",
    metavar="NAME",
    help="Also write the example taskfile NAME to tasks/ (`--example list` names them).",
)
@click.option(
    "--no-test-probe",
    is_flag=True,
    help="Do not run the test command once to check that it finds tests.",
)
@json_option
def init(force: bool, example: str | None, no_test_probe: bool, as_json: bool) -> None:
    """Prepare this repo: .coder/ and coder.config.json.

    Runs the test command once (in the sandbox, with a timeout) and warns when it finds no
    tests or cannot run; --no-test-probe skips that.
    """
    from dataclasses import asdict

    if example == "list":
        names = initialize.example_names()
        if as_json:
            emit_json({"examples": names})
        else:
            click.echo("\n".join(names))
        return
    result = initialize.init(cwd(), force=force, probe=not no_test_probe)
    written = initialize.write_example(result.root, example, force=force) if example else None
    if as_json:
        emit_json(
            {
                "root": str(result.root),
                "config": str(result.config_path),
                "config_written": result.config_written,
                "excluded": result.excluded,
                "detected": result.config,
                "example": None if written is None else str(written),
                "tests": None if result.probe is None else asdict(result.probe),
            }
        )
        return
    click.echo(
        f"Prepared {result.root / CODER_DIR}/ "
        f"({'added to' if result.excluded else 'already in'} .git/info/exclude)"
    )
    if result.config_written:
        click.echo(f"Wrote {result.config_path}")
        test_command = result.config.get("test_command")
        click.echo(
            f"  test_command  {test_command}"
            if test_command
            else "  test_command  none detected (set it in coder.config.json for test steps "
            "and --if-green)"
        )
        click.echo("  (everything else keeps its default or your user config: see `coder config`)")
    else:
        click.echo(f"Kept existing {result.config_path} (use --force to rewrite it)")
    if result.probe is not None:
        _echo_probe(result.probe)
    if written is not None:
        rel = written.relative_to(result.root)
        click.echo(f"Wrote {rel}\nNext: `coder run --autonomous -f {rel}`")
    else:
        click.echo(
            "Next: write a taskfile (`coder init --example hello-shell` writes a first one) "
            "and check it with `coder validate -f FILE`."
        )


@click.command(epilog="\b\nExamples:\n  coder trust\n  coder trust --revoke")
@click.option("--revoke", is_flag=True, help="Stop trusting this repository's settings.")
@json_option
def trust(revoke: bool, as_json: bool) -> None:
    """Trust the settings of this repository's coder.config.json that widen what runs.

    allowed_commands, allow_network, env_passthrough, mcp_servers, api_key_env, "sandbox":
    "off", ollama_host or base_url off this machine (in models too), and limits,
    command_timeout or step_timeout above the defaults in a repository's own config are
    ignored, and runs refuse, until you trust them here. Trust is kept in your user config with
    a hash of exactly these values: when they change, coder asks again.
    """
    root = config_mod.find_project_root(cwd())
    if root is None:
        raise EnvironmentProblem(
            f"not a git repository: {cwd()}", hint="run `coder trust` in the repository"
        )
    settings = config_mod.trust(root, revoke=revoke)
    if as_json:
        emit_json(
            {"root": str(root), "trusted": not revoke and bool(settings), "settings": settings}
        )
        return
    if not settings:
        click.echo(f"{root}/{config_mod.PROJECT_FILE} widens nothing; nothing to trust")
    elif revoke:
        click.echo(f"No longer trusting the settings of {root}/{config_mod.PROJECT_FILE}")
    else:
        click.echo(f"Trusted these settings of {root}/{config_mod.PROJECT_FILE}:")
        click.echo(describe_settings(settings))


def describe_settings(settings: dict[str, object]) -> str:
    import json

    return "\n".join(f"  {key:<17} {json.dumps(value)}" for key, value in settings.items())


def ask_trust(as_json: bool) -> None:
    """Before a run at a terminal: offer to trust the repository's untrusted settings (the run
    itself refuses them otherwise, naming them)."""
    import sys

    if as_json or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return
    cfg = config_mod.load(cwd())
    if not cfg.untrusted or cfg.project_root is None:
        return
    click.echo(f"{cfg.project_root}/{config_mod.PROJECT_FILE} widens what runs:", err=True)
    click.echo(describe_settings(dict(cfg.untrusted)), err=True)
    if click.confirm("Trust these settings for this repository?", default=False, err=True):
        config_mod.trust(cfg.project_root)


@click.group(
    name="config",
    invoke_without_command=True,
    epilog="\b\nExamples:\n  coder config\n  coder config set model qwen2.5-coder:14b --user\n"
    "  coder config get model\n  coder config unset max_parallel",
)
@json_option
@click.pass_context
def config(ctx: click.Context, as_json: bool) -> None:
    """Show the merged config and where each value comes from.

    Precedence: flags > environment (OLLAMA_HOST, CODER_MODEL) > project file
    (coder.config.json, or the file named by CODER_CONFIG) > user file
    (~/.config/coder/config.json) > defaults. `set`, `get` and `unset` edit and read one
    setting (in the project file, or the user file with --user).
    """
    if ctx.invoked_subcommand is not None:
        return
    import json

    cfg = config_mod.load()
    if as_json:
        emit_json(
            {
                "values": dict(cfg.values),
                "sources": dict(cfg.sources),
                "files": [str(f) for f in cfg.files],
                "untrusted": dict(cfg.untrusted),
            }
        )
        return
    width = max(map(len, cfg.values))
    for key, value in cfg.values.items():
        click.echo(f"{key:<{width}}  {json.dumps(value):<28}  {cfg.sources[key]}")
        if key in cfg.untrusted:  # in the project file, not applied until `coder trust`
            click.echo(
                f"{'':<{width}}  {json.dumps(cfg.untrusted[key]):<28}  project file, waits "
                "for `coder trust`"
            )


def _config_file(user: bool) -> Path:
    """The file `config set/unset` edit: the user's with --user, else this repository's."""
    if user:
        return config_mod.user_config_path()
    root = config_mod.find_project_root(cwd())
    if root is None:
        raise EnvironmentProblem(
            f"not a git repository: {cwd()}",
            hint="run it in a repository, or pass --user for your own config file",
        )
    return root / config_mod.PROJECT_FILE


_user_option = click.option(
    "--user", is_flag=True, help="Your own config file instead of this repository's."
)


@config.command(name="set")
@click.argument("key")
@click.argument("value")
@_user_option
def config_set(key: str, value: str, user: bool) -> None:
    """Set KEY to VALUE (JSON where it parses: 2, true, ["make"]; else a string)."""
    import json

    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    path = _config_file(user)
    config_mod.edit_file(path, key, parsed)
    click.echo(f"Set {key} = {json.dumps(parsed)} in {path}.")
    if not user and key in config_mod.widening({key: parsed}):
        click.echo("It widens what runs: it applies after `coder trust`.")


@config.command(name="unset")
@click.argument("key")
@_user_option
def config_unset(key: str, user: bool) -> None:
    """Take KEY out of the file: the next layer's value applies again."""
    path = _config_file(user)
    config_mod.edit_file(path, key, remove=True)
    click.echo(f"Removed {key} from {path}.")


@config.command(name="get")
@click.argument("key")
@json_option
def config_get(key: str, as_json: bool) -> None:
    """Print KEY's value (JSON) and where it comes from."""
    import json

    cfg = config_mod.load()
    if key not in cfg.values:
        raise InvalidInput(f"unknown setting {key!r}{yamldoc.did_you_mean(key, list(cfg.values))}")
    if as_json:
        emit_json({"key": key, "value": cfg.values[key], "source": cfg.sources[key]})
        return
    click.echo(f"{json.dumps(cfg.values[key])}  ({cfg.sources[key]})")


def _echo_probe(probe: Probe) -> None:
    """`init`'s line on the test command's one run: a warning (stderr) unless it found tests."""
    if probe.outcome == "ok":
        click.echo(f"Tests: {probe.detail}")
        return
    click.echo(f"{click.style('warning', fg='yellow')}: {probe.detail}", err=True)
    if probe.fix:
        click.echo(f"  fix: {probe.fix}", err=True)


@click.command(epilog="\b\nExample:\n  coder doctor --model qwen2.5-coder:14b")
@click.option("--model", help="Check this model instead of the configured one.")
@click.option(
    "--no-test-probe", is_flag=True, help="Do not run the test command once to find its tests."
)
@json_option
def doctor(model: str | None, no_test_probe: bool, as_json: bool) -> None:
    """Check git, the sandbox, the model server and the model; say how to fix each problem.

    The test command runs once, to check that it finds tests (--no-test-probe skips it).
    Exits 0 when nothing failed (warnings allowed), 3 otherwise.
    """
    checks = doctor_mod.run_checks(cwd(), model=model, probe=not no_test_probe)
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        emit_json({"ok": not failed, "checks": [c.as_dict() for c in checks]})
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            label = {"ok": "ok", "warn": "warn", "fail": "FAIL"}[c.status]
            colour = {"ok": "green", "warn": "yellow", "fail": "red"}[c.status]
            click.echo(f"{click.style(f'{label:<4}', fg=colour)}  {c.name:<{width}}  {c.detail}")
            if c.fix:
                click.echo(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    if failed:
        raise SystemExit(EXIT_ENVIRONMENT)
