"""The tool registry: typed tools, argument validation, errors as data, redaction on the way out.

One registry serves the agent loop (Ollama function tools) and the MCP server. A tool is a
name, a description, a flat JSON Schema and a handler `(ToolContext, args) -> ToolResult`.
`Registry.call` is the only way a tool runs, and it guarantees three things:

* the model always gets an answer it can act on: an unknown name, a bad argument, a policy
  refusal, a missing file or a failing handler all become `ToolResult.error(message, hint)`;
  except, in a run (`ctx.stop_on_environment`), what is not the model's to fix: an
  EnvironmentProblem (no sandbox for a command, ...) or a full disk is raised, so the run
  stops as `error` instead of the step failing (DESIGN.md invariant 10);
* arguments are validated against the schema (Draft 2020-12) before the handler sees them;
* everything that leaves (content, hint, data) passes through `ctx.redactor` (fail closed);
* with `ctx.approve` (per-edit approvals), a tool that changes something is shown to the user
  before it runs and does what the answer says (`coder.tools.approval.gated`).

Schemas are flat on purpose: the ollama client keeps only `type`, `description`, `enum` and
`items` of each property (APIS.md §0.2), so defaults and limits live in the descriptions and
nested objects are not used. `register` enforces it.
"""

from __future__ import annotations

import difflib
import errno
import functools
import json
import os
import re
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from coder import yamldoc
from coder.errors import CoderError, EnvironmentProblem, InvalidInput, PolicyViolation
from coder.models.provider import Arguments
from coder.policy.paths import protected_hint
from coder.redact import Redactor
from coder.taskfile.kinds import KINDS
from coder.tools import approval, fs, git, grep, search, shell
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.envfiles import register_env_files

if TYPE_CHECKING:
    from coder.models.provider import ToolSchema

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_PROPERTY_KEYS = frozenset({"type", "description", "enum", "items"})
_INT_TEXT = re.compile(r"\s*-?\d{1,12}\s*")


# --------------------------------------------------------------------------- registry


