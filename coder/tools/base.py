"""What every tool module takes: a tool's types and its flat JSON Schema parameters.

    ToolResult   what a call answers (errors are data: `ToolResult.error(message, hint)`)
    ToolContext  where and under which rules a call runs (the worktree, the policy, the
                 redactor, the run's config and policies, who approves each change)
    CodeSearch   what code_search keeps and asks besides BM25 (coder.tools.codeindex)
    Tool         a name, a description, the parameters and a handler `(ctx, args) -> result`;
                 a tool that changes something also a `preview` (coder.tools.approval)
    params, prop the flat object schema of a tool's parameters (see coder.tools.registry)

Imports none of the tool modules, so fs, git, search and shell import it and the registry
imports them without a circle.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder.config import Config, as_config
from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.taskfile.policies import Policies

if TYPE_CHECKING:
    from coder.models.factory import Embedder
    from coder.models.provider import ToolSchema
    from coder.schemas import JsonSchema
    from coder.tools.proposal import Approver, Proposal


# A tool's preview of a call (coder.tools.approval): what it would change, its own error, or None.
# A handler and its preview take the tool's own TypedDict of its arguments (`Any` here: the
# registry holds every tool), which the registry checked against `parameters` first
# (tests/tools/test_tool_arguments.py holds each TypedDict to its schema).
Preview = Callable[["ToolContext", Any], "Proposal | ToolResult | None"]


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: str  # what the model sees (for an error: the message)
    data: dict[str, Any] = field(default_factory=dict)  # structured extras for the harness/MCP
    hint: str | None = None

    @classmethod
    def error(
        cls, message: str, hint: str | None = None, data: dict[str, Any] | None = None
    ) -> ToolResult:
        return cls(ok=False, content=message, data=dict(data or {}), hint=hint)

    def as_text(self) -> str:
        if self.ok:
            return self.content
        return f"error: {self.content}" + (f"\nhint: {self.hint}" if self.hint else "")


@dataclass(frozen=True)
class CodeSearch:
    """code_search's settings, decided once per run (coder.tools.codeindex.code_settings)."""

    cache_dir: Path | None = None  # .coder/cache: the index (None: in memory only)
    embedder: Embedder | None = None  # hybrid ranking (None: BM25 alone)
    embed_key: str = ""  # the embedding model (names its vector cache)


@dataclass
class ToolContext:
    root: Path  # the worktree
    policy: Policy
    redactor: Redactor
    cancel: threading.Event | None = None
    # the settings the tools go by: the config's test_command and lint_command (None: detect),
    # the taskfile's policies (veto_syntax_errors, lint_after_edit)
    config: Config = field(default_factory=lambda: as_config({}))
    policies: Policies = field(default_factory=Policies)
    write_filter: Callable[[str], str | None] | None = None  # repo-relative path -> refusal
    command_timeout: int | None = None  # cap for shell_run/tests_run; None: the policy's
    read_limit: int = 400  # lines per fs_read page
    owner: str | None = None  # sandbox owner token, so `coder resume` can kill leftovers
    code: CodeSearch = field(default_factory=CodeSearch)
    # in a run: an EnvironmentProblem or a full disk stops the run instead of being an
    # answer to the model (the MCP server keeps answering: its client decides)
    stop_on_environment: bool = False
    # per-edit approvals: asked with each write, patch and command before it happens (None:
    # nobody is asked; coder.tools.approval)
    approve: Approver | None = None
    _env_scanned: bool = field(default=False, init=False, repr=False)
    _edits: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # lint memo


Handler = Callable[[ToolContext, Any], ToolResult]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: JsonSchema
    handler: Handler
    read_only: bool
    terminal: bool = False
    preview: Preview | None = None  # what a call would change, for per-edit approvals

    def definition(self) -> ToolSchema:
        """Ollama's (and OpenAI's) function-tool shape."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def params(properties: dict[str, JsonSchema], required: Iterable[str] = ()) -> JsonSchema:
    """A flat object schema (see the module docstring)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def prop(type_: str, description: str, **extra: Any) -> JsonSchema:
    return {"type": type_, "description": description, **extra}
