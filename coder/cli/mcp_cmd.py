"""`coder mcp serve` and `coder mcp list`: coder as an MCP server, and the MCP servers a run
uses. The `mcp` SDK is imported only when one of these runs (it costs ~0.4 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder import config as config_mod
from coder.cli.common import PathType, cwd, emit_json, json_option
from coder.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from coder.mcp.client import McpBridge
from coder.mcp.server import DEFAULT_PORT
from coder.mcp.server import serve as run_server
from coder.mcp.token import load_token, new_token
from coder.policy.commands import visible_paths

if TYPE_CHECKING:
    from pathlib import Path

SERVE_EPILOG = """\b
Examples:
  coder mcp serve                      # stdio, for an MCP client to launch
  coder mcp serve --root ~/src/app --http --port 3323
"""


@click.group(
    epilog="\b\nExamples:\n  coder mcp serve --root .\n  coder mcp serve --http --port 3323\n"
    "  coder mcp token --new\n  coder mcp list --json"
)
def mcp() -> None:
    """MCP: serve coder's tools, or list the external MCP servers runs use."""


@mcp.command(epilog=SERVE_EPILOG)
@click.option(
    "--root",
    type=PathType(exists=True, file_okay=False),
    help="The repository the tools work on (default: the current repository).",
)
@click.option(
    "--http", is_flag=True, help="Serve streamable HTTP on 127.0.0.1 (at /mcp) instead of stdio."
)
@click.option("--port", type=click.IntRange(1, 65535), help="HTTP port (default 3323).")
def serve(root: Path | None, http: bool, port: int | None) -> None:
    """Serve coder's tools and task control over MCP.

    Tools: fs_*, shell_run, tests_run, git_* and task_validate, task_run, task_status,
    task_stop, on the repository, with the same policy and walls as runs (paths kept inside
    it, the command allowlist, no network, secrets redacted; what a command changes in .git
    is put back and its leftover processes ended after each call). stdio by default; --http
    serves streamable HTTP on 127.0.0.1 only, to requests with the bearer token it prints
    (`coder mcp token`)."""
    if port is not None and not http:
        raise click.UsageError("--port needs --http")
    if root is None:
        root = config_mod.find_project_root(cwd())
        if root is None:
            raise EnvironmentProblem(  # exit 3, as every command outside a repository
                f"not a git repository: {cwd()}", hint="run it in a repository, or pass --root DIR"
            )
    run_server(root.resolve(), http=http, port=port or DEFAULT_PORT)


@mcp.command(epilog="\b\nExamples:\n  coder mcp token\n  coder mcp token --new")
@click.option("--new", "rotate", is_flag=True, help="Replace the token; the old one stops working.")
def token(rotate: bool) -> None:
    """Print the bearer token `coder mcp serve --http` requires.

    Generated on first use and kept in the user's config dir (mode 0600); one token for every
    repository served. --new replaces it: running servers refuse the old one at once."""
    click.echo(new_token() if rotate else load_token())


@mcp.command("list")
@json_option
def list_servers(as_json: bool) -> None:
    """List the configured MCP servers and their tools.

    Starts each server of `mcp_servers` in coder.config.json and lists its tools as a run
    offers them to the model (`<server>__<tool>`). Exits 3 when a server cannot be started."""
    cfg = config_mod.load(cwd())
    config_mod.require_trusted(cfg)  # starting a repository's servers runs its programs
    servers = list(cfg.mcp_servers)
    if not servers:
        if as_json:
            emit_json([])
        else:
            click.echo(
                "No MCP servers configured; add them under `mcp_servers` in coder.config.json."
            )
        return

    sandbox = cfg.sandbox != "off"
    visible = visible_paths(cfg.visible_paths)
    with McpBridge(
        servers, cwd=cfg.project_root or cwd(), sandbox=sandbox, visible=visible
    ) as bridge:
        statuses = bridge.servers
    if as_json:
        emit_json([s.as_dict() for s in statuses])
    else:
        for status in statuses:
            command = " ".join([status.command, *status.args])
            state = f"{len(status.tools)} tools" if status.ok else f"FAILED: {status.error}"
            click.echo(f"{status.name}  ({command})  {state}")
            for tool in status.tools:
                summary = tool.description.split("] ", 1)[-1]
                click.echo(f"  {tool.name:<30} {summary[:70]}")
    if not all(s.ok for s in statuses):
        raise SystemExit(EXIT_ENVIRONMENT)
