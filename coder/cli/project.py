"""`coder init` and `coder config`: preparing a repository and showing the merged settings."""

from __future__ import annotations

import click

from coder.cli.common import cwd, emit_json, json_option


@click.command(epilog="\b\nExample:\n  cd my-repo && coder init")
@click.option("--force", is_flag=True, help="Overwrite an existing coder.config.json.")
@json_option
def init(force: bool, as_json: bool) -> None:
    """Prepare this repo: .coder/ and coder.config.json."""
    from coder import project

    result = project.init(cwd(), force=force)
    if as_json:
        emit_json(
            {
                "root": str(result.root),
                "config": str(result.config_path),
                "config_written": result.config_written,
                "excluded": result.excluded,
                "detected": result.config,
            }
        )
        return
    click.echo(
        f"Prepared {result.root / project.CODER_DIR}/ "
        f"({'added to' if result.excluded else 'already in'} .git/info/exclude)"
    )
    if result.config_written:
        click.echo(f"Wrote {result.config_path}")
        for key in ("model", "ollama_host", "test_command"):
            click.echo(f"  {key:<13} {result.config[key]}")
    else:
        click.echo(f"Kept existing {result.config_path} (use --force to rewrite it)")
    click.echo("Next: write a taskfile (see tasks/) and run `coder validate -f FILE`.")


@click.command(name="config", epilog="\b\nExample:\n  CODER_MODEL=qwen2.5-coder:14b coder config")
@json_option
def config(as_json: bool) -> None:
    """Show the merged config and where each value comes from.

    Precedence: flags > environment (OLLAMA_HOST, CODER_MODEL) > project file
    (coder.config.json, or the file named by CODER_CONFIG) > user file
    (~/.config/coder/config.json) > defaults.
    """
    import json

    from coder import config as config_mod

    cfg = config_mod.load()
    if as_json:
        emit_json(
            {
                "values": dict(cfg.values),
                "sources": dict(cfg.sources),
                "files": [str(f) for f in cfg.files],
            }
        )
        return
    width = max(map(len, cfg.values))
    for key, value in cfg.values.items():
        click.echo(f"{key:<{width}}  {json.dumps(value):<28}  {cfg.sources[key]}")


@click.command(epilog="\b\nExample:\n  coder doctor --model qwen2.5-coder:14b")
@click.option("--model", help="Check this model instead of the configured one.")
@json_option
def doctor(model: str | None, as_json: bool) -> None:
    """Check git, the sandbox, Ollama and the model; say how to fix each problem.

    Exits 0 when nothing failed (warnings allowed), 3 otherwise.
    """
    from coder import doctor as doctor_mod
    from coder.errors import EXIT_ENVIRONMENT

    checks = doctor_mod.run_checks(cwd(), model=model)
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