class Registry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Draft202012Validator] = {}

    def register(self, tool: Tool) -> None:
        if not NAME_RE.match(tool.name):
            raise ValueError(f"tool name {tool.name!r} must match {NAME_RE.pattern}")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        _check_flat(tool)
        Draft202012Validator.check_schema(tool.parameters)
        self._tools[tool.name] = tool
        self._validators[tool.name] = Draft202012Validator(tool.parameters)

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def definitions(self, names: Iterable[str] | None = None) -> list[ToolSchema]:
        """Function-tool definitions in registration order (stable, so a prompt prefix built
        from them stays byte-identical), restricted to `names` when given."""
        wanted = None if names is None else set(names)
        if wanted is not None and (unknown := wanted - set(self._tools)):
            raise InvalidInput(f"unknown tool(s): {', '.join(sorted(unknown))}")
        return [t.definition() for t in self._tools.values() if wanted is None or t.name in wanted]

    def call(self, name: str, arguments: Any, ctx: ToolContext) -> ToolResult:
        """Run one tool call; never raises for anything the model did (see module docstring)."""
        return _redacted(self._call(name, arguments, ctx), ctx.redactor)

    def _call(self, name: str, arguments: Any, ctx: ToolContext) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            close = difflib.get_close_matches(str(name), list(self._tools), n=1, cutoff=0.5)
            return ToolResult.error(
                f"unknown tool {name!r}" + (f"; did you mean {close[0]}?" if close else ""),
                hint=f"available tools: {', '.join(self._tools)}",
            )
        if ctx.cancel is not None and ctx.cancel.is_set():
            return ToolResult.error("the step is being stopped; the tool was not run")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):  # some models send the arguments as JSON text
            try:
                arguments = yamldoc.loads_json(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        if not isinstance(arguments, dict):
            return ToolResult.error(
                f"arguments of {name} must be a JSON object", hint=_signature(tool)
            )
        args = _coerce(tool, arguments)
        errors = sorted(self._validators[name].iter_errors(args), key=_error_rank)
        if errors:
            return ToolResult.error(_describe(errors[0], tool), hint=_signature(tool))
        if not ctx._env_scanned:
            register_env_files(Path(ctx.root), ctx.redactor)
            ctx._env_scanned = True
        try:
            if ctx.approve is not None and not tool.read_only:  # per-edit approvals
                return approval.gated(tool, args, ctx)
            return tool.handler(ctx, args)
        except PolicyViolation as exc:
            return ToolResult.error(
                exc.message,
                hint=exc.hint or protected_hint(),
            )
        except EnvironmentProblem as exc:
            if ctx.stop_on_environment:
                raise
            return ToolResult.error(exc.message, hint=exc.hint)
        except CoderError as exc:
            return ToolResult.error(exc.message, hint=exc.hint)
        except OSError as exc:
            if ctx.stop_on_environment and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise EnvironmentProblem(
                    f"{name}: {_os_error(exc, ctx).content}", hint="free some disk space"
                ) from None
            return _os_error(exc, ctx)
        except Exception as exc:  # noqa: BLE001 - a tool bug must not end the step unseen
            return ToolResult.error(
                f"internal error in {name}: {type(exc).__name__}: {exc}",
                hint="this is a bug in coder, not in your call; try another way",
                data={"traceback": traceback.format_exc()},
            )


def _redacted(result: ToolResult, redactor: Redactor) -> ToolResult:
    data = redactor.redact_obj(result.data)
    return ToolResult(
        ok=result.ok,
        content=redactor.redact(result.content),
        data=data if isinstance(data, dict) else {"redacted": data},
        hint=None if result.hint is None else redactor.redact(result.hint),
    )


def _check_flat(tool: Tool) -> None:
    p = tool.parameters
    if p.get("type") != "object" or not isinstance(p.get("properties"), dict):
        raise ValueError(f"{tool.name}: parameters must be an object schema with properties")
    for key, spec in p["properties"].items():
        extra = set(spec) - _PROPERTY_KEYS
        if extra:
            raise ValueError(
                f"{tool.name}.{key}: the ollama client drops {sorted(extra)}; "
                "keep properties flat (type, description, enum, items)"
            )
        if "type" not in spec or "description" not in spec:
            raise ValueError(f"{tool.name}.{key}: every property needs a type and a description")
        items = spec.get("items")
        if items is not None and set(items) - {"type", "enum"}:
            raise ValueError(f"{tool.name}.{key}: array items must be simple (type/enum)")


def _coerce(tool: Tool, arguments: Arguments) -> Arguments:
    """Forgive what small models commonly send: `null` for an optional argument, "10" for an
    integer, "true" for a boolean, a single string or JSON text for an array of strings.
    Anything less clear-cut is left for validation to report."""
    props = tool.parameters["properties"]
    required = set(tool.parameters.get("required", ()))
    out: Arguments = {}
    for key, value in arguments.items():
        kind = props.get(key, {}).get("type")
        if value is None and key in props and key not in required:
            continue
        if kind == "integer" and isinstance(value, str) and _INT_TEXT.fullmatch(value):
            value = int(value)
        elif kind == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)
        elif kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif kind == "array" and isinstance(value, str):
            try:
                parsed = yamldoc.loads_json(value)
            except ValueError:
                parsed = None
            value = parsed if isinstance(parsed, list) else [value]
        out[key] = value
    return out


def _error_rank(e: ValidationError) -> tuple[int, str]:
    order = {"additionalProperties": 0, "required": 1, "type": 2}
    return order.get(str(e.validator), 3), e.json_path


_JSON_TYPES = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _describe(e: ValidationError, tool: Tool) -> str:
    field_name = "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
        for i, p in enumerate(e.absolute_path)
    )
    if e.validator == "additionalProperties":
        extra = sorted(set(cast(dict[str, Any], e.instance)) - set(tool.parameters["properties"]))
        return f"unknown argument(s) for {tool.name}: {', '.join(extra)}"
    if e.validator == "required":
        given = cast(dict[str, Any], e.instance)
        missing = [r for r in cast(list[str], e.validator_value) if r not in given]
        return f"missing required argument(s) for {tool.name}: {', '.join(missing)}"
    if e.validator == "type":
        got = _JSON_TYPES.get(type(e.instance), type(e.instance).__name__)
        shown = json.dumps(e.instance)[:60]
        return (
            f"argument {field_name!r} of {tool.name} must be of type {e.validator_value}, "
            f"got {got} {shown}"
        )
    if e.validator == "enum":
        return f"argument {field_name!r} of {tool.name} must be one of {e.validator_value}"
    return f"argument {field_name or '(arguments)'!r} of {tool.name}: {e.message}"


def _signature(tool: Tool) -> str:
    required = set(tool.parameters.get("required", ()))
    parts = [
        f"{k} ({v['type']}{', required' if k in required else ''})"
        for k, v in tool.parameters["properties"].items()
    ]
    return f"{tool.name} takes: {', '.join(parts) or 'no arguments'}"


