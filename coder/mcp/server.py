"""`coder mcp serve`: the tool registry and task control as a real MCP server.

Built on the SDK's low-level `Server`, whose `tools/list` and `tools/call` handlers take the
registry's own names, descriptions and JSON schemas as they are (the high-level MCPServer
derives schemas from Python signatures, which would mean a second copy of every schema).
Every call goes through `Registry.call` with one `ToolContext` built from the repository's
config, so an MCP client gets exactly the policy of a run: paths guarded, the command allowlist,
no network, secrets redacted; and inside the walls of a run's step (coder.mcp.walls): `.git`
put back and leftover processes ended after each call. A refusal is a tool error (`isError`)
carrying the message (and hint) a user of coder sees. The HTTP transport listens on 127.0.0.1
only and answers only requests with the user's bearer token (coder.mcp.token).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from coder import __version__, project
from coder import config as config_mod
from coder.errors import EnvironmentProblem
from coder.git import repository
from coder.mcp.tasks import TASK_TOOLS
from coder.mcp.token import RequireToken, how_to_connect, load_token, token_path
from coder.mcp.walls import Walls
from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.run.secrets import known_secrets
from coder.schemas import JsonSchema
from coder.tools.base import ToolContext, ToolResult
from coder.tools.codeindex import code_settings
from coder.tools.registry import Registry, default_registry

HOST = "127.0.0.1"  # never another interface: the tools write files and run commands
DEFAULT_PORT = 3323


def server_registry() -> Registry:
    """The default tools except the agent loop's `step_complete`, then task control."""
    registry = Registry()
    for tool in default_registry():
        if not tool.terminal:
            registry.register(tool)
    for tool in TASK_TOOLS:
        registry.register(tool)
    return registry


def tool_context(root: Path) -> ToolContext:
    """The context of every call: the repository's config, as a run would use it."""
    cfg = config_mod.load(root)
    # Before any command runs in the checkout, `.coder/` is made (a link there refused): the
    # sandbox keeps it read-only to commands only if it is there (writes.kept_readonly), and
    # one could otherwise plant a link where coder then writes.
    coder_dir = project.ensure_coder_dir(root)
    repository.ensure_excluded(repository.open_repo(root), f"/{project.CODER_DIR}/")
    # what a run would redact: `.env*` values, secret-named and passed-through variables
    redactor = Redactor(known_secrets([root], cfg.values))
    return ToolContext(
        root=root,
        policy=Policy.from_config(cfg.values),
        redactor=redactor,
        config=cfg,
        code=code_settings(cfg, coder_dir / "cache", redactor),
    )


def to_call_result(result: ToolResult) -> Any:
    from mcp import types

    text = result.content
    if not result.ok and result.hint:
        text += f"\nhint: {result.hint}"
    data = {k: v for k, v in result.data.items() if k != "traceback"}  # coder's, not the client's
    structured = json.loads(json.dumps(data, default=str)) if data else None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=not result.ok,
    )


def build_server(root: Path) -> Any:
    """The low-level MCP server for the repository at `root`."""
    import anyio.to_thread
    from mcp import types
    from mcp.server.lowlevel import Server

    registry = server_registry()
    walls = Walls(registry, tool_context(root), unguarded=[t.name for t in TASK_TOOLS])
    listed = [
        types.Tool(
            name=t.name,
            description=t.description,
            input_schema=t.parameters,
            annotations=types.ToolAnnotations(read_only_hint=t.read_only),
        )
        for t in registry
    ]

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(_ctx: Any, params: Any) -> Any:
        # Tools block (commands, git, waiting for a run to start): keep the loop free.
        result = await anyio.to_thread.run_sync(walls.call, params.name, params.arguments or {})
        return to_call_result(result)

    def input_schema(name: str) -> JsonSchema | None:
        tool = registry.get(name)
        return None if tool is None else tool.parameters

    return Server(
        "coder",
        version=__version__,
        instructions=(
            f"coder's tools on the repository at {root}. Paths are relative to it. "
            "The policy of coder runs applies: paths stay inside the repository, only "
            "allowed commands run, without network, and secrets are redacted; commands "
            "cannot change .git (commits, refs, hooks, git config are put back). "
            "task_validate/task_run/task_status/task_stop drive coder runs."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )


def serve(root: Path, *, http: bool = False, port: int = DEFAULT_PORT) -> None:
    """Serve until stdin closes (stdio) or until interrupted (HTTP)."""
    import anyio

    server = build_server(root)
    if http:
        _check_port(port)
        url = f"http://{HOST}:{port}/mcp"
        print(f"coder mcp: serving {root} at {url}", file=sys.stderr)
        print(how_to_connect(url, load_token()), file=sys.stderr, flush=True)
        anyio.run(_serve_http, server, port)
    else:
        anyio.run(_serve_stdio, server)


async def _serve_stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(server: Any, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host=HOST)  # also turns on DNS-rebinding protection
    guarded = RequireToken(app, token_path())  # before anything else sees the request
    config = uvicorn.Config(guarded, host=HOST, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot listen on {HOST}:{port}: {exc.strerror}", hint="pass another --port"
            ) from None
