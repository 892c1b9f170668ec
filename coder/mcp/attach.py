"""A run's MCP servers attached to its agent session: started (confined to the worktree unless
the sandbox is off) before any step runs, their tools added to the session's registry (the
tool list is part of the run-wide prompt prefix), problems logged as run warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.mcp.client import McpBridge
from coder.policy.commands import visible_paths
from coder.tools.registry import Registry

if TYPE_CHECKING:
    from coder.agent.session import AgentSession, EventSink
    from coder.config import Config
    from coder.redact import Redactor


def extend_registry(base: Registry, bridge: McpBridge) -> Registry:
    """A new registry: `base`'s tools then the external ones (the cached default registry is
    never changed)."""
    registry = Registry()
    for tool in base:
        registry.register(tool)
    for tool in bridge.registry_tools():
        registry.register(tool)
    return registry


def attach(
    agent: AgentSession,
    servers: Sequence[Mapping[str, Any]],
    *,
    cwd: Path,
    log: EventSink,
    redactor: Redactor | None = None,
    sandbox: bool = True,
    visible: Sequence[str] = (),
) -> McpBridge:
    """Start the run's MCP servers (confined to the worktree unless `sandbox` is off) and add
    their tools to the agent session, before any step runs (the tool list is part of the
    run-wide prefix). Problems go to the event log."""
    # As run.warning (with the MCP event as `kind`), so the console shows them too.
    bridge = McpBridge(
        servers,
        cwd=cwd,
        warn=lambda kind, f: log.warning("run.warning", kind=kind, **f),
        sandbox=sandbox,
        visible=visible,
    )
    if redactor is not None:
        redactor.add(*bridge.secrets())
    agent.registry = extend_registry(agent.registry, bridge)
    agent.tools = agent.registry.definitions()
    for status in bridge.servers:
        if status.ok:
            log.info("mcp.server_ready", server=status.name, tools=[t.name for t in status.tools])
    return bridge


def attach_configured(
    agent: AgentSession,
    cfg: Config,
    *,
    cwd: Path,
    log: EventSink,
    redactor: Redactor | None = None,
) -> McpBridge | None:
    """`RunOptions.attach_tools` for the CLI: the config's `mcp_servers`, if it lists any."""
    servers = cfg.mcp_servers
    if not servers:
        return None

    sandbox = cfg.sandbox != "off"
    visible = visible_paths(cfg.visible_paths)
    return attach(
        agent, servers, cwd=cwd, log=log, redactor=redactor, sandbox=sandbox, visible=visible
    )
