"""MCP client: the tools of external MCP servers (`mcp_servers` in coder.config.json) for a run.

The executor is synchronous and the SDK is async, so `McpBridge` runs one asyncio loop in a
background thread. Each server lives in a task of that loop that owns its connection (the SDK's
context managers must be entered and left by the same task) and waits for `close()`; calls are
sent to the loop with `run_coroutine_threadsafe` and waited for with a timeout.

A server that cannot start, or dies later, is a warning, not a failure: its tools answer with an
error result and the run goes on. The tool list is fixed when the run starts (it is part of the
byte-stable prompt prefix), so a dead server's tools stay listed and say why they cannot run.

Tools are offered as `<server>__<tool>` with the input schema flattened (coder.mcp.flatten);
arguments are checked against the server's original schema before they are forwarded.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from coder import __version__
from coder.errors import EnvironmentProblem
from coder.mcp.flatten import argument_problem, flatten_schema
from coder.policy.launch import launcher_argv
from coder.policy.proctrees import Tree
from coder.tools.base import Tool, ToolContext, ToolResult
from coder.tools.registry import NAME_RE

if TYPE_CHECKING:
    from coder.schemas import JsonSchema

SEPARATOR = "__"  # <server>__<tool>; built-in tool names never contain it
STARTUP_TIMEOUT = 30.0  # seconds for a server to start, initialize and list its tools
CALL_TIMEOUT = 120.0  # default per call; a step's timeout lowers it
SHUTDOWN_TIMEOUT = 10.0
MAX_RESULT_CHARS = 30_000
MAX_DESCRIPTION_CHARS = 2_000
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)

Warn = Callable[[str, dict[str, Any]], None]  # (event, fields)


@dataclass(frozen=True)
class ExternalTool:
    name: str  # as the model sees it: <server>__<tool>
    server: str
    tool: str  # the server's own name
    description: str
    input_schema: JsonSchema  # the server's, used for validation
    parameters: JsonSchema  # flattened, offered to the model


@dataclass
class ServerStatus:
    name: str
    command: str
    args: list[str]
    ok: bool = False
    error: str | None = None
    # the server's own listing (mcp Tool objects) once started, then the ExternalTools offered
    tools: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "args": self.args,
            "ok": self.ok,
            "error": self.error,
            "tools": [
                {
                    "name": t.name,
                    "tool": t.tool,
                    "description": t.description,
                    "input_schema": t.input_schema,
                    "parameters": t.parameters,
                }
                for t in self.tools
            ],
        }


@dataclass
class _Connection:
    spec: Mapping[str, Any]
    status: ServerStatus
    errlog: TextIO
    client: Any = None
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    listed: asyncio.Future[list[Any]] | None = None
    dead: str | None = None  # why it cannot be called any more
    tree: Tree | None = None  # its process tree, when confined (coder.policy.proctrees)

    def stderr_tail(self, lines: int = 3) -> str:
        try:  # pread: the server shares the file offset; do not move it
            fd = self.errlog.fileno()
            size = os.fstat(fd).st_size
            text = os.pread(fd, min(size, 4000), max(0, size - 4000)).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail)


class McpBridge:
    """Started external MCP servers and a synchronous way to call their tools."""

    def __init__(
        self,
        servers: Sequence[Mapping[str, Any]],
        *,
        cwd: Path,
        startup_timeout: float = STARTUP_TIMEOUT,
        warn: Warn | None = None,
        sandbox: bool = True,
        visible: Sequence[str] = (),
    ) -> None:
        self.cwd = cwd
        self.sandbox = sandbox  # each server confined to `cwd` like a command (policy.confine)
        self.visible = tuple(visible)  # the config's `visible_paths`: shown to each server
        self.warnings: list[str] = []
        self._warn_sink = warn
        self._conns: dict[str, _Connection] = {}
        self.tools: dict[str, ExternalTool] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="coder-mcp-client", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a run that fails before its end still stops the servers
        for spec in servers:
            name = str(spec["name"])
            status = ServerStatus(
                name, str(spec["command"]), [str(a) for a in spec.get("args") or []]
            )
            if name in self._conns:
                self._warn(
                    "mcp.server_failed",
                    f"MCP server {name!r} is listed twice in "
                    "mcp_servers; the second entry is ignored",
                    server=name,
                )
                continue
            self._conns[name] = _Connection(
                spec,
                status,
                tempfile.TemporaryFile("w+", encoding="utf-8", prefix=f"coder-mcp-{name}-"),
            )
        try:
            asyncio.run_coroutine_threadsafe(self._start_all(startup_timeout), self._loop).result()
        except BaseException:
            self.close()
            raise
        for conn in self._conns.values():
            if conn.status.ok:
                self._adopt(conn)

    # ----------------------------------------------------------------------- public

    @property
    def servers(self) -> list[ServerStatus]:
        return [c.status for c in self._conns.values()]

    def registry_tools(self) -> list[Tool]:
        """The external tools as registry tools (read_only=False: their effects are unknown)."""
        return [
            Tool(
                name=t.name,
                description=t.description,
                parameters=t.parameters,
                handler=self._handler(t.name),
                read_only=False,
            )
            for t in self.tools.values()
        ]

    def secrets(self) -> list[str]:
        """Secret-looking values handed to the servers' environments (API keys, tokens), to be
        redacted from what the servers return before the model or the logs see it."""
        return [
            str(v)
            for c in self._conns.values()
            for k, v in (c.spec.get("env") or {}).items()
            if _SECRET_NAME.search(str(k))
        ]

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        timeout: float = CALL_TIMEOUT,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        """Call an external tool by its namespaced name; every failure is an error result."""
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult.error(
                f"unknown external tool {name!r}",
                hint=f"external tools: {', '.join(self.tools) or 'none'}",
            )
        conn = self._conns[tool.server]
        if conn.dead is not None or conn.client is None or self._closed:
            return ToolResult.error(
                f"MCP server {tool.server} is not running ({conn.dead or 'closed'}); "
                f"{name} is unavailable",
                hint="carry on with the other tools",
            )
        problem = argument_problem(tool.input_schema, arguments, name)
        if problem:
            return ToolResult.error(
                problem, hint=_signature(tool), data={"server": tool.server, "forwarded": False}
            )
        future = asyncio.run_coroutine_threadsafe(
            conn.client.call_tool(tool.tool, dict(arguments), read_timeout_seconds=timeout),
            self._loop,
        )
        deadline = time.monotonic() + timeout + 5  # the SDK times out first; this is a backstop
        while not future.done():
            concurrent.futures.wait([future], timeout=0.1)
            if cancel is not None and cancel.is_set() and not future.done():
                future.cancel()
                return ToolResult.error(
                    f"the step is being stopped; the call to {name} was abandoned"
                )
            if time.monotonic() > deadline and not future.done():
                future.cancel()
                return _timed_out(name, timeout)
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            return ToolResult.error(f"the call to {name} was cancelled")
        except Exception as exc:  # noqa: BLE001 - whatever the SDK raises becomes data
            return self._call_failed(conn, tool, exc, timeout)
        return _to_result(tool, result)

    def close(self) -> None:
        """Stop every server (stdin closed, then SIGTERM/SIGKILL by the SDK) and the loop, and
        end every process they started (coder.policy.proctrees)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        trees = [conn.tree for conn in self._conns.values() if conn.tree is not None]
        for tree in trees:  # while the servers run: a subreaper tree is found below its server
            self._end_tree(tree.end_new)
        if self._thread.is_alive():
            if self._loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop).result(
                        timeout=SHUTDOWN_TIMEOUT + 5
                    )
                except (concurrent.futures.TimeoutError, RuntimeError):
                    pass
            self._loop.call_soon_threadsafe(self._loop.stop)  # queued if not running yet
            self._thread.join(timeout=SHUTDOWN_TIMEOUT)
        for tree in trees:
            self._end_tree(tree.close)
        for conn in self._conns.values():
            conn.errlog.close()

    def __enter__(self) -> McpBridge:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- the loop thread

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            try:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.run_until_complete(self._loop.shutdown_default_executor())
            finally:
                self._loop.close()

    async def _start_all(self, timeout: float) -> None:
        conns = list(self._conns.values())
        for conn in conns:
            conn.stop = asyncio.Event()
            conn.listed = self._loop.create_future()
            conn.task = asyncio.create_task(self._own(conn), name=f"mcp-{conn.status.name}")
        if not conns:
            return
        await asyncio.wait([c.listed for c in conns if c.listed], timeout=timeout)
        for conn in conns:
            assert conn.listed is not None and conn.task is not None
            if conn.listed.done():
                exc = conn.listed.exception()
                if exc is None:
                    conn.status.ok = True
                    conn.status.tools = conn.listed.result()
                else:
                    self._failed(conn, _reason(exc, conn))
                continue
            conn.task.cancel()
            await asyncio.gather(conn.task, return_exceptions=True)
            tail = conn.stderr_tail()
            self._failed(
                conn,
                f"it did not answer within {timeout:.0f}s" + (f" (stderr: {tail})" if tail else ""),
            )

    async def _own(self, conn: _Connection) -> None:
        """Open the connection, list the tools, hold it until close()."""
        from mcp import Client, stdio_client
        from mcp.types import Implementation

        assert conn.listed is not None and conn.stop is not None
        try:
            params = self._params(conn)
            async with Client(
                stdio_client(params, errlog=conn.errlog),
                cache=None,
                client_info=Implementation(name="coder", version=__version__),
            ) as client:
                tools: list[Any] = []
                cursor = None
                while True:  # the listing may come in pages
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                conn.client = client
                if conn.tree is not None:
                    conn.tree.ready()  # what it started until now is its own
                if not conn.listed.done():
                    conn.listed.set_result(tools)
                await conn.stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported, never raised out of the loop
            if not conn.listed.done():
                conn.listed.set_exception(_leaf(exc))
            elif conn.dead is None and not self._closed:
                conn.dead = _reason(exc, conn)

    def _params(self, conn: _Connection) -> Any:
        """How to start a server: confined like a command, in a process tree of its own
        (`conn.tree`), unless the sandbox is off (network only when its entry allows it)."""
        from mcp import StdioServerParameters

        spec = conn.spec
        argv = [str(spec["command"]), *(str(a) for a in spec.get("args") or [])]
        if self.sandbox:
            program = str(self.cwd / argv[0]) if "/" in argv[0] else argv[0]
            if shutil.which(program) is None:
                raise FileNotFoundError(argv[0])  # as starting it unconfined would say
            conn.tree = Tree(self.cwd)  # closed by close(), whatever happens from here
            network = bool(spec.get("allow_network"))
            argv = launcher_argv(
                argv, self.cwd, network=network, visible=self.visible, tree=conn.tree.spec
            )
        return StdioServerParameters(
            command=argv[0],
            args=argv[1:],
            env={str(k): str(v) for k, v in (spec.get("env") or {}).items()} or None,
            cwd=str(self.cwd),
        )

    async def _stop_all(self) -> None:
        tasks = []
        for conn in self._conns.values():
            if conn.stop is not None:
                conn.stop.set()
            if conn.task is not None and not conn.task.done():
                tasks.append(conn.task)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ----------------------------------------------------------------------- helpers

    def _adopt(self, conn: _Connection) -> None:
        """Name, filter (allow list) and flatten a started server's tools."""
        server = conn.status.name
        allow = conn.spec.get("allow")
        offered = []
        for t in conn.status.tools:
            name = _namespaced(server, t.name)
            if allow is not None and t.name not in allow and name not in allow:
                continue
            if not NAME_RE.match(name):
                self._warn(
                    "mcp.tool_skipped",
                    f"MCP server {server}: tool {t.name!r} has no "
                    f"usable name ({name!r}); it is not offered",
                    server=server,
                )
                continue
            if name in self.tools:
                self._warn(
                    "mcp.tool_skipped",
                    f"MCP server {server}: tool {t.name!r} clashes with {name}; it is not offered",
                    server=server,
                )
                continue
            schema = dict(t.input_schema or {})
            description = " ".join((t.description or t.title or t.name).split())
            self.tools[name] = ExternalTool(
                name=name,
                server=server,
                tool=t.name,
                input_schema=schema,
                description=_clip(f"[MCP server {server}] {description}", MAX_DESCRIPTION_CHARS),
                parameters=flatten_schema(schema),
            )
            offered.append(self.tools[name])
        if allow is not None:
            known = {t.name for t in conn.status.tools} | {
                _namespaced(server, t.name) for t in conn.status.tools
            }
            for missing in [a for a in allow if a not in known]:
                self._warn(
                    "mcp.allow_unknown",
                    f"MCP server {server} has no tool {missing!r} (named in its allow list)",
                    server=server,
                )
        conn.status.tools = offered

    def _handler(self, name: str) -> Callable[[ToolContext, dict[str, Any]], ToolResult]:
        def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
            timeout = float(min(ctx.command_timeout or CALL_TIMEOUT, CALL_TIMEOUT))
            return self.call(name, args, timeout=timeout, cancel=ctx.cancel)

        return handler

    def _call_failed(
        self, conn: _Connection, tool: ExternalTool, exc: BaseException, timeout: float
    ) -> ToolResult:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        exc = _leaf(exc)
        if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:
            return _timed_out(tool.name, timeout)
        if (
            isinstance(exc, MCPError)
            and exc.code == CONNECTION_CLOSED
            or isinstance(exc, (OSError, EOFError))
        ):
            tail = conn.stderr_tail()
            conn.dead = f"it exited during a call to {tool.tool}" + (
                f" (stderr: {tail})" if tail else ""
            )
            self._warn(
                "mcp.server_died",
                f"MCP server {tool.server} died ({conn.dead}); its "
                "tools answer with an error for the rest of the run",
                server=tool.server,
            )
            return ToolResult.error(
                f"MCP server {tool.server} died during the call to "
                f"{tool.name}; its tools are no longer available",
                hint="carry on with the other tools",
            )
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return ToolResult.error(f"{tool.name} failed: {message}", data={"server": tool.server})

    def _failed(self, conn: _Connection, reason: str) -> None:
        conn.status.ok = False
        conn.status.error = reason
        conn.dead = reason
        self._warn(
            "mcp.server_failed",
            f"MCP server {conn.status.name} could not be started: "
            f"{reason}; the run goes on without its tools",
            server=conn.status.name,
        )

    def _end_tree(self, end: Callable[[], None]) -> None:
        """Stopping goes on when a server's processes cannot be ended: it is said."""
        try:
            end()
        except EnvironmentProblem as exc:
            self._warn("mcp.processes_left", f"MCP server processes left running: {exc.message}")

    def _warn(self, event: str, message: str, **fields: Any) -> None:
        self.warnings.append(message)
        if self._warn_sink is not None:
            self._warn_sink(event, {"message": message, **fields})