def _os_error(exc: OSError, ctx: ToolContext) -> ToolResult:
    where = ""
    if exc.filename is not None:
        name = os.fsdecode(exc.filename)
        real_root = os.path.realpath(ctx.root)
        where = os.path.relpath(name, real_root) if name.startswith(real_root) else name
    what = exc.strerror or str(exc)
    hints = {
        FileNotFoundError: "check the path (fs_glob lists files)",
        IsADirectoryError: "that is a directory; list it with fs_glob",
        NotADirectoryError: "a part of the path is a file, not a directory",
        PermissionError: "the file is not accessible",
    }
    hint = next((h for cls, h in hints.items() if isinstance(exc, cls)), None)
    return ToolResult.error(f"{what}: {where}" if where else what, hint=hint)


# --------------------------------------------------------------------------- tool sets

DOC_PATTERNS: tuple[str, ...] = (
    "*.md",
    "*.rst",
    "*.txt",
    "*.adoc",
    "docs/**",
    "doc/**",
    "README*",
    "CHANGELOG*",
    "CONTRIBUTING*",
    "LICENSE*",
)
_DOC_SUFFIXES = (".md", ".rst", ".txt", ".adoc")
_DOC_NAMES = ("readme", "changelog", "contributing", "license")
_DOC_DIRS = frozenset({"docs", "doc"})


def doc_write_filter(path: str) -> str | None:
    """Why a doc step may not write `path` (repo-relative posix), or None if it is a doc.
    Names are compared case-insensitively; `docs/` and `doc/` count at any depth."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return "not a documentation file"
    name = parts[-1].lower()
    if name.endswith(_DOC_SUFFIXES) or name.startswith(_DOC_NAMES):
        return None
    if any(p.lower() in _DOC_DIRS for p in parts[:-1]):
        return None
    return f"{path} is not documentation; this step may only write docs ({', '.join(DOC_PATTERNS)})"


TERMINAL_TOOL = "step_complete"
_WRITE_TOOLS = ("fs_write", "fs_edit", "fs_apply_patch", "tests_run")


def tools_for_kind(kind: str, registry: Registry | None = None) -> list[str]:
    """The tool names a model step of `kind` may call, in registry order: read-only tools for
    a read-only kind, plus the write tools for one that edits, every tool for `all`."""
    reg = registry or default_registry()
    read_only = [t.name for t in reg if t.read_only]
    role = KINDS[kind].model if kind in KINDS else None
    if role == "read":
        names = set(read_only)
    elif role in ("edit", "docs"):
        names = set(read_only) | set(_WRITE_TOOLS)
    elif role == "all":
        names = set(reg.names())
    else:
        model_kinds = ", ".join(k.name for k in KINDS.values() if k.uses_model)
        raise InvalidInput(
            f"step kind {kind!r} has no model tools", hint=f"model steps are {model_kinds}"
        )
    names.add(TERMINAL_TOOL)
    return [n for n in reg.names() if n in names]


class StepCompleteArgs(TypedDict, total=False):
    summary: Required[str]
    files_changed: list[str]
    no_change_reason: str


def _step_complete(ctx: ToolContext, args: StepCompleteArgs) -> ToolResult:
    # The agent loop intercepts this call and checks the claim against the real diff; this
    # handler only serves other callers (MCP) and records the claim as data.
    files = list(args.get("files_changed") or [])
    return ToolResult(
        ok=True,
        content="step_complete received: " + args["summary"].strip(),
        data={
            "summary": args["summary"],
            "files_changed": files,
            "no_change_reason": args.get("no_change_reason"),
        },
    )


STEP_COMPLETE = Tool(
    name=TERMINAL_TOOL,
    description=(
        "Finish the step. Give a short summary and the files you changed; if no file "
        "had to change, say why in no_change_reason. The claim is checked against "
        "the real changes."
    ),
    parameters=params(
        {
            "summary": prop("string", "What you did and found, in a few sentences."),
            "files_changed": prop(
                "array",
                "Repository-relative paths you changed (empty if none).",
                items={"type": "string"},
            ),
            "no_change_reason": prop("string", "Why no file had to change (only when none did)."),
        },
        required=["summary"],
    ),
    handler=_step_complete,
    read_only=True,
    terminal=True,
)


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The standard tool set, built once. Callers must not register into it; build a
    `Registry()` of their own (e.g. with MCP tools) instead."""
    reg = Registry()
    for tool in (
        fs.FS_READ,
        fs.FS_GLOB,
        grep.FS_GREP,
        search.CODE_SEARCH,
        git.GIT_STATUS,
        git.GIT_DIFF,
        git.GIT_LOG,
        fs.FS_WRITE,
        fs.FS_EDIT,
        git.FS_APPLY_PATCH,
        shell.TESTS_RUN,
        shell.SHELL_RUN,
        STEP_COMPLETE,
    ):
        reg.register(tool)
    return reg