# --------------------------------------------------------------------------- conversions


def _namespaced(server: str, tool: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", f"{server}{SEPARATOR}{tool}".lower())


def _signature(tool: ExternalTool) -> str:
    props = tool.parameters["properties"]
    required = set(tool.parameters.get("required", ()))
    parts = [
        f"{k} ({v['type'] if isinstance(v['type'], str) else '|'.join(v['type'])}"
        f"{', required' if k in required else ''})"
        for k, v in props.items()
    ]
    return f"{tool.name} takes: {', '.join(parts) or 'no arguments'}"


def _timed_out(name: str, timeout: float) -> ToolResult:
    return ToolResult.error(
        f"{name} timed out after {timeout:g}s",
        hint="try a smaller request, or carry on without this tool",
    )


def _to_result(tool: ExternalTool, result: Any) -> ToolResult:
    parts = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {item.mime_type}, {len(item.data)} base64 characters not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        elif kind == "resource":
            text = getattr(item.resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {item.resource.uri}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, default=str))
    text = _clip("\n".join(parts), MAX_RESULT_CHARS)
    data: dict[str, object] = {"server": tool.server, "tool": tool.tool}
    if structured is not None:
        data["structured"] = structured
    if result.is_error:
        return ToolResult.error(text or f"{tool.name} reported an error", data=data)
    return ToolResult(ok=True, content=text or "(no output)", data=data)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from the SDK's task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException, conn: _Connection) -> str:
    exc = _leaf(exc)
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {conn.status.command}"
    if isinstance(exc, PermissionError):
        return f"command not executable: {conn.status.command}"
    if getattr(exc, "code", None) == -32000:  # CONNECTION_CLOSED: the process went away
        message = "it exited before completing the MCP handshake"
    else:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    tail = conn.stderr_tail()
    return message + (f" (stderr: {tail})" if tail else "")
